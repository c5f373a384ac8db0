//! Tenants and their databases: id validation, connection pools, and
//! `imstream migrate` (one database per tenant, migrations from
//! `migrations/tenant`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection};

use crate::config::{Config, MysqlConfig, TenantConfig};
pub use crate::failure::FailureKind;
use crate::replica::Replica;
use crate::shutdown::Shutdown;

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
    #[error("{0}")]
    Inexact(crate::exact::ExactError),
    #[error("normalizing the stored logins failed: {0}")]
    Logins(#[from] crate::users::UsersError),
}

impl TenantError {
    /// Whether trying again later can succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            TenantError::Unknown(_) => false,
            TenantError::Db(e) => db_failure(e).is_outage(),
            TenantError::Migrate(_) => false,
            TenantError::Inexact(_) => false,
            TenantError::Logins(crate::users::UsersError::Db(e)) => db_failure(e).is_outage(),
            TenantError::Logins(_) => false,
        }
    }
}

/// Whether a database error is transient (connection lost, pool timeout,
/// deadlock, lock wait, failover) rather than a fault in the statement or
/// data. Same answer as [`db_failure`].
pub fn is_retryable_db_error(e: &sqlx::Error) -> bool {
    db_failure(e).is_outage()
}

/// Outage or poison, for any database error (the one classifier every
/// pipeline uses): the connection and the pool (I/O, TLS, protocol, pool
/// timeout or closed, a crashed worker) are outages; a server error is
/// classified by its number ([`mysql_error_kind`]); anything else (a row
/// that does not decode, an argument that does not encode) is poison.
pub fn db_failure(e: &sqlx::Error) -> FailureKind {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => FailureKind::Outage,
        sqlx::Error::Database(db) => match db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        {
            Some(m) => mysql_error_kind(m.number()),
            None => FailureKind::Poison,
        },
        _ => FailureKind::Poison,
    }
}

/// Outage or poison by MySQL/MariaDB error number. Outages: the server
/// unreachable, gone or shutting down, out of connections, killed
/// connections, lock waits and deadlocks, read-only or not yet writable
/// during a failover, a table or database that does not exist yet (the
/// shard manager or a migration will make it), out of disk or memory,
/// access briefly refused (grants being restored). Every other number (a
/// constraint, a duplicate, data too long or of the wrong type, invalid
/// JSON, a NOT NULL or foreign key refusal, a syntax error) is poison.
pub fn mysql_error_kind(number: u16) -> FailureKind {
    let transient = matches!(
        number,
        // Server resources: disk full, out of memory, record file full,
        // too many connections, out of threads.
        1021 | 1037 | 1038 | 1040 | 1041 | 1114 | 1135
        // Access refused for now (grants restored during a failover),
        // unknown database (not created yet).
        | 1044 | 1045 | 1049
        // Unknown table: not created yet by the shard manager / migration.
        | 1146
        // Server shutting down, connection killed, query interrupted.
        | 1053 | 1927 | 1317 | 3024 | 1969
        // Network errors while reading/writing the packet.
        | 1152
            ..=1161
        // Replication / cluster: commit or rollback errors from a node,
        // read-only (super_read_only, --read-only, during failover).
        | 1180 | 1181 | 1290 | 1836 | 1792 | 1637 | 4031
        // Too many user connections, user resource limits.
        | 1203 | 1226
        // Lock wait timeout, deadlock.
        | 1205 | 1213
        // Client-side connection errors (CR_*).
        | 2002 | 2003 | 2005 | 2006 | 2013 | 2026 | 2055
        // Galera: WSREP has not yet prepared the node for application use.
        | 1047
    );
    FailureKind::from_transient(transient)
}

/// Connection pools, one per configured tenant database (on the tenant's
/// own server), and one per read replica.
#[derive(Clone)]
pub struct TenantPools {
    pools: Arc<HashMap<String, MySqlPool>>,
    replicas: Arc<HashMap<String, Replica>>,
}

impl TenantPools {
    /// Opens a lazily-connecting pool per tenant (no I/O until first use).
    pub fn connect_lazy(config: &Config) -> Result<Self, TenantError> {
        let mut pools = HashMap::new();
        let mut replicas = HashMap::new();
        for tenant in &config.tenants {
            pools.insert(tenant.id.clone(), tenant_pool(&config.mysql, tenant)?);
            if let Some(read) = tenant.mysql_read(&config.mysql) {
                let pool = database_pool(&read, &tenant.database)?;
                replicas.insert(tenant.id.clone(), Replica::new(pool));
            }
        }
        Ok(Self {
            pools: Arc::new(pools),
            replicas: Arc::new(replicas),
        })
    }

    /// The tenant's primary: every write, and reads that must see them.
    pub fn get(&self, tenant: &str) -> Result<&MySqlPool, TenantError> {
        self.pools
            .get(tenant)
            .ok_or_else(|| TenantError::Unknown(tenant.to_string()))
    }

