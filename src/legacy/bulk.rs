//! The bulk path of `imstream legacy copy`: one month's legacy rows read
//! by keyset ranges on the cursor index, written into the month table with
//! multi-row `INSERT … VALUES` statements built here (no `INSERT … SELECT`:
//! MariaDB then only stores rows, it does not also read, join and hash
//! them), and a past month's secondary indexes built once after its load
//! instead of row by row during it.
//!
//! A row is inserted without looking first when no copy of it can exist
//! (after the month's `fresh` mark, see [`state::MonthState`]); the plain
//! `INSERT` then must store every row (a duplicate key is an error, never
//! skipped). Otherwise (a `--restart`, copies made before the mark existed)
//! the copies already there are read and compared, and only the missing
//! rows are inserted.
//!
//! Bulk load of a month (catalog `sealed`, table empty, no
//! `--keep-indexes`): [`begin`] records the status to put back and sets
//! `loading` (one transaction), then drops the secondary indexes; after
//! the month's last row [`finish`] builds the missing ones in one pass and
//! puts the status back (one transaction). Both steps are idempotent, so a
//! copy stopped anywhere in between resumes: rows go on from the month's
//! cursor, indexes are built by whichever run finds the month exhausted.

use std::collections::HashMap;

use chrono::NaiveDateTime;
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{MySql, Row, Transaction};

use crate::store::catalog::ShardStatus;
use crate::store::month::{MonthTable, SecondaryIndex, ShardMonth, SECONDARY_INDEXES};

use super::state::{self, Cursor};
use crate::store::legacy::table::{self, COPY_COLUMNS};

/// MySQL's limit on the placeholders of one prepared statement.
const MAX_PLACEHOLDERS: usize = 65_535;
/// Placeholders per row: `message_id` and [`COPY_COLUMNS`].
const ROW_WIDTH: usize = 25;
/// Rows per `INSERT` statement (a 5,000-row batch is two statements).
pub const ROWS_PER_INSERT: usize = MAX_PLACEHOLDERS / ROW_WIDTH;

/// One legacy row, every column (`id` becomes `message_id`).
#[derive(Debug, Clone, PartialEq)]
pub struct LegacyRow {
    pub id: i64,
    pub topic: String,
    pub group_id: i64,
    pub seq: i64,
    pub from_user: i64,
    pub client_msg_id: Option<String>,
    pub msg_type: String,
    pub status: String,
    pub content: Option<String>,
    pub head: Option<String>,
    pub mentioned_user_ids: Option<String>,
    pub mention_all: i8,
    pub reply_seqid: Option<i64>,
    pub root_seqid: Option<i64>,
    pub file_count: i32,
    pub content_size: i32,
    pub has_risk: i8,
    pub audit_status: String,
    pub version: i32,
    pub recalled_at: Option<NaiveDateTime>,
    pub recalled_by: Option<i64>,
    pub deleted_at: Option<NaiveDateTime>,
    pub expires_at: Option<NaiveDateTime>,
    pub created_at: NaiveDateTime,
    pub updated_at: NaiveDateTime,
}

impl LegacyRow {
    pub fn cursor(&self) -> Cursor {
        (self.created_at, self.id)
    }

    /// The row's digest, hex SHA-256 of `seqid|from_user|content|status|version`
    /// (the batch log's content hash is made of these, in id order).
    pub fn digest(&self) -> String {
        digest(
            self.seq,
            self.from_user,
            self.content.as_deref(),
            &self.status,
            self.version,
        )
    }

