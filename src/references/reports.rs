//! The moderation queue: reports of messages by members, read and closed
//! by operators through the admin API. The references pipeline applies
//! `MessageReported` (a report is recorded once: its id is derived from
//! the message and the reporter) and `MessageReportResolved`. Both events
//! are keyed by the conversation, so a report and its resolution are
//! applied in order, live and in a replay.

use sqlx::mysql::MySqlPool;
use sqlx::Row;

/// Longest reason a reporter may give (characters).
pub const MAX_REASON: usize = 500;
/// Largest page of reports an operator may ask for.
pub const MAX_LIMIT: i64 = 100;

/// Where a report stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Open,
    Dismissed,
    Actioned,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Open => "open",
            Status::Dismissed => "dismissed",
            Status::Actioned => "actioned",
        }
    }

    pub fn parse(text: &str) -> Option<Status> {
        match text {
            "open" => Some(Status::Open),
            "dismissed" => Some(Status::Dismissed),
            "actioned" => Some(Status::Actioned),
            _ => None,
        }
    }
}

/// The id of `reporter`'s report of `(topic, seq)`: one report per
/// reporter and message, whatever the retries.
pub fn report_id(topic: &str, seq: i64, reporter: i64) -> String {
    format!("{topic}.{seq}.{reporter}")
}

/// The reporter a report id names (topic names hold no `.`), if any.
pub fn reporter_of(report_id: &str) -> Option<i64> {
    report_id
        .rsplit_once('.')
        .and_then(|(_, uid)| uid.parse().ok())
        .filter(|uid| *uid > 0)
}

/// One report as the queue holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub report_id: String,
    pub topic: String,
    pub seq: i64,
    pub reporter: i64,
    pub reason: String,
    pub status: String,
    /// Epoch ms.
    pub created_at: i64,
    pub resolved_at: Option<i64>,
    pub resolved_by: Option<String>,
    pub note: String,
}

/// Records a report; a report already recorded stays as it is.
pub async fn record(
    pool: &MySqlPool,
    report_id: &str,
    topic: &str,
    seq: i64,
    reporter: i64,
    reason: &str,
    at: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO im_message_reports (report_id, topic, seq, reporter_uid, reason, status, created_at) \
         VALUES (?, ?, ?, ?, ?, 'open', ?) ON DUPLICATE KEY UPDATE seq = seq",
    )
    .bind(report_id)
    .bind(topic)
    .bind(seq)
    .bind(reporter)
    .bind(reason)
    .bind(crate::store::writer::naive(at))
    .execute(pool)
    .await?;
    Ok(())
}

/// Closes a report (applied again, it writes the same values).
pub async fn resolve(
    pool: &MySqlPool,
    report_id: &str,
    status: Status,
    by: &str,
    note: &str,
    at: i64,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_message_reports SET status = ?, resolved_by = ?, note = ?, resolved_at = ? WHERE report_id = ?",
    )
    .bind(status.as_str())
    .bind(by)
    .bind(note)
    .bind(crate::store::writer::naive(at))
    .bind(report_id)
    .execute(pool)
    .await?;
    Ok(())
}

const COLUMNS: &str = "report_id, topic, seq, reporter_uid, reason, status, created_at, resolved_at, resolved_by, note";

fn report_of(r: &sqlx::mysql::MySqlRow) -> sqlx::Result<Report> {
    let ms = |t: chrono::NaiveDateTime| t.and_utc().timestamp_millis();
    Ok(Report {
        report_id: r.try_get::<crate::exact::Exact, _>(0)?.into(),
        topic: r.try_get::<crate::exact::Exact, _>(1)?.into(),
        seq: r.try_get(2)?,
        reporter: r.try_get(3)?,
        reason: r.try_get(4)?,
        status: r.try_get(5)?,
        created_at: ms(r.try_get(6)?),
        resolved_at: r.try_get::<Option<chrono::NaiveDateTime>, _>(7)?.map(ms),
        resolved_by: r.try_get(8)?,
        note: r.try_get(9)?,
    })
}

pub async fn get(pool: &MySqlPool, report_id: &str) -> sqlx::Result<Option<Report>> {
    sqlx::query(&format!(
        "SELECT {COLUMNS} FROM im_message_reports WHERE report_id = ?"
    ))
    .bind(report_id)
    .fetch_optional(pool)
    .await?
    .as_ref()
    .map(report_of)
    .transpose()
}

/// Reports in `status`, oldest first (the queue's order), after the
/// report `after` (its creation time and id), at most `limit`.
pub async fn list(
    pool: &MySqlPool,
    status: Status,
    after: Option<(i64, &str)>,
    limit: i64,
) -> sqlx::Result<Vec<Report>> {
    let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(format!(
        "SELECT {COLUMNS} FROM im_message_reports WHERE status = "
    ));
    q.push_bind(status.as_str());
    if let Some((at, id)) = after {
        let at = crate::store::writer::naive(at);
        q.push(" AND (created_at > ")
            .push_bind(at)
            .push(" OR (created_at = ")
            .push_bind(at)
            .push(" AND report_id > ")
            .push_bind(id)
            .push("))");
    }
    q.push(" ORDER BY created_at, report_id LIMIT ")
        .push_bind(limit);
    q.build()
        .fetch_all(pool)
        .await?
        .iter()
        .map(report_of)
        .collect()
}
