//! Projector pipelines (`imstream project <pipeline>`): stateless consumer
//! groups that turn the event log into read models. The runner
//! ([`runner`]) is shared; each pipeline brings its handler.

pub mod checkpoints;
pub mod commands;
pub mod control;
pub mod conversations;
pub mod dlq;
pub mod failure;
pub mod fanout;
pub mod hot;
pub mod lag;
pub mod members;
pub mod notifications;
pub mod notify;
pub mod push;
pub mod pushsend;
pub mod receipts;
pub mod records;
pub mod references;
pub mod relations;
pub mod runner;
pub mod scan;
pub mod search;
pub mod stats;
pub mod store;
pub mod topology;
pub mod unit;
pub mod worker;

use std::path::Path;

use crate::config::Config;
use crate::events::EventCodec;
use crate::kafka::producer::EventProducer;
use crate::shutdown::Shutdown;
use crate::tenant::TenantPools;

pub use dlq::{replay_dlq, replay_dlq_topology, replay_until_drained};
pub use topology::Topology;

/// Pipelines this build can run.
pub const PIPELINES: &[&str] = &[
    "store",
    "members",
    "hot",
    "fanout",
    "receipts",
    "control",
    "commands",
    "relations",
    "notify",
    "push",
    "pushsend",
    "conversations",
    "stats",
    "references",
    "search",
    "notifications",
    "scan",
];

/// Loads `topologies/<name>.toml` (from the configured directory, else the
/// built-in copy) and runs the pipeline until `shutdown`.
pub async fn run_named(config: &Config, name: &str, shutdown: Shutdown) -> anyhow::Result<()> {
    let topology = load_topology(config, name)?;
    run_topology(config, &topology, shutdown).await
}

/// `topologies/<name>.toml` from the configured directory, else the
/// built-in copy.
pub fn load_topology(config: &Config, name: &str) -> anyhow::Result<Topology> {
    let dir = Path::new(&config.pipelines.topologies_dir);
    Ok(if dir.join(format!("{name}.toml")).exists() {
        Topology::load(dir, name)?
    } else {
        Topology::builtin(name).ok_or_else(|| {
            anyhow::anyhow!("unknown pipeline {name:?}; known: {}", PIPELINES.join(", "))
        })?
    })
}

/// Where a pipeline reads, as which consumer group, and where records it
/// gives up on go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub source: String,
    pub group: String,
    pub dlq: String,
}

impl Route {
    /// The pipeline's own route: its source topic, its group, its DLQ.
    pub fn main(config: &Config, topology: &Topology) -> anyhow::Result<Route> {
        let kind = topology
            .source_kind()
            .ok_or_else(|| anyhow::anyhow!("topology {} has no known source", topology.name))?;
        let names = crate::kafka::topics::TopicNames::new(&config.kafka);
        Ok(Route {
            source: names.name(kind),
            group: runner::group_id(config, topology),
            dlq: names.dlq(kind, &topology.name),
        })
    }
}

/// The store pipeline's topics, for the shard manager's sealing check.
pub fn store_topics(config: &Config) -> anyhow::Result<crate::store::sealing::StoreTopics> {
    let route = Route::main(config, &load_topology(config, "store")?)?;
    Ok(crate::store::sealing::StoreTopics {
        source: route.source,
        group: route.group,
        dlq: route.dlq,
        replay_group: dlq::replay_group(config, "store"),
    })
}

/// Runs one pipeline from its topology until `shutdown`.
pub async fn run_topology(
    config: &Config,
    topology: &Topology,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let route = Route::main(config, topology)?;
    run_route(config, topology, &route, shutdown).await
}

/// Runs the pipeline's handler over `route` until `shutdown`.
pub async fn run_route(
    config: &Config,
    topology: &Topology,
    route: &Route,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let codec = EventCodec::new(&config.registry.url)?;
    let producer = EventProducer::new(&config.kafka, codec.clone())?;
    let run = RunOn {
        config,
        topology,
        route,
        producer,
        shutdown,
    };
    with_handler(config, &topology.name, codec, run).await??;
    Ok(())
}

/// Something to do with a pipeline's handler, whatever its type: run it as
/// a consumer group, or replay the log through it (`replay`).
pub trait WithHandler {
    type Output;
    fn with<H: records::Handler>(
        self,
        handler: H,
    ) -> impl std::future::Future<Output = Self::Output> + Send;
}

