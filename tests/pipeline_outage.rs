//! Outage versus poison in the store pipeline, against the real services
//! (issue 12):
//!
//! - the tenant database becomes unreachable while messages keep arriving:
//!   the pipeline waits it out (`/readyz` says `degraded: store: …`),
//!   nothing goes to the DLQ, and once the database is back every message
//!   is stored exactly once without anyone doing anything;
//! - records that can never be applied (refused by the database, or not
//!   decodable) go to the DLQ alone; their batch-mates — including later
//!   records of the same key, which waited for them — are stored.
//!
//! The outage is real but local to the test: the pipeline reaches MariaDB
//! through a TCP proxy the test owns, which cuts every connection and
//! refuses new ones while "down" (as a server restart or failover does).
//! The shared MariaDB itself is never touched.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use sqlx::MySqlPool;

use imstream::config::Config;
use imstream::events::{EventCodec, GroupEvent, GroupEventBody, HistoryCleared, SeqRange};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::pipeline::Topology;
use imstream::store::month::ShardMonth;
use imstream::telemetry::Readiness;

use common::{message_sent, server_of, through, unique_id, wait_for, DbProxy, Stack};

const DEADLINE: Duration = Duration::from_secs(60);

/// The store topology with short backoffs and few attempts: under the old
/// semantics an outage longer than a second would have sent records to
/// the DLQ.
fn fast_store_topology(batch_linger_ms: u64) -> Topology {
    Topology::parse(
        &format!(
            "name = \"store\"\nsource = \"group_events\"\nbatch_max = 200\n\
             batch_linger_ms = {batch_linger_ms}\nmax_attempts = 3\n\
             backoff_initial_ms = 20\nbackoff_max_ms = 200\n"
        ),
        "test-store.toml",
    )
    .expect("topology")
}

fn text(seq: i64) -> String {
    format!("{{\"txt\":\"m{seq}\"}}")
}

fn current_month() -> String {
    ShardMonth::of(chrono::Utc::now()).to_string()
}

struct Produce {
    producer: EventProducer,
    topic: String,
}

impl Produce {
    fn new(config: &Config) -> Produce {
        let codec = EventCodec::new(&config.registry.url).unwrap();
        Produce {
            producer: EventProducer::new(&config.kafka, codec).unwrap(),
            topic: TopicNames::new(&config.kafka).name(TopicKind::GroupEvents),
        }
    }

    async fn event(&self, e: &GroupEvent) {
        self.producer
            .send(
                TopicKind::GroupEvents,
                &format!("{}:{}", e.tenant_id, e.topic),
                e,
                None,
            )
            .await
            .expect("produce");
    }

    async fn bytes(&self, key: &str, payload: &[u8]) {
        self.producer
            .send_bytes(&self.topic, key.as_bytes(), payload, &[])
            .await
            .expect("produce bytes");
    }
}

/// seq → rows stored for `topic` this month.
async fn stored(pool: &MySqlPool, topic: &str) -> BTreeMap<i64, i64> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(&format!(
        "SELECT seqid, COUNT(*) FROM im_group_messages_{} WHERE topic = ? GROUP BY seqid",
        current_month()
    ))
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// Waits until exactly seqs `1..=n` of `topic` are stored, once each.
async fn wait_stored_once(pool: &MySqlPool, topic: &str, n: i64) {
    let expected: BTreeMap<i64, i64> = (1..=n).map(|s| (s, 1)).collect();
    wait_for(
        &format!("seqs 1..={n} of {topic} stored once each"),
        DEADLINE,
        || {
            let (pool, expected) = (pool.clone(), expected.clone());
            async move {
                let got = stored(&pool, topic).await;
                if got == expected {
                    Ok(())
                } else {
                    Err(format!("stored (seq → rows): {got:?}"))
                }
            }
        },
    )
    .await;
}

/// One record read back from the store DLQ: (reason header, payload).
type Dead = (String, Vec<u8>);

/// Reads the store DLQ from the start until `n` records were read.
async fn read_dlq(config: &Config, n: usize) -> Vec<Dead> {
    let dlq = TopicNames::new(&config.kafka).dlq(TopicKind::GroupEvents, "store");
    let consumer: StreamConsumer = imstream::kafka::client_config(&config.kafka)
        .set("group.id", format!("dlq-reader-{}", unique_id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[&dlq]).unwrap();
    let seen: Mutex<Vec<Dead>> = Mutex::new(Vec::new());
    let (consumer, seen_ref) = (&consumer, &seen);
    wait_for(&format!("{n} records in {dlq}"), DEADLINE, || async move {
        if let Ok(Ok(msg)) = tokio::time::timeout(Duration::from_millis(500), consumer.recv()).await
        {
            let reason = msg
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "dlq.reason"))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            let payload = msg.payload().unwrap_or_default().to_vec();
            seen_ref.lock().unwrap().push((reason, payload));
        }
        let got = seen_ref.lock().unwrap().len();
        if got >= n {
            Ok(())
        } else {
            Err(format!("{got} read"))
        }
    })
    .await;
    seen.into_inner().unwrap()
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

