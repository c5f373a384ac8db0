//! Engines that come back with less than they acknowledged (issue 29),
//! against the real services, without restarting the shared servers (the
//! fault suite does that).
//!
//! A topic's seq state is rolled back the way a restore from an older AOF or
//! a promoted lagging replica leaves it — `last_seq` below what was
//! acknowledged, the claims of the later messages gone, written by an
//! incarnation of Redis that is not the one answering.
//!
//! - The next send is fenced until the state is re-derived from the log: its
//!   seq is past every acknowledged one (the stored ones and those still only
//!   in the log), and a retry of an acknowledged message gets its own seq.
//! - A collision the store finds anyway (a `(topic, seq)` held by another
//!   message) keeps both messages: the stored row stays, the other is kept
//!   in `im_seq_collisions` (and counted in
//!   `imstream_store_seq_collisions_total`, logged at error with both ids).
//!
//! A tenant database is put back to an earlier consistent state (rows and
//! pipeline checkpoints as they were after the first ten messages), as a
//! replica that lagged and was promoted would be: the store pipeline,
//! running or restarted, notices from its checkpoints and handles the lost
//! messages again.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{send_http, wait_for, Stack};
use imstream::keys::TopicKeys;

const TOPIC: &str = "grpRollback";
const OWNER: i64 = 7;

/// `client_msg_id → seq` of the topic's stored rows.
async fn stored(pool: &sqlx::MySqlPool) -> BTreeMap<String, i64> {
    let month = chrono::Utc::now().format("%Y%m").to_string();
    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT CAST(client_msg_id AS CHAR), seqid FROM im_group_messages_{month} WHERE topic = ?"
    ))
    .bind(TOPIC)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

async fn wait_stored(pool: &sqlx::MySqlPool, n: usize) -> BTreeMap<String, i64> {
    wait_for(&format!("{n} rows stored"), Duration::from_secs(90), || {
        let pool = pool.clone();
        async move {
            let rows = stored(&pool).await;
            if rows.len() == n {
                Ok(rows)
            } else {
                Err(format!("{} rows", rows.len()))
            }
        }
    })
    .await
}

