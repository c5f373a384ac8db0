//! The event-log topics of ARCHITECTURE.md §2 and `imstream topics ensure`,
//! which creates them through the Kafka admin API (broker auto-creation
//! stays off).

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use crate::config::{Config, KafkaConfig, TopicSpec};

/// Pipelines that have a DLQ per source topic: `<topic>.<pipeline>.dlq`.
pub const PIPELINES_WITH_DLQ: &[(&str, TopicKind)] = &[
    ("store", TopicKind::GroupEvents),
    ("hot", TopicKind::GroupEvents),
    ("fanout", TopicKind::GroupEvents),
    ("members", TopicKind::GroupEvents),
    ("push", TopicKind::GroupEvents),
    ("receipts", TopicKind::Receipts),
    ("control", TopicKind::SessionControl),
    ("commands", TopicKind::AdminCommands),
    ("relations", TopicKind::UserEvents),
    ("notify", TopicKind::UserEvents),
    ("scan", TopicKind::UserEvents),
    ("notifications", TopicKind::GroupEvents),
    ("pushsend", TopicKind::PushTasks),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicKind {
    GroupEvents,
    Receipts,
    SessionControl,
    AdminCommands,
    AdminResults,
    UserEvents,
    PushTasks,
}

impl TopicKind {
    pub const ALL: [TopicKind; 7] = [
        TopicKind::GroupEvents,
        TopicKind::Receipts,
        TopicKind::SessionControl,
        TopicKind::AdminCommands,
        TopicKind::AdminResults,
        TopicKind::UserEvents,
        TopicKind::PushTasks,
    ];

    /// The topic's name without the deployment prefix.
    pub const fn base_name(self) -> &'static str {
        match self {
            TopicKind::GroupEvents => "im.group.events.v1",
            TopicKind::Receipts => "im.receipts.v1",
            TopicKind::SessionControl => "im.session.control.v1",
            TopicKind::AdminCommands => "im.admin.commands.v1",
            TopicKind::AdminResults => "im.admin.results.v1",
            TopicKind::UserEvents => "im.user.events.v1",
            TopicKind::PushTasks => "im.push.tasks.v1",
        }
    }

    fn spec(self, kafka: &KafkaConfig) -> &TopicSpec {
        let t = &kafka.topics;
        match self {
            TopicKind::GroupEvents => &t.group_events,
            TopicKind::Receipts => &t.receipts,
            TopicKind::SessionControl => &t.session_control,
            TopicKind::AdminCommands => &t.admin_commands,
            TopicKind::AdminResults => &t.admin_results,
            TopicKind::UserEvents => &t.user_events,
            TopicKind::PushTasks => &t.push_tasks,
        }
    }
}

/// Topic names of one deployment (the configured prefix applied).
#[derive(Debug, Clone)]
pub struct TopicNames {
    prefix: String,
}

impl TopicNames {
    pub fn new(kafka: &KafkaConfig) -> Self {
        Self {
            prefix: kafka.topic_prefix.clone(),
        }
    }

    pub fn name(&self, kind: TopicKind) -> String {
        format!("{}{}", self.prefix, kind.base_name())
    }

    /// `<topic>.<pipeline>.dlq`
    pub fn dlq(&self, kind: TopicKind, pipeline: &str) -> String {
        format!("{}.{pipeline}.dlq", self.name(kind))
    }
}

/// Every topic a deployment needs, with its partitions and retention.
pub fn desired_topics(kafka: &KafkaConfig) -> Vec<(String, TopicSpec)> {
    let names = TopicNames::new(kafka);
    let mut topics: Vec<(String, TopicSpec)> = TopicKind::ALL
        .iter()
        .map(|k| (names.name(*k), k.spec(kafka).clone()))
        .collect();
    for (pipeline, source) in PIPELINES_WITH_DLQ {
        topics.push((names.dlq(*source, pipeline), kafka.topics.dlq.clone()));
    }
    topics
}

#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    #[error("kafka admin: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("creating topic {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("{0}")]
    Unsafe(String),
}

