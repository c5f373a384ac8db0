//! The migration's persisted progress: the state row written (plan,
//! status, dual read, restart), each month's copy progress
//! (`im_legacy_migration_months`, migration 0022) and the batch log
//! (`im_legacy_migration_batches`). Reading the state row is the store's
//! (`crate::store::legacy::state`, which the read path uses), re-exported
//! here so the commands see one `state`.

use chrono::NaiveDateTime;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, Row, Transaction};

use crate::store::catalog::ShardStatus;
pub use crate::store::legacy::state::*;
use crate::store::month::ShardMonth;

/// Creates the state row (dual read on) or refreshes its total; never
/// moves the cursor.
pub async fn plan(pool: &MySqlPool, rows_total: i64) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO im_legacy_migration (id, status, dual_read, rows_total, planned_at, updated_at) \
         VALUES (1, 'planned', 1, ?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3)) \
         ON DUPLICATE KEY UPDATE rows_total = VALUES(rows_total), \
         dual_read = IF(status = 'cut_over', 0, 1), updated_at = UTC_TIMESTAMP(3)",
    )
    .bind(rows_total)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn set_status(pool: &MySqlPool, status: &str) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_legacy_migration SET status = ?, updated_at = UTC_TIMESTAMP(3) WHERE id = 1",
    )
    .bind(status)
    .execute(pool)
    .await?;
    Ok(())
}

/// The per-tenant dual-read switch.
pub async fn set_dual_read(pool: &MySqlPool, on: bool) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE im_legacy_migration SET dual_read = ?, updated_at = UTC_TIMESTAMP(3) WHERE id = 1",
    )
    .bind(on)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Starts the copy over from the first row (copies already there are left
/// as they are; each month's `fresh` mark stays, so they are looked for).
pub async fn restart(pool: &MySqlPool) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE im_legacy_migration SET cursor_created_at = NULL, cursor_id = NULL, rows_copied = 0, \
         rows_inserted = 0, status = 'copying', updated_at = UTC_TIMESTAMP(3) WHERE id = 1",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE im_legacy_migration_months SET cursor_created_at = NULL, cursor_id = NULL, rows_copied = 0, \
         batches = 0, done = 0, updated_at = UTC_TIMESTAMP(3)",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// One month's copy progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonthState {
    pub month: ShardMonth,
    /// Last copied `(created_at, id)` of the month; `None` before its first row.
    pub cursor: Option<Cursor>,
    /// No copy of a legacy row after this exists in the month table
    /// (`None`: no copy at all), so those rows need no look before insert.
    pub fresh_after: Option<Cursor>,
    pub rows_copied: i64,
    pub batches: i64,
    /// While bulk-loaded (catalog `loading`): the status to put back.
    pub loading_from: Option<ShardStatus>,
    /// Every legacy row of the month is copied and its indexes are built.
    pub done: bool,
}

/// Every month's progress, oldest first (none before migration 0022 or the first copy).
pub async fn months(pool: &MySqlPool) -> sqlx::Result<Vec<MonthState>> {
    let rows = match sqlx::query(
        "SELECT shard_month, cursor_created_at, cursor_id, fresh_created_at, fresh_id, rows_copied, batches, \
         loading_from, done FROM im_legacy_migration_months ORDER BY shard_month",
    )
    .fetch_all(pool)
    .await
    {
        Ok(r) => r,
        Err(e) if crate::store::legacy::table::is_missing_table(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let month: String = r.try_get(0)?;
        let loading_from: Option<String> = r.try_get(7)?;
        let cursor = |a: usize, b: usize| -> sqlx::Result<Option<Cursor>> {
            Ok(r.try_get::<Option<NaiveDateTime>, _>(a)?
                .zip(r.try_get::<Option<i64>, _>(b)?))
        };
        let (Ok(month), Ok(loading_from)) = (
            ShardMonth::parse(&month),
            loading_from.map(|s| s.parse::<ShardStatus>()).transpose(),
        ) else {
            tracing::warn!(%month, "ignoring malformed legacy month row");
            continue;
        };
        out.push(MonthState {
            month,
            cursor: cursor(1, 2)?,
            fresh_after: cursor(3, 4)?,
            rows_copied: r.try_get(5)?,
            batches: r.try_get(6)?,
            loading_from,
            done: r.try_get::<i8, _>(8)? != 0,
        });
    }
    Ok(out)
}

/// Creates a month's progress row unless it exists.
pub async fn ensure_month(
    pool: &MySqlPool,
    month: ShardMonth,
    cursor: Option<Cursor>,
    fresh_after: Option<Cursor>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO im_legacy_migration_months (shard_month, cursor_created_at, cursor_id, fresh_created_at, \
         fresh_id, updated_at) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(3)) \
         ON DUPLICATE KEY UPDATE shard_month = shard_month",
    )
    .bind(month.to_string())
    .bind(cursor.map(|c| c.0))
    .bind(cursor.map(|c| c.1))
    .bind(fresh_after.map(|c| c.0))
    .bind(fresh_after.map(|c| c.1))
    .execute(pool)
    .await?;
    Ok(())
}

