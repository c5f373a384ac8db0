//! The consumer-group runner shared by every pipeline, its replays and DLQ
//! replays (at-least-once): batches records, hands them to the pipeline's
//! handler, and commits an offset only once every record up to it is
//! handled. A failed record is either an outage or poison
//! ([`super::failure`]):
//!
//! - an **outage** is retried without a limit, with capped exponential
//!   backoff (`backoff_initial_ms` .. `backoff_max_ms`); meanwhile the
//!   pipeline is *degraded* — a warning (on the first attempt and every
//!   30 s), the gauge `imstream_pipeline_degraded`, and `/readyz` answering
//!   503 `degraded: <pipeline>: <reason>` — and it recovers by itself;
//!   nothing goes to the DLQ;
//! - **poison** in a batch of several records makes the runner *isolate*:
//!   the failed records are handled again one by one, in offset order, so
//!   their batch-mates are applied; a record refused alone `max_attempts`
//!   times goes, alone, to the DLQ (an outage while handling one by one is
//!   still retried without a limit).
//!
//! Handlers keep per-key order: a record after a failed one of the same
//! Kafka key is not applied but reported as waiting
//! (`super::records::KeyGate`), so retries never reorder a key's records.
//! The handling itself is `super::worker::Worker`'s.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicNames;
use crate::shutdown::Shutdown;

use super::topology::Topology;

use super::records::{Handler, Record};
use super::worker::Worker;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("topology {0} has no known source")]
    Source(String),
}

/// The consumer group id of a pipeline.
pub fn group_id(config: &Config, topology: &Topology) -> String {
    format!("{}.{}", config.pipelines.group_prefix, topology.name)
}

/// Runs the pipeline until `shutdown`, reading `topic` (or the topology's
/// source topic) as consumer group `group` (or the pipeline's group).
pub async fn run<H: Handler>(
    config: &Config,
    topology: &Topology,
    handler: H,
    producer: EventProducer,
    shutdown: Shutdown,
) -> Result<(), PipelineError> {
    let kind = topology
        .source_kind()
        .ok_or_else(|| PipelineError::Source(topology.name.clone()))?;
    let names = TopicNames::new(&config.kafka);
    let source = names.name(kind);
    let dlq = names.dlq(kind, &topology.name);
    run_on(
        config,
        topology,
        &source,
        &group_id(config, topology),
        &dlq,
        handler,
        producer,
        shutdown,
        None,
    )
    .await
}

