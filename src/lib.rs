//! imstream: the message backbone of a multi-tenant IM product.
//!
//! Every change is an Avro event in Kafka (registered in a schema
//! registry); stateless projector pipelines turn the log into read models
//! (monthly MySQL tables, the route mirror, Redis routes and hot messages,
//! realtime fan-out); a thin Tinode-compatible gateway only produces events
//! and serves reads. See `docs/ARCHITECTURE.md`.
//!
//! # Layout: floors
//!
//! The modules stand on eight floors; a module imports from its own floor
//! and the floors below, never above ([`FLOORS`], checked by the test in
//! `src/layers.rs` on every `cargo test`). Lowest first:
//!
//! 1. **Base** — [`config`] (the TOML configuration with environment
//!    overrides), [`names`] (tenant ids, database names, month-table
//!    prefixes), [`keys`] (Redis key names), [`exact`] (identity columns are
//!    `VARBINARY`, checked before a database is used), [`fields`] (what
//!    every user-given field may hold: the columns' limits), [`failure`] (outage
//!    or poison), [`metrics`], [`routes`] (HTTP routes listed by the code
//!    that builds them), [`bearer`] (operator tokens, constant-time),
//!    [`shutdown`], [`request_id`], [`tinode`] (the protocol's names and
//!    `{ctrl}` frames), [`coalesce`] (single-flight reads), [`digest`]
//!    (order-independent digests of rows, for verifications).
//! 2. **Contract** — [`events`]: the Avro events and their wire codec.
//! 3. **Clients** — [`kafka`] (producer, topics), [`registry`] (the
//!    embedded schema registry and the client that registers schemas),
//!    [`redis_util`] (connections, locks, Redis's clock, the dataset
//!    generation), [`tenant`] (tenant databases, pools, migrations),
//!    [`replica`] (read replicas and their lag), [`users`] (password
//!    logins), [`snowflake`] (ids), [`telemetry`] (tracing, metrics and
//!    health endpoints).
//! 4. **Store** — [`store`]: stored messages and everything that keeps
//!    them: month tables, the catalog and the month clock, the writer,
//!    routes, user-view deletes, archives (format, writer, verify, reader),
//!    the legacy table as the paths see it, the consistency checker;
//!    [`files`]: uploaded files' records and their bytes in an object store.
//! 5. **Models** — state the commands are checked against and read models
//!    beside the messages: [`group_model`] (one consistent state per group,
//!    changed atomically), [`groups`], [`governance`], [`caps`],
//!    [`relations`], [`pins`] (a chat's pinned messages),
//!    [`session_control`], [`conversations`] (the chat list),
//!    [`search`], [`stats`], [`realtime`] (presence, the bus, the local
//!    hub), [`auth`] (session tokens, `basic` logins).
//! 6. **Paths** — [`history`] (page assembly: hot, routes, months,
//!    archives, legacy), [`send`] (ACL, seq allocation, produce, ack),
//!    [`references`] (reports, favorites, files resolved through the read
//!    path), [`notifications`], [`recovery`] (the write side put back from
//!    durable state after Redis forgot).
//! 7. **Processes** — [`gateway`] (Tinode WebSocket and HTTP), [`pipeline`]
//!    (the projector runner and pipelines), [`replay`] (rebuild and verify
//!    a projection), [`legacy`] (the legacy-table migration commands).
//! 8. **Entry** — [`cli`], [`commands`] (what each subcommand does, wired
//!    from the floors below), [`bench`] (load generators).

/// The floors of the crate, lowest first (see `# Layout`): a module may
/// import from its own floor and those below. Every top-level module is on
/// exactly one floor; `src/layers.rs` checks both.
pub const FLOORS: &[(&str, &[&str])] = &[
    (
        "base",
        &[
            "bearer",
            "coalesce",
            "config",
            "digest",
            "exact",
            "failure",
            "fields",
            "keys",
            "metrics",
            "names",
            "request_id",
            "routes",
            "shutdown",
            "tinode",
        ],
    ),
    ("contract", &["events"]),
    (
        "clients",
        &[
            "kafka",
            "redis_util",
            "registry",
            "replica",
            "snowflake",
            "telemetry",
            "tenant",
            "users",
        ],
    ),
    ("store", &["files", "store"]),
    (
        "models",
        &[
            "auth",
            "caps",
            "conversations",
            "governance",
            "group_model",
            "groups",
            "pins",
            "realtime",
            "relations",
            "search",
            "session_control",
            "stats",
        ],
    ),
    (
        "paths",
        &["history", "notifications", "recovery", "references", "send"],
    ),
    ("processes", &["gateway", "legacy", "pipeline", "replay"]),
    ("entry", &["bench", "cli", "commands"]),
];

pub mod auth;
pub mod bearer;
pub mod bench;
pub mod caps;
pub mod cli;
pub mod coalesce;
pub mod commands;
pub mod config;
pub mod conversations;
pub mod digest;
pub mod events;
pub mod exact;
pub mod failure;
pub mod fields;
pub mod files;
pub mod gateway;
pub mod governance;
pub mod group_model;
pub mod groups;
pub mod history;
pub mod kafka;
pub mod keys;
pub mod legacy;
pub mod metrics;
pub mod names;
pub mod notifications;
pub mod pins;
pub mod pipeline;
pub mod realtime;
pub mod recovery;
pub mod redis_util;
pub mod references;
pub mod registry;
pub mod relations;
pub mod replay;
pub mod replica;
pub mod request_id;
pub mod routes;
pub mod search;
pub mod send;
pub mod session_control;
pub mod shutdown;
pub mod snowflake;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod tenant;
pub mod tinode;
pub mod users;

pub use commands::run;

#[cfg(test)]
mod layers;
