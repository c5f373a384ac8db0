//! The event contract: Avro schemas (`schemas/*.avsc`), their Rust types
//! ([`model`]), and the Confluent wire-format codec ([`codec`]).
//! Registering them is the registry client's (`crate::registry::client`).

pub mod codec;
pub mod decoded;
pub mod model;

pub use codec::{CodecError, EventCodec};
pub use model::*;

/// Milliseconds since the Unix epoch, UTC.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A new unique event id (UUIDv7: time-ordered).
pub fn new_event_id() -> String {
    uuid::Uuid::now_v7().to_string()
}
