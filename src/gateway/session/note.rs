//! `{note}`: read/recv receipts (to the receipts topic) and typing (relayed live).

use crate::events::{new_event_id, now_ms, ReceiptBody, ReceiptEvent, SeqCursor};
use crate::gateway::{personal, reads};
use crate::kafka::topics::TopicKind;
use crate::realtime::frames;
use crate::tinode;

use super::Session;

/// Minimum spacing of relayed typing notifications per session and topic.
const KP_INTERVAL_MS: i64 = 3000;

impl Session {
    /// `{note}`: recv/read go to the receipts topic (the receipts pipeline
    /// stores the cursor and relays `{info}`); kp is relayed in real time only.
    pub(super) async fn note(&mut self, note: tinode::MsgNote) {
        let topic = note.topic.as_str();
        if !self.is_attached(topic) {
            return;
        }
        let who = self.identity.clone().expect("logged in");
        if reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid)
            .await
            .is_err()
        {
            return;
        }
        match (note.what.as_str(), note.seq) {
            ("kp", None) => {
                let now = now_ms();
                let last = self.kp_at.get(topic).copied().unwrap_or(0);
                if now - last < KP_INTERVAL_MS {
                    return;
                }
                self.kp_at.insert(topic.to_string(), now);
                // Incognito hides typing too (the app says so).
                if personal::hides_presence(&self.gateway, &who.tenant, who.uid).await {
                    return;
                }
                match tinode::p2p_peer(topic, who.uid) {
                    // One-to-one: the peer knows the chat as `usr<writer>`
                    // (as the receipts projection addresses read and recv).
                    Some(peer) => {
                        let frame =
                            frames::info_frame(&tinode::user_id(who.uid), who.uid, "kp", None);
                        self.announce_to_user(&who.tenant, peer, frame).await
                    }
                    None => {
                        let frame = frames::info_frame(topic, who.uid, "kp", None);
                        self.announce(&who.tenant, topic, frame).await
                    }
                }
            }
            (what @ ("recv" | "read"), Some(seq)) if seq > 0 => {
                // Notes carry no id: the 429 names the topic only.
                if !self
                    .rate(None, topic, crate::gateway::limits::Action::Receipt)
                    .await
                {
                    return;
                }
                let keys = crate::keys::TopicKeys::new(&who.tenant, topic);
                let mut redis = self.gateway.redis.clone();
                let last: Option<i64> = redis::cmd("HGET")
                    .arg(keys.seq())
                    .arg("last_seq")
                    .query_async(&mut redis)
                    .await
                    .ok()
                    .flatten();
                if last.is_some_and(|l| seq > l) {
                    return;
                }
                // Clients note the newest message they saw; when everything
                // after it is deleted for this user, the cursor moves to the
                // end (else a trailing delete leaves an unread count that
                // can never be read away), and this session is told.
                let mut seq = seq;
                if let Some(last) = last.filter(|l| seq < *l) {
                    if self
                        .hidden_through(&who.tenant, topic, who.uid, seq, last)
                        .await
                    {
                        seq = last;
                        self.reply(frames::pres_me_seq_frame(&self.shown(topic), what, seq))
                            .await;
                    }
                }
                let cursor = SeqCursor { seq };
                let body = if what == "read" {
                    ReceiptBody::ReadReceipt(cursor)
                } else {
                    ReceiptBody::RecvReceipt(cursor)
                };
                let event = ReceiptEvent {
                    event_id: new_event_id(),
                    tenant_id: who.tenant.clone(),
                    topic: topic.to_string(),
                    occurred_at: now_ms(),
                    uid: who.uid,
                    device: who.device.clone(),
                    source_sid: self.sid.clone(),
                    source_node: self.gateway.node_id.clone(),
                    body,
                };
                let key = format!("{}:{topic}", who.tenant);
                if let Err(e) = self
                    .gateway
                    .sender
                    .producer()
                    .send(TopicKind::Receipts, &key, &event, None)
                    .await
                {
                    tracing::warn!(error = %e, "receipt not produced");
                }
            }
            _ => {}
        }
    }

    /// Whether every message after `seq` up to `last` is deleted for `uid`
    /// (for everyone or by the user).
    async fn hidden_through(
        &self,
        tenant: &str,
        topic: &str,
        uid: i64,
        seq: i64,
        last: i64,
    ) -> bool {
        match self.gateway.history.hidden(tenant, topic, uid).await {
            Ok(hidden) => hidden.range_of(seq + 1).is_some_and(|(_, hi)| hi > last),
            Err(e) => {
                tracing::warn!(error = %e, "delete log unreadable; the read cursor stays");
                false
            }
        }
    }
}
