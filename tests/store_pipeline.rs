//! The store pipeline against the real services (seed 000 §12):
//!
//! - (11) a missing month table is an outage: the event is retried (the
//!   shard-missing metric moves, the pipeline is degraded), never sent to
//!   the DLQ, and stored once the table exists; a dead letter is stored by
//!   a DLQ replay (`imstream dlq replay store`), exactly once;
//! - (14) illegal months and table names are refused, by the parsers and
//!   end to end: such an event goes to the DLQ and never creates a table;
//! - (13) a 10,000-member group with 20 concurrent senders × 500 messages:
//!   seqs exactly 1..=10000, every acked message stored exactly once.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use sqlx::MySqlPool;

use imstream::events::{new_event_id, now_ms, EventCodec, GroupEvent, GroupEventBody, MessageSent};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::pipeline::Topology;
use imstream::store::month::{MonthTable, ShardMonth};

use common::{process, send_http, unique_id, wait_for, Stack};

/// The store topology with short backoffs, so a doomed record reaches the
/// DLQ quickly.
fn fast_store_topology() -> Topology {
    Topology::parse(
        "name = \"store\"\nsource = \"group_events\"\nbatch_max = 200\nbatch_linger_ms = 5\n\
         max_attempts = 3\nbackoff_initial_ms = 20\nbackoff_max_ms = 50\n",
        "test-store.toml",
    )
    .expect("topology")
}

/// Starts the store pipeline in-process with `topology`.
fn start_store(stack: &Stack, topology: Topology) -> tokio::task::JoinHandle<()> {
    let config = stack.config().clone();
    let shutdown = stack.world.shutdown.child();
    tokio::spawn(async move {
        imstream::pipeline::run_topology(&config, &topology, shutdown)
            .await
            .expect("store pipeline");
    })
}

/// Sum of every series of a Prometheus counter in this process.
fn counter(name: &str) -> f64 {
    imstream::telemetry::metrics_handle()
        .render()
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn message_sent(tenant: &str, topic: &str, seq: i64, month: &str, cmid: &str) -> GroupEvent {
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
            message_id: (rand::random::<u32>() as i64) << 20 | seq,
            group_id: 42,
            seq,
            shard_month: month.to_string(),
            client_msg_id: Some(cmid.to_string()),
            from_user: 7,
            msg_type: "text".into(),
            head: None,
            content: Some(format!("{{\"txt\":\"{cmid}\"}}")),
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
    }
}

async fn produce(stack: &Stack, events: &[&GroupEvent]) {
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer = EventProducer::new(&stack.config().kafka, codec).unwrap();
    for e in events {
        producer
            .send(
                TopicKind::GroupEvents,
                &format!("{}:{}", e.tenant_id, e.topic),
                *e,
                None,
            )
            .await
            .expect("produce");
    }
}

/// One record read back from the store DLQ.
#[derive(Debug, Clone)]
struct Dead {
    event_id: String,
    reason: String,
    pipeline: String,
}

/// Reads the store DLQ from the start (own consumer group).
struct DlqReader {
    consumer: StreamConsumer,
    codec: EventCodec,
    seen: Mutex<Vec<Dead>>,
}

impl DlqReader {
    fn new(stack: &Stack) -> DlqReader {
        let config = stack.config();
        let dlq = TopicNames::new(&config.kafka).dlq(TopicKind::GroupEvents, "store");
        let consumer: StreamConsumer = imstream::kafka::client_config(&config.kafka)
            .set("group.id", format!("dlq-reader-{}", unique_id()))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.subscribe(&[&dlq]).unwrap();
        DlqReader {
            consumer,
            codec: EventCodec::new(&config.registry.url).unwrap(),
            seen: Mutex::new(Vec::new()),
        }
    }

