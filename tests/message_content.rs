//! What a message's content says, as Tinode clients send it (tinode-sdk's
//! Drafty, run by tests/node/tinode_content.js), stored in the month
//! table's columns and acted on (seed 000 §3.1, §5.1, §12 item 7; seed 003
//! §12):
//!
//! - a Drafty mention (`MN` entity) of one member in a 600-member group
//!   (over `limits.push_group_members`) is stored in `mentioned_user_ids`
//!   and creates exactly one push task, for that member;
//! - `@all` from a plain member mentions nobody (stored `mention_all = 0`,
//!   no push task); from the owner it pushes offline members up to the cap;
//! - a reply (`head.reply`, the web app's quote) is stored with its
//!   parent's seq and its thread's root, across a month switch, and the
//!   context read of the reply (month tables, no hot copy) returns its
//!   parent from the other month; a reply to a missing message, a malformed
//!   `head.reply` and a non-member's reply are refused.

mod common;

use std::time::Duration;

use common::{call, read_events, run_node_output, wait_for, Stack};
use imstream::events::PushTask;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::keys::TopicKeys;
use serde_json::{json, Value};
use sqlx::MySqlPool;

const OWNER: i64 = 1;
const MEMBER: i64 = 2;
const MENTIONED: i64 = 321;
const SIZE: i64 = 600;

/// Runs tinode_content.js as `uid` on `topic` with `steps`; the acked seqs.
async fn tinode_send(stack: &Stack, uid: i64, topic: &str, steps: Value) -> Vec<i64> {
    let out = run_node_output(
        "tinode_content.js",
        &[
            ("GATEWAY_HOST", stack.gateway_addr(0).to_string()),
            ("TOKEN", stack.token(uid, "sdk")),
            ("TOPIC", topic.to_string()),
            ("STEPS", steps.to_string()),
        ],
        Duration::from_secs(60),
    )
    .await;
    out.lines()
        .filter_map(|l| l.strip_prefix("seq "))
        .map(|s| s.trim().parse().expect("a seq"))
        .collect()
}

