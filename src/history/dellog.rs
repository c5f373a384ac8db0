//! User-view deletes (`im_dellog`, Tinode's dellog): ranges `[low, hi)` a
//! reader no longer sees — their own (`deletedfor = uid`) and everyone's
//! (`deletedfor = 0`). Applied to every read path, hot and MySQL, as one
//! merged range set per read. A user has at most `limits.dellog_per_user`
//! rows per topic (a clear beyond it is refused).

use sqlx::mysql::MySqlPool;

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