/// Marks a month bulk-loaded: catalog `loading`, and the status `from` to
/// put back (unless one is recorded already), in one transaction.
pub async fn begin_loading(
    pool: &MySqlPool,
    month: ShardMonth,
    from: ShardStatus,
) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE im_legacy_migration_months SET loading_from = IFNULL(loading_from, ?), updated_at = UTC_TIMESTAMP(3) \
         WHERE shard_month = ?",
    )
    .bind(from.as_str())
    .bind(month.to_string())
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE im_group_message_shards SET status = 'loading' WHERE shard_month = ?")
        .bind(month.to_string())
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Ends a month's bulk load (its indexes are built): the catalog status
/// back to `to`, the month done, in one transaction.
pub async fn end_loading(pool: &MySqlPool, month: ShardMonth, to: ShardStatus) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE im_group_message_shards SET status = ? WHERE shard_month = ? AND status = 'loading'",
    )
    .bind(to.as_str())
    .bind(month.to_string())
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE im_legacy_migration_months SET loading_from = NULL, done = 1, updated_at = UTC_TIMESTAMP(3) \
         WHERE shard_month = ?",
    )
    .bind(month.to_string())
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// A month all of whose rows are copied (its indexes, if it was
/// bulk-loaded, built and its status put back first).
pub async fn month_done(pool: &MySqlPool, month: ShardMonth) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_legacy_migration_months SET done = 1, updated_at = UTC_TIMESTAMP(3) WHERE shard_month = ?",
    )
    .bind(month.to_string())
    .execute(pool)
    .await?;
    Ok(())
}

/// One month's part of a batch, inside the batch's transaction: the
/// month's cursor moves to `to` and its fresh mark to `fresh_after`.
pub async fn advance_month(
    tx: &mut Transaction<'_, MySql>,
    month: ShardMonth,
    to: Cursor,
    fresh_after: Cursor,
    rows: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_legacy_migration_months SET cursor_created_at = ?, cursor_id = ?, fresh_created_at = ?, \
         fresh_id = ?, rows_copied = rows_copied + ?, batches = batches + 1, updated_at = UTC_TIMESTAMP(3) \
         WHERE shard_month = ?",
    )
    .bind(to.0)
    .bind(to.1)
    .bind(fresh_after.0)
    .bind(fresh_after.1)
    .bind(rows)
    .bind(month.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The global cursor from the months in order with `(cursor, done)`:
/// the last position before which every month's rows are copied.
pub fn prefix_cursor<'a>(
    months: impl IntoIterator<Item = (Option<Cursor>, bool)> + 'a,
) -> Option<Cursor> {
    let mut out = None;
    for (cursor, done) in months {
        if cursor.is_some() {
            out = cursor;
        }
        if !done {
            break;
        }
    }
    out
}

/// Where a month's copy starts when its progress row is created: the
/// global cursor if it lies within or after the month (a copy made before
/// per-month cursors existed went that far), else the month's start.
pub fn initial_cursor(global: Option<Cursor>, month: ShardMonth) -> Option<Cursor> {
    global.filter(|(at, _)| *at >= month.start().naive_utc())
}

/// One copied batch, recorded in the batch's own transaction.
pub struct Batch<'a> {
    pub from: Option<Cursor>,
    pub to: Cursor,
    pub rows_read: i64,
    pub rows_inserted: i64,
    pub hash: &'a str,
}