async fn readyz(client: &reqwest::Client, ops: SocketAddr) -> Result<(u16, String), String> {
    let resp = client
        .get(format!("http://{ops}/readyz"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    Ok((status, resp.text().await.map_err(|e| e.to_string())?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_database_is_waited_out_and_every_message_is_stored_once() {
    imstream::telemetry::metrics_handle();
    let stack = Stack::prepared(None).await;
    let pool = stack.pool();
    let proxy = DbProxy::start(server_of(&stack.config().mysql.url)).await;
    let config = through(stack.config(), proxy.addr);

    // The store pipeline, with its ops endpoint, reaching MariaDB through
    // the proxy.
    let shutdown = stack.world.shutdown.child();
    let readiness = Readiness::default();
    let ops = imstream::telemetry::serve_ops(
        "127.0.0.1:0".parse().unwrap(),
        readiness.clone(),
        shutdown.clone(),
    )
    .await
    .expect("ops endpoint");
    readiness.set_ready(true);
    let pipeline = {
        let (config, shutdown) = (config.clone(), shutdown.clone());
        tokio::spawn(async move {
            imstream::pipeline::run_topology(&config, &fast_store_topology(5), shutdown)
                .await
                .expect("store pipeline");
        })
    };
    let client = reqwest::Client::new();
    let produce = Produce::new(stack.config());
    let topic = format!("grpOutage{}", unique_id());

    // Healthy: the first ten are stored.
    for seq in 1..=10 {
        produce
            .event(&message_sent(stack.tenant(), &topic, seq, text(seq)))
            .await;
    }
    wait_stored_once(&pool, &topic, 10).await;
    assert_eq!(readyz(&client, ops).await.unwrap(), (200, "ready".into()));

    // The database goes away while ten more arrive.
    let retries_before = counter("imstream_pipeline_outage_retries_total");
    proxy.down();
    for seq in 11..=20 {
        produce
            .event(&message_sent(stack.tenant(), &topic, seq, text(seq)))
            .await;
    }
    // Degraded, with the reason, for far longer than max_attempts (3)
    // attempts would have lasted.
    let (client_ref, ops_copy) = (&client, ops);
    let said = wait_for(
        "/readyz to say the store is degraded",
        DEADLINE,
        || async move {
            let (status, body) = readyz(client_ref, ops_copy).await?;
            let retries = counter("imstream_pipeline_outage_retries_total") - retries_before;
            if status == 503 && body.contains("degraded: store: ") && retries >= 15.0 {
                Ok(body)
            } else {
                Err(format!("{status} {body:?} after {retries} outage retries"))
            }
        },
    )
    .await;
    assert!(
        said.contains("mysql") || said.contains("pool") || said.contains("connection"),
        "the reason names the database: {said:?}"
    );
    // A public port's `/readyz` (the gateway's; `imstream dev` runs the
    // pipelines in its process) says which pipeline, never the database's
    // error text (issue 39).
    let public = {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (router, _) =
            imstream::telemetry::health_routes("public", readiness.clone()).into_parts();
        tokio::spawn(async move { axum::serve(listener, router).await });
        addr
    };
    let (status, body) = readyz(&client, public).await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("degraded: store"), "{body:?}");
    assert!(
        !body.contains(':') || body.lines().all(|l| l.matches(':').count() == 1),
        "a public /readyz carries no reason: {body:?}"
    );
    assert_eq!(
        common::store_dlq_depth(stack.config()).await,
        0,
        "nothing in the DLQ during the outage"
    );
    assert_eq!(
        stored(&pool, &topic).await.len(),
        10,
        "nothing stored while down"
    );

    // Back: everything is stored once, by itself, and the pipeline is ready.
    proxy.up();
    wait_stored_once(&pool, &topic, 20).await;
    wait_for("/readyz ready again", DEADLINE, || async move {
        match readyz(client_ref, ops_copy).await? {
            (200, body) if body == "ready" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        common::store_dlq_depth(stack.config()).await,
        0,
        "nothing in the DLQ after the outage"
    );
    let mirror: (i64, i64, i64) = sqlx::query_as(
        "SELECT min_seq, max_seq, message_count FROM im_group_message_topic_shards WHERE topic = ?",
    )
    .bind(&topic)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        mirror,
        (1, 20, 20),
        "the route mirror counts each message once"
    );

    shutdown.trigger();
    pipeline.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_that_can_never_be_applied_go_alone_to_the_dlq_and_their_batch_mates_are_stored() {
    imstream::telemetry::metrics_handle();
    let stack = Stack::prepared(None).await;
    let pool = stack.pool();
    // A long linger so the records below are handled as one batch.
    let shutdown = stack.world.shutdown.child();
    let pipeline = {
        let (config, shutdown) = (stack.config().clone(), shutdown.clone());
        tokio::spawn(async move {
            imstream::pipeline::run_topology(&config, &fast_store_topology(1500), shutdown)
                .await
                .expect("store pipeline");
        })
    };
    let produce = Produce::new(stack.config());
    let tenant = stack.tenant();
    let topic = format!("grpPoison{}", unique_id());
    let key = format!("{tenant}:{topic}");

    // Five messages, a user-view delete the dellog refuses (its topic is
    // longer than the column: strict mode says "Data too long" — INSERT
    // IGNORE used to truncate it silently), a record that does not decode,
    // keyed like the messages (so the next five wait for it), five more
    // messages and a delete the dellog takes.
    for seq in 1..=5 {
        produce
            .event(&message_sent(tenant, &topic, seq, text(seq)))
            .await;
    }
    let long_topic = format!("grp{}", "x".repeat(70));
    let refused = GroupEvent::new(
        tenant,
        &long_topic,
        7,
        GroupEventBody::HistoryCleared(HistoryCleared {
            uid: 7,
            ranges: vec![SeqRange { low: 1, hi: 3 }],
            del_id: 1,
        }),
    );
    produce.event(&refused).await;
    produce.bytes(&key, b"not avro at all").await;
    for seq in 6..=10 {
        produce
            .event(&message_sent(tenant, &topic, seq, text(seq)))
            .await;
    }
    let fine_clear = GroupEvent::new(
        tenant,
        &topic,
        7,
        GroupEventBody::HistoryCleared(HistoryCleared {
            uid: 7,
            ranges: vec![SeqRange { low: 1, hi: 2 }],
            del_id: 2,
        }),
    );
    produce.event(&fine_clear).await;
    // Content nested deeper than both MariaDB (32) and MySQL 8 (100) store:
    // the gateway refuses it at the door, but an event in the log must still
    // never be dropped as a warning.
    let deep = format!("{}1{}", "[".repeat(120), "]".repeat(120));
    let deep_event = message_sent(tenant, &topic, 11, deep);
    produce.event(&deep_event).await;

    // Every good record is applied, the five after the undecodable one
    // included.
    wait_stored_once(&pool, &topic, 10).await;
    let pool_ref = &pool;
    let (topic_ref, fine_id) = (&topic, fine_clear.event_id.clone());
    wait_for("the good delete in the dellog", DEADLINE, || {
        let fine_id = fine_id.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM im_dellog WHERE topic = ? AND event_id = ?",
            )
            .bind(topic_ref)
            .bind(&fine_id)
            .fetch_one(pool_ref)
            .await
            .map_err(|e| e.to_string())?;
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} rows"))
            }
        }
    })
    .await;

    // Exactly the three that can never be applied are in the DLQ, each once.
    let dead = read_dlq(stack.config(), 3).await;
    assert_eq!(
        common::store_dlq_depth(stack.config()).await,
        3,
        "only the three refused: {dead:?}"
    );
    let mut deep_seen = 0;
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let mut refused_seen = 0;
    let mut garbage_seen = 0;
    for (reason, payload) in &dead {
        if payload.as_slice() == b"not avro at all" {
            garbage_seen += 1;
            continue;
        }
        let event: GroupEvent = codec
            .decode(Some(payload.as_slice()))
            .await
            .expect("DLQ record decodes");
        if event.event_id == deep_event.event_id {
            deep_seen += 1;
            continue;
        }
        assert_eq!(event.event_id, refused.event_id, "{reason}");
        assert!(
            reason.contains("1406") || reason.to_lowercase().contains("too long"),
            "the reason says what the database refused: {reason}"
        );
        refused_seen += 1;
    }
    assert_eq!(
        (refused_seen, garbage_seen, deep_seen),
        (1, 1, 1),
        "{dead:?}"
    );
    assert_eq!(
        stored(&pool, &topic).await.get(&11),
        None,
        "the deep message is not stored"
    );
    let truncated: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_dellog WHERE event_id = ?")
        .bind(&refused.event_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(truncated, 0, "the refused delete was not stored truncated");

    shutdown.trigger();
    pipeline.await.unwrap();
}
