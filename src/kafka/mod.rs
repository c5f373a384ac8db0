//! Kafka clients: shared client settings, the idempotent event producer
//! ([`producer`]), the topics of the event log ([`topics`]), and
//! consumer-group backlogs ([`lag`]).

pub mod lag;
pub mod log_tail;
pub mod producer;
pub mod topics;

use rdkafka::ClientConfig;

use crate::config::KafkaConfig;

/// Base librdkafka settings for every client of this deployment.
pub fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &kafka.brokers)
        .set("client.id", "imstream");
    for (k, v) in &kafka.client_properties {
        cfg.set(k, v);
    }
    cfg
}