    fn from_row(r: &sqlx::mysql::MySqlRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: r.try_get(0)?,
            topic: r.try_get::<crate::exact::Exact, _>(1)?.into(),
            group_id: r.try_get(2)?,
            seq: r.try_get(3)?,
            from_user: r.try_get(4)?,
            client_msg_id: r
                .try_get::<Option<crate::exact::Exact>, _>(5)?
                .map(String::from),
            msg_type: r.try_get(6)?,
            status: r.try_get(7)?,
            content: r.try_get(8)?,
            head: r.try_get(9)?,
            mentioned_user_ids: r.try_get(10)?,
            mention_all: r.try_get(11)?,
            reply_seqid: r.try_get(12)?,
            root_seqid: r.try_get(13)?,
            file_count: r.try_get(14)?,
            content_size: r.try_get(15)?,
            has_risk: r.try_get(16)?,
            audit_status: r.try_get(17)?,
            version: r.try_get(18)?,
            recalled_at: r.try_get(19)?,
            recalled_by: r.try_get(20)?,
            deleted_at: r.try_get(21)?,
            expires_at: r.try_get(22)?,
            created_at: r.try_get(23)?,
            updated_at: r.try_get(24)?,
        })
    }
}

/// Hex SHA-256 of `seqid|from_user|content|status|version` (content `''`
/// when NULL), as `SHA2(CONCAT_WS('|', …), 256)` in SQL.
pub fn digest(
    seq: i64,
    from_user: i64,
    content: Option<&str>,
    status: &str,
    version: i32,
) -> String {
    let text = format!(
        "{seq}|{from_user}|{}|{status}|{version}",
        content.unwrap_or("")
    );
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The next `limit` rows of `month` after `cursor`, in copy order.
pub async fn read_month(
    conn: &mut MySqlConnection,
    month: ShardMonth,
    cursor: Option<Cursor>,
    limit: usize,
) -> sqlx::Result<Vec<LegacyRow>> {
    let sql = table::month_rows_sql(cursor.is_some());
    let mut q = sqlx::query(&sql);
    if let Some((at, id)) = cursor {
        q = q.bind(at).bind(at).bind(id);
    }
    let rows = q
        .bind(month.start().naive_utc())
        .bind(month.end().naive_utc())
        .bind(limit as i64)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(LegacyRow::from_row).collect()
}

/// Whether `month` has legacy rows after `cursor`.
pub async fn has_rows_after(
    conn: &mut MySqlConnection,
    month: ShardMonth,
    cursor: Option<Cursor>,
) -> sqlx::Result<bool> {
    Ok(!read_month(conn, month, cursor, 1).await?.is_empty())
}

/// Inserts `rows` with plain multi-row `INSERT`s; returns the rows stored
/// (every one, or an error).
pub async fn insert(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    rows: &[&LegacyRow],
) -> sqlx::Result<u64> {
    let mut stored = 0;
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let sql = table.insert_copied_sql(COPY_COLUMNS, chunk.len());
        let mut q = sqlx::query(&sql);
        for r in chunk {
            q = q
                .bind(r.id)
                .bind(&r.topic)
                .bind(r.group_id)
                .bind(r.seq)
                .bind(r.from_user)
                .bind(&r.client_msg_id)
                .bind(&r.msg_type)
                .bind(&r.status)
                .bind(&r.content)
                .bind(&r.head)
                .bind(&r.mentioned_user_ids)
                .bind(r.mention_all)
                .bind(r.reply_seqid)
                .bind(r.root_seqid)
                .bind(r.file_count)
                .bind(r.content_size)
                .bind(r.has_risk)
                .bind(&r.audit_status)
                .bind(r.version)
                .bind(r.recalled_at)
                .bind(r.recalled_by)
                .bind(r.deleted_at)
                .bind(r.expires_at)
                .bind(r.created_at)
                .bind(r.updated_at);
        }
        stored += q.execute(&mut **tx).await?.rows_affected();
    }
    Ok(stored)
}

