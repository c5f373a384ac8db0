//! Configuration: one TOML file (see `docker/local/imstream.toml` for the
//! documented example) with environment overrides.
//!
//! Every section denies unknown keys, so a typo is refused with a message
//! naming the key instead of being silently ignored. Overrides use the form
//! `IMSTREAM__<SECTION>__<KEY>=<value>` (double underscores separate path
//! segments; the value is parsed as a TOML scalar, falling back to a string),
//! for example `IMSTREAM__KAFKA__BROKERS=10.0.0.5:9092`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Prefix of the environment variables that override configuration keys.
pub const ENV_PREFIX: &str = "IMSTREAM__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {source}")]
    Syntax {
        path: String,
        source: toml::de::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub node: NodeConfig,
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub redis: RedisConfig,
    #[serde(default)]
    pub mysql: MysqlConfig,
    #[serde(default)]
    pub registry: RegistryConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default)]
    pub gateway: GatewayConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub shards: ShardsConfig,
    #[serde(default)]
    pub pipelines: PipelinesConfig,
    #[serde(default)]
    pub push: PushConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub search: SearchConfig,
    /// Tenants served by this deployment; each has its own database.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Node id used for presence and the node's realtime channel. Empty means
    /// `IM_NODE_ID`, then `HOSTNAME`.
    pub id: String,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self { id: String::new() }
    }
}

impl NodeConfig {
    /// The effective node id: config, then `IM_NODE_ID`, then `HOSTNAME`.
    pub fn resolved_id(&self) -> String {
        if !self.id.is_empty() {
            return self.id.clone();
        }
        std::env::var("IM_NODE_ID")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "node-1".to_string())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma separated.
    pub brokers: String,
    /// Replication factor for topics created by `imstream topics ensure`.
    pub replication_factor: i32,
    /// `min.insync.replicas` of the topics `topics ensure` creates: with
    /// the producers' `acks=all`, a write is acknowledged only once this
    /// many replicas hold it.
    pub min_insync_replicas: i32,
    /// This deployment runs a single broker (a development stack): its
    /// acknowledged messages are lost with that broker's disk. Without it,
    /// `topics ensure` refuses a replication that can lose an acknowledged
    /// message when one broker fails (replication factor below 3,
    /// `min_insync_replicas` below 2, or not below the replication factor).
    pub single_broker: bool,
    /// Topic name prefix, so several deployments (or tests) can share a cluster.
    pub topic_prefix: String,
    pub topics: TopicsConfig,
    /// Extra librdkafka properties for every client (e.g. security settings).
    pub client_properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:19092".into(),
            replication_factor: 3,
            min_insync_replicas: 2,
            single_broker: false,
            topic_prefix: String::new(),
            topics: TopicsConfig::default(),
            client_properties: BTreeMap::new(),
        }
    }
}

/// Partition counts and retention of the event-log topics (ARCHITECTURE.md §2).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    pub group_events: TopicSpec,
    pub receipts: TopicSpec,
    pub session_control: TopicSpec,
    pub admin_commands: TopicSpec,
    pub admin_results: TopicSpec,
    /// Relations, user settings and user-targeted notifications: kept
    /// without a time limit (the relations projection is rebuilt from it).
    pub user_events: TopicSpec,
    /// Offline push tasks.
    pub push_tasks: TopicSpec,
    /// Partitions and retention of every `<topic>.<pipeline>.dlq` topic.
    pub dlq: TopicSpec,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        Self {
            // The event store: kept without a time limit so replays can rebuild.
            group_events: TopicSpec::new(8, -1),
            receipts: TopicSpec::new(8, 7 * DAY_MS),
            // Outlives every token (auth.token_ttl_secs, 14 days): a
            // revocation is still in the log while its token is valid.
            session_control: TopicSpec::new(4, 15 * DAY_MS),
            admin_commands: TopicSpec::new(4, 30 * DAY_MS),
            admin_results: TopicSpec::new(4, 30 * DAY_MS),
            user_events: TopicSpec::new(8, -1),
            push_tasks: TopicSpec::new(8, 7 * DAY_MS),
            dlq: TopicSpec::new(2, -1),
        }
    }
}

const DAY_MS: i64 = 86_400_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicSpec {
    pub partitions: i32,
    /// `retention.ms`; -1 keeps records forever.
    pub retention_ms: i64,
}

