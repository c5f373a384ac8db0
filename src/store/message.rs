//! A stored message, the one type every floor above the store shares:
//! [`StoredMessage`] is a message as read back (month tables, the legacy
//! table, archives, hot snapshots, realtime frames); [`NewMessage`] is one
//! the store pipeline writes, with the topic and event id of its envelope.

use serde::Serialize;
use sqlx::Row;

use crate::events::MessageSent;

/// One message as read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct StoredMessage {
    pub seq: i64,
    pub from: i64,
    /// Epoch ms.
    pub ts: i64,
    /// Tinode head (JSON text), if any.
    pub head: Option<String>,
    /// Tinode content (JSON text).
    pub content: Option<String>,
    pub status: String,
    pub version: i32,
    /// Seq of the newest edit applied to a hot snapshot (edits apply in
    /// replacement order); not kept in MySQL rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_seq: Option<i64>,
    /// The message this one answers (`head.reply`, column `reply_seqid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_seq: Option<i64>,
    /// The first message of the thread it answers (`root_seqid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_seq: Option<i64>,
}

impl StoredMessage {
    /// The row a month table (or the legacy table) answers, in the column
    /// order of every history query: `seq, from, head, content, status,
    /// version, created_at, reply_seqid, root_seqid`.
    pub fn from_row(r: &sqlx::mysql::MySqlRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            seq: r.try_get(0)?,
            from: r.try_get(1)?,
            head: r.try_get(2)?,
            content: r.try_get(3)?,
            status: r.try_get(4)?,
            version: r.try_get(5)?,
            ts: r.try_get(6)?,
            edit_seq: None,
            reply_seq: r.try_get(7)?,
            root_seq: r.try_get(8)?,
        })
    }

    /// A message as it was sent (normal, first version).
    pub fn sent(m: &crate::events::MessageSent) -> Self {
        Self {
            seq: m.seq,
            from: m.from_user,
            ts: m.created_at,
            head: m.head.clone(),
            content: m.content.clone(),
            status: "normal".into(),
            version: 1,
            edit_seq: None,
            reply_seq: m.reply_seq,
            root_seq: m.root_seq,
        }
    }

    /// Not recalled or deleted for everyone.
    pub fn visible(&self) -> bool {
        self.status == "normal"
    }

    /// The seq this message replaces when it is an edit (`head.replace`).
    pub fn replaces(&self) -> Option<i64> {
        crate::tinode::replaced_seq(self.head.as_deref())
            .ok()
            .flatten()
    }
}

/// A message to store, with the topic and event id from its envelope.
#[derive(Debug, Clone)]
pub struct NewMessage<'a> {
    pub topic: &'a str,
    pub event_id: &'a str,
    pub msg: &'a MessageSent,
}
