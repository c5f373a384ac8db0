//! The shard lifecycle of seed 000 §10 against the real services:
//! `sealing → sealed` only when the store pipeline has no lag and no store
//! dead letter of that month waits for a replay; `archived` only through
//! the explicit `imstream shards archive` / `imstream shards drop --confirm`
//! commands, after a verified archive; reads of an archived month answer a
//! clear 410 naming the month.
//!
//! Clocks: the stack starts at 2026-09-15 (tables 202608..202611, active
//! 202609); passes at 2026-10-09 (more than `sealing_days` = 7 after the
//! end of September) may seal 202608 and 202609.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::MySqlPool;

use imstream::events::{now_ms, EventCodec, GroupEvent, GroupEventBody, MessageSent};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::redis_util::Clock;
use imstream::store::month::ShardMonth;
use imstream::store::sealing::Hold;
use imstream::store::shards::{ShardManager, ShardPass};

use common::{send_http, wait_for, write_config_file, Stack};

/// Within August's sealing period, so the first pass seals nothing whatever
/// the store backlog reads (an empty, just-created topic has no lag).
const SEPTEMBER: &str = "2026-09-05T12:00:00Z";
/// Two days after September's end: still in its sealing period.
const EARLY_OCTOBER: &str = "2026-10-03T00:00:00Z";
/// Eight days after September's end: past its sealing period.
const MID_OCTOBER: &str = "2026-10-09T00:00:00Z";

fn month(m: &str) -> ShardMonth {
    ShardMonth::parse(m).unwrap()
}

/// One shard-manager pass at `now`; this tenant's result.
async fn pass(stack: &Stack, now: &str) -> ShardPass {
    let manager = ShardManager::connect(
        stack.config(),
        Clock::from_override(now),
        imstream::pipeline::store_topics(stack.config()).expect("store topics"),
    )
    .await
    .expect("shard manager");
    let mut passes = manager.pass().await.expect("shard pass");
    assert_eq!(passes.len(), 1);
    passes.remove(0).1
}

fn holds_of(pass: &ShardPass, m: &str) -> Option<Vec<Hold>> {
    pass.held
        .iter()
        .find(|(x, _)| *x == month(m))
        .map(|(_, h)| h.clone())
}

async fn status(pool: &MySqlPool, m: &str) -> String {
    sqlx::query_scalar("SELECT status FROM im_group_message_shards WHERE shard_month = ?")
        .bind(m)
        .fetch_one(pool)
        .await
        .expect("catalog row")
}

async fn table_exists(pool: &MySqlPool, m: &str) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(format!("im_group_messages_{m}"))
    .fetch_one(pool)
    .await
    .unwrap();
    n > 0
}

fn message_sent(stack: &Stack, topic: &str, seq: i64, m: &str) -> GroupEvent {
    let now = now_ms();
    GroupEvent::new(
        stack.tenant(),
        topic,
        7,
        GroupEventBody::MessageSent(MessageSent {
            message_id: (rand::random::<u32>() as i64) << 20 | seq,
            group_id: 42,
            seq,
            shard_month: m.to_string(),
            client_msg_id: Some(format!("{topic}-{seq}")),
            from_user: 7,
            msg_type: "text".into(),
            head: None,
            content: Some(format!("{{\"txt\":\"{topic} {seq}\"}}")),
            mentioned_user_ids: vec![],
            mention_all: false,
            reply_seq: None,
            root_seq: None,
            file_count: 0,
            content_size: 12,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: now,
            expires_at: None,
        }),
    )
}

fn producer(stack: &Stack) -> EventProducer {
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    EventProducer::new(&stack.config().kafka, codec).unwrap()
}

