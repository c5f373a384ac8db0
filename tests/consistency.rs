//! The consistency checker (seed 000 §3.4 item 4, §3.5, §5.3, §12 item 16)
//! against the real services:
//!
//! - a topic across September and October whose MySQL route mirror and
//!   Redis route were damaged (a wrong mirror row, a missing one, an orphan
//!   one, a wrong and a missing Redis month) is repaired from the month
//!   tables and the mirror by `imstream shards check`; every repair is a row
//!   of `im_consistency_repairs` saying what was found and what it became;
//!   history reads return every message; a second check finds nothing;
//! - the scheduled check goes through a tenant's topics a few at a time;
//! - expired dedup rows are purged, at most `dedup_purge_per_run` per run;
//! - a sealed month reopened with `imstream shards reopen` takes its late
//!   events from the store DLQ (`imstream dlq replay store`) and is sealed
//!   again by the next shard pass.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sqlx::MySqlPool;

use imstream::events::{now_ms, EventCodec, GroupEvent, GroupEventBody, MessageSent};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::TopicKind;
use imstream::keys::TopicKeys;
use imstream::redis_util::Clock;
use imstream::store::shards::ShardManager;

use common::{send_http, store_dlq_depth, wait_for, Stack};

const SEPTEMBER_CLOCK: &str = "2026-09-30T23:59:00Z";
const OCTOBER_CLOCK: &str = "2026-10-01T00:00:05Z";

/// `(month, min, max, count)` of a topic's mirror rows.
async fn mirror(pool: &MySqlPool, topic: &str) -> BTreeMap<String, (i64, i64, i64)> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT shard_month, min_seq, max_seq, message_count FROM im_group_message_topic_shards WHERE topic = ?",
    )
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(m, a, b, c)| (m, (a, b, c)))
        .collect()
}

/// The Redis route of a topic: ZSET month → first seq, and `route_meta`.
async fn route(stack: &Stack, topic: &str) -> (Vec<(String, i64)>, BTreeMap<String, String>) {
    let mut redis = stack.redis().await;
    let keys = TopicKeys::new(stack.tenant(), topic);
    let zset: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(keys.route())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut redis)
        .await
        .unwrap();
    let mut meta: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys.route_meta())
        .query_async(&mut redis)
        .await
        .unwrap();
    meta.remove("complete");
    (zset, meta)
}

