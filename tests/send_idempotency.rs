//! The send path is idempotent by construction, against the real services:
//!
//! - a send whose first attempt died between allocation and produce (a
//!   gateway crash, a produce timeout) is answered on retry with the seq it
//!   was first given, and stored once there;
//! - a send whose event reached the log but whose ack was lost is produced
//!   again on retry: the log holds the same event twice, and the month
//!   table, history and the online member's stream each show it once;
//! - a client message id reused for a different message is refused (409);
//! - content some supported database would refuse (JSON nested deeper than
//!   the documented limit, unpaired surrogates) is refused at the door with
//!   400 and never acknowledged, over HTTP and WebSocket.

mod common;
mod realtime_support;

use std::time::Duration;

use serde_json::{json, Value};

use imstream::events::{GroupEvent, GroupEventBody};
use imstream::kafka::topics::TopicKind;
use imstream::keys::TopicKeys;
use imstream::send::{SendRequest, Sender, MAX_JSON_DEPTH};

use common::{read_events, send_http, wait_for, Stack};
use realtime_support::{stored_rows, wait_stored, Client};

async fn running_stack() -> Stack {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "hot", "fanout"] {
        stack.start_pipeline(p).await;
    }
    stack.start_gateway("node-a").await;
    stack.start_gateway("node-b").await;
    stack
}

async fn claim_of(stack: &Stack, topic: &str, uid: i64, cmid: &str) -> Option<String> {
    let mut redis = stack.redis().await;
    redis::cmd("GET")
        .arg(TopicKeys::new(stack.tenant(), topic).uniq(uid, cmid))
        .query_async(&mut redis)
        .await
        .unwrap()
}

/// Every `{data}` seq of `topic` in a history page walk over HTTP.
async fn history_seqs(stack: &Stack, topic: &str, token: &str) -> Vec<i64> {
    let client = reqwest::Client::new();
    let mut seqs = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let mut url = format!(
            "http://{}/v1/groups/{topic}/messages?limit=50",
            stack.gateway_addr(0)
        );
        if let Some(b) = before {
            url.push_str(&format!("&before={b}"));
        }
        let body: Value = client
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let page = body["messages"].as_array().cloned().unwrap_or_default();
        seqs.extend(page.iter().filter_map(|m| m["seq"].as_i64()));
        match body["next_before"].as_i64() {
            Some(b) if !page.is_empty() => before = Some(b),
            _ => break,
        }
    }
    seqs
}

#[tokio::test]
async fn a_retry_after_a_lost_attempt_gets_its_first_seq_and_is_stored_once() {
    let stack = running_stack().await;
    let topic = "grpIdem";
    stack.create_group(topic, 1, &[2]).await;
    let pool = stack.pool();
    let http = reqwest::Client::new();
    let sender_token = stack.token(1, "web");
    let member = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(2, "pad"),
        topic,
        "member",
    )
    .await;

    // 1. The first attempt dies after its seq was allocated, before its
    //    event was produced (a gateway crash): a second gateway's retry
    //    gets the same seq, not a new one.
    let mut redis = stack.redis().await;
    let snowflake = imstream::snowflake::Snowflake::lease(&mut redis, stack.world.shutdown.child())
        .await
        .unwrap();
    let codec = imstream::events::EventCodec::new(&stack.config().registry.url).unwrap();
    let producer =
        imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
    let pools = imstream::tenant::TenantPools::connect_lazy(stack.config()).unwrap();
    let crashed = Sender::new(
        stack.config().clone(),
        redis.clone(),
        pools,
        producer,
        snowflake,
    );
    let request = SendRequest {
        tenant: stack.tenant().to_string(),
        topic: topic.to_string(),
        uid: 1,
        device: "web".into(),
        sid: String::new(),
        client_msg_id: Some("lost".into()),
        head: None,
        content: json!({"txt": "lost"}).to_string(),
        traceparent: None,
        edit_of: None,
        reply_root: None,
    };
    drop(crashed.allocate(&request).await);
    let claim = claim_of(&stack, topic, 1, "lost").await.expect("claimed");
    let first: i64 = claim.split('|').nth(1).unwrap().parse().unwrap();
    assert!(claim.starts_with("pending|"), "{claim}");

    let (status, body) = send_http(
        &http,
        stack.gateway_addr(0),
        &sender_token,
        topic,
        "lost",
        "lost",
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        body["seq"],
        json!(first),
        "the retry keeps the first seq: {body}"
    );
    assert_eq!(wait_stored(&pool, topic, first).await, 1);
    member.expect_data(topic, first).await;

    // 2. The event reached the log but the ack was lost (the claim is still
    //    pending): the retry produces the same event again.
    let (status, body) = send_http(
        &http,
        stack.gateway_addr(0),
        &sender_token,
        topic,
        "acklost",
        "twice",
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let twice = body["seq"].as_i64().unwrap();
    let done = claim_of(&stack, topic, 1, "acklost").await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(TopicKeys::new(stack.tenant(), topic).uniq(1, "acklost"))
        .arg(done.replacen("done|", "pending|", 1))
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, body) = send_http(
        &http,
        stack.gateway_addr(0),
        &sender_token,
        topic,
        "acklost",
        "twice",
    )
    .await;
    assert_eq!((status, body["seq"].as_i64()), (202, Some(twice)), "{body}");
    let events = read_events::<GroupEvent>(stack.config(), TopicKind::GroupEvents, |events| {
        copies(events, topic, twice).len() >= 2
    })
    .await;
    let ids: Vec<String> = copies(&events, topic, twice);
    assert_eq!(ids.len(), 2, "the log holds the event twice");
    assert_eq!(ids[0], ids[1], "the same event (same id) both times");

    // A marker after it: once the member has the marker, every copy of
    // `twice` was fanned out.
    let (_, body) = send_http(
        &http,
        stack.gateway_addr(0),
        &sender_token,
        topic,
        "marker",
        "marker",
    )
    .await;
    let marker = body["seq"].as_i64().unwrap();
    member.expect_data(topic, marker).await;
    wait_stored(&pool, topic, marker).await;
    assert_eq!(stored_rows(&pool, topic, twice).await, 1, "stored once");
    let live = member.data_seqs(topic);
    assert_eq!(
        live.iter().filter(|s| **s == twice).count(),
        1,
        "delivered once: {live:?}"
    );
    assert_eq!(
        live,
        vec![first, twice, marker],
        "each message once, in order"
    );
    let history = history_seqs(&stack, topic, &sender_token).await;
    assert_eq!(
        history,
        vec![marker, twice, first],
        "history shows each once"
    );

    // 3. The same client id for another message is refused.
    let (status, body) = send_http(
        &http,
        stack.gateway_addr(0),
        &sender_token,
        topic,
        "acklost",
        "something else",
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["params"]["code"], json!("CLIENT_MID_REUSED"), "{body}");
}

