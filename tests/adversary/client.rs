//! The attack clients: one HTTP call with a bearer token (the whole answer
//! kept as text, so nothing of it escapes the leak scan), and a Tinode
//! WebSocket session that keeps every frame it receives, reconnects when
//! the server closes it, and never panics on a missing reply (a reply that
//! does not come is an outcome too).

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// How long one reply may take.
pub const REPLY: Duration = Duration::from_secs(15);

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    pub status: u16,
    pub body: String,
}

pub async fn http(
    client: &reqwest::Client,
    addr: SocketAddr,
    method: &str,
    path_and_query: &str,
    bearer: &str,
    body: Option<&Value>,
) -> HttpAnswer {
    http_with(client, addr, method, path_and_query, bearer, body, &[]).await
}

/// [`http`] with extra headers (`Idempotency-Key`).
pub async fn http_with(
    client: &reqwest::Client,
    addr: SocketAddr,
    method: &str,
    path_and_query: &str,
    bearer: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> HttpAnswer {
    let url = format!("http://{addr}{path_and_query}");
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
    let mut req = client.request(method, &url).bearer_auth(bearer);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    match tokio::time::timeout(REPLY, req.send()).await {
        Ok(Ok(resp)) => {
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            HttpAnswer { status, body }
        }
        Ok(Err(e)) => HttpAnswer {
            status: 0,
            body: format!("request failed: {e}"),
        },
        Err(_) => HttpAnswer {
            status: 0,
            body: format!("no answer within {REPLY:?}"),
        },
    }
}

/// A logged-in Tinode session (token login), reconnected on demand.
pub struct WsSession {
    addr: SocketAddr,
    token: String,
    label: String,
    conn: Option<Conn>,
    next_id: u64,
}

struct Conn {
    sink: futures::stream::SplitSink<
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        Message,
    >,
    frames: mpsc::UnboundedReceiver<Value>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The reply to one WebSocket request: the frames before it and the
/// closing `ctrl` (or `meta`) with the request's id, if any came.
#[derive(Debug, Clone, Default)]
pub struct WsAnswer {
    pub frames: Vec<Value>,
    pub reply: Option<Value>,
    /// Why no reply came (closed, timed out), if so.
    pub trouble: Option<String>,
}

impl WsAnswer {
    pub fn code(&self) -> Option<i64> {
        let r = self.reply.as_ref()?;
        if r.get("meta").is_some() {
            return Some(200);
        }
        r["ctrl"]["code"].as_i64()
    }

    /// Every frame of the answer as text (for the leak scan).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for f in self.frames.iter().chain(self.reply.iter()) {
            out.push_str(&f.to_string());
            out.push('\n');
        }
        out
    }
}

impl WsSession {
    pub fn new(addr: SocketAddr, token: &str, label: &str) -> WsSession {
        WsSession {
            addr,
            token: token.to_string(),
            label: label.to_string(),
            conn: None,
            next_id: 0,
        }
    }

