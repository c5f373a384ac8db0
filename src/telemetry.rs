//! Telemetry: `tracing` (pretty for a terminal, JSON for services), the
//! `metrics` recorder with its Prometheus endpoint, and `/healthz` +
//! `/readyz` for every long-running subcommand. `/readyz` also says when a
//! pipeline of the process is degraded (waiting out an outage, see
//! [`Degraded`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, TelemetryConfig};
use crate::shutdown::Shutdown;

/// Installs the global tracing subscriber. Safe to call more than once (later
/// calls are ignored), so tests and `dev` can share it.
pub fn init_tracing(config: &TelemetryConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log_filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.log_format {
        LogFormat::Pretty => builder.compact().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

static PROMETHEUS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide Prometheus recorder once and returns its handle.
pub fn metrics_handle() -> PrometheusHandle {
    PROMETHEUS
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(crate::metrics::LATENCY_BUCKETS_SECONDS)
                .expect("static buckets are valid")
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(
                        crate::metrics::QUERY_TABLES.to_string(),
                    ),
                    crate::metrics::QUERY_TABLES_BUCKETS,
                )
                .expect("static buckets are valid")
                .build_recorder();
            let handle = recorder.handle();
            // Another recorder may already be installed (e.g. by a test
            // harness); the handle still renders what this one records.
            let _ = metrics::set_global_recorder(recorder);
            crate::metrics::describe_all();
            handle
        })
        .clone()
}

/// Readiness of a process: set once its dependencies answered.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set_ready(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Routes `/metrics`, `/healthz` and `/readyz`, to be merged into a
/// process's own HTTP router or served alone by [`serve_ops`]: the
/// operator's view, `/readyz` naming each degraded pipeline and why.
pub fn ops_router(readiness: Readiness) -> Router {
    let handle = metrics_handle();
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
        .route("/metrics", get(move || async move { handle.render() }))
}

/// `/healthz` and `/readyz` as recorded routes of `listener`: what a
/// public port (the gateway's) may serve. Its `/readyz` says ready or
/// not, and which pipelines are degraded, but never why: a reason is an
/// error text of a database or broker (addresses, users, schema), for the
/// telemetry port (issue 39).
pub fn health_routes(listener: &'static str, readiness: Readiness) -> crate::routes::Routes {
    use crate::routes::{get, Routes};
    Routes::new(listener)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_public))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<Readiness>) -> (StatusCode, String) {
    readiness_answer(&readiness, true)
}

async fn readyz_public(State(readiness): State<Readiness>) -> (StatusCode, String) {
    readiness_answer(&readiness, false)
}

fn readiness_answer(readiness: &Readiness, with_reasons: bool) -> (StatusCode, String) {
    if !readiness.is_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready".into());
    }
    let degraded = Degraded::list();
    if degraded.is_empty() {
        return (StatusCode::OK, "ready".into());
    }
    let lines: Vec<String> = degraded
        .iter()
        .map(|(pipeline, reason)| match with_reasons {
            true => format!("degraded: {pipeline}: {reason}"),
            false => format!("degraded: {pipeline}"),
        })
        .collect();
    (StatusCode::SERVICE_UNAVAILABLE, lines.join("\n"))
}

/// The pipelines of this process that are waiting out an outage (a
/// database, Redis, the registry or the broker unreachable): while any is,
/// `/readyz` answers 503 `degraded: <pipeline>: <reason>`. Process-wide, so
/// every ops endpoint of the process sees every pipeline it runs.
pub struct Degraded;

/// Consumer group → (pipeline, reason). Keyed by group, so a pipeline and
/// its DLQ replay (or tests' pipelines) in one process are told apart.
fn degraded_registry() -> &'static Mutex<BTreeMap<String, (String, String)>> {
    static REGISTRY: OnceLock<Mutex<BTreeMap<String, (String, String)>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Degraded {
    /// Marks the pipeline consuming as `group` degraded, for `reason`.
    pub fn set(group: &str, pipeline: &str, reason: &str) {
        degraded_registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                group.to_string(),
                (pipeline.to_string(), reason.to_string()),
            );
    }

    /// The pipeline consuming as `group` is healthy again.
    pub fn clear(group: &str) {
        degraded_registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(group);
    }

    /// The reason `group` is degraded, if it is.
    pub fn reason(group: &str) -> Option<String> {
        degraded_registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(group)
            .map(|(_, reason)| reason.clone())
    }

    /// `(pipeline, reason)` of every degraded pipeline.
    pub fn list() -> Vec<(String, String)> {
        degraded_registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// Serves the ops endpoints on `addr` until shutdown; returns the bound address.
pub async fn serve_ops(
    addr: SocketAddr,
    readiness: Readiness,
    shutdown: Shutdown,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "metrics and health endpoints listening");
    let app = ops_router(readiness);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });
    Ok(bound)
}