/// Like [`run`] with explicit topic, group and DLQ (DLQ replays use it),
/// and the projection's checkpoints in the tenant databases, if it keeps
/// them (a partition a database is behind on is handled again from there).
#[allow(clippy::too_many_arguments)]
pub async fn run_on<H: Handler>(
    config: &Config,
    topology: &Topology,
    source: &str,
    group: &str,
    dlq: &str,
    handler: H,
    producer: EventProducer,
    shutdown: Shutdown,
    mut checkpoints: Option<super::checkpoints::Checkpoints>,
) -> Result<(), PipelineError> {
    let consumer: StreamConsumer = consumer_config(
        config,
        group,
        topology.fetch_min_bytes,
        topology.fetch_wait_max_ms,
    )
    .create()?;
    consumer.subscribe(&[source])?;
    crate::events::decoded::share(source);
    tracing::info!(pipeline = %topology.name, %source, %group, "pipeline started");
    let gauges = super::lag::spawn_gauges(config, &topology.name, source, group, dlq, &shutdown);
    let worker = Worker::new(
        topology,
        handler,
        producer,
        dlq.to_string(),
        shutdown.clone(),
    )
    .health_id(group);
    let linger = Duration::from_millis(topology.batch_linger_ms);
    // Offsets handled but not committed yet: committed at most every
    // COMMIT_INTERVAL, and at once when the source goes quiet. A commit per
    // batch was one broker request per record per pipeline at low rates; a
    // crash now re-handles at most that interval's records, which every
    // handler already takes (idempotent by key).
    let mut pending: HashMap<(String, i32), i64> = HashMap::new();
    let mut last_commit = tokio::time::Instant::now();
    // Checkpoints are checked soon after the start (the partitions are
    // assigned by then), then whenever no record comes for a while.
    let mut checkpoint_tick = tokio::time::Instant::now() + Duration::from_secs(1);
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep_until(checkpoint_tick), if checkpoints.is_some() => {
                checkpoint_tick = tokio::time::Instant::now() + super::checkpoints::ALL_TENANTS_EVERY;
                if let Some(cp) = checkpoints.as_mut() {
                    for (partition, next) in assigned_positions(&consumer, source) {
                        cp.assigned(partition, next);
                    }
                    let rewinds = cp.flush().await;
                    rewind(&consumer, source, &mut pending, &rewinds);
                }
                continue;
            }
            m = consumer.recv() => m,
            _ = tokio::time::sleep_until(last_commit + COMMIT_INTERVAL), if !pending.is_empty() => {
                commit_offsets(&consumer, &mut pending, CommitMode::Async);
                last_commit = tokio::time::Instant::now();
                continue;
            }
        };
        let Some(batch) =
            gather(&consumer, first, linger, topology.batch_max, &topology.name).await
        else {
            continue;
        };
        if !worker.process(&batch).await {
            // Shutdown during retries: the batch is not committed and will
            // be redelivered.
            break;
        }
        handled(&mut pending, &batch);
        if let Some(cp) = checkpoints.as_mut() {
            let rewinds = cp.after_batch(&batch).await;
            rewind(&consumer, source, &mut pending, &rewinds);
        }
        if last_commit.elapsed() >= COMMIT_INTERVAL {
            commit_offsets(&consumer, &mut pending, CommitMode::Async);
            last_commit = tokio::time::Instant::now();
        }
    }
    // What was handled is committed before the consumer leaves, and every
    // tenant's checkpoint written.
    if let Some(cp) = checkpoints.as_mut() {
        let rewinds = cp.flush().await;
        rewind(&consumer, source, &mut pending, &rewinds);
    }
    if !pending.is_empty() {
        commit_offsets(&consumer, &mut pending, CommitMode::Sync);
    }
    if let Ok(assigned) = consumer.assignment() {
        if assigned.count() > 0 {
            let _ = consumer.commit_consumer_state(CommitMode::Sync);
        }
    }
    drop(gauges);
    // Closing a consumer can block for good inside librdkafka when a
    // rebalance is pending while the brokers are away (seen: the drop
    // waiting on `rd_kafka_assign` with no timeout after a broker was
    // killed). Leaving the group must never hold up the process's runtime
    // or its exit, so the consumer is closed on a thread of its own.
    let _ = std::thread::Builder::new()
        .name("consumer-close".into())
        .spawn(move || drop(consumer));
    tracing::info!(pipeline = %topology.name, "pipeline stopped");
    Ok(())
}

/// The consumer settings of every pipeline and unit: manual offsets, read
/// from the start when the group has none, and the fetch sizes given.
pub(crate) fn consumer_config(
    config: &Config,
    group: &str,
    fetch_min_bytes: u32,
    fetch_wait_max_ms: u32,
) -> rdkafka::ClientConfig {
    let mut client = crate::kafka::client_config(&config.kafka);
    client
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        // An outage is waited out inside `Worker::process` without polling,
        // for as long as it lasts (a database failover, a Redis restart).
        // Liveness comes from the session heartbeats, which librdkafka sends
        // from its own thread; the default 5 min poll interval would make a
        // healthy but waiting consumer leave its group and hand the same
        // stuck records to another member, again and again. So the poll
        // interval is librdkafka's maximum (24 h). The cost: a rebalance
        // started during an outage waits for this member until the outage
        // ends, which is no worse than the outage itself.
        .set("max.poll.interval.ms", "86400000")
        // Long poll: with fetch.min.bytes 1 the broker answers as soon as
        // a record arrives, so a longer wait costs no latency and only
        // saves idle fetch round trips (at 100 ms, twelve idle pipelines
        // kept the broker at 6 % of a core). Background pipelines ask for
        // more bytes per fetch (see `Topology::fetch_min_bytes`).
        .set("fetch.min.bytes", fetch_min_bytes.max(1).to_string())
        .set("fetch.wait.max.ms", fetch_wait_max_ms.to_string());
    client
}

