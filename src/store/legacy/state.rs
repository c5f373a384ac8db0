//! The migration's state row (`im_legacy_migration`, one per tenant
//! database) as the read path needs it: status and the dual-read switch
//! (with the copy cursor and counters of the same row). Writing it, and
//! the per-month progress and batch log, are the migration commands'
//! (`crate::legacy::state`).

use chrono::NaiveDateTime;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// A position along the copy order: the last copied `(created_at, id)`.
pub type Cursor = (NaiveDateTime, i64);

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
    /// Every legacy row up to this `(created_at, id)` is copied; `None`
    /// before the first batch. Months copied in parallel may be further on
    /// (`crate::legacy::state::MonthState::cursor`).
    pub cursor: Option<Cursor>,
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
