//! Archiving a sealed month (seed 000 §10): `imstream shards archive`
//! exports its table as JSON lines plus a manifest (row count, per-topic
//! seq ranges, SHA-256 of the file); `imstream shards drop --confirm` drops
//! the table only after the archive verifies against the table, and marks
//! the month `archived` in the catalog. Reads of an archived month then
//! answer `HistoryError::Archived` (HTTP 410 / Tinode ctrl 410).
//!
//! Layout under the archive root: `<root>/<tenant>/<YYYYMM>/messages.jsonl`
//! and `manifest.json` beside it. One JSON object per row, keys sorted,
//! rows in `(topic, seqid)` order; JSON columns as JSON, times as the
//! stored `YYYY-MM-DD HH:MM:SS.fff` UTC text.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::Row;

use super::catalog::{self, ShardStatus};
use super::month::{Family, MonthTable, ShardMonth, ARCHIVE_COLUMNS};

/// Manifest format tag, bumped if the layout ever changes.
pub const FORMAT: &str = "imstream.month-archive.v1";
pub const DATA_FILE: &str = "messages.jsonl";
pub const MANIFEST_FILE: &str = "manifest.json";
/// Rows read per export query.
const PAGE_ROWS: i64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("month {0} is not in the catalog")]
    UnknownMonth(ShardMonth),
    #[error("month {0} is {1}; only a sealed month can be archived or dropped")]
    NotSealed(ShardMonth, ShardStatus),
    #[error("month {month}: the table and the route mirror disagree ({detail}); not archived")]
    MirrorMismatch { month: ShardMonth, detail: String },
    #[error("no archive of month {month} at {path}: run `imstream shards archive` first")]
    NoArchive { month: ShardMonth, path: String },
    #[error("archive of month {month} does not verify: {detail}")]
    Unverified { month: ShardMonth, detail: String },
    #[error("dropping month {0}'s table needs --confirm")]
    NotConfirmed(ShardMonth),
}

/// A topic's rows in the archived month.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSummary {
    pub topic: String,
    pub count: i64,
    pub min_seq: i64,
    pub max_seq: i64,
}

/// `manifest.json` of one archived month.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub tenant: String,
    pub shard_month: String,
    pub table: String,
    pub file: String,
    pub row_count: i64,
    /// Hex SHA-256 of the data file's bytes.
    pub sha256: String,
    pub topics: Vec<TopicSummary>,
    /// RFC 3339, when the export finished.
    pub exported_at: String,
}