    async fn connect(&mut self) -> Result<(), String> {
        let url = format!("ws://{}/v0/channels", self.addr);
        let (ws, _) = tokio::time::timeout(REPLY, tokio_tungstenite::connect_async(&url))
            .await
            .map_err(|_| format!("[{}] connect timed out", self.label))?
            .map_err(|e| format!("[{}] connect: {e}", self.label))?;
        let (sink, mut stream) = ws.split();
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            while let Some(Ok(frame)) = stream.next().await {
                let text = match frame {
                    Message::Text(t) => t.to_string(),
                    Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                    Message::Close(_) => break,
                    _ => continue,
                };
                let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        self.conn = Some(Conn {
            sink,
            frames: rx,
            reader,
        });
        let hi = self
            .request_raw(json!({"hi": {"ver": "0.25.3"}}), REPLY)
            .await;
        if hi.code() != Some(201) {
            self.conn = None;
            return Err(format!("[{}] hi: {hi:?}", self.label));
        }
        if self.token.is_empty() {
            return Ok(());
        }
        let token = self.token.clone();
        let login = self
            .request_raw(
                json!({"login": {"scheme": "token", "secret": token}}),
                REPLY,
            )
            .await;
        if login.code() != Some(200) {
            self.conn = None;
            return Err(format!("[{}] login: {login:?}", self.label));
        }
        Ok(())
    }

    /// Connects (again) if needed.
    pub async fn ready(&mut self) -> Result<(), String> {
        if self.conn.as_ref().is_some_and(|c| !c.reader.is_finished()) {
            return Ok(());
        }
        self.conn = None;
        self.connect().await
    }

    /// A session that only says `{hi}` (for login attempts).
    pub fn anonymous(addr: SocketAddr, label: &str) -> WsSession {
        WsSession::new(addr, "", label)
    }

    /// Sends `msg` with a fresh id and waits for the reply with that id.
    pub async fn request(&mut self, msg: Value) -> WsAnswer {
        if let Err(e) = self.ready().await {
            return WsAnswer {
                trouble: Some(e),
                ..Default::default()
            };
        }
        self.request_raw(msg, REPLY).await
    }

    /// [`WsSession::request`] waiting at most `wait` for the reply.
    pub async fn request_within(&mut self, msg: Value, wait: Duration) -> WsAnswer {
        if let Err(e) = self.ready().await {
            return WsAnswer {
                trouble: Some(e),
                ..Default::default()
            };
        }
        self.request_raw(msg, wait).await
    }

    async fn request_raw(&mut self, mut msg: Value, wait: Duration) -> WsAnswer {
        self.next_id += 1;
        let id = format!("{}-{}", self.label, self.next_id);
        let verb = msg
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .expect("{verb: {...}}");
        msg[&verb]["id"] = json!(id);
        let mut answer = WsAnswer::default();
        let Some(conn) = self.conn.as_mut() else {
            answer.trouble = Some("not connected".into());
            return answer;
        };
        if let Err(e) = conn.sink.send(Message::Text(msg.to_string().into())).await {
            answer.trouble = Some(format!("send: {e}"));
            self.conn = None;
            return answer;
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, conn.frames.recv()).await {
                Ok(Some(frame)) => {
                    // A message too large to read is refused without an
                    // id (`413`): that answers the request in flight. Any
                    // other refusal names the request it answers.
                    let unnamed_refusal = frame["ctrl"].is_object()
                        && frame["ctrl"]["id"].is_null()
                        && frame["ctrl"]["code"] == json!(413);
                    if frame["ctrl"]["id"] == json!(id)
                        || frame["meta"]["id"] == json!(id)
                        || unnamed_refusal
                    {
                        answer.reply = Some(frame);
                        return answer;
                    }
                    answer.frames.push(frame);
                }
                Ok(None) => {
                    answer.trouble = Some("the server closed the connection".into());
                    self.conn = None;
                    return answer;
                }
                Err(_) => {
                    answer.trouble = Some(format!("no reply within {wait:?}"));
                    self.conn = None;
                    return answer;
                }
            }
        }
    }

    /// Sends a message that gets no reply (`{note}`).
    pub async fn send_only(&mut self, msg: Value) -> Result<(), String> {
        self.ready().await?;
        let conn = self.conn.as_mut().ok_or("not connected")?;
        if let Err(e) = conn.sink.send(Message::Text(msg.to_string().into())).await {
            self.conn = None;
            return Err(format!("send: {e}"));
        }
        Ok(())
    }

    /// A request that is always answered and changes nothing (`{leave
    /// topic="fnd"}`): the frames before its reply are everything earlier
    /// messages still caused for this session.
    pub async fn sync(&mut self) -> WsAnswer {
        if self.conn.is_none() {
            return WsAnswer::default();
        }
        let mut sync = self
            .request_raw(json!({"leave": {"topic": "fnd"}}), REPLY)
            .await;
        sync.reply = None;
        sync
    }

    /// Whether the connection is still open.
    pub fn is_open(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.reader.is_finished())
    }

    /// Frames that arrived unasked since the last call.
    pub fn drain(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(conn) = self.conn.as_mut() {
            while let Ok(f) = conn.frames.try_recv() {
                out.push(f);
            }
        }
        out
    }
}
