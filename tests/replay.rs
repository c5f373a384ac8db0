//! `imstream replay` against the real services (issue 7):
//!
//! - Redis hot messages and routes wiped → `replay hot` / `replay store`
//!   restore them identically; replaying again changes nothing; the
//!   pipeline's group ends at the log end, so the live pipeline continues;
//! - a dropped tenant database → migrate + `replay store --tenant` → rows,
//!   mirror and dedup identical (checksums), other tenants' events not
//!   re-applied;
//! - a reset is refused while the pipeline runs;
//! - `--from <time>` starts at the first record at or after that time
//!   (for a group that had handled everything before it).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use imstream::config::TenantConfig;
use imstream::digest::{Summary, Verdict};
use imstream::events::{new_event_id, now_ms, EventCodec, GroupEvent, GroupEventBody, MessageSent};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::replay::{projection, replay, ReplayArgs};
use imstream::store::month::ShardMonth;
use sqlx::MySqlPool;

use common::{unique_id, wait_for, Stack};

fn args(pipeline: &str) -> ReplayArgs {
    ReplayArgs {
        pipeline: pipeline.into(),
        from: "earliest".into(),
        tenant: None,
        into: None,
        wait_inactive_secs: 15,
    }
}

/// The shard clock of these stacks: early in the current month, so last
/// month is still in its sealing period and accepts the events the tests
/// produce for it (a month past it seals once nothing holds it).
fn early_this_month() -> String {
    chrono::Utc::now().format("%Y-%m-03T00:00:00Z").to_string()
}

/// `n` MessageSent events of `tenant`/`topic`, seqs `first..first+n`, created
/// now in `month`.
fn messages(tenant: &str, topic: &str, first: i64, n: i64, month: ShardMonth) -> Vec<GroupEvent> {
    let now = now_ms();
    let base = (rand::random::<u32>() as i64) << 24;
    (first..first + n)
        .map(|seq| GroupEvent {
            event_id: new_event_id(),
            tenant_id: tenant.to_string(),
            topic: topic.to_string(),
            occurred_at: now,
            actor_uid: 7,
            actor_device: String::new(),
            source_sid: String::new(),
            source_node: String::new(),
            traceparent: String::new(),
            body: GroupEventBody::MessageSent(MessageSent {
                message_id: base + seq,
                group_id: 42,
                seq,
                shard_month: month.to_string(),
                client_msg_id: Some(format!("{topic}-c{seq}")),
                from_user: 7 + seq % 3,
                msg_type: "text".into(),
                head: None,
                content: Some(format!("{{\"txt\":\"{topic} says {seq}\"}}")),
                mentioned_user_ids: Vec::new(),
                mention_all: false,
                reply_seq: None,
                root_seq: None,
                file_count: 0,
                content_size: 10,
                has_risk: false,
                audit_status: "pass".into(),
                created_at: now - (first + n - seq),
                expires_at: None,
            }),
        })
        .collect()
}

async fn produce(stack: &Stack, events: Vec<GroupEvent>) {
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer = EventProducer::new(&stack.config().kafka, codec).unwrap();
    futures::stream::iter(events)
        .map(|e| {
            let producer = producer.clone();
            async move {
                let key = format!("{}:{}", e.tenant_id, e.topic);
                producer
                    .send(TopicKind::GroupEvents, &key, &e, None)
                    .await
                    .expect("produced")
            }
        })
        .buffer_unordered(128)
        .collect::<Vec<_>>()
        .await;
}

fn total(s: &BTreeMap<String, Summary>) -> i64 {
    s.values().map(|s| s.count).sum()
}

async fn wait_month_rows(pool: &MySqlPool, want: i64) {
    wait_for(
        &format!("{want} stored rows"),
        Duration::from_secs(90),
        || async move {
            let s = projection::month_tables(pool)
                .await
                .map_err(|e| e.to_string())?;
            if total(&s) == want {
                Ok(())
            } else {
                Err(format!("{} rows", total(&s)))
            }
        },
    )
    .await;
}

