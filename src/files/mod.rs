//! Files people upload (issue 41): their records in MySQL (`im_files`,
//! who refers to them in `im_file_refs`), where their bytes live
//! ([`store`]), their ids and addresses ([`id`]), the content type their
//! bytes show ([`sniff`]) and a download's byte range ([`range`]). The
//! bytes never pass through MySQL, Redis or Kafka (seed 000 §3.1 item 4):
//! the log carries that a file was uploaded, never the file.

pub mod id;
pub mod range;
pub mod scan;
pub mod sniff;
pub mod store;
pub mod sweep;

use sqlx::mysql::MySqlPool;

pub use id::FileId;

/// Where a file stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Its bytes are on their way: never served.
    Uploading,
    /// Served to whoever may read it.
    Stored,
    /// Flagged by the scan or an operator: refused to everyone (410).
    Unavailable,
    /// Gone, or queued to go.
    Deleted,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Uploading => "uploading",
            State::Stored => "stored",
            State::Unavailable => "unavailable",
            State::Deleted => "deleted",
        }
    }

    fn parse(s: &str) -> State {
        match s {
            "stored" => State::Stored,
            "unavailable" => State::Unavailable,
            "deleted" => State::Deleted,
            _ => State::Uploading,
        }
    }
}

/// A file's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRecord {
    pub id: FileId,
    pub uploader: i64,
    pub object_key: String,
    pub size: i64,
    pub mime: String,
    pub name: String,
    pub state: State,
    /// What the scan said: `pending`, `clean` or `flagged`.
    pub scan: String,
}

/// Records an upload that is starting (`uploading`: never served).
pub async fn begin(
    pool: &MySqlPool,
    id: &FileId,
    uploader: i64,
    object_key: &str,
    name: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO im_files (file_id, uploader_uid, object_key, name, state) \
         VALUES (?, ?, ?, ?, 'uploading')",
    )
    .bind(id.as_str())
    .bind(uploader)
    .bind(object_key)
    .bind(name)
    .execute(pool)
    .await?;
    Ok(())
}

/// The upload is complete: its size and sniffed type, served from now on.
pub async fn stored(pool: &MySqlPool, id: &FileId, size: i64, mime: &str) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_files SET state = 'stored', size = ?, mime = ? \
         WHERE file_id = ? AND state = 'uploading'",
    )
    .bind(size)
    .bind(mime)
    .bind(id.as_str())
    .execute(pool)
    .await?;
    Ok(())
}

/// An upload that did not complete leaves no record.
pub async fn abandon(pool: &MySqlPool, id: &FileId) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM im_files WHERE file_id = ? AND state = 'uploading'")
        .bind(id.as_str())
        .execute(pool)
        .await?;
    Ok(())
}

/// The file's record, if there is one.
pub async fn get(pool: &MySqlPool, id: &FileId) -> sqlx::Result<Option<FileRecord>> {
    let row: Option<(
        crate::exact::Exact,
        i64,
        crate::exact::Exact,
        i64,
        String,
        String,
        String,
        String,
    )> = sqlx::query_as(
        "SELECT file_id, uploader_uid, object_key, size, mime, name, state, scan \
             FROM im_files WHERE file_id = ?",
    )
    .bind(id.as_str())
    .fetch_optional(pool)
    .await?;
    Ok(
        row.and_then(|(file_id, uploader, key, size, mime, name, state, scan)| {
            Some(FileRecord {
                id: FileId::parse(&file_id.0)?,
                uploader,
                object_key: key.into_string(),
                size,
                mime,
                name,
                state: State::parse(&state),
                scan,
            })
        }),
    )
}

/// Most references of one file looked at for a download.
pub const MAX_REFS_CHECKED: i64 = 100;

/// One thing that refers to a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    /// The message's topic; for a profile picture empty (as the gateway
    /// accepted it) or `@<owner>` (the profile showing it).
    pub topic: String,
    /// The message's seq (for a picture: the user or group).
    pub seq: i64,
    /// How long ago it was recorded, in milliseconds.
    pub age_ms: i64,
}

/// What refers to the file: messages, and profile pictures, newest first.
pub async fn refs(pool: &MySqlPool, id: &FileId) -> sqlx::Result<Vec<FileRef>> {
    let rows: Vec<(crate::exact::Exact, i64, i64)> = sqlx::query_as(
        "SELECT topic, seq, CAST(TIMESTAMPDIFF(MICROSECOND, created_at, CURRENT_TIMESTAMP(3)) / 1000 AS SIGNED) \
         FROM im_file_refs WHERE file_id = ? ORDER BY created_at DESC LIMIT ?",
    )
    .bind(id.as_str())
    .bind(MAX_REFS_CHECKED)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(t, seq, age_ms)| FileRef {
            topic: t.into_string(),
            seq,
            age_ms,
        })
        .collect())
}

