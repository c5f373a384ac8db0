//! The read path against the real services (seed 000 §12, ARCHITECTURE.md
//! §5): history pages across month tables over HTTP and the Tinode
//! WebSocket, exact seq, context, search, user-view deletes, hot-message
//! fallback, lost Redis routes, refusals, and request coalescing.
//!
//! Multi-month history is produced as MessageSent events straight into the
//! event log (each with its month) and stored by the store pipeline; the
//! shard pass at 2026-09-05 prepares 202608..202611 (August still within
//! its sealing period, so late August events are stored). Those months are
//! in the past of the machine clock, so the hot pipeline would not keep them.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use imstream::events::{new_event_id, now_ms, GroupEvent, GroupEventBody, MessageSent};
use imstream::history::{History, PageQuery};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::TopicKind;
use imstream::keys::TopicKeys;
use imstream::store::month::ShardMonth;
use serde_json::{json, Value};
use sqlx::MySqlPool;

use common::{send_http, wait_for, Stack, Ws};

const CLOCK: &str = "2026-09-05T12:00:00Z";
const OWNER: i64 = 1;
const ALICE: i64 = 2;
const BOB: i64 = 3;
const STRANGER: i64 = 99;

/// A stack whose month tables cover 202608..202611, with the store and
/// members pipelines and one gateway.
async fn history_stack() -> Stack {
    let mut stack = Stack::prepared(Some(CLOCK)).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    stack.start_gateway("node-a").await;
    stack
}

fn text_of(seq: i64) -> String {
    format!("message {seq}")
}

/// Produces MessageSent events for `seqs` of `topic` in `month` (created in
/// that month, one second apart) and waits until the mirror counts `total`
/// stored messages of the topic.
async fn produce(
    stack: &Stack,
    topic: &str,
    seqs: std::ops::RangeInclusive<i64>,
    month: &str,
    total: i64,
) {
    produce_with(stack, topic, seqs, month, total, text_of).await
}

async fn produce_with(
    stack: &Stack,
    topic: &str,
    seqs: std::ops::RangeInclusive<i64>,
    month: &str,
    total: i64,
    text: impl Fn(i64) -> String,
) {
    let config = stack.config();
    let codec = imstream::events::EventCodec::new(&config.registry.url).unwrap();
    let producer = EventProducer::new(&config.kafka, codec).unwrap();
    let pool = stack.pool();
    let group_id: i64 = sqlx::query_scalar("SELECT group_id FROM im_groups WHERE topic = ?")
        .bind(topic)
        .fetch_one(&pool)
        .await
        .expect("group exists");
    let start = ShardMonth::parse(month).unwrap().start().timestamp_millis();
    let base = (rand::random::<u32>() as i64) << 24;
    let key = format!("{}:{topic}", stack.tenant());
    let events: Vec<GroupEvent> = seqs
        .map(|seq| GroupEvent {
            event_id: new_event_id(),
            tenant_id: stack.tenant().to_string(),
            topic: topic.to_string(),
            occurred_at: start + seq * 1000,
            actor_uid: OWNER,
            actor_device: String::new(),
            source_sid: String::new(),
            source_node: String::new(),
            traceparent: String::new(),
            body: GroupEventBody::MessageSent(MessageSent {
                message_id: base + seq,
                group_id,
                seq,
                shard_month: month.to_string(),
                client_msg_id: Some(format!("c{seq}")),
                from_user: OWNER,
                msg_type: "text".into(),
                head: None,
                content: Some(json!({ "txt": text(seq) }).to_string()),
                mentioned_user_ids: Vec::new(),
                mention_all: false,
                reply_seq: None,
                root_seq: None,
                file_count: 0,
                content_size: 0,
                has_risk: false,
                audit_status: "pass".into(),
                created_at: start + seq * 1000,
                expires_at: None,
            }),
        })
        .collect();
    futures::stream::iter(events)
        .map(|e| {
            let (producer, key) = (producer.clone(), key.clone());
            async move {
                producer
                    .send(TopicKind::GroupEvents, &key, &e, None)
                    .await
                    .expect("MessageSent produced")
            }
        })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await;
    wait_stored(&pool, topic, total).await;
}

async fn wait_stored(pool: &MySqlPool, topic: &str, total: i64) {
    wait_for(&format!("{total} messages of {topic} stored"), Duration::from_secs(90), || async move {
        let n: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(SUM(message_count) AS SIGNED) FROM im_group_message_topic_shards WHERE topic = ?",
        )
        .bind(topic)
        .fetch_one(pool)
        .await
        .map_err(|e| e.to_string())?;
        if n == Some(total) {
            Ok(())
        } else {
            Err(format!("{n:?} stored"))
        }
    })
    .await;
}

