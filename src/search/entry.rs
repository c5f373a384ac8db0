//! One message's state in the index, and how events change it.
//!
//! An entry is identified by `(topic, seq)` and holds what the events said
//! about that message: that it was sent (time, sender, text), its newest
//! edit (by the edit's own seq), and whether it was recalled or deleted.
//! Merging is commutative, associative and idempotent — "sent" is set once,
//! the edit with the highest edit seq wins, "removed" is sticky — so the
//! same events in any order, delivered any number of times, give the same
//! entry (Kafka order is not seq order; redelivery and replays happen).
//! Only an entry that was sent and not removed is searchable; the others
//! stay as small documents so a late event cannot bring a message back.

use tantivy::schema::{
    Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value, FAST, INDEXED, STORED,
    STRING,
};
use tantivy::{TantivyDocument, Term};

/// The index's fields (one schema for every tenant).
#[derive(Debug, Clone, Copy)]
pub struct Fields {
    /// `topic \u{1f} seq`: the document's identity, for delete-then-add.
    pub key: Field,
    pub topic: Field,
    pub seq: Field,
    /// Send time, epoch ms (0 until the message itself was seen).
    pub ts: Field,
    /// A stable 64-bit hash of the topic: the last part of the newest-first
    /// order `(ts, seq, topic_hash)`, so ties never depend on doc ids.
    pub topic_hash: Field,
    /// The two users of a one-to-one topic (a group's members are looked up
    /// at query time instead).
    pub p2p_user: Field,
    /// The searchable text (indexed only, never stored).
    pub body: Field,
    pub from: Field,
    pub sent_text: Field,
    pub edit_seq: Field,
    pub edit_text: Field,
    /// 1 once recalled or deleted for everyone.
    pub removed: Field,
    /// 1 once the message itself (MessageSent) was seen.
    pub sent: Field,
}

impl Fields {
    pub fn schema() -> (Schema, Fields) {
        let mut b = Schema::builder();
        let body_options = TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(super::tokenizer::NAME)
                .set_index_option(IndexRecordOption::WithFreqs),
        );
        let fields = Fields {
            key: b.add_text_field("key", STRING),
            topic: b.add_text_field("topic", STRING | STORED),
            seq: b.add_i64_field("seq", INDEXED | STORED | FAST),
            ts: b.add_i64_field("ts", INDEXED | STORED | FAST),
            topic_hash: b.add_u64_field("topic_hash", FAST),
            p2p_user: b.add_i64_field("p2p_user", INDEXED),
            body: b.add_text_field("body", body_options),
            from: b.add_i64_field("from", STORED),
            sent_text: b.add_text_field("sent_text", STORED),
            edit_seq: b.add_i64_field("edit_seq", STORED),
            edit_text: b.add_text_field("edit_text", STORED),
            removed: b.add_u64_field("removed", STORED),
            sent: b.add_u64_field("sent", STORED),
        };
        (b.build(), fields)
    }

    /// The identity term of `(topic, seq)`.
    pub fn key_term(&self, topic: &str, seq: i64) -> Term {
        Term::from_field_text(self.key, &key(topic, seq))
    }
}

fn key(topic: &str, seq: i64) -> String {
    format!("{topic}\u{1f}{seq}")
}

/// FNV-1a of the topic name: stable across processes and versions (unlike
/// std's hasher), which the cursor relies on.
pub fn topic_hash(topic: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The plain text of a message's content: a JSON string, or a Drafty
/// document's `txt`; other contents (and none) have no text.
pub fn plain_text(content: Option<&str>) -> String {
    let Some(text) = content else {
        return String::new();
    };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(serde_json::Value::Object(o)) => o
            .get("txt")
            .and_then(|t| t.as_str())
            .unwrap_or_default()
            .to_string(),
        Ok(_) => String::new(),
        // Not JSON: stored as sent.
        Err(_) => text.to_string(),
    }
}

/// What one event says about one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Sent {
        ts: i64,
        from: i64,
        text: String,
    },
    /// The newest text, from the edit (a replacement message) `edit_seq`.
    Edited {
        edit_seq: i64,
        text: String,
    },
    Removed,
}

/// What was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub ts: i64,
    pub from: i64,
    pub text: String,
}

/// One message's state (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub topic: String,
    pub seq: i64,
    pub sent: Option<Sent>,
    /// (edit seq, text) of the newest edit.
    pub edit: Option<(i64, String)>,
    pub removed: bool,
}

impl Entry {
    pub fn new(topic: &str, seq: i64) -> Entry {
        Entry {
            topic: topic.to_string(),
            seq,
            sent: None,
            edit: None,
            removed: false,
        }
    }

