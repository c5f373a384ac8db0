//! A minimal Tinode WebSocket client for the benchmarks: hi, login with a
//! token, sub, then a stream of frames in and out.

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the gateway's WebSocket with `TCP_NODELAY`, as a real client's
/// small frames need (with Nagle a frame waits for the peer's delayed ACK).
pub async fn open(url: &str) -> anyhow::Result<Ws> {
    let (ws, _) = tokio_tungstenite::connect_async_with_config(
        format!("{url}/v0/channels?apikey=bench"),
        None,
        true,
    )
    .await?;
    Ok(ws)
}

/// Connects, greets, logs in and attaches to `topic`.
pub async fn connect(url: &str, token: &str, topic: &str) -> anyhow::Result<Ws> {
    let mut ws = open(url).await?;
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
    // 503 means "retry": a client backs off and subscribes again.
    for attempt in 0..20 {
        match request(
            &mut ws,
            json!({"sub": {"id": format!("sub{attempt}"), "topic": topic}}),
        )
        .await
        {
            Ok(_) => return Ok(ws),
            Err(e) if e.to_string().contains("503") => {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await
            }
            Err(e) => return Err(e),
        }
    }
    anyhow::bail!("could not subscribe to {topic}")
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

/// Publishes one message and waits for its 202, retrying while the gateway
/// answers 503 (a new topic's seq allocator is being seeded). Used to bring
/// a topic to steady state before measuring.
pub async fn warm_up(ws: &mut Ws, topic: &str) -> anyhow::Result<()> {
    for attempt in 0..100 {
        let msg =
            json!({"pub": {"id": format!("warm{attempt}"), "topic": topic, "content": "warm-up"}});
        match request(ws, msg).await {
            Ok(_) => return Ok(()),
            Err(e) if e.to_string().contains("503") => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await
            }
            Err(e) => return Err(e),
        }
    }
    anyhow::bail!("topic {topic} did not accept a message")
}
