//! `imstream registry`: an embedded, Confluent-compatible schema registry.
//!
//! Production points `registry.url` at Confluent Schema Registry (or any
//! compatible one); this one exists because none installs from the package
//! registries a laptop or CI reaches. It serves the REST subset clients use
//! (see [`api`]), persists schemas in MySQL/MariaDB ([`store`]), and checks
//! compatibility with apache-avro ([`compat`]). [`client`] is the other side:
//! `imstream schemas register|check` against any such registry, ours or
//! Confluent's.

pub mod api;
pub mod client;
pub mod compat;
pub mod store;

use std::net::SocketAddr;

use crate::config::Config;
use crate::shutdown::Shutdown;
use crate::telemetry::Readiness;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry database: {0}")]
    Tenant(#[from] crate::tenant::TenantError),
    #[error("registry database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("registry migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running registry: its bound address and the task serving it.
pub struct RunningRegistry {
    pub addr: SocketAddr,
    pub task: tokio::task::JoinHandle<()>,
}

/// Prepares the registry database and starts serving on `addr` (port 0
/// picks a free port) until `shutdown`.
pub async fn start(
    config: &Config,
    addr: SocketAddr,
    readiness: Readiness,
    shutdown: Shutdown,
) -> Result<RunningRegistry, RegistryError> {
    let database = &config.registry.database;
    crate::tenant::create_database(&config.mysql, database).await?;
    // Migrated first (which makes its subject names exact), then checked.
    let pool = crate::tenant::unverified_pool(&config.mysql, database)?;
    let store = store::RegistryStore::new(pool.clone());
    store.migrate().await?;
    crate::exact::verify_registry(&pool, database)
        .await
        .map_err(|e| RegistryError::Tenant(crate::tenant::TenantError::Inexact(e)))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RegistryError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| RegistryError::Bind { addr, source })?;
    let app = api::router(api::AppState::new(store, &config.registry.write_token))
        .merge(crate::telemetry::ops_router(readiness.clone()));
    readiness.set_ready(true);
    tracing::info!(%bound, "schema registry listening");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });
    Ok(RunningRegistry { addr: bound, task })
}