/// The digests of the copies of `ids` already in the table, by id.
pub async fn present_digests(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    ids: &[i64],
) -> sqlx::Result<HashMap<i64, String>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(MAX_PLACEHOLDERS / 2) {
        let sql = table.digests_by_id_sql(chunk.len());
        let mut q = sqlx::query(&sql);
        for id in chunk {
            q = q.bind(id);
        }
        for r in q.fetch_all(&mut **tx).await? {
            let content: Option<String> = r.try_get(3)?;
            let status: String = r.try_get(4)?;
            out.insert(
                r.try_get::<i64, _>(0)?,
                digest(
                    r.try_get(1)?,
                    r.try_get(2)?,
                    content.as_deref(),
                    &status,
                    r.try_get(5)?,
                ),
            );
        }
    }
    Ok(out)
}

/// Whether a database error is a duplicate key (1062).
pub fn is_duplicate_key(e: &sqlx::Error) -> bool {
    mysql_error_number(e) == Some(1062)
}

/// Whether a transaction lost a deadlock (1213) or a lock wait (1205):
/// the batch is run again.
pub fn is_lock_conflict(e: &sqlx::Error) -> bool {
    matches!(mysql_error_number(e), Some(1213 | 1205))
}

fn mysql_error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// How a month is copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Indexes kept, rows inserted as they come (the live months, a month
    /// with rows already, `--keep-indexes`).
    Indexed,
    /// Bulk-loaded: catalog `loading`, secondary indexes built at the end;
    /// `from` is the status to put back.
    Bulk { from: ShardStatus },
}

/// Which load a month gets, from its catalog status, the status recorded
/// when a bulk load of it began (`loading_from`), whether its table is
/// empty and `--keep-indexes`. Only a past month nothing else writes
/// (`sealed`) whose table is empty starts a bulk load; a begun one goes
/// on whatever the flags (its indexes are gone already).
pub fn choose_load(
    status: ShardStatus,
    loading_from: Option<ShardStatus>,
    table_empty: bool,
    keep_indexes: bool,
) -> Load {
    match (status, loading_from) {
        (_, Some(from)) => Load::Bulk { from },
        (ShardStatus::Loading, None) => Load::Bulk {
            from: ShardStatus::Sealed,
        },
        (ShardStatus::Sealed, None) if table_empty && !keep_indexes => Load::Bulk {
            from: ShardStatus::Sealed,
        },
        _ => Load::Indexed,
    }
}

/// The template's secondary indexes that `present` (index names) lacks.
pub fn missing_indexes(present: &[String]) -> Vec<&'static SecondaryIndex> {
    SECONDARY_INDEXES
        .iter()
        .filter(|i| !present.iter().any(|p| p.eq_ignore_ascii_case(i.name)))
        .collect()
}

/// The template's secondary indexes that `present` still has.
pub fn present_indexes(present: &[String]) -> Vec<&'static SecondaryIndex> {
    SECONDARY_INDEXES
        .iter()
        .filter(|i| present.iter().any(|p| p.eq_ignore_ascii_case(i.name)))
        .collect()
}

async fn index_names(pool: &MySqlPool, table: &MonthTable) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar(&table.index_names_sql())
        .fetch_all(pool)
        .await
}

/// Whether the month table holds no row at all.
pub async fn table_empty(pool: &MySqlPool, table: &MonthTable) -> sqlx::Result<bool> {
    let any: i64 = sqlx::query_scalar(&table.any_id_below_sql())
        .bind(i64::MAX)
        .fetch_one(pool)
        .await?;
    Ok(any == 0)
}

/// Whether the month table holds a copy of some legacy row (an id up to
/// `max_legacy_id`; Snowflake ids are far above).
pub async fn has_copies(
    pool: &MySqlPool,
    table: &MonthTable,
    max_legacy_id: i64,
) -> sqlx::Result<bool> {
    let any: i64 = sqlx::query_scalar(&table.any_id_below_sql())
        .bind(max_legacy_id.saturating_add(1))
        .fetch_one(pool)
        .await?;
    Ok(any != 0)
}