/// `GET` with a bearer token: (status, body).
async fn get(client: &reqwest::Client, url: &str, token: &str) -> (u16, Value) {
    let resp = client
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn seqs_of(messages: &Value) -> Vec<i64> {
    messages
        .as_array()
        .unwrap_or_else(|| panic!("messages array expected: {messages}"))
        .iter()
        .map(|m| m["seq"].as_i64().expect("seq"))
        .collect()
}

fn desc(from: i64, to: i64) -> Vec<i64> {
    (to..=from).rev().collect()
}

/// Checks every message's content and sender against what was produced.
fn assert_contents(messages: &Value) {
    for m in messages.as_array().unwrap() {
        let seq = m["seq"].as_i64().unwrap();
        assert_eq!(m["content"]["txt"], json!(text_of(seq)), "{m}");
        assert_eq!(m["from"], json!(format!("usr{OWNER}")), "{m}");
    }
}

/// HTTP: every page of a newest-first walk from the top, following
/// `next_before`; returns the seqs.
async fn walk_back(client: &reqwest::Client, base: &str, token: &str, limit: i64) -> Vec<i64> {
    let mut all = Vec::new();
    let mut url = format!("{base}/messages?limit={limit}");
    for _ in 0..10_000 {
        let (status, body) = get(client, &url, token).await;
        assert_eq!(status, 200, "{url}: {body}");
        let seqs = seqs_of(&body["messages"]);
        if seqs.is_empty() {
            assert!(body["next_before"].is_null(), "{body}");
            return all;
        }
        assert!(seqs.len() as i64 <= limit);
        assert_eq!(
            body["next_before"],
            json!(seqs.last().unwrap()),
            "cursor is the page's smallest seq"
        );
        all.extend(seqs);
        url = format!(
            "{base}/messages?limit={limit}&before={}",
            body["next_before"]
        );
    }
    panic!("walk did not end");
}

/// HTTP: an oldest-first catch-up from `since`, following `next_since`.
async fn walk_since(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    since: i64,
    limit: i64,
) -> Vec<i64> {
    let mut all = Vec::new();
    let mut since = since;
    for _ in 0..10_000 {
        let url = format!("{base}/messages?since={since}&limit={limit}");
        let (status, body) = get(client, &url, token).await;
        assert_eq!(status, 200, "{url}: {body}");
        let seqs = seqs_of(&body["messages"]);
        if seqs.is_empty() {
            assert!(body["next_since"].is_null(), "{body}");
            return all;
        }
        assert!(seqs.len() as i64 <= limit);
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "oldest first: {seqs:?}"
        );
        assert_eq!(
            body["next_since"],
            json!(seqs.last().unwrap() + 1),
            "{body}"
        );
        all.extend(seqs);
        since = body["next_since"].as_i64().unwrap();
    }
    panic!("walk did not end");
}

