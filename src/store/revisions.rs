//! Edits, recalls and deletes for everyone applied to stored messages
//! (seed 000 §7): the month comes from the route mirror, the row is locked
//! (`SELECT … FOR UPDATE`) and changed under a version guard in one
//! transaction with its `im_message_revisions` row (with `shard_month`) and,
//! for recalls and deletes, the `im_dellog` row (`deletedfor = 0`).
//!
//! Idempotent under redelivery and replay: a revision is keyed by its event
//! (`event_id`, or `event_id:seq` for a range delete), an edit applies only
//! when its replacement seq is newer than the last edit applied, and only
//! `normal` rows change. Rows stay as stubs: content and head are cleared,
//! the old ones are kept in the revision.

use chrono::{TimeZone, Utc};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, Row, Transaction};

use crate::events::{GroupEvent, GroupEventBody, SeqRange};

use super::catalog::{self, ShardStatus};
use super::month::{MonthTable, ShardMonth};
use super::writer::StoreError;

/// What applying one event did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Rows changed (and revisions written).
    pub changed: usize,
    /// Already applied, stale or not applicable (redelivery, replay).
    pub skipped: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum RevisionError {
    #[error("message {1} of {0} is not stored")]
    NotStored(String, i64),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for RevisionError {
    fn from(e: sqlx::Error) -> Self {
        RevisionError::Store(StoreError::Db(e))
    }
}

impl RevisionError {
    pub fn is_retryable(&self) -> bool {
        match self {
            // The message precedes its edit in the log; if it is missing,
            // its own event went to the DLQ: replay that first.
            RevisionError::NotStored(..) => false,
            RevisionError::Store(e) => e.is_retryable(),
        }
    }
}

fn at(ms: i64) -> chrono::NaiveDateTime {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
        .naive_utc()
}

/// Whether this event changes stored messages.
pub fn is_revision(event: &GroupEvent) -> bool {
    matches!(
        event.body,
        GroupEventBody::MessageEdited(_)
            | GroupEventBody::MessageRecalled(_)
            | GroupEventBody::MessageDeleted(_)
    )
}

/// Applies one edit, recall or delete event in one transaction.
pub async fn apply(pool: &MySqlPool, event: &GroupEvent) -> Result<Applied, RevisionError> {
    let topic = event.topic.as_str();
    let ranges: Vec<SeqRange> = match &event.body {
        GroupEventBody::MessageEdited(e) => vec![single(e.seq)],
        GroupEventBody::MessageRecalled(r) => vec![single(r.seq)],
        GroupEventBody::MessageDeleted(d) => d.ranges.clone(),
        _ => return Ok(Applied::default()),
    };
    let months = months_of(pool, topic, &ranges).await?;
    let mut tx = pool.begin().await?;
    let mut applied = Applied::default();
    let mut found = false;
    for (month, table) in months {
        for r in &ranges {
            let rows = lock_rows(&mut tx, &table, topic, r).await?;
            found |= !rows.is_empty();
            for row in rows {
                if apply_row(&mut tx, &table, month, event, &row).await? {
                    applied.changed += 1;
                } else {
                    applied.skipped += 1;
                }
            }
        }
    }
    match &event.body {
        GroupEventBody::MessageEdited(e) if !found => {
            let _ = tx.rollback().await;
            return Err(RevisionError::NotStored(topic.to_string(), e.seq));
        }
        GroupEventBody::MessageRecalled(r) => {
            write_dellog(&mut tx, event, r.del_id, &ranges).await?;
        }
        GroupEventBody::MessageDeleted(d) => {
            write_dellog(&mut tx, event, d.del_id, &ranges).await?;
        }
        _ => {}
    }
    tx.commit().await?;
    Ok(applied)
}

fn single(seq: i64) -> SeqRange {
    SeqRange {
        low: seq,
        hi: seq.saturating_add(1),
    }
}

/// Month tables holding any seq of `ranges` (from the route mirror).
/// Archived months cannot change.
async fn months_of(
    pool: &MySqlPool,
    topic: &str,
    ranges: &[SeqRange],
) -> Result<Vec<(ShardMonth, MonthTable)>, RevisionError> {
    let low = ranges.iter().map(|r| r.low).min().unwrap_or(0);
    let hi = ranges.iter().map(|r| r.hi).max().unwrap_or(0);
    let months: Vec<String> = sqlx::query_scalar(
        "SELECT shard_month FROM im_group_message_topic_shards \
         WHERE topic = ? AND min_seq < ? AND max_seq >= ? ORDER BY shard_month",
    )
    .bind(topic)
    .bind(hi)
    .bind(low)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(months.len());
    for m in months {
        let month = ShardMonth::parse(&m).map_err(StoreError::from)?;
        match catalog::table(pool, month).await? {
            Some((_, ShardStatus::Archived)) => {
                return Err(StoreError::Sealed(month, ShardStatus::Archived).into())
            }
            Some((table, _)) => out.push((month, table.for_topic(topic))),
            None => return Err(StoreError::MissingTable(month).into()),
        }
    }
    Ok(out)
}

struct LockedRow {
    message_id: i64,
    seq: i64,
    status: String,
    version: i32,
    head: Option<String>,
    content: Option<String>,
}

async fn lock_rows(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    topic: &str,
    r: &SeqRange,
) -> Result<Vec<LockedRow>, RevisionError> {
    let sql = format!(
        "SELECT message_id, seqid, status, version, CAST(head AS CHAR CHARACTER SET utf8mb4), \
         CAST(content AS CHAR CHARACTER SET utf8mb4) FROM `{}` \
         WHERE topic = ? AND seqid >= ? AND seqid < ? ORDER BY seqid FOR UPDATE",
        table.name()
    );
    let rows = sqlx::query(&sql)
        .bind(topic)
        .bind(r.low)
        .bind(r.hi)
        .fetch_all(&mut **tx)
        .await?;
    rows.iter()
        .map(|row| {
            Ok(LockedRow {
                message_id: row.try_get(0)?,
                seq: row.try_get(1)?,
                status: row.try_get(2)?,
                version: row.try_get(3)?,
                head: row.try_get(4)?,
                content: row.try_get(5)?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

/// Applies the event to one locked row; `false` when there was nothing to do.
async fn apply_row(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    month: ShardMonth,
    event: &GroupEvent,
    row: &LockedRow,
) -> Result<bool, RevisionError> {
    let revision_id = match event.body {
        GroupEventBody::MessageDeleted(_) => format!("{}:{}", event.event_id, row.seq),
        _ => event.event_id.clone(),
    };
    let seen: Option<i64> =
        sqlx::query_scalar("SELECT id FROM im_message_revisions WHERE event_id = ?")
            .bind(&revision_id)
            .fetch_optional(&mut **tx)
            .await?;
    if seen.is_some() || row.status != "normal" {
        return Ok(false);
    }
    let new_version = row.version + 1;
    let (action, edit_seq) = match &event.body {
        GroupEventBody::MessageEdited(e) => {
            let last: Option<i64> = sqlx::query_scalar(
                "SELECT MAX(edit_seq) FROM im_message_revisions WHERE topic = ? AND seqid = ? AND action = 'edit'",
            )
            .bind(&event.topic)
            .bind(row.seq)
            .fetch_one(&mut **tx)
            .await?;
            let this = e.edit_seq.unwrap_or(0);
            if e.edit_seq.is_some() && last.is_some_and(|l| l >= this) {
                return Ok(false); // an older edit arriving after a newer one
            }
            let sql = format!(
                "UPDATE `{}` SET content = ?, head = COALESCE(?, head), version = ?, updated_at = ? \
                 WHERE message_id = ?",
                table.name()
            );
            sqlx::query(&sql)
                .bind(&e.content)
                .bind(&e.head)
                .bind(new_version)
                .bind(at(e.edited_at))
                .bind(row.message_id)
                .execute(&mut **tx)
                .await?;
            ("edit", e.edit_seq)
        }
        GroupEventBody::MessageRecalled(r) => {
            let sql = format!(
                "UPDATE `{}` SET status = 'recalled', recalled_at = ?, recalled_by = ?, \
                 content = NULL, head = NULL, version = ?, updated_at = ? WHERE message_id = ?",
                table.name()
            );
            sqlx::query(&sql)
                .bind(at(r.recalled_at))
                .bind(event.actor_uid)
                .bind(new_version)
                .bind(at(r.recalled_at))
                .bind(row.message_id)
                .execute(&mut **tx)
                .await?;
            ("recall", None)
        }
        GroupEventBody::MessageDeleted(d) => {
            let sql = format!(
                "UPDATE `{}` SET status = 'deleted', deleted_at = ?, audit_status = ?, \
                 content = NULL, head = NULL, version = ?, updated_at = ? WHERE message_id = ?",
                table.name()
            );
            sqlx::query(&sql)
                .bind(at(d.deleted_at))
                .bind(if d.moderation { "moderated" } else { "pass" })
                .bind(new_version)
                .bind(at(d.deleted_at))
                .bind(row.message_id)
                .execute(&mut **tx)
                .await?;
            ("delete", None)
        }
        _ => return Ok(false),
    };
    sqlx::query(
        "INSERT INTO im_message_revisions (topic, shard_month, seqid, message_id, version, edit_seq, \
         action, actor_uid, old_content, old_head, event_id, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&event.topic)
    .bind(month.to_string())
    .bind(row.seq)
    .bind(row.message_id)
    .bind(new_version)
    .bind(edit_seq)
    .bind(action)
    .bind(event.actor_uid)
    .bind(&row.content)
    .bind(&row.head)
    .bind(&revision_id)
    .bind(at(event.occurred_at))
    .execute(&mut **tx)
    .await?;
    Ok(true)
}

/// Everyone's delete-log rows (`deletedfor = 0`), keyed by event and range.
async fn write_dellog(
    tx: &mut Transaction<'_, MySql>,
    event: &GroupEvent,
    del_id: i32,
    ranges: &[SeqRange],
) -> Result<(), RevisionError> {
    for r in ranges {
        sqlx::query(
            "INSERT INTO im_dellog (topic, deletedfor, delid, low, hi, event_id) VALUES (?, 0, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE low = low",
        )
        .bind(&event.topic)
        .bind(del_id)
        .bind(r.low)
        .bind(r.hi)
        .bind(&event.event_id)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
