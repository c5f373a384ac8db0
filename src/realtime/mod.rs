//! Realtime delivery across gateway pods (seed 002, ARCHITECTURE.md §6):
//! the bus envelope ([`envelope`]), presence in Redis ([`presence`]), the
//! gateway's local sessions ([`hub`]) and the Pub/Sub subscriber ([`bus`]).

pub mod bus;
pub mod envelope;
pub mod frames;
pub mod hub;
pub mod presence;

pub use envelope::{Envelope, Kind, TargetType};
