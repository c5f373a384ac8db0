//! References to messages (seed 000 §12 item 8): reports to moderators,
//! a user's favorites and a conversation's files. Each keeps only
//! `(topic, seq)` and is resolved through the read path when read — routes,
//! month tables or the month's archive, the reader's deletes — so a
//! reference still finds its message months later, and a message taken
//! back shows as such instead of its old text.
//!
//! - [`reports`] — the moderation queue (`im_message_reports`).
//! - [`favorites`] — saved messages per user (`im_favorites`).
//! - [`files`] — which messages carry a file (`im_group_files`), and how a
//!   Drafty content says so.

pub mod favorites;
pub mod files;
pub mod reports;

use serde::Serialize;

use crate::history::{History, HistoryError};
use crate::store::message::StoredMessage;

/// What a reference points at, as its reader may see it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// The message as stored, readable.
    Ok,
    /// Taken back by its sender.
    Recalled,
    /// Deleted for everyone (by its sender, an admin or moderation).
    Deleted,
    /// Hidden from this reader (cleared from their view), or never stored.
    Gone,
    /// The reader is no longer a member of the conversation.
    NoAccess,
}

/// A reference resolved for one reader: its state and, when readable or
/// taken back, the stored row (a taken-back row has no content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub state: State,
    pub message: Option<StoredMessage>,
}

impl Resolved {
    pub fn no_access() -> Self {
        Self {
            state: State::NoAccess,
            message: None,
        }
    }
}

/// The state a stored row's status means.
pub fn state_of(m: &StoredMessage) -> State {
    match m.status.as_str() {
        "recalled" => State::Recalled,
        "deleted" => State::Deleted,
        _ => State::Ok,
    }
}

/// Resolves `(topic, seq)` for `reader` through the read path (the caller
/// has checked membership; `reader` 0 reads as an operator, with no user
/// view applied). Errors are the read path's: an unreachable database, or
/// a month that cannot be read.
pub async fn resolve(
    history: &History,
    tenant: &str,
    reader: i64,
    topic: &str,
    seq: i64,
) -> Result<Resolved, HistoryError> {
    Ok(match history.stored(tenant, topic, reader, seq).await? {
        Some(m) => Resolved {
            state: state_of(&m),
            message: Some(m),
        },
        None => Resolved {
            state: State::Gone,
            message: None,
        },
    })
}