/// Sends `cmid` until it is accepted (a fenced topic answers 503 meanwhile).
async fn send_until_accepted(stack: &Stack, cmid: &str) -> i64 {
    let client = reqwest::Client::new();
    let token = stack.token(OWNER, "http");
    wait_for(&format!("{cmid} accepted"), Duration::from_secs(90), || {
        let (client, token) = (client.clone(), token.clone());
        async move {
            let (code, body) =
                send_http(&client, stack.gateway_addr(0), &token, TOPIC, cmid, cmid).await;
            match code {
                202 => Ok(body["seq"].as_i64().expect("seq")),
                503 => Err(format!("503 {body}")),
                other => panic!("{cmid}: {other} {body}"),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolled_back_seq_state_is_fenced_and_rederived_from_the_log() {
    let mut stack = Stack::running().await;
    stack.create_group(TOPIC, OWNER, &[8]).await;
    let pool = stack.pool();
    let mut acked: BTreeMap<String, i64> = BTreeMap::new();
    for i in 1..=20 {
        let cmid = format!("m{i:02}");
        acked.insert(cmid.clone(), send_until_accepted(&stack, &cmid).await);
    }
    assert_eq!(
        acked.values().copied().collect::<Vec<_>>(),
        (1..=20).collect::<Vec<_>>()
    );
    wait_stored(&pool, 20).await;
    // Five more while the store is stopped: acknowledged, only in the log.
    stack.stop_pipeline("store").await;
    for i in 21..=25 {
        let cmid = format!("m{i:02}");
        acked.insert(cmid.clone(), send_until_accepted(&stack, &cmid).await);
    }

    // Redis comes back older: last_seq 18 (as an incarnation that is gone
    // wrote it), and the claims of seqs 19..25 are lost.
    let mut redis = stack.redis().await;
    let keys = TopicKeys::new(stack.tenant(), TOPIC);
    let _: () = redis::cmd("HSET")
        .arg(keys.seq())
        .arg("last_seq")
        .arg(18)
        .arg("inc")
        .arg("0123456789abcdef0123456789abcdef01234567")
        .query_async(&mut redis)
        .await
        .unwrap();
    for (cmid, seq) in &acked {
        if *seq > 18 {
            let _: () = redis::cmd("DEL")
                .arg(keys.uniq(OWNER, cmid))
                .query_async(&mut redis)
                .await
                .unwrap();
        }
    }
    stack.start_pipeline("store").await;

    // The next message takes a seq past every acknowledged one, never 19.
    let next = send_until_accepted(&stack, "after").await;
    assert!(next > 25, "seq {next} handed out again after a rollback");
    // Retries of acknowledged messages get their own seqs back: 19 and 20
    // from the month table, 23 from the log.
    for cmid in ["m19", "m20", "m23", "m05"] {
        assert_eq!(
            send_until_accepted(&stack, cmid).await,
            acked[cmid],
            "a retry of {cmid}"
        );
    }
    acked.insert("after".into(), next);
    // Every acknowledged message is stored once, at its seq.
    let rows = wait_stored(&pool, acked.len()).await;
    assert_eq!(rows, acked);
    let collisions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_seq_collisions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(collisions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seq_collision_keeps_both_messages_and_is_counted() {
    use imstream::events::*;
    let stack = Stack::running().await;
    stack.create_group(TOPIC, OWNER, &[8]).await;
    let pool = stack.pool();
    let first = send_until_accepted(&stack, "first").await;
    wait_stored(&pool, 1).await;

    // Another message with the same (topic, seq), as a Redis that handed
    // the seq out twice would produce it, delivered twice.
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer =
        imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
    let month = chrono::Utc::now().format("%Y%m").to_string();
    let intruder = GroupEvent::new(
        stack.tenant(),
        TOPIC,
        OWNER,
        GroupEventBody::MessageSent(MessageSent {
            message_id: 987_654_321,
            group_id: 1,
            seq: first,
            shard_month: month.clone(),
            client_msg_id: Some("second".into()),
            from_user: OWNER,
            msg_type: "text".into(),
            head: None,
            content: Some("{\"txt\":\"second\"}".into()),
            mentioned_user_ids: Vec::new(),
            mention_all: false,
            reply_seq: None,
            root_seq: None,
            file_count: 0,
            content_size: 14,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: now_ms(),
            expires_at: None,
        }),
    );
    for _ in 0..2 {
        producer
            .send(
                imstream::kafka::topics::TopicKind::GroupEvents,
                &intruder.key(),
                &intruder,
                None,
            )
            .await
            .unwrap();
    }
    let kept: (i64, i64, String, i64, String) =
        wait_for("the collision recorded", Duration::from_secs(60), || {
            let pool = pool.clone();
            async move {
                sqlx::query_as(
                    "SELECT message_id, seqid, CAST(client_msg_id AS CHAR), held_by_message_id, \
                     CAST(JSON_UNQUOTE(JSON_EXTRACT(content, '$.txt')) AS CHAR) \
                     FROM im_seq_collisions WHERE topic = ?",
                )
                .bind(TOPIC)
                .fetch_optional(&pool)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "none yet".to_string())
            }
        })
        .await;
    let held_by: i64 = sqlx::query_scalar(&format!(
        "SELECT message_id FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
    ))
    .bind(TOPIC)
    .bind(first)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        kept,
        (
            987_654_321,
            first,
            "second".into(),
            held_by,
            "second".into()
        )
    );
    // Once, although delivered twice; the stored row is the first message.
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_seq_collisions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        stored(&pool).await,
        BTreeMap::from([("first".into(), first)])
    );
}

/// The store pipeline's checkpoints in the tenant database.
async fn checkpoints(pool: &sqlx::MySqlPool) -> Vec<(String, i32, i64)> {
    sqlx::query_as(
        "SELECT CAST(source_topic AS CHAR), kafka_partition, next_offset \
         FROM im_pipeline_checkpoints WHERE consumer_group LIKE '%.store' \
         ORDER BY source_topic, kafka_partition",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Puts the database back to what it held after the first ten messages.
async fn back_to_ten(pool: &sqlx::MySqlPool, saved: &[(String, i32, i64)]) {
    let month = chrono::Utc::now().format("%Y%m").to_string();
    for sql in [
        format!("DELETE FROM im_group_messages_{month} WHERE topic = ? AND seqid > 10"),
        "DELETE FROM im_group_message_dedup WHERE topic = ? AND seqid > 10".to_string(),
        "UPDATE im_group_message_topic_shards SET max_seq = 10, message_count = 10 WHERE topic = ?"
            .to_string(),
    ] {
        sqlx::query(&sql).bind(TOPIC).execute(pool).await.unwrap();
    }
    for (source, partition, next) in saved {
        sqlx::query(
            "UPDATE im_pipeline_checkpoints SET next_offset = ? \
             WHERE consumer_group LIKE '%.store' AND source_topic = ? AND kafka_partition = ?",
        )
        .bind(next)
        .bind(source)
        .bind(partition)
        .execute(pool)
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_database_that_comes_back_older_is_caught_up_from_its_checkpoints() {
    let mut stack = Stack::running().await;
    caught_up_from_checkpoints(&mut stack, "store").await;
}

/// The same with the store pipeline in a deployment unit (issue 31): its
/// rewind moves the unit's shared consumer back, and the unit's other
/// member (hot) skips what it had handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_a_unit_a_tenant_database_that_comes_back_older_is_caught_up_from_its_checkpoints() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("members").await;
    stack.start_gateway("node-a").await;
    stack.use_units(
        "[[unit]]\nname = \"pair\"\nsource = \"group_events\"\npipelines = [\"store\", \"hot\"]\n",
    );
    stack.start_unit("pair").await;
    caught_up_from_checkpoints(&mut stack, "pair").await;
}

/// `store`: the store pipeline (alone, or the unit that runs it).
async fn caught_up_from_checkpoints(stack: &mut Stack, store: &str) {
    stack.create_group(TOPIC, OWNER, &[8]).await;
    let pool = stack.pool();
    let mut acked: BTreeMap<String, i64> = BTreeMap::new();
    for i in 1..=10 {
        let cmid = format!("m{i:02}");
        acked.insert(cmid.clone(), send_until_accepted(stack, &cmid).await);
    }
    wait_stored(&pool, 10).await;
    // Stopping writes every checkpoint: the state a replica holds.
    stack.stop_pipeline(store).await;
    let saved = checkpoints(&pool).await;
    assert!(!saved.is_empty(), "the store keeps checkpoints");
    stack.start(store).await;
    for i in 11..=20 {
        let cmid = format!("m{i:02}");
        acked.insert(cmid.clone(), send_until_accepted(stack, &cmid).await);
    }
    wait_stored(&pool, 20).await;
    wait_for("the checkpoints moved on", Duration::from_secs(30), || {
        let pool = pool.clone();
        let saved = saved.clone();
        async move {
            let now = checkpoints(&pool).await;
            if now != saved {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            }
        }
    })
    .await;

    // While the pipeline runs, the database comes back as it was after ten
    // messages; the next message (or the next check) finds it behind.
    back_to_ten(&pool, &saved).await;
    acked.insert("m21".into(), send_until_accepted(stack, "m21").await);
    assert_eq!(wait_stored(&pool, 21).await, acked);
    let count: i64 = sqlx::query_scalar(
        "SELECT CAST(SUM(message_count) AS SIGNED) FROM im_group_message_topic_shards WHERE topic = ?",
    )
    .bind(TOPIC)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(count, 21, "the mirror counts each message once");

    // Again with the pipeline stopped: it finds the database behind when it
    // starts, with no new message.
    stack.stop_pipeline(store).await;
    back_to_ten(&pool, &saved).await;
    assert_eq!(stored(&pool).await.len(), 10);
    stack.start(store).await;
    assert_eq!(wait_stored(&pool, 21).await, acked);
}
