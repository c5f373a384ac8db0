//! User-view deletes (`im_dellog`, Tinode's dellog): ranges `[low, hi)` a
//! reader no longer sees — their own (`deletedfor = uid`) and everyone's
//! (`deletedfor = 0`). Applied to every read path, hot and MySQL, as one
//! merged range set per read. A user has at most `limits.dellog_per_user`
//! rows per topic (a clear beyond it is refused).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::redis_util::Redis;
use sqlx::mysql::MySqlPool;

use crate::keys::TopicKeys;

impl TopicKeys {
    /// STRING set anew after every write of the topic's dellog (by the
    /// store pipeline): a reader's cached ranges are good while it is the
    /// token they were read under.
    pub fn dellog_token(&self) -> String {
        format!("{}:dellog_token", self.base())
    }
}

/// How long a token lives (a topic whose deletes are older is read from
/// MySQL once, then cached again).
const TOKEN_TTL_SECS: u64 = 7 * 24 * 3600;
/// A cached entry is never used when older than this, token or not.
const CACHE_MAX_AGE: Duration = Duration::from_secs(10);
/// Entries kept; the cache is emptied when it grows past this.
const CACHE_MAX_ENTRIES: usize = 100_000;

/// Marks `topic`'s dellog as changed; called after every committed write.
pub async fn changed(redis: &mut Redis, tenant: &str, topic: &str) -> redis::RedisResult<()> {
    redis::cmd("SET")
        .arg(TopicKeys::new(tenant, topic).dellog_token())
        .arg(crate::events::new_event_id())
        .arg("EX")
        .arg(TOKEN_TTL_SECS)
        .query_async(redis)
        .await
}

/// Readers' hidden ranges kept in the process between their reads: one
/// Redis GET of the topic's token instead of a MySQL query per page.
#[derive(Default)]
pub struct Cache {
    /// (tenant, reader) → topic → entry.
    entries: Mutex<HashMap<(String, i64), HashMap<String, Entry>>>,
    /// Entries inserted since the cache was last emptied (an upper bound
    /// of its size).
    count: std::sync::atomic::AtomicUsize,
}

struct Entry {
    token: Option<String>,
    at: Instant,
    hidden: Hidden,
}

impl Cache {
    /// [`ranges_for`], from the cache while the topic's token is the one
    /// the entry was read under. Without Redis it reads MySQL every time.
    pub async fn ranges_for(
        &self,
        pool: &MySqlPool,
        redis: &mut Redis,
        tenant: &str,
        topic: &str,
        reader: i64,
    ) -> sqlx::Result<Hidden> {
        let token: Option<String> = match redis::cmd("GET")
            .arg(TopicKeys::new(tenant, topic).dellog_token())
            .query_async(redis)
            .await
        {
            Ok(t) => t,
            Err(_) => return ranges_for(pool, topic, reader).await,
        };
        if let Some(hidden) = self.cached(tenant, topic, reader, token.as_deref()) {
            return Ok(hidden);
        }
        // Read after the token: a write between the two leaves a newer
        // token behind, so this entry is not used again.
        let hidden = ranges_for(pool, topic, reader).await?;
        self.insert(tenant, topic, reader, token, hidden.clone());
        Ok(hidden)
    }

    /// The entry read under `token` (the topic's current token, read by
    /// the caller), if it is still young enough.
    pub fn cached(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        token: Option<&str>,
    ) -> Option<Hidden> {
        self.cached_many(tenant, reader, &[(topic, token)])
            .pop()
            .flatten()
    }

    /// [`Cache::cached`] for several topics of one reader, under one lock.
    pub fn cached_many(
        &self,
        tenant: &str,
        reader: i64,
        topics: &[(&str, Option<&str>)],
    ) -> Vec<Option<Hidden>> {
        let entries = self.entries.lock().expect("dellog cache");
        let Some(of_reader) = entries.get(&(tenant.to_string(), reader)) else {
            return vec![None; topics.len()];
        };
        topics
            .iter()
            .map(|(topic, token)| {
                let e = of_reader.get(*topic)?;
                (e.token.as_deref() == *token && e.at.elapsed() < CACHE_MAX_AGE)
                    .then(|| e.hidden.clone())
            })
            .collect()
    }

