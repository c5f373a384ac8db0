//! The gateway's HTTP server: `axum::serve` with the limits it lacks
//! (issue 13). Each accepted connection counts against its address's
//! `limits.connections_per_ip` (refused beyond it: closed at once; an
//! upgraded WebSocket keeps its place until it closes), must
//! send its request headers within `limits.header_timeout_secs`, and every
//! request (its body included) must be handled within
//! `limits.request_timeout_secs` (`408`) and carry at most
//! `limits.max_body_bytes` (`413`). The client address is handed to the
//! handlers as axum's `ConnectInfo`. Every answer carries its request id
//! (`X-Request-Id`, see [`crate::request_id`]); a JSON error body names it
//! too (`request_id`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::config::LimitsConfig;
use crate::shutdown::Shutdown;

use super::limits::Connections;

/// Adds the body-size and request-time limits to `app`, and the request
/// id to every answer (the outermost layer: a `408` has one too).
pub fn limited(app: Router, limits: &LimitsConfig) -> Router {
    let timeout = Duration::from_secs(limits.request_timeout_secs.max(1));
    app.layer(axum::extract::DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| request_timeout(req, next, timeout),
        ))
        .layer(axum::middleware::from_fn(with_request_id))
}

/// Largest error body that gets its `request_id` added (bigger ones keep
/// the header only; the gateway's own error bodies are a few hundred bytes).
const ERROR_BODY_MAX: usize = 64 * 1024;

/// Runs the request under its id (the client's `X-Request-Id` when sane,
/// else a new one) and names the id in the answer.
async fn with_request_id(req: Request, next: Next) -> Response {
    let id = crate::request_id::accept(
        req.headers()
            .get(crate::request_id::HEADER)
            .and_then(|v| v.to_str().ok()),
    );
    let response = crate::request_id::scope(Some(id.clone()), next.run(req)).await;
    let mut response = if response.status().as_u16() >= 400 {
        name_in_error_body(response, &id).await
    } else {
        response
    };
    if let Ok(value) = axum::http::HeaderValue::from_str(&id) {
        response
            .headers_mut()
            .insert(crate::request_id::HEADER, value);
    }
    response
}

/// A JSON object error body with `request_id` added (other bodies as
/// they are).
async fn name_in_error_body(response: Response, id: &str) -> Response {
    let json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if !json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, ERROR_BODY_MAX).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(request_id = %id, error = %e, "error body unreadable");
            parts.headers.remove(axum::http::header::CONTENT_LENGTH);
            return Response::from_parts(parts, Body::empty());
        }
    };
    let body = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.entry("request_id")
                .or_insert_with(|| serde_json::Value::String(id.to_string()));
            parts.headers.remove(axum::http::header::CONTENT_LENGTH);
            Body::from(serde_json::Value::Object(map).to_string())
        }
        _ => Body::from(bytes),
    };
    Response::from_parts(parts, body)
}

async fn request_timeout(req: Request, next: Next, timeout: Duration) -> Response {
    // An upload's body may take longer: it has its own limit
    // (`files.upload_timeout_secs`).
    if req.uri().path() == super::files::UPLOAD_PATH {
        return next.run(req).await;
    }
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            axum::Json(serde_json::json!({"code": 408, "error": "request timeout"})),
        )
            .into_response(),
    }
}

/// Serves `app` on `listener` until `shutdown`, then lets open requests
/// finish (upgraded WebSockets end with the gateway's own shutdown).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: LimitsConfig,
    connections: Connections,
    shutdown: Shutdown,
) {
    let header_timeout = Duration::from_secs(limits.header_timeout_secs.max(1));
    // Every connection task holds a clone; all dropped = all finished.
    let (alive, mut finished) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(counted) = connections.admit(peer.ip(), &limits) else {
            metrics::counter!(crate::metrics::RATE_LIMITED_TOTAL, "what" => "connections")
                .increment(1);
            tracing::info!(%peer, "connection refused: too many from this address");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        // Shared with the requests: an upgraded WebSocket keeps its
        // connection's place after the HTTP connection is done.
        let counted = Counted(std::sync::Arc::new(counted));
        let app = app.clone();
        let (alive, shutdown) = (alive.clone(), shutdown.clone());
        tokio::spawn(async move {
            let held = counted.clone();
            let service =
                hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    req.extensions_mut().insert(held.clone());
                    let mut app = app.clone();
                    async move { tower_service::Service::call(&mut app, req.map(Body::new)).await }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.as_mut().await;
                }
            }
            drop(counted);
            drop(alive);
        });
    }
    drop(alive);
    let _ = finished.recv().await;
}

/// A connection's place in the per-address count, handed to its requests
/// (the WebSocket upgrade keeps it for the life of the socket).
#[derive(Clone)]
pub struct Counted(#[allow(dead_code)] std::sync::Arc<Option<super::limits::ConnectionGuard>>);

/// The address of the client of a request, when the server knows it.
pub fn peer_of(info: Option<ConnectInfo<SocketAddr>>) -> Option<std::net::IpAddr> {
    info.map(|ConnectInfo(addr)| addr.ip())
}
