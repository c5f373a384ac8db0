//! Reading a month table for an archive: its rows in seq order per topic,
//! as archived rows, and the per-topic summaries (counts, seq ranges) the
//! manifest, the mirror and a verification compare.

use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::Row;

use crate::exact::Exact;
use crate::store::month::{Family, MonthTable, ShardMonth};

use super::{ArchiveError, ArchivedRow, TopicSummary};

/// Rows read per export query.
pub(super) const PAGE_ROWS: i64 = 1000;

/// Every row of the month's tables (group family first, then one-to-one;
/// each in `(topic, seq)` order), as archived.
pub(super) async fn for_each_row(
    pool: &MySqlPool,
    table: &MonthTable,
    mut visit: impl FnMut(ArchivedRow) -> Result<(), ArchiveError>,
) -> Result<(), ArchiveError> {
    for family in Family::ALL {
        let sql = table.of_family(family).export_page_sql();
        let (mut topic, mut seq) = (String::new(), i64::MIN);
        loop {
            let page = sqlx::query(&sql)
                .bind(&topic)
                .bind(&topic)
                .bind(seq)
                .bind(PAGE_ROWS)
                .fetch_all(pool)
                .await?;
            for row in &page {
                let row = archived_row(row)?;
                topic = row.topic.clone();
                seq = row.seqid;
                visit(row)?;
            }
            if (page.len() as i64) < PAGE_ROWS {
                break;
            }
        }
    }
    Ok(())
}

/// An integer column, whatever width MySQL reports (TINYINT(1) as bool).
pub(super) fn int(row: &MySqlRow, i: usize) -> Result<Option<i64>, sqlx::Error> {
    if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
        return Ok(v);
    }
    if let Ok(v) = row.try_get::<Option<bool>, _>(i) {
        return Ok(v.map(i64::from));
    }
    row.try_get::<Option<i32>, _>(i).map(|v| v.map(i64::from))
}

pub(super) fn required<T>(v: Option<T>, name: &str) -> Result<T, sqlx::Error> {
    v.ok_or_else(|| sqlx::Error::Decode(format!("column {name} is NULL").into()))
}

/// One row of [`MonthTable::export_page_sql`] (columns in
/// `ARCHIVE_COLUMNS` order, then `created_ms`).
pub(super) fn archived_row(row: &MySqlRow) -> Result<ArchivedRow, sqlx::Error> {
    let text = |i: usize| row.try_get::<Option<String>, _>(i);
    let exact =
        |i: usize| Ok::<_, sqlx::Error>(row.try_get::<Option<Exact>, _>(i)?.map(String::from));
    Ok(ArchivedRow {
        message_id: required(int(row, 0)?, "message_id")?,
        topic: required(exact(1)?, "topic")?,
        group_id: required(int(row, 2)?, "group_id")?,
        seqid: required(int(row, 3)?, "seqid")?,
        from_user: required(int(row, 4)?, "from_user")?,
        client_msg_id: exact(5)?,
        msg_type: required(text(6)?, "msg_type")?,
        status: required(text(7)?, "status")?,
        content: text(8)?,
        head: text(9)?,
        mentioned_user_ids: text(10)?,
        mention_all: required(int(row, 11)?, "mention_all")?,
        reply_seqid: int(row, 12)?,
        root_seqid: int(row, 13)?,
        file_count: required(int(row, 14)?, "file_count")?,
        content_size: required(int(row, 15)?, "content_size")?,
        has_risk: required(int(row, 16)?, "has_risk")?,
        audit_status: required(text(17)?, "audit_status")?,
        version: required(int(row, 18)?, "version")?,
        recalled_at: text(19)?,
        recalled_by: int(row, 20)?,
        deleted_at: text(21)?,
        expires_at: text(22)?,
        created_at: required(text(23)?, "created_at")?,
        updated_at: required(text(24)?, "updated_at")?,
        created_ms: required(int(row, 25)?, "created_ms")?,
    })
}

/// Per topic of every family's table of the month: group topics first,
/// then one-to-one topics (`grp…` sorts before `p2p…`, as in the mirror).
pub(super) async fn table_summary(
    pool: &MySqlPool,
    table: &MonthTable,
) -> Result<Vec<TopicSummary>, ArchiveError> {
    let mut out = Vec::new();
    for family in Family::ALL {
        let rows: Vec<(Exact, i64, i64, i64)> =
            sqlx::query_as(&table.of_family(family).topic_summary_sql())
                .fetch_all(pool)
                .await?;
        out.extend(
            rows.into_iter()
                .map(|(topic, count, min_seq, max_seq)| TopicSummary {
                    topic: topic.into(),
                    count,
                    min_seq,
                    max_seq,
                }),
        );
    }
    Ok(out)
}

/// The route mirror's view of the month, in the same shape.
pub(super) async fn mirror_summary(
    pool: &MySqlPool,
    month: ShardMonth,
) -> Result<Vec<TopicSummary>, ArchiveError> {
    let rows: Vec<(Exact, i64, i64, i64)> = sqlx::query_as(
        "SELECT topic, message_count, min_seq, max_seq FROM im_group_message_topic_shards \
         WHERE shard_month = ? AND message_count > 0 ORDER BY topic",
    )
    .bind(month.to_string())
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(topic, count, min_seq, max_seq)| TopicSummary {
            topic: topic.into(),
            count,
            min_seq,
            max_seq,
        })
        .collect())
}

pub(super) fn first_difference(table: &[TopicSummary], mirror: &[TopicSummary]) -> String {
    for t in table {
        match mirror.iter().find(|m| m.topic == t.topic) {
            None => return format!("topic {} is in the table but not in the mirror", t.topic),
            Some(m) if m != t => {
                return format!(
                    "topic {}: table {} row(s) seq {}..={}, mirror {} row(s) seq {}..={}",
                    t.topic, t.count, t.min_seq, t.max_seq, m.count, m.min_seq, m.max_seq
                )
            }
            Some(_) => {}
        }
    }
    match mirror
        .iter()
        .find(|m| !table.iter().any(|t| t.topic == m.topic))
    {
        Some(m) => format!("topic {} is in the mirror but not in the table", m.topic),
        None => "summaries differ".to_string(),
    }
}