fn copies(events: &[GroupEvent], topic: &str, seq: i64) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.topic == topic)
        .filter(|e| matches!(&e.body, GroupEventBody::MessageSent(m) if m.seq == seq))
        .map(|e| e.event_id.clone())
        .collect()
}

fn nested(levels: usize) -> Value {
    let mut v = json!(1);
    for _ in 0..levels {
        v = json!([v]);
    }
    v
}

#[tokio::test]
async fn content_a_database_would_refuse_is_refused_at_the_door() {
    let stack = running_stack().await;
    let topic = "grpDoor";
    stack.create_group(topic, 1, &[2]).await;
    let pool = stack.pool();
    let http = reqwest::Client::new();
    let token = stack.token(1, "web");
    let url = format!(
        "http://{}/v1/groups/{topic}/messages",
        stack.gateway_addr(0)
    );
    let post = |body: String| {
        let (http, url, token) = (http.clone(), url.clone(), token.clone());
        async move {
            let resp = http
                .post(url)
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    // 40 levels (MariaDB's json_valid refuses 32): refused, never acked.
    let (status, body) =
        post(json!({"content": nested(40), "client_msg_id": "deep"}).to_string()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("nests deeper"), "{body}");
    let (status, body) = post(json!({"content": {"txt": "x"}, "head": {"a": nested(MAX_JSON_DEPTH)}, "client_msg_id": "deephead"}).to_string()).await;
    assert_eq!(status, 400, "{body}");
    // An unpaired surrogate (MariaDB refuses it in JSON).
    let (status, body) =
        post(r#"{"content": {"txt": "a\ud800b"}, "client_msg_id": "surrogate"}"#.to_string()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        claim_of(&stack, topic, 1, "deep").await.is_none(),
        "nothing claimed"
    );

    // Over WebSocket too.
    let mut ws = Client::open_sub(stack.gateway_addr(0), &token, topic, "sender").await;
    let ctrl = ws
        .request(json!({"pub": {"topic": topic, "content": nested(MAX_JSON_DEPTH + 1)}}))
        .await;
    assert_eq!(ctrl["code"], json!(400), "{ctrl}");

    // At the limit: accepted and stored as it is.
    let (status, body) =
        post(json!({"content": nested(MAX_JSON_DEPTH), "client_msg_id": "limit"}).to_string())
            .await;
    assert_eq!(status, 202, "{body}");
    let seq = body["seq"].as_i64().unwrap();
    assert_eq!(wait_stored(&pool, topic, seq).await, 1);
    let month = imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string();
    let stored: String = sqlx::query_scalar(&format!(
        "SELECT CAST(content AS CHAR CHARACTER SET utf8mb4) FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
    ))
    .bind(topic)
    .bind(seq)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&stored).unwrap(),
        nested(MAX_JSON_DEPTH)
    );
    // The refused ones left no seq behind: the next message follows.
    let (_, body) = send_http(&http, stack.gateway_addr(0), &token, topic, "next", "next").await;
    assert_eq!(body["seq"], json!(seq + 1), "{body}");
    wait_for("nothing else stored", Duration::from_secs(5), || {
        let (pool, month) = (pool.clone(), month.clone());
        async move {
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ?"
            ))
            .bind(topic)
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if n == 2 {
                Ok(())
            } else {
                Err(format!("{n} rows"))
            }
        }
    })
    .await;
}
