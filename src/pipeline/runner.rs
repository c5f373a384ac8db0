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
//! Kafka key is not applied but reported as waiting ([`KeyGate`]), so
//! retries never reorder a key's records.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicNames;
use crate::metrics as m;
use crate::shutdown::Shutdown;
use crate::telemetry::Degraded;

use super::failure::{codec_failure, FailureKind};
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

/// Why one record of a batch was not handled, and whether it can ever be
/// (see [`super::failure`]).
#[derive(Debug, Clone)]
pub struct RecordFailure {
    /// Index into the slice the handler was given.
    pub index: usize,
    pub kind: FailureKind,
    pub reason: String,
}

impl RecordFailure {
    pub fn new(index: usize, kind: FailureKind, reason: impl Into<String>) -> Self {
        Self {
            index,
            kind,
            reason: reason.into(),
        }
    }

    /// A service is unavailable: retried without a limit, never the DLQ.
    pub fn outage(index: usize, reason: impl Into<String>) -> Self {
        Self::new(index, FailureKind::Outage, reason)
    }

    /// The record can never be applied: the DLQ, alone, after
    /// `max_attempts` attempts alone.
    pub fn poison(index: usize, reason: impl Into<String>) -> Self {
        Self::new(index, FailureKind::Poison, reason)
    }

    /// Not attempted: an earlier record of its key failed (see [`KeyGate`]).
    pub fn waiting(index: usize) -> Self {
        Self::outage(index, WAITS_FOR_ITS_KEY)
    }
}

/// The reason of a record held back behind an earlier one of its key.
pub const WAITS_FOR_ITS_KEY: &str = "waits for an earlier record of its key";

/// Decodes every record as `E`. Undecodable records are reported in
/// `failures` (poison, or an outage when the registry is unreachable);
/// kinds this build does not know (written by a newer producer) are
/// skipped with a warning.
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
            Err(e) => failures.push(RecordFailure::new(i, codec_failure(&e), e.to_string())),
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

/// Per-key order for handlers that apply records one by one: once a record
/// fails, every later record of the same Kafka key in the batch is held
/// back (reported as [`RecordFailure::waiting`]), so a retry never applies
/// a key's records out of order. Records without a key are not ordered.
///
/// ```ignore
/// let mut failures = Vec::new();
/// let events = decode_all(&codec, records, &mut failures).await;
/// let mut gate = KeyGate::new(records, failures);
/// for (i, event) in events {
///     if !gate.admit(i) { continue; }
///     if let Err(f) = apply(i, &event).await { gate.fail(f); }
/// }
/// gate.outcome()
/// ```
pub struct KeyGate<'r> {
    records: &'r [&'r Record],
    /// Key → index of its first failed record in this batch.
    blocked: HashMap<&'r [u8], usize>,
    failures: Vec<RecordFailure>,
    /// Indexes already in `failures`.
    failed: HashSet<usize>,
}

impl<'r> KeyGate<'r> {
    /// A gate over `records` that already holds `failures` (e.g. records
    /// that did not decode): their keys are blocked from then on.
    pub fn new(records: &'r [&'r Record], failures: Vec<RecordFailure>) -> Self {
        let mut gate = KeyGate {
            records,
            blocked: HashMap::new(),
            failures: Vec::with_capacity(failures.len()),
            failed: HashSet::new(),
        };
        for f in failures {
            gate.fail(f);
        }
        gate
    }

    /// Whether record `i` may be applied now. When an earlier record of its
    /// key failed, it is reported as waiting and `false` is returned.
    pub fn admit(&mut self, i: usize) -> bool {
        let Some(key) = self.key(i) else {
            return !self.failed.contains(&i);
        };
        if self.blocked.get(key).is_some_and(|first| *first < i) {
            if self.failed.insert(i) {
                self.failures.push(RecordFailure::waiting(i));
            }
            return false;
        }
        !self.failed.contains(&i)
    }

    /// Records a failure; later records of its key are held back.
    pub fn fail(&mut self, f: RecordFailure) {
        if let Some(key) = self.key(f.index) {
            let first = self.blocked.entry(key).or_insert(f.index);
            *first = (*first).min(f.index);
        }
        if self.failed.insert(f.index) {
            self.failures.push(f);
        }
    }

    /// `Err(failure)` as [`fail`](Self::fail); `Ok` passes through.
    pub fn check<T>(&mut self, result: Result<T, RecordFailure>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(f) => {
                self.fail(f);
                None
            }
        }
    }

    /// What the handler reports: every failed and every held-back record.
    pub fn outcome(self) -> Result<(), Vec<RecordFailure>> {
        outcome(self.failures)
    }

    fn key(&self, i: usize) -> Option<&'r [u8]> {
        self.records
            .get(i)
            .and_then(|r| r.key.as_deref())
            .filter(|k| !k.is_empty())
    }
}

