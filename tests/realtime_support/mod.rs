//! A small Tinode WebSocket client for the realtime tests: hi, token login,
//! sub, pub, get and notes, with every incoming frame collected so a test
//! can wait (with a deadline) for the frame a user would look for, count
//! what arrived, and see when the server closed the connection. Plus Redis
//! probes the tests need: a gateway's heartbeat clock, Pub/Sub subscriber
//! counts, direct envelope publishing.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Generous bound for anything that goes through Kafka and a pipeline.
pub const DELIVERY: Duration = Duration::from_secs(30);
/// Bound for a direct request/reply round trip.
pub const REPLY: Duration = Duration::from_secs(15);

#[derive(Default)]
struct Log {
    frames: Vec<Value>,
    closed: bool,
}

/// One WebSocket connection speaking the Tinode protocol.
pub struct Client {
    pub label: String,
    sink: SplitSink<Ws, Message>,
    log: Arc<Mutex<Log>>,
    next_id: u64,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Client {
    /// Connects to `/v0/channels` and says {hi}.
    pub async fn connect(addr: std::net::SocketAddr, label: &str) -> Client {
        let url = format!("ws://{addr}/v0/channels?apikey=test");
        let (ws, _) = tokio_tungstenite::connect_async(&url)
            .await
            .unwrap_or_else(|e| panic!("[{label}] connect {url}: {e}"));
        let (sink, mut stream) = ws.split();
        let log = Arc::new(Mutex::new(Log::default()));
        let reader_log = log.clone();
        let reader = tokio::spawn(async move {
            while let Some(frame) = stream.next().await {
                let text = match frame {
                    Ok(Message::Text(t)) => t.to_string(),
                    Ok(Message::Binary(b)) => String::from_utf8_lossy(&b).into_owned(),
                    Ok(Message::Close(_)) | Err(_) => break,
                    Ok(_) => continue,
                };
                let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
                reader_log.lock().unwrap().frames.push(value);
            }
            reader_log.lock().unwrap().closed = true;
        });
        let mut client = Client {
            label: label.to_string(),
            sink,
            log,
            next_id: 0,
            reader,
        };
        let hi = client
            .request(json!({"hi": {"ver": "0.25.3", "ua": "imstream-realtime-test/1.0"}}))
            .await;
        assert_eq!(hi["code"], json!(201), "[{label}] hi: {hi}");
        client
    }

    /// Connects, logs in with `token` (must succeed).
    pub async fn open(addr: std::net::SocketAddr, token: &str, label: &str) -> Client {
        let mut c = Client::connect(addr, label).await;
        let ctrl = c.login(token).await;
        assert_eq!(ctrl["code"], json!(200), "[{label}] login: {ctrl}");
        c
    }

    /// Connects, logs in and attaches to `topic` (all must succeed).
    pub async fn open_sub(
        addr: std::net::SocketAddr,
        token: &str,
        topic: &str,
        label: &str,
    ) -> Client {
        let mut c = Client::open(addr, token, label).await;
        c.sub(topic).await;
        c
    }

    /// `{login scheme="token"}`; returns the ctrl.
    pub async fn login(&mut self, token: &str) -> Value {
        self.request(json!({"login": {"scheme": "token", "secret": token}}))
            .await
    }

    /// `{sub}` without a query (must succeed).
    pub async fn sub(&mut self, topic: &str) -> Value {
        let ctrl = self.request(json!({"sub": {"topic": topic}})).await;
        assert_eq!(
            ctrl["code"],
            json!(200),
            "[{}] sub {topic}: {ctrl}",
            self.label
        );
        ctrl
    }

    /// `{leave}`; returns the ctrl.
    pub async fn leave(&mut self, topic: &str) -> Value {
        self.request(json!({"leave": {"topic": topic}})).await
    }

    /// `{pub}` of a text message, with an optional client_mid in head;
    /// returns the ctrl.
    pub async fn publish(&mut self, topic: &str, text: &str, client_mid: Option<&str>) -> Value {
        let mut p = json!({"topic": topic, "content": {"txt": text}});
        if let Some(cmid) = client_mid {
            p["head"] = json!({"client_mid": cmid});
        }
        self.request(json!({ "pub": p })).await
    }

    /// Publishes and returns the accepted seq (ctrl 202 required).
    pub async fn send_text(&mut self, topic: &str, text: &str) -> i64 {
        let ctrl = self.publish(topic, text, None).await;
        accepted_seq(&ctrl, &self.label)
    }

    /// `{note}` (no reply).
    pub async fn note(&mut self, topic: &str, what: &str, seq: Option<i64>) {
        let mut n = json!({"topic": topic, "what": what});
        if let Some(seq) = seq {
            n["seq"] = json!(seq);
        }
        self.send(json!({ "note": n })).await;
    }

    /// `{get what="data" data={since}}`: the {data} frames of the reply (in
    /// arrival order) and its closing ctrl (208 or 204).
    pub async fn get_since(&mut self, topic: &str, since: i64) -> (Vec<Value>, Value) {
        let start = self.log.lock().unwrap().frames.len();
        let ctrl = self
            .request(json!({"get": {"topic": topic, "what": "data", "data": {"since": since, "limit": 100}}}))
            .await;
        let frames = self.log.lock().unwrap().frames[start..].to_vec();
        let data = frames
            .into_iter()
            .filter(|f| f["data"]["topic"] == json!(topic))
            .collect();
        (data, ctrl)
    }

    /// Sends one client message.
    pub async fn send(&mut self, msg: Value) {
        self.sink
            .send(Message::Text(msg.to_string().into()))
            .await
            .unwrap_or_else(|e| panic!("[{}] send {msg}: {e}", self.label));
    }

    /// Sends client messages back to back, in one write: all of them are on
    /// the wire before the gateway can answer the first (a close included).
    /// The gateway may close the session first (its heartbeat can find a
    /// revocation before the uplink does): messages after the close are not
    /// sent, which is no failure.
    pub async fn send_together_unless_closed(&mut self, msgs: &[Value]) {
        for msg in msgs {
            match self.sink.feed(Message::Text(msg.to_string().into())).await {
                Ok(()) => {}
                Err(tokio_tungstenite::tungstenite::Error::Protocol(_))
                | Err(tokio_tungstenite::tungstenite::Error::AlreadyClosed)
                | Err(tokio_tungstenite::tungstenite::Error::ConnectionClosed) => return,
                Err(e) => panic!("[{}] send {msg}: {e}", self.label),
            }
        }
        let _ = self.sink.flush().await;
    }

    /// Sends a message that carries an id (added here) and waits for the
    /// {ctrl} with that id.
    pub async fn request(&mut self, mut msg: Value) -> Value {
        self.next_id += 1;
        let id = format!("{}-{}", self.label, self.next_id);
        let body = msg
            .as_object_mut()
            .and_then(|o| o.values_mut().next())
            .and_then(Value::as_object_mut)
            .expect("a client message is {verb: {...}}");
        body.insert("id".into(), json!(id));
        self.send(msg.clone()).await;
        let ctrl = self
            .expect(&format!("ctrl for {msg}"), REPLY, |f| {
                f["ctrl"]["id"] == json!(id)
            })
            .await;
        ctrl["ctrl"].clone()
    }

    /// Waits until a frame matching `pred` has arrived (at any time since
    /// the connection opened); returns the first such frame.
    pub async fn expect(
        &self,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            {
                let log = self.log.lock().unwrap();
                if let Some(f) = log.frames.iter().find(|f| pred(f)) {
                    return f.clone();
                }
                if log.closed {
                    panic!(
                        "[{}] connection closed while waiting for {what}; frames: {}",
                        self.label,
                        show(&log.frames)
                    );
                }
                if start.elapsed() > deadline {
                    panic!(
                        "[{}] timed out after {deadline:?} waiting for {what}; frames: {}",
                        self.label,
                        show(&log.frames)
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the `{data}` of `seq` in `topic`.
    pub async fn expect_data(&self, topic: &str, seq: i64) -> Value {
        self.expect(&format!("{{data}} {topic}#{seq}"), DELIVERY, |f| {
            is_data(f, topic, seq)
        })
        .await["data"]
            .clone()
    }

    /// Waits until the server closed the connection; returns every frame
    /// received.
    pub async fn expect_closed(&self, deadline: Duration) -> Vec<Value> {
        let start = Instant::now();
        loop {
            {
                let log = self.log.lock().unwrap();
                if log.closed {
                    return log.frames.clone();
                }
                if start.elapsed() > deadline {
                    panic!(
                        "[{}] still open after {deadline:?}; frames: {}",
                        self.label,
                        show(&log.frames)
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Closes the connection from the client side (the user goes offline)
    /// and waits until the server has closed its side too.
    pub async fn close(&mut self) {
        let _ = self.sink.send(Message::Close(None)).await;
        self.expect_closed(REPLY).await;
    }

    /// Waits until at least `n` received frames match `pred`.
    pub async fn expect_count(
        &self,
        what: &str,
        deadline: Duration,
        n: usize,
        pred: impl Fn(&Value) -> bool,
    ) {
        let start = Instant::now();
        loop {
            {
                let log = self.log.lock().unwrap();
                if log.frames.iter().filter(|f| pred(f)).count() >= n {
                    return;
                }
                if log.closed || start.elapsed() > deadline {
                    panic!(
                        "[{}] waiting for {n} x {what} (closed: {}); frames: {}",
                        self.label,
                        log.closed,
                        show(&log.frames)
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn is_closed(&self) -> bool {
        self.log.lock().unwrap().closed
    }

    /// Every frame received so far.
    pub fn frames(&self) -> Vec<Value> {
        self.log.lock().unwrap().frames.clone()
    }

    /// How many received frames match.
    pub fn count(&self, pred: impl Fn(&Value) -> bool) -> usize {
        self.log
            .lock()
            .unwrap()
            .frames
            .iter()
            .filter(|f| pred(f))
            .count()
    }

    /// Seqs of the {data} frames of `topic` received so far, in order.
    pub fn data_seqs(&self, topic: &str) -> Vec<i64> {
        self.log
            .lock()
            .unwrap()
            .frames
            .iter()
            .filter(|f| f["data"]["topic"] == json!(topic))
            .filter_map(|f| f["data"]["seq"].as_i64())
            .collect()
    }

    /// A request round trip proving the session is still open and served.
    pub async fn assert_alive(&mut self, topic: &str) {
        assert!(
            !self.is_closed(),
            "[{}] was closed: {}",
            self.label,
            show(&self.frames())
        );
        let ctrl = self.request(json!({"sub": {"topic": topic}})).await;
        assert_eq!(
            ctrl["code"],
            json!(304),
            "[{}] still attached to {topic}: {ctrl}",
            self.label
        );
    }
}

/// The seq of an accepted publish.
pub fn accepted_seq(ctrl: &Value, label: &str) -> i64 {
    assert_eq!(ctrl["code"], json!(202), "[{label}] publish: {ctrl}");
    ctrl["params"]["seq"]
        .as_i64()
        .unwrap_or_else(|| panic!("[{label}] publish ctrl without seq: {ctrl}"))
}

pub fn is_data(f: &Value, topic: &str, seq: i64) -> bool {
    f["data"]["topic"] == json!(topic) && f["data"]["seq"] == json!(seq)
}

/// The session-closing ctrl: 401 with `params.reason`.
pub fn closing_reason(frames: &[Value]) -> Option<String> {
    let last = frames.iter().rev().find(|f| f.get("ctrl").is_some())?;
    (last["ctrl"]["code"] == json!(401))
        .then(|| last["ctrl"]["params"]["reason"].as_str().map(String::from))
        .flatten()
}

fn show(frames: &[Value]) -> String {
    let all: Vec<String> = frames.iter().map(Value::to_string).collect();
    format!("[{}]", all.join(", "))
}

/// Tinode user id.
pub fn usr(uid: i64) -> String {
    format!("usr{uid}")
}

/// A token of any tenant, issued under `auth_version`.
pub fn token_for(
    config: &imstream::config::Config,
    tenant: &str,
    uid: i64,
    device: &str,
    auth_version: i64,
) -> String {
    imstream::auth::Tokens::new(config)
        .issue(tenant, uid, device, auth_version, 0)
        .token
}

/// The node id of the `i`-th gateway started by `Stack::realtime`.
pub fn node_of(stack: &crate::common::Stack, i: usize) -> String {
    format!("gw{i}-{}", stack.world.id)
}

/// Rows of `topic` with `seq` in the current month table.
pub async fn stored_rows(pool: &sqlx::MySqlPool, topic: &str, seq: i64) -> i64 {
    let month = imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string();
    sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
    ))
    .bind(topic)
    .bind(seq)
    .fetch_one(pool)
    .await
    .expect("count stored rows")
}

/// Waits until the store pipeline has written `seq` of `topic`; returns
/// the number of rows (so a duplicate would show).
pub async fn wait_stored(pool: &sqlx::MySqlPool, topic: &str, seq: i64) -> i64 {
    crate::common::wait_for(&format!("{topic}#{seq} stored"), DELIVERY, || {
        let pool = pool.clone();
        async move {
            match stored_rows(&pool, topic, seq).await {
                0 => Err("not stored yet".to_string()),
                n => Ok(n),
            }
        }
    })
    .await
}

/// Last heartbeat of `node` for `topic` (epoch ms): the gateway's
/// heartbeat re-stamps the topic's online-node index every beat.
pub async fn heartbeat_stamp(
    redis: &mut imstream::redis_util::Redis,
    tenant: &str,
    topic: &str,
    node: &str,
) -> Option<i64> {
    let key = imstream::keys::TopicKeys::new(tenant, topic).online_nodes();
    redis::cmd("ZSCORE")
        .arg(key)
        .arg(node)
        .query_async::<Option<f64>>(redis)
        .await
        .expect("ZSCORE")
        .map(|s| s as i64)
}

/// Waits until gateway `node` has completed `beats` more heartbeats (it
/// must have a session attached to `topic`). A heartbeat stamps presence
/// and then re-checks session control, so after two new stamps at least
/// one complete re-check ran.
pub async fn wait_heartbeats(
    redis: &mut imstream::redis_util::Redis,
    tenant: &str,
    topic: &str,
    node: &str,
    beats: usize,
) {
    let mut last = heartbeat_stamp(redis, tenant, topic, node).await;
    let mut seen = 0;
    let start = Instant::now();
    while seen < beats {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "node {node} did not heartbeat {beats} times within 30 s (saw {seen})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = heartbeat_stamp(redis, tenant, topic, node).await;
        if now > last {
            seen += 1;
            last = now;
        }
    }
}

/// Subscribers of a Pub/Sub channel.
pub async fn numsub(redis: &mut imstream::redis_util::Redis, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(redis)
        .await
        .expect("PUBSUB NUMSUB");
    n
}

/// Publishes an envelope straight to a channel, as a pipeline would.
pub async fn publish_envelope(
    redis: &mut imstream::redis_util::Redis,
    channel: &str,
    envelope: &imstream::realtime::Envelope,
) {
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(serde_json::to_string(envelope).unwrap())
        .query_async(redis)
        .await
        .expect("PUBLISH");
}

/// An admin session-control call on operator port `addr` (a gateway's
/// `admin_addr`); returns the status.
pub async fn admin(addr: std::net::SocketAddr, admin_token: &str, path: &str, tenant: &str) -> u16 {
    reqwest::Client::new()
        .post(format!(
            "http://{addr}/v1/admin/users/{path}?tenant={tenant}"
        ))
        .bearer_auth(admin_token)
        .send()
        .await
        .expect("gateway reachable")
        .status()
        .as_u16()
}