/// A batch from `consumer`: the record `first` brought, then what else
/// arrives within `linger`, up to `max` records. `None` (after a short
/// pause) when `first` was a consume error; `who` names the consumer in
/// the warning.
pub(crate) async fn gather(
    consumer: &StreamConsumer,
    first: Result<rdkafka::message::BorrowedMessage<'_>, rdkafka::error::KafkaError>,
    linger: Duration,
    max: usize,
    who: &str,
) -> Option<Vec<Record>> {
    let mut batch = match first {
        Ok(msg) => vec![detach(&msg)],
        Err(e) => {
            tracing::warn!(consumer = who, error = %e, "consume error");
            tokio::time::sleep(Duration::from_millis(200)).await;
            return None;
        }
    };
    let deadline = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        match tokio::time::timeout_at(deadline, consumer.recv()).await {
            Ok(Ok(msg)) => batch.push(detach(&msg)),
            Ok(Err(e)) => {
                tracing::warn!(consumer = who, error = %e, "consume error");
                break;
            }
            Err(_) => break,
        }
    }
    Some(batch)
}

pub(crate) fn detach<M: Message>(msg: &M) -> Record {
    let traceparent = msg.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == "traceparent")
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    });
    Record {
        topic: msg.topic().to_string(),
        partition: msg.partition(),
        offset: msg.offset(),
        key: msg.key().map(<[u8]>::to_vec),
        payload: msg.payload().map(<[u8]>::to_vec),
        traceparent,
        timestamp_ms: msg.timestamp().to_millis(),
    }
}

/// The partitions of `source` assigned to this consumer, each with its
/// group's committed offset (where records resume); none on a failure.
fn assigned_positions<C: Consumer>(consumer: &C, source: &str) -> Vec<(i32, i64)> {
    let Ok(assignment) = consumer.assignment() else {
        return Vec::new();
    };
    let Ok(committed) = consumer.committed_offsets(assignment, Duration::from_secs(5)) else {
        return Vec::new();
    };
    committed
        .elements()
        .iter()
        .filter(|e| e.topic() == source)
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Moves each rewound partition back to its checkpoint; nothing past it is
/// committed (the records from there are handled again).
fn rewind<C: Consumer>(
    consumer: &C,
    source: &str,
    pending: &mut HashMap<(String, i32), i64>,
    rewinds: &[super::checkpoints::Rewind],
) {
    for r in rewinds {
        pending.remove(&(source.to_string(), r.partition));
        if let Err(e) = consumer.seek(
            source,
            r.partition,
            Offset::Offset(r.offset),
            Duration::from_secs(10),
        ) {
            tracing::error!(partition = r.partition, offset = r.offset, error = %e, "rewind failed; the checkpoint stays behind and is found again");
        } else {
            tracing::warn!(
                partition = r.partition,
                offset = r.offset,
                "partition rewound to a tenant database's checkpoint"
            );
        }
    }
}

/// How long handled offsets may wait for their commit while records flow.
const COMMIT_INTERVAL: Duration = Duration::from_millis(200);

/// Commits `pending` (next offset per partition) and clears it.
fn commit_offsets<C: Consumer>(
    consumer: &C,
    pending: &mut HashMap<(String, i32), i64>,
    mode: CommitMode,
) {
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in pending.drain() {
        let _ = tpl.add_partition_offset(&topic, partition, Offset::Offset(offset));
    }
    if let Err(e) = consumer.commit(&tpl, mode) {
        tracing::warn!(error = %e, "offset commit failed; records will be handled again");
    }
}

/// Commits the next offset of every partition in the batch.
pub(crate) fn commit<C: Consumer>(consumer: &C, batch: &[Record], mode: CommitMode) {
    let mut next = HashMap::new();
    handled(&mut next, batch);
    commit_offsets(consumer, &mut next, mode);
}

/// Records `batch` as handled: the next offset of each of its partitions.
fn handled(pending: &mut HashMap<(String, i32), i64>, batch: &[Record]) {
    for r in batch {
        let next = pending.entry((r.topic.clone(), r.partition)).or_insert(0);
        *next = (*next).max(r.offset + 1);
    }
}
