//! Edits, recalls and moderation (seed 000 §7 and §12 item 8) against the
//! real services:
//!
//! - an edit, a recall and a moderation delete of messages in an older
//!   month show in MySQL (row, revision with its month, dellog), in the hot
//!   snapshots, in history reads and in real time on another gateway;
//! - who may do what: only the sender edits or recalls, an owner deletes
//!   anyone's message, a member cannot;
//! - an edit or recall delivered twice, or replayed from the log by a
//!   fresh consumer group, produces one revision and leaves the row as is.

mod common;
mod realtime_support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::MySqlPool;

use common::{send_http, wait_for, Stack};
use realtime_support::{accepted_seq, Client, DELIVERY};

const SEPTEMBER_CLOCK: &str = "2026-09-30T23:59:00Z";
const OCTOBER_CLOCK: &str = "2026-10-01T00:00:05Z";
const SEP: &str = "202609";
const OCT: &str = "202610";

/// `(status, version, content)` of one stored message.
async fn row(
    pool: &MySqlPool,
    month: &str,
    topic: &str,
    seq: i64,
) -> Option<(String, i32, Option<String>)> {
    sqlx::query_as(&format!(
        "SELECT status, version, CAST(content AS CHAR CHARACTER SET utf8mb4) \
         FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
    ))
    .bind(topic)
    .bind(seq)
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// `(action, shard_month, version, old content)` of a message's revisions.
async fn revisions(
    pool: &MySqlPool,
    topic: &str,
    seq: i64,
) -> Vec<(String, String, i32, Option<String>)> {
    sqlx::query_as(
        "SELECT action, shard_month, version, CAST(old_content AS CHAR CHARACTER SET utf8mb4) \
         FROM im_message_revisions WHERE topic = ? AND seqid = ? ORDER BY version",
    )
    .bind(topic)
    .bind(seq)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn wait_row(
    pool: &MySqlPool,
    month: &str,
    topic: &str,
    seq: i64,
    want: impl Fn(&(String, i32, Option<String>)) -> bool,
) -> (String, i32, Option<String>) {
    wait_for(&format!("{topic}#{seq} in {month}"), DELIVERY, || async {
        match row(pool, month, topic, seq).await {
            Some(r) if want(&r) => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// The hot snapshot of one message, as JSON.
async fn hot_snapshot(stack: &Stack, topic: &str, seq: i64) -> Option<Value> {
    let mut redis = stack.redis().await;
    let key = imstream::keys::TopicKeys::new(stack.tenant(), topic).hot_msg(seq);
    let text: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut redis)
        .await
        .unwrap();
    text.map(|t| serde_json::from_str(&t).unwrap())
}

/// Sends over HTTP until a message is stored in `month`.
async fn send_until_stored_in(
    stack: &Stack,
    addr: SocketAddr,
    token: &str,
    topic: &str,
    month: &str,
) {
    let client = reqwest::Client::new();
    let pool = stack.pool();
    for n in 0..200 {
        let (status, body) =
            send_http(&client, addr, token, topic, &format!("probe-{n}"), "probe").await;
        if status != 202 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let seq = body["seq"].as_i64().unwrap();
        let stored = wait_for(&format!("probe {seq} stored"), DELIVERY, || async {
            for m in [SEP, OCT] {
                if row(&pool, m, topic, seq).await.is_some() {
                    return Ok(m);
                }
            }
            Err("not yet".to_string())
        })
        .await;
        if stored == month {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no message reached {month}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn recall_edit_and_moderation_of_an_older_month_show_everywhere() {
    let mut stack = Stack::prepared(Some(SEPTEMBER_CLOCK)).await;
    for p in ["store", "members", "hot", "fanout"] {
        stack.start_pipeline(p).await;
    }
    let gw0 = stack.start_gateway("gw0").await;
    let gw1 = stack.start_gateway("gw1").await;
    const TOPIC: &str = "grpEdits";
    const OWNER: i64 = 1;
    const ALICE: i64 = 2;
    const BOB: i64 = 3;
    stack.create_group(TOPIC, OWNER, &[ALICE, BOB]).await;

    let mut alice = Client::open_sub(gw0, &stack.token(ALICE, "phone"), TOPIC, "alice").await;
    let mut owner = Client::open_sub(gw0, &stack.token(OWNER, "web"), TOPIC, "owner").await;
    let mut bob = Client::open_sub(gw1, &stack.token(BOB, "phone"), TOPIC, "bob").await;

    // Three of Alice's messages in September, then the month switches.
    let s1 = alice.send_text(TOPIC, "one").await;
    let s2 = alice.send_text(TOPIC, "two").await;
    let s3 = alice.send_text(TOPIC, "three").await;
    let pool = stack.pool();
    for s in [s1, s2, s3] {
        wait_row(&pool, SEP, TOPIC, s, |_| true).await;
        bob.expect_data(TOPIC, s).await;
    }
    stack.shard_pass(Some(OCTOBER_CLOCK)).await;
    send_until_stored_in(&stack, gw0, &stack.token(ALICE, "http"), TOPIC, OCT).await;

    // Edit s1: a replacement message Bob sees with head.replace; the
    // September row carries the new content, version 2, one revision.
    let ctrl = alice
        .request(json!({"pub": {"topic": TOPIC, "head": {"replace": format!(":{s1}")}, "content": "one, edited"}}))
        .await;
    let edit_seq = accepted_seq(&ctrl, "alice edit");
    let replacement = bob.expect_data(TOPIC, edit_seq).await;
    assert_eq!(replacement["head"]["replace"], json!(format!(":{s1}")));
    assert_eq!(replacement["content"], json!("one, edited"));
    let edited = wait_row(&pool, SEP, TOPIC, s1, |r| r.1 == 2).await;
    assert_eq!(edited, ("normal".into(), 2, Some("\"one, edited\"".into())));
    let revs = revisions(&pool, TOPIC, s1).await;
    assert_eq!(revs.len(), 1, "{revs:?}");
    assert_eq!(revs[0].0, "edit");
    assert_eq!(
        revs[0].1, SEP,
        "the revision names the month of the message"
    );
    assert!(revs[0].3.as_deref().unwrap().contains("one"), "{revs:?}");

    // Recall s2 by its sender: Bob's session is told (pres del), the row
    // becomes a stub, and history no longer shows it.
    let ctrl = alice
        .request(
            json!({"del": {"topic": TOPIC, "what": "msg", "delseq": [{"low": s2}], "hard": true}}),
        )
        .await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
    let recall_del = ctrl["params"]["del"].as_i64().unwrap();
    let pres = bob
        .expect("pres del of s2", DELIVERY, |f| {
            f["pres"]["what"] == json!("del") && f["pres"]["delseq"] == json!([{"low": s2}])
        })
        .await;
    assert_eq!(pres["pres"]["clear"], json!(recall_del));
    assert_eq!(pres["pres"]["src"], json!(realtime_support::usr(ALICE)));
    let recalled = wait_row(&pool, SEP, TOPIC, s2, |r| r.0 != "normal").await;
    assert_eq!(recalled, ("recalled".into(), 2, None));
    assert_eq!(revisions(&pool, TOPIC, s2).await[0].0, "recall");

    // Moderation: the owner deletes Alice's s3.
    let ctrl = owner
        .request(
            json!({"del": {"topic": TOPIC, "what": "msg", "delseq": [{"low": s3}], "hard": true}}),
        )
        .await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
    bob.expect("pres del of s3", DELIVERY, |f| {
        f["pres"]["what"] == json!("del") && f["pres"]["delseq"] == json!([{"low": s3}])
    })
    .await;
    let deleted = wait_row(&pool, SEP, TOPIC, s3, |r| r.0 != "normal").await;
    assert_eq!(deleted, ("deleted".into(), 2, None));
    let revs = revisions(&pool, TOPIC, s3).await;
    assert_eq!((revs[0].0.as_str(), revs[0].1.as_str()), ("delete", SEP));

    // Hot snapshots follow: new content for s1, stubs for s2 and s3.
    let hot = wait_for("hot snapshots amended", DELIVERY, || async {
        let snaps = (
            hot_snapshot(&stack, TOPIC, s1).await,
            hot_snapshot(&stack, TOPIC, s2).await,
            hot_snapshot(&stack, TOPIC, s3).await,
        );
        match &snaps {
            (Some(a), Some(b), Some(c))
                if a["version"] == json!(2)
                    && b["status"] == json!("recalled")
                    && c["status"] == json!("deleted") =>
            {
                Ok(snaps)
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(hot.0.unwrap()["content"], json!("\"one, edited\""));
    assert_eq!(hot.1.unwrap()["content"], Value::Null);

    // History from Bob's point of view: s1 edited, s2 and s3 gone; the
    // deletes are listed by {get del}.
    let (data, end) = bob.get_since(TOPIC, 1).await;
    assert_eq!(end["code"], json!(208), "{end}");
    let seqs: Vec<i64> = data
        .iter()
        .map(|d| d["data"]["seq"].as_i64().unwrap())
        .collect();
    assert!(
        seqs.contains(&s1) && !seqs.contains(&s2) && !seqs.contains(&s3),
        "{seqs:?}"
    );
    let first = data.iter().find(|d| d["data"]["seq"] == json!(s1)).unwrap();
    assert_eq!(first["data"]["content"], json!("one, edited"));
    bob.send(json!({"get": {"id": "get-del", "topic": TOPIC, "what": "del"}}))
        .await;
    let meta = bob
        .expect("meta del", DELIVERY, |f| {
            f["meta"]["id"] == json!("get-del")
        })
        .await;
    let delseq = meta["meta"]["del"]["delseq"].as_array().unwrap().clone();
    assert!(
        delseq.contains(&json!({"low": s2})) && delseq.contains(&json!({"low": s3})),
        "{delseq:?}"
    );

    // Over HTTP the same reads agree: s2 is gone, s1 is edited.
    let http = reqwest::Client::new();
    let resp = http
        .get(format!("http://{gw1}/v1/groups/{TOPIC}/messages/{s2}"))
        .bearer_auth(stack.token(BOB, "http"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let m: Value = http
        .get(format!("http://{gw1}/v1/groups/{TOPIC}/messages/{s1}"))
        .bearer_auth(stack.token(BOB, "http"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(m["content"], json!("one, edited"), "{m}");
    assert_eq!(m["version"], json!(2), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_senders_edit_and_recall_and_only_owners_and_admins_delete_others() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "hot"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const TOPIC: &str = "grpRules";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    let http = reqwest::Client::new();
    let (_, sent) = send_http(&http, gw, &stack.token(2, "d"), TOPIC, "m1", "mine").await;
    let seq = sent["seq"].as_i64().unwrap();
    wait_row(&stack.pool(), &current_month(), TOPIC, seq, |_| true).await;

    let url = format!("http://{gw}/v1/groups/{TOPIC}/messages/{seq}");
    // Another member can neither edit nor delete it.
    let r = http
        .patch(&url)
        .bearer_auth(stack.token(3, "d"))
        .json(&json!({"content": "not yours"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("only the sender"),
        "{body}"
    );
    let r = http
        .delete(&url)
        .bearer_auth(stack.token(3, "d"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    // Editing a message that does not exist, or a malformed replace.
    let r = http
        .patch(format!("http://{gw}/v1/groups/{TOPIC}/messages/999"))
        .bearer_auth(stack.token(2, "d"))
        .json(&json!({"content": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = http
        .post(format!("http://{gw}/v1/groups/{TOPIC}/messages"))
        .bearer_auth(stack.token(2, "d"))
        .json(&json!({"content": "x", "head": {"replace": "seven"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);

    // The sender edits over HTTP; the owner deletes it as a moderator.
    let r = http
        .patch(&url)
        .bearer_auth(stack.token(2, "d"))
        .json(&json!({"content": "mine, edited"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["edited"], json!(seq), "{body}");
    let r = http
        .delete(&url)
        .bearer_auth(stack.token(1, "d"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["action"], json!("deleted"), "{body}");
    let (status, _, _) = wait_row(&stack.pool(), &current_month(), TOPIC, seq, |r| {
        r.0 != "normal"
    })
    .await;
    assert_eq!(status, "deleted");
    let actions: Vec<String> = revisions(&stack.pool(), TOPIC, seq)
        .await
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(actions, ["edit", "delete"]);
}

/// The month the shard manager made active for a stack at Redis TIME.
fn current_month() -> String {
    chrono::Utc::now().format("%Y%m").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_edit_or_recall_delivered_twice_or_replayed_produces_one_revision() {
    use imstream::events::*;
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let gw = stack.start_gateway("gw").await;
    const TOPIC: &str = "grpTwice";
    stack.create_group(TOPIC, 1, &[2]).await;
    let http = reqwest::Client::new();
    let token = stack.token(2, "d");
    let mut seqs = Vec::new();
    for n in 0..2 {
        let (_, body) = send_http(&http, gw, &token, TOPIC, &format!("m{n}"), "text").await;
        seqs.push(body["seq"].as_i64().unwrap());
    }
    let pool = stack.pool();
    let month = current_month();
    for s in &seqs {
        wait_row(&pool, &month, TOPIC, *s, |_| true).await;
    }
    let url = |s: i64| format!("http://{gw}/v1/groups/{TOPIC}/messages/{s}");
    let r = http
        .patch(url(seqs[0]))
        .bearer_auth(&token)
        .json(&json!({"content": "v2"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let edit_seq = r.json::<Value>().await.unwrap()["seq"].as_i64().unwrap();
    let r = http
        .delete(url(seqs[1]))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let del_id = r.json::<Value>().await.unwrap()["del"].as_i64().unwrap() as i32;
    wait_row(&pool, &month, TOPIC, seqs[0], |r| r.1 == 2).await;
    wait_row(&pool, &month, TOPIC, seqs[1], |r| r.0 == "recalled").await;
    let before = (
        row(&pool, &month, TOPIC, seqs[0]).await,
        row(&pool, &month, TOPIC, seqs[1]).await,
    );

    // The same two events delivered again (same ids, as a redelivery).
    let ids: Vec<(i64, String)> = sqlx::query_as(
        "SELECT seqid, CAST(event_id AS CHAR) FROM im_message_revisions WHERE topic = ? ORDER BY seqid",
    )
    .bind(TOPIC)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(ids.len(), 2, "{ids:?}");
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer =
        imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
    let tenant = stack.tenant().to_string();
    let again = [
        GroupEvent {
            event_id: ids[0].1.clone(),
            ..GroupEvent::new(
                &tenant,
                TOPIC,
                2,
                GroupEventBody::MessageEdited(MessageEdited {
                    seq: seqs[0],
                    edit_seq: Some(edit_seq),
                    head: None,
                    content: Some("\"v2\"".into()),
                    edited_at: now_ms(),
                }),
            )
        },
        GroupEvent {
            event_id: ids[1].1.clone(),
            ..GroupEvent::new(
                &tenant,
                TOPIC,
                2,
                GroupEventBody::MessageRecalled(MessageRecalled {
                    seq: seqs[1],
                    recalled_at: now_ms(),
                    del_id,
                }),
            )
        },
    ];
    for event in &again {
        for _ in 0..2 {
            producer
                .send(
                    imstream::kafka::topics::TopicKind::GroupEvents,
                    &event.key(),
                    event,
                    None,
                )
                .await
                .unwrap();
        }
    }
    // A later message in the same partition: once it is stored, the
    // duplicates before it were consumed.
    let (_, body) = send_http(&http, gw, &token, TOPIC, "after-dups", "after").await;
    wait_row(&pool, &month, TOPIC, body["seq"].as_i64().unwrap(), |_| {
        true
    })
    .await;

    // Then a replay of the whole log by a fresh consumer group.
    stack.stop_pipeline("store").await;
    stack.world.config.pipelines.group_prefix = format!("replay-{}", common::unique_id());
    stack.start_pipeline("store").await;
    let (_, body) = send_http(&http, gw, &token, TOPIC, "after-replay", "after").await;
    wait_row(&pool, &month, TOPIC, body["seq"].as_i64().unwrap(), |_| {
        true
    })
    .await;

    let count: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_message_revisions WHERE topic = ?")
            .bind(TOPIC)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(count, 2, "one revision per change");
    let after = (
        row(&pool, &month, TOPIC, seqs[0]).await,
        row(&pool, &month, TOPIC, seqs[1]).await,
    );
    assert_eq!(before, after, "rows unchanged by redelivery and replay");
    let dellog: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_dellog WHERE topic = ? AND deletedfor = 0")
            .bind(TOPIC)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dellog, 1);
}