/// Decodes `records` as `E` and applies each with `apply`, in log order,
/// through a [`KeyGate`]: the shape of every handler that applies records
/// one by one.
pub async fn apply_in_order<E, F, Fut>(
    codec: &crate::events::EventCodec,
    records: &[&Record],
    mut apply: F,
) -> Result<(), Vec<RecordFailure>>
where
    E: crate::events::Event,
    F: FnMut(E) -> Fut,
    Fut: Future<Output = Result<(), (FailureKind, String)>>,
{
    let mut failures = Vec::new();
    let events = decode_all::<E>(codec, records, &mut failures).await;
    let mut gate = KeyGate::new(records, failures);
    for (i, event) in events {
        if !gate.admit(i) {
            continue;
        }
        if let Err((kind, why)) = apply(event).await {
            gate.fail(RecordFailure::new(i, kind, why));
        }
    }
    gate.outcome()
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

/// Where records a pipeline gives up on go.
enum DeadLetters {
    /// The pipeline's DLQ topic.
    Kafka {
        producer: EventProducer,
        topic: String,
    },
    /// Kept in memory (unit tests of the runner).
    #[cfg(test)]
    Memory(std::sync::Arc<Mutex<Vec<(i64, String)>>>),
}

/// Handles batches for one pipeline: outages retried without a limit,
/// poison isolated and sent alone to the DLQ. Shared by the consumer-group
/// loop here and by replays (`crate::replay`).
pub(crate) struct Worker<'a, H> {
    topology: &'a Topology,
    handler: H,
    dead_letters: DeadLetters,
    shutdown: Shutdown,
    /// The key of this worker's entry in [`Degraded`] (its consumer group):
    /// a pipeline and its DLQ replay in one process are told apart.
    health_id: String,
    /// Degraded since, and when the last warning was logged.
    outage: Mutex<Option<OutageState>>,
}

/// An outage being waited out.
struct OutageState {
    since: Instant,
    warned: Instant,
    retries: u64,
}

/// How often an ongoing outage is logged again.
const OUTAGE_WARN_EVERY: Duration = Duration::from_secs(30);

/// Capped exponential backoff.
struct Backoff {
    next: Duration,
    initial: Duration,
    max: Duration,
}

impl Backoff {
    fn new(topology: &Topology) -> Self {
        let initial = Duration::from_millis(topology.backoff_initial_ms);
        Backoff {
            next: initial,
            initial,
            max: Duration::from_millis(topology.backoff_max_ms.max(topology.backoff_initial_ms)),
        }
    }

    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// What a handler said of some records, by index into the batch.
struct Attempt {
    handled: usize,
    outages: Vec<(usize, String)>,
    poison: Vec<(usize, String)>,
}

impl Attempt {
    /// Failed indexes, in batch (offset) order.
    fn failed(&self) -> Vec<usize> {
        let mut all: Vec<usize> = self
            .outages
            .iter()
            .chain(&self.poison)
            .map(|(i, _)| *i)
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The reason shown for an outage: the first that is not just waiting
    /// behind another record.
    fn outage_reason(&self) -> &str {
        self.outages
            .iter()
            .map(|(_, r)| r.as_str())
            .find(|r| *r != WAITS_FOR_ITS_KEY)
            .or_else(|| self.outages.first().map(|(_, r)| r.as_str()))
            .unwrap_or("unknown")
    }
}

impl<'a, H: Handler> Worker<'a, H> {
    pub(crate) fn new(
        topology: &'a Topology,
        handler: H,
        producer: EventProducer,
        dlq: String,
        shutdown: Shutdown,
    ) -> Self {
        let health_id = format!("replay:{dlq}");
        Self {
            topology,
            handler,
            dead_letters: DeadLetters::Kafka {
                producer,
                topic: dlq,
            },
            shutdown,
            health_id,
            outage: Mutex::new(None),
        }
    }

