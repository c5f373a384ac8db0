//! `imstream gateway`: the thin front end. WebSocket at `/v0/channels`
//! (Tinode protocol, [`session`]) and HTTP under `/v1` ([`http`]); it
//! authenticates, checks ACLs, produces events and serves reads. Apart from
//! its live connections it holds no state.

pub mod auth;
pub mod http;
pub mod proto;
pub mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{State, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;

use crate::config::Config;
use crate::events::EventCodec;
use crate::kafka::producer::EventProducer;
use crate::send::Sender;
use crate::shutdown::Shutdown;
use crate::snowflake::Snowflake;
use crate::telemetry::Readiness;
use crate::tenant::TenantPools;

/// Shared state of one gateway process.
pub struct Gateway {
    pub config: Config,
    pub node_id: String,
    pub sender: Sender,
    pub tokens: auth::Tokens,
    pub snowflake: Snowflake,
    pub shutdown: Shutdown,
}

/// A started gateway.
pub struct RunningGateway {
    pub addr: SocketAddr,
    pub task: tokio::task::JoinHandle<()>,
}

/// Connects to Redis, MySQL and Kafka, then serves on `addr` (port 0 picks
/// one) until `shutdown`.
pub async fn start(
    config: &Config,
    addr: SocketAddr,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<RunningGateway> {
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    let snowflake = Snowflake::lease(&mut redis, shutdown.clone()).await?;
    let codec = EventCodec::new(&config.registry.url)?;
    let producer = EventProducer::new(&config.kafka, codec)?;
    let pools = TenantPools::connect_lazy(config)?;
    let sender = Sender::new(config.clone(), redis, pools, producer, snowflake.clone());
    let gateway = Arc::new(Gateway {
        config: config.clone(),
        node_id: config.node.resolved_id(),
        sender,
        tokens: auth::Tokens::new(&config.auth),
        snowflake,
        shutdown: shutdown.clone(),
    });
    let app = Router::new()
        .route("/v0/channels", get(upgrade))
        .route("/v1/groups", post(http::create_group))
        .route("/v1/groups/{topic}/messages", post(http::send_message))
        .with_state(gateway.clone())
        .merge(crate::telemetry::ops_router(readiness.clone()));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    readiness.set_ready(true);
    tracing::info!(%bound, node = %gateway.node_id, "gateway listening");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        gateway
            .sender
            .producer()
            .flush(std::time::Duration::from_secs(5));
    });
    Ok(RunningGateway { addr: bound, task })
}

async fn upgrade(State(gw): State<Arc<Gateway>>, ws: WebSocketUpgrade) -> Response {
    let max = gw.config.gateway.max_message_size + 64 * 1024;
    ws.max_message_size(max)
        .on_upgrade(move |socket| session::serve(gw, socket))
}