async fn wait_hot(stack: &Stack, tenant: &str, want: i64) {
    let redis = stack.redis().await;
    wait_for(
        &format!("{want} hot messages"),
        Duration::from_secs(90),
        || {
            let mut redis = redis.clone();
            async move {
                let s = projection::hot_messages(&mut redis, tenant)
                    .await
                    .map_err(|e| e.to_string())?;
                if total(&s) == want {
                    Ok(())
                } else {
                    Err(format!("{} hot", total(&s)))
                }
            }
        },
    )
    .await;
}

/// Deletes every Redis key of `tenant`'s topics ending in one of `suffixes`.
async fn wipe(stack: &Stack, tenant: &str, suffixes: &[&str]) -> usize {
    let mut redis = stack.redis().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("im:{{{tenant}:*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    let doomed: Vec<&String> = keys
        .iter()
        .filter(|k| {
            suffixes
                .iter()
                .any(|s| k.ends_with(s) || k.contains(":hot_msg:"))
        })
        .collect();
    if !doomed.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&doomed)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    doomed.len()
}

/// Every mirror row of a tenant database, as text.
async fn mirror(pool: &MySqlPool) -> Vec<(String, String, i64, i64, i64)> {
    sqlx::query_as(
        "SELECT CAST(topic AS CHAR), shard_month, min_seq, max_seq, message_count FROM im_group_message_topic_shards ORDER BY topic, shard_month",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wiped_hot_messages_and_routes_are_replayed_identically() {
    let mut stack = Stack::prepared(Some(&early_this_month())).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("hot").await;
    let tenant = stack.tenant().to_string();
    let month = ShardMonth::of(chrono::Utc::now());
    let mut events = Vec::new();
    for t in 0..3 {
        events.extend(messages(&tenant, &format!("grp{t}"), 1, 120, month));
    }
    produce(&stack, events).await;
    let pool = stack.pool();
    wait_month_rows(&pool, 360).await;
    wait_hot(&stack, &tenant, 360).await;
    let mut redis = stack.redis().await;
    let rows_before = projection::month_tables(&pool).await.unwrap();
    let hot_before = projection::hot_messages(&mut redis, &tenant).await.unwrap();
    let routes_before = projection::routes(&mut redis, &tenant).await.unwrap();
    assert_eq!(routes_before.len(), 3, "{routes_before:?}");
    assert_eq!(total(&routes_before), 360);

    stack.stop_pipeline("store").await;
    stack.stop_pipeline("hot").await;
    assert!(
        wipe(
            &stack,
            &tenant,
            &[":hot_msg_seqs", ":groupmsg:route", ":groupmsg:route_meta"]
        )
        .await
            > 360
    );
    assert!(projection::hot_messages(&mut redis, &tenant)
        .await
        .unwrap()
        .is_empty());
    assert!(projection::routes(&mut redis, &tenant)
        .await
        .unwrap()
        .is_empty());

    let hot = replay(stack.config(), &args("hot"), stack.world.shutdown.child())
        .await
        .expect("replay hot");
    assert_eq!(hot.counts.records, 360);
    assert_eq!(hot.counts.applied, 360);
    let checks = &hot.verifications[0];
    assert_eq!(checks.part, "hot_messages");
    assert!(
        checks.topics.iter().all(|c| c.verdict == Verdict::Restored),
        "{checks:?}"
    );
    assert_eq!(
        projection::hot_messages(&mut redis, &tenant).await.unwrap(),
        hot_before
    );

    let store = replay(stack.config(), &args("store"), stack.world.shutdown.child())
        .await
        .expect("replay store");
    assert_eq!(store.counts.records, 360);
    assert_eq!(
        projection::routes(&mut redis, &tenant).await.unwrap(),
        routes_before
    );
    assert_eq!(projection::month_tables(&pool).await.unwrap(), rows_before);

    // Again: nothing changes, and the verification says so.
    for pipeline in ["store", "hot"] {
        let again = replay(
            stack.config(),
            &args(pipeline),
            stack.world.shutdown.child(),
        )
        .await
        .expect("replay again");
        for v in &again.verifications {
            assert!(
                v.topics.iter().all(|c| c.verdict == Verdict::Identical),
                "{pipeline}: {v:?}"
            );
            assert_eq!(v.topics.len(), 3);
        }
    }
    assert_eq!(projection::month_tables(&pool).await.unwrap(), rows_before);
    assert_eq!(
        projection::routes(&mut redis, &tenant).await.unwrap(),
        routes_before
    );
    assert_eq!(
        projection::hot_messages(&mut redis, &tenant).await.unwrap(),
        hot_before
    );

    // The pipeline's group was moved to the log end the replay saw, so the
    // live pipeline continues there.
    let config = stack.config().clone();
    let (marks, committed) = tokio::task::spawn_blocking(move || {
        let source = TopicNames::new(&config.kafka).name(TopicKind::GroupEvents);
        let group = format!("{}.store", config.pipelines.group_prefix);
        (
            imstream::kafka::lag::watermarks(&config.kafka, &group, &source).unwrap(),
            imstream::kafka::lag::committed(&config.kafka, &group, &source).unwrap(),
        )
    })
    .await
    .unwrap();
    for (p, (_, high)) in &marks {
        assert_eq!(
            committed.get(p).copied().unwrap_or(0),
            *high,
            "partition {p}"
        );
    }
    stack.start_pipeline("store").await;
    produce(&stack, messages(&tenant, "grp0", 121, 5, month)).await;
    wait_month_rows(&pool, 365).await;
    let routes = projection::routes(&mut redis, &tenant).await.unwrap();
    assert_eq!((routes["grp0"].count, routes["grp0"].max_seq), (125, 125));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_pipeline_refuses_a_reset() {
    let mut stack = Stack::prepared(Some(&early_this_month())).await;
    stack.start_pipeline("hot").await;
    let tenant = stack.tenant().to_string();
    produce(
        &stack,
        messages(&tenant, "g", 1, 3, ShardMonth::of(chrono::Utc::now())),
    )
    .await;
    wait_hot(&stack, &tenant, 3).await;
    let mut a = args("hot");
    a.wait_inactive_secs = 1;
    let err = replay(stack.config(), &a, stack.world.shutdown.child())
        .await
        .expect_err("a reset of an active group is refused")
        .to_string();
    assert!(err.contains("is active") && err.contains(".hot"), "{err}");
    let err = replay(
        stack.config(),
        &args("fanout"),
        stack.world.shutdown.child(),
    )
    .await
    .expect_err("fanout is not replayable")
    .to_string();
    assert!(err.contains("not replayable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_from_a_time_starts_there() {
    let mut stack = Stack::prepared(Some(&early_this_month())).await;
    stack.start_pipeline("hot").await;
    let tenant = stack.tenant().to_string();
    let month = ShardMonth::of(chrono::Utc::now());
    produce(&stack, messages(&tenant, "g", 1, 20, month)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let from = now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    produce(&stack, messages(&tenant, "g", 21, 10, month)).await;
    wait_hot(&stack, &tenant, 30).await;
    stack.stop_pipeline("hot").await;
    wipe(&stack, &tenant, &[":hot_msg_seqs"]).await;
    let mut a = args("hot");
    a.from = from.to_string();
    let report = replay(stack.config(), &a, stack.world.shutdown.child())
        .await
        .expect("replay");
    assert_eq!(report.counts.records, 10);
    let mut redis = stack.redis().await;
    let hot = projection::hot_messages(&mut redis, &tenant).await.unwrap();
    assert_eq!(
        (hot["g"].count, hot["g"].min_seq, hot["g"].max_seq),
        (10, 21, 30)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_tenant_database_is_rebuilt_by_migrate_and_replay() {
    let mut stack = Stack::prepared(Some(&early_this_month())).await;
    // A second tenant shares the log.
    let other = TenantConfig {
        id: format!("o{}", unique_id()),
        database: format!("imo_{}", unique_id()),
        signing_keys: Vec::new(),
        ..Default::default()
    };
    stack.world.config.tenants.push(other.clone());
    imstream::tenant::migrate(stack.config(), Some(&other.id))
        .await
        .unwrap();
    stack.shard_pass(Some(&early_this_month())).await;
    stack.start_pipeline("store").await;
    let tenant = stack.tenant().to_string();
    let month = ShardMonth::of(chrono::Utc::now());
    let mut events = messages(&tenant, "a1", 1, 150, month);
    events.extend(messages(&tenant, "a2", 1, 80, month.prev()));
    events.extend(messages(&other.id, "b1", 1, 60, month));
    produce(&stack, events).await;
    let pool = stack.pool();
    let other_pool =
        imstream::tenant::database_pool(&stack.config().mysql, &other.database).unwrap();
    wait_month_rows(&pool, 230).await;
    wait_month_rows(&other_pool, 60).await;
    let rows_before = projection::month_tables(&pool).await.unwrap();
    let mirror_before = mirror(&pool).await;
    let dedup_before: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_group_message_dedup")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dedup_before, 230);
    stack.stop_pipeline("store").await;

    // The other tenant loses rows in its database; a replay of this tenant
    // must not bring them back (its events are not re-applied).
    let table = format!("im_group_messages_{month}");
    sqlx::query(&format!("DELETE FROM `{table}` WHERE seqid <= 10"))
        .execute(&other_pool)
        .await
        .unwrap();
    let database = &stack.config().tenants[0].database;
    sqlx::query(&format!("DROP DATABASE `{database}`"))
        .execute(&other_pool)
        .await
        .unwrap();
    imstream::tenant::migrate(stack.config(), Some(&tenant))
        .await
        .unwrap();
    stack.shard_pass(Some(&early_this_month())).await;

    let mut a = args("store");
    a.tenant = Some(tenant.clone());
    let report = replay(stack.config(), &a, stack.world.shutdown.child())
        .await
        .expect("replay store");
    assert_eq!(
        (
            report.counts.records,
            report.counts.applied,
            report.counts.skipped
        ),
        (290, 230, 60)
    );
    let pool = stack.pool();
    assert_eq!(projection::month_tables(&pool).await.unwrap(), rows_before);
    assert_eq!(mirror(&pool).await, mirror_before);
    let dedup: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_group_message_dedup")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dedup, dedup_before);
    let other_rows = projection::month_tables(&other_pool).await.unwrap();
    assert_eq!((other_rows["b1"].count, other_rows["b1"].min_seq), (50, 11));

    // Twice: identical.
    let again = replay(stack.config(), &a, stack.world.shutdown.child())
        .await
        .expect("again");
    let tables = again
        .verifications
        .iter()
        .find(|v| v.part == "month_tables")
        .unwrap();
    assert_eq!(tables.topics.len(), 2);
    assert!(
        tables
            .topics
            .iter()
            .all(|c| c.verdict == Verdict::Identical),
        "{tables:?}"
    );
    assert_eq!(projection::month_tables(&pool).await.unwrap(), rows_before);
    assert_eq!(mirror(&pool).await, mirror_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_into_a_fresh_database_matches_the_live_one() {
    let mut stack = Stack::prepared(Some(&early_this_month())).await;
    stack.start_pipeline("store").await;
    let tenant = stack.tenant().to_string();
    let month = ShardMonth::of(chrono::Utc::now());
    let mut events = messages(&tenant, "x1", 1, 70, month);
    events.extend(messages(&tenant, "x2", 1, 30, month.prev()));
    produce(&stack, events).await;
    let pool = stack.pool();
    wait_month_rows(&pool, 100).await;
    let live = projection::month_tables(&pool).await.unwrap();
    // The live pipeline keeps running: a fresh target needs no reset.
    let fresh = format!("imx_{}", unique_id());
    let mut a = args("store");
    a.into = Some(format!("database:{fresh}"));
    let report = replay(stack.config(), &a, stack.world.shutdown.child())
        .await
        .expect("replay into");
    assert_ne!(
        report.group,
        format!("{}.store", stack.config().pipelines.group_prefix)
    );
    let tables = report
        .verifications
        .iter()
        .find(|v| v.part == "month_tables")
        .unwrap();
    assert_eq!(tables.topics.len(), 2);
    assert!(
        tables
            .topics
            .iter()
            .all(|c| c.verdict == Verdict::Identical),
        "{tables:?}"
    );
    let rebuilt = imstream::tenant::database_pool(&stack.config().mysql, &fresh).unwrap();
    assert_eq!(projection::month_tables(&rebuilt).await.unwrap(), live);
    assert_eq!(mirror(&rebuilt).await, mirror(&pool).await);
    let mut a = args("store");
    a.into = Some(format!("database:{}", stack.config().tenants[0].database));
    let err = replay(stack.config(), &a, stack.world.shutdown.child())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("live database"), "{err}");
}
