//! `imstream gateway`: the thin front end. WebSocket at `/v0/channels`
//! (Tinode protocol, [`session`]) and HTTP under `/v1` ([`http`]); it
//! authenticates, checks ACLs, produces events and serves reads. Apart from
//! its live connections it holds no state. With `gateway.webapp_dir` it
//! also serves the Tinode web app at `/` ([`webapp`]).

pub mod admin;
pub mod chats;
pub mod control;
pub mod dev_profiles;
pub mod edits;
pub mod files;
pub mod governance;
pub mod http;
mod lease;
pub mod limits;
pub mod me_http;
pub mod notifications;
pub mod origin;
pub mod password;
pub mod personal;
pub mod pins;
pub mod reads;
pub mod references;
pub mod refusal;
pub mod relations;
pub mod replies;
pub mod search;
mod server;
pub mod session;
mod state;
pub mod trace;
pub mod webapp;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{State, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::config::Config;
use crate::events::EventCodec;
use crate::kafka::producer::EventProducer;
use crate::routes::{delete, get, post, put, RouteInfo, Routes};
use crate::send::Sender;
use crate::shutdown::Shutdown;
use crate::snowflake::Snowflake;
use crate::telemetry::Readiness;
use crate::tenant::TenantPools;

pub use state::Gateway;

/// A started gateway.
pub struct RunningGateway {
    /// The public port: WebSocket and the users' HTTP API.
    pub addr: SocketAddr,
    /// The operator port (`gateway.admin_addr`): `/v1/admin/…` only.
    pub admin_addr: SocketAddr,
    pub task: tokio::task::JoinHandle<()>,
    /// Every route its listeners serve, as the router was built.
    pub routes: Vec<RouteInfo>,
    /// Each listener's address, by the name its routes give
    /// ([`RouteInfo::listener`]).
    pub listeners: Vec<(&'static str, SocketAddr)>,
}

/// Connects to Redis, MySQL and Kafka, then serves on `addr` (port 0 picks
/// one), and the operator endpoints on `gateway.admin_addr`, until
/// `shutdown`.
pub async fn start(
    config: &Config,
    addr: SocketAddr,
    readiness: Readiness,
    shutdown: Shutdown,
) -> anyhow::Result<RunningGateway> {
    // Before any lease: a missing web app install fails the start at once.
    let webapp = match config.gateway.webapp_dir.as_str() {
        "" => None,
        dir => Some(Arc::new(webapp::WebApp::load(std::path::Path::new(dir))?)),
    };
    // A files store that cannot be named fails the start at once.
    let files = crate::files::store::FileStore::from_config(&config.files)?;
    // A tenant database whose identities compare inexactly is refused,
    // before anything is leased.
    crate::tenant::verify_exact_identities(config).await?;
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    // A Redis that could evict the write side (seq allocators, group
    // models, claims) is refused before anything is leased.
    crate::redis_util::incarnation::check_no_eviction(&mut redis)
        .await
        .map_err(anyhow::Error::msg)?;
    let node_id = config.node.resolved_id();
    lease_node_id(&mut redis, &node_id, shutdown.clone()).await?;
    let snowflake = Snowflake::lease(&mut redis, shutdown.clone()).await?;
    let codec = EventCodec::new(&config.registry.url)?;
    let producer = EventProducer::new(&config.kafka, codec)?;
    let pools = TenantPools::connect_lazy(config)?;
    // History pages read from tenants' read replicas while they keep up.
    pools.watch_replicas(config, &shutdown);
    let history = crate::history::History::new(pools.clone(), redis.clone()).with_archives(
        crate::store::archive::reader::Archives::from_config(&config.shards),
    );
    let sender = Sender::new(
        config.clone(),
        redis.clone(),
        pools.clone(),
        producer.clone(),
        snowflake.clone(),
    );
    // Governance decides on the same group write model the send path
    // checks senders against.
    let groups = sender.groups().clone();
    let governance = crate::governance::Executor::new(groups.clone(), producer, node_id.clone());
    let gateway = Arc::new(Gateway {
        config: config.clone(),
        node_id: node_id.clone(),
        sender,
        pools,
        redis,
        groups,
        history,
        governance,
        tokens: crate::auth::Tokens::new(config),
        snowflake,
        hub: crate::realtime::hub::Hub::default(),
        shutdown: shutdown.clone(),
        connections: limits::Connections::default(),
        search: crate::search::query::Indexes::new(config),
        files,
    });
    let tenants: std::collections::HashSet<String> =
        config.tenants.iter().map(|t| t.id.clone()).collect();
    // After a lost subscription, the gap is filled from the newest stored
    // messages (the hot copy, else the month tables).
    let history = gateway.history.clone();
    let model = gateway.groups.clone();
    let refill: crate::realtime::bus::Refill = Arc::new(move |tenant, topic| {
        let history = history.clone();
        let model = model.clone();
        Box::pin(async move {
            let newest = crate::history::PageQuery::new(None, None, Some(100), false);
            let messages = match newest {
                Ok(q) => history
                    .page(&tenant, &topic, 0, q)
                    .await
                    .map(|p| p.messages)
                    .unwrap_or_default(),
                Err(_) => Vec::new(),
            };
            // Who left is read after the page: a removal acknowledged before
            // any message of the page was allocated is in it.
            let departures = if crate::tinode::is_group_topic(&topic) {
                match model.departures(&tenant, &topic).await {
                    Ok(d) => d,
                    // Who left is unknown: hand over nothing rather than
                    // risk a message to a removed member.
                    Err(_) => return (Vec::new(), Default::default()),
                }
            } else {
                Default::default()
            };
            (messages, departures)
        })
    });
    tokio::spawn(crate::realtime::bus::run_subscriber(
        config.redis.url.clone(),
        node_id.clone(),
        gateway.hub.clone(),
        tenants,
        Some(refill),
        shutdown.clone(),
    ));
    tokio::spawn(heartbeat(gateway.clone()));
    if dev_profiles::any(config) {
        tokio::spawn(dev_profiles::seed(gateway.clone()));
    }
    tokio::spawn(sweep_governance(gateway.clone()));
    // After Redis forgets, every conversation of every tenant is restored
    // from durable state in one pass (one gateway per tenant does it).
    tokio::spawn(
        crate::recovery::Recovery::new(
            config.clone(),
            gateway.pools.clone(),
            gateway.redis.clone(),
            gateway.sender.producer().codec().clone(),
            gateway.groups.clone(),
        )
        .watch(shutdown.clone()),
    );
    tokio::spawn(process_gauges(gateway.clone()));
    let app = public_router(gateway.clone())
        // `/metrics` is served on the telemetry port only, never here.
        .merge(crate::telemetry::health_routes(
            crate::routes::PUBLIC,
            readiness.clone(),
        ));
    let web_routes = Routes::new(crate::routes::PUBLIC)
        .when("gateway.webapp_dir")
        .fallback(webapp::serve);
    let app = match webapp {
        Some(web) => app.merge(
            web_routes
                .with_state(web)
                .map_router(|r| r.layer(axum::middleware::map_response(webapp::harden))),
        ),
        None => app.not_served(web_routes),
    };
    let (app, mut routes) = app.into_parts();
    let (admin_app, admin_routes) = admin_router(gateway.clone()).into_parts();
    routes.extend(admin_routes);
    let app = server::limited(app, &config.limits);
    let admin_app = server::limited(admin_app, &config.limits);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let admin_listener = tokio::net::TcpListener::bind(config.gateway.admin_addr)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "binding gateway.admin_addr {}: {e}",
                config.gateway.admin_addr
            )
        })?;
    let admin_bound = admin_listener.local_addr()?;
    if !admin_bound.ip().is_loopback() {
        tracing::warn!(%admin_bound, "operator endpoints listen beyond loopback (gateway.admin_addr)");
    }
    readiness.set_ready(true);
    tracing::info!(%bound, %admin_bound, node = %gateway.node_id, "gateway listening (operator endpoints on admin_bound)");
    let (limits, connections) = (config.limits.clone(), gateway.connections.clone());
    let task = tokio::spawn(async move {
        tokio::join!(
            server::serve(listener, app, limits.clone(), connections, shutdown.clone()),
            server::serve(
                admin_listener,
                admin_app,
                limits,
                limits::Connections::default(),
                shutdown
            ),
        );
        gateway
            .sender
            .producer()
            .flush(std::time::Duration::from_secs(5));
    });
    Ok(RunningGateway {
        addr: bound,
        admin_addr: admin_bound,
        task,
        routes,
        listeners: vec![
            (crate::routes::PUBLIC, bound),
            (crate::routes::ADMIN, admin_bound),
        ],
    })
}