/// Records that message `(topic, seq)` (or a profile picture: `topic`
/// empty, `seq` the user) refers to the file. Idempotent. False, and
/// nothing recorded, when the file is no longer kept (the sweep took it
/// meanwhile): the caller refuses what would refer to it.
pub async fn refer(pool: &MySqlPool, id: &FileId, topic: &str, seq: i64) -> sqlx::Result<bool> {
    // First the file (its row lock orders this against the sweep's
    // conditional update): referred to, no longer queued to go.
    let kept = sqlx::query(
        "UPDATE im_files SET referenced_at = COALESCE(referenced_at, CURRENT_TIMESTAMP(3)), \
         delete_after = NULL WHERE file_id = ? AND state IN ('stored', 'unavailable')",
    )
    .bind(id.as_str())
    .execute(pool)
    .await?;
    if kept.rows_affected() == 0 {
        return Ok(false);
    }
    sqlx::query("INSERT IGNORE INTO im_file_refs (file_id, topic, seq) VALUES (?, ?, ?)")
        .bind(id.as_str())
        .bind(topic)
        .bind(seq)
        .execute(pool)
        .await?;
    Ok(true)
}

/// Whether some profile shows the file as its picture now (as the profile
/// projections recorded it; the gateway's own record of a picture it
/// accepted does not count: that change may not have been made).
pub async fn is_shown_picture(pool: &MySqlPool, id: &FileId) -> sqlx::Result<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM im_file_refs WHERE file_id = ? AND topic LIKE '@%'",
    )
    .bind(id.as_str())
    .fetch_one(pool)
    .await?;
    Ok(n > 0)
}

/// Whether a reference's `topic` makes the file a profile picture: empty
/// (as the gateway records a picture it accepts) or `@<owner>` (as the
/// profile projections record the picture a profile has).
pub fn is_picture_ref(topic: &str) -> bool {
    topic.is_empty() || topic.starts_with('@')
}

/// `owner`'s profile (`usr<uid>` or a group's name) now has `photo` as its
/// picture (an upload's address, an inline picture, or none: empty). The
/// upload is recorded as that profile's picture (`@<owner>`, again on a
/// replay), and the uploads that were its picture before are released, in
/// one transaction (a failure leaves them as they were, for the retry):
/// no longer readable as a picture unless another profile still shows
/// them, queued to go after `retention_secs` unless something else refers
/// to them. A replay converges: each change re-records its own picture.
pub async fn set_picture(
    pool: &MySqlPool,
    owner: &str,
    photo: &str,
    retention_secs: u64,
) -> sqlx::Result<()> {
    let tag = format!("@{owner}");
    let keep = FileId::from_reference(photo);
    if let Some(id) = &keep {
        // (A file swept since is not referred to again.)
        refer(pool, id, &tag, 0).await?;
    }
    let mut tx = pool.begin().await?;
    let before: Vec<(crate::exact::Exact,)> =
        sqlx::query_as("SELECT DISTINCT file_id FROM im_file_refs WHERE topic = ? FOR UPDATE")
            .bind(&tag)
            .fetch_all(&mut *tx)
            .await?;
    for (old,) in before {
        if keep.as_ref().is_some_and(|k| k.as_str() == old.0) {
            continue;
        }
        sqlx::query("DELETE FROM im_file_refs WHERE file_id = ? AND topic = ?")
            .bind(&old.0)
            .bind(&tag)
            .execute(&mut *tx)
            .await?;
        let shown: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM im_file_refs WHERE file_id = ? AND topic LIKE '@%'",
        )
        .bind(&old.0)
        .fetch_one(&mut *tx)
        .await?;
        if shown == 0 {
            // The gateway's record of it as a picture goes too.
            sqlx::query("DELETE FROM im_file_refs WHERE file_id = ? AND topic = ''")
                .bind(&old.0)
                .execute(&mut *tx)
                .await?;
        }
        queue_if_unreferenced(&mut *tx, &old.0, retention_secs).await?;
    }
    tx.commit().await
}

/// Who made a file unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The scan flagged its bytes: final.
    Scan,
    /// An operator blocked a message carrying it (`file.audit.update`);
    /// an `ok` audit of that message takes it back.
    Audit,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Scan => "scan",
            Verdict::Audit => "audit",
        }
    }
}

