//! Tenants and their databases: id validation, connection pools, and
//! `imstream migrate` (one database per tenant, migrations from
//! `migrations/tenant`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection};

use crate::config::{Config, MysqlConfig, TenantConfig};

/// Migrations applied to every tenant database.
pub static TENANT_MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/tenant");

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("unknown tenant {0:?}")]
    Unknown(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl TenantError {
    /// Whether trying again later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            TenantError::Unknown(_) => false,
            TenantError::Db(e) => is_retryable_db_error(e),
            TenantError::Migrate(_) => false,
        }
    }
}

/// Whether a database error is transient (connection lost, pool timeout,
/// deadlock, lock wait) rather than a fault in the statement or data.
pub fn is_retryable_db_error(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Database(db) => {
            // 1205 lock wait timeout, 1213 deadlock, 2006/2013 server gone/lost.
            matches!(
                db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .map(|m| m.number()),
                Some(1205 | 1213 | 2006 | 2013 | 1040)
            )
        }
        _ => false,
    }
}

/// Checks a tenant id: 1–32 characters of `[a-z0-9_]`. Tenant ids appear in
/// Redis keys, Kafka keys and channel names, so they are kept plain.
pub fn validate_tenant_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 32 {
        return Err("must be 1 to 32 characters".into());
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err("may contain only a-z, 0-9 and _".into());
    }
    Ok(())
}

/// Checks a database name: 1–64 characters of `[A-Za-z0-9_]`, so it can be
/// quoted into DDL safely.
pub fn validate_database_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err("may contain only A-Z, a-z, 0-9 and _".into());
    }
    Ok(())
}

/// Connection pools, one per configured tenant database.
#[derive(Clone)]
pub struct TenantPools {
    pools: Arc<HashMap<String, MySqlPool>>,
}

impl TenantPools {
    /// Opens a lazily-connecting pool per tenant (no I/O until first use).
    pub fn connect_lazy(config: &Config) -> Result<Self, TenantError> {
        let mut pools = HashMap::new();
        for tenant in &config.tenants {
            pools.insert(tenant.id.clone(), tenant_pool(&config.mysql, tenant)?);
        }
        Ok(Self {
            pools: Arc::new(pools),
        })
    }

    pub fn get(&self, tenant: &str) -> Result<&MySqlPool, TenantError> {
        self.pools
            .get(tenant)
            .ok_or_else(|| TenantError::Unknown(tenant.to_string()))
    }

    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.pools.keys().map(String::as_str)
    }
}

/// A pool for one database on the configured server.
pub fn database_pool(mysql: &MysqlConfig, database: &str) -> Result<MySqlPool, sqlx::Error> {
    let options: MySqlConnectOptions = mysql.database_url(database).parse()?;
    let options = options
        .charset("utf8mb4")
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_millis(500));
    Ok(MySqlPoolOptions::new()
        .max_connections(mysql.max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options))
}

fn tenant_pool(mysql: &MysqlConfig, tenant: &TenantConfig) -> Result<MySqlPool, TenantError> {
    Ok(database_pool(mysql, &tenant.database)?)
}

/// Creates `database` on the server if it does not exist (utf8mb4).
pub async fn create_database(mysql: &MysqlConfig, database: &str) -> Result<(), TenantError> {
    validate_database_name(database)
        .map_err(|e| TenantError::Db(sqlx::Error::Configuration(e.into())))?;
    let options: MySqlConnectOptions = mysql.url.parse()?;
    let mut conn = sqlx::MySqlConnection::connect_with(&options).await?;
    sqlx::query(&format!(
        "CREATE DATABASE IF NOT EXISTS `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
    ))
    .execute(&mut conn)
    .await?;
    conn.close().await?;
    Ok(())
}

/// Creates one tenant's database and applies every tenant migration.
/// Running it again is harmless.
pub async fn migrate_tenant(mysql: &MysqlConfig, tenant: &TenantConfig) -> Result<(), TenantError> {
    create_database(mysql, &tenant.database).await?;
    let pool = tenant_pool(mysql, tenant)?;
    TENANT_MIGRATOR.run(&pool).await?;
    pool.close().await;
    Ok(())
}

/// `imstream migrate`: every configured tenant, or only `only`.
pub async fn migrate(config: &Config, only: Option<&str>) -> Result<usize, TenantError> {
    let mut done = 0;
    for tenant in &config.tenants {
        if only.is_some_and(|t| t != tenant.id) {
            continue;
        }
        migrate_tenant(&config.mysql, tenant).await?;
        tracing::info!(tenant = %tenant.id, database = %tenant.database, "tenant database migrated");
        done += 1;
    }
    if let Some(t) = only {
        if done == 0 {
            return Err(TenantError::Unknown(t.to_string()));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids() {
        assert!(validate_tenant_id("acme_01").is_ok());
        assert!(validate_tenant_id("").is_err());
        assert!(validate_tenant_id("Acme").is_err());
        assert!(validate_tenant_id("a:b").is_err());
        assert!(validate_tenant_id(&"a".repeat(33)).is_err());
    }

    #[test]
    fn database_names() {
        assert!(validate_database_name("im_tenant_acme").is_ok());
        assert!(validate_database_name("x`; DROP").is_err());
        assert!(validate_database_name("").is_err());
    }
}
