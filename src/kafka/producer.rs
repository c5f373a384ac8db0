//! The event producer: `acks=all`, idempotence on, Avro values in the
//! Confluent wire format, keys `{tenant}:{topic}` (or `{tenant}:{uid}`),
//! trace context in a `traceparent` header.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use crate::config::KafkaConfig;
use crate::events::{CodecError, Event, EventCodec};

use super::topics::{TopicKind, TopicNames};

#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("encoding {kind} event: {source}")]
    Encode {
        kind: &'static str,
        source: CodecError,
    },
    #[error("kafka did not acknowledge the event: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

impl ProduceError {
    /// Every produce failure is worth retrying except a record that does
    /// not fit its schema.
    pub fn is_retryable(&self) -> bool {
        match self {
            ProduceError::Encode { source, .. } => source.is_retryable(),
            ProduceError::Kafka(_) => true,
        }
    }
}

/// A produce is acknowledged or failed within this (`message.timeout.ms`).
pub const MESSAGE_TIMEOUT_MS: u64 = 10_000;
/// A send that allocated a seq acks or fails within this window (the
/// producer's [`MESSAGE_TIMEOUT_MS`] plus slack): what a re-seed after lost
/// Redis state, and a group model rebuilt after it, wait out.
pub const IN_FLIGHT_WINDOW_MS: i64 = MESSAGE_TIMEOUT_MS as i64 + 1_000;

/// Where an acknowledged event landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    pub partition: i32,
    pub offset: i64,
}

#[derive(Clone)]
pub struct EventProducer {
    producer: std::sync::Arc<FutureProducer>,
    codec: EventCodec,
    names: TopicNames,
}

impl EventProducer {
    /// The process's producer for `kafka` (no I/O until the first send).
    /// Every pipeline, the gateway and the commands of one process share
    /// one librdkafka producer: each has a polling thread that costs CPU
    /// even when idle (about 1 % of a core each), and one producer batches
    /// better than twelve. It lives while any `EventProducer` holds it.
    pub fn new(kafka: &KafkaConfig, codec: EventCodec) -> Result<Self, rdkafka::error::KafkaError> {
        static SHARED: std::sync::Mutex<Vec<(String, std::sync::Weak<FutureProducer>)>> =
            std::sync::Mutex::new(Vec::new());
        let key = format!("{kafka:?}");
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        shared.retain(|(_, w)| w.strong_count() > 0);
        let existing = shared
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade());
        let producer = match existing {
            Some(p) => p,
            None => {
                let p = std::sync::Arc::new(Self::create(kafka)?);
                shared.push((key, std::sync::Arc::downgrade(&p)));
                p
            }
        };
        Ok(Self {
            producer,
            codec,
            names: TopicNames::new(kafka),
        })
    }

    fn create(kafka: &KafkaConfig) -> Result<FutureProducer, rdkafka::error::KafkaError> {
        super::client_config(kafka)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("max.in.flight.requests.per.connection", "5")
            // Small batches: the send path waits for the ack.
            .set("linger.ms", "1")
            .set("compression.type", "lz4")
            // A send gives up (and the client gets a retryable error) after this.
            .set("message.timeout.ms", MESSAGE_TIMEOUT_MS.to_string())
            .create()
    }

    pub fn names(&self) -> &TopicNames {
        &self.names
    }

    pub fn codec(&self) -> &EventCodec {
        &self.codec
    }

    /// Encodes and sends `event` to the topic of `kind`, waiting for the
    /// broker's acknowledgement.
    pub async fn send<E: Event>(
        &self,
        kind: TopicKind,
        key: &str,
        event: &E,
        traceparent: Option<&str>,
    ) -> Result<Acked, ProduceError> {
        let topic = self.names.name(kind);
        self.send_to(&topic, key, event, traceparent).await
    }

    /// Like [`send`](Self::send), to an explicit topic name (DLQs).
    pub async fn send_to<E: Event>(
        &self,
        topic: &str,
        key: &str,
        event: &E,
        traceparent: Option<&str>,
    ) -> Result<Acked, ProduceError> {
        let payload =
            self.codec
                .encode(topic, event)
                .await
                .map_err(|source| ProduceError::Encode {
                    kind: E::KIND,
                    source,
                })?;
        self.send_raw(topic, key, &payload, traceparent).await
    }

    /// Sends an already-encoded value with a `traceparent` header.
    pub async fn send_raw(
        &self,
        topic: &str,
        key: &str,
        payload: &[u8],
        traceparent: Option<&str>,
    ) -> Result<Acked, ProduceError> {
        let headers: Vec<(&str, &[u8])> = traceparent
            .filter(|t| !t.is_empty())
            .map(|t| vec![("traceparent", t.as_bytes())])
            .unwrap_or_default();
        self.send_bytes(topic, key.as_bytes(), payload, &headers)
            .await
    }

    /// Sends raw bytes with arbitrary headers (a DLQ copy keeps the original
    /// key and value and adds why it failed).
    pub async fn send_bytes(
        &self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
        headers: &[(&str, &[u8])],
    ) -> Result<Acked, ProduceError> {
        let mut record = FutureRecord::to(topic).key(key).payload(payload);
        if !headers.is_empty() {
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in headers {
                owned = owned.insert(Header {
                    key: k,
                    value: Some(*v),
                });
            }
            record = record.headers(owned);
        }
        let delivery = self
            .producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| ProduceError::Kafka(e))?;
        metrics::counter!(crate::metrics::EVENTS_PRODUCED_TOTAL, "topic" => topic_label(topic))
            .increment(1);
        Ok(Acked {
            partition: delivery.partition,
            offset: delivery.offset,
        })
    }

    /// Waits for every in-flight send (on shutdown).
    pub fn flush(&self, timeout: Duration) {
        let _ = self.producer.flush(timeout);
    }
}

/// A bounded metric label: the topic's base name without any prefix.
fn topic_label(topic: &str) -> String {
    for kind in TopicKind::ALL {
        if topic.ends_with(kind.base_name()) {
            return kind.base_name().to_string();
        }
    }
    if topic.ends_with(".dlq") {
        return "dlq".into();
    }
    "other".into()
}
