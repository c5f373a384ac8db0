//! The Centrifugo side of `imstream bench fanout --compare-centrifugo`:
//! the same sessions and publishing rate driven through Centrifugo (v6,
//! `docker/local/centrifugo install`), once per engine, on the same box.
//!
//! For each engine the bench starts Centrifugo itself, as a child process
//! on a free loopback port with a generated JSON config, waits for its
//! `/health`, connects every session over Centrifugo's JSON WebSocket
//! protocol (connect with an HS256 token whose `sub` is the user, then
//! subscribe to one channel), publishes open loop through the server HTTP
//! API (`POST /api/publish`), each publication carrying its scheduled send
//! time exactly as the imstream side does, and kills the child at the end.
//! Every session listens: the publisher is the server API, not a session.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use super::client::Ws;
use super::deliveries::{self, Deliveries, OpenLoop, Outcome};

/// The channel namespace the generated config declares; its channels can be
/// subscribed to by any connected client (publishing through the server API
/// needs no permission).
const NAMESPACE: &str = "bench";

/// Prefix of every Redis key and PUB/SUB channel the Redis engine uses, so
/// nothing of imstream's in the same Redis is touched.
const REDIS_PREFIX: &str = "imstream_bench_centrifugo";

/// How long the receivers keep listening after the last publication.
const GRACE: Duration = Duration::from_secs(5);

/// How long Centrifugo may take to answer `/health` after its start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Centrifugo's engine: where its PUB/SUB goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// In the process: the fastest Centrifugo can be, one node only.
    Memory,
    /// Through Redis PUB/SUB, as a multi-node Centrifugo runs.
    Redis,
}

impl Engine {
    pub const ALL: [Engine; 2] = [Engine::Memory, Engine::Redis];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Memory => "memory",
            Engine::Redis => "redis",
        }
    }
}

/// One Centrifugo measurement: the same shape as the imstream side's.
pub struct CentrifugoBench {
    /// The Centrifugo binary (`docker/local/centrifugo path`).
    pub binary: PathBuf,
    /// The Redis engine's address, `redis://host:port[/db]`.
    pub redis_url: String,
    pub sessions: usize,
    pub rate: u64,
    pub duration: Duration,
    pub connect_concurrency: usize,
}

/// The per-run credentials the config and the clients share.
struct Secrets {
    /// Signs the connection tokens (HS256).
    hmac: String,
    /// `X-API-Key` of the server HTTP API.
    api_key: String,
}

impl Secrets {
    fn generate() -> Secrets {
        Secrets {
            hmac: uuid::Uuid::new_v4().simple().to_string(),
            api_key: uuid::Uuid::new_v4().simple().to_string(),
        }
    }
}

/// Centrifugo's JSON config for one engine, listening on 127.0.0.1:`port`.
fn config(engine: Engine, port: u16, secrets: &Secrets, redis_url: &str) -> Value {
    let engine = match engine {
        Engine::Memory => json!({"type": "memory"}),
        Engine::Redis => json!({
            "type": "redis",
            "redis": {"address": [redis_url], "prefix": REDIS_PREFIX},
        }),
    };
    json!({
        "http_server": {"address": "127.0.0.1", "port": port},
        "log": {"level": "error"},
        "client": {"token": {"hmac_secret_key": secrets.hmac}},
        "http_api": {"key": secrets.api_key},
        "health": {"enabled": true},
        "usage_stats": {"disabled": true},
        "channel": {"namespaces": [{"name": NAMESPACE, "allow_subscribe_for_client": true}]},
        "engine": engine,
    })
}

/// A connection token for user `user`: HS256, `sub` the user id, no expiry.
fn connect_token(secret: &str, user: usize) -> String {
    #[derive(serde::Serialize)]
    struct Claims {
        sub: String,
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Claims {
            sub: user.to_string(),
        },
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HS256 encoding cannot fail")
}

/// One message of Centrifugo's JSON protocol, as far as the bench cares.
#[derive(Debug, PartialEq)]
enum Incoming {
    /// The server's ping, `{}`: answered with `{}`.
    Ping,
    /// The reply to command `id`, with the error's text when it failed.
    Reply { id: u64, error: Option<String> },
    /// A publication carrying its scheduled send time.
    Publication { sent_micros: i64 },
    /// Anything else (a join, a disconnect push, a publication of others).
    Other,
}

/// A WebSocket frame's messages: Centrifugo may put several in one frame,
/// one per line.
fn parse_frame(text: &str) -> impl Iterator<Item = Incoming> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(parse_line)
}

