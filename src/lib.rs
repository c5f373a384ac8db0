//! imstream: the message backbone of a multi-tenant IM product.
//!
//! Every change is an Avro event in Kafka (registered in a schema
//! registry); stateless projector pipelines turn the log into read models
//! (monthly MySQL tables, the route mirror, Redis routes and hot messages,
//! realtime fan-out); a thin Tinode-compatible gateway only produces events
//! and serves reads. See `docs/ARCHITECTURE.md`.
//!
//! # Layout
//!
//! - [`cli`] — the command line (one subcommand per process role).
//! - [`commands`] — what each subcommand does, wired from the parts below.
//! - [`config`] — the TOML configuration with environment overrides.
//! - [`bearer`] — operator bearer tokens, compared in constant time.
//! - [`telemetry`], [`metrics`] — tracing, Prometheus metrics, health endpoints.
//! - [`shutdown`] — the graceful-shutdown signal handed to every task.
//! - [`events`] — the Avro event contract, the wire-format codec, schema registration.
//! - [`registry`] — the embedded Confluent-compatible schema registry.
//! - [`kafka`] — producer, topics of the event log.
//! - [`failure`] — outage or poison: how every failure is classified.
//! - [`exact`] — exact identities: identity columns are `VARBINARY`, checked before a database is used.
//! - [`tenant`] — tenant databases (each on its own server, if configured), pools, migrations.
//! - [`replica`] — read replicas of tenant servers: the lag probe that decides when they are read.
//! - [`keys`], [`redis_util`] — Redis key names, scripts, locks, the month clock.
//! - [`store`] — month tables, the catalog, the shard manager, month archives in
//!   object storage, the store writer, routes.
//! - [`groups`] — membership and roles as the gateway asks about them.
//! - [`group_model`] — the group write model: one consistent state per group in Redis that every command is checked against and changed in atomically; rebuilt from MySQL and the log.
//! - [`caps`] — per-user caps (favorites, history clears) checked and taken atomically in Redis.
//! - [`governance`] — who may govern a group and the events each action becomes.
//! - [`conversations`] — the chat list read model: conversations, unread counts, profiles, member lists.
//! - [`references`] — reports, favorites and a conversation's files: `(topic, seq)` references resolved when read.
//! - [`search`] — message search from its own index: Tantivy per tenant, jieba for Chinese; hits resolved through the read path.
//! - [`stats`] — admin statistics: daily summaries per topic (messages, edits, recalls, deletes, senders).
//! - [`users`] — password logins (`basic`): the logins table, Argon2id hashes.
//! - [`relations`] — friends and blocks between users, cached for the one-to-one send path.
//! - [`notifications`] — a user's system notifications with their read state, derived from the log.
//! - [`pipeline`] — the consumer-group runner and the projector pipelines.
//! - [`send`], [`snowflake`] — the send path: ACL, seq allocation, produce, ack.
//! - [`gateway`] — the Tinode-compatible WebSocket and HTTP front end.
//! - [`tinode`] — the Tinode protocol's names, client messages and `{ctrl}` frames, for every layer.
//! - [`request_id`] — the id of the request being answered: in answers, in `{ctrl}` ≥ 500, in logs.
//! - [`realtime`] — presence, the realtime bus envelope, local session hub, Pub/Sub.
//! - [`history`] — the read path: hot messages, routes, month tables, archived
//!   months, dellog, coalescing.
//! - [`replay`] — `imstream replay`: rebuild a projection from the log and verify it.
//! - [`legacy`] — `imstream legacy`: move the legacy single table into month tables.
//! - [`bench`] — `imstream bench …` load generators (latency percentiles, throughput).

pub mod bearer;
pub mod bench;
pub mod caps;
pub mod cli;
pub mod commands;
pub mod config;
pub mod conversations;
pub mod events;
pub mod exact;
pub mod failure;
pub mod gateway;
pub mod governance;
pub mod group_model;
pub mod groups;
pub mod history;
pub mod kafka;
pub mod keys;
pub mod legacy;
pub mod metrics;
pub mod notifications;
pub mod pipeline;
pub mod realtime;
pub mod redis_util;
pub mod references;
pub mod registry;
pub mod relations;
pub mod replay;
pub mod replica;
pub mod request_id;
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
