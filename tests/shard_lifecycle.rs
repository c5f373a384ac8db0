//! The shard lifecycle of seed 000 §10 against the real services:
//! `sealing → sealed` only when the store pipeline has no lag and no store
//! dead letter of that month waits for a replay; `archived` only through
//! the explicit `imstream shards archive` / `imstream shards drop --confirm`
//! commands, after a verified archive; reads of an archived month are then
//! served from its archive exactly as before.
//!
//! Clocks: the stack starts at 2026-09-15 (tables 202608..202611, active
//! 202609); passes at 2026-10-09 (more than `sealing_days` = 7 after the
//! end of September) may seal 202608 and 202609.

mod common;

use std::path::PathBuf;
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

use common::{send_http, wait_for, Stack};

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
    let (ok, out) = stack.imstream(&["dlq", "replay", "store"]);
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

/// Every read a client makes over HTTP that reaches September and October
/// (pages both ways across the months, exact messages, context), as
/// `(url, status, body)`.
async fn http_reads(
    client: &reqwest::Client,
    gw: std::net::SocketAddr,
    token: &str,
    topic: &str,
) -> Vec<(String, u16, Value)> {
    let mut out = Vec::new();
    let paths = [
        "messages?limit=3",
        "messages?limit=10",
        "messages?before=8&limit=4",
        "messages?before=7&limit=3",
        "messages?before=4&limit=10",
        "messages?since=1&limit=4",
        "messages?since=4&limit=10",
        "messages?since=6&limit=2",
        "messages/1",
        "messages/2",
        "messages/3",
        "messages/4",
        "messages/6",
        "messages/8",
        "messages/5/context?n=2",
        "messages/7/context?n=3",
        "messages/2/context?n=1",
    ];
    for path in paths {
        let url = format!("http://{gw}/v1/groups/{topic}/{path}");
        let resp = client.get(&url).bearer_auth(token).send().await.unwrap();
        let status = resp.status().as_u16();
        let mut body = resp.json::<Value>().await.unwrap_or(Value::Null);
        // Each answer names its own request: not part of what was read.
        if let Some(error) = body.as_object_mut() {
            error.remove("request_id");
        }
        out.push((path.to_string(), status, body));
    }
    out
}

fn assert_same_reads(before: &[(String, u16, Value)], after: &[(String, u16, Value)], who: &str) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        assert_eq!(b, a, "{who}: {} reads differently after the drop", b.0);
    }
}