    /// Waits until each of `event_ids` was read `times` times; returns
    /// everything read so far.
    async fn wait_for(&self, event_ids: &[&str], times: usize) -> Vec<Dead> {
        wait_for(
            &format!("{event_ids:?} in the DLQ {times}x"),
            Duration::from_secs(60),
            || async move {
                if let Ok(Ok(msg)) =
                    tokio::time::timeout(Duration::from_millis(500), self.consumer.recv()).await
                {
                    let header = |name: &str| {
                        msg.headers()
                            .and_then(|h| h.iter().find(|h| h.key == name))
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default()
                    };
                    let event: GroupEvent = self
                        .codec
                        .decode(msg.payload())
                        .await
                        .map_err(|e| e.to_string())?;
                    self.seen.lock().unwrap().push(Dead {
                        event_id: event.event_id,
                        reason: header("dlq.reason"),
                        pipeline: header("dlq.pipeline"),
                    });
                }
                let seen = self.seen.lock().unwrap().clone();
                let missing: Vec<_> = event_ids
                    .iter()
                    .filter(|id| seen.iter().filter(|d| d.event_id == **id).count() < times)
                    .collect();
                if missing.is_empty() {
                    Ok(seen)
                } else {
                    Err(format!("missing {missing:?}; read {seen:?}"))
                }
            },
        )
        .await
    }
}

async fn month_tables(pool: &MySqlPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() \
         AND table_name LIKE 'im\\_group\\_messages\\_%' ORDER BY table_name",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn catalog(pool: &MySqlPool) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT shard_month, table_name FROM im_group_message_shards ORDER BY shard_month",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn count_seq(pool: &MySqlPool, month: &str, topic: &str, seq: i64) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
    ))
    .bind(topic)
    .bind(seq)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn mirror(pool: &MySqlPool, topic: &str) -> Vec<(String, i64, i64, i64)> {
    sqlx::query_as(
        "SELECT shard_month, min_seq, max_seq, message_count FROM im_group_message_topic_shards \
         WHERE topic = ? ORDER BY shard_month",
    )
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn current_month() -> String {
    ShardMonth::of(chrono::Utc::now()).to_string()
}

/// (11) Missing month table: an outage (the shard manager has not made it
/// yet), not a reason to give up. The event is retried far past
/// `max_attempts`, the shard-missing metric moves, the pipeline reports
/// itself degraded, the topic's next message waits for it, and nothing goes
/// to the DLQ; once the table exists both are stored, exactly once, without
/// any command. A dead letter left in the DLQ is stored by `imstream dlq
/// replay store`, and a second replay of the same DLQ changes nothing.
#[tokio::test]
async fn a_missing_month_table_is_waited_for_and_the_dlq_replay_stores_dead_letters_once() {
    imstream::telemetry::metrics_handle();
    let stack = Stack::prepared(None).await;
    let pool = stack.pool();
    let topology = fast_store_topology();
    let group = imstream::pipeline::runner::group_id(stack.config(), &topology);
    let pipeline = start_store(&stack, topology.clone());
    let dlq = DlqReader::new(&stack);
    let missing_before = counter("group_message_shard_missing_total");

    // 203001 is a legal month nobody created or registered yet.
    let topic = "grpMissing";
    let lost = message_sent(stack.tenant(), topic, 1, "203001", "lost-1");
    let fine = message_sent(stack.tenant(), topic, 2, &current_month(), "fine-2");
    produce(&stack, &[&lost, &fine]).await;

    let (group_ref, attempts) = (&group, topology.max_attempts as f64);
    let reason = wait_for(
        "the store degraded by the missing table, past max_attempts",
        Duration::from_secs(60),
        || async move {
            let moved = counter("group_message_shard_missing_total") - missing_before;
            match imstream::telemetry::Degraded::reason(group_ref) {
                Some(r) if moved >= attempts * 3.0 => Ok(r),
                other => Err(format!(
                    "degraded: {other:?}; shard_missing moved by {moved}"
                )),
            }
        },
    )
    .await;
    assert!(
        reason.contains("203001") && reason.contains("does not exist"),
        "{reason}"
    );
    // The later message of the same topic waits for the earlier one.
    assert_eq!(count_seq(&pool, &current_month(), topic, 2).await, 0);
    assert_eq!(
        common::store_dlq_depth(stack.config()).await,
        0,
        "an outage never reaches the DLQ"
    );

    // The table is created (the shard manager's job): both are stored.
    imstream::store::catalog::create_month(&pool, ShardMonth::parse("203001").unwrap())
        .await
        .unwrap();
    wait_for("both events stored", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let n = (
                count_seq(&pool, "203001", topic, 1).await,
                count_seq(&pool, &current_month(), topic, 2).await,
            );
            if n == (1, 1) {
                Ok(())
            } else {
                Err(format!("rows (203001 seq 1, current seq 2): {n:?}"))
            }
        }
    })
    .await;
    let mut expected_mirror = vec![(current_month(), 2, 2, 1), ("203001".to_string(), 1, 1, 1)];
    expected_mirror.sort();
    assert_eq!(mirror(&pool, topic).await, expected_mirror);
    wait_for(
        "no longer degraded",
        Duration::from_secs(30),
        || async move {
            match imstream::telemetry::Degraded::reason(group_ref) {
                None => Ok(()),
                Some(r) => Err(r),
            }
        },
    )
    .await;
    assert_eq!(common::store_dlq_depth(stack.config()).await, 0);

    // A dead letter waiting in the DLQ (refused by an earlier release, say);
    // `imstream dlq replay store` stores it.
    let dead = message_sent(stack.tenant(), topic, 3, "203001", "dead-3");
    let names = TopicNames::new(&stack.config().kafka);
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let payload = codec
        .encode(&names.name(TopicKind::GroupEvents), &dead)
        .await
        .expect("encode");
    EventProducer::new(&stack.config().kafka, codec)
        .unwrap()
        .send_bytes(
            &names.dlq(TopicKind::GroupEvents, "store"),
            format!("{}:{topic}", stack.tenant()).as_bytes(),
            &payload,
            &[("dlq.reason", b"test".as_slice())],
        )
        .await
        .expect("dead letter");
    dlq.wait_for(&[&dead.event_id], 1).await;
    let replay = process::command(&stack.config_file("dlq"), &["dlq", "replay", "store"]);
    let ran = tokio::time::timeout(Duration::from_secs(120), process::run_async(replay, None))
        .await
        .expect("dlq replay finishes once drained");
    let stdout = &ran.stdout;
    assert!(ran.ok, "dlq replay failed: {stdout}\n{}", ran.stderr);
    assert!(stdout.contains("replayed 1 DLQ record"), "{stdout}");
    assert_eq!(count_seq(&pool, "203001", topic, 3).await, 1);
    let expected_mirror = {
        let mut m = vec![(current_month(), 2, 2, 1), ("203001".to_string(), 1, 3, 2)];
        m.sort();
        m
    };
    assert_eq!(mirror(&pool, topic).await, expected_mirror);
    let dead_row: (String, String) = sqlx::query_as(
        "SELECT CAST(client_msg_id AS CHAR), CAST(JSON_UNQUOTE(JSON_EXTRACT(content, '$.txt')) AS CHAR) FROM im_group_messages_203001 WHERE topic = ? AND seqid = 3",
    )
    .bind(topic)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(dead_row, ("dead-3".to_string(), "dead-3".to_string()));

    // Replaying the same DLQ again (a fresh replay group reads it from the
    // start) is harmless: still one row, still counted once.
    let mut again = stack.config().clone();
    again.pipelines.group_prefix = format!("{}-again", again.pipelines.group_prefix);
    let drained =
        imstream::pipeline::replay_until_drained(&again, "store", stack.world.shutdown.child())
            .await
            .expect("second replay");
    assert_eq!(drained.records, 1);
    assert_eq!(count_seq(&pool, "203001", topic, 3).await, 1);
    assert_eq!(mirror(&pool, topic).await, expected_mirror);
    // Nothing failed during the replays: the DLQ still holds only the
    // dead letter put there by hand.
    assert_eq!(common::store_dlq_depth(stack.config()).await, 1);
    pipeline.abort();
}