/// Why the configured replication can lose an acknowledged message (or stop
/// taking writes) when one broker fails; `None` when it cannot, or when the
/// deployment says it runs a single broker.
pub fn replication_risk(kafka: &KafkaConfig) -> Option<String> {
    let (rf, isr) = (kafka.replication_factor, kafka.min_insync_replicas);
    if kafka.single_broker {
        return None;
    }
    if rf < 3 {
        return Some(format!(
            "kafka.replication_factor = {rf}: an acknowledged message lives on {rf} broker(s), and \
             losing {} of them loses it; use 3 (and min_insync_replicas = 2) on at least three \
             brokers, or set kafka.single_broker = true for a development stack",
            rf.max(1)
        ));
    }
    if isr < 2 {
        return Some(format!(
            "kafka.min_insync_replicas = {isr}: with acks=all a message is acknowledged once one \
             replica has it, so the failure of that one broker loses it; use 2"
        ));
    }
    if isr >= rf {
        return Some(format!(
            "kafka.min_insync_replicas = {isr} with replication_factor = {rf}: one broker down \
             stops every write; use a min_insync_replicas below the replication factor"
        ));
    }
    None
}

/// What `ensure` did for one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Existed,
}

pub fn admin_client(kafka: &KafkaConfig) -> Result<AdminClient<DefaultClientContext>, TopicsError> {
    let mut cfg = crate::kafka::client_config(kafka);
    Ok(cfg.set("socket.timeout.ms", "10000").create()?)
}

/// Creates every missing topic; existing ones are left as they are.
pub async fn ensure(config: &Config) -> Result<Vec<(String, Ensured)>, TopicsError> {
    if let Some(why) = replication_risk(&config.kafka) {
        return Err(TopicsError::Unsafe(format!(
            "refusing to create topics: {why}"
        )));
    }
    let admin = admin_client(&config.kafka)?;
    let min_isr = config.kafka.min_insync_replicas.to_string();
    let wanted = desired_topics(&config.kafka);
    let retention: Vec<String> = wanted
        .iter()
        .map(|(_, s)| s.retention_ms.to_string())
        .collect();
    let new_topics: Vec<NewTopic<'_>> = wanted
        .iter()
        .zip(&retention)
        .map(|((name, spec), retention)| {
            NewTopic::new(
                name,
                spec.partitions,
                TopicReplication::Fixed(config.kafka.replication_factor),
            )
            .set("retention.ms", retention)
            .set("cleanup.policy", "delete")
            .set("min.insync.replicas", &min_isr)
            // A replica that missed acknowledged writes never becomes leader.
            .set("unclean.leader.election.enable", "false")
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(&new_topics, &opts).await?;
    let mut out = Vec::new();
    for result in results {
        match result {
            Ok(name) => out.push((name, Ensured::Created)),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => out.push((name, Ensured::Existed)),
            Err((topic, code)) => return Err(TopicsError::Create { topic, code }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replication_that_can_lose_an_acked_message_is_refused_with_the_reason() {
        let kafka = |rf: i32, isr: i32, single: bool| KafkaConfig {
            replication_factor: rf,
            min_insync_replicas: isr,
            single_broker: single,
            ..KafkaConfig::default()
        };
        assert_eq!(
            replication_risk(&KafkaConfig::default()),
            None,
            "3 / 2 is the default"
        );
        assert_eq!(replication_risk(&kafka(5, 3, false)), None);
        assert!(replication_risk(&kafka(1, 1, false))
            .unwrap()
            .contains("replication_factor = 1"));
        assert!(replication_risk(&kafka(2, 1, false))
            .unwrap()
            .contains("replication_factor = 2"));
        assert!(replication_risk(&kafka(3, 1, false))
            .unwrap()
            .contains("min_insync_replicas = 1"));
        assert!(replication_risk(&kafka(3, 3, false))
            .unwrap()
            .contains("stops every write"));
        assert_eq!(
            replication_risk(&kafka(1, 1, true)),
            None,
            "a development stack says so"
        );
    }

    #[test]
    fn names_and_dlqs() {
        let mut kafka = KafkaConfig::default();
        kafka.topic_prefix = "t1.".into();
        let names = TopicNames::new(&kafka);
        assert_eq!(names.name(TopicKind::GroupEvents), "t1.im.group.events.v1");
        assert_eq!(
            names.dlq(TopicKind::GroupEvents, "store"),
            "t1.im.group.events.v1.store.dlq"
        );
        let all = desired_topics(&kafka);
        assert_eq!(all.len(), TopicKind::ALL.len() + PIPELINES_WITH_DLQ.len());
        let events = all
            .iter()
            .find(|(n, _)| n == "t1.im.group.events.v1")
            .unwrap();
        assert_eq!(
            events.1.retention_ms, -1,
            "the event store keeps events forever"
        );
    }
}
