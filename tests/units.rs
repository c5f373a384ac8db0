//! Deployment units (issue 31, `topologies/units.toml`): several pipelines
//! of one source consumed by one consumer, each keeping its own progress,
//! against the real services.
//!
//! - a member whose database is down (a TCP proxy the test owns, as in
//!   tests/pipeline_outage.rs) holds the others back by at most the unit's
//!   window; stopped there, each member's own group says where it stood,
//!   and after a restart with the database back every record is applied
//!   exactly once and every member's group reaches the end of the log;
//! - `imstream unit group` as a child process is killed with SIGKILL while
//!   clients send through a gateway, and started again: every acked
//!   message is stored exactly once at its seq, is in the hot set, and
//!   every member's own group (and the unit's) catches up with the log.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use imstream::config::Config;
use imstream::events::{EventCodec, GroupEvent};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::keys::TopicKeys;
use imstream::store::month::ShardMonth;

use common::process::Proc;
use common::{send_http, server_of, stored_counts, through, unique_id, wait_for, DbProxy, Stack};

const DEADLINE: Duration = Duration::from_secs(90);

fn current_month() -> String {
    ShardMonth::of(chrono::Utc::now()).to_string()
}

fn message_sent(tenant: &str, topic: &str, seq: i64) -> GroupEvent {
    common::message_sent(tenant, topic, seq, format!("{{\"txt\":\"m{seq}\"}}"))
}

async fn hot_count(stack: &Stack, topic: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(TopicKeys::new(stack.tenant(), topic).hot_seqs())
        .query_async(&mut stack.redis().await)
        .await
        .unwrap()
}

/// partition → committed offset of `group` on the group-events topic.
fn committed(config: &Config, group: &str) -> BTreeMap<i32, i64> {
    let topic = TopicNames::new(&config.kafka).name(TopicKind::GroupEvents);
    imstream::kafka::lag::committed(&config.kafka, group, &topic).expect("committed offsets")
}

/// partition → high watermark of the group-events topic.
fn log_end(config: &Config) -> BTreeMap<i32, i64> {
    let topic = TopicNames::new(&config.kafka).name(TopicKind::GroupEvents);
    imstream::kafka::lag::watermarks(&config.kafka, "probe", &topic)
        .expect("watermarks")
        .into_iter()
        .filter(|(_, (_, high))| *high > 0)
        .map(|(p, (_, high))| (p, high))
        .collect()
}

