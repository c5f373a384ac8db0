//! Command-line interface: one binary, one subcommand per process role
//! (ARCHITECTURE.md §1).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "imstream",
    version,
    about = "Event-sourced message backbone for a multi-tenant IM product",
    long_about = "imstream turns every chat change into an Avro event in Kafka and projects the \
event log into MySQL monthly tables, Redis routes and hot messages, and realtime fan-out to \
Tinode-compatible WebSocket gateways.\n\nConfiguration comes from --config (TOML) and \
IMSTREAM__<SECTION>__<KEY> environment overrides; see docker/local/imstream.toml."
)]
pub struct Cli {
    /// Configuration file (TOML). Without it, built-in defaults for the local stack.
    #[arg(long, short, global = true, env = "IMSTREAM_CONFIG")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the embedded Confluent-compatible schema registry.
    Registry(RegistryArgs),
    /// Register or check the event schemas (schemas/*.avsc) with the schema registry.
    #[command(subcommand)]
    Schemas(SchemasCommand),
    /// Manage the Kafka topics of the event log.
    #[command(subcommand)]
    Topics(TopicsCommand),
    /// Create every tenant database and apply migrations/tenant (idempotent).
    Migrate(MigrateArgs),
    /// Serve the Tinode-compatible WebSocket (/v0/channels) and HTTP (/v1) gateway.
    Gateway(GatewayArgs),
    /// Run one projector pipeline as a Kafka consumer group (topologies/<pipeline>.toml).
    Project(ProjectArgs),
    /// Run a deployment unit: several pipelines of one source on one consumer (topologies/units.toml).
    Unit(UnitArgs),
    /// Run the shard manager: month tables, catalog, active month.
    Shards(ShardsArgs),
    /// Dead-letter queues of the pipelines.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Session tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// People who log in with a password (`basic`; auth.basic.tenants).
    #[command(subcommand)]
    Users(UsersCommand),
    /// Redis topic routes.
    #[command(subcommand)]
    Routes(RoutesCommand),
    /// Rebuild a projection from the event log (reset the pipeline's group, or --into a fresh target), then verify it.
    Replay(crate::replay::ReplayArgs),
    /// Move the legacy single table im_group_messages into the monthly tables.
    #[command(subcommand)]
    Legacy(crate::legacy::LegacyCommand),
    /// Run everything against local services in one process (laptop default).
    Dev(DevArgs),
    /// Benchmarks against a running deployment (start one with docker/local/run).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Send-ack latency and send-to-MySQL throughput over WebSocket clients.
    Send(crate::bench::send::SendArgs),
    /// End-to-end delivery latency, deliveries/s and memory per session for one big group.
    Fanout(crate::bench::fanout::FanoutArgs),
    /// History page latency (hot path and MySQL across two months) and request coalescing.
    History(crate::bench::history::HistoryArgs),
    /// File uploads and downloads: a large upload's gateway memory, concurrent uploads, downloads per second.
    Files(crate::bench::files::FilesArgs),
    /// The chat list and unread badge of a user in many conversations.
    Conversations(crate::bench::conversations::ConversationsArgs),
    /// The search index: indexing docs/s, then query p50/p99 at a fixed rate.
    Search(crate::bench::search::SearchArgs),
    /// Legacy-table copy throughput (rows/s) into monthly tables, on a scratch database.
    LegacyCopy(crate::bench::legacy::LegacyCopyArgs),
    /// After Redis restarts or is emptied: the time until every conversation sends again.
    Recovery(crate::bench::recovery::RecoveryArgs),
}

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Address to listen on; defaults to gateway.listen from the config.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Start even with a published default or short auth.jwt_secret /
    /// auth.admin_token (local testing only; never in production).
    #[arg(long)]
    pub insecure_dev_secrets: bool,
}

#[derive(Debug, Args)]
pub struct ProjectArgs {
    /// Pipeline name (topologies/<pipeline>.toml), e.g. store or members.
    pub pipeline: String,
}