/// (14), parsers: only `YYYYMM` months 01–12 (years 2000–2999) and only
/// `im_group_messages_YYYYMM` table names.
#[test]
fn illegal_months_and_table_names_are_refused_by_the_parsers() {
    for bad in [
        "202613",
        "202600",
        "2026-1",
        "2026-10",
        "20261",
        "2026100",
        "",
        "abcdef",
        "199912",
        "300001",
        "+20261",
        " 202610",
        "202610 ",
        "２０２６１０",
        "2026\u{0}1",
    ] {
        assert!(ShardMonth::parse(bad).is_err(), "month {bad:?} accepted");
    }
    for good in ["202609", "202610", "202612", "203001", "200001", "299912"] {
        assert_eq!(ShardMonth::parse(good).unwrap().to_string(), good);
    }
    for bad in [
        "im_group_messages_202613",
        "im_group_messages_2026-1",
        "im_group_messages_20261",
        "im_group_messages_2026101",
        "im_group_messages_202610; DROP TABLE im_group_message_shards",
        "im_group_messages_202610`",
        "IM_GROUP_MESSAGES_202610",
        "im_group_messages",
        "im_group_messages_",
        "im_group_message_shards",
        "other_202610",
        "x_im_group_messages_202610",
    ] {
        assert!(
            MonthTable::parse_name(bad).is_err(),
            "table {bad:?} accepted"
        );
    }
    assert_eq!(
        MonthTable::parse_name("im_group_messages_202610")
            .unwrap()
            .to_string(),
        "202610"
    );
}