/// `imstream <args>` as a user runs it, with this stack's config.
fn imstream(stack: &Stack, args: &[&str]) -> (bool, String) {
    let config = write_config_file(stack.config(), &format!("shards-{}", stack.world.id));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_imstream"))
        .arg("--config")
        .arg(&config)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("run imstream");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Sealing waits for its period, then for the store pipeline's lag, then
/// for a pending dead letter of the month; a dead letter of one month does
/// not hold another; a DLQ replay clears it and the month is sealed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sealing_waits_for_store_lag_and_dead_letters() {
    let mut stack = Stack::prepared(Some(SEPTEMBER)).await;
    let pool = stack.pool();
    let topic = "grpSealing";
    // A late September message while the store pipeline is not running.
    let late = message_sent(&stack, topic, 1, "202609");
    let key = format!("{}:{topic}", stack.tenant());
    producer(&stack)
        .send(TopicKind::GroupEvents, &key, &late, None)
        .await
        .expect("produce");

    // Within the sealing period nothing is sealed, whatever the backlog.
    let early = pass(&stack, EARLY_OCTOBER).await;
    assert_eq!(status(&pool, "202609").await, "sealing");
    assert!(
        matches!(
            holds_of(&early, "202609").as_deref(),
            Some([Hold::SealingPeriod { .. }])
        ),
        "{early:?}"
    );

    // Past it, the store pipeline's lag holds every sealing month.
    let lagging = pass(&stack, MID_OCTOBER).await;
    for m in ["202608", "202609"] {
        assert_eq!(status(&pool, m).await, "sealing", "{m}");
        let holds = holds_of(&lagging, m).unwrap_or_default();
        assert!(
            holds
                .iter()
                .any(|h| matches!(h, Hold::StoreLag { records } if *records >= 1)),
            "{m}: {holds:?}"
        );
    }
    assert!(lagging.sealed.is_empty(), "{lagging:?}");

    // A September dead letter waiting in the store DLQ.
    let dead = message_sent(&stack, topic, 2, "202609");
    let dlq = TopicNames::new(&stack.config().kafka).dlq(TopicKind::GroupEvents, "store");
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let names = TopicNames::new(&stack.config().kafka);
    let payload = codec
        .encode(&names.name(TopicKind::GroupEvents), &dead)
        .await
        .expect("encode");
    producer(&stack)
        .send_bytes(
            &dlq,
            key.as_bytes(),
            &payload,
            &[("dlq.reason", b"test".as_slice())],
        )
        .await
        .expect("dead letter");

    // The store pipeline catches up: August has nothing holding it and is
    // sealed; September waits for its dead letter.
    stack.start_pipeline("store").await;
    let s = &stack;
    let held = wait_for(
        "the store lag to clear",
        Duration::from_secs(60),
        || async move {
            let p = pass(s, MID_OCTOBER).await;
            match holds_of(&p, "202609") {
                Some(h) if h.iter().any(|h| matches!(h, Hold::StoreLag { .. })) => {
                    Err(format!("{h:?}"))
                }
                _ => Ok(p),
            }
        },
    )
    .await;
    assert_eq!(
        holds_of(&held, "202609"),
        Some(vec![Hold::DeadLetters { records: 1 }]),
        "{held:?}"
    );
    assert_eq!(status(&pool, "202609").await, "sealing");
    assert_eq!(status(&pool, "202608").await, "sealed");
    let stored: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ?")
            .bind(topic)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        stored, 1,
        "the late message is stored while September is sealing"
    );

    // `imstream dlq replay store` stores the dead letter; then September seals.
    let (ok, out) = imstream(&stack, &["dlq", "replay", "store"]);
    assert!(ok, "dlq replay: {out}");
    let sealed = pass(&stack, MID_OCTOBER).await;
    assert_eq!(sealed.sealed, vec![month("202609")], "{sealed:?}");
    assert_eq!(status(&pool, "202609").await, "sealed");
    let stored: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ?")
            .bind(topic)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(stored, 2);
}

/// `seq` of every line of an archive file, with the line count and SHA-256.
fn read_archive(path: &Path) -> (Vec<i64>, String) {
    use sha2::Digest;
    let bytes = std::fs::read(path).expect("archive file");
    let sha = hex::encode(sha2::Sha256::digest(&bytes));
    let seqs = String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| {
            let row: Value = serde_json::from_str(l).expect("one JSON object per line");
            row["seqid"].as_i64().expect("seqid")
        })
        .collect();
    (seqs, sha)
}

