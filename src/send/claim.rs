//! The idempotency claim of a client message id (`TopicKeys::uniq`): the
//! text `lua/allocate_seq.lua` stores under it, pending until the event is
//! in the log and done after, with the digest that tells a retry from a
//! different message under the same id; and the ids derived from it.

use super::SendRequest;

/// What a claim fixes for good about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    pub(super) seq: i64,
    pub(super) month: String,
    pub(super) message_id: i64,
    pub(super) event_id: String,
    pub(super) created_at: i64,
}

/// A parsed claim: `status|seq|month|message_id|event_id|created_at|digest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    pub(super) done: bool,
    pub(super) identity: Identity,
    pub(super) digest: String,
}

impl Claim {
    pub(super) fn parse(text: &str) -> Option<Claim> {
        let mut parts = text.split('|');
        let status = parts.next()?;
        let seq = parts.next()?.parse().ok()?;
        let month = parts.next()?.to_string();
        let message_id = parts.next()?.parse().ok()?;
        let event_id = parts.next()?.to_string();
        let created_at = parts.next()?.parse().ok()?;
        let digest = parts.next()?.to_string();
        if parts.next().is_some() || event_id.is_empty() {
            return None;
        }
        Some(Claim {
            done: match status {
                "done" => true,
                "pending" => false,
                _ => return None,
            },
            identity: Identity {
                seq,
                month,
                message_id,
                event_id,
                created_at,
            },
            digest,
        })
    }

    pub(super) fn text(&self) -> String {
        let i = &self.identity;
        format!(
            "{}|{}|{}|{}|{}|{}|{}",
            if self.done { "done" } else { "pending" },
            i.seq,
            i.month,
            i.message_id,
            i.event_id,
            i.created_at,
            self.digest
        )
    }
}

/// What makes two sends with one client message id the same message.
pub(super) fn digest(req: &SendRequest) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(req.content.as_bytes());
    h.update([0]);
    h.update(req.head.as_deref().unwrap_or("").as_bytes());
    h.update([0]);
    h.update(req.edit_of.map(|s| s.to_string()).unwrap_or_default());
    let hash = h.finalize();
    hash[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The id of the `MessageEdited` that follows an edit's `MessageSent`:
/// derived from the replacement's event id, so a re-produced edit is the
/// same event too.
pub(super) fn edit_event_id(sent_event_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(format!("{sent_event_id}:edit").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}