/// (4) the latest 50 across two months, over HTTP and WebSocket; (6) exact
/// seq in an old month; (7) context across the month edge; search with its
/// time range; refusals for non-members and bad cursors.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn latest_page_exact_and_context_across_two_months() {
    let stack = history_stack().await;
    let topic = "grpTwoMonths";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    // Seqs 1..=30 in September, 31..=70 in October.
    produce(&stack, topic, 1..=30, "202609", 30).await;
    produce(&stack, topic, 31..=70, "202610", 70).await;

    let client = reqwest::Client::new();
    let token = stack.token(ALICE, "web");
    let base = format!("http://{}/v1/groups/{topic}", stack.gateway_addr(0));

    // (4) HTTP: 70..=21 newest first, cursor 21; then 20..=1; then nothing.
    let (status, body) = get(&client, &format!("{base}/messages?limit=50"), &token).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(seqs_of(&body["messages"]), desc(70, 21));
    assert_eq!(body["next_before"], json!(21));
    assert_contents(&body["messages"]);
    let (_, body) = get(
        &client,
        &format!("{base}/messages?limit=50&before=21"),
        &token,
    )
    .await;
    assert_eq!(seqs_of(&body["messages"]), desc(20, 1));
    assert_eq!(body["next_before"], json!(1));
    let (_, body) = get(
        &client,
        &format!("{base}/messages?limit=50&before=1"),
        &token,
    )
    .await;
    assert_eq!(seqs_of(&body["messages"]), Vec::<i64>::new());
    assert!(body["next_before"].is_null(), "{body}");
    // A page whose cursor sits right at the month edge.
    let (_, body) = get(
        &client,
        &format!("{base}/messages?limit=5&before=33"),
        &token,
    )
    .await;
    assert_eq!(seqs_of(&body["messages"]), desc(32, 28));
    // since + before: newest first within [since, before).
    let (_, body) = get(
        &client,
        &format!("{base}/messages?since=25&before=36&limit=50"),
        &token,
    )
    .await;
    assert_eq!(seqs_of(&body["messages"]), desc(35, 25));
    assert_eq!(walk_back(&client, &base, &token, 50).await, desc(70, 1));

    // (4) WebSocket: the same pages, ctrl 208 with the count, then 204.
    let mut ws = Ws::connect(stack.gateway_addr(0), &token).await;
    let (seqs, ctrl) = ws.get_data(topic, json!({"limit": 50})).await;
    assert_eq!(seqs, desc(70, 21));
    assert_eq!(ctrl["ctrl"]["code"], json!(208), "{ctrl}");
    assert_eq!(ctrl["ctrl"]["params"], json!({"what": "data", "count": 50}));
    assert_eq!(ctrl["ctrl"]["topic"], json!(topic));
    let (seqs, ctrl) = ws.get_data(topic, json!({"before": 21, "limit": 50})).await;
    assert_eq!(seqs, desc(20, 1));
    assert_eq!(ctrl["ctrl"]["params"]["count"], json!(20));
    let (seqs, ctrl) = ws.get_data(topic, json!({"before": 1, "limit": 50})).await;
    assert!(seqs.is_empty());
    assert_eq!(ctrl["ctrl"]["code"], json!(204), "{ctrl}");
    assert_eq!(ctrl["ctrl"]["params"], json!({"what": "data"}));
    // since (inclusive) is still newest first in Tinode.
    let (seqs, _) = ws.get_data(topic, json!({"since": 28, "limit": 5})).await;
    assert_eq!(seqs, desc(70, 66));
    let (seqs, _) = ws.get_data(topic, json!({"since": 28, "before": 34})).await;
    assert_eq!(seqs, desc(33, 28));
    // ranges, across the month edge.
    let (seqs, ctrl) = ws
        .get_data(
            topic,
            json!({"ranges": [{"low": 29, "hi": 33}, {"low": 2}], "limit": 10}),
        )
        .await;
    assert_eq!(seqs, vec![32, 31, 30, 29, 2]);
    assert_eq!(ctrl["ctrl"]["params"]["count"], json!(5));
    // A data frame in Tinode's shape.
    let (frames, _) = ws
        .request(
            json!({"get": {"topic": topic, "what": "data", "data": {"ranges": [{"low": 30}]}}}),
        )
        .await;
    let d = &frames[0]["data"];
    assert_eq!(d["seq"], json!(30));
    assert_eq!(d["from"], json!("usr1"));
    assert_eq!(d["content"], json!({"txt": "message 30"}));
    assert!(
        d["ts"]
            .as_str()
            .unwrap()
            .starts_with("2026-09-01T00:00:30.000"),
        "{d}"
    );
    assert!(d.get("head").is_none(), "empty head is left out: {d}");
    // {sub} with get: ctrl 200, then the page, then 208.
    let (_, ctrl) = ws
        .request(json!({"sub": {"topic": topic, "get": {"what": "data", "data": {"limit": 10}}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let id = ctrl["ctrl"]["id"].as_str().unwrap().to_string();
    let (frames, end) = ws.until_reply(&id).await;
    let seqs: Vec<i64> = frames
        .iter()
        .map(|f| f["data"]["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, desc(70, 61));
    assert_eq!(end["ctrl"]["code"], json!(208), "{end}");
    let many: Vec<Value> = (1..=101).map(|low| json!({"low": low})).collect();
    let (_, ctrl) = ws.get_data(topic, json!({"ranges": many})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(400), "{ctrl}");
    // Bad cursors over WebSocket.
    let (_, ctrl) = ws.get_data(topic, json!({"since": 10, "before": 10})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(400), "{ctrl}");
    let (_, ctrl) = ws.get_data(topic, json!({"before": 0})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(400), "{ctrl}");

    // (6) exact seq in the old month, and in the new one.
    let (status, m) = get(&client, &format!("{base}/messages/7"), &token).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(
        (m["seq"].clone(), m["content"]["txt"].clone()),
        (json!(7), json!("message 7"))
    );
    assert_eq!(m["status"], json!("normal"));
    let (status, m) = get(&client, &format!("{base}/messages/31"), &token).await;
    assert_eq!((status, m["seq"].clone()), (200, json!(31)));
    for seq in [1, 30, 70] {
        let (status, m) = get(&client, &format!("{base}/messages/{seq}"), &token).await;
        assert_eq!((status, m["seq"].clone()), (200, json!(seq)));
    }
    let (status, _) = get(&client, &format!("{base}/messages/71"), &token).await;
    assert_eq!(status, 404);
    for bad in ["0", "-3", "abc", "9223372036854775807"] {
        let (status, body) = get(&client, &format!("{base}/messages/{bad}"), &token).await;
        assert!(status == 400 || status == 404, "{bad}: {status} {body}");
    }

    // (7) context ±20 around the last message of September and the first
    // of October: oldest first, across the edge.
    let (status, body) = get(&client, &format!("{base}/messages/30/context?n=20"), &token).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(seqs_of(&body["messages"]), (10..=50).collect::<Vec<_>>());
    assert_contents(&body["messages"]);
    let (_, body) = get(&client, &format!("{base}/messages/31/context?n=20"), &token).await;
    assert_eq!(seqs_of(&body["messages"]), (11..=51).collect::<Vec<_>>());
    // Near both ends of the history.
    let (_, body) = get(&client, &format!("{base}/messages/3/context?n=20"), &token).await;
    assert_eq!(seqs_of(&body["messages"]), (1..=23).collect::<Vec<_>>());
    let (_, body) = get(&client, &format!("{base}/messages/69/context"), &token).await;
    assert_eq!(seqs_of(&body["messages"]), (49..=70).collect::<Vec<_>>());
    for bad in ["n=0", "n=51", "n=x"] {
        let (status, _) = get(
            &client,
            &format!("{base}/messages/30/context?{bad}"),
            &token,
        )
        .await;
        assert_eq!(status, 400, "{bad}");
    }

    // Search: bounded time range, month by month, newest first.
    let search = |q: &str, from: &str, to: &str| {
        let (client, token) = (client.clone(), token.clone());
        let url = format!("{base}/search");
        let url = format!("{url}?q={}&from={from}&to={to}", q.replace(' ', "%20"));
        async move {
            let resp = client.get(&url).bearer_auth(&token).send().await.unwrap();
            (
                resp.status().as_u16(),
                resp.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (status, body) = search("message 3", "2026-09-01T00:00:00Z", "2026-11-01T00:00:00Z").await;
    assert_eq!(status, 200, "{body}");
    // "message 3" matches 3 and 30..=39, newest first.
    assert_eq!(
        seqs_of(&body["messages"]),
        vec![39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 3]
    );
    // Only October's part of the range.
    let (_, body) = search("message 3", "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z").await;
    assert_eq!(seqs_of(&body["messages"]), desc(39, 31));
    let (status, _) = search("message", "2026-06-01T00:00:00Z", "2026-11-01T00:00:00Z").await;
    assert_eq!(status, 400, "more than 3 months");
    let (status, _) = search("message", "2026-10-01T00:00:00Z", "2026-09-01T00:00:00Z").await;
    assert_eq!(status, 400, "to before from");
    let resp = client
        .get(format!("{base}/search?q=message"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400, "a time range is required");

    // Bad cursors and limits: 400.
    for bad in [
        "limit=0",
        "limit=101",
        "limit=-1",
        "before=0",
        "before=-5",
        "since=-1",
        "since=10&before=10",
        "since=11&before=10",
        "before=abc",
        "since=x",
        "limit=ten",
        "before=",
        "cursor=5",
    ] {
        let (status, body) = get(&client, &format!("{base}/messages?{bad}"), &token).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["code"], json!(400), "{body}");
    }
    let (status, body) = get(&client, &format!("{base}/messages?limit=100"), &token).await;
    assert_eq!((status, seqs_of(&body["messages"]).len()), (200, 70));

    // A non-member gets 403 everywhere; no token 401; a non-group topic 404.
    let stranger = stack.token(STRANGER, "web");
    for path in [
        "messages".to_string(),
        "messages?limit=5&before=10".into(),
        "messages/7".into(),
        "messages/7/context?n=5".into(),
        "search?q=message&from=2026-09-01T00:00:00Z&to=2026-10-01T00:00:00Z".into(),
    ] {
        let (status, body) = get(&client, &format!("{base}/{path}"), &stranger).await;
        assert_eq!(status, 403, "{path}: {body}");
    }
    let resp = client
        .post(format!("{base}/history/clear"))
        .bearer_auth(&stranger)
        .json(&json!({"ranges": [{"low": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let resp = client.get(format!("{base}/messages")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let (status, _) = get(
        &client,
        &format!("http://{}/v1/groups/usrX/messages", stack.gateway_addr(0)),
        &token,
    )
    .await;
    assert_eq!(status, 404);
    let mut ws = Ws::connect(stack.gateway_addr(0), &stranger).await;
    let (seqs, ctrl) = ws.get_data(topic, json!({"limit": 5})).await;
    assert!(seqs.is_empty());
    assert_eq!(ctrl["ctrl"]["code"], json!(403), "{ctrl}");
    let (_, ctrl) = ws
        .request(json!({"get": {"topic": topic, "what": "del"}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(403), "{ctrl}");

    // A month marked archived whose archive is not there is the server's
    // error (500 naming the month), not the client's fault (400); pages
    // that stay in live months are unaffected. (Archived months with their
    // archive: tests/archive_reads.rs.)
    use imstream::store::catalog::{set_status, ShardStatus};
    set_status(
        &stack.pool(),
        ShardMonth::parse("202609").unwrap(),
        ShardStatus::Archived,
    )
    .await
    .unwrap();
    let (status, body) = get(&client, &format!("{base}/messages?limit=50"), &token).await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body.to_string()
            .contains("archive of month 202609 is missing"),
        "{body}"
    );
    let (status, body) = get(&client, &format!("{base}/messages/5"), &token).await;
    assert_eq!(status, 500, "{body}");
    let (status, body) = get(&client, &format!("{base}/messages?limit=10"), &token).await;
    assert_eq!((status, seqs_of(&body["messages"])), (200, desc(70, 61)));
    let mut ws = Ws::connect(stack.gateway_addr(0), &token).await;
    let (_, ctrl) = ws.get_data(topic, json!({"limit": 50})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(500), "{ctrl}");
    assert!(ctrl.to_string().contains("202609"), "{ctrl}");
}

/// (5) since-paging over 5,000 messages in three months: no gap, no
/// duplicate (and the newest-first walk back too).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn since_paging_over_three_months_has_no_gap_or_duplicate() {
    let stack = history_stack().await;
    let topic = "grpThreeMonths";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    produce(&stack, topic, 1..=1700, "202608", 1700).await;
    produce(&stack, topic, 1701..=3400, "202609", 3400).await;
    produce(&stack, topic, 3401..=5000, "202610", 5000).await;

    let client = reqwest::Client::new();
    let token = stack.token(ALICE, "web");
    let base = format!("http://{}/v1/groups/{topic}", stack.gateway_addr(0));
    let all: Vec<i64> = (1..=5000).collect();

    let got = walk_since(&client, &base, &token, 1, 100).await;
    assert_eq!(got.len(), 5000);
    assert_eq!(got, all, "since paging: no gap, no duplicate, in order");
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 5000);
    // since=0 is the same as since=1; odd page sizes straddle the month edges.
    assert_eq!(walk_since(&client, &base, &token, 0, 100).await, all);
    assert_eq!(
        walk_since(&client, &base, &token, 1650, 37).await,
        (1650..=5000).collect::<Vec<_>>()
    );
    // A single page across an edge.
    let (_, body) = get(
        &client,
        &format!("{base}/messages?since=1695&limit=10"),
        &token,
    )
    .await;
    assert_eq!(
        seqs_of(&body["messages"]),
        (1695..=1704).collect::<Vec<_>>()
    );
    assert_eq!(body["next_since"], json!(1705));
    assert_contents(&body["messages"]);
    // Past the end: empty, no cursor.
    let (_, body) = get(&client, &format!("{base}/messages?since=5001"), &token).await;
    assert_eq!(seqs_of(&body["messages"]), Vec::<i64>::new());
    assert!(body["next_since"].is_null());

    let back = walk_back(&client, &base, &token, 100).await;
    assert_eq!(back, desc(5000, 1), "before paging: no gap, no duplicate");
}

/// Waits until `n` dellog rows of `topic` exist.
async fn wait_dellog(pool: &MySqlPool, topic: &str, n: i64) {
    wait_for(
        &format!("{n} dellog rows for {topic}"),
        Duration::from_secs(30),
        || async move {
            let got: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_dellog WHERE topic = ?")
                .bind(topic)
                .fetch_one(pool)
                .await
                .map_err(|e| e.to_string())?;
            if got == n {
                Ok(())
            } else {
                Err(format!("{got} rows"))
            }
        },
    )
    .await;
}

/// (9) a user's delete ranges across two months hide those messages from
/// that user only — set with `POST history/clear` and with `{del what="msg"}`
/// — and `{get what="del"}` answers in Tinode's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn user_delete_ranges_across_months_are_per_user() {
    let stack = history_stack().await;
    let topic = "grpDeletes";
    stack.create_group(topic, OWNER, &[ALICE, BOB]).await;
    // Seqs 1..=60 in September, 61..=120 in October.
    produce(&stack, topic, 1..=60, "202609", 60).await;
    produce(&stack, topic, 61..=120, "202610", 120).await;
    let pool = stack.pool();
    let client = reqwest::Client::new();
    let base = format!("http://{}/v1/groups/{topic}", stack.gateway_addr(0));
    let (alice, bob, owner) = (
        stack.token(ALICE, "web"),
        stack.token(BOB, "web"),
        stack.token(OWNER, "web"),
    );

    // Pages read before the deletes: the gateway caches each reader's
    // (empty) deleted ranges, which the deletes below must replace.
    for token in [&alice, &bob] {
        let (status, _) = get(&client, &format!("{base}/messages?limit=60"), token).await;
        assert_eq!(status, 200);
    }

    // Invalid ranges are refused.
    for bad in [
        json!({"ranges": []}),
        json!({"ranges": [{"low": 0}]}),
        json!({"ranges": [{"low": 5, "hi": 5}]}),
        json!({}),
    ] {
        let resp = client
            .post(format!("{base}/history/clear"))
            .bearer_auth(&alice)
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400, "{bad}");
    }

    // Alice over HTTP: [50, 71) spans both months (10 in Sep, 10 in Oct).
    let resp = client
        .post(format!("{base}/history/clear"))
        .bearer_auth(&alice)
        .json(&json!({"ranges": [{"low": 50, "hi": 71}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let cleared: Value = resp.json().await.unwrap();
    let alice_del = cleared["del"].as_i64().expect("del id");
    assert_eq!(cleared["topic"], json!(topic));

    // Bob over WebSocket: one message in September and [58, 64) across the edge.
    let mut bob_ws = Ws::connect(stack.gateway_addr(0), &bob).await;
    let (_, ctrl) = bob_ws
        .request(json!({"del": {"topic": topic, "what": "msg", "delseq": [{"low": 10}, {"low": 58, "hi": 64}]}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    assert_eq!(ctrl["ctrl"]["topic"], json!(topic));
    let bob_del = ctrl["ctrl"]["params"]["del"].as_i64().expect("params.del");
    assert_ne!(alice_del, bob_del);
    let (_, ctrl) = bob_ws
        .request(json!({"del": {"topic": topic, "what": "msg", "delseq": [{"low": 7, "hi": 3}]}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(400), "{ctrl}");
    wait_dellog(&pool, topic, 3).await;
    // The store announces each dellog write (readers' caches go stale).
    let redis = stack.redis().await;
    let token_key = TopicKeys::new(stack.tenant(), topic).dellog_token();
    wait_for(
        "the dellog change announced",
        Duration::from_secs(30),
        || {
            let (mut redis, key) = (redis.clone(), token_key.clone());
            async move {
                let n: i64 = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut redis)
                    .await
                    .map_err(|e| e.to_string())?;
                if n == 1 {
                    Ok(())
                } else {
                    Err("no token".into())
                }
            }
        },
    )
    .await;

    let alice_hidden: Vec<i64> = (50..71).collect();
    let bob_hidden: Vec<i64> = [10].into_iter().chain(58..64).collect();
    let visible = |hidden: &[i64]| {
        (1..=120)
            .filter(|s| !hidden.contains(s))
            .collect::<Vec<i64>>()
    };

    // Alice: the latest 60 is still a full page (the hidden range is skipped,
    // not counted), every walk misses exactly her range.
    let (_, body) = get(&client, &format!("{base}/messages?limit=60"), &alice).await;
    let expected: Vec<i64> = desc(120, 71).into_iter().chain(desc(49, 40)).collect();
    assert_eq!(seqs_of(&body["messages"]), expected);
    assert_eq!(body["next_before"], json!(40));
    // A page starting just above her range skips it.
    let (_, body) = get(
        &client,
        &format!("{base}/messages?limit=5&before=71"),
        &alice,
    )
    .await;
    assert_eq!(seqs_of(&body["messages"]), desc(49, 45));
    let (_, body) = get(
        &client,
        &format!("{base}/messages?since=48&limit=5"),
        &alice,
    )
    .await;
    assert_eq!(seqs_of(&body["messages"]), vec![48, 49, 71, 72, 73]);
    let mut alice_visible = visible(&alice_hidden);
    assert_eq!(
        walk_since(&client, &base, &alice, 1, 7).await,
        alice_visible
    );
    alice_visible.reverse();
    assert_eq!(walk_back(&client, &base, &alice, 9).await, alice_visible);
    let (status, _) = get(&client, &format!("{base}/messages/60"), &alice).await;
    assert_eq!(status, 404, "hidden from Alice");
    let (status, _) = get(&client, &format!("{base}/messages/71"), &alice).await;
    assert_eq!(status, 200);
    let (_, body) = get(&client, &format!("{base}/messages/60/context?n=3"), &alice).await;
    assert_eq!(seqs_of(&body["messages"]), vec![47, 48, 49, 71, 72, 73]);
    let (_, body) = get(
        &client,
        &format!("{base}/search?q=message%206&from=2026-09-01T00:00:00Z&to=2026-11-01T00:00:00Z"),
        &alice,
    )
    .await;
    assert_eq!(
        seqs_of(&body["messages"]),
        vec![6],
        "search filters her range too"
    );

    // Bob: over WebSocket and HTTP his own ranges are gone, Alice's are not.
    let (seqs, ctrl) = bob_ws
        .get_data(topic, json!({"before": 66, "limit": 10}))
        .await;
    assert_eq!(seqs, vec![65, 64, 57, 56, 55, 54, 53, 52, 51, 50]);
    assert_eq!(ctrl["ctrl"]["params"]["count"], json!(10));
    let (seqs, _) = bob_ws
        .get_data(topic, json!({"ranges": [{"low": 9, "hi": 12}]}))
        .await;
    assert_eq!(seqs, vec![11, 9]);
    let mut bob_visible = visible(&bob_hidden);
    assert_eq!(walk_since(&client, &base, &bob, 1, 10).await, bob_visible);
    bob_visible.reverse();
    assert_eq!(walk_back(&client, &base, &bob, 50).await, bob_visible);

    // Everybody else still sees everything.
    assert_eq!(walk_back(&client, &base, &owner, 50).await, desc(120, 1));
    let (status, _) = get(&client, &format!("{base}/messages/60"), &owner).await;
    assert_eq!(status, 200);

    // {get what="del"}: Tinode's {meta del} with clear and delseq.
    let (_, meta) = bob_ws
        .request(json!({"get": {"topic": topic, "what": "del"}}))
        .await;
    assert_eq!(meta["meta"]["topic"], json!(topic), "{meta}");
    assert_eq!(
        meta["meta"]["del"],
        json!({"clear": bob_del, "delseq": [{"low": 10}, {"low": 58, "hi": 64}]}),
        "{meta}"
    );
    assert!(
        meta["meta"]["ts"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{meta}"
    );
    let mut alice_ws = Ws::connect(stack.gateway_addr(0), &alice).await;
    let (_, meta) = alice_ws
        .request(json!({"get": {"topic": topic, "what": "del"}}))
        .await;
    assert_eq!(
        meta["meta"]["del"],
        json!({"clear": alice_del, "delseq": [{"low": 50, "hi": 71}]}),
        "{meta}"
    );
    let mut owner_ws = Ws::connect(stack.gateway_addr(0), &owner).await;
    let (_, ctrl) = owner_ws
        .request(json!({"get": {"topic": topic, "what": "del"}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(204), "{ctrl}");
    assert_eq!(ctrl["ctrl"]["params"], json!({"what": "del"}));
    // A Tinode-style page for the owner is untouched.
    let (seqs, _) = owner_ws
        .get_data(topic, json!({"before": 66, "limit": 10}))
        .await;
    assert_eq!(seqs, desc(65, 56));
}

/// (16) with the Redis route keys deleted, reads are complete and the keys
/// come back from the MySQL mirror — also when the store pipeline re-created
/// the keys with only its current month first; `imstream routes rebuild`
/// restores them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_redis_routes_are_rebuilt_and_reads_stay_complete() {
    let stack = history_stack().await;
    let topic = "grpRoutes";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    produce(&stack, topic, 1..=40, "202608", 40).await;
    produce(&stack, topic, 41..=80, "202609", 80).await;
    produce(&stack, topic, 81..=120, "202610", 120).await;
    let client = reqwest::Client::new();
    let token = stack.token(ALICE, "web");
    let base = format!("http://{}/v1/groups/{topic}", stack.gateway_addr(0));
    let keys = TopicKeys::new(stack.tenant(), topic);
    let mut redis = stack.redis().await;
    let expected_meta = |max: i64| {
        vec![
            (
                "202608".to_string(),
                "min_seq=1,max_seq=40,count=40".to_string(),
            ),
            (
                "202609".to_string(),
                "min_seq=41,max_seq=80,count=40".to_string(),
            ),
            (
                "202610".to_string(),
                format!("min_seq=81,max_seq={max},count={}", max - 80),
            ),
        ]
    };
    let months_of =
        |redis: imstream::redis_util::Redis| route_of(redis, TopicKeys::new(stack.tenant(), topic));
    let delete_routes = |redis: imstream::redis_util::Redis| {
        let keys = TopicKeys::new(stack.tenant(), topic);
        async move {
            let mut redis = redis;
            let n: i64 = redis::cmd("DEL")
                .arg(keys.route())
                .arg(keys.route_meta())
                .query_async(&mut redis)
                .await
                .unwrap();
            assert_eq!(n, 2, "both route keys existed");
        }
    };
    let full_route = vec![
        ("202608".to_string(), 1),
        ("202609".to_string(), 41),
        ("202610".to_string(), 81),
    ];
    assert_eq!(
        months_of(redis.clone()).await,
        (expected_meta(120), full_route.clone())
    );

    // Keys gone: the first read rebuilds them; every walk is complete.
    delete_routes(redis.clone()).await;
    let (_, body) = get(
        &client,
        &format!("{base}/messages?limit=50&before=60"),
        &token,
    )
    .await;
    assert_eq!(seqs_of(&body["messages"]), desc(59, 10));
    assert_eq!(
        months_of(redis.clone()).await,
        (expected_meta(120), full_route.clone())
    );
    delete_routes(redis.clone()).await;
    assert_eq!(
        walk_since(&client, &base, &token, 1, 100).await,
        (1..=120).collect::<Vec<_>>()
    );
    delete_routes(redis.clone()).await;
    let (status, m) = get(&client, &format!("{base}/messages/5"), &token).await;
    assert_eq!((status, m["seq"].clone()), (200, json!(5)));
    delete_routes(redis.clone()).await;
    let (_, body) = get(&client, &format!("{base}/messages/40/context?n=20"), &token).await;
    assert_eq!(seqs_of(&body["messages"]), (20..=60).collect::<Vec<_>>());
    assert_eq!(
        months_of(redis.clone()).await,
        (expected_meta(120), full_route.clone())
    );

    // Keys gone, then a new message stored before any read: the store
    // pipeline re-creates the route with October only. Reads must still see
    // August and September.
    delete_routes(redis.clone()).await;
    produce(&stack, topic, 121..=121, "202610", 121).await;
    wait_for(
        "the store pipeline re-created the route",
        Duration::from_secs(30),
        || {
            let (mut redis, key) = (redis.clone(), keys.route_meta());
            async move {
                let meta: Vec<(String, String)> = redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async(&mut redis)
                    .await
                    .map_err(|e| e.to_string())?;
                if meta.is_empty() {
                    Err("no route yet".into())
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
    let (meta, _) = months_of(redis.clone()).await;
    assert_eq!(
        meta,
        vec![(
            "202610".to_string(),
            "min_seq=81,max_seq=121,count=41".to_string()
        )],
        "the store pipeline wrote only its month"
    );
    assert_eq!(walk_back(&client, &base, &token, 100).await, desc(121, 1));
    assert_eq!(
        walk_since(&client, &base, &token, 1, 100).await,
        (1..=121).collect::<Vec<_>>()
    );
    assert_eq!(
        months_of(redis.clone()).await,
        (expected_meta(121), full_route.clone())
    );

    // `imstream routes rebuild` restores them from the mirror.
    let _: () = redis::cmd("DEL")
        .arg(keys.route())
        .arg(keys.route_meta())
        .query_async(&mut redis)
        .await
        .unwrap();
    let args = [
        "routes",
        "rebuild",
        "--tenant",
        stack.tenant(),
        "--topic",
        topic,
    ];
    let cmd = common::process::command(&stack.config_file("routes"), &args);
    let ran = common::process::run_async(cmd, None).await;
    let stdout = &ran.stdout;
    assert!(ran.ok, "routes rebuild failed: {stdout}\n{}", ran.stderr);
    assert!(stdout.contains("3 month(s)"), "{stdout}");
    assert_eq!(
        months_of(redis.clone()).await,
        (expected_meta(121), full_route.clone())
    );
    assert_eq!(walk_back(&client, &base, &token, 100).await, desc(121, 1));
}

/// A topic's Redis route: `route_meta` month fields and the `route` ZSET.
async fn route_of(
    mut redis: imstream::redis_util::Redis,
    keys: TopicKeys,
) -> (Vec<(String, String)>, Vec<(String, i64)>) {
    let meta: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys.route_meta())
        .query_async(&mut redis)
        .await
        .unwrap();
    let route: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(keys.route())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut redis)
        .await
        .unwrap();
    let meta = meta.into_iter().filter(|(k, _)| k.len() == 6).collect();
    (meta, route)
}

/// (10) hot messages with a hole or expired entries fall back to MySQL and
/// the page is complete; a complete hot page is served from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hot_cache_with_holes_falls_back_to_mysql() {
    let mut stack = Stack::running().await;
    stack.start_pipeline("hot").await;
    let topic = "grpHot";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    let client = reqwest::Client::new();
    let owner = stack.token(OWNER, "web");
    let addr = stack.gateway_addr(0);
    for i in 1..=60 {
        let (status, body) =
            send_http(&client, addr, &owner, topic, &format!("h{i}"), &text_of(i)).await;
        assert_eq!((status, body["seq"].clone()), (202, json!(i)), "{body}");
    }
    let pool = stack.pool();
    wait_stored(&pool, topic, 60).await;
    let keys = TopicKeys::new(stack.tenant(), topic);
    let mut redis = stack.redis().await;
    wait_for("60 hot messages", Duration::from_secs(30), || {
        let (mut redis, key) = (redis.clone(), keys.hot_seqs());
        async move {
            let n: i64 = redis::cmd("ZCARD")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .map_err(|e| e.to_string())?;
            if n == 60 {
                Ok(())
            } else {
                Err(format!("{n}"))
            }
        }
    })
    .await;

    let history = History::new(
        imstream::tenant::TenantPools::connect_lazy(stack.config()).unwrap(),
        redis.clone(),
    );
    let tenant = stack.tenant().to_string();
    let page = |since: Option<i64>, before: Option<i64>, limit: i64| {
        let (history, tenant) = (history.clone(), tenant.clone());
        async move {
            let p = history
                .page(
                    &tenant,
                    topic,
                    ALICE,
                    PageQuery::new(since, before, Some(limit), false).unwrap(),
                )
                .await
                .unwrap();
            (
                p.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
                p.source,
                p.messages,
            )
        }
    };
    let token = stack.token(ALICE, "web");
    let base = format!("http://{addr}/v1/groups/{topic}");
    let http_page = |query: &str| {
        let (client, token, url) = (
            client.clone(),
            token.clone(),
            format!("{base}/messages?{query}"),
        );
        async move {
            let (status, body) = get(&client, &url, &token).await;
            assert_eq!(status, 200, "{body}");
            assert_contents(&body["messages"]);
            seqs_of(&body["messages"])
        }
    };

    // Complete hot pages are served from Redis, equal to MySQL's.
    let (seqs, source, hot_messages) = page(None, None, 50).await;
    assert_eq!((seqs, source), (desc(60, 11), "hot"));
    assert_eq!(page(None, Some(41), 20).await.1, "hot");
    assert_eq!(page(None, None, 100).await.1, "hot", "reaches seq 1");
    assert_eq!(page(Some(55), None, 10).await.1, "hot", "reaches since");
    assert_eq!(http_page("limit=50").await, desc(60, 11));

    // A lost snapshot (the ZSET still lists it): pages covering it go to
    // MySQL and are complete; pages beside it stay hot.
    let _: () = redis::cmd("DEL")
        .arg(keys.hot_msg(45))
        .query_async(&mut redis)
        .await
        .unwrap();
    let (seqs, source, mysql_messages) = page(None, None, 50).await;
    assert_eq!(seqs, desc(60, 11));
    assert_ne!(source, "hot");
    assert_eq!(
        mysql_messages, hot_messages,
        "hot snapshots read back like MySQL rows"
    );
    assert_eq!(http_page("limit=50").await, desc(60, 11));
    assert_eq!(http_page("limit=10&before=50").await, desc(49, 40));
    assert_eq!(page(None, Some(41), 20).await.1, "hot");

    // A hole in the ZSET (the snapshot is still there).
    let member = format!(
        "30:{}",
        hot_messages.iter().find(|m| m.seq == 30).unwrap().ts
    );
    let removed: i64 = redis::cmd("ZREM")
        .arg(keys.hot_seqs())
        .arg(&member)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(removed, 1, "{member}");
    let (seqs, source, _) = page(None, Some(41), 20).await;
    assert_eq!((seqs, source == "hot"), (desc(40, 21), false));
    assert_eq!(http_page("limit=20&before=41").await, desc(40, 21));

    // The newest entry missing from the ZSET: the latest page must still
    // start at the newest message.
    let _: () = redis::cmd("ZREMRANGEBYSCORE")
        .arg(keys.hot_seqs())
        .arg(60)
        .arg(60)
        .query_async(&mut redis)
        .await
        .unwrap();
    let (seqs, source, _) = page(None, None, 5).await;
    assert_eq!((seqs, source == "hot"), (desc(60, 56), false));
    assert_eq!(http_page("limit=5").await, desc(60, 56));

    // An expired snapshot.
    let _: () = redis::cmd("PEXPIRE")
        .arg(keys.hot_msg(52))
        .arg(1)
        .query_async(&mut redis)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (seqs, source, _) = page(None, Some(56), 6).await;
    assert_eq!((seqs, source == "hot"), (desc(55, 50), false));
    assert_eq!(http_page("limit=6&before=56").await, desc(55, 50));

    // The whole hot set gone: MySQL.
    let _: () = redis::cmd("DEL")
        .arg(keys.hot_seqs())
        .query_async(&mut redis)
        .await
        .unwrap();
    let (seqs, source, _) = page(None, None, 60).await;
    assert_eq!((seqs, source == "hot"), (desc(60, 1), false));

    // WebSocket pages are complete as well.
    let mut ws = Ws::connect(addr, &token).await;
    let (seqs, ctrl) = ws.get_data(topic, json!({"limit": 50})).await;
    assert_eq!(seqs, desc(60, 11));
    assert_eq!(ctrl["ctrl"]["params"]["count"], json!(50));
}

/// 1,000 identical concurrent latest-page reads (hot pipeline not running,
/// so MySQL is read) share one fetch; a later read fetches again, also after
/// a reader gave up mid-fetch.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn identical_concurrent_reads_share_one_fetch() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let topic = "grpHerd";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    let month = ShardMonth::of_millis(now_ms()).to_string();
    produce(&stack, topic, 1..=100, &month, 100).await;

    let redis = stack.redis().await;
    let history = History::new(
        imstream::tenant::TenantPools::connect_lazy(stack.config()).unwrap(),
        redis,
    );
    let tenant = stack.tenant().to_string();
    let query = PageQuery::new(None, None, Some(50), false).unwrap();
    // Warm up (route, pool connections).
    let warm = history.page(&tenant, topic, ALICE, query).await.unwrap();
    assert_eq!(
        warm.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        desc(100, 51)
    );
    assert_ne!(warm.source, "hot");

    let before = history.fetches();
    let barrier = Arc::new(tokio::sync::Barrier::new(1000));
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let (history, tenant, barrier) = (history.clone(), tenant.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                history
                    .page(&tenant, topic, ALICE, query)
                    .await
                    .expect("page")
            })
        })
        .collect();
    for t in tasks {
        let page = t.await.unwrap();
        assert_eq!(page.messages.len(), 50);
        assert_eq!(page.messages.first().map(|m| m.seq), Some(100));
        assert_eq!(page.next, Some(51));
    }
    let fetched = history.fetches() - before;
    println!("1000 concurrent identical reads -> {fetched} fetch(es)");
    assert!(
        fetched <= 5,
        "1000 identical concurrent reads caused {fetched} fetches"
    );

    // Not cached beyond the fetch: a new message shows up in the next read.
    produce(&stack, topic, 101..=101, &month, 101).await;
    let page = history.page(&tenant, topic, ALICE, query).await.unwrap();
    assert_eq!(page.messages[0].seq, 101);
    assert_eq!(history.fetches() - before, fetched + 1);

    // A reader that gives up mid-fetch does not pin that fetch's result.
    let gave_up = tokio::time::timeout(
        Duration::from_micros(1),
        history.page(&tenant, topic, ALICE, query),
    )
    .await;
    assert!(gave_up.is_err() || gave_up.unwrap().is_ok());
    for seq in 102..=103 {
        produce(&stack, topic, seq..=seq, &month, seq).await;
        let page = history.page(&tenant, topic, ALICE, query).await.unwrap();
        assert_eq!(
            page.messages[0].seq, seq,
            "read after a cancelled reader sees new messages"
        );
    }
}

/// Readers' deleted ranges are cached between pages, and a dellog write
/// the store announces is seen at once by the next read (no waiting out
/// the cache); unannounced, the cache would keep serving what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_deletes_are_cached_until_the_topic_announces_a_change() {
    use imstream::store::dellog;
    let stack = Stack::prepared(None).await;
    let (pool, mut redis) = (stack.pool(), stack.redis().await);
    let tenant = stack.tenant().to_string();
    let topic = format!("grpDellog{}", &new_event_id()[..8]);
    let cache = dellog::Cache::default();
    let insert = |low: i64, hi: i64| {
        let (pool, topic) = (pool.clone(), topic.clone());
        async move {
            sqlx::query(
                "INSERT INTO im_dellog (topic, deletedfor, delid, low, hi, event_id) VALUES (?, 7, 1, ?, ?, ?)",
            )
            .bind(&topic)
            .bind(low)
            .bind(hi)
            .bind(new_event_id())
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    insert(1, 2).await;
    dellog::changed(&mut redis, &tenant, &topic).await.unwrap();
    let first = cache
        .ranges_for(&pool, &mut redis, &tenant, &topic, 7)
        .await
        .unwrap();
    assert!(first.covers(1) && !first.covers(5));
    // Written but not announced: the cached ranges stand (the cache works).
    insert(5, 6).await;
    let cached = cache
        .ranges_for(&pool, &mut redis, &tenant, &topic, 7)
        .await
        .unwrap();
    assert!(!cached.covers(5), "served from the cache");
    // Announced, as the store pipeline does after every dellog write: seen.
    dellog::changed(&mut redis, &tenant, &topic).await.unwrap();
    let fresh = cache
        .ranges_for(&pool, &mut redis, &tenant, &topic, 7)
        .await
        .unwrap();
    assert!(
        fresh.covers(1) && fresh.covers(5),
        "the change is read at once"
    );
    // A lost token (Redis flushed) is a change too.
    redis::cmd("DEL")
        .arg(TopicKeys::new(&tenant, &topic).dellog_token())
        .query_async::<()>(&mut redis)
        .await
        .unwrap();
    insert(9, 10).await;
    let after_loss = cache
        .ranges_for(&pool, &mut redis, &tenant, &topic, 7)
        .await
        .unwrap();
    assert!(after_loss.covers(9));
}
