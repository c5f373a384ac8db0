//! Message search from its own index (issue 17 part 1, seed 000 §6.6)
//! against the real services: the search pipeline indexes the group
//! events, `GET /v1/search` asks the index for `(topic, seq)` and resolves
//! every hit through the read path for the caller.
//!
//! - Chinese and English (and number) queries find exactly the messages
//!   that hold the words, newest first, across two month tables (202608
//!   and 202609: MessageSent events straight into the log, each with its
//!   month), scoped to one topic or a time range, page by page with the
//!   cursor, with highlighted snippets; bad input is a 400; a stranger
//!   finds nothing. Replaying the pipeline over its own index verifies
//!   identical, and rebuilding it from nothing gives the same documents.
//! - An edited message is found by its new text only (under its own seq);
//!   recalled and deleted-for-everyone messages are found by nobody; a
//!   message the reader cleared from their own view is not found by them
//!   (others still find it); a member who left a group finds none of its
//!   messages; a one-to-one message is found by its two users only.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use imstream::digest::Verdict;
use imstream::events::{new_event_id, GroupEvent, GroupEventBody, MessageSent};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::TopicKind;
use imstream::replay::{replay, ReplayArgs};
use imstream::store::month::ShardMonth;
use serde_json::{json, Value};

use common::{call, send_http, wait_for, Stack};

/// 202608..202611 exist; 202609 is the active month.
const CLOCK: &str = "2026-09-05T12:00:00Z";
const OWNER: i64 = 1801;
const ALICE: i64 = 1802;
const BOB: i64 = 1803;
const STRANGER: i64 = 1899;

/// Messages of the two-month topic: (seq, month, text).
const TEAM: &[(i64, &str, &str)] = &[
    (1, "202608", "明天下午三点开会，讨论项目进度"),
    (2, "202608", "Release 2024 checklist: deploy to staging"),
    (3, "202608", "午饭吃什么？"),
    (4, "202609", "the budget review moved to Friday"),
    (5, "202609", "下周一上午开会，记得带电脑"),
    (6, "202609", "新版本 release 今晚上线, build 2024"),
];

async fn stack_with(pipelines: &[&str]) -> Stack {
    let mut stack = Stack::prepared(Some(CLOCK)).await;
    stack.world.config.search.enabled = true;
    for p in pipelines {
        stack.start_pipeline(p).await;
    }
    stack.start_gateway("search").await;
    stack
}