impl TopicSpec {
    pub const fn new(partitions: i32, retention_ms: i64) -> Self {
        Self {
            partitions,
            retention_ms,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    pub url: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:16379".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MysqlConfig {
    /// Server URL without a database; tenant databases are appended. A
    /// tenant may name its own server (`tenants[].mysql_url`).
    pub url: String,
    /// Connections per tenant pool.
    pub max_connections: u32,
    /// A read replica further behind its primary than this is skipped:
    /// its reads go to the primary until it catches up.
    pub replica_max_lag_ms: u64,
    /// How often a gateway measures each replica's lag (a heartbeat row
    /// written on the primary, read back from the replica).
    pub replica_heartbeat_ms: u64,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        Self {
            url: "mysql://imstream:imstream@127.0.0.1:13306".into(),
            max_connections: 16,
            replica_max_lag_ms: 1_000,
            replica_heartbeat_ms: 500,
        }
    }
}

impl MysqlConfig {
    /// URL of one database on the configured server.
    pub fn database_url(&self, database: &str) -> String {
        let base = self.url.trim_end_matches('/');
        match base.split_once('?') {
            Some((server, query)) => format!("{server}/{database}?{query}"),
            None => format!("{base}/{database}"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// Where clients reach the schema registry (Confluent-compatible).
    pub url: String,
    /// Where `imstream registry` listens.
    pub listen: SocketAddr,
    /// Database on the MySQL server that holds the embedded registry's schemas.
    pub database: String,
    /// Bearer token the embedded registry requires for every change (a new
    /// schema version, deletes, compatibility settings); `imstream schemas
    /// register` sends it. Empty: no token (only `imstream dev` and
    /// `imstream registry --insecure-dev-secrets` accept that).
    pub write_token: String,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:18081".into(),
            listen: "127.0.0.1:18081".parse().expect("static address"),
            database: "imstream_registry".into(),
            write_token: String::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable, for a terminal.
    Pretty,
    /// One JSON object per line, for services.
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub log_format: LogFormat,
    /// `tracing_subscriber::EnvFilter` directive; `RUST_LOG` wins when set.
    pub log_filter: String,
    /// Address of the Prometheus `/metrics`, `/healthz` and `/readyz`
    /// endpoint of long-running subcommands. Port 0 picks a free port.
    pub listen: SocketAddr,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Pretty,
            log_filter: "info,rdkafka=warn,sqlx=warn,tantivy=warn".into(),
            listen: "127.0.0.1:9464".parse().expect("static address"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    /// Where the operator endpoints (`/v1/admin/…`) listen, apart from the
    /// public port (which answers 404 for them). Loopback by default; port
    /// 0 picks a free one (the gateway logs it).
    pub admin_addr: SocketAddr,
    /// Largest accepted message content, in bytes (Tinode's maxMessageSize).
    pub max_message_size: usize,
    /// Seconds between presence refreshes and session control re-checks.
    pub heartbeat_secs: u64,
    /// How long after sending a sender may recall a message (Tinode's
    /// msg_delete_age). Owners and admins may delete any message at any age.
    pub recall_window_secs: u64,
    /// How long after sending a sender may edit a message.
    pub edit_window_secs: u64,
    /// One-to-one messages only between friends (blocks always apply).
    pub p2p_friends_only: bool,
    /// Folder where `npm ci --prefix webapp` installed the Tinode web app
    /// and the packages its page would load from CDNs; the gateway then
    /// serves the app at `/`. Empty: no web app (`imstream dev` uses
    /// `webapp` when it is installed).
    pub webapp_dir: String,
    /// Origins (`scheme://host[:port]`) whose pages may open the WebSocket
    /// besides the gateway's own (the page it serves); `*` allows any.
    /// Clients that send no `Origin` (non-browser) are not checked.
    pub allowed_origins: Vec<String>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:6060".parse().expect("static address"),
            admin_addr: "127.0.0.1:0".parse().expect("static address"),
            max_message_size: 256 * 1024,
            heartbeat_secs: 20,
            recall_window_secs: 600,
            edit_window_secs: 24 * 3600,
            p2p_friends_only: false,
            webapp_dir: String::new(),
            allowed_origins: Vec::new(),
        }
    }
}

/// A token bucket: `burst` requests at once, refilled at `per_minute`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    pub burst: u32,
    pub per_minute: u32,
}

impl BucketConfig {
    pub const fn new(burst: u32, per_minute: u32) -> Self {
        Self { burst, per_minute }
    }
}

/// What one user, one address or one message may cost (issue 13). The
/// rate buckets live in Redis under the user's own hash tag
/// (`im:{<tenant>:u:<uid>}:rl:<what>`); with Redis down a limited request
/// is refused (503), never let through (seed 001 §10).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Messages and edits (WebSocket `{pub}`, HTTP sends) per user.
    pub sends: BucketConfig,
    /// `{note what="recv"|"read"}` per user.
    pub receipts: BucketConfig,
    /// History clears (`{del}` without `hard`, `POST …/history/clear`).
    pub clears: BucketConfig,
    /// `GET …/search` per user.
    pub searches: BucketConfig,
    /// Directory searches (`{get topic="fnd" what="sub"}`) per user.
    pub finds: BucketConfig,
    /// `POST /v1/groups` per user.
    pub group_creates: BucketConfig,
    /// Users one user may add or invite to groups (creates and adds), per
    /// minute; a request costs one token per named user. Operators' admin
    /// commands are not counted.
    pub member_adds: BucketConfig,
    /// Most users one create or add may name (`400` beyond); operators add
    /// more through the `group.member.add` admin command.
    pub members_per_request: usize,
    /// `POST /v1/friends/requests` per user.
    pub friend_requests: BucketConfig,
    /// `POST …/messages/{seq}/report` per user.
    pub reports: BucketConfig,
    /// `PUT /v1/me/password` per user (each costs two Argon2 hashes; wrong
    /// old passwords also count as failed logins of the user's login).
    pub password_changes: BucketConfig,
    /// Favorites one user may keep (`PUT /v1/me/favorites/…` beyond it is
    /// refused with 409).
    pub favorites_per_user: usize,
    /// Passwords checked per login name (`basic`, normalized) before a
    /// lockout, however many attempts arrive at once: the attempt that
    /// takes the last one starts the lockout (a success lifts it); each
    /// attempt after a lockout ends doubles it.
    pub login_failures: u32,
    /// Failed logins per client address (any scheme) before its lockout,
    /// counted the same way; 0 turns the per-address lockout off (behind a
    /// proxy every client has the proxy's address).
    pub login_address_failures: u32,
    /// Loopback clients (a local proxy, `imstream bench`, tests) are not
    /// counted per address (connections, failed logins).
    pub exempt_loopback: bool,
    /// Failed admin tokens per client address, on one gateway's operator
    /// port, before it answers `429` to every admin call from that
    /// address for a while (the lockouts below, doubling).
    pub admin_failures: u32,
    /// First lockout, in milliseconds.
    pub login_lockout_ms: u64,
    /// Longest lockout, in milliseconds.
    pub login_lockout_max_ms: u64,
    /// Open WebSocket and HTTP connections per client address, per gateway.
    pub connections_per_ip: usize,
    /// Logged-in sessions per user on one gateway; a login beyond it is
    /// refused (`{ctrl 429 "too many sessions"}`, then closed), existing
    /// sessions are kept.
    pub sessions_per_user: usize,
    /// A socket that has not logged in (`{hi}` + `{login}`) this long
    /// after connecting is closed.
    pub login_deadline_secs: u64,
    /// A socket with no frame from the client (a message, Tinode's `1`
    /// probe, a pong to the gateway's pings) this long is closed. The
    /// gateway pings every third of it.
    pub idle_timeout_secs: u64,
    /// HTTP: time to read a request's headers, in seconds.
    pub header_timeout_secs: u64,
    /// HTTP: time to handle a request, body included, in seconds.
    pub request_timeout_secs: u64,
    /// HTTP: largest request body, in bytes.
    pub max_body_bytes: usize,
    /// `{get what="data"}`: most ranges in one request.
    pub get_ranges: usize,
    /// `{get what="data"}`: most seqs all ranges of one request may span.
    pub get_range_seqs: i64,
    /// Groups up to this many members get a push task per offline member;
    /// in bigger groups only mentioned users are pushed, and an owner's or
    /// admin's `@all` pushes at most this many offline members.
    pub push_group_members: usize,
    /// Hot messages kept per topic (the newest).
    pub hot_per_topic: i64,
    /// History-clear rows kept per user and topic; beyond it the oldest
    /// ranges are merged into one.
    pub dellog_per_user: usize,
    /// Widest moderation or recall delete (seqs) in one request.
    pub delete_width: i64,
    /// Concurrent log scans of first sends to topics without a seq.
    pub reseed_scans: usize,
    /// Sends one gateway process holds at once (admitted, not yet acked or
    /// refused). Beyond it a send is refused at once, before any seq is
    /// allocated: `{ctrl 503}` / HTTP 503 with `retry_after_ms` and
    /// `Retry-After`, so a saturated system answers fast instead of
    /// queueing acks for seconds. 0: no bound.
    pub sends_in_flight: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            sends: BucketConfig::new(30, 600),
            receipts: BucketConfig::new(60, 1200),
            clears: BucketConfig::new(10, 60),
            searches: BucketConfig::new(10, 60),
            finds: BucketConfig::new(20, 120),
            group_creates: BucketConfig::new(5, 30),
            member_adds: BucketConfig::new(1_000, 1_000),
            members_per_request: 500,
            friend_requests: BucketConfig::new(10, 60),
            reports: BucketConfig::new(10, 60),
            password_changes: BucketConfig::new(5, 5),
            favorites_per_user: 5_000,
            login_failures: 5,
            login_address_failures: 20,
            exempt_loopback: true,
            admin_failures: 5,
            login_lockout_ms: 1_000,
            login_lockout_max_ms: 300_000,
            connections_per_ip: 256,
            sessions_per_user: 16,
            login_deadline_secs: 10,
            idle_timeout_secs: 90,
            header_timeout_secs: 10,
            request_timeout_secs: 30,
            max_body_bytes: 1024 * 1024,
            get_ranges: 20,
            get_range_seqs: 2_000,
            push_group_members: 500,
            hot_per_topic: 200,
            dellog_per_user: 256,
            delete_width: 1_000,
            reseed_scans: 4,
            sends_in_flight: 4_096,
        }
    }
}

