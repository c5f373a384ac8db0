//! Where a replay starts and stops in the log, and whether a consumer group
//! may be reset: watermarks, offsets by timestamp (`offsets_for_times`),
//! committed offsets, group members. Blocking librdkafka calls; run them
//! off the async workers.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::lag;

const TIMEOUT: Duration = Duration::from_secs(10);

fn probe(config: &Config, group: &str) -> Result<BaseConsumer, KafkaError> {
    lag::group_probe(&config.kafka, group)
}

/// partition → first offset whose timestamp is at or after `ts_ms`
/// (`None` where no record is that recent).
pub fn offsets_for_time(
    config: &Config,
    group: &str,
    topic: &str,
    ts_ms: i64,
) -> Result<BTreeMap<i32, Option<i64>>, KafkaError> {
    let consumer = probe(config, group)?;
    let mut wanted = TopicPartitionList::new();
    for p in lag::partitions(&consumer, topic)? {
        wanted.add_partition_offset(topic, p, Offset::Offset(ts_ms))?;
    }
    let found = consumer.offsets_for_times(wanted, TIMEOUT)?;
    Ok(found
        .elements()
        .iter()
        .map(|e| {
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            (e.partition(), offset)
        })
        .collect())
}

/// The members of consumer group `group` (`client_id@host`), empty when the
/// group is inactive or unknown.
pub fn group_members(config: &Config, group: &str) -> Result<Vec<String>, KafkaError> {
    let consumer = probe(config, &format!("{group}.probe"))?;
    let list = consumer.fetch_group_list(Some(group), TIMEOUT)?;
    Ok(list
        .groups()
        .iter()
        .filter(|g| g.name() == group)
        .flat_map(|g| {
            g.members()
                .iter()
                .map(|m| format!("{}@{}", m.client_id(), m.client_host()))
        })
        .collect())
}

/// Where a replay reads one partition: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: i64,
    pub end: i64,
    /// Records before this offset were already applied by the group being
    /// reset (its committed offset); `--tenant` skips other tenants' records
    /// only below it, so a reset never drops a record that was never applied.
    pub applied_below: i64,
}

/// The spans of a replay: from `from` (per partition; `None` = log start)
/// to the high watermark seen now. When the pipeline's own group is reset
/// (`reset_committed` is its committed offsets), a start is never after the
/// group's committed offset, so no record it has not handled is skipped.
pub fn spans(
    marks: &BTreeMap<i32, (i64, i64)>,
    from: &BTreeMap<i32, Option<i64>>,
    reset_committed: Option<&BTreeMap<i32, i64>>,
) -> BTreeMap<i32, Span> {
    marks
        .iter()
        .map(|(p, (low, high))| {
            let mut start = match from.get(p) {
                Some(Some(o)) => (*o).max(*low),
                Some(None) => *high,
                None => *low,
            };
            let mut applied_below = *low;
            if let Some(committed) = reset_committed {
                let c = committed.get(p).copied().unwrap_or(*low).clamp(*low, *high);
                start = start.min(c);
                applied_below = c;
            }
            (
                *p,
                Span {
                    start: start.min(*high),
                    end: *high,
                    applied_below,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_never_starts_after_what_the_group_applied() {
        let marks = BTreeMap::from([(0, (0, 100)), (1, (10, 50)), (2, (0, 0))]);
        // From a timestamp: partition 0 at 60, partition 1 has nothing that recent.
        let from = BTreeMap::from([(0, Some(60)), (1, None), (2, None)]);
        let fresh = spans(&marks, &from, None);
        assert_eq!(
            fresh[&0],
            Span {
                start: 60,
                end: 100,
                applied_below: 0
            }
        );
        assert_eq!(
            fresh[&1],
            Span {
                start: 50,
                end: 50,
                applied_below: 10
            }
        );
        // The group had handled partition 0 only up to 40: start there.
        let committed = BTreeMap::from([(0, 40), (1, 50)]);
        let reset = spans(&marks, &from, Some(&committed));
        assert_eq!(
            reset[&0],
            Span {
                start: 40,
                end: 100,
                applied_below: 40
            }
        );
        assert_eq!(
            reset[&1],
            Span {
                start: 50,
                end: 50,
                applied_below: 50
            }
        );
        assert_eq!(
            reset[&2],
            Span {
                start: 0,
                end: 0,
                applied_below: 0
            }
        );
        // From the start of the log.
        let earliest = spans(&marks, &BTreeMap::new(), Some(&committed));
        assert_eq!(
            earliest[&1],
            Span {
                start: 10,
                end: 50,
                applied_below: 50
            }
        );
    }
}
