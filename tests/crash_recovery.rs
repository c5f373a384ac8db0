//! Crash recovery against the real services:
//!
//! - the store pipeline, a real `imstream project store` child process, is
//!   killed with SIGKILL while it writes and restarted: every acked message
//!   is stored exactly once and the route mirror counts exactly the rows;
//! - a crash between the MySQL commit and the Redis route write: the
//!   redelivered batch (nothing new to insert) still repairs the route;
//! - Redis loses this tenant's data while clients send: sends go on at
//!   once, from the topic's durable seq mark (issue 38), with seqs above
//!   every seq acked before (a hole of at most two blocks), and no seq is
//!   used twice.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use sqlx::MySqlPool;

use imstream::events::{new_event_id, now_ms, EventCodec, GroupEvent, GroupEventBody, MessageSent};
use imstream::kafka::producer::{Acked, EventProducer};
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::keys::{TenantKeys, TopicKeys};
use imstream::send::marks::{MAX_BLOCK, RESTORE_BLOCK};
use imstream::store::month::ShardMonth;

use common::process::Proc;
use common::{send_http, stored_counts, wait_for, Stack};

fn current_month() -> String {
    ShardMonth::of(chrono::Utc::now()).to_string()
}

async fn stored_rows(pool: &MySqlPool, topic: &str) -> Vec<(i64, String)> {
    sqlx::query_as(&format!(
        "SELECT seqid, CAST(client_msg_id AS CHAR) FROM im_group_messages_{} WHERE topic = ? ORDER BY seqid",
        current_month()
    ))
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Sum of the mirror's message counts of a topic.
async fn mirror_count(pool: &MySqlPool, topic: &str) -> i64 {
    let counts: Vec<i64> = sqlx::query_scalar(
        "SELECT message_count FROM im_group_message_topic_shards WHERE topic = ?",
    )
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap();
    counts.into_iter().sum()
}

/// Sends with retries of retryable refusals (same client_msg_id).
async fn send_acked(
    client: &reqwest::Client,
    addr: std::net::SocketAddr,
    token: &str,
    topic: &str,
    cmid: &str,
) -> i64 {
    wait_for(
        &format!("{cmid} acked"),
        Duration::from_secs(60),
        || async move {
            let (status, body) = send_http(client, addr, token, topic, cmid, cmid).await;
            match status {
                202 => Ok(body["seq"].as_i64().expect("seq")),
                503 if body["params"]["retry"] == serde_json::json!(true) => {
                    Err(format!("503 {body}"))
                }
                other => panic!("{cmid} refused: {other} {body}"),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_of_the_store_pipeline_mid_batch_loses_and_duplicates_nothing() {
    const SENDERS: usize = 8;
    const PER_SENDER: usize = 400;
    const TOTAL: usize = SENDERS * PER_SENDER;
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("members").await;
    stack.start_gateway("node-a").await;
    let topic = "grpCrash";
    let members: Vec<i64> = (2..=20).collect();
    stack.create_group(topic, 1, &members).await;
    let pool = stack.pool();
    let config_file = stack.config_file("crash");
    // A store pipeline in its own process, its logs in crash-<id>-N.log.
    let name = format!("crash-{}", stack.world.id);
    let mut store = Proc::spawn(&name, &config_file, &["project", "store"]);

    let addr = stack.gateway_addr(0);
    let client = reqwest::Client::new();
    let acks: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let uid = 2 + s as i64;
        let token = stack.token(uid, "web");
        let (client, acks) = (client.clone(), acks.clone());
        senders.push(tokio::spawn(async move {
            for i in 0..PER_SENDER {
                let cmid = format!("u{uid}-{i}");
                let seq = send_acked(&client, addr, &token, topic, &cmid).await;
                acks.lock().unwrap().push((cmid, seq));
            }
        }));
    }

    // Two crashes, each while the pipeline is busy writing a stream that is
    // still coming in; the last incarnation runs to the end.
    let mut killed_at = Vec::new();
    for round in 1..=2 {
        let floor = stored_counts(&pool, topic).await.0;
        let seen = wait_for(
            &format!("crash {round}: the pipeline writing"),
            Duration::from_secs(120),
            || {
                let (pool, acks) = (pool.clone(), acks.clone());
                async move {
                    let (rows, _) = stored_counts(&pool, topic).await;
                    let acked = acks.lock().unwrap().len() as i64;
                    // Writing, with acked messages still waiting for it.
                    if rows >= floor + 300 && acked > rows {
                        Ok(rows)
                    } else {
                        Err(format!("{rows} rows (floor {floor}), {acked} acked"))
                    }
                }
            },
        )
        .await;
        store.kill_9().await;
        killed_at.push(seen);
        store.respawn();
    }
    for s in senders {
        s.await.expect("sender");
    }
    let acks = acks.lock().unwrap().clone();
    assert_eq!(acks.len(), TOTAL);

    wait_for(
        "every acked message stored",
        Duration::from_secs(180),
        || {
            let pool = pool.clone();
            async move {
                let (rows, _) = stored_counts(&pool, topic).await;
                if rows >= TOTAL as i64 {
                    Ok(())
                } else {
                    Err(format!("{rows} of {TOTAL} rows"))
                }
            }
        },
    )
    .await;
    // The last incarnation handled everything: stop it the hard way too.
    store.kill_9().await;

    let (rows, distinct) = stored_counts(&pool, topic).await;
    assert_eq!(
        (rows, distinct),
        (TOTAL as i64, TOTAL as i64),
        "killed at {killed_at:?}"
    );
    let stored: HashMap<String, i64> = stored_rows(&pool, topic)
        .await
        .into_iter()
        .map(|(seq, cmid)| (cmid, seq))
        .collect();
    for (cmid, seq) in &acks {
        assert_eq!(stored.get(cmid), Some(seq), "{cmid}");
    }
    let seqs: BTreeSet<i64> = acks.iter().map(|a| a.1).collect();
    assert_eq!(seqs.len(), TOTAL, "no seq acked twice");
    assert_eq!(
        mirror_count(&pool, topic).await,
        rows,
        "the mirror counts each row once"
    );
    let (lo, hi): (i64, i64) = sqlx::query_as(
        "SELECT min_seq, max_seq FROM im_group_message_topic_shards WHERE topic = ?",
    )
    .bind(topic)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((lo, hi), (*seqs.first().unwrap(), *seqs.last().unwrap()));
}

fn message_sent(tenant: &str, topic: &str, seq: i64) -> GroupEvent {
    let now = now_ms();
    GroupEvent {
        event_id: new_event_id(),
        tenant_id: tenant.to_string(),
        topic: topic.to_string(),
        occurred_at: now,
        actor_uid: 7,
        actor_device: "test".into(),
        source_sid: String::new(),
        source_node: "test".into(),
        traceparent: String::new(),
        body: GroupEventBody::MessageSent(MessageSent {
            message_id: 1_000_000 + seq,
            group_id: 42,
            seq,
            shard_month: current_month(),
            client_msg_id: Some(format!("c{seq}")),
            from_user: 7,
            msg_type: "text".into(),
            head: None,
            content: Some("{\"txt\":\"x\"}".into()),
            mentioned_user_ids: vec![],
            mention_all: false,
            reply_seq: None,
            root_seq: None,
            file_count: 0,
            content_size: 11,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: now,
            expires_at: None,
        }),
    }
}

async fn route_meta(stack: &Stack, topic: &str) -> Option<String> {
    let mut redis = stack.redis().await;
    redis::cmd("HGET")
        .arg(TopicKeys::new(stack.tenant(), topic).route_meta())
        .arg(current_month())
        .query_async(&mut redis)
        .await
        .unwrap()
}

async fn wait_route(stack: &Stack, topic: &str, expected: &str) {
    wait_for(
        &format!("route_meta of {topic} = {expected}"),
        Duration::from_secs(30),
        || async move {
            match route_meta(stack, topic).await {
                Some(v) if v == expected => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// The store pipeline committed a batch to MySQL and died before writing the
/// Redis route and before committing its Kafka offset. Its successor gets
/// the batch again, finds every row stored already, and must still write the
/// route: otherwise Redis keeps the stale segment for good.
#[tokio::test]
async fn a_crash_between_commit_and_route_write_is_repaired_by_the_redelivery() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("store").await;
    let topic = "grpRouteCrash";
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer = EventProducer::new(&stack.config().kafka, codec).unwrap();
    let key = format!("{}:{topic}", stack.tenant());
    for seq in 1..=2 {
        let e = message_sent(stack.tenant(), topic, seq);
        producer
            .send(TopicKind::GroupEvents, &key, &e, None)
            .await
            .unwrap();
    }
    wait_route(&stack, topic, "min_seq=1,max_seq=2,count=2").await;
    let third = message_sent(stack.tenant(), topic, 3);
    let acked: Acked = producer
        .send(TopicKind::GroupEvents, &key, &third, None)
        .await
        .unwrap();
    wait_route(&stack, topic, "min_seq=1,max_seq=3,count=3").await;
    stack.stop_pipeline("store").await;

    // What the crash left: MySQL has seq 3 and the mirror counts it, Redis
    // still shows the segment before it, and the group's offset is before
    // seq 3's record.
    let mut redis = stack.redis().await;
    let _: () = redis::cmd("HSET")
        .arg(TopicKeys::new(stack.tenant(), topic).route_meta())
        .arg(current_month())
        .arg("min_seq=1,max_seq=2,count=2")
        .query_async(&mut redis)
        .await
        .unwrap();
    let config = stack.config().clone();
    tokio::task::spawn_blocking(move || {
        let group = format!("{}.store", config.pipelines.group_prefix);
        let consumer: BaseConsumer = imstream::kafka::client_config(&config.kafka)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let source = TopicNames::new(&config.kafka).name(TopicKind::GroupEvents);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&source, acked.partition, Offset::Offset(acked.offset))
            .unwrap();
        consumer.commit(&tpl, CommitMode::Sync).unwrap();
    })
    .await
    .unwrap();

    stack.start_pipeline("store").await;
    wait_route(&stack, topic, "min_seq=1,max_seq=3,count=3").await;
    let pool = stack.pool();
    assert_eq!(stored_counts(&pool, topic).await, (3, 3));
    assert_eq!(mirror_count(&pool, topic).await, 3);
}

/// One request of the Redis-loss test.
#[derive(Debug, Clone)]
struct Outcome {
    cmid: String,
    seq: i64,
    /// Phase when the request started / got its answer:
    /// 0 before the loss, 1 while the keys are deleted, 2 after.
    started: u8,
    answered: u8,
}

/// What [`lose_tenant_data`] did.
struct Loss {
    /// Keys deleted.
    deleted: usize,
    /// The lost allocator's `last_seq`: every seq it handed out is at most
    /// this.
    last_seq: i64,
}

/// Loses `keys` (from [`tenant_keys`]) at one instant, as a Redis restart
/// without persistence or a failover to an empty replica does: one MULTI
/// reads the topic allocator's last seq and deletes them all. (Deleting
/// while scanning spread the loss over the tens of seconds the scan takes,
/// so a re-seed started when the seq key went could be done before the
/// loss was over.)
async fn lose_tenant_data(
    redis: &mut imstream::redis_util::Redis,
    tenant: &str,
    topic: &str,
    keys: &BTreeSet<String>,
) -> Loss {
    let seq_key = TopicKeys::new(tenant, topic).seq();
    let generation = TenantKeys::new(tenant).generation();
    let mut pipe = redis::pipe();
    // One MULTI on one server. A cluster cannot delete keys of many slots
    // at once (its loss is per node anyway): there the commands go one
    // slot after another, a key per DEL.
    if !common::redis_url().contains("+cluster://") {
        pipe.atomic();
    }
    pipe.cmd("HGET").arg(&seq_key).arg("last_seq");
    for k in keys {
        pipe.cmd("DEL").arg(k);
    }
    pipe.cmd("EXISTS")
        .arg(&seq_key)
        .cmd("EXISTS")
        .arg(&generation);
    let replies: Vec<redis::Value> = pipe.query_async(redis).await.unwrap();
    let number = |v: &redis::Value| -> i64 { redis::from_redis_value(v).unwrap() };
    let last_seq: Option<i64> = redis::from_redis_value(&replies[0]).unwrap();
    let deleted = replies[1..replies.len() - 2]
        .iter()
        .map(number)
        .sum::<i64>() as usize;
    let (seq_left, generation_left) = (
        number(&replies[replies.len() - 2]) > 0,
        number(&replies[replies.len() - 1]) > 0,
    );
    assert!(
        !seq_left && !generation_left,
        "the allocator and the generation marker are gone"
    );
    Loss {
        deleted,
        last_seq: last_seq.expect("the topic had a seq allocator before the loss"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_losing_the_tenant_restores_sends_from_the_mark_and_never_reuses_a_seq() {
    let stack = Stack::running().await;
    let topic = "grpFlush";
    stack.create_group(topic, 1, &[2, 3, 4, 5]).await;
    let pool = stack.pool();
    let addr = stack.gateway_addr(0);
    let client = reqwest::Client::new();
    let phase = Arc::new(AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let refusals_after = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for uid in 2..=5i64 {
        let token = stack.token(uid, "web");
        let (client, phase, stop, outcomes, refusals_after) = (
            client.clone(),
            phase.clone(),
            stop.clone(),
            outcomes.clone(),
            refusals_after.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let cmid = format!("u{uid}-{i}");
                let started = phase.load(Ordering::SeqCst);
                // Retry this client_msg_id until it is accepted.
                let seq = wait_for(&format!("{cmid} acked"), Duration::from_secs(90), || {
                    let (client, token, cmid, refusals_after, phase) =
                        (&client, &token, &cmid, &refusals_after, &phase);
                    async move {
                        let (status, body) =
                            send_http(client, addr, token, topic, cmid, cmid).await;
                        match status {
                            202 => Ok(body["seq"].as_i64().expect("seq")),
                            503 => {
                                assert_eq!(
                                    body["params"]["retry"],
                                    serde_json::json!(true),
                                    "a 503 says retry: {body}"
                                );
                                // Answered once the loss began: nothing
                                // else refuses a send in this test.
                                if phase.load(Ordering::SeqCst) >= 1 {
                                    refusals_after.fetch_add(1, Ordering::SeqCst);
                                }
                                Err(format!("503 {body}"))
                            }
                            other => panic!("{cmid} refused: {other} {body}"),
                        }
                    }
                })
                .await;
                let answered = phase.load(Ordering::SeqCst);
                outcomes.lock().unwrap().push(Outcome {
                    cmid,
                    seq,
                    started,
                    answered,
                });
                i += 1;
            }
        }));
    }
    let count_where = |f: fn(&Outcome) -> bool| {
        let outcomes = outcomes.clone();
        move || outcomes.lock().unwrap().iter().filter(|o| f(o)).count()
    };
    let before = count_where(|_| true);
    wait_for("sends before the loss", Duration::from_secs(60), || {
        let n = before();
        async move {
            if n >= 100 {
                Ok(())
            } else {
                Err(format!("{n} acks"))
            }
        }
    })
    .await;

    let mut redis = stack.redis().await;
    let keys = common::tenant_keys(&mut redis, stack.tenant(), topic).await;
    phase.store(1, Ordering::SeqCst);
    let loss = lose_tenant_data(&mut redis, stack.tenant(), topic, &keys).await;
    phase.store(2, Ordering::SeqCst);
    assert!(loss.deleted > 0);

    let after = count_where(|o| o.started == 2);
    wait_for(
        "sends accepted again after the re-seed",
        Duration::from_secs(90),
        || {
            let n = after();
            async move {
                if n >= 100 {
                    Ok(())
                } else {
                    Err(format!("{n} acks started after the loss"))
                }
            }
        },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.await.expect("sender");
    }
    let outcomes = outcomes.lock().unwrap().clone();

    // The old allocator handed out seqs up to `loss.last_seq`; the
    // restored one only above. Sends started after the loss got seqs
    // from the restored allocator.
    eprintln!(
        "retryable answers after the loss: {}",
        refusals_after.load(Ordering::SeqCst)
    );
    let (old, restored): (Vec<&Outcome>, Vec<&Outcome>) =
        outcomes.iter().partition(|o| o.seq <= loss.last_seq);
    assert!(
        old.iter().all(|o| o.started < 2),
        "a send started after the loss got a seq of the lost allocator (≤ {})",
        loss.last_seq
    );
    assert!(restored.len() >= 100, "acks after the loss");
    // The restore continued from the durable mark: above everything acked
    // before, skipping at most the blocks reserved ahead (no margin of a
    // thousand, no log read).
    let max_old = old
        .iter()
        .map(|o| o.seq)
        .max()
        .expect("acks before the loss");
    let min_restored = restored.iter().map(|o| o.seq).min().unwrap();
    assert!(
        min_restored > max_old && min_restored <= max_old + 2 * MAX_BLOCK + RESTORE_BLOCK + 1,
        "restored at {min_restored} after {max_old}: not within the blocks reserved ahead"
    );
    // No seq handed out twice.
    let mut holders: HashMap<i64, Vec<&str>> = HashMap::new();
    for o in &outcomes {
        holders.entry(o.seq).or_default().push(&o.cmid);
    }
    let reused: Vec<_> = holders.iter().filter(|(_, c)| c.len() > 1).collect();
    assert!(reused.is_empty(), "seqs acked twice: {reused:?}");
    // Every send started after the loss got a seq above every seq acked
    // before it.
    let acked_before = outcomes
        .iter()
        .filter(|o| o.answered == 0)
        .map(|o| o.seq)
        .max()
        .expect("acks before the loss");
    let first_after = outcomes
        .iter()
        .filter(|o| o.started == 2)
        .map(|o| o.seq)
        .min()
        .expect("acks after the loss");
    assert!(
        first_after > acked_before,
        "after the loss seqs restart at {first_after}, but {acked_before} was acked before"
    );

    // Everything acked is stored once.
    let expected = outcomes.len() as i64;
    wait_for(
        "every acked message stored",
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            async move {
                let (rows, _) = stored_counts(&pool, topic).await;
                if rows >= expected {
                    Ok(())
                } else {
                    Err(format!("{rows} of {expected}"))
                }
            }
        },
    )
    .await;
    let (rows, distinct) = stored_counts(&pool, topic).await;
    assert_eq!((rows, distinct), (expected, expected));
    let stored: HashMap<String, i64> = stored_rows(&pool, topic)
        .await
        .into_iter()
        .map(|(seq, cmid)| (cmid, seq))
        .collect();
    for o in &outcomes {
        assert_eq!(stored.get(&o.cmid), Some(&o.seq), "{}", o.cmid);
    }
    assert_eq!(mirror_count(&pool, topic).await, rows);
}