/// Where the push sender delivers offline push tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushConfig {
    /// POST each task as JSON to this URL; empty logs tasks instead (the
    /// default, for development).
    pub webhook_url: String,
    /// Timeout of one webhook call, in milliseconds.
    pub timeout_ms: u64,
    /// A message older than this when the push pipeline reaches it gets no
    /// push (0: no horizon). After a lag or a replay the pipeline then
    /// catches up with bounded work instead of a storm of notifications
    /// nobody wants minutes late; the badge and catch-up show them.
    pub horizon_secs: u64,
}

impl Default for PushConfig {
    fn default() -> Self {
        Self {
            webhook_url: String::new(),
            timeout_ms: 3000,
            horizon_secs: 300,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// HS256 secret for session tokens. Must be changed in production.
    pub jwt_secret: String,
    /// Lifetime of issued tokens, in seconds.
    pub token_ttl_secs: u64,
    /// Users accepted by the `basic` login scheme (development only).
    pub dev_users: Vec<DevUser>,
    /// Bearer token of the `/v1/admin` endpoints. Must be changed in production.
    /// An unnamed operator (audited as `admin`) of every tenant; empty
    /// disables it (allowed when `admin_tokens` lists others).
    pub admin_token: String,
    /// Named admin tokens: the audit records the name, and a token with a
    /// `tenant` may act on that tenant only.
    pub admin_tokens: Vec<AdminToken>,
    /// `iss` of issued tokens; tokens of another issuer are refused.
    pub issuer: String,
    /// Password logins of real deployments (`{login scheme="basic"}`).
    pub basic: BasicAuthConfig,
}

/// One operator's bearer token for the `/v1/admin` endpoints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminToken {
    /// Who holds it: recorded as the operator of every call made with it.
    pub name: String,
    pub token: String,
    /// The one tenant it may act on; absent: every tenant.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// One HS256 key of a tenant's session tokens, named by the `kid` header.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKey {
    pub kid: String,
    pub secret: String,
}

/// Where `basic` logins are looked up besides the development users: the
/// `im_basic_logins` table (Argon2id hashes, `imstream users add`) of
/// these tenants.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BasicAuthConfig {
    /// Tenants whose logins table answers `basic` logins. A login names one
    /// person across them (`imstream users add` refuses a login another of
    /// these tenants has). Empty: only `auth.dev_users` (development).
    pub tenants: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_secret: "dev-secret-change-me".into(),
            token_ttl_secs: 14 * 86_400,
            dev_users: Vec::new(),
            admin_token: "dev-admin-token-change-me".into(),
            admin_tokens: Vec::new(),
            issuer: "imstream".into(),
            basic: BasicAuthConfig::default(),
        }
    }
}

