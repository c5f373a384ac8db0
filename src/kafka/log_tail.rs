//! Reads the part of the group-events log a pipeline has not committed yet:
//! the highest seq (and month) of one topic there (with the MySQL mirror,
//! everything committed, this covers every acked event: what re-seeding a
//! topic from before durable marks needs), and every message of some
//! tenants there, in one pass over every partition (whose client message
//! id claims a restore after a Redis loss puts back, `crate::recovery`).

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::config::Config;
use crate::events::{EventCodec, GroupEvent, GroupEventBody};

use super::topics::{TopicKind, TopicNames};

#[derive(Debug, thiserror::Error)]
pub enum TailError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("decoding a tail event: {0}")]
    Codec(#[from] crate::events::CodecError),
    #[error("log tail scan did not finish within {0:?}")]
    Timeout(Duration),
}

/// Highest seq and shard month of `key`'s topic in the uncommitted tail.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TailMax {
    pub seq: Option<i64>,
    pub month: Option<String>,
    pub scanned: u64,
    /// Records of the key that could not be decoded (logged, skipped).
    pub skipped: u64,
    /// Partitions read.
    pub partitions: usize,
    /// Every message of the key found, in log order (a fenced re-seed puts
    /// back the client message id claims a rolled-back Redis lost).
    pub sent: Vec<TailSent>,
}

/// One `MessageSent` of the tail: what a client message id claim records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailSent {
    pub seq: i64,
    pub month: String,
    pub from_user: i64,
    pub client_msg_id: Option<String>,
    pub message_id: i64,
}

/// Scans `key`'s partition (every partition when a custom partitioner is
/// configured) from `group`'s committed offset (or the start) to the high
/// watermark seen now, decoding only records whose key is `key`.
pub async fn max_in_tail(
    config: &Config,
    group: &str,
    key: &str,
    codec: &EventCodec,
    deadline: Duration,
) -> Result<TailMax, TailError> {
    let topic = TopicNames::new(&config.kafka).name(TopicKind::GroupEvents);
    let config = config.clone();
    let group = group.to_string();
    let filter = Filter::Key(key.as_bytes().to_vec());
    // librdkafka's blocking calls run off the async workers.
    let payloads =
        tokio::task::spawn_blocking(move || scan(&config, &topic, &group, &filter, deadline))
            .await
            .map_err(|_| TailError::Timeout(deadline))??;
    let mut out = TailMax {
        scanned: payloads.1,
        partitions: payloads.2,
        ..TailMax::default()
    };
    for payload in payloads.0 {
        let event: GroupEvent = match codec.decode(Some(&payload)).await {
            Ok(e) => e,
            // A registry outage may hide a real seq: fail, to be retried.
            Err(e) if e.is_retryable() => return Err(e.into()),
            // A record nobody can decode carries no seq anyone was acked
            // for from this build's view; one such record must not fail
            // every re-seed of its topic.
            Err(e) => {
                out.skipped += 1;
                tracing::warn!(key, error = %e, "skipping an undecodable record in the log tail");
                continue;
            }
        };
        if let GroupEventBody::MessageSent(m) = event.body {
            out.seq = out.seq.max(Some(m.seq));
            if out
                .month
                .as_deref()
                .is_none_or(|cur| m.shard_month.as_str() > cur)
            {
                out.month = Some(m.shard_month.clone());
            }
            out.sent.push(TailSent {
                seq: m.seq,
                month: m.shard_month,
                from_user: m.from_user,
                client_msg_id: m.client_msg_id,
                message_id: m.message_id,
            });
        }
    }
    Ok(out)
}

/// Every event of `key`'s topic in the part of the log `group` has not
/// committed yet, in log order (a rebuild of a group's write model applies
/// them on top of what the members projection stored). Records nobody can
/// decode are skipped (logged), as in [`max_in_tail`].
pub async fn events_in_tail(
    config: &Config,
    group: &str,
    key: &str,
    codec: &EventCodec,
    deadline: Duration,
) -> Result<Vec<GroupEvent>, TailError> {
    let topic = TopicNames::new(&config.kafka).name(TopicKind::GroupEvents);
    let config = config.clone();
    let group = group.to_string();
    let filter = Filter::Key(key.as_bytes().to_vec());
    let payloads =
        tokio::task::spawn_blocking(move || scan(&config, &topic, &group, &filter, deadline))
            .await
            .map_err(|_| TailError::Timeout(deadline))??;
    let mut out = Vec::new();
    for payload in payloads.0 {
        match codec.decode::<GroupEvent>(Some(&payload)).await {
            Ok(e) => out.push(e),
            Err(e) if e.is_retryable() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(key, error = %e, "skipping an undecodable record in the log tail");
            }
        }
    }
    Ok(out)
}