/// Every route of the public port: WebSocket and the users' HTTP API.
/// Operator routes (`/v1/admin/…`) are not here: they answer 404 on this
/// port ([`admin_router`]).
fn public_router(gateway: Arc<Gateway>) -> Routes {
    Routes::new(crate::routes::PUBLIC)
        .route("/v0/channels", get(upgrade))
        .route(files::UPLOAD_PATH, post(files::upload))
        .route("/v0/file/s/{*path}", get(files::download))
        .route("/v1/groups", post(http::create_group))
        .route("/v1/groups/{topic}", delete(governance::dissolve))
        .route("/v1/groups/{topic}/members", post(governance::add_member))
        .route(
            "/v1/groups/{topic}/invitation",
            post(governance::accept_invitation).delete(governance::decline_invitation),
        )
        .route(
            "/v1/me/settings",
            get(governance::settings).put(governance::set_settings),
        )
        .route(
            "/v1/groups/{topic}/members/{uid}",
            delete(governance::remove_member),
        )
        .route(
            "/v1/groups/{topic}/members/{uid}/role",
            put(governance::set_role),
        )
        .route(
            "/v1/groups/{topic}/members/{uid}/mute",
            put(governance::mute_member),
        )
        .route("/v1/groups/{topic}/owner", put(governance::transfer_owner))
        .route("/v1/groups/{topic}/mute", put(governance::mute_all))
        .route(
            "/v1/groups/{topic}/messages",
            post(http::send_message).get(http::list_messages),
        )
        .route(
            "/v1/groups/{topic}/messages/{seq}",
            get(http::get_message)
                .patch(governance::edit_message)
                .delete(governance::delete_message),
        )
        .route(
            "/v1/groups/{topic}/messages/{seq}/context",
            get(http::message_context),
        )
        .route(
            "/v1/groups/{topic}/messages/{seq}/report",
            post(references::report),
        )
        .route("/v1/groups/{topic}/files", get(references::list_files))
        .route("/v1/me/favorites", get(references::list_favorites))
        .route(
            "/v1/me/favorites/{topic}/{seq}",
            put(references::add_favorite).delete(references::remove_favorite),
        )
        .route("/v1/groups/{topic}/search", get(http::search))
        .route(
            "/v1/users/{peer}/messages",
            post(http::send_p2p).get(http::list_p2p),
        )
        .route(
            "/v1/groups/{topic}/history/clear",
            post(http::clear_history),
        )
        .route("/v1/friends/requests", post(relations::request_friend))
        .route(
            "/v1/friends/requests/{uid}/accept",
            post(relations::accept_friend),
        )
        .route("/v1/friends/{uid}", delete(relations::remove_friend))
        .route("/v1/blocks", post(relations::block))
        .route("/v1/blocks/{uid}", delete(relations::unblock))
        .route("/v1/me/conversations", get(me_http::conversations))
        .route("/v1/me/unread", get(me_http::unread))
        .route("/v1/search", get(search::search))
        .route("/v1/me/profile", put(me_http::set_profile))
        .route("/v1/me/password", put(me_http::change_password))
        .route(
            "/v1/groups/{topic}/profile",
            put(me_http::set_group_profile),
        )
        .route("/v1/groups/{topic}/subscribers", get(me_http::members))
        .route("/v1/me/notifications", get(notifications::list))
        .route("/v1/me/notifications/read", post(notifications::read))
        .route("/v1/me/push", put(relations::set_dnd))
        .route("/v1/me/push/topics/{topic}", put(relations::mute_topic))
        .with_state(gateway)
}

