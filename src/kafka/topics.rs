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
    let admin = admin_client(&config.kafka)?;
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