/// `(kind, topic, month, found, repaired_to)` of every recorded repair.
async fn repairs(pool: &MySqlPool) -> Vec<(String, String, String, String, String)> {
    sqlx::query_as(
        "SELECT kind, CAST(topic AS CHAR), shard_month, found, repaired_to FROM im_consistency_repairs ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn wait_stored(pool: &MySqlPool, topic: &str, want: BTreeMap<String, (i64, i64, i64)>) {
    wait_for(
        &format!("{topic} stored as {want:?}"),
        Duration::from_secs(60),
        || {
            let want = want.clone();
            async move {
                let got = mirror(pool, topic).await;
                if got == want {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_repairs_mirror_and_route_from_mysql_and_records_each_repair() {
    let mut stack = Stack::prepared(Some(SEPTEMBER_CLOCK)).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let addr = stack.start_gateway("node-a").await;
    let (topic, calm) = ("grpDamaged", "grpCalm");
    stack.create_group(topic, 1, &[2]).await;
    stack.create_group(calm, 1, &[2]).await;
    let client = reqwest::Client::new();
    let token = stack.token(2, "web");
    for i in 1..=5 {
        let (status, _) = send_http(&client, addr, &token, topic, &format!("s{i}"), "sep").await;
        assert_eq!(status, 202);
    }
    let (status, _) = send_http(&client, addr, &token, calm, "c1", "calm").await;
    assert_eq!(status, 202);
    stack.shard_pass(Some(OCTOBER_CLOCK)).await;
    for i in 1..=3 {
        let (status, _) = send_http(&client, addr, &token, topic, &format!("o{i}"), "oct").await;
        assert_eq!(status, 202);
    }
    let truth = BTreeMap::from([
        ("202609".to_string(), (1, 5, 5)),
        ("202610".to_string(), (6, 8, 3)),
    ]);
    let pool = stack.pool();
    wait_stored(&pool, topic, truth.clone()).await;
    // The store writes Redis after MySQL: wait for the route too.
    wait_for("the route written", Duration::from_secs(30), || async {
        let (zset, _) = route(&stack, topic).await;
        if zset.len() == 2 {
            Ok(())
        } else {
            Err(format!("{zset:?}"))
        }
    })
    .await;
    let healthy = route(&stack, topic).await;

    // Damage: a wrong mirror row, a missing one, an orphan one (August's
    // table exists and holds nothing of the topic); a wrong and a missing
    // month in Redis.
    sqlx::query("UPDATE im_group_message_topic_shards SET max_seq = 4, message_count = 4 WHERE topic = ? AND shard_month = '202609'")
        .bind(topic).execute(&pool).await.unwrap();
    sqlx::query(
        "DELETE FROM im_group_message_topic_shards WHERE topic = ? AND shard_month = '202610'",
    )
    .bind(topic)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO im_group_message_topic_shards (topic, shard_month, min_seq, max_seq, message_count, min_created_at, max_created_at) VALUES (?, '202608', 1, 3, 3, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))")
        .bind(topic).execute(&pool).await.unwrap();
    let mut redis = stack.redis().await;
    let keys = TopicKeys::new(stack.tenant(), topic);
    let _: () = redis::pipe()
        .hset(keys.route_meta(), "202609", "min_seq=1,max_seq=2,count=2")
        .ignore()
        .zrem(keys.route(), "202610")
        .ignore()
        .hdel(keys.route_meta(), "202610")
        .ignore()
        .query_async(&mut redis)
        .await
        .unwrap();

    let (ok, out) = stack.imstream(&["shards", "check", "--tenant", stack.tenant()]);
    assert!(ok, "shards check: {out}");
    for kind in [
        "mirror_wrong",
        "mirror_missing",
        "mirror_orphan",
        "redis_route",
    ] {
        assert!(
            out.contains(&format!("\t{kind}\tfound=1\trepaired=1")),
            "{kind} in: {out}"
        );
    }
    assert!(out.contains("\ttopics=2\t"), "{out}");

    // MySQL is as the tables say; Redis as MySQL says.
    assert_eq!(mirror(&pool, topic).await, truth);
    assert_eq!(route(&stack, topic).await, healthy);
    let recorded = repairs(&pool).await;
    let kinds: Vec<&str> = recorded.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "mirror_orphan",
            "mirror_wrong",
            "mirror_missing",
            "redis_route"
        ],
        "{recorded:?}"
    );
    assert!(recorded.iter().all(|r| r.1 == topic), "{recorded:?}");
    assert_eq!(
        (
            recorded[1].2.as_str(),
            recorded[1].3.as_str(),
            recorded[1].4.as_str()
        ),
        (
            "202609",
            "min_seq=1,max_seq=4,count=4",
            "min_seq=1,max_seq=5,count=5"
        )
    );
    assert_eq!(recorded[2].3, "missing");
    assert!(recorded[3].3.contains("202610: missing"), "{recorded:?}");

    // Every message reads back.
    let resp = client
        .get(format!("http://{addr}/v1/groups/{topic}/messages?limit=50"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let page: Value = resp.json().await.unwrap();
    let mut seqs: Vec<i64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    seqs.sort();
    assert_eq!(seqs, (1..=8).collect::<Vec<_>>(), "{page}");

    // A second check finds nothing and records nothing.
    let (ok, out) = stack.imstream(&["shards", "check", "--tenant", stack.tenant()]);
    assert!(ok && !out.contains("found="), "{out}");
    assert_eq!(repairs(&pool).await.len(), 4);

    // The scheduled check goes through the topics a few at a time.
    let mut config = stack.config().clone();
    config.shards.check_topics_per_run = 1;
    let manager = ShardManager::connect(
        &config,
        Clock::from_override(OCTOBER_CLOCK),
        imstream::pipeline::store_topics(&config).unwrap(),
    )
    .await
    .unwrap();
    let mut cursors = std::collections::HashMap::new();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let reports = manager.check(&mut cursors).await;
        assert_eq!(reports.len(), 1);
        seen.push((reports[0].1.topics, cursors.get(stack.tenant()).cloned()));
    }
    assert_eq!(
        seen,
        [
            (1, Some(calm.to_string())),
            (1, Some(topic.to_string())),
            (0, None)
        ]
    );
}

#[tokio::test]
async fn expired_dedup_rows_are_purged_a_bounded_number_per_run() {
    let stack = Stack::prepared(None).await;
    let pool = stack.pool();
    for i in 0..28 {
        let expires = if i < 25 {
            "UTC_TIMESTAMP(3) - INTERVAL 1 DAY"
        } else {
            "UTC_TIMESTAMP(3) + INTERVAL 1 DAY"
        };
        sqlx::query(&format!(
            "INSERT INTO im_group_message_dedup (topic, from_user, client_msg_id, seqid, shard_month, status, expires_at) \
             VALUES ('grpDedup', 7, ?, ?, '202609', 'done', {expires})"
        ))
        .bind(format!("c{i}"))
        .bind(i + 1)
        .execute(&pool)
        .await
        .unwrap();
    }
    let mut config = stack.config().clone();
    config.shards.dedup_purge_per_run = 10;
    let manager = ShardManager::connect(
        &config,
        Clock::from_override(""),
        imstream::pipeline::store_topics(&config).unwrap(),
    )
    .await
    .unwrap();
    let mut cursors = std::collections::HashMap::new();
    let mut purged = Vec::new();
    for _ in 0..4 {
        purged.push(manager.check(&mut cursors).await[0].1.dedup_purged);
    }
    assert_eq!(purged, [10, 10, 5, 0]);
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(client_msg_id AS CHAR) FROM im_group_message_dedup ORDER BY seqid",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(left, ["c25", "c26", "c27"]);
}

fn late_message(stack: &Stack, topic: &str, seq: i64, month: &str) -> GroupEvent {
    GroupEvent::new(
        stack.tenant(),
        topic,
        7,
        GroupEventBody::MessageSent(MessageSent {
            message_id: (rand::random::<u32>() as i64) << 20 | seq,
            group_id: 42,
            seq,
            shard_month: month.to_string(),
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
            created_at: now_ms(),
            expires_at: None,
        }),
    )
}

async fn status(pool: &MySqlPool, m: &str) -> String {
    sqlx::query_scalar("SELECT status FROM im_group_message_shards WHERE shard_month = ?")
        .bind(m)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn stored(pool: &MySqlPool, topic: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ?")
        .bind(topic)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reopened_sealed_month_takes_its_late_events_from_the_dlq_and_seals_again() {
    const SEPTEMBER: &str = "2026-09-05T12:00:00Z";
    const MID_OCTOBER: &str = "2026-10-09T00:00:00Z";
    let mut stack = Stack::prepared(Some(SEPTEMBER)).await;
    stack.start_pipeline("store").await;
    let pool = stack.pool();
    stack.shard_pass(Some(MID_OCTOBER)).await;
    assert_eq!(status(&pool, "202609").await, "sealed");

    // A late September event: the store sends it to its DLQ (compensation).
    let topic = "grpLate";
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer = EventProducer::new(&stack.config().kafka, codec).unwrap();
    producer
        .send(
            TopicKind::GroupEvents,
            &format!("{}:{topic}", stack.tenant()),
            &late_message(&stack, topic, 1, "202609"),
            None,
        )
        .await
        .unwrap();
    let config = stack.config().clone();
    wait_for(
        "the late event dead-lettered",
        Duration::from_secs(60),
        || {
            let config = config.clone();
            async move {
                match store_dlq_depth(&config).await {
                    n if n >= 1 => Ok(()),
                    n => Err(format!("{n} dead letters")),
                }
            }
        },
    )
    .await;
    assert_eq!(stored(&pool, topic).await, 0);

    // Only a sealed month can be reopened.
    let (ok, out) = stack.imstream(&["shards", "reopen", stack.tenant(), "202610"]);
    assert!(!ok && out.contains("202610 is writable"), "{out}");
    let (ok, out) = stack.imstream(&["shards", "reopen", stack.tenant(), "202609"]);
    assert!(ok, "reopen: {out}");
    assert_eq!(status(&pool, "202609").await, "sealing");
    let recorded = repairs(&pool).await;
    assert_eq!(
        recorded,
        [(
            "month_reopened".to_string(),
            String::new(),
            "202609".to_string(),
            "sealed".to_string(),
            "sealing".to_string()
        )]
    );
    // While its dead letter waits, a pass does not seal it again.
    stack.shard_pass(Some(MID_OCTOBER)).await;
    assert_eq!(status(&pool, "202609").await, "sealing");

    let (ok, out) = stack.imstream(&["dlq", "replay", "store"]);
    assert!(ok, "dlq replay: {out}");
    assert_eq!(stored(&pool, topic).await, 1);
    stack.shard_pass(Some(MID_OCTOBER)).await;
    assert_eq!(status(&pool, "202609").await, "sealed");
}
