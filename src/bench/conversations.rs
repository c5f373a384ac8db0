//! `imstream bench conversations`: the chat list of a user in N
//! conversations (`{get topic="me" what="sub"}` over WebSocket) and the
//! unread badge (`GET /v1/me/unread`), each at a fixed rate, with p50/p99
//! and the box's CPU-seconds per 1,000 requests.
//!
//! Setup puts the user in N groups through the log (`GroupCreated`, one
//! `MessageSent` each, as a replay would) and waits for the conversations
//! projection to list them all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::config::Config;
use crate::events::{
    new_event_id, now_ms, EventCodec, GroupCreated, GroupEvent, GroupEventBody, MessageSent,
};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::store::month::ShardMonth;

use super::Setup;

#[derive(Debug, Clone, clap::Args)]
pub struct ConversationsArgs {
    /// Gateway base URL (http://host:port).
    #[arg(long, default_value = "http://127.0.0.1:6060")]
    pub url: String,
    /// Conversations of the user.
    #[arg(long, default_value_t = 500)]
    pub conversations: i64,
    /// Requests per second.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds per figure.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// WebSocket sessions the list requests are spread over.
    #[arg(long, default_value_t = 20)]
    pub sessions: usize,
    #[arg(long)]
    pub tenant: Option<String>,
}

pub async fn run(config: &Config, args: ConversationsArgs) -> anyhow::Result<()> {
    let Setup {
        tenant,
        pool,
        tokens,
        run,
    } = Setup::new(config, args.tenant.as_deref())?;
    let user = 4_000_000i64 + (rand::random::<u16>() as i64) * 16;
    let token = tokens.issue(&tenant, user, "bench", 0, 0).token;
    let codec = EventCodec::new(&config.registry.url)?;
    let producer = EventProducer::new(&config.kafka, codec)?;
    let month = ShardMonth::of(chrono::Utc::now()).to_string();
    let mut sends = Vec::new();
    for i in 0..args.conversations {
        let topic = format!("grpCv{run}x{i}");
        let key = format!("{tenant}:{topic}");
        let created = GroupEvent::new(
            &tenant,
            &topic,
            user + 1,
            GroupEventBody::GroupCreated(GroupCreated {
                group_id: (rand::random::<i64>() & 0x3fff_ffff_ffff_ffff) | 1,
                name: format!("bench group {i}"),
                owner_uid: user + 1,
                members: vec![user],
            }),
        );
        let sent = GroupEvent::new(
            &tenant,
            &topic,
            user + 1,
            GroupEventBody::MessageSent(MessageSent {
                message_id: (rand::random::<i64>() & 0x3fff_ffff_ffff_ffff) | 1,
                group_id: 1,
                seq: 1,
                shard_month: month.clone(),
                client_msg_id: Some(new_event_id()),
                from_user: user + 1,
                msg_type: "text".into(),
                head: None,
                content: Some(json!(format!("hello in {i}")).to_string()),
                mentioned_user_ids: Vec::new(),
                mention_all: false,
                reply_seq: None,
                root_seq: None,
                file_count: 0,
                content_size: 10,
                has_risk: false,
                audit_status: "pass".into(),
                created_at: now_ms(),
                expires_at: None,
            }),
        );
        let producer = producer.clone();
        sends.push(tokio::spawn(async move {
            producer
                .send(TopicKind::GroupEvents, &key, &created, None)
                .await?;
            producer
                .send(TopicKind::GroupEvents, &key, &sent, None)
                .await
        }));
    }
    for s in sends {
        s.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM im_conversations c JOIN im_conversation_topics t USING (topic) \
             WHERE c.uid = ? AND t.last_seq = 1",
        )
        .bind(user)
        .fetch_one(&pool)
        .await?;
        if n >= args.conversations {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{n} of {} conversations projected after 180 s; is the conversations pipeline running?",
            args.conversations
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "bench conversations: a user in {} conversations, {} requests/s for {} s each",
        args.conversations, args.rate, args.duration
    );

    // The list over WebSocket, spread over sessions subscribed to `me`.
    let ws_url = args.url.replacen("http", "ws", 1);
    let mut sessions = Vec::new();
    for _ in 0..args.sessions {
        sessions.push(MeSession::open(&ws_url, &token).await?);
    }
    let costs = super::Costs::start();
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let end = tokio::time::Instant::now() + Duration::from_secs(args.duration);
    let mut at = tokio::time::Instant::now();
    let mut waits = Vec::new();
    let mut i = 0usize;
    while at < end {
        tokio::time::sleep_until(at).await;
        let s = &sessions[i % sessions.len()];
        waits.push(s.ask(format!("l{i}"), args.conversations as usize, at)?);
        i += 1;
        at += interval;
    }
    let mut hist = super::histogram();
    for w in waits {
        let us = tokio::time::timeout(Duration::from_secs(30), w).await???;
        // Beyond the histogram's range (a backlog): counted at its top.
        hist.record(us.clamp(1, 59_000_000))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{:>22}: {}  ({:.0}/s achieved)\n{:>22}  {}",
        "{get me what=sub}",
        super::summary(&hist),
        hist.len() as f64 / elapsed,
        "",
        costs.report(hist.len(), "lists")
    );

    // The badge over HTTP.
    let web = reqwest::Client::new();
    let costs = super::Costs::start();
    let started = Instant::now();
    let end = tokio::time::Instant::now() + Duration::from_secs(args.duration);
    let mut at = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    while at < end {
        tokio::time::sleep_until(at).await;
        let (web, url, token, scheduled) = (
            web.clone(),
            format!("{}/v1/me/unread", args.url),
            token.clone(),
            at,
        );
        let want = args.conversations;
        tasks.push(tokio::spawn(async move {
            let body: Value = web.get(url).bearer_auth(token).send().await?.json().await?;
            anyhow::ensure!(
                body["conversations_with_unread"] == json!(want),
                "unexpected badge {body}"
            );
            Ok::<_, anyhow::Error>(scheduled.elapsed().as_micros() as u64)
        }));
        at += interval;
    }
    let mut hist = super::histogram();
    for t in tasks {
        hist.record(t.await??.clamp(1, 59_000_000))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{:>22}: {}  ({:.0}/s achieved)\n{:>22}  {}",
        "GET /v1/me/unread",
        super::summary(&hist),
        hist.len() as f64 / elapsed,
        "",
        costs.report(hist.len(), "badges")
    );
    Ok(())
}