/// Counts `batch` and logs it, inside the batch's transaction, and moves
/// the global cursor to `prefix` unless it is further on already (batches
/// of parallel months commit in any order).
pub async fn advance(
    tx: &mut Transaction<'_, MySql>,
    batch: &Batch<'_>,
    prefix: Option<Cursor>,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_legacy_migration SET rows_copied = rows_copied + ?, rows_inserted = rows_inserted + ?, \
         batches = batches + 1, status = 'copying', updated_at = UTC_TIMESTAMP(3) WHERE id = 1",
    )
    .bind(batch.rows_read)
    .bind(batch.rows_inserted)
    .execute(&mut **tx)
    .await?;
    raise_cursor(&mut **tx, prefix).await?;
    log(&mut **tx, batch, "ok", None).await
}

/// Moves the global cursor forward to `to` (never back).
pub async fn raise_cursor<'e, E: sqlx::MySqlExecutor<'e>>(
    executor: E,
    to: Option<Cursor>,
) -> sqlx::Result<()> {
    let Some((at, id)) = to else {
        return Ok(());
    };
    sqlx::query(
        "UPDATE im_legacy_migration SET cursor_created_at = ?, cursor_id = ? WHERE id = 1 \
         AND (cursor_created_at IS NULL OR cursor_created_at < ? OR (cursor_created_at = ? AND cursor_id < ?))",
    )
    .bind(at)
    .bind(id)
    .bind(at)
    .bind(at)
    .bind(id)
    .execute(executor)
    .await?;
    Ok(())
}

/// Logs a failed batch (its transaction was rolled back).
pub async fn failed(pool: &MySqlPool, batch: &Batch<'_>, error: &str) -> sqlx::Result<()> {
    log(pool, batch, "failed", Some(error)).await
}

async fn log<'e, E: sqlx::MySqlExecutor<'e>>(
    executor: E,
    batch: &Batch<'_>,
    status: &str,
    error: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO im_legacy_migration_batches (from_created_at, from_id, to_created_at, to_id, rows_read, \
         rows_inserted, content_hash, status, error, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(3))",
    )
    .bind(batch.from.map(|c| c.0))
    .bind(batch.from.map(|c| c.1))
    .bind(batch.to.0)
    .bind(batch.to.1)
    .bind(batch.rows_read)
    .bind(batch.rows_inserted)
    .bind(batch.hash)
    .bind(status)
    .bind(error)
    .execute(executor)
    .await?;
    Ok(())
}

/// The last `n` batches, newest first: (batch_no, rows_read, rows_inserted, status, error).
pub async fn recent_batches(
    pool: &MySqlPool,
    n: i64,
) -> sqlx::Result<Vec<(i64, i32, i32, String, Option<String>)>> {
    sqlx::query_as(
        "SELECT batch_no, rows_read, rows_inserted, status, error FROM im_legacy_migration_batches \
         ORDER BY batch_no DESC LIMIT ?",
    )
    .bind(n)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn at(day: u32, id: i64) -> Cursor {
        (
            NaiveDate::from_ymd_opt(2026, 9, day)
                .unwrap()
                .and_hms_opt(12, 0, 0)
                .unwrap(),
            id,
        )
    }

    #[test]
    fn the_global_cursor_stops_at_the_first_unfinished_month() {
        assert_eq!(prefix_cursor([]), None);
        assert_eq!(
            prefix_cursor([(None, false), (Some(at(5, 9)), false)]),
            None
        );
        assert_eq!(
            prefix_cursor([
                (Some(at(1, 1)), true),
                (Some(at(3, 7)), false),
                (Some(at(9, 20)), false)
            ]),
            Some(at(3, 7))
        );
        // A month without rows (done, no cursor) does not stop it.
        assert_eq!(
            prefix_cursor([
                (Some(at(1, 1)), true),
                (None, true),
                (Some(at(9, 20)), true)
            ]),
            Some(at(9, 20))
        );
        assert_eq!(
            prefix_cursor([
                (Some(at(1, 1)), true),
                (None, false),
                (Some(at(9, 20)), true)
            ]),
            Some(at(1, 1))
        );
    }

    #[test]
    fn a_months_first_cursor_comes_from_an_older_global_cursor() {
        let sep = ShardMonth::parse("202609").unwrap();
        assert_eq!(initial_cursor(None, sep), None);
        // Within the month: resume there.
        assert_eq!(initial_cursor(Some(at(3, 7)), sep), Some(at(3, 7)));
        // Before the month: the month starts from its first row.
        assert_eq!(initial_cursor(Some(at(3, 7)), sep.next()), None);
        // After the month: nothing of it is left.
        assert_eq!(initial_cursor(Some(at(3, 7)), sep.prev()), Some(at(3, 7)));
    }
}
