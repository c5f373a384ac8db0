//! When a `sealing` month may become `sealed` (seed 000 §10): its sealing
//! period (`shards.sealing_days` after the month's end, for late messages)
//! is over, the store pipeline has committed every group event (no consumer
//! lag on the group-events topic), and no store dead letter of that tenant
//! and month waits for a replay.
//!
//! "Waits for a replay" means: in the store DLQ after the offset committed
//! by the replay group (`<prefix>.store.dlq-replay`). A replayed record that
//! failed again was appended anew, so it still counts. A dead letter that
//! cannot be decoded has no known month: it holds every month of the tenant
//! its key names (nothing is sealed past a record nobody can place).

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::Config;
use crate::events::{EventCodec, GroupEvent, GroupEventBody};
use crate::kafka::lag::{self, PartitionBacklog};

use super::month::ShardMonth;

/// How long reading the pending part of the store DLQ may take.
const DLQ_SCAN_DEADLINE: Duration = Duration::from_secs(30);

/// Why a month stays `sealing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Late messages may still arrive until `until`.
    SealingPeriod { until: DateTime<Utc> },
    /// The store pipeline has not committed this many group events yet.
    StoreLag { records: i64 },
    /// This many store dead letters of the tenant and month wait for a replay.
    DeadLetters { records: usize },
    /// The store pipeline's backlog could not be read (Kafka down): nothing
    /// is sealed blind.
    Unchecked { reason: String },
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hold::SealingPeriod { until } => {
                write!(f, "sealing period until {}", until.to_rfc3339())
            }
            Hold::StoreLag { records } => {
                write!(f, "store pipeline lags {records} group event(s)")
            }
            Hold::DeadLetters { records } => {
                write!(f, "{records} store dead letter(s) wait for a replay")
            }
            Hold::Unchecked { reason } => write!(f, "store backlog unknown: {reason}"),
        }
    }
}

/// One pending store dead letter, placed by tenant and month where known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub tenant: Option<String>,
    /// `None` when the record could not be decoded.
    pub month: Option<ShardMonth>,
}

/// The store pipeline's state, read once per shard-manager pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreBacklog {
    /// Group events the store pipeline has not committed.
    pub lag: i64,
    /// Store dead letters after the replay group's committed offset.
    pub dead_letters: Vec<DeadLetter>,
}

