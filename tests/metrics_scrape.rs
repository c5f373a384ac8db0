//! Observability (ARCHITECTURE.md §9, seed 000 §11): after a small run —
//! sends (one retried with the same client_msg_id), a realtime delivery, a
//! history read after the Redis route was lost, an undecodable event and a
//! message for a month without a table — the telemetry port's `/metrics` exports
//! every seed 000 §11 name plus send/delivery latency, consumer lag and DLQ
//! counts, and each of them moved.

mod common;
mod realtime_support;

use std::time::Duration;

use imstream::events::{EventCodec, GroupEvent, GroupEventBody, MessageSent};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::keys::TopicKeys;
use imstream::metrics as m;

use common::{send_http, wait_for, Stack};
use realtime_support::Client;

const OWNER: i64 = 5001;
const ALICE: i64 = 5002;

/// Sum of every sample of `series` (a full sample name such as
/// `x_count`) in a Prometheus text page; `None` when absent.
fn sample_sum(page: &str, series: &str) -> Option<f64> {
    let mut found = None;
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(series) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// A sample line of `series` whose labels contain `label`.
fn has_labelled(page: &str, series: &str, label: &str) -> bool {
    page.lines()
        .any(|l| l.starts_with(&format!("{series}{{")) && l.contains(label))
}

#[test]
fn sample_sums_add_every_series_and_skip_prefixes() {
    let page = "# TYPE a counter\na{x=\"1\"} 2\na{x=\"2\"} 3\nab 7\na_count 4\n";
    assert_eq!(sample_sum(page, "a"), Some(5.0));
    assert_eq!(sample_sum(page, "a_count"), Some(4.0));
    assert_eq!(sample_sum(page, "zz"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_run_moves_every_exported_metric() {
    // The recorder must exist before any pipeline records.
    imstream::telemetry::metrics_handle();
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "fanout"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("node-m").await;
    // Metrics are served on the telemetry port, as `imstream gateway` does.
    let ops = imstream::telemetry::serve_ops(
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        stack.world.shutdown.child(),
    )
    .await
    .expect("ops endpoint");
    let topic = "grpMetrics";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    let alice = Client::open_sub(gw, &stack.token(ALICE, "phone"), topic, "alice").await;

    // Sends, one of them retried with the same client_msg_id (a dedup hit).
    let client = reqwest::Client::new();
    let token = stack.token(OWNER, "web");
    for i in 1..=5 {
        let (status, body) = send_http(&client, gw, &token, topic, &format!("m-{i}"), "hi").await;
        assert_eq!(status, 202, "{body}");
    }
    let (status, body) = send_http(&client, gw, &token, topic, "m-1", "hi").await;
    assert_eq!(
        (status, body["duplicate"].as_bool()),
        (202, Some(true)),
        "{body}"
    );
    alice.expect_data(topic, 5).await;

    // Stored; then the Redis route is lost and a read rebuilds it.
    let pool = stack.pool();
    let pool_ref = &pool;
    wait_for("5 rows stored", Duration::from_secs(30), || async move {
        let n: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(message_count), 0) AS SIGNED) FROM im_group_message_topic_shards WHERE topic = ?",
        )
        .bind(topic)
        .fetch_one(pool_ref)
        .await
        .map_err(|e| e.to_string())?;
        if n == 5 { Ok(()) } else { Err(format!("{n} in the mirror")) }
    })
    .await;
    let keys = TopicKeys::new(stack.tenant(), topic);
    let mut redis = stack.redis().await;
    let _: () = redis::cmd("DEL")
        .arg(keys.route())
        .arg(keys.route_meta())
        .query_async(&mut redis)
        .await
        .unwrap();
    let resp = client
        .get(format!("http://{gw}/v1/groups/{topic}/messages?limit=3"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    // Undecodable bytes (poison: the store gives up on them, to the DLQ),
    // then a message for a month that has no table (an outage: retried
    // without a limit, each attempt counted as a missing shard).
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer = EventProducer::new(&stack.config().kafka, codec).unwrap();
    let events_topic = TopicNames::new(&stack.config().kafka).name(TopicKind::GroupEvents);
    let key = format!("{}:{topic}", stack.tenant());
    producer
        .send_bytes(&events_topic, key.as_bytes(), b"not avro", &[])
        .await
        .expect("produce garbage");
    let far = GroupEvent::new(
        stack.tenant(),
        topic,
        OWNER,
        GroupEventBody::MessageSent(MessageSent {
            message_id: 77,
            group_id: 1,
            seq: 1_000,
            shard_month: "209912".into(),
            client_msg_id: None,
            from_user: OWNER,
            msg_type: "text".into(),
            head: None,
            content: Some("{\"txt\":\"far\"}".into()),
            mentioned_user_ids: vec![],
            mention_all: false,
            reply_seq: None,
            root_seq: None,
            file_count: 0,
            content_size: 3,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: imstream::events::now_ms(),
            expires_at: None,
        }),
    );
    producer
        .send(TopicKind::GroupEvents, &key, &far, None)
        .await
        .expect("produce");

    // Scrape the telemetry port's /metrics until everything moved.
    let moved: &[(&str, String)] = &[
        ("counter", m::PERSIST_TOTAL.to_string()),
        ("histogram", format!("{}_count", m::PERSIST_LATENCY)),
        ("counter", m::SHARD_MISSING_TOTAL.to_string()),
        ("histogram", format!("{}_count", m::QUERY_TABLES)),
        ("histogram", format!("{}_count", m::QUERY_LATENCY)),
        ("counter", m::DEDUP_HIT_TOTAL.to_string()),
        ("counter", m::ROUTE_MISS_TOTAL.to_string()),
        ("counter", m::ROUTE_REBUILD_TOTAL.to_string()),
        ("counter", m::DEAD_LETTER_TOTAL.to_string()),
        ("counter", m::SEND_TOTAL.to_string()),
        ("histogram", format!("{}_count", m::SEND_ACK_LATENCY)),
        ("histogram", format!("{}_count", m::DELIVERY_LATENCY)),
        ("counter", m::PIPELINE_EVENTS_TOTAL.to_string()),
        ("counter", m::PIPELINE_DLQ_TOTAL.to_string()),
        ("counter", m::EVENTS_PRODUCED_TOTAL.to_string()),
    ];
    let url = format!("http://{ops}/metrics");
    let (client_ref, moved_ref, url_ref) = (&client, moved, &url);
    let page = wait_for(
        "every metric to move",
        Duration::from_secs(60),
        || async move {
            let page = client_ref
                .get(url_ref)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            let still: Vec<String> = moved_ref
                .iter()
                .filter(|(_, s)| sample_sum(&page, s).unwrap_or(0.0) <= 0.0)
                .map(|(kind, s)| format!("{kind} {s}"))
                .collect();
            let lag = has_labelled(&page, m::PIPELINE_LAG, "pipeline=\"store\"");
            if still.is_empty() && lag {
                Ok(page)
            } else {
                Err(format!(
                    "not moved: {still:?}; store lag gauge present: {lag}"
                ))
            }
        },
    )
    .await;

    // Names of seed 000 §11 verbatim, the repair backlog gauge included.
    for name in m::SEED_000 {
        let series = [name.to_string(), format!("{name}_count")];
        assert!(
            series.iter().any(|s| sample_sum(&page, s).is_some()),
            "{name} missing from /metrics"
        );
    }
    assert!(has_labelled(
        &page,
        m::PIPELINE_DLQ_TOTAL,
        "pipeline=\"store\""
    ));
    assert!(has_labelled(&page, m::PERSIST_TOTAL, "status=\"ok\""));
    assert!(has_labelled(&page, m::PERSIST_TOTAL, "status=\"failed\""));
    // Every series of the lag gauge is a partition of a pipeline's source.
    let partitions = stack.config().kafka.topics.group_events.partitions;
    for p in 0..partitions {
        assert!(
            has_labelled(&page, m::PIPELINE_LAG, &format!("partition=\"{p}\"")),
            "no lag series for partition {p}"
        );
    }
}