/// Archive + drop: refused before a verified archive (and without
/// --confirm, and when an object was tampered with); afterwards the catalog
/// says archived, the table is gone, the manifest lists the objects with
/// their hashes, and every read into the month — pages across it and the
/// live month, exact, context, over HTTP and WebSocket, for a reader who
/// cleared a message from their view and one who did not, with an edit and
/// a recall in the month — answers exactly as before the drop, now from
/// the archive. Changing an archived message is refused (409); once an
/// archive object is damaged a fresh gateway answers 500 naming the month.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn archive_then_drop_keeps_the_month_readable_as_before() {
    let mut stack = Stack::prepared(Some(SEPTEMBER)).await;
    let root: PathBuf = common::repo_root()
        .join("target/tmp")
        .join(format!("archive-{}", stack.world.id));
    let root_s = root.display().to_string();
    // The gateways read archived months where the CLI writes them.
    stack.world.config.shards.archive_url = root_s.clone();
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let gw = stack.start_gateway("node-a").await;
    let pool = stack.pool();
    let topic = "grpArchive";
    let (owner, alice) = (9001, 9002);
    stack.create_group(topic, owner, &[alice]).await;
    let client = reqwest::Client::new();
    let token = stack.token(alice, "web");
    let owner_token = stack.token(owner, "web");
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
    // In September: alice edits 2 (the edit is message 6) and recalls 3;
    // the owner clears 4 from their own view.
    let resp = client
        .patch(format!("http://{gw}/v1/groups/{topic}/messages/2"))
        .bearer_auth(&token)
        .json(&json!({"content": {"txt": "hi, edited"}, "client_msg_id": "sep-edit-2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202, "{:?}", resp.text().await);
    let resp = client
        .delete(format!("http://{gw}/v1/groups/{topic}/messages/3"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202, "{:?}", resp.text().await);
    let resp = client
        .post(format!("http://{gw}/v1/groups/{topic}/history/clear"))
        .bearer_auth(&owner_token)
        .json(&json!({"ranges": [{"low": 4}]}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.text().await);
    wait_for(
        "6 September rows, 2 edited, 3 recalled, the owner's clear",
        Duration::from_secs(30),
        || async move {
            let q = |sql: &'static str| async move {
                sqlx::query_scalar::<_, i64>(sql)
                    .bind(topic)
                    .fetch_one(pool_ref)
                    .await
                    .map_err(|e| e.to_string())
            };
            let seen = (
                q("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ?").await?,
                q("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ? AND seqid = 2 AND version = 2").await?,
                q("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ? AND seqid = 3 AND status <> 'normal'").await?,
                q("SELECT COUNT(*) FROM im_dellog WHERE topic = ? AND deletedfor <> 0").await?,
            );
            if seen == (6, 1, 1, 1) {
                Ok(())
            } else {
                Err(format!("(rows, edited, recalled, cleared) = {seen:?}"))
            }
        },
    )
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
    assert_eq!(october, vec![7, 8, 9]);
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

    let tenant = stack.tenant().to_string();

    // No archive yet: the drop is refused and nothing changes.
    let (ok, out) = stack.imstream(&[
        "shards",
        "drop",
        &tenant,
        "202609",
        "--from",
        &root_s,
        "--confirm",
    ]);
    assert!(!ok, "drop without an archive must fail: {out}");
    assert!(out.contains("no archive of month 202609"), "{out}");
    assert!(table_exists(&pool, "202609").await);
    assert_eq!(status(&pool, "202609").await, "sealed");
    // A month that is not sealed cannot be archived.
    let (ok, out) = stack.imstream(&["shards", "archive", &tenant, "202610", "--to", &root_s]);
    assert!(!ok && out.contains("202610 is writable"), "{out}");

    // Archive: the manifest lists the objects with their sizes and hashes.
    let (ok, out) = stack.imstream(&["shards", "archive", &tenant, "202609", "--to", &root_s]);
    assert!(ok, "archive: {out}");
    let dir = root.join(&tenant).join("202609");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], json!("imstream.month-archive.v2"));
    assert_eq!(manifest["row_count"], json!(6));
    assert_eq!(
        manifest["topics"],
        json!([{"topic": topic, "count": 6, "min_seq": 1, "max_seq": 6}])
    );
    for object in manifest["objects"].as_array().unwrap() {
        use sha2::Digest;
        let bytes = std::fs::read(dir.join(object["name"].as_str().unwrap())).unwrap();
        assert_eq!(object["bytes"], json!(bytes.len()), "{object}");
        assert_eq!(
            object["sha256"],
            json!(hex::encode(sha2::Sha256::digest(&bytes))),
            "{object}"
        );
    }
    let data_sha = manifest["objects"][0]["sha256"].as_str().unwrap();
    assert!(out.contains(data_sha), "{out}");

    // Without --confirm: refused.
    let (ok, out) = stack.imstream(&["shards", "drop", &tenant, "202609", "--from", &root_s]);
    assert!(!ok && out.contains("--confirm"), "{out}");
    // A tampered data object does not verify: refused.
    let data = dir.join("messages.avro");
    let original = std::fs::read(&data).unwrap();
    let mut tampered = original.clone();
    let last = tampered.len() - 20;
    tampered[last] ^= 0x01;
    std::fs::write(&data, &tampered).unwrap();
    let (ok, out) = stack.imstream(&[
        "shards",
        "drop",
        &tenant,
        "202609",
        "--from",
        &root_s,
        "--confirm",
    ]);
    assert!(!ok && out.contains("does not verify"), "{out}");
    assert!(table_exists(&pool, "202609").await);
    std::fs::write(&data, &original).unwrap();

    // What readers see while the table is there.
    let alice_before = http_reads(&client, gw_oct, &token, topic).await;
    let owner_before = http_reads(&client, gw_oct, &owner_token, topic).await;
    let mut ws = realtime_ws::Ws::connect(gw_oct, &token).await;
    let (ctrl, ws_before) = ws
        .request_with_data(json!({"get": {"topic": topic, "what": "data", "data": {"limit": 10}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(208), "{ctrl}");
    assert_eq!(ws_before.len(), 8, "{ws_before:?}");

    // Verified: dropped, archived.
    let (ok, out) = stack.imstream(&[
        "shards",
        "drop",
        &tenant,
        "202609",
        "--from",
        &root_s,
        "--confirm",
    ]);
    assert!(ok, "drop: {out}");
    assert_eq!(status(&pool, "202609").await, "archived");
    assert!(!table_exists(&pool, "202609").await);
    let row_count: i64 = sqlx::query_scalar(
        "SELECT row_count FROM im_group_message_shards WHERE shard_month = '202609'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row_count, 6);
    // The next pass leaves an archived month alone.
    pass(&stack, MID_OCTOBER).await;
    assert_eq!(status(&pool, "202609").await, "archived");

    // Every read answers as before, from the archive (the gateway that
    // read the table before, and a fresh one).
    let gw_fresh = stack.start_gateway("node-c").await;
    for g in [gw_oct, gw_fresh] {
        assert_same_reads(
            &alice_before,
            &http_reads(&client, g, &token, topic).await,
            "alice",
        );
        assert_same_reads(
            &owner_before,
            &http_reads(&client, g, &owner_token, topic).await,
            "owner",
        );
    }
    let page = &alice_before[1];
    assert_eq!(page.1, 200);
    let seqs: Vec<i64> = page.2["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![9, 8, 7, 6, 5, 4, 2, 1], "3 was recalled");
    let owner_page = &owner_before[1];
    assert!(
        !owner_page.2.to_string().contains("\"seq\":4"),
        "the owner cleared 4: {owner_page:?}"
    );
    assert_eq!(
        alice_before[9].2["version"],
        json!(2),
        "{:?}",
        alice_before[9]
    );
    let mut ws = realtime_ws::Ws::connect(gw_fresh, &token).await;
    let (ctrl, ws_after) = ws
        .request_with_data(json!({"get": {"topic": topic, "what": "data", "data": {"limit": 10}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(208), "{ctrl}");
    assert_eq!(ws_after, ws_before);

    // An archived message can no longer change: 409 naming the month.
    let resp = client
        .patch(format!("http://{gw_fresh}/v1/groups/{topic}/messages/5"))
        .bearer_auth(&token)
        .json(&json!({"content": {"txt": "too late"}, "client_msg_id": "late-edit-5"}))
        .send()
        .await
        .unwrap();
    let (code, text) = (resp.status().as_u16(), resp.text().await.unwrap());
    assert_eq!(code, 409, "{text}");
    assert!(text.contains("202609"), "{text}");
    let resp = client
        .delete(format!("http://{gw_fresh}/v1/groups/{topic}/messages/5"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let (code, text) = (resp.status().as_u16(), resp.text().await.unwrap());
    assert_eq!(code, 409, "{text}");

    // A damaged archive: a gateway that has not cached the month answers
    // 500 naming it (HTTP and WebSocket); the live month still reads.
    let mut damaged = original.clone();
    let middle = damaged.len() - 40;
    damaged[middle] ^= 0xff;
    std::fs::write(&data, &damaged).unwrap();
    let gw_damaged = stack.start_gateway("node-d").await;
    let base = format!("http://{gw_damaged}/v1/groups/{topic}");
    let resp = client
        .get(format!("{base}/messages?limit=10"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let (code, body) = (resp.status().as_u16(), resp.text().await.unwrap());
    assert_eq!(code, 500, "{body}");
    assert!(
        body.contains("archive of month 202609 is damaged"),
        "{body}"
    );
    let resp = client
        .get(format!("{base}/messages?limit=3"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut ws = realtime_ws::Ws::connect(gw_damaged, &token).await;
    let ctrl = ws
        .request(json!({"get": {"topic": topic, "what": "data", "data": {"limit": 10}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(500), "{ctrl}");
    assert!(ctrl.to_string().contains("202609"), "{ctrl}");
    std::fs::write(&data, &original).unwrap();
}

/// A minimal Tinode WebSocket session for the archive checks.
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
        pub async fn request(&mut self, msg: Value) -> Value {
            self.request_with_data(msg).await.0
        }

        /// Sends `msg` with a fresh id; returns the ctrl answering it and
        /// the `{data}` frames that came before it.
        pub async fn request_with_data(&mut self, mut msg: Value) -> (Value, Vec<Value>) {
            self.next_id += 1;
            let id = self.next_id.to_string();
            let verb = msg.as_object().unwrap().keys().next().unwrap().clone();
            msg[&verb]["id"] = json!(id);
            self.stream
                .send(Message::Text(msg.to_string().into()))
                .await
                .expect("send");
            let mut data = Vec::new();
            loop {
                let frame = tokio::time::timeout(Duration::from_secs(20), self.stream.next())
                    .await
                    .expect("a frame within 20 s")
                    .expect("socket open")
                    .expect("frame");
                if let Message::Text(t) = frame {
                    let v: Value = serde_json::from_str(&t).expect("json frame");
                    if v["ctrl"]["id"] == json!(id) {
                        return (v, data);
                    }
                    if v.get("data").is_some() {
                        data.push(v);
                    }
                }
            }
        }
    }
}
