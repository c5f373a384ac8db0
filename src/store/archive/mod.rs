//! Month archives in object storage (seed 000 §10), one component:
//! - [`format`] — format v2: an Avro container file in blocks, a per-topic
//!   seq index, a manifest with counts, seq ranges and the SHA-256 of every
//!   object; [`location`] — where a tenant's month lives.
//! - `writer` — `imstream shards archive` writes a sealed month's rows
//!   ([`export`]), read from its table by `rows`.
//! - `verify` — the archive against the table row for row ([`verify()`]);
//!   `imstream shards drop --confirm` drops the table only after that, and
//!   marks the month `archived` in the catalog ([`drop_month`]).
//! - [`reader`] — reads of an archived month, served from the archive.
//!
//! Archives of the first format (v1, JSON lines) are not read: a drop
//! refuses them (archive the month again while its table is there).

pub mod format;
pub mod location;
pub mod reader;
mod rows;
mod verify;
mod writer;

use std::path::PathBuf;

use sqlx::mysql::MySqlPool;

use super::catalog::{self, ShardStatus};
use super::month::ShardMonth;

pub use format::{
    ArchiveIndex, ArchivedRow, Manifest, ObjectRef, TopicSummary, DATA_OBJECT, FORMAT,
    INDEX_OBJECT, MANIFEST_OBJECT,
};
pub use location::{ArchiveLocation, LocationError};
pub use verify::{check_object, drop_month, read_manifest, verify};
pub use writer::export;

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

pub(super) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A scratch file removed when dropped.
pub(super) struct Scratch(PathBuf);

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
pub(super) async fn status_of(
    pool: &MySqlPool,
    month: ShardMonth,
) -> Result<ShardStatus, ArchiveError> {
    Ok(catalog::entry(pool, month)
        .await?
        .ok_or(ArchiveError::UnknownMonth(month))?
        .status)
}
