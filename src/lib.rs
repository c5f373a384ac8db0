//! imstream: the message backbone of a multi-tenant IM product.
//!
//! Every change is an Avro event in Kafka (registered in a schema
//! registry); stateless projector pipelines turn the log into read models
//! (monthly MySQL tables, the route mirror, Redis routes and hot messages,
//! realtime fan-out); a thin Tinode-compatible gateway only produces events
//! and serves reads. See `shared/design/ARCHITECTURE.md`.
//!
//! # Layout
//!
//! - [`cli`] — the command line (one subcommand per process role).
//! - [`commands`] — what each subcommand does, wired from the parts below.
//! - [`config`] — the TOML configuration with environment overrides.
//! - [`telemetry`], [`metrics`] — tracing, Prometheus metrics, health endpoints.
//! - [`shutdown`] — the graceful-shutdown signal handed to every task.
//! - [`events`] — the Avro event contract, the wire-format codec, schema registration.
//! - [`registry`] — the embedded Confluent-compatible schema registry.
//! - [`kafka`] — producer, topics of the event log.
//! - [`tenant`] — tenant databases, pools, migrations.

pub mod cli;
pub mod commands;
pub mod config;
pub mod events;
pub mod kafka;
pub mod metrics;
pub mod registry;
pub mod shutdown;
pub mod telemetry;
pub mod tenant;

pub use commands::run;