    /// A worker whose DLQ is `sink` (offset, reason), for unit tests.
    #[cfg(test)]
    fn in_memory(
        topology: &'a Topology,
        handler: H,
        shutdown: Shutdown,
        sink: std::sync::Arc<Mutex<Vec<(i64, String)>>>,
    ) -> Self {
        Self {
            topology,
            handler,
            dead_letters: DeadLetters::Memory(sink),
            shutdown,
            health_id: format!("test:{}", crate::events::new_event_id()),
            outage: Mutex::new(None),
        }
    }

    /// Names this worker's health entry (its consumer group).
    pub(crate) fn health_id(mut self, id: &str) -> Self {
        self.health_id = id.to_string();
        self
    }

    /// Handles a batch to completion: every record applied or, if it can
    /// never be, in the DLQ. Outages are waited out. `false` when shutdown
    /// interrupted it (nothing of the batch may be committed then).
    pub(crate) async fn process(&self, batch: &[Record]) -> bool {
        let name = self.topology.name.as_str();
        let mut pending: Vec<usize> = (0..batch.len()).collect();
        let mut backoff = Backoff::new(self.topology);
        // The whole batch together while failures are outages only.
        while pending.len() > 1 {
            let attempt = self.attempt(batch, &pending).await;
            if attempt.outages.is_empty() {
                self.recovered();
            }
            if attempt.outages.is_empty() && attempt.poison.is_empty() {
                return true;
            }
            pending = attempt.failed();
            if !attempt.poison.is_empty() {
                // Poison among several records: handle the failed ones one
                // by one, so only what can never be applied goes to the DLQ.
                if pending.len() > 1 {
                    metrics::counter!(m::PIPELINE_ISOLATED_TOTAL, "pipeline" => name.to_string())
                        .increment(pending.len() as u64);
                    tracing::info!(
                        pipeline = name,
                        records = pending.len(),
                        poison = attempt.poison.len(),
                        reason = %attempt.poison[0].1,
                        "records refused in a batch; handling them one by one"
                    );
                }
                break;
            }
            if !self.wait_out(attempt.outage_reason(), backoff.next()).await {
                return false;
            }
        }
        // One by one, in offset order.
        for index in pending {
            backoff.reset();
            let mut refused = 0u32;
            loop {
                let attempt = self.attempt(batch, &[index]).await;
                if let Some((_, reason)) = attempt.outages.first() {
                    let reason = reason.clone();
                    if !self.wait_out(&reason, backoff.next()).await {
                        return false;
                    }
                    continue;
                }
                self.recovered();
                let Some((_, reason)) = attempt.poison.first() else {
                    break;
                };
                refused += 1;
                if refused >= self.topology.max_attempts {
                    tracing::warn!(pipeline = name, partition = batch[index].partition, offset = batch[index].offset, %reason, attempts = refused, "record refused for good; to the DLQ");
                    if !self.send_to_dlq(&batch[index], reason).await {
                        return false;
                    }
                    break;
                }
                metrics::counter!(m::PIPELINE_RETRIES_TOTAL, "pipeline" => name.to_string())
                    .increment(1);
                tracing::info!(pipeline = name, offset = batch[index].offset, %reason, attempt = refused, "record refused; trying it again alone");
                tokio::select! {
                    _ = self.shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(backoff.next()) => {}
                }
            }
        }
        true
    }

    /// One call of the handler on `pending` (indexes into `batch`).
    async fn attempt(&self, batch: &[Record], pending: &[usize]) -> Attempt {
        let records: Vec<&Record> = pending.iter().map(|i| &batch[*i]).collect();
        let failures = match self.handler.handle(&records).await {
            Ok(()) => Vec::new(),
            Err(f) => f,
        };
        let mut attempt = Attempt {
            handled: 0,
            outages: Vec::new(),
            poison: Vec::new(),
        };
        let mut seen = HashSet::new();
        for f in failures {
            let Some(&index) = pending.get(f.index) else {
                tracing::error!(pipeline = %self.topology.name, index = f.index, records = pending.len(), "handler reported a failure outside its batch");
                continue;
            };
            if !seen.insert(index) {
                continue;
            }
            match f.kind {
                FailureKind::Outage => attempt.outages.push((index, f.reason)),
                FailureKind::Poison => attempt.poison.push((index, f.reason)),
            }
        }
        attempt.handled = pending.len() - seen.len();
        metrics::counter!(m::PIPELINE_EVENTS_TOTAL, "pipeline" => self.topology.name.clone(), "outcome" => "handled")
            .increment(attempt.handled as u64);
        attempt
    }

