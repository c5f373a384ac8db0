//! What a pipeline's handler sees: consumed records ([`Record`]), how it
//! reports each one's failure ([`RecordFailure`]: outage or poison), and
//! per-key order — a record after a failed one of the same Kafka key is
//! not applied but reported as waiting ([`KeyGate`], [`apply_in_order`]),
//! so retries never reorder a key's records.

use std::collections::{HashMap, HashSet};
use std::future::Future;

use super::failure::{codec_failure, FailureKind};

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
