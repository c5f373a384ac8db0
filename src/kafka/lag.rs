//! Consumer-group backlog: for each partition of a topic, where a group
//! would resume (its committed offset, or the log start) and the high
//! watermark now. The lag gauge of every pipeline, the shard manager's
//! sealing check and the dead-letter scan all read it.
//!
//! Every function here makes blocking librdkafka calls: run it on
//! `spawn_blocking`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::config::KafkaConfig;

/// How long one metadata, watermark or committed-offset request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One partition's unconsumed range `[from, high)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionBacklog {
    pub partition: i32,
    /// Where the group resumes: its committed offset, never below the log start.
    pub from: i64,
    /// The high watermark (offset of the next record to be written).
    pub high: i64,
}

impl PartitionBacklog {
    /// Records the group has not committed yet.
    pub fn lag(&self) -> i64 {
        (self.high - self.from).max(0)
    }
}

/// Records of every partition the group has not committed yet.
pub fn total_lag(backlog: &[PartitionBacklog]) -> i64 {
    backlog.iter().map(PartitionBacklog::lag).sum()
}

/// A client that only reads `group`'s state: no subscription, no commits.
pub fn group_probe(kafka: &KafkaConfig, group: &str) -> Result<BaseConsumer, KafkaError> {
    crate::kafka::client_config(kafka)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
}

/// The partition ids of `topic`.
pub fn partitions(probe: &BaseConsumer, topic: &str) -> Result<Vec<i32>, KafkaError> {
    let metadata = probe.fetch_metadata(Some(topic), REQUEST_TIMEOUT)?;
    Ok(metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect())
}

/// partition → (low, high) watermarks of `topic` now.
pub fn watermarks(
    kafka: &KafkaConfig,
    group: &str,
    topic: &str,
) -> Result<BTreeMap<i32, (i64, i64)>, KafkaError> {
    watermarks_of(&group_probe(kafka, group)?, topic)
}

fn watermarks_of(
    probe: &BaseConsumer,
    topic: &str,
) -> Result<BTreeMap<i32, (i64, i64)>, KafkaError> {
    let mut out = BTreeMap::new();
    for p in partitions(probe, topic)? {
        out.insert(p, probe.fetch_watermarks(topic, p, REQUEST_TIMEOUT)?);
    }
    Ok(out)
}

/// partition → offset committed by `group` on `topic` (absent: never
/// committed).
pub fn committed(
    kafka: &KafkaConfig,
    group: &str,
    topic: &str,
) -> Result<BTreeMap<i32, i64>, KafkaError> {
    committed_of(&group_probe(kafka, group)?, topic)
}

fn committed_of(probe: &BaseConsumer, topic: &str) -> Result<BTreeMap<i32, i64>, KafkaError> {
    let mut wanted = TopicPartitionList::new();
    for p in partitions(probe, topic)? {
        wanted.add_partition(topic, p);
    }
    let committed = probe.committed_offsets(wanted, REQUEST_TIMEOUT)?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}

/// The backlog of `group` on every partition of `topic`. A group that never
/// committed on a partition resumes at the log start, so all of it counts.
pub fn backlog(
    kafka: &KafkaConfig,
    topic: &str,
    group: &str,
) -> Result<Vec<PartitionBacklog>, KafkaError> {
    backlog_with(&group_probe(kafka, group)?, topic)
}

/// [`backlog`] through an existing probe of the group: what a periodic
/// reader uses, so it does not open a Kafka client (threads, connections,
/// metadata, coordinator lookup) every time.
pub fn backlog_with(
    probe: &BaseConsumer,
    topic: &str,
) -> Result<Vec<PartitionBacklog>, KafkaError> {
    let committed = committed_of(probe, topic)?;
    Ok(watermarks_of(probe, topic)?
        .into_iter()
        .map(|(partition, (low, high))| PartitionBacklog {
            partition,
            from: committed.get(&partition).map_or(low, |c| (*c).max(low)),
            high,
        })
        .collect())
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("scanning {topic} did not finish within {deadline:?}")]
    Timeout { topic: String, deadline: Duration },
}

/// One record of a scanned range.
#[derive(Debug, Clone)]
pub struct ScannedRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
}

/// Reads every record of `backlog` (each partition's `[from, high)`) with a
/// throwaway consumer that commits nothing.
pub fn read_backlog(
    kafka: &KafkaConfig,
    topic: &str,
    backlog: &[PartitionBacklog],
    deadline: Duration,
) -> Result<Vec<ScannedRecord>, ScanError> {
    let started = Instant::now();
    let mut assignment = TopicPartitionList::new();
    let mut ends = std::collections::HashMap::new();
    for b in backlog.iter().filter(|b| b.lag() > 0) {
        assignment.add_partition_offset(topic, b.partition, Offset::Offset(b.from))?;
        ends.insert(b.partition, b.high);
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return Ok(out);
    }
    let reader: BaseConsumer = crate::kafka::client_config(kafka)
        .set(
            "group.id",
            format!("imstream-scan-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    reader.assign(&assignment)?;
    while !ends.is_empty() {
        if started.elapsed() > deadline {
            return Err(ScanError::Timeout {
                topic: topic.to_string(),
                deadline,
            });
        }
        let Some(result) = reader.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = match result {
            Ok(m) => m,
            Err(rdkafka::error::KafkaError::PartitionEOF(p)) => {
                ends.remove(&p);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let p = msg.partition();
        let Some(high) = ends.get(&p).copied() else {
            continue;
        };
        if msg.offset() < high {
            out.push(ScannedRecord {
                partition: p,
                offset: msg.offset(),
                key: msg.key().map(<[u8]>::to_vec),
                payload: msg.payload().map(<[u8]>::to_vec),
            });
        }
        if msg.offset() + 1 >= high {
            ends.remove(&p);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_from_the_resume_point_to_the_high_watermark() {
        let b = [
            PartitionBacklog {
                partition: 0,
                from: 3,
                high: 10,
            },
            PartitionBacklog {
                partition: 1,
                from: 5,
                high: 5,
            },
        ];
        assert_eq!(b[0].lag(), 7);
        assert_eq!(b[1].lag(), 0);
        assert_eq!(total_lag(&b), 7);
    }
}