/// (14), end to end: MessageSent events with illegal months go to the DLQ
/// at once (not retryable), create no table and no catalog row; replaying
/// them fails again and puts them back into the DLQ, still creating nothing.
#[tokio::test]
async fn events_with_illegal_months_go_to_the_dlq_and_never_create_a_table() {
    imstream::telemetry::metrics_handle();
    let mut stack = Stack::prepared(None).await;
    let pool = stack.pool();
    let tables_before = month_tables(&pool).await;
    let catalog_before = catalog(&pool).await;
    assert_eq!(tables_before.len(), 4, "{tables_before:?}");
    stack.start_pipeline("store").await;
    let dlq = DlqReader::new(&stack);
    let dead_before = counter("group_message_dead_letter_total");

    let topic = "grpIllegal";
    let bad_months = [
        "202613",
        "2026-1",
        "202600",
        "",
        "202610`; DROP TABLE im_group_message_shards; --",
        "../../etc",
    ];
    let bad: Vec<GroupEvent> = bad_months
        .iter()
        .enumerate()
        .map(|(i, m)| message_sent(stack.tenant(), topic, i as i64 + 1, m, &format!("bad-{i}")))
        .collect();
    let marker_seq = bad.len() as i64 + 1;
    let marker = message_sent(
        stack.tenant(),
        topic,
        marker_seq,
        &current_month(),
        "marker",
    );
    let mut all: Vec<&GroupEvent> = bad.iter().collect();
    all.push(&marker);
    produce(&stack, &all).await;

    let ids: Vec<&str> = bad.iter().map(|e| e.event_id.as_str()).collect();
    let dead = dlq.wait_for(&ids, 1).await;
    assert_eq!(dead.len(), bad.len(), "{dead:?}");
    for d in &dead {
        assert!(d.reason.contains("illegal month"), "{d:?}");
    }
    // The counter moves once the DLQ acked the record, which can be after a
    // reader already sees it.
    wait_for(
        "the dead-letter counter",
        Duration::from_secs(10),
        || async {
            let moved = counter("group_message_dead_letter_total") - dead_before;
            if moved >= bad.len() as f64 {
                Ok(())
            } else {
                Err(format!("{moved}"))
            }
        },
    )
    .await;
    wait_for("the legal marker stored", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            match count_seq(&pool, &current_month(), topic, marker_seq).await {
                1 => Ok(()),
                n => Err(format!("{n} rows")),
            }
        }
    })
    .await;

    let check_nothing_created = |when: &'static str| {
        let (pool, tables_before, catalog_before) =
            (pool.clone(), tables_before.clone(), catalog_before.clone());
        async move {
            let tables = month_tables(&pool).await;
            assert_eq!(tables, tables_before, "{when}: month tables changed");
            for t in &tables {
                assert!(MonthTable::parse_name(t).is_ok(), "{when}: table {t:?}");
            }
            assert_eq!(
                catalog(&pool).await,
                catalog_before,
                "{when}: catalog changed"
            );
            let shards: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_group_message_shards")
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(shards, 4, "{when}: the shard catalog is intact");
            assert_eq!(
                mirror(&pool, topic).await,
                vec![(current_month(), marker_seq, marker_seq, 1)],
                "{when}: only the legal message is routed"
            );
            let rows: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM im_group_messages_{} WHERE topic = ?",
                current_month()
            ))
            .bind(topic)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(rows, 1, "{when}");
        }
    };
    check_nothing_created("after the pipeline").await;

    // A replay cannot make them legal: they fail again and go back to the
    // same DLQ.
    let replay = stack.world.shutdown.child();
    let task = {
        let (config, replay) = (stack.config().clone(), replay.clone());
        tokio::spawn(async move { imstream::pipeline::replay_dlq(&config, "store", replay).await })
    };
    let dead = dlq.wait_for(&ids, 2).await;
    let pipelines: HashSet<&str> = dead.iter().map(|d| d.pipeline.as_str()).collect();
    assert_eq!(pipelines, HashSet::from(["store"]));
    assert!(
        dead.iter().all(|d| d.reason.contains("illegal month")),
        "{dead:?}"
    );
    replay.trigger();
    task.await.unwrap().expect("replay stops cleanly");
    stack.stop_pipeline("store").await;
    check_nothing_created("after the replay").await;
}

