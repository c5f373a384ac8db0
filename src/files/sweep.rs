//! Files nobody needs any more, removed by the shard manager's pass
//! (issue 41): uploads a gateway began and never finished (it was killed
//! or lost the store half way: the record says `uploading` past
//! `files.upload_timeout_secs`), uploads no message or profile
//! referred to within `files.unreferenced_ttl_secs`, and files whose last
//! message went (recalled, deleted for everyone, moderated: the references
//! projection queued them) once `delete_after` has passed. The record leaves
//! serving first (a conditional update, so a file referred to meanwhile is
//! kept), then the object goes, then the record: a pass cut short anywhere
//! is finished by the next one.

use sqlx::mysql::MySqlPool;

use crate::config::FilesConfig;

use super::store::FileStore;
use super::FileId;

/// Most files one pass removes per tenant and kind (the next pass goes on).
pub const SWEEP_BATCH: i64 = 500;

/// What one pass removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Uploads that never completed.
    pub abandoned: u64,
    /// Uploads nothing referred to in time.
    pub unreferenced: u64,
    /// Files whose last message went, past their retention.
    pub retained: u64,
}

/// One sweep of a tenant's files.
pub async fn sweep(
    tenant: &str,
    pool: &MySqlPool,
    store: &FileStore,
    config: &FilesConfig,
) -> anyhow::Result<Swept> {
    let mut swept = Swept::default();
    // A gateway may still be writing until its upload times out.
    let stale: Vec<(crate::exact::Exact, i64)> = sqlx::query_as(
        "SELECT file_id, uploader_uid FROM im_files WHERE state = 'uploading' \
         AND created_at < NOW(3) - INTERVAL ? SECOND LIMIT ?",
    )
    .bind(config.upload_timeout_secs + 60)
    .bind(SWEEP_BATCH)
    .fetch_all(pool)
    .await?;
    for (id, uploader) in stale {
        if remove(tenant, pool, store, &id.0, uploader, "uploading").await {
            swept.abandoned += 1;
        }
    }
    let unreferenced: Vec<(crate::exact::Exact, i64)> = sqlx::query_as(
        "SELECT file_id, uploader_uid FROM im_files WHERE state IN ('stored', 'deleted') \
         AND referenced_at IS NULL AND created_at < NOW(3) - INTERVAL ? SECOND LIMIT ?",
    )
    .bind(config.unreferenced_ttl_secs)
    .bind(SWEEP_BATCH)
    .fetch_all(pool)
    .await?;
    for (id, uploader) in unreferenced {
        // Referred to since it was listed: kept.
        let leaving = sqlx::query(
            "UPDATE im_files SET state = 'deleted' \
             WHERE file_id = ? AND referenced_at IS NULL AND state IN ('stored', 'deleted')",
        )
        .bind(&id.0)
        .execute(pool)
        .await?;
        if leaving.rows_affected() == 1 {
            if remove(tenant, pool, store, &id.0, uploader, "deleted").await {
                swept.unreferenced += 1;
            }
        }
    }
    let expired: Vec<(crate::exact::Exact, i64)> = sqlx::query_as(
        "SELECT file_id, uploader_uid FROM im_files \
         WHERE delete_after IS NOT NULL AND delete_after < NOW(3) LIMIT ?",
    )
    .bind(SWEEP_BATCH)
    .fetch_all(pool)
    .await?;
    for (id, uploader) in expired {
        // Referred to again since (or by a profile): kept.
        let leaving = sqlx::query(
            "UPDATE im_files SET state = 'deleted' WHERE file_id = ? AND delete_after < NOW(3) \
             AND NOT EXISTS (SELECT 1 FROM im_file_refs r WHERE r.file_id = ?)",
        )
        .bind(&id.0)
        .bind(&id.0)
        .execute(pool)
        .await?;
        if leaving.rows_affected() == 1 {
            if remove(tenant, pool, store, &id.0, uploader, "deleted").await {
                swept.retained += 1;
            }
        }
    }
    for (why, n) in [
        ("abandoned", swept.abandoned),
        ("unreferenced", swept.unreferenced),
        ("retention", swept.retained),
    ] {
        if n > 0 {
            metrics::counter!(crate::metrics::FILES_SWEPT_TOTAL, "why" => why).increment(n);
        }
    }
    Ok(swept)
}

/// The object, then its record (still in `state`); whether both went. A
/// file that cannot go now is logged and left for the next pass: it never
/// stops the others.
async fn remove(
    tenant: &str,
    pool: &MySqlPool,
    store: &FileStore,
    id: &str,
    uploader: i64,
    state: &str,
) -> bool {
    let removed = async {
        if let Some(file) = FileId::parse(id) {
            let key = store.key(tenant, uploader, &file);
            store.delete(&key).await?;
            store.discard_staged(&key);
        }
        sqlx::query("DELETE FROM im_files WHERE file_id = ? AND state = ?")
            .bind(id)
            .bind(state)
            .execute(pool)
            .await?;
        anyhow::Ok(())
    }
    .await;
    match removed {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(tenant, file = id, error = %e, "a file was not swept; the next pass tries again");
            false
        }
    }
}
