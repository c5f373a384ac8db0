//! Archiving a sealed month (seed 000 §10): `imstream shards archive`
//! writes its rows to object storage (format v2, [`format`]: an Avro
//! container file in blocks, a per-topic seq index, a manifest with counts,
//! seq ranges and the SHA-256 of every object) at an [`ArchiveLocation`];
//! `imstream shards drop --confirm` drops the table only after the archive
//! verifies against the table row for row, and marks the month `archived`
//! in the catalog. Reads of an archived month are then served from the
//! archive (`crate::store::archive::reader`).
//!
//! Archives of the first format (v1, JSON lines) are not read: a drop
//! refuses them (archive the month again while its table is there).

pub mod format;
pub mod location;
pub mod reader;

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use futures::StreamExt;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::Row;

use super::catalog::{self, ShardStatus};
use super::month::{Family, MonthTable, ShardMonth};
use crate::exact::Exact;

pub use format::{
    ArchiveIndex, ArchivedRow, Manifest, ObjectRef, TopicSummary, DATA_OBJECT, FORMAT,
    INDEX_OBJECT, MANIFEST_OBJECT,
};
pub use location::{ArchiveLocation, LocationError};

/// Rows read per export query.
const PAGE_ROWS: i64 = 1000;
/// Objects up to this size go up in one PUT; larger ones in parts.
const SINGLE_PUT_BYTES: u64 = 32 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("month {month}: object store at {location}: {source}")]
    Store {
        month: ShardMonth,
        location: String,
        source: object_store::Error,
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

fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A scratch file removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tenant: &str, month: ShardMonth) -> Scratch {
        Scratch(std::env::temp_dir().join(format!(
            "imstream-archive-{tenant}-{month}-{}.avro",
            uuid::Uuid::new_v4().simple()
        )))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The month's catalog status; unknown months are an error.
async fn status_of(pool: &MySqlPool, month: ShardMonth) -> Result<ShardStatus, ArchiveError> {
    Ok(catalog::entry(pool, month)
        .await?
        .ok_or(ArchiveError::UnknownMonth(month))?
        .status)
}

/// Exports a sealed month to `<location>/<tenant>/<YYYYMM>/` and returns
/// its manifest. Refused unless the month is `sealed` and its table agrees
/// with the route mirror (count and seq range of every topic).
pub async fn export(
    pool: &MySqlPool,
    tenant: &str,
    month: ShardMonth,
    location: &ArchiveLocation,
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

    // The data object is built in a scratch file (a month can be large),
    // then uploaded; the manifest goes last, so a month with a manifest is
    // a complete archive.
    let scratch = Scratch::new(tenant, month);
    let file = std::fs::File::create(&scratch.0).map_err(io_err(&scratch.0))?;
    let avro_err = |e: apache_avro::Error| ArchiveError::Unverified {
        month,
        detail: format!("writing the data object: {e}"),
    };
    let mut writer = format::ArchiveWriter::new(BufWriter::new(file)).map_err(avro_err)?;
    for_each_row(pool, &table, |row| writer.append(&row).map_err(avro_err)).await?;
    let written = writer.finish().map_err(avro_err)?;
    let file = written.inner.into_inner().map_err(|e| ArchiveError::Io {
        path: scratch.0.display().to_string(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err(&scratch.0))?;
    drop(file);

    let store_err = |source| ArchiveError::Store {
        month,
        location: location.to_string(),
        source,
    };
    let store = location.store();
    upload_file(
        store.as_ref(),
        &location.object(tenant, month, DATA_OBJECT),
        &scratch.0,
    )
    .await
    .map_err(|e| match e {
        UploadError::Io(source) => io_err(&scratch.0)(source),
        UploadError::Store(source) => store_err(source),
    })?;
    let index = serde_json::to_vec(&written.index).expect("the index serializes");
    let index_ref = ObjectRef {
        name: INDEX_OBJECT.to_string(),
        bytes: index.len() as u64,
        sha256: format::sha256_hex(&index),
    };
    store
        .put(
            &location.object(tenant, month, INDEX_OBJECT),
            PutPayload::from(index),
        )
        .await
        .map_err(store_err)?;

    let manifest = Manifest {
        format: FORMAT.to_string(),
        tenant: tenant.to_string(),
        shard_month: month.to_string(),
        tables: Family::ALL
            .iter()
            .map(|f| table.of_family(*f).name())
            .collect(),
        row_count: written.row_count,
        rows_sha256: written.rows_sha256,
        codec: format::CODEC.to_string(),
        block_rows: format::BLOCK_ROWS,
        objects: vec![written.data, index_ref],
        topics,
        exported_at: chrono::Utc::now().to_rfc3339(),
    };
    let text = serde_json::to_vec_pretty(&manifest).expect("the manifest serializes");
    store
        .put(
            &location.object(tenant, month, MANIFEST_OBJECT),
            PutPayload::from(text),
        )
        .await
        .map_err(store_err)?;
    tracing::info!(tenant, %month, rows = manifest.row_count, at = %location.month_shown(tenant, month), "month archived");
    Ok(manifest)
}

enum UploadError {
    Io(std::io::Error),
    Store(object_store::Error),
}

/// Uploads a file: one PUT when small, a multipart upload otherwise.
async fn upload_file(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    file: &std::path::Path,
) -> Result<(), UploadError> {
    let size = std::fs::metadata(file).map_err(UploadError::Io)?.len();
    if size <= SINGLE_PUT_BYTES {
        let bytes = std::fs::read(file).map_err(UploadError::Io)?;
        store
            .put(path, PutPayload::from(bytes))
            .await
            .map_err(UploadError::Store)?;
        return Ok(());
    }
    let upload = store
        .put_multipart(path)
        .await
        .map_err(UploadError::Store)?;
    let mut parts = WriteMultipart::new(upload);
    let mut reader = BufReader::new(std::fs::File::open(file).map_err(UploadError::Io)?);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf).map_err(UploadError::Io)?;
        if n == 0 {
            break;
        }
        parts
            .wait_for_capacity(4)
            .await
            .map_err(UploadError::Store)?;
        parts.write(&buf[..n]);
    }
    parts.finish().await.map_err(UploadError::Store)?;
    Ok(())
}

/// Every row of the month's tables (group family first, then one-to-one;
/// each in `(topic, seq)` order), as archived.
async fn for_each_row(
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
fn int(row: &MySqlRow, i: usize) -> Result<Option<i64>, sqlx::Error> {
    if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
        return Ok(v);
    }
    if let Ok(v) = row.try_get::<Option<bool>, _>(i) {
        return Ok(v.map(i64::from));
    }
    row.try_get::<Option<i32>, _>(i).map(|v| v.map(i64::from))
}

fn required<T>(v: Option<T>, name: &str) -> Result<T, sqlx::Error> {
    v.ok_or_else(|| sqlx::Error::Decode(format!("column {name} is NULL").into()))
}

/// One row of [`MonthTable::export_page_sql`] (columns in
/// `ARCHIVE_COLUMNS` order, then `created_ms`).
fn archived_row(row: &MySqlRow) -> Result<ArchivedRow, sqlx::Error> {
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
async fn table_summary(
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
async fn mirror_summary(
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

/// Reads the manifest of a month (`None` when there is none).
pub async fn read_manifest(
    location: &ArchiveLocation,
    tenant: &str,
    month: ShardMonth,
) -> Result<Option<Manifest>, ArchiveError> {
    let unverified = |detail: String| ArchiveError::Unverified { month, detail };
    let path = location.object(tenant, month, MANIFEST_OBJECT);
    let bytes = match location.store().get(&path).await {
        Ok(got) => got.bytes().await,
        Err(e) => Err(e),
    };
    let bytes = match bytes {
        Ok(b) => b,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(source) => {
            return Err(ArchiveError::Store {
                month,
                location: location.to_string(),
                source,
            })
        }
    };
    let raw: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| unverified(format!("{MANIFEST_OBJECT}: {e}")))?;
    if raw["format"] == format::FORMAT_V1 {
        return Err(unverified(format!(
            "it is in the old format {} (JSON lines); run `imstream shards archive` again to write {FORMAT}",
            format::FORMAT_V1
        )));
    }
    let manifest: Manifest =
        serde_json::from_value(raw).map_err(|e| unverified(format!("{MANIFEST_OBJECT}: {e}")))?;
    if manifest.format != FORMAT
        || manifest.tenant != tenant
        || manifest.shard_month != month.to_string()
    {
        return Err(unverified(format!(
            "the manifest is {} of tenant {} month {}",
            manifest.format, manifest.tenant, manifest.shard_month
        )));
    }
    Ok(Some(manifest))
}

/// Reads the manifest and checks every object against it (length and
/// SHA-256 of the data object, its index and each block; every row decoded
/// and digested) and, while the table still exists, the table against the
/// archive: per-topic seq ranges, row count and the digest of every row.
pub async fn verify(
    pool: &MySqlPool,
    tenant: &str,
    month: ShardMonth,
    location: &ArchiveLocation,
) -> Result<Manifest, ArchiveError> {
    let unverified = |detail: String| ArchiveError::Unverified { month, detail };
    let store_err = |source| ArchiveError::Store {
        month,
        location: location.to_string(),
        source,
    };
    let Some(manifest) = read_manifest(location, tenant, month).await? else {
        return Err(ArchiveError::NoArchive {
            month,
            path: location.month_shown(tenant, month),
        });
    };
    let expect = |name: &str| {
        manifest
            .object(name)
            .cloned()
            .ok_or_else(|| unverified(format!("the manifest lists no {name}")))
    };
    let (data_ref, index_ref) = (expect(DATA_OBJECT)?, expect(INDEX_OBJECT)?);

    // The index, whole.
    let index_bytes = get_whole(location, tenant, month, INDEX_OBJECT)
        .await
        .map_err(|e| match e {
            object_store::Error::NotFound { .. } => {
                unverified(format!("{INDEX_OBJECT} is missing"))
            }
            other => store_err(other),
        })?;
    check_object(&index_ref, &index_bytes).map_err(unverified)?;
    let index: ArchiveIndex = serde_json::from_slice(&index_bytes)
        .map_err(|e| unverified(format!("{INDEX_OBJECT}: {e}")))?;

    // The data object, streamed into a scratch file and hashed.
    let scratch = Scratch::new(tenant, month);
    let path = location.object(tenant, month, DATA_OBJECT);
    let mut stream = match location.store().get(&path).await {
        Ok(got) => got.into_stream(),
        Err(object_store::Error::NotFound { .. }) => {
            return Err(unverified(format!("{DATA_OBJECT} is missing")))
        }
        Err(e) => return Err(store_err(e)),
    };
    let mut file = BufWriter::new(std::fs::File::create(&scratch.0).map_err(io_err(&scratch.0))?);
    let (mut hasher, mut bytes) = (Sha256::new(), 0u64);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(store_err)?;
        hasher.update(&chunk);
        bytes += chunk.len() as u64;
        file.write_all(&chunk).map_err(io_err(&scratch.0))?;
    }
    file.flush().map_err(io_err(&scratch.0))?;
    drop(file);
    let sha = hex::encode(hasher.finalize());
    if bytes != data_ref.bytes || sha != data_ref.sha256 {
        return Err(unverified(format!(
            "{DATA_OBJECT} has {bytes} byte(s) with SHA-256 {sha}; the manifest says {} byte(s) with {}",
            data_ref.bytes, data_ref.sha256
        )));
    }
    // Every block where the index says, with the index's hash.
    let mut file = std::fs::File::open(&scratch.0).map_err(io_err(&scratch.0))?;
    let mut at = index.header_len;
    for (i, b) in index.blocks.iter().enumerate() {
        if b.offset != at {
            return Err(unverified(format!(
                "block {i} starts at {} in the index, after the previous one at {at}",
                b.offset
            )));
        }
        let mut buf = vec![0u8; b.len as usize];
        file.seek(SeekFrom::Start(b.offset))
            .and_then(|_| file.read_exact(&mut buf))
            .map_err(io_err(&scratch.0))?;
        if format::sha256_hex(&buf) != b.sha256 {
            return Err(unverified(format!(
                "block {i} does not match its hash in the index"
            )));
        }
        at += b.len;
    }
    if at != bytes {
        return Err(unverified(format!(
            "the index's blocks end at {at}, the data object at {bytes}"
        )));
    }
    // Every row, decoded and digested as the export digested it.
    file.seek(SeekFrom::Start(0)).map_err(io_err(&scratch.0))?;
    let reader = apache_avro::Reader::new(BufReader::new(file))
        .map_err(|e| unverified(format!("{DATA_OBJECT}: {e}")))?;
    let (mut rows, mut digest) = (0i64, Sha256::new());
    for value in reader {
        let value = value.map_err(|e| unverified(format!("{DATA_OBJECT}: {e}")))?;
        let row = ArchivedRow::from_value(value)
            .map_err(|e| unverified(format!("{DATA_OBJECT}: {e}")))?;
        digest.update(row.datum());
        rows += 1;
    }
    let rows_sha = hex::encode(digest.finalize());
    if rows != manifest.row_count || rows_sha != manifest.rows_sha256 {
        return Err(unverified(format!(
            "{DATA_OBJECT} holds {rows} row(s) with digest {rows_sha}; the manifest says {} with {}",
            manifest.row_count, manifest.rows_sha256
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
        let (mut rows, mut digest) = (0i64, Sha256::new());
        for_each_row(pool, &table, |row| {
            digest.update(row.datum());
            rows += 1;
            Ok(())
        })
        .await?;
        let table_sha = hex::encode(digest.finalize());
        if rows != manifest.row_count || table_sha != manifest.rows_sha256 {
            return Err(unverified(format!(
                "the table has {rows} row(s) with digest {table_sha}, the archive {} with {} \
                 (a row changed since the export?)",
                manifest.row_count, manifest.rows_sha256
            )));
        }
    }
    Ok(manifest)
}

async fn get_whole(
    location: &ArchiveLocation,
    tenant: &str,
    month: ShardMonth,
    name: &str,
) -> Result<bytes::Bytes, object_store::Error> {
    location
        .store()
        .get(&location.object(tenant, month, name))
        .await?
        .bytes()
        .await
}

/// An object read whole against its manifest entry.
pub fn check_object(expected: &ObjectRef, bytes: &[u8]) -> Result<(), String> {
    let sha = format::sha256_hex(bytes);
    if bytes.len() as u64 != expected.bytes || sha != expected.sha256 {
        return Err(format!(
            "{} has {} byte(s) with SHA-256 {sha}; the manifest says {} byte(s) with {}",
            expected.name,
            bytes.len(),
            expected.bytes,
            expected.sha256
        ));
    }
    Ok(())
}

/// Drops a sealed month's table after its archive verifies, and marks the
/// month `archived` (first, so reads go to the archive rather than find no
/// table). Re-running it on an `archived` month whose table is still there
/// finishes the drop.
pub async fn drop_month(
    pool: &MySqlPool,
    tenant: &str,
    month: ShardMonth,
    location: &ArchiveLocation,
    confirmed: bool,
) -> Result<Manifest, ArchiveError> {
    let status = status_of(pool, month).await?;
    if !matches!(status, ShardStatus::Sealed | ShardStatus::Archived) {
        return Err(ArchiveError::NotSealed(month, status));
    }
    let manifest = verify(pool, tenant, month, location).await?;
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