/// The stored columns of `seq`: (msg_type, mentioned_user_ids, mention_all,
/// reply_seqid, root_seqid), waiting until the row is there.
async fn row(
    pool: &MySqlPool,
    month: &str,
    topic: &str,
    seq: i64,
) -> (String, Option<Value>, i8, Option<i64>, Option<i64>) {
    let row: (String, Option<String>, i8, Option<i64>, Option<i64>) = wait_for(
        &format!("{topic} seq {seq} stored in {month}"),
        Duration::from_secs(60),
        || async move {
            sqlx::query_as(&format!(
                "SELECT msg_type, CAST(mentioned_user_ids AS CHAR), mention_all, reply_seqid, root_seqid \
                 FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
            ))
            .bind(topic)
            .bind(seq)
            .fetch_optional(pool)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let mentions = row.1.map(|m| serde_json::from_str(&m).expect("JSON"));
    (row.0, mentions, row.2, row.3, row.4)
}

/// Waits until the push pipeline has handled `seq` (its claim is done),
/// then returns every push task of `topic`'s `seq` in the log.
async fn push_tasks(stack: &Stack, topic: &str, seq: i64) -> Vec<PushTask> {
    let redis = stack.redis().await;
    let claim = TopicKeys::new(stack.tenant(), topic).push_claim(seq);
    wait_for(
        &format!("push of seq {seq} handled"),
        Duration::from_secs(60),
        || {
            let (mut redis, claim) = (redis.clone(), claim.clone());
            async move {
                let state: Option<String> = redis::cmd("GET")
                    .arg(&claim)
                    .query_async(&mut redis)
                    .await
                    .map_err(|e| e.to_string())?;
                (state.as_deref() == Some("done"))
                    .then_some(())
                    .ok_or(format!("{state:?}"))
            }
        },
    )
    .await;
    // Every task of the log (this test's own topics), so none is missed.
    let kafka = stack.config().kafka.clone();
    let name = TopicNames::new(&kafka).name(TopicKind::PushTasks);
    let total: i64 = tokio::task::spawn_blocking(move || {
        imstream::kafka::lag::watermarks(&kafka, &format!("probe-{}", common::unique_id()), &name)
            .unwrap()
            .values()
            .map(|(low, high)| high - low)
            .sum()
    })
    .await
    .unwrap();
    let all = read_events::<PushTask>(stack.config(), TopicKind::PushTasks, |ts| {
        ts.len() as i64 >= total
    })
    .await;
    all.into_iter()
        .filter(|t| t.topic == topic && t.seq == seq)
        .collect()
}

/// `GET path` on the first gateway as `uid`.
async fn get(stack: &Stack, uid: i64, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("http://{}{path}", stack.gateway_addr(0)))
        .bearer_auth(stack.token(uid, "http"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn month_now() -> String {
    imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mention_in_a_big_group_pushes_only_the_mentioned_member() {
    let mut stack = Stack::prepared(None).await;
    assert!(stack.config().limits.push_group_members < SIZE as usize);
    for p in ["store", "members", "push"] {
        stack.start_pipeline(p).await;
    }
    stack.start_gateway("content").await;
    let topic = "grpBigMentions";
    let members: Vec<i64> = (2..=SIZE).collect();
    stack.create_group(topic, OWNER, &members).await;
    let pool = stack.pool();
    let month = month_now();

    // A member mentions one other member, as the web app makes it.
    let mention = json!([{"mention": format!("usr{MENTIONED}"), "name": "Mia"}]);
    let seq = tinode_send(&stack, MEMBER, topic, mention).await[0];
    let (msg_type, mentioned, all, reply, _) = row(&pool, &month, topic, seq).await;
    assert_eq!(
        (msg_type.as_str(), mentioned, all, reply),
        ("text", Some(json!([MENTIONED])), 0, None)
    );
    let tasks = push_tasks(&stack, topic, seq).await;
    assert_eq!(
        tasks.iter().map(|t| t.recipient_uid).collect::<Vec<_>>(),
        vec![MENTIONED],
        "exactly one push task, for the mentioned member: {tasks:?}"
    );
    assert_eq!(tasks[0].sender_uid, MEMBER);

    // A plain member's `@all` is a word: it mentions nobody.
    let seq = tinode_send(&stack, MEMBER, topic, json!([{"all": true}])).await[0];
    let (_, mentioned, all, _, _) = row(&pool, &month, topic, seq).await;
    assert_eq!((mentioned, all), (None, 0));
    assert_eq!(push_tasks(&stack, topic, seq).await.len(), 0);

    // The owner's `@all` reaches offline members, at most the cap.
    let seq = tinode_send(&stack, OWNER, topic, json!([{"all": true}])).await[0];
    let (_, _, all, _, _) = row(&pool, &month, topic, seq).await;
    assert_eq!(all, 1);
    let tasks = push_tasks(&stack, topic, seq).await;
    let mut recipients: Vec<i64> = tasks.iter().map(|t| t.recipient_uid).collect();
    recipients.sort_unstable();
    recipients.dedup();
    assert_eq!(
        (tasks.len(), recipients.len()),
        (stack.config().limits.push_group_members, tasks.len()),
        "one task per offline member up to the cap"
    );
    assert!(recipients
        .iter()
        .all(|u| *u != OWNER && (2..=SIZE).contains(u)));
}

const SEPTEMBER_CLOCK: &str = "2026-09-30T23:59:00Z";
const OCTOBER_CLOCK: &str = "2026-10-01T00:00:05Z";
const SEP: &str = "202609";
const OCT: &str = "202610";

/// The month `seq` of `topic` was stored in (September or October).
async fn stored_month(pool: &MySqlPool, topic: &str, seq: i64) -> String {
    wait_for(
        &format!("{topic} seq {seq} stored"),
        Duration::from_secs(60),
        || async move {
            for month in [SEP, OCT] {
                let n: i64 = sqlx::query_scalar(&format!(
                    "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
                ))
                .bind(topic)
                .bind(seq)
                .fetch_one(pool)
                .await
                .map_err(|e| e.to_string())?;
                if n > 0 {
                    return Ok(month.to_string());
                }
            }
            Err("not stored yet".to_string())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reply_keeps_its_parent_and_root_across_a_month_switch() {
    let mut stack = Stack::prepared(Some(SEPTEMBER_CLOCK)).await;
    // No hot pipeline: reads come from the month tables.
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    stack.start_gateway("reply").await;
    let topic = "grpReplies";
    stack.create_group(topic, OWNER, &[MEMBER]).await;
    let pool = stack.pool();
    let addr = stack.gateway_addr(0);

    // September: the parent and more after it.
    let steps = json!([{"text": "the parent"}, {"text": "a"}, {"text": "b"}, {"text": "c"}]);
    let seqs = tinode_send(&stack, OWNER, topic, steps).await;
    let parent = seqs[0];
    assert_eq!(stored_month(&pool, topic, *seqs.last().unwrap()).await, SEP);
    assert_eq!(stored_month(&pool, topic, parent).await, SEP);

    // The switch: October once a message lands there.
    stack.shard_pass(Some(OCTOBER_CLOCK)).await;
    let client = reqwest::Client::new();
    let token = stack.token(OWNER, "http");
    wait_for(
        "a message stored in October",
        Duration::from_secs(60),
        || {
            let (client, token, pool) = (&client, &token, &pool);
            async move {
                let cmid = format!("probe-{}", common::unique_id());
                let (status, body) =
                    common::send_http(client, addr, token, topic, &cmid, "probe").await;
                if status != 202 {
                    return Err(format!("{status} {body}"));
                }
                let seq = body["seq"].as_i64().unwrap();
                match stored_month(pool, topic, seq).await.as_str() {
                    OCT => Ok(()),
                    other => Err(format!("seq {seq} in {other}")),
                }
            }
        },
    )
    .await;

    // October: a reply to the September parent, then a reply to the reply.
    let steps = json!([
        {"reply": parent, "author": format!("usr{OWNER}"), "name": "Owen", "quoted": "the parent", "text": "my answer"},
    ]);
    let reply = tinode_send(&stack, MEMBER, topic, steps).await[0];
    let steps = json!([
        {"reply": reply, "author": format!("usr{MEMBER}"), "name": "Mem", "quoted": "my answer", "text": "and more"},
    ]);
    let second = tinode_send(&stack, OWNER, topic, steps).await[0];
    // The web app's quote mentions the parent's author: a reply notifies
    // whom it answers (never the sender itself).
    assert_eq!(
        row(&pool, OCT, topic, reply).await,
        (
            "text".into(),
            Some(json!([OWNER])),
            0,
            Some(parent),
            Some(parent)
        )
    );
    assert_eq!(
        row(&pool, OCT, topic, second).await,
        (
            "text".into(),
            Some(json!([MEMBER])),
            0,
            Some(reply),
            Some(parent)
        )
    );

    // The context of the reply, read from October's table, brings its
    // parent from September's.
    let (status, body) = get(
        &stack,
        MEMBER,
        &format!("/v1/groups/{topic}/messages/{reply}/context?n=1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seqs: Vec<i64> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert!(!seqs.contains(&parent), "the parent is far back: {seqs:?}");
    assert_eq!(body["reply_to"]["seq"], json!(parent), "{body}");
    assert_eq!(body["reply_to"]["content"], json!("the parent"), "{body}");
    let target = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["seq"] == json!(reply))
        .unwrap();
    assert_eq!(
        (target["reply_seq"].clone(), target["root_seq"].clone()),
        (json!(parent), json!(parent))
    );
    // The reply to the reply: its parent, and the thread's first message.
    let (status, body) = get(
        &stack,
        OWNER,
        &format!("/v1/groups/{topic}/messages/{second}/context?n=1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reply_to"]["seq"], json!(reply), "{body}");
    assert_eq!(body["root"]["seq"], json!(parent), "{body}");

    // Refused: a reply to nothing, a malformed head.reply, a non-member.
    let send = |uid: i64, head: Value| {
        let stack = &stack;
        async move {
            call(
                stack,
                addr,
                uid,
                "POST",
                &format!("/v1/groups/{topic}/messages"),
                json!({"content": "x", "head": head}),
            )
            .await
        }
    };
    let (status, body) = send(MEMBER, json!({"reply": "9999"})).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = send(MEMBER, json!({"reply": "twelve"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("head.reply"),
        "{body}"
    );
    let (status, body) = send(77, json!({"reply": format!("{parent}")})).await;
    assert_eq!(
        status, 403,
        "a non-member learns nothing of the topic: {body}"
    );
}