/// Where the archive of `tenant`'s `month` lives under `root`.
pub fn archive_dir(root: &Path, tenant: &str, month: ShardMonth) -> PathBuf {
    root.join(tenant).join(month.to_string())
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The month's catalog status; unknown months are an error.
async fn status_of(pool: &MySqlPool, month: ShardMonth) -> Result<ShardStatus, ArchiveError> {
    Ok(catalog::entry(pool, month)
        .await?
        .ok_or(ArchiveError::UnknownMonth(month))?
        .status)
}

/// Exports a sealed month to `<root>/<tenant>/<YYYYMM>/` and returns its
/// manifest. Refused unless the month is `sealed` and its table agrees with
/// the route mirror (count and seq range of every topic).
pub async fn export(
    pool: &MySqlPool,
    tenant: &str,
    month: ShardMonth,
    root: &Path,
) -> Result<Manifest, ArchiveError> {
    let status = status_of(pool, month).await?;
    if status != ShardStatus::Sealed {
        return Err(ArchiveError::NotSealed(month, status));
    }
    let table = MonthTable::new(month);
    let topics = table_summary(pool, &table).await?;
    let mirror = mirror_summary(pool, month).await?;
    if topics != mirror {
        return Err(ArchiveError::MirrorMismatch {
            month,
            detail: first_difference(&topics, &mirror),
        });
    }

    let dir = archive_dir(root, tenant, month);
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let data = dir.join(DATA_FILE);
    let partial = dir.join(format!("{DATA_FILE}.partial"));
    let (row_count, sha256) = write_rows(pool, &table, &partial).await?;
    std::fs::rename(&partial, &data).map_err(io_err(&data))?;

    let manifest = Manifest {
        format: FORMAT.to_string(),
        tenant: tenant.to_string(),
        shard_month: month.to_string(),
        table: table.name(),
        file: DATA_FILE.to_string(),
        row_count,
        sha256,
        topics,
        exported_at: chrono::Utc::now().to_rfc3339(),
    };
    let path = dir.join(MANIFEST_FILE);
    let text = serde_json::to_string_pretty(&manifest).expect("manifest serializes");
    let partial = dir.join(format!("{MANIFEST_FILE}.partial"));
    std::fs::write(&partial, text).map_err(io_err(&partial))?;
    std::fs::rename(&partial, &path).map_err(io_err(&path))?;
    tracing::info!(tenant, %month, rows = row_count, dir = %dir.display(), "month archived to files");
    Ok(manifest)
}

/// Writes every row as one JSON line; returns the row count and the file's
/// hex SHA-256.
async fn write_rows(
    pool: &MySqlPool,
    table: &MonthTable,
    path: &Path,
) -> Result<(i64, String), ArchiveError> {
    let file = std::fs::File::create(path).map_err(io_err(path))?;
    let mut out = std::io::BufWriter::new(file);
    let mut hasher = Sha256::new();
    let mut rows = 0i64;
    // Group topics, then one-to-one topics: the route mirror's order.
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
                let mut line = serde_json::to_vec(&row_json(row)).expect("a JSON map serializes");
                line.push(b'\n');
                hasher.update(&line);
                out.write_all(&line).map_err(io_err(path))?;
                topic = row.try_get("topic")?;
                seq = row.try_get("seqid")?;
                rows += 1;
            }
            if (page.len() as i64) < PAGE_ROWS {
                break;
            }
        }
    }
    let file = out.into_inner().map_err(|e| ArchiveError::Io {
        path: path.display().to_string(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err(path))?;
    Ok((rows, hex::encode(hasher.finalize())))
}

/// One row as a JSON object: integers as numbers, JSON columns parsed,
/// other text as strings, NULL as null.
fn row_json(row: &MySqlRow) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::Value;
    let mut obj = serde_json::Map::new();
    for (i, name) in ARCHIVE_COLUMNS.iter().enumerate() {
        let value = if let Ok(n) = row.try_get::<Option<i64>, _>(i) {
            n.map_or(Value::Null, Value::from)
        } else {
            match row.try_get::<Option<String>, _>(i).ok().flatten() {
                None => Value::Null,
                Some(text) if matches!(*name, "content" | "head" | "mentioned_user_ids") => {
                    serde_json::from_str(&text).unwrap_or(Value::String(text))
                }
                Some(text) => Value::String(text),
            }
        };
        obj.insert((*name).to_string(), value);
    }
    obj
}

/// Per topic of every family's table of the month: group topics first,
/// then one-to-one topics (`grp…` sorts before `p2p…`, as in the mirror).
async fn table_summary(
    pool: &MySqlPool,
    table: &MonthTable,
) -> Result<Vec<TopicSummary>, ArchiveError> {
    let mut out = Vec::new();
    for family in Family::ALL {
        let rows: Vec<(String, i64, i64, i64)> =
            sqlx::query_as(&table.of_family(family).topic_summary_sql())
                .fetch_all(pool)
                .await?;
        out.extend(
            rows.into_iter()
                .map(|(topic, count, min_seq, max_seq)| TopicSummary {
                    topic,
                    count,
                    min_seq,
                    max_seq,
                }),
        );
    }
    Ok(out)
}

/// The route mirror's view of the month, in the same shape.
async fn mirror_summary(
    pool: &MySqlPool,
    month: ShardMonth,
) -> Result<Vec<TopicSummary>, ArchiveError> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT topic, message_count, min_seq, max_seq FROM im_group_message_topic_shards \
         WHERE shard_month = ? AND message_count > 0 ORDER BY topic",
    )
    .bind(month.to_string())
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(topic, count, min_seq, max_seq)| TopicSummary {
            topic,
            count,
            min_seq,
            max_seq,
        })
        .collect())
}

