//! A conversation's files: which messages carry one. The references
//! pipeline records `(topic, seq, kind)` of every message whose Drafty
//! content holds an attachment entity; `GET /v1/groups/{topic}/files` lists
//! them newest first and resolves each through the read path, so the name,
//! size and link come from the message as it is now (a recalled file
//! shows as recalled, without them).
//!
//! File audit (seed 002 §7.2 `file.audit.update`): an operator's verdict
//! on a file message, `ok` or `blocked`, applied by the references pipeline
//! from `FileAuditUpdated`. A blocked file stays in the list (`audit:
//! "blocked"`) without its file (no name, size or link): its references no
//! longer show it. The message itself stays in history; taking it away is
//! `message.moderate`.

use serde_json::Value;
use sqlx::mysql::MySqlPool;

/// Largest page of files a client may ask for.
pub const MAX_LIMIT: i64 = 50;

/// What kind of file a Drafty entity carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Image,
    Audio,
    Video,
}

impl FileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Image => "image",
            FileKind::Audio => "audio",
            FileKind::Video => "video",
        }
    }

    /// The kind of a Drafty entity type (`EX` attachment, `IM` image,
    /// `AU` audio, `VD` video); other entities (links, mentions, buttons,
    /// forms) carry no file.
    pub fn of_entity(tp: &str) -> Option<FileKind> {
        match tp {
            "EX" => Some(FileKind::File),
            "IM" => Some(FileKind::Image),
            "AU" => Some(FileKind::Audio),
            "VD" => Some(FileKind::Video),
            _ => None,
        }
    }
}

/// The kind of the first file a message's content (Drafty JSON text)
/// carries, if any. Plain text, malformed JSON and entities without a file
/// give `None`.
pub fn file_kind(content: Option<&str>) -> Option<FileKind> {
    let content: Value = serde_json::from_str(content?).ok()?;
    content
        .get("ent")?
        .as_array()?
        .iter()
        .find_map(|e| FileKind::of_entity(e.get("tp")?.as_str()?))
}

/// What a client shows of a file: the first attachment entity's data
/// (name, mime type, size, link), without inline bytes (`val`).
pub fn attachment(content: &Value) -> Option<Value> {
    let entity = content.get("ent")?.as_array()?.iter().find(|e| {
        e.get("tp")
            .and_then(Value::as_str)
            .is_some_and(|tp| FileKind::of_entity(tp).is_some())
    })?;
    let kind = FileKind::of_entity(entity.get("tp")?.as_str()?)?;
    let mut data = entity.get("data").cloned().unwrap_or(Value::Null);
    if let Some(map) = data.as_object_mut() {
        map.remove("val");
    }
    Some(serde_json::json!({"kind": kind.as_str(), "data": data}))
}

/// A file message of a conversation, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    pub seq: i64,
    pub kind: String,
    /// `ok` or `blocked` ([`Audit`]).
    pub audit: String,
}

/// An operator's verdict on a file (`file.audit.update`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audit {
    Ok,
    Blocked,
}

impl Audit {
    pub fn as_str(self) -> &'static str {
        match self {
            Audit::Ok => "ok",
            Audit::Blocked => "blocked",
        }
    }

    pub fn parse(text: &str) -> Option<Audit> {
        match text {
            "ok" => Some(Audit::Ok),
            "blocked" => Some(Audit::Blocked),
            _ => None,
        }
    }
}

/// Whether `(topic, seq)` is a recorded file message.
pub async fn exists(pool: &MySqlPool, topic: &str, seq: i64) -> sqlx::Result<bool> {
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_group_files WHERE topic = ? AND seq = ?")
            .bind(topic)
            .bind(seq)
            .fetch_one(pool)
            .await?;
    Ok(n > 0)
}

/// Records an audit verdict (applied again, it writes the same values).
/// Returns whether the file message was recorded (an audit of a message
/// the pipeline has not recorded as a file changes nothing).
pub async fn set_audit(
    pool: &MySqlPool,
    topic: &str,
    seq: i64,
    audit: Audit,
    by: &str,
    at: i64,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "UPDATE im_group_files SET audit = ?, audited_by = ?, audited_at = ? WHERE topic = ? AND seq = ?",
    )
    .bind(audit.as_str())
    .bind(by)
    .bind(crate::store::writer::naive(at))
    .bind(topic)
    .bind(seq)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0 || exists(pool, topic, seq).await?)
}

/// Records file messages `(topic, seq, kind, created_at ms)`; recording
/// one twice changes nothing.
pub async fn record(pool: &MySqlPool, rows: &[(String, i64, FileKind, i64)]) -> sqlx::Result<()> {
    for chunk in rows.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO im_group_files (topic, seq, kind, created_at) ",
        );
        q.push_values(chunk, |mut r, (topic, seq, kind, at)| {
            r.push_bind(topic.as_str())
                .push_bind(*seq)
                .push_bind(kind.as_str())
                .push_bind(crate::store::writer::naive(*at));
        });
        // Recorded before: kept as it is (no INSERT IGNORE, which would
        // also turn a value that does not fit into a warning).
        q.push(" ON DUPLICATE KEY UPDATE seq = seq");
        q.build().execute(pool).await?;
    }
    Ok(())
}

/// The topic's file messages below seq `before` (all when `None`), newest
/// first, at most `limit`.
pub async fn list(
    pool: &MySqlPool,
    topic: &str,
    before: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<FileRef>> {
    let rows: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT seq, kind, audit FROM im_group_files WHERE topic = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
    )
    .bind(topic)
    .bind(before.unwrap_or(i64::MAX))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(seq, kind, audit)| FileRef { seq, kind, audit })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_images_audio_and_video_are_files_and_other_entities_are_not() {
        let drafty = |tp: &str| {
            format!(
                r#"{{"txt":" ","fmt":[{{"at":-1,"len":0,"key":0}}],"ent":[{{"tp":"{tp}","data":{{"mime":"x/y","name":"n","val":"QUJD","size":3}}}}]}}"#
            )
        };
        assert_eq!(file_kind(Some(&drafty("EX"))), Some(FileKind::File));
        assert_eq!(file_kind(Some(&drafty("IM"))), Some(FileKind::Image));
        assert_eq!(file_kind(Some(&drafty("AU"))), Some(FileKind::Audio));
        assert_eq!(file_kind(Some(&drafty("VD"))), Some(FileKind::Video));
        assert_eq!(file_kind(Some(&drafty("LN"))), None);
        assert_eq!(file_kind(Some(&drafty("MN"))), None);
        assert_eq!(file_kind(Some(r#""just text""#)), None);
        assert_eq!(file_kind(Some("{not json")), None);
        assert_eq!(file_kind(None), None);
    }

    #[test]
    fn the_first_file_entity_is_shown_without_its_inline_bytes() {
        let content: Value = serde_json::from_str(
            r#"{"txt":"see https://x.y and the file","ent":[{"tp":"LN","data":{"url":"https://x.y"}},
                {"tp":"EX","data":{"mime":"application/pdf","name":"plan.pdf","val":"JVBERi0=","size":5}}]}"#,
        )
        .unwrap();
        assert_eq!(
            attachment(&content),
            Some(
                serde_json::json!({"kind": "file", "data": {"mime": "application/pdf", "name": "plan.pdf", "size": 5}})
            )
        );
        assert_eq!(attachment(&serde_json::json!("text")), None);
    }
}
