//! Kafka clients: shared client settings, the idempotent event producer
//! ([`producer`]), the topics of the event log ([`topics`]), and
//! consumer-group backlogs ([`lag`]).

pub mod lag;
pub mod log_tail;
pub mod producer;
pub mod topics;

use std::sync::atomic::{AtomicU64, Ordering};

use rdkafka::ClientConfig;

use crate::config::KafkaConfig;

static CLIENTS_CONFIGURED: AtomicU64 = AtomicU64::new(0);

/// Kafka clients this process has configured so far (every client starts
/// from [`client_config`]): a request path that makes one pays a broker
/// connection and its threads, which the adversarial suite refuses for any
/// refused request.
pub fn clients_configured() -> u64 {
    CLIENTS_CONFIGURED.load(Ordering::Relaxed)
}

/// Base librdkafka settings for every client of this deployment.
pub fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    CLIENTS_CONFIGURED.fetch_add(1, Ordering::Relaxed);
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &kafka.brokers)
        .set("client.id", "imstream");
    for (k, v) in &kafka.client_properties {
        cfg.set(k, v);
    }
    cfg
}