impl StoreBacklog {
    /// What keeps `month` of `tenant` from being sealed at `now`; empty when
    /// it may be sealed.
    pub fn holds(
        &self,
        tenant: &str,
        month: ShardMonth,
        now: DateTime<Utc>,
        sealing_days: u32,
    ) -> Vec<Hold> {
        let mut out = Vec::new();
        let until = month.end() + chrono::Duration::days(i64::from(sealing_days));
        if now < until {
            // Nothing else matters yet: late messages are still expected.
            out.push(Hold::SealingPeriod { until });
            return out;
        }
        if self.lag > 0 {
            out.push(Hold::StoreLag { records: self.lag });
        }
        let dead = self
            .dead_letters
            .iter()
            .filter(|d| d.tenant.as_deref().is_none_or(|t| t == tenant))
            .filter(|d| d.month.is_none_or(|m| m == month))
            .count();
        if dead > 0 {
            out.push(Hold::DeadLetters { records: dead });
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("{0}")]
    Scan(#[from] lag::ScanError),
    #[error("{0}")]
    Pipeline(String),
}

/// Reads the store pipeline's lag and pending dead letters.
pub struct SealGate {
    config: Config,
    codec: EventCodec,
    topics: StoreTopics,
}

/// Where the store pipeline reads, commits and parks dead letters (named by
/// its topology; the caller resolves them, the store does not know pipelines).
#[derive(Debug, Clone)]
pub struct StoreTopics {
    /// The group-events topic.
    pub source: String,
    /// The store pipeline's consumer group.
    pub group: String,
    /// The store pipeline's DLQ.
    pub dlq: String,
    /// The group that replays the DLQ.
    pub replay_group: String,
}

impl SealGate {
    /// No I/O.
    pub fn new(config: &Config, topics: StoreTopics) -> Result<Self, SealError> {
        let codec = EventCodec::new(&config.registry.url)
            .map_err(|e| SealError::Pipeline(e.to_string()))?;
        Ok(Self {
            config: config.clone(),
            codec,
            topics,
        })
    }

    /// The store pipeline's lag and every pending store dead letter now.
    pub async fn observe(&self) -> Result<StoreBacklog, SealError> {
        let (kafka, topics) = (self.config.kafka.clone(), self.topics.clone());
        let (events, records) = tokio::task::spawn_blocking(move || {
            let events: Vec<PartitionBacklog> =
                lag::backlog(&kafka, &topics.source, &topics.group)?;
            let pending = lag::backlog(&kafka, &topics.dlq, &topics.replay_group)?;
            let records = lag::read_backlog(&kafka, &topics.dlq, &pending, DLQ_SCAN_DEADLINE)?;
            Ok::<_, SealError>((events, records))
        })
        .await
        .map_err(|e| SealError::Pipeline(e.to_string()))??;
        let mut dead_letters = Vec::with_capacity(records.len());
        for r in records {
            dead_letters.extend(self.place(r.key.as_deref(), r.payload.as_deref()).await);
        }
        Ok(StoreBacklog {
            lag: lag::total_lag(&events),
            dead_letters,
        })
    }

    /// The tenant and month of one dead letter, as far as it can be told;
    /// `None` for events not bound to a month (dellog ranges), which hold
    /// nothing.
    async fn place(&self, key: Option<&[u8]>, payload: Option<&[u8]>) -> Option<DeadLetter> {
        match self.codec.decode::<GroupEvent>(payload).await {
            Ok(GroupEvent {
                tenant_id,
                body: GroupEventBody::MessageSent(m),
                ..
            }) => Some(DeadLetter {
                tenant: Some(tenant_id),
                // A month that does not parse is no month of the catalog.
                month: Some(ShardMonth::parse(&m.shard_month).ok()?),
            }),
            Ok(_) => None,
            Err(_) => Some(DeadLetter {
                tenant: key
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(|k| k.split_once(':'))
                    .map(|(tenant, _)| tenant.to_string()),
                month: None,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn sep() -> ShardMonth {
        ShardMonth::parse("202609").unwrap()
    }

    #[test]
    fn the_sealing_period_comes_first() {
        let backlog = StoreBacklog {
            lag: 5,
            dead_letters: vec![],
        };
        assert_eq!(
            backlog.holds("t", sep(), at("2026-10-07T23:59:59Z"), 7),
            vec![Hold::SealingPeriod {
                until: at("2026-10-08T00:00:00Z")
            }]
        );
        assert_eq!(
            backlog.holds("t", sep(), at("2026-10-08T00:00:00Z"), 7),
            vec![Hold::StoreLag { records: 5 }]
        );
    }

    #[test]
    fn dead_letters_hold_only_their_tenant_and_month() {
        let oct = ShardMonth::parse("202610").unwrap();
        let backlog = StoreBacklog {
            lag: 0,
            dead_letters: vec![
                DeadLetter {
                    tenant: Some("a".into()),
                    month: Some(sep()),
                },
                DeadLetter {
                    tenant: Some("b".into()),
                    month: Some(oct),
                },
                DeadLetter {
                    tenant: Some("c".into()),
                    month: None,
                },
            ],
        };
        let now = at("2027-01-01T00:00:00Z");
        assert_eq!(
            backlog.holds("a", sep(), now, 7),
            vec![Hold::DeadLetters { records: 1 }]
        );
        assert!(backlog.holds("a", oct, now, 7).is_empty());
        assert!(backlog.holds("b", sep(), now, 7).is_empty());
        // Undecodable: every month of its tenant.
        assert_eq!(
            backlog.holds("c", oct, now, 7),
            vec![Hold::DeadLetters { records: 1 }]
        );
    }
}