/// (13) One 10,000-member group, 20 members sending 500 messages each at
/// the same time over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ten_thousand_member_group_under_concurrent_senders_gets_unique_seqs_stored_once() {
    const SENDERS: i64 = 20;
    const PER_SENDER: i64 = 500;
    const TOTAL: i64 = SENDERS * PER_SENDER;
    let stack = Stack::running().await;
    let topic = "grpTenK";
    let members: Vec<i64> = (2..=10_000).collect();
    stack.create_group(topic, 1, &members).await;
    let pool = stack.pool();
    // The count follows the member rows in its own statement.
    wait_for("member_count 10,000", Duration::from_secs(30), || async {
        let count: i64 = sqlx::query_scalar("SELECT member_count FROM im_groups WHERE topic = ?")
            .bind(topic)
            .fetch_one(&pool)
            .await
            .unwrap();
        if count == 10_000 {
            Ok(())
        } else {
            Err(format!("member_count {count}"))
        }
    })
    .await;

    let addr = stack.gateway_addr(0);
    let client = reqwest::Client::new();
    let acks: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        // Senders spread over the member list.
        let uid = 1 + s * 499;
        let token = stack.token(uid, "web");
        let (client, acks) = (client.clone(), acks.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..PER_SENDER {
                let cmid = format!("u{uid}-{i}");
                let seq = wait_for(&format!("{cmid} acked"), Duration::from_secs(60), || {
                    let (client, token, cmid) = (&client, &token, &cmid);
                    async move {
                        let (status, body) =
                            send_http(client, addr, token, topic, cmid, cmid).await;
                        match status {
                            202 => Ok(body["seq"].as_i64().expect("seq")),
                            503 if body["params"]["retry"] == serde_json::json!(true) => {
                                Err(format!("503 {body}"))
                            }
                            other => panic!("{cmid} refused: {other} {body}"),
                        }
                    }
                })
                .await;
                acks.lock().unwrap().push((cmid, seq));
            }
        }));
    }
    for t in tasks {
        t.await.expect("sender");
    }
    let acks = acks.lock().unwrap().clone();
    assert_eq!(acks.len() as i64, TOTAL);
    let seqs: BTreeSet<i64> = acks.iter().map(|a| a.1).collect();
    assert_eq!(seqs.len() as i64, TOTAL, "a seq was acked twice");
    assert_eq!(
        seqs.iter().copied().collect::<Vec<_>>(),
        (1..=TOTAL).collect::<Vec<_>>(),
        "seqs are exactly 1..={TOTAL}"
    );

    let month = current_month();
    let table = format!("im_group_messages_{month}");
    wait_for(
        "every acked message stored",
        Duration::from_secs(180),
        || {
            let (pool, table) = (pool.clone(), table.clone());
            async move {
                let n: i64 =
                    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table} WHERE topic = ?"))
                        .bind(topic)
                        .fetch_one(&pool)
                        .await
                        .map_err(|e| e.to_string())?;
                if n == TOTAL {
                    Ok(())
                } else {
                    Err(format!("{n} of {TOTAL} rows"))
                }
            }
        },
    )
    .await;
    let (rows, distinct, lo, hi): (i64, i64, i64, i64) = sqlx::query_as(&format!(
        "SELECT COUNT(*), COUNT(DISTINCT seqid), MIN(seqid), MAX(seqid) FROM {table} WHERE topic = ?"
    ))
    .bind(topic)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((rows, distinct, lo, hi), (TOTAL, TOTAL, 1, TOTAL));
    assert_eq!(mirror(&pool, topic).await, vec![(month, 1, TOTAL, TOTAL)]);
    // Each acked message is the row under its acked seq.
    let stored: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT CAST(client_msg_id AS CHAR), seqid FROM {table} WHERE topic = ?"
    ))
    .bind(topic)
    .fetch_all(&pool)
    .await
    .unwrap();
    let stored: HashMap<String, i64> = stored.into_iter().collect();
    assert_eq!(stored.len() as i64, TOTAL);
    for (cmid, seq) in &acks {
        assert_eq!(stored.get(cmid), Some(seq), "{cmid}");
    }
}
