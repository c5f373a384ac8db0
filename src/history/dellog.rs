//! User-view deletes (`im_dellog`, Tinode's dellog): ranges `[low, hi)` a
//! reader no longer sees — their own (`deletedfor = uid`) and everyone's
//! (`deletedfor = 0`). Applied to every read path, hot and MySQL.

use sqlx::mysql::MySqlPool;

/// The ranges hidden from `reader` in `topic`.
pub async fn ranges_for(
    pool: &MySqlPool,
    topic: &str,
    reader: i64,
) -> sqlx::Result<Vec<(i64, i64)>> {
    sqlx::query_as("SELECT low, hi FROM im_dellog WHERE topic = ? AND deletedfor IN (0, ?)")
        .bind(topic)
        .bind(reader)
        .fetch_all(pool)
        .await
}

/// Whether `seq` falls in any `[low, hi)`.
pub fn covers(ranges: &[(i64, i64)], seq: i64) -> bool {
    ranges.iter().any(|(low, hi)| seq >= *low && seq < *hi)
}

#[cfg(test)]
mod tests {
    #[test]
    fn half_open_ranges() {
        let r = [(3, 5), (10, 11)];
        assert!(!super::covers(&r, 2));
        assert!(super::covers(&r, 3));
        assert!(super::covers(&r, 4));
        assert!(!super::covers(&r, 5));
        assert!(super::covers(&r, 10));
        assert!(!super::covers(&r, 11));
    }
}