    /// Where a read that may lag a little goes: the tenant's read replica
    /// while it is measured within the bound, else the primary.
    pub fn read(&self, tenant: &str) -> Result<&MySqlPool, TenantError> {
        match self.replicas.get(tenant) {
            Some(r) if r.fresh() => Ok(&r.pool),
            _ => self.get(tenant),
        }
    }

    /// Measures every read replica's lag until `shutdown` (a process that
    /// reads from replicas runs this; until the first measurement, reads go
    /// to the primaries).
    pub fn watch_replicas(&self, config: &Config, shutdown: &Shutdown) {
        let every = Duration::from_millis(config.mysql.replica_heartbeat_ms.max(50));
        for (tenant, replica) in self.replicas.iter() {
            let Ok(primary) = self.get(tenant) else {
                continue;
            };
            tokio::spawn(crate::replica::watch(
                tenant.clone(),
                primary.clone(),
                replica.clone(),
                every,
                config.mysql.replica_max_lag_ms,
                shutdown.child(),
            ));
        }
    }

    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.pools.keys().map(String::as_str)
    }
}

/// A pool for one database on the configured server, used only once the
/// database has proved its identity columns exact ([`crate::exact::verify`]):
/// until then every new connection is refused (logged with the column's
/// name; to its users the database is unavailable, never served inexactly).
pub fn database_pool(mysql: &MysqlConfig, database: &str) -> Result<MySqlPool, sqlx::Error> {
    let verified = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let name = database.to_string();
    Ok(pool_options(mysql)
        .after_connect(move |conn, _meta| {
            let (verified, name) = (verified.clone(), name.clone());
            Box::pin(async move {
                use std::sync::atomic::Ordering;
                if verified.load(Ordering::Acquire) {
                    return Ok(());
                }
                crate::exact::verify(&mut *conn, &name)
                    .await
                    .map_err(crate::exact::ExactError::into_sqlx)?;
                verified.store(true, Ordering::Release);
                Ok(())
            })
        })
        .connect_lazy_with(connect_options(mysql, database)?))
}

/// A pool that uses the database as it is: for migrations, which make it
/// exact, and the schema registry, which checks itself after migrating.
pub fn unverified_pool(mysql: &MysqlConfig, database: &str) -> Result<MySqlPool, sqlx::Error> {
    Ok(pool_options(mysql).connect_lazy_with(connect_options(mysql, database)?))
}

fn connect_options(
    mysql: &MysqlConfig,
    database: &str,
) -> Result<MySqlConnectOptions, sqlx::Error> {
    let options: MySqlConnectOptions = mysql.database_url(database).parse()?;
    Ok(options
        .charset("utf8mb4")
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Warn, Duration::from_millis(500)))
}

fn pool_options(mysql: &MysqlConfig) -> MySqlPoolOptions {
    MySqlPoolOptions::new()
        .max_connections(mysql.max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
}

/// Refuses to start when a configured tenant database that answers has an
/// identity column that is not exact, naming it. A database that does not
/// answer now is checked by its pool before its first use
/// ([`database_pool`]).
pub async fn verify_exact_identities(config: &Config) -> Result<(), TenantError> {
    for tenant in &config.tenants {
        let pool = unverified_pool(&tenant.mysql(&config.mysql), &tenant.database)?;
        let checked = tokio::time::timeout(
            Duration::from_secs(10),
            crate::exact::verify(&pool, &tenant.database),
        )
        .await;
        pool.close().await;
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(crate::exact::ExactError::Db(e))) => {
                tracing::warn!(tenant = %tenant.id, error = %e, "identity columns not checked at start (database unavailable); checked before its first use");
            }
            Err(_) => {
                tracing::warn!(tenant = %tenant.id, "identity columns not checked at start (database timed out); checked before its first use");
            }
            Ok(Err(e)) => return Err(TenantError::Inexact(e)),
        }
    }
    Ok(())
}

/// A pool for `tenant`'s database on its own server (`tenants[].mysql_url`,
/// else `mysql.url`).
pub fn pool_of(config: &Config, tenant: &TenantConfig) -> Result<MySqlPool, sqlx::Error> {
    database_pool(&tenant.mysql(&config.mysql), &tenant.database)
}

fn tenant_pool(mysql: &MysqlConfig, tenant: &TenantConfig) -> Result<MySqlPool, TenantError> {
    Ok(database_pool(&tenant.mysql(mysql), &tenant.database)?)
}