/// Waits until `group` committed the end of every non-empty partition.
async fn caught_up(config: &Config, group: &str) {
    let end = log_end(config);
    wait_for(
        &format!("{group} committed the end of the log"),
        DEADLINE,
        || {
            let (config, group, end) = (config.clone(), group.to_string(), end.clone());
            async move {
                let at = tokio::task::spawn_blocking(move || committed(&config, &group))
                    .await
                    .unwrap();
                let behind: Vec<_> = end
                    .iter()
                    .filter(|(p, high)| at.get(p).copied().unwrap_or(0) < **high)
                    .collect();
                if behind.is_empty() {
                    Ok(())
                } else {
                    Err(format!("behind on {behind:?}, committed {at:?}"))
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stuck_member_holds_the_others_back_by_its_window_and_each_resumes_from_its_own_progress()
{
    let mut stack = Stack::prepared(None).await;
    let proxy = DbProxy::start(server_of(&stack.config().mysql.url)).await;
    // One record per batch and a window of 4 batches: the hot member can
    // be at most a handful of records ahead of a stuck store (its batch in
    // hand, its queue, the batch the consumer waits to hand over).
    const WINDOW: i64 = 4;
    stack.use_units(&format!(
        "[[unit]]\nname = \"pair\"\nsource = \"group_events\"\npipelines = [\"store\", \"hot\"]\n\
             batch_max = 1\nbatch_linger_ms = 0\nwindow_batches = {WINDOW}\n"
    ));
    let unit_config = through(stack.config(), proxy.addr);
    let units = imstream::pipeline::unit::units(&unit_config).expect("units");
    let unit = units[0].clone();
    let prefix = stack.config().pipelines.group_prefix.clone();
    let (store_group, hot_group) = (format!("{prefix}.store"), format!("{prefix}.hot"));

    let tenant = stack.tenant().to_string();
    let topic = format!("grpUnit{}", unique_id());
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer = EventProducer::new(&stack.config().kafka, codec).unwrap();
    let key = format!("{tenant}:{topic}");
    const N: i64 = 30;

    proxy.down();
    let stop = stack.world.shutdown.child();
    let running = {
        let (config, unit, stop) = (unit_config.clone(), unit.clone(), stop.clone());
        tokio::spawn(async move { imstream::pipeline::unit::run(&config, &unit, stop).await })
    };
    // The first record gets store stuck (waiting out the outage, its batch
    // in hand; a member gathers by its own linger, so the rest come after).
    producer
        .send(
            TopicKind::GroupEvents,
            &key,
            &message_sent(&tenant, &topic, 1),
            None,
        )
        .await
        .expect("produce");
    wait_for("the first record hot", DEADLINE, || async {
        match hot_count(&stack, &topic).await {
            1 => Ok(()),
            n => Err(format!("{n} hot")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for seq in 2..=N {
        producer
            .send(
                TopicKind::GroupEvents,
                &key,
                &message_sent(&tenant, &topic, seq),
                None,
            )
            .await
            .expect("produce");
    }
    // The hot member applies what its window lets through, then stops
    // moving: the consumer waits for the stuck store.
    let ahead = wait_for("the hot member moved, then stopped", DEADLINE, || {
        let stack = &stack;
        let topic = topic.clone();
        async move {
            let before = hot_count(stack, &topic).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let after = hot_count(stack, &topic).await;
            if after > 0 && after == before {
                Ok(after)
            } else {
                Err(format!("hot set {before} → {after}"))
            }
        }
    })
    .await;
    assert!(
        ahead <= 1 + WINDOW + 2,
        "a stuck member holds the others back by its window: hot has {ahead} of {N}"
    );
    assert_eq!(
        stored_counts(&stack.pool(), &topic).await,
        (0, 0),
        "store is stuck"
    );

    // Stopped there: each member's own group says where it stood.
    stop.trigger();
    running.await.unwrap().expect("unit ran");
    let (store_at, hot_at) = {
        let c = stack.config().clone();
        let (s, h) = (store_group.clone(), hot_group.clone());
        tokio::task::spawn_blocking(move || (committed(&c, &s), committed(&c, &h)))
            .await
            .unwrap()
    };
    let sum = |m: &BTreeMap<i32, i64>| m.values().sum::<i64>();
    assert!(
        sum(&hot_at) >= sum(&store_at) + ahead,
        "hot committed its own progress ({hot_at:?}), ahead of store's ({store_at:?})"
    );

    // Back up: every record applied exactly once, both groups at the end.
    proxy.up();
    let stop = stack.world.shutdown.child();
    let running = {
        let (config, unit, stop) = (unit_config.clone(), unit.clone(), stop.clone());
        tokio::spawn(async move { imstream::pipeline::unit::run(&config, &unit, stop).await })
    };
    let pool = stack.pool();
    wait_for("every message stored", DEADLINE, || {
        let (pool, topic) = (pool.clone(), topic.clone());
        async move {
            match stored_counts(&pool, &topic).await {
                (n, d) if n == N && d == N => Ok(()),
                other => Err(format!("{other:?} of {N}")),
            }
        }
    })
    .await;
    assert_eq!(hot_count(&stack, &topic).await, N);
    caught_up(stack.config(), &store_group).await;
    caught_up(stack.config(), &hot_group).await;
    stop.trigger();
    running.await.unwrap().expect("unit ran");
    assert_eq!(stored_counts(&pool, &topic).await, (N, N), "exactly once");
    let _ = &mut stack;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unit_killed_while_clients_send_resumes_every_member_and_stores_each_acked_message_once()
{
    let mut stack = Stack::prepared(None).await;
    let config_file = stack.config_file("unit");
    let name = format!("unit-{}", stack.world.id);
    let mut unit = Proc::spawn_logging(&name, &config_file, &["unit", "group"], "warn");
    let gateway = stack.start_gateway("node-u").await;
    let topic = format!("grpUnitKill{}", unique_id());
    stack.create_group(&topic, 1, &[1, 2]).await;
    let token = stack.token(1, "d1");
    let web = reqwest::Client::new();

    let sending = {
        let (web, token, topic) = (web.clone(), token.clone(), topic.clone());
        tokio::spawn(async move {
            let mut acked = BTreeMap::new();
            for i in 0..120 {
                let id = format!("unit-kill-{i}");
                let (status, body) =
                    send_http(&web, gateway, &token, &topic, &id, &format!("m{i}")).await;
                if status == 202 || status == 200 {
                    let seq = body["seq"].as_i64().expect("acked with a seq");
                    assert!(acked.insert(seq, id).is_none(), "seq {seq} acked twice");
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    unit.kill().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    unit.respawn();
    let acked = sending.await.unwrap();
    assert!(acked.len() >= 100, "most sends acked: {}", acked.len());

    let pool = stack.pool();
    let n = acked.len() as i64;
    wait_for("every acked message stored once", DEADLINE, || {
        let (pool, topic) = (pool.clone(), topic.clone());
        async move {
            match stored_counts(&pool, &topic).await {
                (rows, d) if rows == n && d == n => Ok(()),
                other => Err(format!("{other:?} of {n}")),
            }
        }
    })
    .await;
    let rows: Vec<(i64, String)> = sqlx::query_as(&format!(
        "SELECT seqid, CAST(client_msg_id AS CHAR) FROM im_group_messages_{} WHERE topic = ? ORDER BY seqid",
        current_month()
    ))
    .bind(&topic)
    .fetch_all(&pool)
    .await
    .unwrap();
    let stored: BTreeMap<i64, String> = rows.into_iter().collect();
    assert_eq!(stored, acked, "each acked message at its seq");
    // The hot copy is the unit's other member, which resumes on its own
    // progress: it catches up, it need not be there when the store is.
    wait_for("every acked message hot", DEADLINE, || {
        let (stack, topic) = (&stack, topic.clone());
        async move {
            match hot_count(stack, &topic).await {
                hot if hot == n => Ok(()),
                hot => Err(format!("{hot} of {n} hot")),
            }
        }
    })
    .await;

    let prefix = stack.config().pipelines.group_prefix.clone();
    let units = imstream::pipeline::unit::units(stack.config()).unwrap();
    let group_unit = units.iter().find(|u| u.name == "group").unwrap();
    for p in &group_unit.pipelines {
        caught_up(stack.config(), &format!("{prefix}.{p}")).await;
    }
    caught_up(
        stack.config(),
        &imstream::pipeline::unit::unit_group_id(stack.config(), group_unit),
    )
    .await;
    unit.kill().await;
    let _ = &mut stack;
}
