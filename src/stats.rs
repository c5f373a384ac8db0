//! Admin statistics from summary tables (seed 000 §6.6: "admin statistics
//! use daily/monthly summary tables; never COUNT(*) over all month tables").
//!
//! The `stats` pipeline keeps, per tenant database, one `im_stats_daily`
//! row per (UTC day, topic) and one `im_stats_senders` row per (day, topic,
//! sender). A row's counts are the sizes of seq sets it keeps beside them
//! (messages, edits, recalls and deletes by seq), so a redelivered or
//! replayed event changes nothing: adding a seq twice is adding it once.
//! A topic's seqs of one day are nearly contiguous, so each set is a few
//! ranges. Months are sums of their days (active senders: distinct over
//! the month's rows).

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// A set of seqs as sorted, disjoint, non-adjacent `[low, hi)` ranges,
/// written `low-last,low-last` (inclusive) in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqSet(Vec<(i64, i64)>);

impl SeqSet {
    /// Parses the table's text; `None` for anything malformed.
    pub fn parse(text: &str) -> Option<SeqSet> {
        let mut set = SeqSet::default();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (low, last) = match part.split_once('-') {
                Some((l, h)) => (l.parse().ok()?, h.parse().ok()?),
                None => {
                    let s: i64 = part.parse().ok()?;
                    (s, s)
                }
            };
            if last < low {
                return None;
            }
            set.insert(low, last + 1);
        }
        Some(set)
    }

    pub fn text(&self) -> String {
        self.0
            .iter()
            .map(|(low, hi)| {
                if hi - low == 1 {
                    low.to_string()
                } else {
                    format!("{low}-{}", hi - 1)
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Adds `[low, hi)`.
    pub fn insert(&mut self, low: i64, hi: i64) {
        if hi <= low {
            return;
        }
        let (mut low, mut hi) = (low, hi);
        // Ranges that overlap or touch [low, hi) merge into it.
        let mut kept = Vec::with_capacity(self.0.len() + 1);
        for &(l, h) in &self.0 {
            if h < low || l > hi {
                kept.push((l, h));
            } else {
                low = low.min(l);
                hi = hi.max(h);
            }
        }
        let at = kept.partition_point(|(l, _)| *l < low);
        kept.insert(at, (low, hi));
        self.0 = kept;
    }

    /// The `[low, hi)` ranges, in order.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.0
    }

    /// How many seqs it holds.
    pub fn len(&self) -> i64 {
        self.0.iter().map(|(l, h)| h - l).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The UTC day of an epoch-ms time.
pub fn day_of(ms: i64) -> NaiveDate {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .date_naive()
}

/// Counts of one day, one month or the whole range.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub messages: i64,
    pub edits: i64,
    pub recalls: i64,
    pub deletes: i64,
    pub active_senders: i64,
    /// Reports of messages to the moderators, by the day they were made.
    pub reports: i64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.messages += other.messages;
        self.edits += other.edits;
        self.recalls += other.recalls;
        self.deletes += other.deletes;
    }
}

/// What `GET /v1/admin/stats` answers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// `YYYY-MM-DD` → that day's counts (days with activity only).
    pub days: BTreeMap<String, Counts>,
    /// `YYYY-MM` → the month's counts within the range.
    pub months: BTreeMap<String, Counts>,
    pub total: Counts,
}

/// The counts of days `from..=to`, of one topic or all, from the summary
/// tables only.
pub async fn report(
    pool: &MySqlPool,
    from: NaiveDate,
    to: NaiveDate,
    topic: Option<&str>,
) -> sqlx::Result<Report> {
    let topic_filter = if topic.is_some() {
        " AND topic = ?"
    } else {
        ""
    };
    let sql = format!(
        "SELECT day, CAST(SUM(messages) AS SIGNED), CAST(SUM(edits) AS SIGNED), \
           CAST(SUM(recalls) AS SIGNED), CAST(SUM(deletes) AS SIGNED) \
         FROM im_stats_daily WHERE day BETWEEN ? AND ?{topic_filter} GROUP BY day ORDER BY day"
    );
    let mut q = sqlx::query(&sql).bind(from).bind(to);
    if let Some(t) = topic {
        q = q.bind(t);
    }
    let mut out = Report::default();
    for r in q.fetch_all(pool).await? {
        let day: NaiveDate = r.try_get(0)?;
        let counts = Counts {
            messages: r.try_get(1)?,
            edits: r.try_get(2)?,
            recalls: r.try_get(3)?,
            deletes: r.try_get(4)?,
            ..Counts::default()
        };
        out.months
            .entry(day.format("%Y-%m").to_string())
            .or_default()
            .add(&counts);
        out.total.add(&counts);
        out.days.insert(day.to_string(), counts);
    }
    // Active senders: distinct per day, per month and over the range.
    let distinct = |group: &str| {
        format!(
            "SELECT {group}, COUNT(DISTINCT uid) FROM im_stats_senders \
             WHERE day BETWEEN ? AND ?{topic_filter} GROUP BY 1"
        )
    };
    for (sql, monthly) in [
        (distinct("DATE_FORMAT(day, '%Y-%m-%d')"), false),
        (distinct("DATE_FORMAT(day, '%Y-%m')"), true),
    ] {
        let mut q = sqlx::query(&sql).bind(from).bind(to);
        if let Some(t) = topic {
            q = q.bind(t);
        }
        for r in q.fetch_all(pool).await? {
            let (key, n): (String, i64) = (r.try_get(0)?, r.try_get(1)?);
            let slot = if monthly {
                out.months.entry(key).or_default()
            } else {
                out.days.entry(key).or_default()
            };
            slot.active_senders = n;
        }
    }
    let sql = format!(
        "SELECT COUNT(DISTINCT uid) FROM im_stats_senders WHERE day BETWEEN ? AND ?{topic_filter}"
    );
    let mut q = sqlx::query_scalar(&sql).bind(from).bind(to);
    if let Some(t) = topic {
        q = q.bind(t);
    }
    out.total.active_senders = q.fetch_one(pool).await?;
    // Reports: the moderation queue holds one row per report; counted by
    // its creation time, never from the month tables.
    let sql = format!(
        "SELECT DATE_FORMAT(created_at, '%Y-%m-%d'), COUNT(*) FROM im_message_reports \
         WHERE created_at >= ? AND created_at < ?{topic_filter} GROUP BY 1"
    );
    let end = to.succ_opt().unwrap_or(to);
    let mut q = sqlx::query(&sql)
        .bind(from.and_time(chrono::NaiveTime::MIN))
        .bind(end.and_time(chrono::NaiveTime::MIN));
    if let Some(t) = topic {
        q = q.bind(t);
    }
    for r in q.fetch_all(pool).await? {
        let (day, n): (String, i64) = (r.try_get(0)?, r.try_get(1)?);
        out.months.entry(day[..7].to_string()).or_default().reports += n;
        out.days.entry(day).or_default().reports = n;
        out.total.reports += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_sets_merge_and_count_each_seq_once() {
        let mut s = SeqSet::default();
        s.insert(5, 6);
        s.insert(1, 4);
        s.insert(4, 5); // touches both neighbours: one range
        assert_eq!(s.text(), "1-5");
        s.insert(3, 4); // again: nothing new
        assert_eq!(s.len(), 5);
        s.insert(10, 11);
        s.insert(8, 9);
        assert_eq!(s.text(), "1-5,8,10");
        assert_eq!(s.len(), 7);
        s.insert(0, 20);
        assert_eq!(s.text(), "0-19");
        assert_eq!(SeqSet::parse(&s.text()), Some(s));
        assert_eq!(SeqSet::parse("1-3,7").unwrap().len(), 4);
        assert_eq!(SeqSet::parse(""), Some(SeqSet::default()));
        assert_eq!(SeqSet::parse("3-1"), None);
        assert_eq!(SeqSet::parse("x"), None);
    }

    #[test]
    fn days_are_utc() {
        assert_eq!(day_of(0).to_string(), "1970-01-01");
        assert_eq!(day_of(1_764_633_599_999).to_string(), "2025-12-01");
        assert_eq!(day_of(1_764_633_600_000).to_string(), "2025-12-02");
    }
}
