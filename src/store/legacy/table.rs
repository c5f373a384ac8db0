//! The legacy single table `im_group_messages` (migration 0004) and every
//! SQL text that reads it. Its name is fixed; after the cutover it is
//! renamed [`RENAMED`] and kept read-only.

use sqlx::mysql::MySqlPool;

/// The legacy table.
pub const TABLE: &str = "im_group_messages";
/// Its name after the cutover.
pub const RENAMED: &str = "im_group_messages_legacy";
/// The copy cursor's index, added by `imstream legacy plan` (online DDL).
pub const CURSOR_INDEX: &str = "idx_legacy_created_id";

/// The columns shared by the legacy table and the month template, in the
/// month table's insert order; the legacy `id` becomes `message_id`.
pub const COPY_COLUMNS: &str = "topic, group_id, seqid, from_user, client_msg_id, msg_type, status, \
     content, head, mentioned_user_ids, mention_all, reply_seqid, root_seqid, file_count, content_size, \
     has_risk, audit_status, version, recalled_at, recalled_by, deleted_at, expires_at, created_at, updated_at";

/// Rows after the cursor `(created_at, id)`: binds `created_at, created_at, id`.
pub const AFTER_CURSOR: &str = "(created_at > ? OR (created_at = ? AND id > ?))";

/// Every column of a legacy row as the bulk copy reads it: `id`, then
/// [`COPY_COLUMNS`] in order, JSON columns cast to text (MySQL 8 and
/// MariaDB both hand back exactly what a JSON column stores).
pub const READ_ROW_COLUMNS: &str = "id, topic, group_id, seqid, from_user, client_msg_id, msg_type, status, \
     CAST(content AS CHAR CHARACTER SET utf8mb4), CAST(head AS CHAR CHARACTER SET utf8mb4), \
     CAST(mentioned_user_ids AS CHAR CHARACTER SET utf8mb4), mention_all, reply_seqid, root_seqid, file_count, \
     content_size, has_risk, audit_status, version, recalled_at, recalled_by, deleted_at, expires_at, \
     created_at, updated_at";

/// The next rows of one month in copy order, by a keyset range on the
/// cursor index: binds `cursor` ×3 (if `after_cursor`), month start,
/// month end, limit.
pub fn month_rows_sql(after_cursor: bool) -> String {
    format!(
        "SELECT {READ_ROW_COLUMNS} FROM {TABLE} FORCE INDEX ({CURSOR_INDEX}) WHERE {}created_at >= ? \
         AND created_at < ? ORDER BY created_at, id LIMIT ?",
        if after_cursor { format!("{AFTER_CURSOR} AND ") } else { String::new() }
    )
}

/// How many rows of one month lie after a cursor: binds as
/// [`month_rows_sql`] without the limit.
pub fn month_remaining_sql(after_cursor: bool) -> String {
    format!(
        "SELECT COUNT(*) FROM {TABLE} FORCE INDEX ({CURSOR_INDEX}) WHERE {}created_at >= ? AND created_at < ?",
        if after_cursor { format!("{AFTER_CURSOR} AND ") } else { String::new() }
    )
}

/// Columns a history read returns (as `history` reads month tables).
pub const READ_COLUMNS: &str = "seqid, from_user, CAST(head AS CHAR CHARACTER SET utf8mb4), \
     CAST(content AS CHAR CHARACTER SET utf8mb4), status, version, \
     CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED), reply_seqid, root_seqid";

/// Newest first: `since <= seqid < before` (binds topic, before, since, limit).
pub fn page_desc_sql() -> String {
    format!(
        "SELECT {READ_COLUMNS} FROM {TABLE} WHERE topic = ? AND seqid < ? AND seqid >= ? ORDER BY seqid DESC LIMIT ?"
    )
}

/// Oldest first: `since <= seqid < before` (binds topic, since, before, limit).
pub fn page_asc_sql() -> String {
    format!(
        "SELECT {READ_COLUMNS} FROM {TABLE} WHERE topic = ? AND seqid >= ? AND seqid < ? ORDER BY seqid ASC LIMIT ?"
    )
}

/// Whether a database error says the table does not exist (1146).
pub fn is_missing_table(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| m.number() == 1146),
        _ => false,
    }
}

/// Whether the legacy table (not yet cut over) exists.
pub async fn exists(pool: &MySqlPool) -> sqlx::Result<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(TABLE)
    .fetch_one(pool)
    .await?;
    Ok(n > 0)
}

/// The highest seq of `topic` in the legacy table; `None` when it has none
/// or the table is gone (cut over: the month tables and the mirror hold it).
pub async fn max_seq(pool: &MySqlPool, topic: &str) -> sqlx::Result<Option<i64>> {
    match sqlx::query_scalar::<_, Option<i64>>(&format!(
        "SELECT MAX(seqid) FROM {TABLE} WHERE topic = ?"
    ))
    .bind(topic)
    .fetch_one(pool)
    .await
    {
        Ok(v) => Ok(v),
        Err(e) if is_missing_table(&e) => Ok(None),
        Err(e) => Err(e),
    }
}
