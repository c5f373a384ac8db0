//! The sections of the processes: node identity, telemetry, gateway,
//! push, the shard manager, search, pipelines.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

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
    /// How long a group invitation can be accepted; an older one is shown
    /// to nobody, accepting it answers `410`, and the group may invite the
    /// user again (issue 39: invitations no longer pile up forever).
    pub invitation_ttl_secs: u64,
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
    /// How many of a user's most recent chats a cold `{sub topic="me"}`
    /// (the whole list asked for without `ims`: a client with nothing
    /// cached) gets the newest messages of, after the list, as Tinode's
    /// clients get them from their own cache (the web app draws a chat's
    /// preview only from messages it holds). 0: none.
    pub warm_chats: usize,
    /// How many of each warmed chat's newest messages (the web app's page).
    pub warm_messages: i64,
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
            invitation_ttl_secs: 14 * 24 * 3600,
            p2p_friends_only: false,
            webapp_dir: String::new(),
            allowed_origins: Vec::new(),
            warm_chats: 16,
            warm_messages: 24,
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

/// Files people upload (issue 41): where their bytes live, how large one
/// may be, how long an upload nobody refers to is kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// The object store root: a local path, `file://`, `s3://bucket/prefix`,
    /// `gs://…` or `az://…`, as `shards.archive_url`.
    pub store_url: String,
    /// That store's options (`aws_endpoint`, `aws_allow_http`, …), as
    /// `shards.archive_options`.
    pub store_options: std::collections::BTreeMap<String, String>,
    /// The largest upload, in bytes (Tinode's default, 8 MiB), told to
    /// clients in `{ctrl hi}` as `maxFileUploadSize`.
    pub max_upload_bytes: u64,
    /// How long one upload may take, start to end.
    pub upload_timeout_secs: u64,
    /// An upload no message or profile refers to is removed after this.
    pub unreferenced_ttl_secs: u64,
    /// A file whose last message went (recalled, deleted for everyone,
    /// moderated) is removed after this; readers lose it at once.
    pub deleted_retention_secs: u64,
    /// What the `scan` pipeline asks about each upload
    /// ([`crate::files::scan::Scanner`]): `clean` (everything is clean:
    /// the local stack's default), `eicar` (the test scanner: flags a file
    /// holding the EICAR test string), `exec:<program> <args…>` (the file
    /// on stdin; exit 0 clean, 1 flagged, else no verdict), or an
    /// `http://`/`https://` webhook (POSTed the file's tenant, id, object
    /// key, size and type; answers `{"verdict":"clean"|"flagged"}`). No
    /// answer: the scan waits. An answer without a verdict twice: a clean
    /// check sample is scanned; decided, the file is held unavailable
    /// (`failed`); not, the scan waits for the scanner.
    pub scanner: String,
    /// How long one scan may take before it counts as no answer (retried).
    pub scan_timeout_secs: u64,
    /// Longest one call to the store may take (a part written, an upload
    /// completed, a download begun): past it the client gets `503` and
    /// the upload is dropped, never half kept.
    pub store_timeout_secs: u64,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            store_url: "files".into(),
            store_options: Default::default(),
            max_upload_bytes: 8 * 1024 * 1024,
            upload_timeout_secs: 600,
            unreferenced_ttl_secs: 24 * 3600,
            deleted_retention_secs: 7 * 24 * 3600,
            scanner: "clean".into(),
            scan_timeout_secs: 120,
            store_timeout_secs: 20,
        }
    }
}