/// Archive + drop: refused before a verified archive (and without
/// --confirm, and when the file was tampered with); afterwards the catalog
/// says archived, the table is gone, the file's rows and hash match the
/// manifest, and reads into the month answer 410 naming it while reads of
/// live months still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn archive_then_drop_archives_the_month_and_reads_answer_410() {
    let mut stack = Stack::prepared(Some(SEPTEMBER)).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let gw = stack.start_gateway("node-a").await;
    let pool = stack.pool();
    let topic = "grpArchive";
    let (owner, alice) = (9001, 9002);
    stack.create_group(topic, owner, &[alice]).await;
    let client = reqwest::Client::new();
    let token = stack.token(alice, "web");
    for i in 1..=5 {
        let (status, body) = send_http(&client, gw, &token, topic, &format!("sep-{i}"), "hi").await;
        assert_eq!(status, 202, "{body}");
    }
    let pool_ref = &pool;
    wait_for("5 September rows", Duration::from_secs(30), || async move {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ?")
                .bind(topic)
                .fetch_one(pool_ref)
                .await
                .map_err(|e| e.to_string())?;
        if n == 5 {
            Ok(())
        } else {
            Err(format!("{n} rows"))
        }
    })
    .await;

    // October: the pass moves the active month to 202610 and, once the
    // store pipeline committed everything, seals September; a gateway
    // started now writes to 202610.
    let s = &stack;
    wait_for("September sealed", Duration::from_secs(60), || async move {
        let p = pass(s, MID_OCTOBER).await;
        if status(pool_ref, "202609").await == "sealed" {
            Ok(())
        } else {
            Err(format!("{:?}", p.held))
        }
    })
    .await;
    let gw_oct = stack.start_gateway("node-b").await;
    let mut october = Vec::new();
    for i in 1..=3 {
        let (status, body) =
            send_http(&client, gw_oct, &token, topic, &format!("oct-{i}"), "hi").await;
        assert_eq!(status, 202, "{body}");
        october.push(body["seq"].as_i64().unwrap());
    }
    assert_eq!(october, vec![6, 7, 8]);
    wait_for("3 October rows", Duration::from_secs(30), || async move {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM im_group_messages_202610 WHERE topic = ?")
                .bind(topic)
                .fetch_one(pool_ref)
                .await
                .map_err(|e| e.to_string())?;
        if n == 3 {
            Ok(())
        } else {
            Err(format!("{n} rows"))
        }
    })
    .await;

    let root: PathBuf = common::repo_root()
        .join("target/tmp")
        .join(format!("archive-{}", stack.world.id));
    let root_s = root.display().to_string();
    let tenant = stack.tenant().to_string();

    // No archive yet: the drop is refused and nothing changes.
    let (ok, out) = imstream(
        &stack,
        &[
            "shards",
            "drop",
            &tenant,
            "202609",
            "--from",
            &root_s,
            "--confirm",
        ],
    );
    assert!(!ok, "drop without an archive must fail: {out}");
    assert!(out.contains("no archive of month 202609"), "{out}");
    assert!(table_exists(&pool, "202609").await);
    assert_eq!(status(&pool, "202609").await, "sealed");
    // A month that is not sealed cannot be archived.
    let (ok, out) = imstream(
        &stack,
        &["shards", "archive", &tenant, "202610", "--to", &root_s],
    );
    assert!(!ok && out.contains("202610 is writable"), "{out}");

    // Archive: rows and hash in the manifest match the file.
    let (ok, out) = imstream(
        &stack,
        &["shards", "archive", &tenant, "202609", "--to", &root_s],
    );
    assert!(ok, "archive: {out}");
    let dir = root.join(&tenant).join("202609");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    let (seqs, sha) = read_archive(&dir.join("messages.jsonl"));
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    assert_eq!(manifest["row_count"], json!(5));
    assert_eq!(manifest["sha256"], json!(sha));
    assert_eq!(
        manifest["topics"],
        json!([{"topic": topic, "count": 5, "min_seq": 1, "max_seq": 5}])
    );
    assert!(out.contains(&sha), "{out}");

    // Without --confirm: refused.
    let (ok, out) = imstream(
        &stack,
        &["shards", "drop", &tenant, "202609", "--from", &root_s],
    );
    assert!(!ok && out.contains("--confirm"), "{out}");
    // A tampered file does not verify: refused.
    let data = dir.join("messages.jsonl");
    let original = std::fs::read(&data).unwrap();
    std::fs::write(&data, [&original[..], b"{\"seqid\":99}\n"].concat()).unwrap();
    let (ok, out) = imstream(
        &stack,
        &[
            "shards",
            "drop",
            &tenant,
            "202609",
            "--from",
            &root_s,
            "--confirm",
        ],
    );
    assert!(!ok && out.contains("does not verify"), "{out}");
    assert!(table_exists(&pool, "202609").await);
    std::fs::write(&data, &original).unwrap();

    // Verified: dropped, archived.
    let (ok, out) = imstream(
        &stack,
        &[
            "shards",
            "drop",
            &tenant,
            "202609",
            "--from",
            &root_s,
            "--confirm",
        ],
    );
    assert!(ok, "drop: {out}");
    assert_eq!(status(&pool, "202609").await, "archived");
    assert!(!table_exists(&pool, "202609").await);
    let row_count: i64 = sqlx::query_scalar(
        "SELECT row_count FROM im_group_message_shards WHERE shard_month = '202609'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row_count, 5);
    // The next pass leaves an archived month alone.
    pass(&stack, MID_OCTOBER).await;
    assert_eq!(status(&pool, "202609").await, "archived");

    // Reads: the live month still answers; a read into September is a 410
    // that names the month, over HTTP and WebSocket.
    let base = format!("http://{gw_oct}/v1/groups/{topic}");
    let get = |url: String| {
        let (client, token) = (client.clone(), token.clone());
        async move {
            let resp = client.get(url).bearer_auth(&token).send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, body) = get(format!("{base}/messages?limit=3")).await;
    assert_eq!(status, 200, "{body}");
    let seqs: Vec<i64> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![8, 7, 6]);
    let (status, body) = get(format!("{base}/messages?limit=10")).await;
    assert_eq!(status, 410, "{body}");
    assert!(
        body.to_string().contains("month 202609 is archived"),
        "{body}"
    );
    let (status, body) = get(format!("{base}/messages/3")).await;
    assert_eq!(status, 410, "{body}");
    let mut ws = realtime_ws::Ws::connect(gw_oct, &token).await;
    let ctrl = ws
        .request(json!({"get": {"topic": topic, "what": "data", "data": {"limit": 10}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(410), "{ctrl}");
    assert!(ctrl.to_string().contains("202609"), "{ctrl}");
}

/// A minimal Tinode WebSocket session for the 410 check.
mod realtime_ws {
    use futures::{SinkExt, StreamExt};
    use serde_json::{json, Value};
    use std::time::Duration;
    use tokio_tungstenite::tungstenite::Message;

    pub struct Ws {
        stream: tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        next_id: u64,
    }

    impl Ws {
        pub async fn connect(addr: std::net::SocketAddr, token: &str) -> Ws {
            let (stream, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v0/channels"))
                .await
                .expect("websocket");
            let mut ws = Ws { stream, next_id: 0 };
            let hi = ws.request(json!({"hi": {"ver": "0.25.3"}})).await;
            assert_eq!(hi["ctrl"]["code"], json!(201), "{hi}");
            let login = ws
                .request(json!({"login": {"scheme": "token", "secret": token}}))
                .await;
            assert_eq!(login["ctrl"]["code"], json!(200), "{login}");
            ws
        }

        /// Sends `msg` with a fresh id; returns the ctrl answering it.
        pub async fn request(&mut self, mut msg: Value) -> Value {
            self.next_id += 1;
            let id = self.next_id.to_string();
            let verb = msg.as_object().unwrap().keys().next().unwrap().clone();
            msg[&verb]["id"] = json!(id);
            self.stream
                .send(Message::Text(msg.to_string().into()))
                .await
                .expect("send");
            loop {
                let frame = tokio::time::timeout(Duration::from_secs(20), self.stream.next())
                    .await
                    .expect("a frame within 20 s")
                    .expect("socket open")
                    .expect("frame");
                if let Message::Text(t) = frame {
                    let v: Value = serde_json::from_str(&t).expect("json frame");
                    if v["ctrl"]["id"] == json!(id) {
                        return v;
                    }
                }
            }
        }
    }
}