    /// Merges one change (see the module doc for why order does not matter).
    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::Sent { ts, from, text } => {
                if self.sent.is_none() {
                    self.sent = Some(Sent {
                        ts: *ts,
                        from: *from,
                        text: text.clone(),
                    });
                }
            }
            Change::Edited { edit_seq, text } => {
                if self.edit.as_ref().is_none_or(|(s, _)| edit_seq > s) {
                    self.edit = Some((*edit_seq, text.clone()));
                }
            }
            Change::Removed => self.removed = true,
        }
        if self.removed {
            // Nothing of a removed message is kept, nor needed again.
            self.sent = self.sent.take().map(|s| Sent {
                text: String::new(),
                ..s
            });
            self.edit = None;
        }
    }

    /// The text a search matches, when the message is searchable.
    pub fn text(&self) -> Option<&str> {
        if self.removed {
            return None;
        }
        let sent = self.sent.as_ref()?;
        Some(self.edit.as_ref().map_or(sent.text.as_str(), |(_, t)| t))
    }

    pub fn to_doc(&self, f: &Fields) -> TantivyDocument {
        let mut d = TantivyDocument::new();
        d.add_text(f.key, key(&self.topic, self.seq));
        d.add_text(f.topic, &self.topic);
        d.add_i64(f.seq, self.seq);
        d.add_u64(f.topic_hash, topic_hash(&self.topic));
        d.add_u64(f.removed, self.removed as u64);
        d.add_u64(f.sent, self.sent.is_some() as u64);
        d.add_i64(f.ts, self.sent.as_ref().map_or(0, |s| s.ts));
        if let Some(s) = &self.sent {
            d.add_i64(f.from, s.from);
            d.add_text(f.sent_text, &s.text);
        }
        if let Some((edit_seq, text)) = &self.edit {
            d.add_i64(f.edit_seq, *edit_seq);
            d.add_text(f.edit_text, text);
        }
        if let Some(text) = self.text() {
            d.add_text(f.body, text);
            if let Some((a, b)) = crate::tinode::parse_p2p_topic(&self.topic) {
                d.add_i64(f.p2p_user, a);
                d.add_i64(f.p2p_user, b);
            }
        }
        d
    }

    /// The entry a stored document holds; `None` for a document this
    /// schema did not write.
    pub fn from_doc(f: &Fields, d: &TantivyDocument) -> Option<Entry> {
        let text = |field: Field| d.get_first(field).and_then(|v| v.as_str());
        let int = |field: Field| d.get_first(field).and_then(|v| v.as_i64());
        let flag = |field: Field| d.get_first(field).and_then(|v| v.as_u64()) == Some(1);
        let mut e = Entry::new(text(f.topic)?, int(f.seq)?);
        e.removed = flag(f.removed);
        if flag(f.sent) {
            e.sent = Some(Sent {
                ts: int(f.ts).unwrap_or(0),
                from: int(f.from).unwrap_or(0),
                text: text(f.sent_text).unwrap_or_default().to_string(),
            });
        }
        if let (Some(s), Some(t)) = (int(f.edit_seq), text(f.edit_text)) {
            e.edit = Some((s, t.to_string()));
        }
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(text: &str) -> Change {
        Change::Sent {
            ts: 1000,
            from: 7,
            text: text.into(),
        }
    }

    fn edited(edit_seq: i64, text: &str) -> Change {
        Change::Edited {
            edit_seq,
            text: text.into(),
        }
    }

    /// Every order of the changes (and each twice) gives the same entry.
    fn all_orders(changes: &[Change]) -> Entry {
        let mut first: Option<Entry> = None;
        let n = changes.len();
        let mut order: Vec<usize> = (0..n).collect();
        // Heap's algorithm over every permutation.
        let mut c = vec![0usize; n];
        let mut check = |order: &[usize]| {
            let mut e = Entry::new("grpX", 5);
            for i in order.iter().chain(order) {
                e.apply(&changes[*i]);
            }
            match &first {
                None => first = Some(e),
                Some(f) => assert_eq!(&e, f, "order {order:?}"),
            }
        };
        check(&order);
        let mut i = 0;
        while i < n {
            if c[i] < i {
                let j = if i % 2 == 0 { 0 } else { c[i] };
                order.swap(j, i);
                check(&order);
                c[i] += 1;
                i = 0;
            } else {
                c[i] = 0;
                i += 1;
            }
        }
        first.expect("at least one order")
    }

    #[test]
    fn the_newest_edit_wins_in_any_order() {
        let e = all_orders(&[sent("old"), edited(9, "newer"), edited(8, "new")]);
        assert_eq!(e.text(), Some("newer"));
    }

    #[test]
    fn a_removal_is_final_in_any_order() {
        let e = all_orders(&[sent("hello"), edited(9, "hi"), Change::Removed]);
        assert_eq!(e.text(), None);
        assert!(e.removed);
    }

    #[test]
    fn an_edit_alone_is_not_searchable_until_the_message_arrives() {
        let mut e = Entry::new("grpX", 5);
        e.apply(&edited(9, "new"));
        assert_eq!(e.text(), None);
        e.apply(&sent("old"));
        assert_eq!(e.text(), Some("new"));
    }

    #[test]
    fn documents_round_trip() {
        let (_, f) = Fields::schema();
        let mut e = Entry::new("grpX", 5);
        e.apply(&sent("old"));
        e.apply(&edited(9, "new"));
        let back = Entry::from_doc(&f, &e.to_doc(&f)).expect("ours");
        assert_eq!(back, e);
    }

    #[test]
    fn plain_text_of_strings_and_drafty() {
        assert_eq!(plain_text(Some(r#""hi""#)), "hi");
        assert_eq!(plain_text(Some(r#"{"txt":"你好","fmt":[]}"#)), "你好");
        assert_eq!(plain_text(Some("[1]")), "");
        assert_eq!(plain_text(None), "");
    }
}