/// MessageSent events for `TEAM` straight into the log (each created in
/// its month), then waits until all are stored.
async fn produce_team(stack: &Stack, topic: &str) {
    let config = stack.config();
    let codec = imstream::events::EventCodec::new(&config.registry.url).unwrap();
    let producer = EventProducer::new(&config.kafka, codec).unwrap();
    let pool = stack.pool();
    let group_id: i64 = sqlx::query_scalar("SELECT group_id FROM im_groups WHERE topic = ?")
        .bind(topic)
        .fetch_one(&pool)
        .await
        .expect("group exists");
    let base = (rand::random::<u32>() as i64) << 24;
    let key = format!("{}:{topic}", stack.tenant());
    let events: Vec<GroupEvent> = TEAM
        .iter()
        .map(|(seq, month, text)| {
            let at = ShardMonth::parse(month).unwrap().start().timestamp_millis() + seq * 1000;
            GroupEvent {
                event_id: new_event_id(),
                tenant_id: stack.tenant().to_string(),
                topic: topic.to_string(),
                occurred_at: at,
                actor_uid: OWNER,
                actor_device: String::new(),
                source_sid: String::new(),
                source_node: String::new(),
                traceparent: String::new(),
                body: GroupEventBody::MessageSent(MessageSent {
                    message_id: base + seq,
                    group_id,
                    seq: *seq,
                    shard_month: month.to_string(),
                    client_msg_id: Some(format!("c{seq}")),
                    from_user: OWNER,
                    msg_type: "text".into(),
                    head: None,
                    content: Some(json!({ "txt": text }).to_string()),
                    mentioned_user_ids: Vec::new(),
                    mention_all: false,
                    reply_seq: None,
                    root_seq: None,
                    file_count: 0,
                    content_size: 0,
                    has_risk: false,
                    audit_status: "pass".into(),
                    created_at: at,
                    expires_at: None,
                }),
            }
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
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    wait_for(
        "the team's messages stored",
        Duration::from_secs(90),
        || async {
            let n: Option<i64> = sqlx::query_scalar(
                "SELECT CAST(SUM(message_count) AS SIGNED) FROM im_group_message_topic_shards WHERE topic = ?",
            )
            .bind(topic)
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if n == Some(TEAM.len() as i64) {
                Ok(())
            } else {
                Err(format!("{n:?} stored"))
            }
        },
    )
    .await;
}

/// `GET /v1/search?<query>` as `uid`: (status, body).
async fn search(stack: &Stack, uid: i64, query: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/search?{query}",
            stack.gateway_addr(0)
        ))
        .bearer_auth(stack.token(uid, "http"))
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn q(text: &str) -> String {
    format!("q={}", urlencode(text))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// (topic, seq) of the hits, in order.
fn hits(body: &Value) -> Vec<(String, i64)> {
    body["hits"]
        .as_array()
        .unwrap_or_else(|| panic!("hits expected: {body}"))
        .iter()
        .map(|h| {
            (
                h["topic"].as_str().expect("topic").to_string(),
                h["seq"].as_i64().expect("seq"),
            )
        })
        .collect()
}

/// Waits until `uid`'s search `query` answers exactly `want`.
async fn until_found(stack: &Stack, uid: i64, query: &str, want: Vec<(String, i64)>) -> Value {
    wait_for(
        &format!("search {query} as {uid} = {want:?}"),
        Duration::from_secs(60),
        || {
            let want = want.clone();
            async move {
                let (status, body) = search(stack, uid, query).await;
                if status == 200 && hits(&body) == want {
                    Ok(body)
                } else {
                    Err(format!("{status} {body}"))
                }
            }
        },
    )
    .await
}

/// (topic, seq, searchable text) of every searchable document.
fn documents(stack: &Stack) -> BTreeSet<(String, i64, String)> {
    let dir = imstream::search::tenant_dir(stack.config(), stack.tenant());
    imstream::search::entries(&dir)
        .expect("index readable")
        .into_iter()
        .filter_map(|e| Some((e.topic.clone(), e.seq, e.text()?.to_string())))
        .collect()
}

fn replay_args() -> ReplayArgs {
    ReplayArgs {
        pipeline: "search".into(),
        from: "earliest".into(),
        tenant: None,
        into: None,
        wait_inactive_secs: 30,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chinese_and_english_queries_find_messages_across_two_months() {
    let mut stack = stack_with(&["store", "members", "search"]).await;
    let team = "grpSearchTeam";
    stack.create_group(team, OWNER, &[ALICE, BOB]).await;
    produce_team(&stack, team).await;
    let t = |seq: i64| (team.to_string(), seq);

    // Chinese, newest first across the two months.
    let body = until_found(&stack, ALICE, &q("开会"), vec![t(5), t(1)]).await;
    let first = &body["hits"][0];
    assert!(
        first["snippet"].as_str().unwrap().contains("<b>开会</b>"),
        "highlighted: {first}"
    );
    assert_eq!(
        first["message"]["content"]["txt"],
        json!(TEAM[4].2),
        "{first}"
    );
    assert_eq!(first["message"]["seq"], json!(5));
    // English, case-insensitive; numbers; words together; a word nobody wrote.
    until_found(&stack, ALICE, &q("RELEASE"), vec![t(6), t(2)]).await;
    until_found(&stack, ALICE, &q("2024"), vec![t(6), t(2)]).await;
    until_found(&stack, ALICE, &q("release 上线"), vec![t(6)]).await;
    until_found(&stack, BOB, &q("budget"), vec![t(4)]).await;
    until_found(&stack, BOB, &q("项目进度"), vec![t(1)]).await;
    until_found(&stack, BOB, &q("会议室"), vec![]).await;
    // One topic; a time range (one month each side of 2026-09-01).
    until_found(
        &stack,
        OWNER,
        &format!("{}&topic={team}", q("开会")),
        vec![t(5), t(1)],
    )
    .await;
    until_found(
        &stack,
        OWNER,
        &format!("{}&from=2026-09-01T00:00:00Z", q("开会")),
        vec![t(5)],
    )
    .await;
    until_found(
        &stack,
        OWNER,
        &format!("{}&to=2026-09-01T00:00:00Z", q("开会")),
        vec![t(1)],
    )
    .await;

    // Page by page: the cursor continues without repeating or skipping.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let query = match &cursor {
            None => format!("{}&limit=1", q("2024")),
            Some(c) => format!("{}&limit=1&cursor={c}", q("2024")),
        };
        let (status, body) = search(&stack, ALICE, &query).await;
        assert_eq!(status, 200, "{body}");
        seen.extend(hits(&body));
        match body["next"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, vec![t(6), t(2)], "pages of one");

    // Outsiders and bad input.
    until_found(&stack, STRANGER, &q("开会"), vec![]).await;
    let (status, _) = search(&stack, STRANGER, &format!("{}&topic={team}", q("开会"))).await;
    assert_eq!(status, 403, "not a member of the topic");
    for (query, why) in [
        (String::new(), "no q"),
        (q("   "), "blank q"),
        (q(&"字".repeat(201)), "q too long"),
        (q("！？"), "no word in q"),
        (format!("{}&limit=0", q("开会")), "limit 0"),
        (format!("{}&limit=51", q("开会")), "limit 51"),
        (format!("{}&limit=ten", q("开会")), "limit not a number"),
        (format!("{}&cursor=garbage", q("开会")), "cursor"),
        (format!("{}&from=yesterday", q("开会")), "from"),
        (
            format!(
                "{}&from=2026-09-02T00:00:00Z&to=2026-09-01T00:00:00Z",
                q("开会")
            ),
            "from after to",
        ),
        (format!("{}&topic=nope", q("开会")), "not a topic name"),
        (format!("{}&colour=red", q("开会")), "unknown parameter"),
    ] {
        let (status, body) = search(&stack, ALICE, &query).await;
        assert_eq!(status, 400, "{why}: {body}");
    }
    let status = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/search?{}",
            stack.gateway_addr(0),
            q("开会")
        ))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(status, 401, "no token");

    // With the index off, the LIKE search of one conversation answers.
    stack.world.config.search.enabled = false;
    let like_gw = stack.start_gateway("like").await;
    let like = |query: String| {
        let token = stack.token(ALICE, "http");
        async move {
            let resp = reqwest::Client::new()
                .get(format!("http://{like_gw}/v1/search?{query}"))
                .bearer_auth(token)
                .send()
                .await
                .expect("gateway reachable");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, body) = like(format!(
        "{}&topic={team}&from=2026-08-01T00:00:00Z&to=2026-10-01T00:00:00Z",
        q("开会")
    ))
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(hits(&body), vec![t(5), t(1)], "{body}");
    assert_eq!(body["source"], json!("like"));
    let (status, body) = like(q("开会")).await;
    assert_eq!(status, 400, "all conversations need the index: {body}");

    // Replayed over its own index: identical. Rebuilt from nothing: the
    // same documents, and the API finds the same messages.
    let before = documents(&stack);
    assert_eq!(before.len(), TEAM.len(), "{before:?}");
    stack.stop_pipeline("search").await;
    let into = ReplayArgs {
        into: Some("database:imt_elsewhere".into()),
        ..replay_args()
    };
    let err = replay(stack.config(), &into, stack.world.shutdown.child())
        .await
        .expect_err("search has no --into")
        .to_string();
    assert!(err.contains("search.index_dir"), "{err}");
    let report = replay(stack.config(), &replay_args(), stack.world.shutdown.child())
        .await
        .expect("replay");
    let checks: Vec<_> = report
        .verifications
        .iter()
        .flat_map(|v| &v.topics)
        .collect();
    assert!(
        !checks.is_empty() && checks.iter().all(|c| c.verdict == Verdict::Identical),
        "replay over its own index: {report:?}"
    );
    assert_eq!(documents(&stack), before, "redelivered: unchanged");
    let dir = imstream::search::tenant_dir(stack.config(), stack.tenant());
    std::fs::remove_dir_all(&dir).expect("index removed");
    assert!(documents(&stack).is_empty(), "wiped");
    replay(stack.config(), &replay_args(), stack.world.shutdown.child())
        .await
        .expect("rebuild");
    assert_eq!(documents(&stack), before, "rebuilt from the log");
    stack.start_pipeline("search").await;
    until_found(&stack, ALICE, &q("开会"), vec![t(5), t(1)]).await;
}

/// Sends `text` to `topic` as `uid`; the seq.
async fn send(stack: &Stack, uid: i64, topic: &str, cmid: &str, text: &str) -> i64 {
    let (status, body) = send_http(
        &reqwest::Client::new(),
        stack.gateway_addr(0),
        &stack.token(uid, "http"),
        topic,
        cmid,
        text,
    )
    .await;
    assert_eq!(status, 202, "send {cmid}: {body}");
    body["seq"].as_i64().expect("seq")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn edits_recalls_deletes_clears_and_leaving_hide_messages() {
    let stack = stack_with(&["store", "members", "relations", "search"]).await;
    let gw = stack.gateway_addr(0);
    let (room, club) = ("grpSearchRoom", "grpSearchClub");
    stack.create_group(room, OWNER, &[ALICE, BOB]).await;
    stack.create_group(club, OWNER, &[ALICE, BOB]).await;
    let edited = send(&stack, ALICE, room, "e1", "original wording 原来的说法").await;
    let recalled = send(&stack, ALICE, room, "e2", "please recall this 撤回测试").await;
    let moderated = send(&stack, BOB, room, "e3", "moderated content 违规内容").await;
    let cleared = send(&stack, ALICE, room, "e4", "cleared by bob 清空记录").await;
    let secret = send(&stack, OWNER, club, "e5", "secret plans 秘密计划").await;
    let (status, body) = call(
        &stack,
        gw,
        ALICE,
        "POST",
        &format!("/v1/users/{BOB}/messages"),
        json!({"content": {"txt": "p2p hello 私聊内容"}, "client_msg_id": "e6"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let pair = imstream::tinode::p2p_topic(ALICE, BOB);
    let private = body["seq"].as_i64().unwrap();
    let r = |seq: i64| (room.to_string(), seq);
    // Everything indexed and findable first.
    until_found(&stack, BOB, &q("原来的说法"), vec![r(edited)]).await;
    until_found(&stack, BOB, &q("撤回测试"), vec![r(recalled)]).await;
    until_found(&stack, ALICE, &q("违规内容"), vec![r(moderated)]).await;
    until_found(&stack, BOB, &q("清空记录"), vec![r(cleared)]).await;
    until_found(
        &stack,
        ALICE,
        &q("秘密计划"),
        vec![(club.to_string(), secret)],
    )
    .await;
    until_found(&stack, BOB, &q("私聊内容"), vec![(pair.clone(), private)]).await;
    until_found(&stack, ALICE, &q("私聊内容"), vec![(pair.clone(), private)]).await;
    until_found(&stack, OWNER, &q("私聊内容"), vec![]).await;

    // Edit (a replacement message), recall (the sender), delete for
    // everyone (the owner, of BOB's message), BOB clears one message from
    // his own view, ALICE leaves the club.
    let (status, body) = call(
        &stack,
        gw,
        ALICE,
        "PATCH",
        &format!("/v1/groups/{room}/messages/{edited}"),
        json!({"content": {"txt": "revised wording 修改后的说法"}, "client_msg_id": "e1-edit"}),
    )
    .await;
    assert_eq!(status, 202, "edit: {body}");
    let (status, body) = call(
        &stack,
        gw,
        ALICE,
        "DELETE",
        &format!("/v1/groups/{room}/messages/{recalled}"),
        json!({}),
    )
    .await;
    assert!(status == 200 || status == 202, "recall: {status} {body}");
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "DELETE",
        &format!("/v1/groups/{room}/messages/{moderated}"),
        json!({}),
    )
    .await;
    assert!(status == 200 || status == 202, "delete: {status} {body}");
    let (status, body) = call(
        &stack,
        gw,
        BOB,
        "POST",
        &format!("/v1/groups/{room}/history/clear"),
        json!({"ranges": [{"low": cleared, "hi": cleared + 1}]}),
    )
    .await;
    assert_eq!(status, 200, "clear: {body}");
    let (status, body) = call(
        &stack,
        gw,
        ALICE,
        "DELETE",
        &format!("/v1/groups/{club}/members/{ALICE}"),
        json!({}),
    )
    .await;
    assert!(status == 200 || status == 202, "leave: {status} {body}");

    // The index itself: the new text under the original's seq (the
    // replacement is no document of its own); the recall and the delete
    // removed.
    wait_for(
        "the index applied the edit, recall and delete",
        Duration::from_secs(60),
        || async {
            let docs = documents(&stack);
            let in_room: Vec<(i64, String)> = docs
                .iter()
                .filter(|(t, _, _)| t == room)
                .map(|(_, s, text)| (*s, text.clone()))
                .collect();
            let want = vec![
                (edited, "revised wording 修改后的说法".to_string()),
                (cleared, "cleared by bob 清空记录".to_string()),
            ];
            if in_room == want {
                Ok(())
            } else {
                Err(format!("{in_room:?}"))
            }
        },
    )
    .await;
    // The edited message: by its new text only, under its own seq.
    for uid in [ALICE, BOB] {
        until_found(&stack, uid, &q("修改后的说法"), vec![r(edited)]).await;
        until_found(&stack, uid, &q("revised"), vec![r(edited)]).await;
        until_found(&stack, uid, &q("原来的说法"), vec![]).await;
        until_found(&stack, uid, &q("original"), vec![]).await;
        until_found(&stack, uid, &q("撤回测试"), vec![]).await;
        until_found(&stack, uid, &q("违规内容"), vec![]).await;
    }
    let (_, body) = search(&stack, BOB, &q("revised")).await;
    assert_eq!(
        body["hits"][0]["message"]["content"]["txt"],
        json!("revised wording 修改后的说法"),
        "{body}"
    );
    // Cleared from BOB's view only.
    until_found(&stack, BOB, &q("清空记录"), vec![]).await;
    until_found(
        &stack,
        BOB,
        &format!("{}&topic={room}", q("清空记录")),
        vec![],
    )
    .await;
    until_found(&stack, ALICE, &q("清空记录"), vec![r(cleared)]).await;
    // ALICE left the club: nothing of it, however she asks; BOB still finds it.
    wait_for(
        "ALICE's leave projected",
        Duration::from_secs(60),
        || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM im_group_members WHERE topic = ? AND uid = ?",
            )
            .bind(club)
            .bind(ALICE)
            .fetch_one(&stack.pool())
            .await
            .map_err(|e| e.to_string())?;
            if n == 0 {
                Ok(())
            } else {
                Err("still a member".into())
            }
        },
    )
    .await;
    until_found(&stack, ALICE, &q("秘密计划"), vec![]).await;
    let (status, _) = search(&stack, ALICE, &format!("{}&topic={club}", q("秘密计划"))).await;
    assert_eq!(status, 403, "a former member asking for the topic");
    until_found(
        &stack,
        BOB,
        &q("秘密计划"),
        vec![(club.to_string(), secret)],
    )
    .await;
}