    /// Waits `delay` before the next attempt of records that failed for an
    /// outage; marks the pipeline degraded. `false` on shutdown.
    async fn wait_out(&self, reason: &str, delay: Duration) -> bool {
        let name = self.topology.name.as_str();
        let now = Instant::now();
        {
            let mut outage = self.outage.lock().unwrap_or_else(|e| e.into_inner());
            match outage.as_mut() {
                None => {
                    tracing::warn!(pipeline = name, %reason, retry_in = ?delay, "outage: records are retried until it ends (none goes to the DLQ)");
                    *outage = Some(OutageState {
                        since: now,
                        warned: now,
                        retries: 1,
                    });
                }
                Some(state) => {
                    state.retries += 1;
                    if now.duration_since(state.warned) >= OUTAGE_WARN_EVERY {
                        state.warned = now;
                        tracing::warn!(pipeline = name, %reason, for_s = now.duration_since(state.since).as_secs(), retries = state.retries, "outage continues; still retrying");
                    }
                }
            }
        }
        Degraded::set(&self.health_id, name, reason);
        metrics::gauge!(m::PIPELINE_DEGRADED, "pipeline" => name.to_string()).set(1.0);
        metrics::counter!(m::PIPELINE_OUTAGE_RETRIES_TOTAL, "pipeline" => name.to_string())
            .increment(1);
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// An attempt went through without an outage: no longer degraded.
    fn recovered(&self) {
        let Some(state) = self.outage.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let name = self.topology.name.as_str();
        tracing::warn!(
            pipeline = name,
            after_s = state.since.elapsed().as_secs(),
            retries = state.retries,
            "outage over; pipeline resumed"
        );
        Degraded::clear(&self.health_id);
        metrics::gauge!(m::PIPELINE_DEGRADED, "pipeline" => name.to_string()).set(0.0);
    }

    /// Copies a record to the DLQ, retrying until the broker takes it:
    /// nothing is dropped silently. `false` on shutdown.
    async fn send_to_dlq(&self, record: &Record, reason: &str) -> bool {
        let name = self.topology.name.as_str();
        let (producer, dlq) = match &self.dead_letters {
            DeadLetters::Kafka { producer, topic } => (producer, topic),
            #[cfg(test)]
            DeadLetters::Memory(sink) => {
                sink.lock()
                    .unwrap()
                    .push((record.offset, reason.to_string()));
                return true;
            }
        };
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
            match producer
                .send_bytes(
                    dlq,
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

impl<H> Drop for Worker<'_, H> {
    /// A worker that stops (shutdown) while degraded leaves no stale entry.
    fn drop(&mut self) {
        let degraded = self.outage.get_mut().map(|o| o.is_some()).unwrap_or(true);
        if degraded {
            Degraded::clear(&self.health_id);
            metrics::gauge!(m::PIPELINE_DEGRADED, "pipeline" => self.topology.name.clone())
                .set(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;

    /// An in-memory sink applied record by record with per-key order: the
    /// shape of most handlers.
    #[derive(Default)]
    struct FakeHandler {
        state: Mutex<FakeState>,
    }

    #[derive(Default)]
    struct FakeState {
        calls: usize,
        /// Every call before this one fails every record as an outage.
        outage_calls: usize,
        /// Offsets refused every time (poison).
        poison: BTreeSet<i64>,
        /// Offset → how many more attempts of it fail as an outage.
        flaky: HashMap<i64, usize>,
        /// Offsets applied, in the order they were applied.
        applied: Vec<i64>,
        /// Degraded reason seen by the handler on each call.
        degraded_seen: Vec<Option<String>>,
    }

    impl Handler for Arc<FakeHandler> {
        async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
            let mut s = self.state.lock().unwrap();
            s.calls += 1;
            if s.calls <= s.outage_calls {
                return Err((0..records.len())
                    .map(|i| RecordFailure::outage(i, "mysql: pool timed out"))
                    .collect());
            }
            let mut gate = KeyGate::new(records, Vec::new());
            for (i, r) in records.iter().enumerate() {
                if !gate.admit(i) {
                    continue;
                }
                if s.poison.contains(&r.offset) {
                    gate.fail(RecordFailure::poison(i, "CHECK constraint failed"));
                    continue;
                }
                if let Some(left) = s.flaky.get_mut(&r.offset).filter(|n| **n > 0) {
                    *left -= 1;
                    gate.fail(RecordFailure::outage(i, "lock wait timeout"));
                    continue;
                }
                s.applied.push(r.offset);
            }
            gate.outcome()
        }
    }

    fn record(offset: i64, key: &str) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset,
            key: Some(key.as_bytes().to_vec()),
            payload: Some(vec![1]),
            traceparent: None,
            timestamp_ms: None,
        }
    }

    fn topology(max_attempts: u32) -> Topology {
        Topology::parse(
            &format!(
                "name = \"fake\"\nsource = \"group_events\"\nmax_attempts = {max_attempts}\n\
                 backoff_initial_ms = 1\nbackoff_max_ms = 4\n"
            ),
            "fake.toml",
        )
        .unwrap()
    }

    /// The applied offsets of each key, in the order applied.
    fn by_key(applied: &[i64], batch: &[Record]) -> HashMap<Vec<u8>, Vec<i64>> {
        let mut out: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
        for o in applied {
            let r = batch.iter().find(|r| r.offset == *o).unwrap();
            out.entry(r.key.clone().unwrap()).or_default().push(*o);
        }
        out
    }

    #[tokio::test]
    async fn an_outage_is_retried_until_it_ends_and_never_reaches_the_dlq() {
        let handler = Arc::new(FakeHandler::default());
        // More failed calls than any max_attempts would allow.
        handler.state.lock().unwrap().outage_calls = 12;
        let topology = topology(3);
        let dlq = Arc::default();
        let worker = Worker::in_memory(
            &topology,
            handler.clone(),
            Shutdown::new(),
            Arc::clone(&dlq),
        );
        let batch: Vec<Record> = (0..5).map(|o| record(o, &format!("k{}", o % 2))).collect();
        let probe = {
            let (handler, id) = (handler.clone(), worker.health_id.clone());
            // Look at the health registry while the worker retries.
            tokio::spawn(async move {
                for _ in 0..200 {
                    if let Some(r) = Degraded::reason(&id) {
                        handler.state.lock().unwrap().degraded_seen.push(Some(r));
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        };
        assert!(worker.process(&batch).await);
        probe.await.unwrap();
        let s = handler.state.lock().unwrap();
        assert_eq!(
            s.calls, 13,
            "12 outage attempts, then one that went through"
        );
        assert_eq!(s.applied, vec![0, 1, 2, 3, 4]);
        assert!(dlq.lock().unwrap().is_empty(), "{:?}", dlq.lock().unwrap());
        assert_eq!(
            s.degraded_seen,
            vec![Some("mysql: pool timed out".to_string())],
            "degraded with its reason during the outage"
        );
        assert_eq!(Degraded::reason(&worker.health_id), None, "recovered");
    }

    #[tokio::test]
    async fn one_poison_record_in_ten_goes_alone_to_the_dlq_and_the_other_nine_are_applied() {
        let handler = Arc::new(FakeHandler::default());
        handler.state.lock().unwrap().poison.insert(4);
        let topology = topology(3);
        let dlq: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
        let worker = Worker::in_memory(
            &topology,
            handler.clone(),
            Shutdown::new(),
            Arc::clone(&dlq),
        );
        // Keys k0..k2: offset 4 is k1, as are 1 and 7 (7 waits for 4).
        let batch: Vec<Record> = (0..10).map(|o| record(o, &format!("k{}", o % 3))).collect();
        assert!(worker.process(&batch).await);
        let s = handler.state.lock().unwrap();
        let mut applied = s.applied.clone();
        applied.sort_unstable();
        assert_eq!(applied, vec![0, 1, 2, 3, 5, 6, 7, 8, 9]);
        assert_eq!(
            dlq.lock().unwrap().clone(),
            vec![(4, "CHECK constraint failed".to_string())]
        );
        // Offset 4 was tried alone max_attempts times: the batch call, then
        // 3 alone for 4, 1 alone for 7 (which waited for it).
        assert_eq!(s.calls, 1 + 3 + 1);
        for (key, offsets) in by_key(&s.applied, &batch) {
            assert!(
                offsets.windows(2).all(|w| w[0] < w[1]),
                "{key:?}: {offsets:?}"
            );
        }
        assert_eq!(Degraded::reason(&worker.health_id), None);
    }

    #[tokio::test]
    async fn records_after_a_failed_one_of_their_key_are_applied_after_it_in_order() {
        let handler = Arc::new(FakeHandler::default());
        // Offset 1 (key a) hits a lock wait twice.
        handler.state.lock().unwrap().flaky.insert(1, 2);
        let topology = topology(2);
        let dlq: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
        let worker = Worker::in_memory(
            &topology,
            handler.clone(),
            Shutdown::new(),
            Arc::clone(&dlq),
        );
        let keys = ["a", "a", "b", "a", "b", "a"];
        let batch: Vec<Record> = keys
            .iter()
            .enumerate()
            .map(|(o, k)| record(o as i64, k))
            .collect();
        assert!(worker.process(&batch).await);
        let s = handler.state.lock().unwrap();
        let keyed = by_key(&s.applied, &batch);
        assert_eq!(keyed[b"a".as_slice()], vec![0, 1, 3, 5]);
        assert_eq!(keyed[b"b".as_slice()], vec![2, 4]);
        // b was not held back by a's trouble: applied on the first call.
        assert_eq!(&s.applied[..3], &[0, 2, 4]);
        assert!(dlq.lock().unwrap().is_empty());
        assert_eq!(s.calls, 3);
    }

    #[tokio::test]
    async fn an_outage_while_isolating_is_retried_and_poison_still_goes_alone() {
        let handler = Arc::new(FakeHandler::default());
        {
            let mut s = handler.state.lock().unwrap();
            s.poison.insert(0);
            // Offset 2 (same key as 0) then hits an outage several times
            // more than max_attempts while handled alone.
            s.flaky.insert(2, 6);
        }
        let topology = topology(2);
        let dlq: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
        let worker = Worker::in_memory(
            &topology,
            handler.clone(),
            Shutdown::new(),
            Arc::clone(&dlq),
        );
        let batch: Vec<Record> = ["x", "y", "x"]
            .iter()
            .enumerate()
            .map(|(o, k)| record(o as i64, k))
            .collect();
        assert!(worker.process(&batch).await);
        let s = handler.state.lock().unwrap();
        assert_eq!(s.applied, vec![1, 2]);
        assert_eq!(dlq.lock().unwrap().len(), 1);
        assert_eq!(dlq.lock().unwrap()[0].0, 0);
    }

    #[tokio::test]
    async fn shutdown_interrupts_an_outage_and_leaves_no_degraded_entry() {
        let handler = Arc::new(FakeHandler::default());
        handler.state.lock().unwrap().outage_calls = usize::MAX;
        let topology = topology(2);
        let shutdown = Shutdown::new();
        let dlq: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
        let worker = Worker::in_memory(&topology, handler.clone(), shutdown.clone(), dlq);
        let id = worker.health_id.clone();
        let batch = vec![record(0, "a"), record(1, "b")];
        let stop = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            shutdown.trigger();
        });
        assert!(!worker.process(&batch).await, "interrupted, not done");
        stop.await.unwrap();
        assert!(Degraded::reason(&id).is_some());
        drop(worker);
        assert_eq!(Degraded::reason(&id), None);
        assert!(handler.state.lock().unwrap().applied.is_empty());
    }

    #[test]
    fn the_key_gate_holds_back_later_records_of_a_failed_key_only() {
        let batch = [
            record(0, "a"),
            record(1, "b"),
            record(2, "a"),
            record(3, "a"),
        ];
        let records: Vec<&Record> = batch.iter().collect();
        // Record 2 did not decode.
        let mut gate = KeyGate::new(&records, vec![RecordFailure::poison(2, "bad avro")]);
        assert!(gate.admit(0), "before the failure");
        assert!(gate.admit(1), "another key");
        assert!(!gate.admit(2), "the failed one itself");
        assert!(!gate.admit(3), "after the failure");
        let failures = gate.outcome().unwrap_err();
        let shown: Vec<(usize, FailureKind, &str)> = failures
            .iter()
            .map(|f| (f.index, f.kind, f.reason.as_str()))
            .collect();
        assert_eq!(
            shown,
            vec![
                (2, FailureKind::Poison, "bad avro"),
                (3, FailureKind::Outage, WAITS_FOR_ITS_KEY)
            ]
        );
    }
}
