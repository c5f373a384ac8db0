//! The replay loop: reads fixed spans of the log (from a start offset to the
//! high watermark seen when the replay began) and hands the records to the
//! pipeline's own handler through the runner's worker (same retries, same
//! DLQ), committing offsets as it goes.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::ProgressBar;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::producer::EventProducer;
use crate::pipeline::records::{Handler, Record};
use crate::pipeline::runner;
use crate::pipeline::worker::Worker;
use crate::pipeline::{Route, Topology, WithHandler};
use crate::shutdown::Shutdown;

use super::offsets::Span;

/// Which records of other tenants a replay leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantFilter {
    /// Every record is applied.
    All,
    /// Only `tenant`'s records; another tenant's record is applied only
    /// when the reset group had not applied it yet (at or after
    /// [`Span::applied_below`]).
    Reset(String),
    /// Only `tenant`'s records (a fresh target holds only that tenant).
    Only(String),
}

/// What a replay went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records read within the spans.
    pub records: u64,
    /// Records handed to the handler.
    pub applied: u64,
    /// Records of other tenants left out.
    pub skipped: u64,
}

/// A replay over `spans` of `route.source` as consumer group `route.group`.
pub struct Replayer<'a> {
    pub config: &'a Config,
    pub topology: &'a Topology,
    pub route: &'a Route,
    pub spans: &'a BTreeMap<i32, Span>,
    pub filter: TenantFilter,
    pub producer: EventProducer,
    pub shutdown: Shutdown,
    pub progress: ProgressBar,
}

/// The tenant of a record, from its `{tenant}:{topic}` key.
fn key_tenant(key: Option<&[u8]>) -> Option<&[u8]> {
    let key = key?;
    let colon = key.iter().position(|b| *b == b':')?;
    Some(&key[..colon])
}

impl TenantFilter {
    fn keeps(&self, record: &Record, span: &Span) -> bool {
        let (tenant, only) = match self {
            TenantFilter::All => return true,
            TenantFilter::Reset(t) => (t, false),
            TenantFilter::Only(t) => (t, true),
        };
        match key_tenant(record.key.as_deref()) {
            // Unkeyed records are not tenant-scoped: the handler decides.
            None => true,
            Some(k) if k == tenant.as_bytes() => true,
            Some(_) => !only && record.offset >= span.applied_below,
        }
    }
}

impl WithHandler for Replayer<'_> {
    type Output = anyhow::Result<Counts>;

    async fn with<H: Handler>(self, handler: H) -> Self::Output {
        let source = &self.route.source;
        let consumer: StreamConsumer = crate::kafka::client_config(&self.config.kafka)
            .set("group.id", &self.route.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("fetch.wait.max.ms", "100")
            .create()?;
        let mut assignment = TopicPartitionList::new();
        let mut open: BTreeMap<i32, i64> = BTreeMap::new();
        for (p, span) in self.spans {
            if span.start < span.end {
                assignment.add_partition_offset(source, *p, Offset::Offset(span.start))?;
                open.insert(*p, span.end);
            }
        }
        let mut counts = Counts::default();
        if open.is_empty() {
            return Ok(counts);
        }
        consumer.assign(&assignment)?;
        let worker = Worker::new(
            self.topology,
            handler,
            self.producer.clone(),
            self.route.dlq.clone(),
            self.shutdown.clone(),
        );
        let linger = Duration::from_millis(self.topology.batch_linger_ms.max(5));
        while !open.is_empty() {
            let mut batch: Vec<Record> = Vec::new();
            let deadline = tokio::time::Instant::now() + linger;
            while batch.len() < self.topology.batch_max {
                let wait = if batch.is_empty() {
                    tokio::time::Instant::now() + Duration::from_millis(500)
                } else {
                    deadline
                };
                let msg = tokio::select! {
                    _ = self.shutdown.cancelled() => anyhow::bail!("replay interrupted; {} record(s) replayed", counts.records),
                    m = tokio::time::timeout_at(wait, consumer.recv()) => m,
                };
                match msg {
                    Ok(Ok(m)) => {
                        let end = open.get(&m.partition()).copied();
                        if end.is_some_and(|end| m.offset() < end) {
                            batch.push(runner::detach(&m));
                        }
                        if end.is_some_and(|end| m.offset() + 1 >= end) {
                            open.remove(&m.partition());
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "replay consume error");
                        break;
                    }
                    Err(_) => break,
                }
                if open.is_empty() {
                    break;
                }
            }
            if batch.is_empty() {
                // Idle: a partition whose last records are not deliverable
                // (e.g. control records) is done once its position is at the end.
                if let Ok(positions) = consumer.position() {
                    for e in positions.elements() {
                        if let (Offset::Offset(o), Some(end)) =
                            (e.offset(), open.get(&e.partition()))
                        {
                            if o >= *end {
                                open.remove(&e.partition());
                            }
                        }
                    }
                }
                continue;
            }
            let kept: Vec<Record> = batch
                .iter()
                .filter(|r| self.filter.keeps(r, &self.spans[&r.partition]))
                .cloned()
                .collect();
            counts.records += batch.len() as u64;
            counts.applied += kept.len() as u64;
            counts.skipped += (batch.len() - kept.len()) as u64;
            if !kept.is_empty() && !worker.process(&kept).await {
                anyhow::bail!("replay interrupted; {} record(s) replayed", counts.records);
            }
            runner::commit(&consumer, &batch, CommitMode::Async);
            self.progress.inc(batch.len() as u64);
        }
        // Everything up to the end of each span is handled: make it durable.
        let mut done = TopicPartitionList::new();
        for (p, span) in self.spans {
            if span.start < span.end {
                done.add_partition_offset(source, *p, Offset::Offset(span.end))?;
            }
        }
        consumer.commit(&done, CommitMode::Sync)?;
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: &str, offset: i64) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset,
            key: Some(key.as_bytes().to_vec()),
            payload: None,
            traceparent: None,
            timestamp_ms: None,
        }
    }

    #[test]
    fn other_tenants_are_not_reapplied() {
        let span = Span {
            start: 0,
            end: 100,
            applied_below: 50,
        };
        let reset = TenantFilter::Reset("acme".into());
        assert!(reset.keeps(&record("acme:grp1", 10), &span));
        assert!(
            !reset.keeps(&record("other:grp1", 10), &span),
            "already applied"
        );
        assert!(
            reset.keeps(&record("other:grp1", 60), &span),
            "never applied yet"
        );
        assert!(
            !reset.keeps(&record("acmex:grp1", 10), &span),
            "prefix is not the tenant"
        );
        let only = TenantFilter::Only("acme".into());
        assert!(!only.keeps(&record("other:grp1", 60), &span));
        assert!(only.keeps(&record("acme:g", 60), &span));
        assert!(TenantFilter::All.keeps(&record("other:g", 1), &span));
    }
}
