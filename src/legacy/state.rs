//! The migration's persisted state (`im_legacy_migration`, one row per
//! tenant database): status, the per-tenant dual-read switch, the copy
//! cursor and counters; and the batch log (`im_legacy_migration_batches`).

use chrono::NaiveDateTime;
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, Row, Transaction};

/// planned → copying → copied → verified → cut_over.
pub const PLANNED: &str = "planned";
pub const COPYING: &str = "copying";
pub const COPIED: &str = "copied";
pub const VERIFIED: &str = "verified";
pub const CUT_OVER: &str = "cut_over";

/// The state row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    pub status: String,
    pub dual_read: bool,
    /// Last copied `(created_at, id)`; `None` before the first batch.
    pub cursor: Option<(NaiveDateTime, i64)>,
    pub rows_total: i64,
    pub rows_copied: i64,
    pub rows_inserted: i64,
    pub batches: i64,
}

/// The state row, if `plan` ran; `None` also when the migration that
/// creates the table is not applied.
pub async fn load(pool: &MySqlPool) -> sqlx::Result<Option<State>> {
    let row = match sqlx::query(
        "SELECT status, dual_read, cursor_created_at, cursor_id, rows_total, rows_copied, rows_inserted, batches \
         FROM im_legacy_migration WHERE id = 1",
    )
    .fetch_optional(pool)
    .await
    {
        Ok(r) => r,
        Err(e) if super::table::is_missing_table(&e) => None,
        Err(e) => return Err(e),
    };
    row.map(|r| {
        let at: Option<NaiveDateTime> = r.try_get(2)?;
        let id: Option<i64> = r.try_get(3)?;
        Ok(State {
            status: r.try_get(0)?,
            dual_read: r.try_get::<i8, _>(1)? != 0,
            cursor: at.zip(id),
            rows_total: r.try_get(4)?,
            rows_copied: r.try_get(5)?,
            rows_inserted: r.try_get(6)?,
            batches: r.try_get(7)?,
        })
    })
    .transpose()
}

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

/// Starts the copy over from the first row (copies already there are left as they are).
pub async fn restart(pool: &MySqlPool) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_legacy_migration SET cursor_created_at = NULL, cursor_id = NULL, rows_copied = 0, \
         rows_inserted = 0, status = 'copying', updated_at = UTC_TIMESTAMP(3) WHERE id = 1",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// One copied batch, recorded in the batch's own transaction.
pub struct Batch<'a> {
    pub from: Option<(NaiveDateTime, i64)>,
    pub to: (NaiveDateTime, i64),
    pub rows_read: i64,
    pub rows_inserted: i64,
    pub hash: &'a str,
}

/// Moves the cursor past `batch` and logs it, inside the batch's transaction.
pub async fn advance(tx: &mut Transaction<'_, MySql>, batch: &Batch<'_>) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_legacy_migration SET cursor_created_at = ?, cursor_id = ?, rows_copied = rows_copied + ?, \
         rows_inserted = rows_inserted + ?, batches = batches + 1, status = 'copying', updated_at = UTC_TIMESTAMP(3) \
         WHERE id = 1",
    )
    .bind(batch.to.0)
    .bind(batch.to.1)
    .bind(batch.rows_read)
    .bind(batch.rows_inserted)
    .execute(&mut **tx)
    .await?;
    log(&mut **tx, batch, "ok", None).await
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