fn first_difference(table: &[TopicSummary], mirror: &[TopicSummary]) -> String {
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

/// Reads the manifest and checks the data file against it (row count,
/// SHA-256) and, while the table still exists, against the table (row
/// count and per-topic seq ranges).
pub async fn verify(
    pool: &MySqlPool,
    tenant: &str,
    month: ShardMonth,
    root: &Path,
) -> Result<Manifest, ArchiveError> {
    let dir = archive_dir(root, tenant, month);
    let manifest_path = dir.join(MANIFEST_FILE);
    let unverified = |detail: String| ArchiveError::Unverified { month, detail };
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ArchiveError::NoArchive {
                month,
                path: manifest_path.display().to_string(),
            })
        }
        Err(e) => return Err(io_err(&manifest_path)(e)),
    };
    let manifest: Manifest = serde_json::from_str(&text)
        .map_err(|e| unverified(format!("{}: {e}", manifest_path.display())))?;
    if manifest.format != FORMAT
        || manifest.tenant != tenant
        || manifest.shard_month != month.to_string()
    {
        return Err(unverified(format!(
            "the manifest is {} of tenant {} month {}",
            manifest.format, manifest.tenant, manifest.shard_month
        )));
    }
    let data = dir.join(&manifest.file);
    let (lines, sha256) = hash_lines(&data)?;
    if sha256 != manifest.sha256 {
        return Err(unverified(format!(
            "{} has SHA-256 {sha256}, the manifest says {}",
            data.display(),
            manifest.sha256
        )));
    }
    if lines != manifest.row_count {
        return Err(unverified(format!(
            "{} has {lines} row(s), the manifest says {}",
            data.display(),
            manifest.row_count
        )));
    }
    if catalog::table_exists(pool, month).await? {
        let table = MonthTable::new(month);
        let topics = table_summary(pool, &table).await?;
        if topics != manifest.topics {
            return Err(unverified(format!(
                "the table no longer matches the archive ({})",
                first_difference(&topics, &manifest.topics)
            )));
        }
        let mut rows = 0i64;
        for family in Family::ALL {
            let n: i64 = sqlx::query_scalar(&table.of_family(family).count_sql())
                .fetch_one(pool)
                .await?;
            rows += n;
        }
        if rows != manifest.row_count {
            return Err(unverified(format!(
                "the table has {rows} row(s), the archive {}",
                manifest.row_count
            )));
        }
    }
    Ok(manifest)
}

/// Line count and hex SHA-256 of a file.
fn hash_lines(path: &Path) -> Result<(i64, String), ArchiveError> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    let mut reader = std::io::BufReader::new(file);
    let mut hasher = Sha256::new();
    let (mut lines, mut buf) = (0i64, Vec::new());
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf);
        lines += 1;
    }
    Ok((lines, hex::encode(hasher.finalize())))
}

/// Drops a sealed month's table after its archive verifies, and marks the
/// month `archived` (first, so reads answer "archived" rather than "no
/// table"). Re-running it on an `archived` month whose table is still there
/// finishes the drop.
pub async fn drop_month(
    pool: &MySqlPool,
    tenant: &str,
    month: ShardMonth,
    root: &Path,
    confirmed: bool,
) -> Result<Manifest, ArchiveError> {
    let status = status_of(pool, month).await?;
    if !matches!(status, ShardStatus::Sealed | ShardStatus::Archived) {
        return Err(ArchiveError::NotSealed(month, status));
    }
    let manifest = verify(pool, tenant, month, root).await?;
    if !confirmed {
        return Err(ArchiveError::NotConfirmed(month));
    }
    catalog::mark_archived(pool, month, manifest.row_count).await?;
    for family in Family::ALL {
        sqlx::query(&MonthTable::new(month).of_family(family).drop_sql())
            .execute(pool)
            .await?;
    }
    tracing::warn!(tenant, %month, rows = manifest.row_count, "month table dropped after a verified archive");
    Ok(manifest)
}