/// Makes a stored file unavailable to everyone (`410`); false when it was
/// not stored (unavailable already, deleted, or never completed). The
/// scan's verdict also takes over an audit's (an `ok` audit must never
/// serve what the scan flagged).
pub async fn make_unavailable(pool: &MySqlPool, id: &FileId, by: Verdict) -> sqlx::Result<bool> {
    let states = match by {
        Verdict::Scan => "'stored', 'unavailable'",
        Verdict::Audit => "'stored'",
    };
    let done = sqlx::query(&format!(
        "UPDATE im_files SET state = 'unavailable', unavailable_by = ? \
         WHERE file_id = ? AND state IN ({states})"
    ))
    .bind(by.as_str())
    .bind(id.as_str())
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Serves again a file an operator's audit made unavailable (never one
/// the scan flagged); true when it was.
pub async fn restore_audited(pool: &MySqlPool, id: &FileId) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE im_files SET state = 'stored', unavailable_by = '' \
         WHERE file_id = ? AND state = 'unavailable' AND unavailable_by = 'audit' \
         AND scan <> 'flagged'",
    )
    .bind(id.as_str())
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records the scan's outcome (`clean` or `flagged`).
pub async fn scanned(pool: &MySqlPool, id: &FileId, outcome: &str) -> sqlx::Result<()> {
    sqlx::query("UPDATE im_files SET scan = ? WHERE file_id = ?")
        .bind(outcome)
        .bind(id.as_str())
        .execute(pool)
        .await?;
    Ok(())
}

/// The files message `(topic, seq)` refers to.
pub async fn of_message(pool: &MySqlPool, topic: &str, seq: i64) -> sqlx::Result<Vec<FileId>> {
    let rows: Vec<(crate::exact::Exact,)> =
        sqlx::query_as("SELECT file_id FROM im_file_refs WHERE topic = ? AND seq = ?")
            .bind(topic)
            .bind(seq)
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id,)| FileId::parse(&id.0))
        .collect())
}

/// Most conversations told live that a file became unavailable.
pub const MAX_TOPICS_TOLD: i64 = 1000;

/// The conversations with a message referring to the file.
pub async fn topics_of(pool: &MySqlPool, id: &FileId) -> sqlx::Result<Vec<String>> {
    let rows: Vec<(crate::exact::Exact,)> = sqlx::query_as(
        "SELECT DISTINCT topic FROM im_file_refs WHERE file_id = ? AND topic <> '' \
         AND topic NOT LIKE '@%' LIMIT ?",
    )
    .bind(id.as_str())
    .bind(MAX_TOPICS_TOLD)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(t,)| t.into_string()).collect())
}

/// Most files one message's content may refer to.
pub const MAX_FILES_PER_MESSAGE: usize = 32;

/// The uploaded files a message's Drafty `content` refers to: this
/// server's download addresses in its entities' `ref` and `preref`, each
/// once, in order.
pub fn referenced(content: &serde_json::Value) -> Vec<FileId> {
    let mut ids: Vec<FileId> = Vec::new();
    let entities = content.get("ent").and_then(|e| e.as_array());
    for data in entities.into_iter().flatten().filter_map(|e| e.get("data")) {
        for field in ["ref", "preref"] {
            let Some(id) = data
                .get(field)
                .and_then(|r| r.as_str())
                .and_then(FileId::from_reference)
            else {
                continue;
            };
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// Messages `[low, hi)` of `topic` no longer refer to anything (recalled,
/// deleted for everyone, moderated): their references go, and a file no
/// message or profile refers to any more is queued to go after
/// `retention_secs` (`delete_after`; the sweep removes it, a new reference
/// takes it back). Idempotent.
pub async fn unrefer(
    pool: &MySqlPool,
    topic: &str,
    low: i64,
    hi: i64,
    retention_secs: u64,
) -> sqlx::Result<usize> {
    let ids: Vec<(crate::exact::Exact,)> = sqlx::query_as(
        "SELECT DISTINCT file_id FROM im_file_refs WHERE topic = ? AND seq >= ? AND seq < ?",
    )
    .bind(topic)
    .bind(low)
    .bind(hi)
    .fetch_all(pool)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    sqlx::query("DELETE FROM im_file_refs WHERE topic = ? AND seq >= ? AND seq < ?")
        .bind(topic)
        .bind(low)
        .bind(hi)
        .execute(pool)
        .await?;
    let mut queued = 0;
    for (id,) in &ids {
        queued += usize::from(queue_if_unreferenced(pool, &id.0, retention_secs).await?);
    }
    Ok(queued)
}

/// Queues file `id` to go `retention_secs` from now (unless queued
/// already) when nothing refers to it any more: true when it was.
async fn queue_if_unreferenced<'e>(
    db: impl sqlx::Executor<'e, Database = sqlx::MySql>,
    id: &str,
    retention_secs: u64,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE im_files SET delete_after = COALESCE(delete_after, NOW(3) + INTERVAL ? SECOND) \
         WHERE file_id = ? AND NOT EXISTS (SELECT 1 FROM im_file_refs r WHERE r.file_id = ?)",
    )
    .bind(retention_secs)
    .bind(id)
    .bind(id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() > 0)
}
