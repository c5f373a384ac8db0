//! `imstream shards archive`: a sealed month's rows exported to object
//! storage (data file, per-topic seq index, manifest), uploaded whole or
//! in parts.

use std::io::{BufReader, BufWriter, Read};

use object_store::{ObjectStore, PutPayload, WriteMultipart};
use sqlx::mysql::MySqlPool;

use crate::store::catalog::ShardStatus;
use crate::store::month::{Family, MonthTable, ShardMonth};

use super::rows::{first_difference, for_each_row, mirror_summary, table_summary};
use super::*;

/// Objects up to this size go up in one PUT; larger ones in parts.
pub(super) const SINGLE_PUT_BYTES: u64 = 32 << 20;

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

pub(super) enum UploadError {
    Io(std::io::Error),
    Store(object_store::Error),
}

/// Uploads a file: one PUT when small, a multipart upload otherwise.
pub(super) async fn upload_file(
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