/// Starts (or resumes) a month's bulk load: catalog `loading` with the
/// status to put back, then its secondary indexes dropped if rows remain
/// to be copied (a resumed load whose rows are all in keeps what a
/// stopped [`finish`] built).
pub async fn begin(
    pool: &MySqlPool,
    conn: &mut MySqlConnection,
    table: &MonthTable,
    month: &state::MonthState,
    from: ShardStatus,
) -> sqlx::Result<()> {
    state::begin_loading(pool, month.month, from).await?;
    if !has_rows_after(conn, month.month, month.cursor).await? {
        return Ok(());
    }
    let present = index_names(pool, table).await?;
    let drop = present_indexes(&present);
    if !drop.is_empty() {
        tracing::info!(month = %month.month, indexes = drop.len(), "bulk load: dropping the month's secondary indexes");
        sqlx::query(&table.drop_indexes_sql(&drop))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Ends a month's bulk load after its last row: builds the missing
/// secondary indexes (one online `ALTER TABLE`), then puts the catalog
/// status back and marks the month done (one transaction).
pub async fn finish(
    pool: &MySqlPool,
    conn: &mut MySqlConnection,
    table: &MonthTable,
    month: ShardMonth,
    to: ShardStatus,
) -> sqlx::Result<()> {
    let present = index_names(pool, table).await?;
    let add = missing_indexes(&present);
    if !add.is_empty() {
        tracing::info!(%month, indexes = add.len(), "bulk load: building the month's secondary indexes");
        sqlx::query(&table.add_indexes_sql(&add))
            .execute(&mut *conn)
            .await?;
    }
    state::end_loading(pool, month, to).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_sealed_month_is_bulk_loaded() {
        use ShardStatus::*;
        let bulk = Load::Bulk { from: Sealed };
        assert_eq!(choose_load(Sealed, None, true, false), bulk);
        assert_eq!(choose_load(Sealed, None, false, false), Load::Indexed);
        assert_eq!(choose_load(Sealed, None, true, true), Load::Indexed);
        for live in [Prepared, Writable, Sealing, Archived] {
            assert_eq!(
                choose_load(live, None, true, false),
                Load::Indexed,
                "{live}"
            );
        }
        // A begun load goes on, whatever the flags, and puts back what it recorded.
        assert_eq!(choose_load(Loading, Some(Sealed), false, true), bulk);
        assert_eq!(choose_load(Loading, None, false, false), bulk);
        assert_eq!(
            choose_load(Archived, Some(Archived), false, false),
            Load::Bulk { from: Archived }
        );
    }

    #[test]
    fn index_sets() {
        let present = vec![
            "PRIMARY".to_string(),
            "uk_topic_seq".to_string(),
            "IDX_EXPIRES".to_string(),
        ];
        let missing: Vec<&str> = missing_indexes(&present).iter().map(|i| i.name).collect();
        assert_eq!(
            missing,
            [
                "uk_topic_sender_client_mid",
                "idx_group_seq",
                "idx_topic_created",
                "idx_topic_from_seq",
                "idx_audit_created"
            ]
        );
        let kept: Vec<&str> = present_indexes(&present).iter().map(|i| i.name).collect();
        assert_eq!(kept, ["uk_topic_seq", "idx_expires"]);
        assert_eq!(missing_indexes(&[]).len(), SECONDARY_INDEXES.len());
    }

    #[test]
    fn the_digest_is_the_sql_one() {
        // MariaDB 10.11: SELECT SHA2(CONCAT_WS('|', 7, 1003, '{"txt":"hi"}', 'normal', 1), 256)
        assert_eq!(
            digest(7, 1003, Some(r#"{"txt":"hi"}"#), "normal", 1),
            "2b7b41ae2947be79c2fba27e209e18a7ef8618b7da9eae70fe660411d539dd69"
        );
        assert_eq!(
            digest(7, 1003, None, "normal", 1),
            digest(7, 1003, Some(""), "normal", 1)
        );
        assert!(ROWS_PER_INSERT * ROW_WIDTH <= MAX_PLACEHOLDERS);
        assert_eq!(COPY_COLUMNS.split(',').count() + 1, ROW_WIDTH);
    }
}
