//! Verifying an archive against its table, row for row and object by
//! object (SHA-256 in the manifest), and `imstream shards drop`, which
//! drops the table only after that verification.

use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use futures::StreamExt;
use object_store::ObjectStore;
use sha2::{Digest, Sha256};
use sqlx::mysql::MySqlPool;

use crate::store::catalog::{self, ShardStatus};
use crate::store::month::{Family, MonthTable, ShardMonth};

use super::rows::{first_difference, for_each_row, table_summary};
use super::*;

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

pub(super) async fn get_whole(
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