/// Shortest accepted `auth.jwt_secret` / `auth.admin_token` outside dev.
pub const MIN_SECRET_BYTES: usize = 32;

/// Secrets published with imstream (built-in defaults, the local config,
/// the compose file's old fallbacks): they protect nothing.
const PUBLISHED_SECRETS: &[&str] = &[
    "dev-secret-change-me",
    "dev-admin-token-change-me",
    "local-dev-secret-change-me",
    "local-dev-admin-token-change-me",
    "compose-dev-secret-change-me",
    "compose-admin-token-change-me",
];

impl AuthConfig {
    /// Why these secrets must not guard a real deployment (empty: fine).
    pub fn secret_problems(&self) -> Vec<String> {
        let mut named = vec![("auth.jwt_secret".to_string(), self.jwt_secret.as_str())];
        // The unnamed token may be switched off once named ones exist.
        if !(self.admin_token.is_empty() && !self.admin_tokens.is_empty()) {
            named.push(("auth.admin_token".into(), self.admin_token.as_str()));
        }
        for t in &self.admin_tokens {
            named.push((format!("auth.admin_tokens {:?}", t.name), t.token.as_str()));
        }
        let mut out = weak_secrets(&named);
        if !self.dev_users.is_empty() {
            out.push(
                "auth.dev_users holds plaintext passwords (development only; use auth.basic and `imstream users add`)"
                    .into(),
            );
        }
        out
    }
}

