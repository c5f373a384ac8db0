//! Projector pipelines (`imstream project <pipeline>`): stateless consumer
//! groups that turn the event log into read models. The runner
//! ([`runner`]) is shared; each pipeline brings its handler.

pub mod members;
pub mod runner;
pub mod store;
pub mod topology;

use std::path::Path;

use crate::config::Config;
use crate::events::EventCodec;
use crate::kafka::producer::EventProducer;
use crate::shutdown::Shutdown;
use crate::tenant::TenantPools;

pub use topology::Topology;

/// Pipelines this build can run.
pub const PIPELINES: &[&str] = &["store", "members"];

/// Loads `topologies/<name>.toml` (from the configured directory, else the
/// built-in copy) and runs the pipeline until `shutdown`.
pub async fn run_named(config: &Config, name: &str, shutdown: Shutdown) -> anyhow::Result<()> {
    let dir = Path::new(&config.pipelines.topologies_dir);
    let topology = if dir.join(format!("{name}.toml")).exists() {
        Topology::load(dir, name)?
    } else {
        Topology::builtin(name).ok_or_else(|| {
            anyhow::anyhow!("unknown pipeline {name:?}; known: {}", PIPELINES.join(", "))
        })?
    };
    run_topology(config, &topology, shutdown).await
}

/// Runs one pipeline from its topology until `shutdown`.
pub async fn run_topology(
    config: &Config,
    topology: &Topology,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let codec = EventCodec::new(&config.registry.url)?;
    let producer = EventProducer::new(&config.kafka, codec.clone())?;
    let pools = TenantPools::connect_lazy(config)?;
    let redis = crate::redis_util::connect(&config.redis.url).await?;
    match topology.name.as_str() {
        "store" => {
            let handler = store::StoreHandler::new(codec, pools, redis);
            runner::run(config, topology, handler, producer, shutdown).await?
        }
        "members" => {
            let handler = members::MembersHandler::new(codec, pools, redis);
            runner::run(config, topology, handler, producer, shutdown).await?
        }
        other => anyhow::bail!(
            "unknown pipeline {other:?}; known: {}",
            PIPELINES.join(", ")
        ),
    }
    Ok(())
}