/// Builds the handler of pipeline `name` (its sinks from `config`: tenant
/// databases, Redis) and hands it to `then`. The one place that maps a
/// pipeline name to its handler, so live runs and replays share the code.
pub async fn with_handler<W: WithHandler>(
    config: &Config,
    name: &str,
    codec: EventCodec,
    then: W,
) -> anyhow::Result<W::Output> {
    crate::tenant::verify_exact_identities(config).await?;
    let pools = TenantPools::connect_lazy(config)?;
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    // A Redis that could evict the write side is refused before anything
    // is decided on it.
    crate::redis_util::incarnation::check_no_eviction(&mut redis)
        .await
        .map_err(anyhow::Error::msg)?;
    Ok(match name {
        "store" => {
            then.with(store::StoreHandler::new(codec, pools, redis))
                .await
        }
        "receipts" => {
            then.with(receipts::ReceiptsHandler::new(codec, pools, redis))
                .await
        }
        "control" => {
            then.with(control::ControlHandler::new(codec, pools, redis))
                .await
        }
        "fanout" => {
            let model = crate::group_model::GroupModel::new(
                config.clone(),
                pools,
                redis.clone(),
                codec.clone(),
            );
            then.with(fanout::FanoutHandler::new(codec, redis, model))
                .await
        }
        "hot" => {
            let cap = config.limits.hot_per_topic;
            then.with(hot::HotHandler::new(codec, redis).per_topic(cap))
                .await
        }
        "members" => {
            then.with(members::MembersHandler::new(codec, pools, redis))
                .await
        }
        "commands" => {
            let producer = EventProducer::new(&config.kafka, codec.clone())?;
            let node = config.node.resolved_id();
            let model = crate::group_model::GroupModel::new(
                config.clone(),
                pools.clone(),
                redis,
                codec.clone(),
            );
            then.with(commands::CommandsHandler::new(
                codec, pools, model, producer, node,
            ))
            .await
        }
        "relations" => {
            then.with(relations::RelationsHandler::new(
                codec,
                pools,
                redis,
                config.files.deleted_retention_secs,
            ))
            .await
        }
        "notify" => then.with(notify::NotifyHandler::new(codec, redis)).await,
        "notifications" => {
            then.with(notifications::NotificationsHandler::new(
                codec, pools, redis,
            ))
            .await
        }
        "conversations" => {
            then.with(conversations::ConversationsHandler::new(
                codec, pools, redis,
            ))
            .await
        }
        "push" => {
            let producer = EventProducer::new(&config.kafka, codec.clone())?;
            let cap = config.limits.push_group_members;
            then.with(
                push::PushHandler::new(
                    codec.clone(),
                    pools.clone(),
                    redis.clone(),
                    producer,
                    crate::group_model::GroupModel::new(config.clone(), pools, redis, codec),
                )
                .group_cap(cap)
                .horizon_secs(config.push.horizon_secs),
            )
            .await
        }
        "stats" => then.with(stats::StatsHandler::new(codec, pools)).await,
        "references" => {
            then.with(references::ReferencesHandler::new(
                codec,
                pools,
                config.files.deleted_retention_secs,
            ))
            .await
        }
        "search" => then.with(search::SearchHandler::new(codec, config)).await,
        "scan" => {
            let producer = EventProducer::new(&config.kafka, codec.clone())?;
            let store = crate::files::store::FileStore::from_config(&config.files)?;
            let scanner = crate::files::scan::Scanner::parse(&config.files.scanner)
                .map_err(anyhow::Error::msg)?;
            let timeout = std::time::Duration::from_secs(config.files.scan_timeout_secs.max(1));
            then.with(scan::ScanHandler::new(
                codec, pools, producer, store, scanner, timeout,
            ))
            .await
        }
        "pushsend" => {
            let sender = pushsend::PushSender::from_config(&config.push)?;
            then.with(pushsend::PushSendHandler::new(codec, redis, sender))
                .await
        }
        other => anyhow::bail!(
            "unknown pipeline {other:?}; known: {}",
            PIPELINES.join(", ")
        ),
    })
}

/// [`run_route`]'s use of a handler: the consumer-group runner.
struct RunOn<'a> {
    config: &'a Config,
    topology: &'a Topology,
    route: &'a Route,
    producer: EventProducer,
    shutdown: Shutdown,
}

impl WithHandler for RunOn<'_> {
    type Output = Result<(), runner::PipelineError>;
    async fn with<H: records::Handler>(self, handler: H) -> Self::Output {
        let r = self.route;
        // Only the pipeline's own route keeps checkpoints in the tenant
        // databases (a DLQ replay is not where the projection stands).
        let own = Route::main(self.config, self.topology).ok().as_ref() == Some(r);
        let checkpoints = match (
            self.topology.checkpoints && own,
            TenantPools::connect_lazy(self.config),
        ) {
            (true, Ok(pools)) => Some(checkpoints::Checkpoints::new(pools, &r.group, &r.source)),
            _ => None,
        };
        runner::run_on(
            self.config,
            self.topology,
            &r.source,
            &r.group,
            &r.dlq,
            handler,
            self.producer,
            self.shutdown,
            checkpoints,
        )
        .await
    }
}
