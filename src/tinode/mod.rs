//! The Tinode protocol's names and frames, below every layer that speaks
//! it (gateway, pipelines, realtime, send; see
//! shared/design/TINODE-PROTOCOL.md): client messages as types ([`client`]),
//! the `{ctrl}` builder and timestamps ([`wire`]), and the naming rules for
//! users and topics ([`names`]).

pub mod client;
pub mod names;
pub mod wire;

pub use client::*;
pub use names::*;
pub use wire::*;

/// The text of every answer to a failure that may pass (a database,
/// Redis, the broker): the client retries; the detail is only in the log,
/// under the request id the answer carries.
pub const UNAVAILABLE: &str = "service unavailable, retry";

/// Tinode's "delete this field" marker (U+2421), as clients send it.
pub const DEL_CHAR: &str = "\u{2421}";

#[cfg(test)]
mod tests;
