//! A pipeline's batches handled: outages retried without a limit (the
//! pipeline degraded meanwhile), poison isolated and sent alone to the DLQ
//! (see `super::runner` for the rules). One [`Worker`] per pipeline,
//! shared by the consumer-group loop, units and replays.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::kafka::producer::EventProducer;
use crate::metrics as m;
use crate::shutdown::Shutdown;
use crate::telemetry::Degraded;

use super::failure::FailureKind;
use super::topology::Topology;

use super::records::{Handler, Record, WAITS_FOR_ITS_KEY};

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
    use std::collections::{BTreeSet, HashMap};
    use std::sync::Arc;

    use super::*;
    use crate::pipeline::records::{KeyGate, RecordFailure};

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
