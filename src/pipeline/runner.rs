//! The consumer-group runner shared by every pipeline (at-least-once):
//! batches records, hands them to the pipeline's handler, retries failed
//! records with backoff, sends records that still fail to the pipeline's
//! DLQ, and commits an offset only once every record up to it is handled.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicNames;
use crate::metrics as m;
use crate::shutdown::Shutdown;

use super::topology::Topology;

/// One consumed record, detached from the consumer.
#[derive(Debug, Clone)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub traceparent: Option<String>,
    /// Broker or producer timestamp, epoch ms.
    pub timestamp_ms: Option<i64>,
}

/// Why one record of a batch was not handled.
#[derive(Debug, Clone)]
pub struct RecordFailure {
    /// Index into the slice the handler was given.
    pub index: usize,
    pub retryable: bool,
    pub reason: String,
}

impl RecordFailure {
    pub fn new(index: usize, retryable: bool, reason: impl Into<String>) -> Self {
        Self {
            index,
            retryable,
            reason: reason.into(),
        }
    }
}

/// Decodes every record as `E`. Undecodable records are reported in
/// `failures`; kinds this build does not know (written by a newer producer)
/// are skipped with a warning.
pub async fn decode_all<E: crate::events::Event>(
    codec: &crate::events::EventCodec,
    records: &[&Record],
    failures: &mut Vec<RecordFailure>,
) -> Vec<(usize, E)> {
    let mut out = Vec::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        match codec.decode::<E>(r.payload.as_deref()).await {
            Ok(e) => out.push((i, e)),
            Err(crate::events::CodecError::UnknownKind { name, .. }) => {
                tracing::warn!(kind = %name, offset = r.offset, "skipping an event kind this build does not know");
            }
            Err(e) => failures.push(RecordFailure::new(i, e.is_retryable(), e.to_string())),
        }
    }
    out
}

/// `Ok` when nothing failed.
pub fn outcome(failures: Vec<RecordFailure>) -> Result<(), Vec<RecordFailure>> {
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures)
    }
}

/// A pipeline's side effects. Must be idempotent: records can be handed
/// over again after a crash, a rebalance or a replay.
pub trait Handler: Send + Sync + 'static {
    /// Handles `records`; returns the ones that failed (the rest are done).
    fn handle(
        &self,
        records: &[&Record],
    ) -> impl Future<Output = Result<(), Vec<RecordFailure>>> + Send;
}

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
    )
    .await
}

/// Like [`run`] with explicit topic, group and DLQ (DLQ replays use it).
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
) -> Result<(), PipelineError> {
    let consumer: StreamConsumer = crate::kafka::client_config(&config.kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        // Long poll: the broker answers as soon as a record arrives, so a
        // longer wait only saves idle fetch round trips.
        .set("fetch.wait.max.ms", "100")
        .create()?;
    consumer.subscribe(&[source])?;
    tracing::info!(pipeline = %topology.name, %source, %group, "pipeline started");
    let lag_gauge = super::lag::spawn(
        config.kafka.clone(),
        topology.name.clone(),
        source.to_string(),
        group.to_string(),
        shutdown.clone(),
    );
    let worker = Worker {
        topology,
        handler,
        producer,
        dlq: dlq.to_string(),
        shutdown: shutdown.clone(),
    };
    let linger = Duration::from_millis(topology.batch_linger_ms);
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = consumer.recv() => m,
        };
        let mut batch = match first {
            Ok(msg) => vec![detach(&msg)],
            Err(e) => {
                tracing::warn!(pipeline = %topology.name, error = %e, "consume error");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let deadline = tokio::time::Instant::now() + linger;
        while batch.len() < topology.batch_max {
            match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(Ok(msg)) => batch.push(detach(&msg)),
                Ok(Err(e)) => {
                    tracing::warn!(pipeline = %topology.name, error = %e, "consume error");
                    break;
                }
                Err(_) => break,
            }
        }
        if !worker.process(&batch).await {
            // Shutdown during retries: the batch is not committed and will
            // be redelivered.
            break;
        }
        commit(&consumer, &batch, CommitMode::Async);
    }
    if let Ok(assigned) = consumer.assignment() {
        if assigned.count() > 0 {
            let _ = consumer.commit_consumer_state(CommitMode::Sync);
        }
    }
    lag_gauge.abort();
    tracing::info!(pipeline = %topology.name, "pipeline stopped");
    Ok(())
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

/// Commits the next offset of every partition in the batch.
pub(crate) fn commit<C: Consumer>(consumer: &C, batch: &[Record], mode: CommitMode) {
    let mut next: HashMap<(&str, i32), i64> = HashMap::new();
    for r in batch {
        let e = next.entry((r.topic.as_str(), r.partition)).or_insert(0);
        *e = (*e).max(r.offset + 1);
    }
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(offset));
    }
    if let Err(e) = consumer.commit(&tpl, mode) {
        tracing::warn!(error = %e, "offset commit failed; records will be handled again");
    }
}