type Waiters = Arc<
    Mutex<
        HashMap<
            String,
            (
                tokio::time::Instant,
                usize,
                tokio::sync::oneshot::Sender<anyhow::Result<u64>>,
            ),
        >,
    >,
>;

/// A session subscribed to `me` whose reader task answers each request id
/// with its latency (from when it was scheduled).
struct MeSession {
    tx: tokio::sync::mpsc::UnboundedSender<String>,
    waiters: Waiters,
}

impl MeSession {
    async fn open(url: &str, token: &str) -> anyhow::Result<MeSession> {
        let mut ws = super::client::open(url).await?;
        for msg in [
            json!({"hi": {"id": "1", "ver": "0.25.3", "ua": "imstream-bench"}}),
            json!({"login": {"id": "2", "scheme": "token", "secret": token}}),
            json!({"sub": {"id": "3", "topic": "me"}}),
        ] {
            ws.send(Message::Text(msg.to_string().into())).await?;
            let id = msg
                .as_object()
                .and_then(|o| o.values().next())
                .and_then(|v| v["id"].as_str())
                .unwrap_or_default()
                .to_string();
            loop {
                let Some(frame) = ws.next().await else {
                    anyhow::bail!("closed during set-up")
                };
                let Message::Text(text) = frame? else {
                    continue;
                };
                let v: Value = serde_json::from_str(&text)?;
                if v["ctrl"]["id"] == json!(id) {
                    anyhow::ensure!(
                        v["ctrl"]["code"].as_u64().unwrap_or(0) < 300,
                        "set-up refused: {v}"
                    );
                    break;
                }
            }
        }
        let (mut sink, mut stream) = ws.split();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            while let Some(text) = rx.recv().await {
                if sink.send(Message::Text(text.into())).await.is_err() {
                    break;
                }
            }
        });
        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        let w = waiters.clone();
        tokio::spawn(async move {
            while let Some(Ok(frame)) = stream.next().await {
                let Message::Text(text) = frame else { continue };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                let (id, subs) = match (&v["meta"]["id"], &v["ctrl"]["id"]) {
                    (Value::String(id), _) => {
                        (id.clone(), v["meta"]["sub"].as_array().map_or(0, Vec::len))
                    }
                    (_, Value::String(id)) => (id.clone(), 0),
                    _ => continue,
                };
                if let Some((at, want, done)) = w.lock().expect("waiters").remove(&id) {
                    let result = if subs == want {
                        Ok(at.elapsed().as_micros() as u64)
                    } else {
                        Err(anyhow::anyhow!(
                            "{id}: {subs} entries, want {want}: {}",
                            &text[..text.len().min(300)]
                        ))
                    };
                    let _ = done.send(result);
                }
            }
        });
        Ok(MeSession { tx, waiters })
    }

    /// Asks for the list; the latency counts from `scheduled` (open loop:
    /// a stall in sending is not hidden).
    fn ask(
        &self,
        id: String,
        want: usize,
        scheduled: tokio::time::Instant,
    ) -> anyhow::Result<tokio::sync::oneshot::Receiver<anyhow::Result<u64>>> {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.waiters
            .lock()
            .expect("waiters")
            .insert(id.clone(), (scheduled, want, done));
        self.tx
            .send(json!({"get": {"id": id, "topic": "me", "what": "sub"}}).to_string())
            .map_err(|_| anyhow::anyhow!("session closed"))?;
        Ok(wait)
    }
}