/// The operator routes (`/v1/admin/…`, admin token), served on their own
/// listener (`gateway.admin_addr`, loopback by default), behind the
/// per-address throttle of failed admin tokens ([`admin::throttle`]).
fn admin_router(gateway: Arc<Gateway>) -> Routes {
    let throttle = (gateway.clone(), limits::AdminFailures::default());
    Routes::new(crate::routes::ADMIN)
        .route("/v1/admin/reports", get(references::list_reports))
        .route(
            "/v1/admin/reports/{report_id}/resolve",
            post(references::resolve_report),
        )
        .route(
            "/v1/admin/users/{uid}/devices/{device}/revoke",
            post(admin::revoke_device),
        )
        .route(
            "/v1/admin/users/{uid}/signout",
            post(admin::sign_out_everywhere),
        )
        .route("/v1/admin/users/{uid}/disable", post(admin::disable_user))
        .route("/v1/admin/users/{uid}/enable", post(admin::enable_user))
        .route("/v1/admin/commands", post(admin::submit_command))
        .route("/v1/admin/stats", get(admin::stats))
        .route("/v1/admin/notifications", post(relations::notify))
        .route("/v1/admin/badges", post(relations::badge))
        .with_state(gateway)
        .map_router(|r| {
            r.route_layer(axum::middleware::from_fn_with_state(
                throttle,
                admin::throttle,
            ))
        })
}