/// Which records of the tail a scan keeps.
enum Filter {
    /// One key's (only its partition is read).
    Key(Vec<u8>),
    /// Every record whose key starts with one of these (every partition).
    Prefixes(Vec<Vec<u8>>),
}

impl Filter {
    fn keeps(&self, key: Option<&[u8]>) -> bool {
        let Some(key) = key else { return false };
        match self {
            Filter::Key(k) => key == k.as_slice(),
            Filter::Prefixes(ps) => ps.iter().any(|p| key.starts_with(p)),
        }
    }
}

/// Every message with a client message id of `tenants` in the part of the
/// log `group` has not committed, in one pass over every partition:
/// `(tenant, topic, message)`. Records nobody can decode are skipped
/// (logged), as in [`max_in_tail`].
pub async fn claims_in_tail(
    config: &Config,
    group: &str,
    tenants: &[String],
    codec: &EventCodec,
    deadline: Duration,
) -> Result<(Vec<(String, String, TailSent)>, u64), TailError> {
    let topic = TopicNames::new(&config.kafka).name(TopicKind::GroupEvents);
    let config = config.clone();
    let group = group.to_string();
    let filter = Filter::Prefixes(
        tenants
            .iter()
            .map(|t| format!("{t}:").into_bytes())
            .collect(),
    );
    let payloads =
        tokio::task::spawn_blocking(move || scan(&config, &topic, &group, &filter, deadline))
            .await
            .map_err(|_| TailError::Timeout(deadline))??;
    let mut out = Vec::new();
    for payload in payloads.0 {
        let event: GroupEvent = match codec.decode(Some(&payload)).await {
            Ok(e) => e,
            Err(e) if e.is_retryable() => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, "skipping an undecodable record in the log tail");
                continue;
            }
        };
        if let GroupEventBody::MessageSent(m) = event.body {
            if m.client_msg_id.is_some() {
                out.push((
                    event.tenant_id,
                    event.topic,
                    TailSent {
                        seq: m.seq,
                        month: m.shard_month,
                        from_user: m.from_user,
                        client_msg_id: m.client_msg_id,
                        message_id: m.message_id,
                    },
                ));
            }
        }
    }
    Ok((out, payloads.1))
}

fn scan(
    config: &Config,
    topic: &str,
    group: &str,
    filter: &Filter,
    deadline: Duration,
) -> Result<(Vec<Vec<u8>>, u64, usize), TailError> {
    let started = Instant::now();
    // Where the group resumes on each partition, up to the end now.
    let mut backlog = super::lag::backlog(&config.kafka, topic, group)?;
    let custom = config
        .kafka
        .client_properties
        .get("partitioner")
        .is_some_and(|p| !p.starts_with("consistent"));
    if let (false, Filter::Key(key)) = (custom, filter) {
        let p = partition_of(key, backlog.len());
        backlog.retain(|b| b.partition == p);
    }
    let partitions = backlog.len();
    let reader: BaseConsumer = crate::kafka::client_config(&config.kafka)
        .set("group.id", format!("{group}.tail-scan"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    let mut ends = std::collections::HashMap::new();
    for b in backlog.iter().filter(|b| b.from < b.high) {
        assignment.add_partition_offset(topic, b.partition, Offset::Offset(b.from))?;
        ends.insert(b.partition, b.high);
    }
    let mut found = Vec::new();
    let mut scanned = 0u64;
    if ends.is_empty() {
        return Ok((found, scanned, partitions));
    }
    reader.assign(&assignment)?;
    while !ends.is_empty() {
        if started.elapsed() > deadline {
            return Err(TailError::Timeout(deadline));
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
        scanned += 1;
        if filter.keeps(msg.key()) {
            if let Some(payload) = msg.payload() {
                found.push(payload.to_vec());
            }
        }
        if ends.get(&p).is_some_and(|high| msg.offset() + 1 >= *high) {
            ends.remove(&p);
        }
    }
    Ok((found, scanned, partitions))
}

/// The partition librdkafka's default (`consistent_random`) partitioner
/// puts a non-empty `key` in: CRC-32 (IEEE) of the key modulo the count.
pub fn partition_of(key: &[u8], partitions: usize) -> i32 {
    if partitions == 0 {
        return 0;
    }
    (crc32(key) % partitions as u32) as i32
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32_is_the_ieee_one() {
        assert_eq!(super::crc32(b"123456789"), 0xcbf4_3926);
    }
}