/// Creates `database` on the server if it does not exist (utf8mb4).
pub async fn create_database(mysql: &MysqlConfig, database: &str) -> Result<(), TenantError> {
    crate::names::validate_database_name(database)
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

/// What `imstream migrate` did to one tenant database.
#[derive(Debug, Default)]
pub struct MigrationReport {
    /// Migrations applied by this run: (version, description).
    pub applied: Vec<(i64, String)>,
    /// Identity columns made exact after the migrations (month tables, and
    /// any that had drifted): (table, column, old type).
    pub converted: Vec<(String, String, String)>,
    /// Stored logins rewritten into their normalized form
    /// ([`crate::users::normalize_stored_logins`]).
    pub logins_normalized: usize,
}

/// Creates one tenant's database, applies every tenant migration and makes
/// the identity columns of its month tables exact ([`crate::exact`]), then
/// checks them all. Running it again is harmless (and reports nothing).
pub async fn migrate_tenant(
    mysql: &MysqlConfig,
    tenant: &TenantConfig,
) -> Result<MigrationReport, TenantError> {
    create_database(&tenant.mysql(mysql), &tenant.database).await?;
    let pool = unverified_pool(&tenant.mysql(mysql), &tenant.database)?;
    let before = applied_versions(&pool).await?;
    TENANT_MIGRATOR.run(&pool).await?;
    let applied = TENANT_MIGRATOR
        .iter()
        .filter(|m| !before.contains(&m.version))
        .map(|m| (m.version, m.description.to_string()))
        .collect();
    let converted = crate::exact::convert(&pool)
        .await
        .map_err(TenantError::Inexact)?;
    crate::exact::verify(&pool, &tenant.database)
        .await
        .map_err(TenantError::Inexact)?;
    // Logins are stored in one form (issue 28): rows from before are
    // rewritten, or the migration stops naming the two that would clash.
    let logins_normalized = crate::users::normalize_stored_logins(&pool).await;
    pool.close().await;
    Ok(MigrationReport {
        applied,
        converted,
        logins_normalized: logins_normalized?,
    })
}

/// Versions already applied to a database (none before its first migration).
async fn applied_versions(pool: &MySqlPool) -> Result<Vec<i64>, sqlx::Error> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '_sqlx_migrations'",
    )
    .fetch_one(pool)
    .await?;
    if exists == 0 {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = 1")
        .fetch_all(pool)
        .await
}

/// `imstream migrate`: every configured tenant, or only `only`; says what
/// it did to each (logged, and returned for the command to print).
pub async fn migrate(
    config: &Config,
    only: Option<&str>,
) -> Result<Vec<(String, MigrationReport)>, TenantError> {
    let mut done = Vec::new();
    for tenant in &config.tenants {
        if only.is_some_and(|t| t != tenant.id) {
            continue;
        }
        let report = migrate_tenant(&config.mysql, tenant).await?;
        for (version, description) in &report.applied {
            tracing::info!(tenant = %tenant.id, version, %description, "migration applied");
        }
        for (table, column, was) in &report.converted {
            tracing::info!(tenant = %tenant.id, %table, %column, %was, "identity column converted to VARBINARY");
        }
        if report.logins_normalized > 0 {
            tracing::info!(tenant = %tenant.id, rows = report.logins_normalized, "stored logins normalized (NFKC + case folding)");
        }
        tracing::info!(tenant = %tenant.id, database = %tenant.database, "tenant database migrated");
        done.push((tenant.id.clone(), report));
    }
    if let Some(t) = only {
        if done.is_empty() {
            return Err(TenantError::Unknown(t.to_string()));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_or_busy_databases_are_outages() {
        for e in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            sqlx::Error::Protocol("packet out of order".into()),
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "refused",
            )),
        ] {
            assert_eq!(db_failure(&e), FailureKind::Outage, "{e}");
            assert!(is_retryable_db_error(&e));
        }
        for n in [
            1205, 1213, 2002, 2003, 2006, 2013, 1040, 1053, 1927, 1290, 1836, 1792, 1146, 1317,
            1152, 1161, 4031, 1969, 3024, 1203, 1226, 1041, 1021, 1114, 1637, 1180, 1181, 1045,
            1044, 1049,
        ] {
            assert_eq!(mysql_error_kind(n), FailureKind::Outage, "error {n}");
        }
    }

    #[test]
    fn refused_records_are_poison() {
        // CHECK (MariaDB 4025, MySQL 3819), duplicate, data too long,
        // incorrect value, invalid JSON, NOT NULL, foreign key, syntax.
        for n in [
            4025, 3819, 1062, 1406, 1366, 3140, 1048, 1452, 1064, 1264, 1292,
        ] {
            assert_eq!(mysql_error_kind(n), FailureKind::Poison, "error {n}");
        }
        for e in [
            sqlx::Error::RowNotFound,
            sqlx::Error::ColumnNotFound("x".into()),
            sqlx::Error::Decode("bad".into()),
        ] {
            assert_eq!(db_failure(&e), FailureKind::Poison, "{e}");
        }
    }
}