/// A second live gateway with the same node id would split its users'
/// deliveries, so a node id is leased. A gateway restarted after a crash
/// takes its own stale lease over at once (same host, the old process is
/// gone); a lease held by a live process elsewhere is waited for, never
/// stolen. A second gateway in this very process is a configuration error.
async fn lease_node_id(
    redis: &mut crate::redis_util::Redis,
    node: &str,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let key = format!("im:{{global}}:node:{node}");
    let token = lease::token();
    let mut waiting_since: Option<std::time::Instant> = None;
    loop {
        let got: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(NODE_LEASE_MS)
            .query_async(redis)
            .await?;
        if got.is_some() {
            break;
        }
        let holder: Option<String> = redis::cmd("GET").arg(&key).query_async(redis).await?;
        let Some(holder) = holder else { continue };
        match lease::judge(&holder) {
            lease::Holder::ThisProcess => anyhow::bail!(
                "node id {node:?} is already live in this process; give each gateway its own id (node.id, IM_NODE_ID or HOSTNAME)"
            ),
            lease::Holder::Gone => {
                let taken: i64 = redis::Script::new(TAKE_OVER_NODE_LEASE)
                    .key(&key)
                    .arg(&holder)
                    .arg(&token)
                    .arg(NODE_LEASE_MS)
                    .invoke_async(redis)
                    .await?;
                if taken == 1 {
                    tracing::warn!(%node, stale = %holder, "took over the node id lease of a crashed gateway");
                    break;
                }
            }
            lease::Holder::Elsewhere => {
                let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed().as_millis() % 15_000 < 1_000 {
                    tracing::error!(%node, holder = %holder, "node id is leased by another live process; waiting for it to end (give each gateway its own id: node.id, IM_NODE_ID or HOSTNAME)");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => anyhow::bail!("shut down while waiting for the node id lease"),
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
            }
        }
    }
    lease::hold(&token);
    let mut redis = redis.clone();
    let node = node.to_string();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let _: redis::RedisResult<i64> = redis::Script::new(include_str!("../../lua/release_lock.lua"))
                        .key(&key).arg(&token).invoke_async(&mut redis).await;
                    lease::release(&token);
                    return;
                }
                _ = tokio::time::sleep(std::time::Duration::from_millis(NODE_LEASE_MS / 3)) => {}
            }
            // Renew only while the lease is ours (or take it back once it
            // expired): never take over another live gateway's id.
            let renewed: redis::RedisResult<i64> = redis::Script::new(RENEW_NODE_LEASE)
                .key(&key)
                .arg(&token)
                .arg(NODE_LEASE_MS)
                .invoke_async(&mut redis)
                .await;
            match renewed {
                Ok(0) => {
                    tracing::error!(%node, "node id lease held by another gateway; not taking it over")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(%node, error = %e, "node id lease renewal failed"),
            }
        }
    });
    Ok(())
}

/// Logs an internal failure under the current request's id and returns
/// the id: what a client is told instead of the detail.
pub(crate) fn log_internal(e: &dyn std::fmt::Display) -> String {
    let request_id = crate::request_id::current();
    tracing::warn!(%request_id, error = %e, "request failed");
    request_id
}

const NODE_LEASE_MS: u64 = 15_000;

/// Replaces the lease only while it still holds the stale token.
const TAKE_OVER_NODE_LEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0";

/// Extends the lease when it holds our token, takes it again when it has
/// expired, and leaves it alone (returns 0) when another holder has it.
const RENEW_NODE_LEASE: &str = "local cur = redis.call('GET', KEYS[1]) \
    if cur == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
    if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end \
    return 0";