#[derive(Debug, Args)]
pub struct UnitArgs {
    /// Unit name, as declared in topologies/units.toml (group, user).
    pub unit: String,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Run the pipeline's handler again over its DLQ (<topic>.<pipeline>.dlq),
    /// as consumer group <group_prefix>.<pipeline>.dlq-replay. Records that
    /// fail again go back to the same DLQ. Stops once every record that was
    /// in the DLQ at the start is replayed, unless --follow.
    Replay {
        /// Pipeline name, as for `imstream project`.
        pipeline: String,
        /// Keep replaying new DLQ records until Ctrl-C / SIGTERM.
        #[arg(long)]
        follow: bool,
    },
}

#[derive(Debug, Args)]
pub struct ShardsArgs {
    /// One pass for every tenant, then exit.
    #[arg(long)]
    pub once: bool,
    /// Use this instant (RFC 3339) instead of Redis TIME (tests, backfills).
    #[arg(long)]
    pub now: Option<String>,
    /// Archive or drop one month instead of running the manager.
    #[command(subcommand)]
    pub action: Option<ShardsAction>,
}

#[derive(Debug, Subcommand)]
pub enum ShardsAction {
    /// Export a sealed month to <root>/<tenant>/<YYYYMM>/ (an Avro
    /// container file in blocks, a per-topic seq index and a manifest with
    /// counts and SHA-256s). The table stays.
    Archive {
        tenant: String,
        /// Month, YYYYMM.
        month: String,
        /// Archive root, a path or an object store URL (s3://bucket/prefix);
        /// defaults to shards.archive_url (or archive_dir) from the config.
        #[arg(long)]
        to: Option<String>,
    },
    /// Verify a month's archive against its table, then drop the table and
    /// mark the month archived. Refused without a verified archive.
    Drop {
        tenant: String,
        /// Month, YYYYMM.
        month: String,
        /// Archive root, a path or an object store URL; defaults to
        /// shards.archive_url (or archive_dir) from the config.
        #[arg(long)]
        from: Option<String>,
        /// Really drop the table.
        #[arg(long)]
        confirm: bool,
    },
    /// Let a sealed month take late events again (status back to
    /// `sealing`); `imstream dlq replay store` then stores its dead letters,
    /// and the shard manager seals it again once nothing holds it.
    Reopen {
        tenant: String,
        /// Month, YYYYMM.
        month: String,
    },
    /// Compare every topic's Redis route, MySQL route mirror and month
    /// tables now, repair what differs (each repair recorded in
    /// im_consistency_repairs), purge expired dedup rows; prints the counts.
    Check {
        /// Only this tenant (default: every tenant).
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum RoutesCommand {
    /// Rebuild Redis route/route_meta from the MySQL route mirror.
    Rebuild {
        /// Only this tenant (default: every tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Mint a session token for development (prints it).
    Issue {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        uid: i64,
        #[arg(long, default_value = "cli")]
        device: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum UsersCommand {
    /// Add a password login for a user to the tenant's logins table (Argon2id
    /// hash). The password is read from the environment variable
    /// IMSTREAM_PASSWORD or else the first line of stdin, never from the
    /// command line (which other users of the machine can see).
    Add {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        uid: i64,
        #[arg(long)]
        login: String,
    },
    /// List the tenant's password logins (login, uid, whether a password
    /// is set, when created and changed; never a hash).
    List {
        #[arg(long)]
        tenant: String,
    },
    /// Remove a login (any spelling of it) and sign its user out everywhere.
    Remove {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        login: String,
    },
    /// Set a new password for a login (read like `add`: IMSTREAM_PASSWORD or
    /// the first line of stdin) and sign its user out everywhere.
    Reset {
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        login: String,
    },
}

#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Address to listen on; defaults to registry.listen from the config.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Start without a registry.write_token (local testing only).
    #[arg(long)]
    pub insecure_dev_secrets: bool,
}

#[derive(Debug, Subcommand)]
pub enum SchemasCommand {
    /// Register every event schema under TopicNameStrategy (<topic>-value).
    /// Refused with the registry's 409 message if a schema is incompatible.
    Register,
    /// Check every event schema against what is registered, without registering.
    /// Exits non-zero when any is incompatible.
    Check,
}

#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Create every missing topic (event log, receipts, control, admin, DLQs)
    /// with the configured partitions and retention.
    Ensure,
    /// Print the topics this deployment uses, with partitions and retention.
    List,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Only this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Skip topic creation and schema registration (they already exist).
    #[arg(long)]
    pub no_setup: bool,
}
