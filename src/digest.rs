//! Per-topic summaries of a projection, for replay and legacy-migration
//! verification: message count, min/max seq and a content hash.
//!
//! The hash is SHA-256 over the SHA-256 of each row's
//! `seq|from|content|status|version`, taken in seq order — so two
//! projections hash alike exactly when they hold the same messages with the
//! same contents, whatever the physical order (months, Redis keys) they were
//! read in.

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

/// Count, seq range and content hash of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub count: i64,
    pub min_seq: i64,
    pub max_seq: i64,
    /// Hex SHA-256 (see the module doc).
    pub hash: String,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "count={} seq={}..{} hash={}",
            self.count,
            self.min_seq,
            self.max_seq,
            &self.hash[..16.min(self.hash.len())]
        )
    }
}

/// The digest of one row.
pub fn row_digest(
    seq: i64,
    from: i64,
    content: Option<&str>,
    status: &str,
    version: i64,
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(format!("{seq}|{from}|").as_bytes());
    h.update(content.unwrap_or("").as_bytes());
    h.update(format!("|{status}|{version}").as_bytes());
    h.finalize().into()
}

/// Rows of many topics, fed in any order; summarised per topic.
#[derive(Debug, Default)]
pub struct Digests {
    rows: BTreeMap<String, Vec<(i64, [u8; 32])>>,
}

impl Digests {
    pub fn add(&mut self, topic: &str, seq: i64, digest: [u8; 32]) {
        match self.rows.get_mut(topic) {
            Some(v) => v.push((seq, digest)),
            None => {
                self.rows.insert(topic.to_string(), vec![(seq, digest)]);
            }
        }
    }

    pub fn add_row(
        &mut self,
        topic: &str,
        seq: i64,
        from: i64,
        content: Option<&str>,
        status: &str,
        version: i64,
    ) {
        self.add(topic, seq, row_digest(seq, from, content, status, version));
    }

    /// Topic → summary, topics in name order.
    pub fn finish(self) -> BTreeMap<String, Summary> {
        self.rows
            .into_iter()
            .map(|(topic, mut rows)| {
                rows.sort_by_key(|(seq, _)| *seq);
                let mut h = Sha256::new();
                for (_, d) in &rows {
                    h.update(d);
                }
                let summary = Summary {
                    count: rows.len() as i64,
                    min_seq: rows.first().map_or(0, |r| r.0),
                    max_seq: rows.last().map_or(0, |r| r.0),
                    hash: hex::encode(h.finalize()),
                };
                (topic, summary)
            })
            .collect()
    }
}

/// How a topic compares between the projection that is replaced (or the
/// source) and the rebuilt one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Identical,
    /// Only in the rebuilt projection (the old one was empty or lost).
    Restored,
    /// Only in the old projection: the rebuild lacks it.
    Missing,
    Changed,
}

impl Verdict {
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::Restored => "restored",
            Verdict::Missing => "MISSING",
            Verdict::Changed => "CHANGED",
        }
    }
}

/// One topic of a comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicCheck {
    pub topic: String,
    pub before: Option<Summary>,
    pub after: Option<Summary>,
    pub verdict: Verdict,
}

/// Compares two per-topic summaries.
pub fn compare(
    before: &BTreeMap<String, Summary>,
    after: &BTreeMap<String, Summary>,
) -> Vec<TopicCheck> {
    let mut topics: Vec<&String> = before.keys().chain(after.keys()).collect();
    topics.sort();
    topics.dedup();
    topics
        .into_iter()
        .map(|t| {
            let (b, a) = (before.get(t).cloned(), after.get(t).cloned());
            let verdict = match (&b, &a) {
                (Some(b), Some(a)) if b == a => Verdict::Identical,
                (Some(_), Some(_)) => Verdict::Changed,
                (None, _) => Verdict::Restored,
                (Some(_), None) => Verdict::Missing,
            };
            TopicCheck {
                topic: t.clone(),
                before: b,
                after: a,
                verdict,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_of_rows_does_not_matter_but_content_does() {
        let mut a = Digests::default();
        a.add_row("t", 2, 7, Some("{\"txt\":\"b\"}"), "normal", 1);
        a.add_row("t", 1, 7, Some("{\"txt\":\"a\"}"), "normal", 1);
        let mut b = Digests::default();
        b.add_row("t", 1, 7, Some("{\"txt\":\"a\"}"), "normal", 1);
        b.add_row("t", 2, 7, Some("{\"txt\":\"b\"}"), "normal", 1);
        let (a, b) = (a.finish(), b.finish());
        assert_eq!(a, b);
        assert_eq!((a["t"].count, a["t"].min_seq, a["t"].max_seq), (2, 1, 2));
        let mut c = Digests::default();
        c.add_row("t", 1, 7, Some("{\"txt\":\"a\"}"), "normal", 1);
        c.add_row("t", 2, 7, Some("{\"txt\":\"B\"}"), "normal", 1);
        assert_ne!(a["t"].hash, c.finish()["t"].hash);
    }

    #[test]
    fn verdicts() {
        let s = |n| Summary {
            count: n,
            min_seq: 1,
            max_seq: n,
            hash: "x".into(),
        };
        let before = BTreeMap::from([
            ("a".to_string(), s(1)),
            ("b".to_string(), s(2)),
            ("c".to_string(), s(3)),
        ]);
        let after = BTreeMap::from([
            ("a".to_string(), s(1)),
            ("b".to_string(), s(5)),
            ("d".to_string(), s(1)),
        ]);
        let v: Vec<_> = compare(&before, &after)
            .into_iter()
            .map(|c| (c.topic, c.verdict))
            .collect();
        assert_eq!(
            v,
            vec![
                ("a".into(), Verdict::Identical),
                ("b".into(), Verdict::Changed),
                ("c".into(), Verdict::Missing),
                ("d".into(), Verdict::Restored)
            ]
        );
    }
}