/// Memory and session gauges, every second (the per-session memory figure
/// of `imstream bench fanout` reads them).
async fn process_gauges(gw: Arc<Gateway>) {
    loop {
        if let Some(rss) = crate::metrics::resident_bytes() {
            metrics::gauge!(crate::metrics::PROCESS_RESIDENT_BYTES).set(rss as f64);
        }
        metrics::gauge!(crate::metrics::GATEWAY_SESSIONS).set(gw.hub.session_count() as f64);
        tokio::select! {
            _ = gw.shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

/// Every heartbeat: refresh this node's presence TTLs and re-check session
/// control for every local session (one round trip each).
async fn heartbeat(gw: Arc<Gateway>) {
    let every = std::time::Duration::from_secs(gw.config.gateway.heartbeat_secs.max(1));
    let mut redis = gw.redis.clone();
    loop {
        tokio::select! {
            _ = gw.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let (users, topics) = gw.hub.snapshot();
        let now = crate::events::now_ms();
        if let Err(e) = crate::realtime::presence::refresh(
            &mut redis,
            &gw.node_id,
            &users,
            &topics,
            now,
            every.as_millis() as i64,
        )
        .await
        {
            tracing::warn!(error = %e, "presence refresh failed");
        }
        recheck_members(&gw, &mut redis).await;
        let checked = control::recheck(&mut redis, &gw.pools, &gw.hub.all_sessions()).await;
        for (session, why) in checked.refused {
            tracing::info!(sid = %session.sid, uid = session.uid, why, "closing session on heartbeat");
            session.offer(crate::realtime::hub::Outbound::Close(Arc::from(why)));
        }
        if let Some((_, e)) = checked.unknown.first() {
            // Their next command is refused until their state can be read.
            tracing::warn!(sessions = checked.unknown.len(), error = %e, "session control check failed");
        }
    }
}

/// Every few seconds, produces the events of governance commands whose
/// gateway died between the change in the group write model and the
/// produce (see `governance::exec`); every gateway sweeps, and an event
/// produced twice changes nothing.
async fn sweep_governance(gw: Arc<Gateway>) {
    let every = std::time::Duration::from_secs(10);
    loop {
        tokio::select! {
            _ = gw.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        for tenant in &gw.config.tenants {
            if let Err(e) = gw.governance.sweep(&tenant.id).await {
                tracing::warn!(tenant = %tenant.id, error = %e, "governance sweep failed");
            }
        }
    }
}

/// Evicts local sessions from groups their user no longer belongs to (or
/// that were dissolved): the Pub/Sub eviction may have been lost, so each
/// heartbeat checks every attachment against the group write model.
async fn recheck_members(gw: &Gateway, _redis: &mut crate::redis_util::Redis) {
    let attached: Vec<_> = gw
        .hub
        .attached_members()
        .into_iter()
        .filter(|(_, topic, _)| crate::tinode::is_group_topic(topic))
        .collect();
    // One read of the model per group, for all its attached users.
    let mut by_group: std::collections::BTreeMap<(String, String), Vec<i64>> =
        std::collections::BTreeMap::new();
    for (tenant, topic, uid) in attached {
        by_group
            .entry((tenant.to_string(), topic.to_string()))
            .or_default()
            .push(uid);
    }
    let model = &gw.groups;
    for ((tenant, topic), uids) in by_group {
        let snapshot = match model.read(&tenant, &topic, &uids, None).await {
            Ok(crate::group_model::Read::State(s)) => s,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "membership re-check failed");
                continue;
            }
        };
        for uid in uids {
            let member = snapshot.status == crate::group_model::Status::Active
                && matches!(snapshot.place(uid), crate::group_model::Place::Member(_));
            if !member {
                let n = crate::realtime::bus::evict(&gw.hub, &tenant, &topic, Some(uid));
                tracing::info!(%tenant, %topic, uid, sessions = n, "evicted on heartbeat: no longer a member");
            }
        }
    }
}

async fn upgrade(
    State(gw): State<Arc<Gateway>>,
    info: Option<axum::Extension<axum::extract::ConnectInfo<SocketAddr>>>,
    counted: Option<axum::Extension<server::Counted>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let origin = header(axum::http::header::ORIGIN);
    if !origin::allowed(
        origin,
        header(axum::http::header::HOST),
        &gw.config.gateway.allowed_origins,
    ) {
        tracing::info!(
            origin,
            "WebSocket refused: origin not allowed (gateway.allowed_origins)"
        );
        return (
            StatusCode::FORBIDDEN,
            "origin not allowed (gateway.allowed_origins)",
        )
            .into_response();
    }
    let peer = server::peer_of(info.map(|axum::Extension(i)| i));
    // The socket holds its connection's place in the per-address count.
    let counted = counted.map(|axum::Extension(c)| c);
    // Frames and messages beyond the limit are refused before they are
    // buffered (the connection closes with 1009).
    let max = gw.config.gateway.max_message_size + 64 * 1024;
    // Small buffers: most sessions are idle most of the time.
    ws.max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(4096)
        .write_buffer_size(4096)
        .on_upgrade(move |socket| session::serve(gw, socket, peer, counted))
}