/// Problems of named secrets: published defaults, short ones, and one
/// secret used for two purposes.
fn weak_secrets(named: &[(String, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, value) in named {
        if PUBLISHED_SECRETS.contains(value) || value.contains("change-me") {
            out.push(format!("{name} is a published default"));
        } else if value.len() < MIN_SECRET_BYTES {
            out.push(format!("{name} is shorter than {MIN_SECRET_BYTES} bytes"));
        }
    }
    for (i, (a, x)) in named.iter().enumerate() {
        for (b, y) in &named[i + 1..] {
            if !x.is_empty() && x == y {
                out.push(format!("{a} and {b} are the same"));
            }
        }
    }
    out
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevUser {
    pub tenant: String,
    pub uid: i64,
    pub login: String,
    pub password: String,
    /// The name people see (`public.fn`): given to the user at gateway
    /// start when they have no profile yet (a name set later is kept).
    #[serde(default)]
    pub name: Option<String>,
    /// A picture reference (`public.photo.ref`): a URL or a path of the
    /// gateway, or a `data:image/…;base64,` URI (what the web app shows
    /// under its policy, which allows the page's origin and `data:`).
    #[serde(default)]
    pub photo: Option<String>,
}

/// Longest dev user name (`auth.dev_users[].name`), in characters: as
/// profile names set through the API.
pub const MAX_DEV_NAME_CHARS: usize = 128;
/// Longest dev user picture reference, in characters.
pub const MAX_DEV_PHOTO_CHARS: usize = 512;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShardsConfig {
    /// Fixed "now" for the shard manager and the gateway's month (RFC 3339),
    /// so tests can cross a month boundary. Empty means Redis `TIME`.
    pub clock_override: String,
    /// Seconds between shard-manager passes.
    pub interval_secs: u64,
    /// Days a finished month stays `sealing` before it may be sealed.
    pub sealing_days: u32,
    /// Root folder of month archives, used when `archive_url` is empty
    /// (kept for older configs).
    pub archive_dir: String,
    /// Where month archives live (`imstream shards archive` / `drop`, and
    /// reads of archived months): a path or `file://` URL, or an object
    /// store URL (`s3://bucket/prefix`, `gs://…`, `az://…`) configured from
    /// the usual `AWS_*` / `GOOGLE_*` / `AZURE_*` environment and
    /// `archive_options`. Empty means `archive_dir`.
    pub archive_url: String,
    /// Decoded archive blocks a process keeps in memory, in MiB.
    pub archive_cache_mb: u64,
    /// Object store options by `object_store` config key (e.g.
    /// `aws_endpoint`, `aws_allow_http`, `aws_region`), over the environment.
    pub archive_options: std::collections::BTreeMap<String, String>,
    /// Seconds between consistency checks of each tenant (the Redis route,
    /// the MySQL route mirror and the month tables; `store::consistency`);
    /// 0 turns the scheduled check off (`imstream shards check` still runs).
    pub check_interval_secs: u64,
    /// Topics one scheduled check compares per tenant; the next check goes
    /// on after the last one (all of them over successive checks).
    pub check_topics_per_run: usize,
    /// Expired rows of `im_group_message_dedup` one check deletes at most.
    pub dedup_purge_per_run: u64,
}

impl ShardsConfig {
    /// The archive root: `archive_url`, else `archive_dir`.
    pub fn archive_root(&self) -> &str {
        if self.archive_url.is_empty() {
            &self.archive_dir
        } else {
            &self.archive_url
        }
    }
}

impl Default for ShardsConfig {
    fn default() -> Self {
        Self {
            clock_override: String::new(),
            interval_secs: 60,
            sealing_days: 7,
            archive_dir: "archive".into(),
            archive_url: String::new(),
            archive_cache_mb: 64,
            archive_options: Default::default(),
            check_interval_secs: 3600,
            check_topics_per_run: 1000,
            dedup_purge_per_run: 10_000,
        }
    }
}

/// The full-text message index (`imstream project search`, `GET
/// /v1/search`): Tantivy on local disk, one index per tenant.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Whether `GET /v1/search` reads the index. Off (the default), it
    /// answers with the `LIKE` search over at most three months of one
    /// conversation, so a deployment that does not run the search pipeline
    /// never serves an empty index.
    pub enabled: bool,
    /// Root folder of the indexes: `<index_dir>/<tenant>/`. The search
    /// pipeline writes it (one writer per index: see docs/api.md "Search"); the
    /// gateways that answer `GET /v1/search` read the same folder.
    pub index_dir: String,
    /// Indexing memory of one tenant's writer, in MB (Tantivy needs at
    /// least 15).
    pub writer_memory_mb: usize,
    /// The tenants whose indexes this host's search pipeline writes (empty:
    /// every configured tenant). Events of the other configured tenants
    /// are passed over, so index hosts split the tenants between them,
    /// each with its own consumer group (`pipelines.group_prefix`).
    pub tenants: Vec<String>,
}

impl Default for SearchConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            index_dir: "search-index".into(),
            writer_memory_mb: 32,
            tenants: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelinesConfig {
    /// Directory holding `topologies/<pipeline>.toml`.
    pub topologies_dir: String,
    /// Consumer group id prefix, so tests can run isolated groups.
    pub group_prefix: String,
}

impl Default for PipelinesConfig {
    fn default() -> Self {
        Self {
            topologies_dir: "topologies".into(),
            group_prefix: "imstream".into(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant id: `[a-z0-9_]{1,32}`; appears in Redis keys and Kafka keys.
    pub id: String,
    /// The tenant's own database on its MySQL server.
    pub database: String,
    /// Keys of this tenant's session tokens: the first signs, every one
    /// verifies (list the new key first and keep the old one during a
    /// roll-over). Empty: `auth.jwt_secret` signs and verifies.
    #[serde(default)]
    pub signing_keys: Vec<SigningKey>,
    /// The tenant's MySQL server (URL without a database), so tenants can
    /// be spread over servers; `None`: `mysql.url`. Migrations, the shard
    /// manager, pipelines, replay, legacy migration and archive follow it.
    #[serde(default)]
    pub mysql_url: Option<String>,
    /// A read replica of that server (seed 003 §11.1): history pages read
    /// from it while its replication lag is within
    /// `mysql.replica_max_lag_ms`; reads that must see their own writes
    /// (edit and recall checks) stay on the primary.
    #[serde(default)]
    pub mysql_read_url: Option<String>,
}

impl TenantConfig {
    /// The MySQL settings of this tenant's server (`mysql` with the
    /// tenant's URL, when it has one).
    pub fn mysql(&self, mysql: &MysqlConfig) -> MysqlConfig {
        match &self.mysql_url {
            Some(url) => MysqlConfig {
                url: url.clone(),
                ..mysql.clone()
            },
            None => mysql.clone(),
        }
    }

    /// The MySQL settings of this tenant's read replica, if it has one.
    pub fn mysql_read(&self, mysql: &MysqlConfig) -> Option<MysqlConfig> {
        self.mysql_read_url.as_ref().map(|url| MysqlConfig {
            url: url.clone(),
            ..mysql.clone()
        })
    }
}

impl Config {
    /// Loads `path` (or the built-in defaults when `None`) and applies the
    /// `IMSTREAM__…` environment overrides.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.display().to_string(),
                source,
            })?,
            None => String::new(),
        };
        let shown = path.map_or_else(|| "<defaults>".to_string(), |p| p.display().to_string());
        Self::from_toml_with_env(&text, &shown, std::env::vars())
    }

    /// Parses TOML text, applies overrides from `env`, and validates.
    pub fn from_toml_with_env(
        text: &str,
        shown_path: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let file: toml::Table = text.parse().map_err(|source| ConfigError::Syntax {
            path: shown_path.to_string(),
            source,
        })?;
        // Defaults first, the file over them, the environment over both, so
        // one key can be set without restating its whole section.
        let mut doc = match toml::Value::try_from(Config::default()) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        merge(&mut doc, file);
        for (name, value) in env {
            if let Some(path) = name.strip_prefix(ENV_PREFIX) {
                apply_override(&mut doc, &name, path, &value)?;
            }
        }
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(doc))
            .map_err(|e| ConfigError::Invalid(format!("{}: {}", e.path(), e.inner().message())))?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.search.writer_memory_mb < 15 {
            return Err(ConfigError::Invalid(
                "search.writer_memory_mb must be at least 15".into(),
            ));
        }
        if self.search.index_dir.is_empty() {
            return Err(ConfigError::Invalid("search.index_dir is empty".into()));
        }
        if let Some(t) = self
            .search
            .tenants
            .iter()
            .find(|t| !self.tenants.iter().any(|c| &c.id == *t))
        {
            return Err(ConfigError::Invalid(format!(
                "search.tenants: {t:?} is not a configured tenant"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tenants {
            crate::names::validate_tenant_id(&t.id)
                .map_err(|e| ConfigError::Invalid(format!("tenants.id {:?}: {e}", t.id)))?;
            crate::names::validate_database_name(&t.database).map_err(|e| {
                ConfigError::Invalid(format!("tenants.database {:?}: {e}", t.database))
            })?;
            for (what, url) in [
                ("mysql_url", &t.mysql_url),
                ("mysql_read_url", &t.mysql_read_url),
            ] {
                if url.as_deref().is_some_and(|u| !u.starts_with("mysql://")) {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: {what} must be a mysql:// URL without a database",
                        t.id
                    )));
                }
            }
            if !seen.insert(t.id.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "tenant {:?} is listed twice",
                    t.id
                )));
            }
            let mut kids = std::collections::HashSet::new();
            for k in &t.signing_keys {
                if k.kid.is_empty() || k.kid.len() > 64 {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: signing_keys kid must be 1-64 characters",
                        t.id
                    )));
                }
                if !kids.insert(k.kid.as_str()) {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: signing key {:?} is listed twice",
                        t.id, k.kid
                    )));
                }
                if k.secret.len() < 16 {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: signing key {:?} must be at least 16 bytes",
                        t.id, k.kid
                    )));
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for a in &self.auth.admin_tokens {
            if a.name.is_empty() || !names.insert(a.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "auth.admin_tokens: name {:?} is empty or listed twice",
                    a.name
                )));
            }
            if let Some(t) = a.tenant.as_deref().filter(|t| !seen.contains(t)) {
                return Err(ConfigError::Invalid(format!(
                    "auth.admin_tokens {:?}: tenant {t:?} is not configured",
                    a.name
                )));
            }
        }
        if self.auth.issuer.is_empty() {
            return Err(ConfigError::Invalid("auth.issuer is empty".into()));
        }
        crate::names::validate_database_name(&self.registry.database).map_err(|e| {
            ConfigError::Invalid(format!(
                "registry.database {:?}: {e}",
                self.registry.database
            ))
        })?;
        if self.kafka.brokers.trim().is_empty() {
            return Err(ConfigError::Invalid("kafka.brokers is empty".into()));
        }
        let topics = &self.kafka.topics;
        for (name, spec) in [
            ("group_events", &topics.group_events),
            ("receipts", &topics.receipts),
            ("session_control", &topics.session_control),
            ("admin_commands", &topics.admin_commands),
            ("admin_results", &topics.admin_results),
            ("dlq", &topics.dlq),
        ] {
            if spec.partitions < 1 {
                return Err(ConfigError::Invalid(format!(
                    "kafka.topics.{name}.partitions must be at least 1, got {}",
                    spec.partitions
                )));
            }
            if spec.retention_ms < -1 || spec.retention_ms == 0 {
                return Err(ConfigError::Invalid(format!(
                    "kafka.topics.{name}.retention_ms must be -1 (forever) or positive, got {}",
                    spec.retention_ms
                )));
            }
        }
        if self.auth.jwt_secret.len() < 16 {
            return Err(ConfigError::Invalid(
                "auth.jwt_secret must be at least 16 bytes".into(),
            ));
        }
        let control = self.kafka.topics.session_control.retention_ms;
        if control != -1 && control < self.auth.token_ttl_secs as i64 * 1000 {
            return Err(ConfigError::Invalid(format!(
                "kafka.topics.session_control.retention_ms ({control}) must be -1 or at least auth.token_ttl_secs ({} s): a revocation must outlive the tokens it revokes",
                self.auth.token_ttl_secs
            )));
        }
        if let Some(u) = self.auth.dev_users.iter().find(|u| u.uid <= 0) {
            return Err(ConfigError::Invalid(format!(
                "auth.dev_users: {:?} has uid {}; uids are positive",
                u.login, u.uid
            )));
        }
        for u in &self.auth.dev_users {
            let name = u.name.as_deref().unwrap_or("x");
            if name.trim().is_empty() || name.chars().count() > MAX_DEV_NAME_CHARS {
                return Err(ConfigError::Invalid(format!(
                    "auth.dev_users: {:?} has a name that is empty or longer than {MAX_DEV_NAME_CHARS} characters",
                    u.login
                )));
            }
            let photo = u.photo.as_deref().unwrap_or("/");
            let data_uri = photo
                .strip_prefix("data:image/")
                .and_then(|rest| rest.split_once(";base64,"))
                .is_some_and(|(kind, _)| {
                    !kind.is_empty()
                        && kind
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
                });
            if photo.chars().count() > MAX_DEV_PHOTO_CHARS
                || !(photo.starts_with('/')
                    || photo.starts_with("https://")
                    || photo.starts_with("http://")
                    || data_uri)
            {
                return Err(ConfigError::Invalid(format!(
                    "auth.dev_users: {:?} has a photo that is not a URL, a path or a data:image/…;base64, URI of at most {MAX_DEV_PHOTO_CHARS} characters",
                    u.login
                )));
            }
        }
        if let Some(t) = self
            .auth
            .basic
            .tenants
            .iter()
            .find(|t| self.tenant(t).is_none())
        {
            return Err(ConfigError::Invalid(format!(
                "auth.basic.tenants: {t:?} is not a configured tenant"
            )));
        }
        if let Some(o) = self
            .gateway
            .allowed_origins
            .iter()
            .find(|o| *o != "*" && !o.contains("://"))
        {
            return Err(ConfigError::Invalid(format!(
                "gateway.allowed_origins: {o:?} is not an origin (scheme://host[:port]) or \"*\""
            )));
        }
        if !self.shards.clock_override.is_empty() {
            chrono::DateTime::parse_from_rfc3339(&self.shards.clock_override).map_err(|e| {
                ConfigError::Invalid(format!(
                    "shards.clock_override {:?} is not RFC 3339: {e}",
                    self.shards.clock_override
                ))
            })?;
        }
        Ok(())
    }

    /// Why this deployment's secrets (`auth`'s and every tenant's signing
    /// keys) must not guard a real deployment (empty: fine).
    pub fn secret_problems(&self) -> Vec<String> {
        let mut out = self.auth.secret_problems();
        let mut named = Vec::new();
        for t in &self.tenants {
            for k in &t.signing_keys {
                named.push((
                    format!("tenants {:?} signing key {:?}", t.id, k.kid),
                    k.secret.as_str(),
                ));
            }
        }
        out.extend(weak_secrets(&named));
        for (name, value) in &named {
            if value == &self.auth.jwt_secret || value == &self.auth.admin_token {
                out.push(format!("{name} is also an auth secret"));
            }
        }
        out
    }

    /// The tenant with this id, if configured.
    pub fn tenant(&self, id: &str) -> Option<&TenantConfig> {
        self.tenants.iter().find(|t| t.id == id)
    }
}