    /// Keeps `hidden`, read from MySQL after the caller read `token`.
    pub fn insert(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        token: Option<String>,
        hidden: Hidden,
    ) {
        let mut entries = self.entries.lock().expect("dellog cache");
        let count = self
            .count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if count >= CACHE_MAX_ENTRIES {
            entries.clear();
            self.count.store(1, std::sync::atomic::Ordering::Relaxed);
        }
        entries
            .entry((tenant.to_string(), reader))
            .or_default()
            .insert(
                topic.to_string(),
                Entry {
                    token,
                    at: Instant::now(),
                    hidden,
                },
            );
    }
}

/// The ranges hidden from `reader` in `topic`, merged (see [`Hidden`]).
pub async fn ranges_for(pool: &MySqlPool, topic: &str, reader: i64) -> sqlx::Result<Hidden> {
    let rows: Vec<(i64, i64)> =
        sqlx::query_as("SELECT low, hi FROM im_dellog WHERE topic = ? AND deletedfor IN (0, ?)")
            .bind(topic)
            .bind(reader)
            .fetch_all(pool)
            .await?;
    Ok(Hidden::new(rows))
}

/// How many user-view delete rows `uid` has in `topic` (bounded by
/// `limits.dellog_per_user`).
pub async fn own_rows(pool: &MySqlPool, topic: &str, uid: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT COUNT(*) FROM im_dellog WHERE topic = ? AND deletedfor = ?")
        .bind(topic)
        .bind(uid)
        .fetch_one(pool)
        .await
}

/// A set of hidden `[low, hi)` ranges, sorted and merged once (n log n), so
/// each message is checked by binary search instead of against every row.
#[derive(Debug, Clone, Default)]
pub struct Hidden(Vec<(i64, i64)>);

impl Hidden {
    pub fn new(mut rows: Vec<(i64, i64)>) -> Self {
        rows.retain(|(low, hi)| low < hi);
        rows.sort_unstable();
        let mut merged: Vec<(i64, i64)> = Vec::with_capacity(rows.len());
        for (low, hi) in rows {
            match merged.last_mut() {
                Some(last) if low <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((low, hi)),
            }
        }
        Self(merged)
    }

    /// The merged ranges, in order.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `seq` falls in any range.
    pub fn covers(&self, seq: i64) -> bool {
        self.range_of(seq).is_some()
    }

    /// The merged range holding `seq`, if any.
    pub fn range_of(&self, seq: i64) -> Option<(i64, i64)> {
        let i = self.0.partition_point(|(low, _)| *low <= seq);
        (i > 0 && seq < self.0[i - 1].1).then(|| self.0[i - 1])
    }
}

/// Whether `seq` falls in any hidden range.
pub fn covers(ranges: &Hidden, seq: i64) -> bool {
    ranges.covers(seq)
}

#[cfg(test)]
mod tests {
    use super::Hidden;

    #[test]
    fn half_open_ranges() {
        let r = Hidden::new(vec![(10, 11), (3, 5)]);
        assert!(!r.covers(2));
        assert!(r.covers(3));
        assert!(r.covers(4));
        assert!(!r.covers(5));
        assert!(r.covers(10));
        assert!(!r.covers(11));
    }

    #[test]
    fn overlapping_ranges_merge() {
        let r = Hidden::new(vec![(1, 4), (3, 8), (8, 9), (20, 30), (21, 22), (5, 5)]);
        assert_eq!(r.0, vec![(1, 9), (20, 30)]);
        assert!(r.covers(8));
        assert!(!r.covers(9));
        assert!(r.covers(29));
        assert!(!r.covers(30));
    }
}
