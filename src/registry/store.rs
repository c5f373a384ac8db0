//! Persistence of the embedded registry in MySQL/MariaDB: schemas (global
//! ids, deduplicated by fingerprint), subject versions (soft-deletable), and
//! compatibility config (global and per subject).

use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::Row;

use super::compat::{Level, DEFAULT_LEVEL};

/// Migrations of the registry's own database.
pub static REGISTRY_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/registry");

/// One version of a subject.
#[derive(Debug, Clone)]
pub struct SubjectVersion {
    pub subject: String,
    pub version: i32,
    pub id: i32,
    pub schema: String,
}

#[derive(Clone)]
pub struct RegistryStore {
    pool: MySqlPool,
}

/// The key under which the global compatibility level is stored.
const GLOBAL: &str = "";

/// Reads a text column of a `_bin` collation (which MySQL reports as
/// binary) as UTF-8.
fn text(row: &MySqlRow, index: usize) -> sqlx::Result<String> {
    let bytes: Vec<u8> = row.try_get(index)?;
    String::from_utf8(bytes).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

pub fn fingerprint(normalized: &str) -> String {
    hex::encode(Sha256::digest(normalized.as_bytes()))
}

impl RegistryStore {
    pub fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }

    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        REGISTRY_MIGRATOR.run(&self.pool).await
    }

    pub async fn subjects(&self) -> sqlx::Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT DISTINCT subject FROM sr_subject_versions WHERE deleted = 0 ORDER BY subject",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| text(r, 0)).collect()
    }

    /// Live (not soft-deleted) versions of a subject, oldest first.
    pub async fn versions(&self, subject: &str) -> sqlx::Result<Vec<SubjectVersion>> {
        let rows = sqlx::query(
            "SELECT v.version, v.schema_id, s.schema_text FROM sr_subject_versions v \
             JOIN sr_schemas s ON s.id = v.schema_id \
             WHERE v.subject = ? AND v.deleted = 0 ORDER BY v.version",
        )
        .bind(subject)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(SubjectVersion {
                    subject: subject.to_string(),
                    version: r.try_get(0)?,
                    id: r.try_get(1)?,
                    schema: text(r, 2)?,
                })
            })
            .collect()
    }

    pub async fn schema_by_id(&self, id: i32) -> sqlx::Result<Option<(String, String)>> {
        let row = sqlx::query("SELECT schema_type, schema_text FROM sr_schemas WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((text(&r, 0)?, text(&r, 1)?))).transpose()
    }

    /// Subjects and versions (live) that use schema `id`.
    pub async fn versions_of_schema(&self, id: i32) -> sqlx::Result<Vec<(String, i32)>> {
        let rows = sqlx::query(
            "SELECT subject, version FROM sr_subject_versions \
             WHERE schema_id = ? AND deleted = 0 ORDER BY subject, version",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((text(r, 0)?, r.try_get(1)?)))
            .collect()
    }

    /// Adds `normalized` as the next version of `subject`, reusing the global
    /// id of an identical schema. Returns the schema id and the version.
    /// The caller has already checked compatibility under its write lock.
    pub async fn insert_version(
        &self,
        subject: &str,
        normalized: &str,
    ) -> sqlx::Result<(i32, i32)> {
        let fp = fingerprint(normalized);
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO sr_schemas (schema_type, fingerprint, schema_text) VALUES ('AVRO', ?, ?) \
             ON DUPLICATE KEY UPDATE fingerprint = fingerprint",
        )
        .bind(&fp)
        .bind(normalized)
        .execute(&mut *tx)
        .await?;
        let id: i32 = sqlx::query_scalar(
            "SELECT id FROM sr_schemas WHERE schema_type = 'AVRO' AND fingerprint = ?",
        )
        .bind(&fp)
        .fetch_one(&mut *tx)
        .await?;
        // Version numbers keep counting after soft deletes, as Confluent's do.
        let next: i32 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(MAX(version), 0) + 1 AS SIGNED) FROM sr_subject_versions WHERE subject = ?",
        )
        .bind(subject)
        .fetch_one(&mut *tx)
        .await
        .map(|v: i64| v as i32)?;
        sqlx::query(
            "INSERT INTO sr_subject_versions (subject, version, schema_id) VALUES (?, ?, ?)",
        )
        .bind(subject)
        .bind(next)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((id, next))
    }

    /// Soft-deletes (or with `permanent`, removes) every version of a
    /// subject; returns the versions affected.
    pub async fn delete_subject(&self, subject: &str, permanent: bool) -> sqlx::Result<Vec<i32>> {
        let mut tx = self.pool.begin().await?;
        let filter = if permanent { "" } else { " AND deleted = 0" };
        let versions: Vec<i32> = sqlx::query_scalar(&format!(
            "SELECT version FROM sr_subject_versions WHERE subject = ?{filter} ORDER BY version FOR UPDATE"
        ))
        .bind(subject)
        .fetch_all(&mut *tx)
        .await?;
        if permanent {
            sqlx::query("DELETE FROM sr_subject_versions WHERE subject = ?")
                .bind(subject)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM sr_config WHERE subject = ?")
                .bind(subject)
                .execute(&mut *tx)
                .await?;
        } else {
            sqlx::query("UPDATE sr_subject_versions SET deleted = 1 WHERE subject = ?")
                .bind(subject)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(versions)
    }

    /// Soft-deletes one version; `false` when it did not exist.
    pub async fn delete_version(&self, subject: &str, version: i32) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "UPDATE sr_subject_versions SET deleted = 1 WHERE subject = ? AND version = ? AND deleted = 0",
        )
        .bind(subject)
        .bind(version)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The subject's own level, if one is set.
    pub async fn subject_level(&self, subject: &str) -> sqlx::Result<Option<Level>> {
        let row = sqlx::query("SELECT compatibility FROM sr_config WHERE subject = ?")
            .bind(subject)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => text(&r, 0)?.parse().ok(),
            None => None,
        })
    }

    pub async fn global_level(&self) -> sqlx::Result<Level> {
        Ok(self.subject_level(GLOBAL).await?.unwrap_or(DEFAULT_LEVEL))
    }

    /// The level that applies to a subject: its own, else the global one.
    pub async fn effective_level(&self, subject: &str) -> sqlx::Result<Level> {
        match self.subject_level(subject).await? {
            Some(l) => Ok(l),
            None => self.global_level().await,
        }
    }

    /// Sets the level of `subject`, or the global level for `None`.
    pub async fn set_level(&self, subject: Option<&str>, level: Level) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO sr_config (subject, compatibility) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE compatibility = VALUES(compatibility)",
        )
        .bind(subject.unwrap_or(GLOBAL))
        .bind(level.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Removes a subject's own level; returns what it was.
    pub async fn clear_level(&self, subject: &str) -> sqlx::Result<Option<Level>> {
        let old = self.subject_level(subject).await?;
        sqlx::query("DELETE FROM sr_config WHERE subject = ?")
            .bind(subject)
            .execute(&self.pool)
            .await?;
        Ok(old)
    }
}