/// Deep-merges `over` into `base`: tables merge key by key, anything else
/// (scalars, arrays) replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(key, v);
            }
        }
    }
}

/// Applies one `IMSTREAM__A__B=value` override to the parsed document.
fn apply_override(
    doc: &mut toml::Table,
    var: &str,
    path: &str,
    value: &str,
) -> Result<(), ConfigError> {
    let segments: Vec<String> = path.split("__").map(|s| s.to_ascii_lowercase()).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(ConfigError::Invalid(format!(
            "environment variable {var}: empty key segment"
        )));
    }
    let (last, parents) = segments.split_last().expect("split yields one segment");
    let mut table = doc;
    for seg in parents {
        let entry = table
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| {
            ConfigError::Invalid(format!(
                "environment variable {var}: `{seg}` is not a section"
            ))
        })?;
    }
    table.insert(last.clone(), parse_scalar(value));
    Ok(())
}

/// A TOML scalar if the text parses as one (number, bool, array), else a string.
fn parse_scalar(value: &str) -> toml::Value {
    let wrapped = format!("v = {value}");
    match wrapped.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(value.into())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(
            text,
            "test.toml",
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn the_local_config_gives_the_dev_users_names_and_pictures() {
        let c = load(include_str!("../docker/local/imstream.toml"), &[]).unwrap();
        let users: Vec<(&str, Option<&str>, bool)> = c
            .auth
            .dev_users
            .iter()
            .map(|u| {
                let photo = u.photo.as_deref().unwrap_or("");
                (
                    u.login.as_str(),
                    u.name.as_deref(),
                    photo.starts_with("data:image/svg+xml;base64,"),
                )
            })
            .collect();
        assert_eq!(
            users,
            vec![
                ("alice", Some("Alice Liddell"), true),
                ("bob", Some("Bob Builder"), true)
            ]
        );
    }

    #[test]
    fn dev_user_names_and_pictures_are_checked() {
        let user = |extra: &str| {
            format!("[[auth.dev_users]]\ntenant = \"t\"\nuid = 1\nlogin = \"a\"\npassword = \"p\"\n{extra}\n")
        };
        assert!(load(&user(""), &[]).is_ok());
        assert!(load(&user("name = \"Ann\"\nphoto = \"/img/a.png\""), &[]).is_ok());
        assert!(load(&user("photo = \"data:image/png;base64,iVBORw0=\""), &[]).is_ok());
        for bad in [
            "name = \"  \"".to_string(),
            format!("name = \"{}\"", "n".repeat(MAX_DEV_NAME_CHARS + 1)),
            "photo = \"javascript:alert(1)\"".to_string(),
            "photo = \"data:image/svg+xml,%3Csvg/%3E\"".to_string(),
            "photo = \"data:text/html;base64,PGI+\"".to_string(),
            format!(
                "photo = \"data:image/png;base64,{}\"",
                "A".repeat(MAX_DEV_PHOTO_CHARS)
            ),
        ] {
            let err = load(&user(&bad), &[]).unwrap_err().to_string();
            assert!(err.contains("auth.dev_users"), "{bad}: {err}");
        }
    }

    #[test]
    fn defaults_are_valid() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.kafka.topics.group_events.retention_ms, -1);
        assert!(c.tenants.is_empty());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = load("[kafka]\nbrokerz = \"x\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("brokerz"), "{err}");
    }

    #[test]
    fn env_overrides_nested_keys() {
        let c = load(
            "[kafka]\nbrokers = \"a:1\"\n",
            &[
                ("IMSTREAM__KAFKA__BROKERS", "b:2"),
                ("IMSTREAM__KAFKA__TOPICS__GROUP_EVENTS__PARTITIONS", "16"),
                ("IMSTREAM__GATEWAY__MAX_MESSAGE_SIZE", "1024"),
                ("OTHER", "ignored"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.brokers, "b:2");
        assert_eq!(c.kafka.topics.group_events.partitions, 16);
        assert_eq!(c.gateway.max_message_size, 1024);
    }

    #[test]
    fn unknown_env_key_is_refused() {
        let err = load("", &[("IMSTREAM__REDIS__URLL", "x")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("urll"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let err = load(
            "[kafka.topics.receipts]\npartitions = 0\nretention_ms = 5\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("kafka.topics.receipts.partitions"), "{err}");
        let err = load("[[tenants]]\nid = \"Bad Tenant\"\ndatabase = \"db\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("Bad Tenant"), "{err}");
        let err = load("[gateway]\nmax_message_size = \"big\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_message_size") || err.contains("invalid type"),
            "{err}"
        );
    }

    #[test]
    fn plaintext_dev_users_are_a_secret_problem() {
        let strong = AuthConfig {
            jwt_secret: "j".repeat(40),
            admin_token: "a".repeat(40),
            ..AuthConfig::default()
        };
        assert!(strong.secret_problems().is_empty());
        let with_dev = AuthConfig {
            dev_users: vec![DevUser {
                tenant: "demo".into(),
                uid: 1,
                login: "alice".into(),
                password: "alice123".into(),
                name: None,
                photo: None,
            }],
            ..strong
        };
        let problems = with_dev.secret_problems();
        assert!(
            problems.iter().any(|p| p.contains("auth.dev_users")),
            "{problems:?}"
        );
    }

    #[test]
    fn basic_tenants_and_origins_are_checked() {
        let err = load("[auth.basic]\ntenants = [\"nope\"]\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope"), "{err}");
        let err = load("[gateway]\nallowed_origins = [\"example.com\"]\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("example.com"), "{err}");
        let c = load(
            "[gateway]\nallowed_origins = [\"https://chat.example.com\", \"*\"]\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.gateway.allowed_origins.len(), 2);
    }

    #[test]
    fn database_url_keeps_query() {
        let m = MysqlConfig {
            url: "mysql://u:p@h:1?ssl-mode=disabled".into(),
            max_connections: 1,
            ..MysqlConfig::default()
        };
        assert_eq!(m.database_url("t1"), "mysql://u:p@h:1/t1?ssl-mode=disabled");
    }

    #[test]
    fn a_tenant_may_live_on_its_own_server_with_a_read_replica() {
        let config = Config::from_toml_with_env(
            r#"
            [mysql]
            url = "mysql://u:p@main:3306"
            [[tenants]]
            id = "a"
            database = "ima"
            [[tenants]]
            id = "b"
            database = "imb"
            mysql_url = "mysql://u:p@server-b:3306"
            mysql_read_url = "mysql://r:p@replica-b:3306"
            "#,
            "<test>",
            Vec::new(),
        )
        .unwrap();
        let (a, b) = (&config.tenants[0], &config.tenants[1]);
        assert_eq!(
            a.mysql(&config.mysql).database_url(&a.database),
            "mysql://u:p@main:3306/ima"
        );
        assert!(a.mysql_read(&config.mysql).is_none());
        assert_eq!(
            b.mysql(&config.mysql).database_url(&b.database),
            "mysql://u:p@server-b:3306/imb"
        );
        assert_eq!(
            b.mysql_read(&config.mysql)
                .unwrap()
                .database_url(&b.database),
            "mysql://r:p@replica-b:3306/imb"
        );
        let bad = Config::from_toml_with_env(
            "[[tenants]]\nid = \"c\"\ndatabase = \"imc\"\nmysql_url = \"server-c:3306\"\n",
            "<test>",
            Vec::new(),
        );
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("mysql_url must be a mysql:// URL"));
    }
}
