//! A minimal Tinode WebSocket client for the benchmarks: hi, login with a
//! token, sub, then a stream of frames in and out.

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connects, greets, logs in and attaches to `topic`.
pub async fn connect(url: &str, token: &str, topic: &str) -> anyhow::Result<Ws> {
    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("{url}/v0/channels?apikey=bench")).await?;
    request(
        &mut ws,
        json!({"hi": {"id": "1", "ver": "0.25.3", "ua": "imstream-bench"}}),
    )
    .await?;
    request(
        &mut ws,
        json!({"login": {"id": "2", "scheme": "token", "secret": token}}),
    )
    .await?;
    request(&mut ws, json!({"sub": {"id": "3", "topic": topic}})).await?;
    Ok(ws)
}

/// Sends one message and waits for the ctrl with the same id; fails on a
/// code ≥ 300.
async fn request(ws: &mut Ws, msg: Value) -> anyhow::Result<Value> {
    let id = msg
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(|v| v["id"].as_str())
        .unwrap_or_default()
        .to_string();
    ws.send(Message::Text(msg.to_string().into())).await?;
    while let Some(frame) = ws.next().await {
        let Message::Text(text) = frame? else {
            continue;
        };
        let v: Value = serde_json::from_str(&text)?;
        if v["ctrl"]["id"] == json!(id) {
            let code = v["ctrl"]["code"].as_u64().unwrap_or(0);
            anyhow::ensure!(code < 300, "request {id} refused: {}", v["ctrl"]);
            return Ok(v);
        }
    }
    anyhow::bail!("connection closed waiting for reply {id}")
}