/// Handles batches for one pipeline: retries, then the DLQ. Shared by the
/// consumer-group loop here and by replays (`crate::replay`).
pub(crate) struct Worker<'a, H> {
    topology: &'a Topology,
    handler: H,
    producer: EventProducer,
    dlq: String,
    shutdown: Shutdown,
}

impl<'a, H: Handler> Worker<'a, H> {
    pub(crate) fn new(
        topology: &'a Topology,
        handler: H,
        producer: EventProducer,
        dlq: String,
        shutdown: Shutdown,
    ) -> Self {
        Self {
            topology,
            handler,
            producer,
            dlq,
            shutdown,
        }
    }

    /// Handles a batch to completion (done or in the DLQ). `false` when
    /// shutdown interrupted it.
    pub(crate) async fn process(&self, batch: &[Record]) -> bool {
        let name = self.topology.name.as_str();
        let mut pending: Vec<usize> = (0..batch.len()).collect();
        let mut to_dlq: Vec<(usize, String)> = Vec::new();
        let mut backoff = Duration::from_millis(self.topology.backoff_initial_ms);
        for attempt in 1..=self.topology.max_attempts {
            let records: Vec<&Record> = pending.iter().map(|i| &batch[*i]).collect();
            let failures = match self.handler.handle(&records).await {
                Ok(()) => Vec::new(),
                Err(f) => f,
            };
            let mut retry = Vec::new();
            for f in failures {
                let Some(&index) = pending.get(f.index) else {
                    continue;
                };
                if f.retryable && attempt < self.topology.max_attempts {
                    retry.push(index);
                } else {
                    tracing::warn!(pipeline = name, offset = batch[index].offset, reason = %f.reason, attempt, "record failed for good");
                    to_dlq.push((index, f.reason));
                }
            }
            metrics::counter!(m::PIPELINE_EVENTS_TOTAL, "pipeline" => name.to_string(), "outcome" => "handled")
                .increment((pending.len() - retry.len()) as u64);
            if retry.is_empty() {
                break;
            }
            retry.sort_unstable();
            retry.dedup();
            pending = retry;
            metrics::counter!(m::PIPELINE_RETRIES_TOTAL, "pipeline" => name.to_string())
                .increment(1);
            tracing::info!(
                pipeline = name,
                records = pending.len(),
                attempt,
                ?backoff,
                "retrying failed records"
            );
            tokio::select! {
                _ = self.shutdown.cancelled() => return false,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_millis(self.topology.backoff_max_ms));
        }
        for (index, reason) in to_dlq {
            if !self.send_to_dlq(&batch[index], &reason).await {
                return false;
            }
        }
        true
    }

    /// Copies a record to the DLQ, retrying until the broker takes it:
    /// nothing is dropped silently. `false` on shutdown.
    async fn send_to_dlq(&self, record: &Record, reason: &str) -> bool {
        let name = self.topology.name.as_str();
        let partition = record.partition.to_string();
        let offset = record.offset.to_string();
        let mut headers: Vec<(&str, &[u8])> = vec![
            ("dlq.reason", reason.as_bytes()),
            ("dlq.pipeline", name.as_bytes()),
            ("dlq.source.topic", record.topic.as_bytes()),
            ("dlq.source.partition", partition.as_bytes()),
            ("dlq.source.offset", offset.as_bytes()),
        ];
        if let Some(tp) = &record.traceparent {
            headers.push(("traceparent", tp.as_bytes()));
        }
        loop {
            match self
                .producer
                .send_bytes(
                    &self.dlq,
                    record.key.as_deref().unwrap_or_default(),
                    record.payload.as_deref().unwrap_or_default(),
                    &headers,
                )
                .await
            {
                Ok(_) => {
                    metrics::counter!(m::PIPELINE_DLQ_TOTAL, "pipeline" => name.to_string())
                        .increment(1);
                    if name == "store" {
                        metrics::counter!(m::DEAD_LETTER_TOTAL).increment(1);
                    }
                    return true;
                }
                Err(e) => {
                    tracing::error!(pipeline = name, error = %e, "DLQ produce failed; retrying");
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return false,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }
}
