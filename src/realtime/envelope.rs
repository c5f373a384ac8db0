//! The realtime bus envelope (seed 002 §4.1): what a pipeline or gateway
//! publishes to a node's channel. `payload` is the Tinode frame, encoded
//! once per event and forwarded to every matching session as is.

use serde::{Deserialize, Serialize};

/// Who an envelope is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetType {
    /// Sessions attached to topic `target`.
    Topic,
    /// Every session of user `target` (uid).
    User,
    /// Sessions of user/device `target` (`uid/device`).
    Device,
    /// Session `target` (sid).
    Session,
    /// Sessions subscribed to `me` whose chat list holds topic `target`
    /// and that are not attached to it (Tinode's `{pres topic="me"}`).
    Watchers,
    /// Sessions of user `uid` not attached to `topic`; `target` is
    /// `uid:topic` (a one-to-one `{pres topic="me"}`, named per user).
    UserOutside,
}

/// What the envelope does at the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Deliver `payload` to the target sessions.
    Deliver,
    /// Close the target sessions (`payload` is the reason).
    Close,
    /// Detach sessions from topic `target` (they get `{ctrl 205 evicted}`
    /// and `{pres me gone}`); `payload` is a uid to evict only that user's
    /// sessions, or empty for every session (a dissolved group).
    Evict,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub event_id: String,
    pub tenant_id: String,
    pub kind: Kind,
    pub target_type: TargetType,
    pub target: String,
    /// Session that must not get this (the sender's own, for `noecho`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub skip_sid: String,
    /// Identity of the delivered thing (e.g. `msg:{topic}:{seq}`): a
    /// gateway delivers one identity to one target once, whatever event
    /// carried it. Empty: the event id is the identity.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dedup_key: String,
    /// Epoch ms when the underlying event happened (delivery latency).
    #[serde(default)]
    pub occurred_at: i64,
    pub payload: String,
    /// Users who must not get this (removed from the group before the
    /// message was sent, whatever the members projection has applied):
    /// their sessions are skipped, and evicted from a topic target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<i64>,
}

impl Envelope {
    /// `payload` for every session of user `to`.
    pub fn to_user(event_id: String, tenant: &str, to: i64, payload: String) -> Self {
        Envelope {
            event_id,
            tenant_id: tenant.to_string(),
            kind: Kind::Deliver,
            target_type: TargetType::User,
            target: to.to_string(),
            skip_sid: String::new(),
            dedup_key: String::new(),
            occurred_at: crate::events::now_ms(),
            payload,
            exclude: Vec::new(),
        }
    }

    /// `{pres topic="me" src=usr<uid> what=…}` for every session of user
    /// `to`: `uid` came online or went offline, as `to` may see.
    pub fn presence_to(event_id: String, tenant: &str, to: i64, uid: i64, what: &str) -> Self {
        let payload = super::frames::pres_me_frame(&crate::tinode::user_id(uid), what);
        Envelope::to_user(event_id, tenant, to, payload)
    }
}

/// Pub/Sub channel of one gateway node.
pub fn node_channel(node: &str) -> String {
    format!("im:rt:node:{node}")
}

/// Channel every gateway listens to (broadcast fallback, session control).
pub const BROADCAST_CHANNEL: &str = "im:rt:all";