fn parse_line(line: &str) -> Incoming {
    // The hot path, ten thousand times per publication: no JSON parse.
    if line.starts_with("{\"push\"") {
        return match deliveries::sent_micros(line) {
            Some(sent_micros) if line.contains("\"pub\"") => Incoming::Publication { sent_micros },
            _ => Incoming::Other,
        };
    }
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        return Incoming::Other;
    };
    match v.as_object() {
        Some(o) if o.is_empty() => Incoming::Ping,
        Some(o) => match o.get("id").and_then(Value::as_u64) {
            Some(id) => Incoming::Reply {
                id,
                error: o.get("error").map(|e| e.to_string()),
            },
            None => Incoming::Other,
        },
        None => Incoming::Other,
    }
}

/// A Centrifugo started for one engine; killed by `stop` (or when dropped).
struct Server {
    child: tokio::process::Child,
    port: u16,
    /// Holds config.json and centrifugo.log.
    dir: PathBuf,
}

impl Server {
    async fn start(
        binary: &Path,
        engine: Engine,
        secrets: &Secrets,
        redis_url: &str,
    ) -> anyhow::Result<Server> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!(
            "imstream-bench-centrifugo-{}-{}",
            std::process::id(),
            engine.name()
        ));
        std::fs::create_dir_all(&dir)?;
        let config_path = dir.join("config.json");
        std::fs::write(
            &config_path,
            serde_json::to_vec_pretty(&config(engine, port, secrets, redis_url))?,
        )?;
        let log = std::fs::File::create(dir.join("centrifugo.log"))?;
        let child = tokio::process::Command::new(binary)
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e}", binary.display()))?;
        let mut server = Server { child, port, dir };
        server.wait_healthy().await?;
        Ok(server)
    }

    /// Until `/health` answers 200, or fail with the log's tail.
    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/health", self.port);
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        let http = reqwest::Client::new();
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "centrifugo exited ({status}) before answering {url}:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "centrifugo did not answer {url} within {} s:\n{}",
                    START_TIMEOUT.as_secs(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("centrifugo.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kills Centrifugo; removes its folder unless its log is wanted.
    async fn stop(mut self, remove_dir: bool) {
        let _ = self.child.kill().await;
        if remove_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A loopback port nothing listens on now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Opens a session: WebSocket with `TCP_NODELAY`, connect, subscribe.
async fn open_session(url: &str, token: &str, channel: &str) -> anyhow::Result<Ws> {
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true).await?;
    command(&mut ws, json!({"id": 1, "connect": {"token": token}})).await?;
    command(&mut ws, json!({"id": 2, "subscribe": {"channel": channel}})).await?;
    Ok(ws)
}

/// Sends one command and waits for its reply; fails on an error reply.
async fn command(ws: &mut Ws, cmd: Value) -> anyhow::Result<()> {
    let id = cmd["id"].as_u64().unwrap_or_default();
    ws.send(Message::Text(cmd.to_string().into())).await?;
    while let Some(frame) = ws.next().await {
        let Message::Text(text) = frame? else {
            continue;
        };
        for incoming in parse_frame(&text) {
            match incoming {
                Incoming::Reply { id: r, error } if r == id => {
                    return match error {
                        None => Ok(()),
                        Some(e) => Err(anyhow::anyhow!("command {id} refused: {e}")),
                    };
                }
                Incoming::Ping => ws.send(Message::Text("{}".into())).await?,
                _ => {}
            }
        }
    }
    anyhow::bail!("connection closed waiting for the reply to command {id}")
}

/// Listens on one session until the task is aborted: records each
/// publication's latency, answers pings. Returns when the server closes
/// the connection.
async fn listen(ws: Ws, session: usize, deliveries: Arc<Deliveries>) {
    let (mut sink, mut stream) = ws.split();
    while let Some(Ok(frame)) = stream.next().await {
        let Message::Text(text) = frame else { continue };
        for incoming in parse_frame(&text) {
            match incoming {
                Incoming::Publication { sent_micros } => deliveries.record(session, sent_micros),
                Incoming::Ping => {
                    // Unanswered, Centrifugo closes the session.
                    let answered = sink.send(Message::Text("{}".into())).await;
                    if answered.is_err() {
                        return;
                    }
                }
                _ => {}
            }
        }
    }
}

impl CentrifugoBench {
    /// Starts Centrifugo with `engine`, measures, stops it.
    pub async fn run(&self, engine: Engine) -> anyhow::Result<Outcome> {
        anyhow::ensure!(
            engine != Engine::Redis || !self.redis_url.starts_with("redis+cluster"),
            "Centrifugo's Redis engine needs one Redis here: pass --centrifugo-redis-url redis://…"
        );
        let secrets = Secrets::generate();
        let server = Server::start(&self.binary, engine, &secrets, &self.redis_url).await?;
        println!(
            "centrifugo {}: {} on 127.0.0.1:{}",
            engine.name(),
            self.binary.display(),
            server.port
        );
        match self.measure(engine, server.port, &secrets).await {
            Ok(outcome) => {
                server.stop(true).await;
                Ok(outcome)
            }
            Err(e) => {
                let log = server.dir.join("centrifugo.log");
                server.stop(false).await;
                Err(e.context(format!("centrifugo's log: {}", log.display())))
            }
        }
    }

    async fn measure(
        &self,
        engine: Engine,
        port: u16,
        secrets: &Secrets,
    ) -> anyhow::Result<Outcome> {
        let channel = format!("{NAMESPACE}:fanout");
        let ws_url = format!("ws://127.0.0.1:{port}/connection/websocket");
        let deliveries = Arc::new(Deliveries::default());
        // Sessions whose connection the server closed before the end.
        let closed = Arc::new(AtomicU64::new(0));

        // Each session listens from the moment it is subscribed: Centrifugo
        // closes a connection that leaves its pings unanswered.
        let started = std::time::Instant::now();
        let sem = Arc::new(tokio::sync::Semaphore::new(self.connect_concurrency.max(1)));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut listeners = Vec::with_capacity(self.sessions);
        for i in 0..self.sessions {
            let (url, channel, token) = (
                ws_url.clone(),
                channel.clone(),
                connect_token(&secrets.hmac, i + 1),
            );
            let (sem, ready, deliveries, closed) = (
                sem.clone(),
                ready_tx.clone(),
                deliveries.clone(),
                closed.clone(),
            );
            listeners.push(tokio::spawn(async move {
                let permit = sem.acquire_owned().await;
                let ws = match open_session(&url, &token, &channel).await {
                    Ok(ws) => ws,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                drop(permit);
                let _ = ready.send(Ok(()));
                listen(ws, i, deliveries).await;
                closed.fetch_add(1, Ordering::Relaxed);
            }));
        }
        drop(ready_tx);
        for _ in 0..self.sessions {
            match ready_rx.recv().await {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    listeners.iter().for_each(|l| l.abort());
                    return Err(e.context("opening a Centrifugo session"));
                }
                None => anyhow::bail!("a session task ended before it connected"),
            }
        }
        println!(
            "{} sessions connected and subscribed in {:.1} s",
            self.sessions,
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;

        let http = reqwest::Client::new();
        let publish_url = format!("http://127.0.0.1:{port}/api/publish");
        let failed = Arc::new(AtomicU64::new(0));
        let mut posts = Vec::new();
        let costs = super::Costs::start();
        let end = tokio::time::Instant::now() + self.duration;
        let mut schedule = OpenLoop::new(self.rate, end)?;
        // Each publication is its own request, in flight while the next is
        // due: a slow answer delays no later publication.
        while let Some((_, content)) = schedule.next().await {
            let request = http
                .post(&publish_url)
                .header("X-API-Key", &secrets.api_key)
                .json(&json!({"channel": channel, "data": {"content": content}}));
            let failed = failed.clone();
            posts.push(tokio::spawn(async move {
                if let Err(e) = publish(request).await {
                    if failed.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("centrifugo publish failed: {e:#}");
                    }
                }
            }));
        }
        for post in posts {
            let _ = post.await;
        }
        let published = schedule.published();
        tokio::time::sleep(GRACE).await;
        for listener in &listeners {
            listener.abort();
        }
        for listener in listeners {
            let _ = listener.await;
        }
        let redis = engine == Engine::Redis;
        let cost = costs.figures(|label| label == "centrifugo" || (redis && label == "redis"));
        let failed = failed.load(Ordering::Relaxed);
        let closed = closed.load(Ordering::Relaxed);
        let outcome = Outcome {
            system: format!("centrifugo {}", engine.name()),
            expected: published.sent * self.sessions as u64,
            delivered: deliveries.delivered(),
            latency: deliveries.latencies(),
            published,
            cost,
        };
        if failed > 0 {
            println!("{failed} publish requests failed (the publication may still have gone out)");
        }
        if closed > 0 {
            println!("{closed} sessions closed by the server before the end");
        }
        println!("{}", outcome.summary());
        println!("{}", costs.report(outcome.delivered, "deliveries"));
        Ok(outcome)
    }
}

/// One `POST /api/publish`; Centrifugo answers 200 with `{"error":…}` when
/// it refuses.
async fn publish(request: reqwest::RequestBuilder) -> anyhow::Result<()> {
    let response = request.send().await?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    anyhow::ensure!(
        status.is_success() && body.get("error").is_none(),
        "{status}: {body}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_declares_the_engine_keys_and_api() {
        let secrets = Secrets {
            hmac: "h".into(),
            api_key: "k".into(),
        };
        let memory = config(Engine::Memory, 18000, &secrets, "redis://127.0.0.1:16379");
        assert_eq!(
            memory["http_server"],
            json!({"address": "127.0.0.1", "port": 18000})
        );
        assert_eq!(memory["client"]["token"]["hmac_secret_key"], "h");
        assert_eq!(memory["http_api"]["key"], "k");
        assert_eq!(memory["health"]["enabled"], true);
        assert_eq!(memory["engine"], json!({"type": "memory"}));
        assert_eq!(
            memory["channel"]["namespaces"],
            json!([{"name": "bench", "allow_subscribe_for_client": true}])
        );

        let redis = config(Engine::Redis, 18000, &secrets, "redis://127.0.0.1:16379/5");
        assert_eq!(redis["engine"]["type"], "redis");
        assert_eq!(
            redis["engine"]["redis"]["address"],
            json!(["redis://127.0.0.1:16379/5"])
        );
        assert_eq!(redis["engine"]["redis"]["prefix"], REDIS_PREFIX);
    }

    #[test]
    fn connect_token_names_the_user() {
        let token = connect_token("secret", 42);
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        let data = jsonwebtoken::decode::<Value>(
            &token,
            &jsonwebtoken::DecodingKey::from_secret(b"secret"),
            &validation,
        )
        .expect("valid token");
        assert_eq!(data.claims, json!({"sub": "42"}));
        assert!(jsonwebtoken::decode::<Value>(
            &token,
            &jsonwebtoken::DecodingKey::from_secret(b"other"),
            &validation
        )
        .is_err());
    }

    #[test]
    fn frames_split_into_their_messages() {
        let frame = concat!(
            r#"{"push":{"channel":"bench:fanout","pub":{"data":{"content":"fb:1700000000000001"},"offset":1}}}"#,
            "\n",
            r#"{"push":{"channel":"bench:fanout","pub":{"data":{"content":"fb:1700000000000002"},"offset":2}}}"#,
            "\n",
            "{}\n",
            r#"{"id":2,"subscribe":{}}"#,
            "\n",
            r#"{"id":1,"error":{"code":109,"message":"token expired"}}"#,
            "\n",
            r#"{"push":{"channel":"bench:fanout","join":{"info":{"user":"7"}}}}"#,
            "\n",
            r#"{"push":{"channel":"bench:fanout","pub":{"data":{"content":"hi"}}}}"#,
        );
        assert_eq!(
            parse_frame(frame).collect::<Vec<_>>(),
            vec![
                Incoming::Publication {
                    sent_micros: 1_700_000_000_000_001
                },
                Incoming::Publication {
                    sent_micros: 1_700_000_000_000_002
                },
                Incoming::Ping,
                Incoming::Reply { id: 2, error: None },
                Incoming::Reply {
                    id: 1,
                    error: Some(r#"{"code":109,"message":"token expired"}"#.into())
                },
                Incoming::Other,
                Incoming::Other,
            ]
        );
        // One message per frame, with or without a trailing newline.
        let all = |text| parse_frame(text).collect::<Vec<_>>();
        assert_eq!(all("{}"), vec![Incoming::Ping]);
        assert_eq!(all("{}\n"), vec![Incoming::Ping]);
        assert_eq!(all("not json"), vec![Incoming::Other]);
    }
}
