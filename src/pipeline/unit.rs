//! Deployment units (`topologies/units.toml`, `imstream unit <name>`):
//! several pipelines of one source topic consumed by ONE consumer in one
//! process. Run alone, each of the ten group-events pipelines was its own
//! consumer group: the broker served the log ten times and every record
//! woke ten batches, most of a message's cost at low rates (issue 31).
//!
//! - The unit's consumer (group `<prefix>.unit.<name>`) gathers a batch and
//!   hands the same batch to every member, through a bounded queue each
//!   ([`UnitDecl::window_batches`]): a slow, paused or failing member holds
//!   the others back by at most that window, then the consumer waits.
//! - Each member gathers its own batches from its queue by its topology's
//!   `batch_max` and `batch_linger_ms` (background members wake rarely),
//!   runs them through the same [`Worker`] as a pipeline alone (outages
//!   retried, poison to its DLQ), and commits its progress to its own
//!   group `<prefix>.<pipeline>` as a simple (non-member) commit. Lag
//!   gauges, the shard manager's sealing check, replays and `imstream
//!   project <pipeline>` all read that group, unchanged.
//! - After a restart each member skips what its own group says it
//!   finished; the unit's group commits the least progress of its members,
//!   and is moved back to it at start (a member added to the unit starts
//!   where its own group stands, not where the unit does).
//! - A member whose tenant database came back older (checkpoints) has the
//!   partition rewound: the consumer seeks back, the member drops that
//!   partition's records until the rewind reaches it, the others skip what
//!   they already handled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Deserialize;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::events::EventCodec;
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicNames;
use crate::shutdown::Shutdown;

use super::checkpoints::{Checkpoints, Rewind};
use super::records::{Handler, Record};
use super::runner::gather;
use super::topology::Topology;
use super::worker::Worker;

/// The committed declaration (`topologies/units.toml`).
const BUILTIN: &str = include_str!("../../topologies/units.toml");

/// How long handled offsets may wait for their commit while records flow:
/// a crash hands at most this much to the (idempotent) handlers again.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// Members that linger longer sleep through their linger rather than wake
/// for each batch that arrives (see [`Member`]).
const LINGER_AWAKE: Duration = Duration::from_millis(5);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnitsFile {
    #[serde(default)]
    unit: Vec<UnitDecl>,
}

/// One deployment unit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitDecl {
    pub name: String,
    /// Topic kind every member consumes.
    pub source: String,
    pub pipelines: Vec<String>,
    /// Records the consumer gathers into one batch for every member.
    #[serde(default = "default_batch_max")]
    pub batch_max: usize,
    /// How long the consumer waits for a batch to fill once a record came.
    #[serde(default = "default_linger")]
    pub batch_linger_ms: u64,
    /// Batches a member may fall behind before the consumer waits for it.
    #[serde(default = "default_window")]
    pub window_batches: usize,
}

fn default_batch_max() -> usize {
    1000
}
fn default_linger() -> u64 {
    1
}
fn default_window() -> usize {
    64
}

/// The declared units, checked: known pipelines, one source per unit, no
/// pipeline in two units.
pub fn units(config: &Config) -> anyhow::Result<Vec<UnitDecl>> {
    let path = std::path::Path::new(&config.pipelines.topologies_dir).join("units.toml");
    let (text, shown) = match std::fs::read_to_string(&path) {
        Ok(text) => (text, path.display().to_string()),
        Err(_) => (BUILTIN.to_string(), "topologies/units.toml".to_string()),
    };
    parse_units(&text, &shown, |name| super::load_topology(config, name))
}

fn parse_units(
    text: &str,
    shown: &str,
    topology: impl Fn(&str) -> anyhow::Result<Topology>,
) -> anyhow::Result<Vec<UnitDecl>> {
    let file: UnitsFile =
        toml::from_str(text).map_err(|e| anyhow::anyhow!("{shown}: {}", e.message()))?;
    let mut seen = HashSet::new();
    for u in &file.unit {
        anyhow::ensure!(
            u.batch_max > 0 && u.window_batches > 0,
            "{shown}: unit {}: batch_max and window_batches must be at least 1",
            u.name
        );
        anyhow::ensure!(
            !u.pipelines.is_empty(),
            "{shown}: unit {} has no pipeline",
            u.name
        );
        for p in &u.pipelines {
            let t = topology(p).map_err(|e| anyhow::anyhow!("{shown}: unit {}: {e}", u.name))?;
            anyhow::ensure!(
                t.source == u.source,
                "{shown}: unit {}: pipeline {p} reads {}, not the unit's source {}",
                u.name,
                t.source,
                u.source
            );
            anyhow::ensure!(
                seen.insert(p.clone()),
                "{shown}: pipeline {p} is in two units"
            );
            anyhow::ensure!(
                !t.alone,
                "{shown}: unit {}: pipeline {p} runs alone (its topology's `alone`)",
                u.name
            );
        }
    }
    Ok(file.unit)
}

/// The consumer group of a unit's shared consumer.
pub fn unit_group_id(config: &Config, unit: &UnitDecl) -> String {
    format!("{}.unit.{}", config.pipelines.group_prefix, unit.name)
}

/// What the unit's consumer hands each member, in log order.
enum Item {
    Batch(Arc<Vec<Record>>),
    /// The consumer moved `partition` back to `offset` for `member`.
    Rewound {
        member: usize,
        partition: i32,
        offset: i64,
    },
}

/// Where each member is done: member → partition → the next offset it is
/// done with (handled, or skipped as handled before).
struct Progress {
    by_member: Mutex<Vec<HashMap<i32, i64>>>,
    /// Woken when a member moved (the unit commits soon after).
    moved: tokio::sync::Notify,
}

impl Progress {
    fn new(members: usize) -> Self {
        Self {
            by_member: Mutex::new(vec![HashMap::new(); members]),
            moved: tokio::sync::Notify::new(),
        }
    }

    /// A member's progress on a partition: forward only, unless `back` (a
    /// rewind).
    fn set(&self, member: usize, partition: i32, next: i64, back: bool) {
        {
            let mut all = self.by_member.lock().unwrap_or_else(|e| e.into_inner());
            let Some(m) = all.get_mut(member) else {
                return;
            };
            let at = m.entry(partition).or_insert(next);
            *at = if back { next } else { (*at).max(next) };
        }
        self.moved.notify_one();
    }
}

/// Runs the unit named `name` until `shutdown`.
pub async fn run_named(config: &Config, name: &str, shutdown: Shutdown) -> anyhow::Result<()> {
    let all = units(config)?;
    let unit = all.iter().find(|u| u.name == name).ok_or_else(|| {
        let known: Vec<&str> = all.iter().map(|u| u.name.as_str()).collect();
        anyhow::anyhow!("unknown unit {name:?}; known: {}", known.join(", "))
    })?;
    run(config, unit, shutdown).await
}

/// Runs `unit` until `shutdown` (or until a member fails to start).
pub async fn run(config: &Config, unit: &UnitDecl, shutdown: Shutdown) -> anyhow::Result<()> {
    let topologies = unit
        .pipelines
        .iter()
        .map(|p| super::load_topology(config, p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let kind = topologies[0]
        .source_kind()
        .ok_or_else(|| anyhow::anyhow!("unit {} has no known source", unit.name))?;
    let names = TopicNames::new(&config.kafka);
    let source = names.name(kind);
    let group = unit_group_id(config, unit);
    start_where_members_stand(config, &source, &group, &topologies).await;

    // Fetched at once: the latency-critical members need each record as
    // it comes (background members batch by their own linger).
    let consumer: Arc<StreamConsumer> =
        Arc::new(super::runner::consumer_config(config, &group, 1, 500).create()?);
    consumer.subscribe(&[&source])?;
    tracing::info!(unit = %unit.name, %source, %group, pipelines = ?unit.pipelines, "unit started");

    let codec = EventCodec::new(&config.registry.url)?;
    let progress = Arc::new(Progress::new(topologies.len()));
    let (rewind_tx, mut rewind_rx) = mpsc::unbounded_channel::<(usize, Rewind)>();
    let (failed_tx, mut failed_rx) = mpsc::unbounded_channel::<anyhow::Error>();
    let members_stop = shutdown.child();
    let mut queues = Vec::new();
    let mut tasks = Vec::new();
    for (index, topology) in topologies.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel(unit.window_batches);
        let nudge = Arc::new(tokio::sync::Notify::new());
        queues.push((tx, nudge.clone()));
        let member = Member {
            config: config.clone(),
            group: super::runner::group_id(config, &topology),
            dlq: names.dlq(kind, &topology.name),
            source: source.clone(),
            topology,
            index,
            queue: rx,
            nudge,
            rewinds: rewind_tx.clone(),
            progress: progress.clone(),
            consumer: consumer.clone(),
            producer: EventProducer::new(&config.kafka, codec.clone())?,
            shutdown: members_stop.clone(),
        };
        let (config, codec, failed_tx) = (config.clone(), codec.clone(), failed_tx.clone());
        tasks.push(tokio::spawn(async move {
            let name = member.topology.name.clone();
            match super::with_handler(&config, &name, codec, member).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) | Err(e) => {
                    tracing::error!(pipeline = %name, error = %e, "pipeline of a unit stopped");
                    let _ = failed_tx.send(anyhow::anyhow!("pipeline {name}: {e}"));
                }
            }
        }));
    }
    drop(rewind_tx);
    drop(failed_tx);

    let linger = Duration::from_millis(unit.batch_linger_ms);
    // The unit's progress is committed at most every COMMIT_INTERVAL after
    // a member moved, so an idle unit wakes up for nothing.
    let mut commit_at: Option<tokio::time::Instant> = None;
    let mut failed: Option<anyhow::Error> = None;
    'consume: loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(e) = failed_rx.recv() => {
                // A member stopped by itself: its handler could not be
                // built (configuration, database). The unit stops with it.
                failed = Some(e);
                break;
            }
            Some((member, rw)) = rewind_rx.recv() => {
                match consumer.seek(&source, rw.partition, Offset::Offset(rw.offset), Duration::from_secs(10)) {
                    Ok(()) => tracing::warn!(unit = %unit.name, member, partition = rw.partition, offset = rw.offset, "partition rewound to a tenant database's checkpoint"),
                    // Not assigned here any more (a rebalance), or the
                    // broker refused: the checkpoint stays behind and is
                    // found again; the member stops waiting for it.
                    Err(e) => tracing::error!(partition = rw.partition, offset = rw.offset, error = %e, "rewind failed; the checkpoint stays behind and is found again"),
                }
                for q in &queues {
                    let item = Item::Rewound { member, partition: rw.partition, offset: rw.offset };
                    if !hand_over(q, item, &shutdown).await { break 'consume; }
                }
                continue;
            }
            _ = progress.moved.notified(), if commit_at.is_none() => {
                commit_at = Some(tokio::time::Instant::now() + COMMIT_INTERVAL);
                continue;
            }
            _ = sleep_until_some(commit_at) => {
                commit_at = None;
                commit_unit(&consumer, &source, &progress, CommitMode::Async);
                continue;
            }
            m = consumer.recv() => m,
        };
        let Some(batch) = gather(&consumer, first, linger, unit.batch_max, &group).await else {
            continue;
        };
        let batch = Arc::new(batch);
        for q in &queues {
            if !hand_over(q, Item::Batch(batch.clone()), &shutdown).await {
                break 'consume;
            }
        }
        if commit_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
            commit_at = None;
            commit_unit(&consumer, &source, &progress, CommitMode::Async);
        }
    }
    // Members finish their batch in hand and commit their own progress.
    members_stop.trigger();
    drop(queues);
    for t in tasks {
        if let Err(e) = t.await {
            failed.get_or_insert(anyhow::anyhow!(
                "a member of unit {} panicked: {e}",
                unit.name
            ));
        }
    }
    while let Ok(e) = failed_rx.try_recv() {
        failed.get_or_insert(e);
    }
    commit_unit(&consumer, &source, &progress, CommitMode::Sync);
    tracing::info!(unit = %unit.name, "unit stopped");
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Sleeps until `at`, or forever when there is none.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A member's queue, and how to wake it when the queue fills.
type Queue = (mpsc::Sender<Item>, Arc<tokio::sync::Notify>);

/// Queues `item` for a member, waiting while its window is full (a member
/// sleeping through its linger is woken once its queue is half full).
/// `false` on shutdown or when the member is gone.
async fn hand_over((queue, nudge): &Queue, item: Item, shutdown: &Shutdown) -> bool {
    let sent = tokio::select! {
        _ = shutdown.cancelled() => false,
        r = queue.send(item) => r.is_ok(),
    };
    if queue.capacity() * 2 <= queue.max_capacity() {
        nudge.notify_one();
    }
    sent
}

/// Commits, to the unit's group, the least progress of its members on
/// each partition every member has reported on.
fn commit_unit(consumer: &StreamConsumer, source: &str, progress: &Progress, mode: CommitMode) {
    let least = {
        let by_member = progress.by_member.lock().unwrap_or_else(|e| e.into_inner());
        least_progress(&by_member)
    };
    if least.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in least {
        let _ = tpl.add_partition_offset(source, partition, Offset::Offset(offset));
    }
    if let Err(e) = consumer.commit(&tpl, mode) {
        tracing::warn!(error = %e, "unit offset commit failed; records will be read again");
    }
}

/// partition → the least next offset over every member, for the partitions
/// every member has reported on.
fn least_progress(progress: &[HashMap<i32, i64>]) -> BTreeMap<i32, i64> {
    let Some((first, rest)) = progress.split_first() else {
        return BTreeMap::new();
    };
    first
        .iter()
        .filter_map(|(p, o)| {
            rest.iter()
                .map(|m| m.get(p).copied())
                .try_fold(*o, |least, next| next.map(|n| least.min(n)))
                .map(|least| (*p, least))
        })
        .collect()
}

/// Before the unit's consumer joins: on each partition, the unit's group is
/// moved back to the least position of its members' own groups (the log
/// start for a member that never committed), so no member misses a record
/// (e.g. one just added to the unit, or one rewound alone). Best effort: a
/// failure is logged, and members never skip what they did not finish.
async fn start_where_members_stand(
    config: &Config,
    source: &str,
    group: &str,
    topologies: &[Topology],
) {
    let kafka = config.kafka.clone();
    let (source, group) = (source.to_string(), group.to_string());
    let members: Vec<String> = topologies
        .iter()
        .map(|t| super::runner::group_id(config, t))
        .collect();
    let r = tokio::task::spawn_blocking(move || -> anyhow::Result<usize> {
        use crate::kafka::lag;
        let marks = lag::watermarks(&kafka, &group, &source)?;
        let mut least: BTreeMap<i32, i64> =
            marks.iter().map(|(p, (_, high))| (*p, *high)).collect();
        for m in &members {
            let committed = lag::committed(&kafka, m, &source)?;
            for (p, (low, _)) in &marks {
                let at = committed.get(p).copied().unwrap_or(*low).max(*low);
                let l = least.entry(*p).or_insert(at);
                *l = (*l).min(at);
            }
        }
        let unit_at = lag::committed(&kafka, &group, &source)?;
        let mut tpl = TopicPartitionList::new();
        let mut moved = 0;
        for (p, at) in &least {
            if unit_at.get(p) != Some(at) {
                tpl.add_partition_offset(&source, *p, Offset::Offset(*at))?;
                moved += 1;
            }
        }
        if moved > 0 {
            lag::group_probe(&kafka, &group)?.commit(&tpl, CommitMode::Sync)?;
        }
        Ok(moved)
    })
    .await;
    match r {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::info!(
            partitions = n,
            "unit group moved to where its members stand"
        ),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "unit group not moved to its members' positions (members skip what they finished)")
        }
        Err(e) => tracing::warn!(error = %e, "unit start position task failed"),
    }
}

/// One pipeline of a unit: its handler, fed from the unit's consumer.
struct Member {
    config: Config,
    topology: Topology,
    source: String,
    group: String,
    dlq: String,
    index: usize,
    queue: mpsc::Receiver<Item>,
    /// Woken by the consumer when this member's queue is half full.
    nudge: Arc<tokio::sync::Notify>,
    rewinds: mpsc::UnboundedSender<(usize, Rewind)>,
    progress: Arc<Progress>,
    consumer: Arc<StreamConsumer>,
    producer: EventProducer,
    shutdown: Shutdown,
}

/// A member's own group: where it stands and where it commits.
struct OwnGroup {
    probe: Arc<BaseConsumer>,
    group: String,
    source: String,
    shutdown: Shutdown,
}

impl OwnGroup {
    /// partition → committed offset for `partitions` (absent: never).
    async fn committed(&self, partitions: Vec<i32>) -> anyhow::Result<HashMap<i32, i64>> {
        let (probe, source) = (self.probe.clone(), self.source.clone());
        tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for p in partitions {
                tpl.add_partition(&source, p);
            }
            let c = probe.committed_offsets(tpl, Duration::from_secs(10))?;
            Ok(c.elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some((e.partition(), o)),
                    _ => None,
                })
                .collect())
        })
        .await?
    }

    /// Commits `next` offsets (a simple commit: the group has no member
    /// while its pipeline runs in a unit).
    async fn commit(&self, next: HashMap<i32, i64>) {
        if next.is_empty() {
            return;
        }
        let (probe, source) = (self.probe.clone(), self.source.clone());
        let r = tokio::task::spawn_blocking(move || {
            let mut tpl = TopicPartitionList::new();
            for (p, o) in next {
                tpl.add_partition_offset(&source, p, Offset::Offset(o))?;
            }
            probe.commit(&tpl, CommitMode::Sync)
        })
        .await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(group = %self.group, error = %e, "pipeline offset commit failed (is the pipeline also running alone?); records will be handled again")
            }
            Err(e) => tracing::warn!(error = %e, "pipeline offset commit task failed"),
        }
    }
}

impl super::WithHandler for Member {
    type Output = anyhow::Result<()>;
    async fn with<H: Handler>(self, handler: H) -> anyhow::Result<()> {
        let Member {
            config,
            topology,
            source,
            group,
            dlq,
            index,
            mut queue,
            nudge,
            rewinds,
            progress,
            consumer,
            producer,
            shutdown,
        } = self;
        crate::events::decoded::share(&source);
        let gauges =
            super::lag::spawn_gauges(&config, &topology.name, &source, &group, &dlq, &shutdown);
        let own = OwnGroup {
            probe: Arc::new(crate::kafka::lag::group_probe(&config.kafka, &group)?),
            group: group.clone(),
            source: source.clone(),
            shutdown: shutdown.clone(),
        };
        let mut checkpoints = match (
            topology.checkpoints,
            crate::tenant::TenantPools::connect_lazy(&config),
        ) {
            (true, Ok(pools)) => Some(Checkpoints::new(pools, &group, &source)),
            _ => None,
        };
        let worker =
            Worker::new(&topology, handler, producer, dlq, shutdown.clone()).health_id(&group);
        let mut gathered = Gathered::default();
        let mut pending: HashMap<i32, i64> = HashMap::new();
        let mut last_commit = tokio::time::Instant::now();
        let mut checkpoint_tick = tokio::time::Instant::now() + Duration::from_secs(1);
        let linger = Duration::from_millis(topology.batch_linger_ms);
        tracing::info!(pipeline = %topology.name, %group, "pipeline started in its unit");
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(checkpoint_tick), if checkpoints.is_some() => {
                    checkpoint_tick = tokio::time::Instant::now() + super::checkpoints::ALL_TENANTS_EVERY;
                    if let Some(cp) = checkpoints.as_mut() {
                        let assigned = assigned_partitions(&consumer, &source);
                        if let Ok(at) = own.committed(assigned).await {
                            for (p, next) in at {
                                cp.assigned(p, next);
                            }
                        }
                        let rw = cp.flush().await;
                        gathered.rewind(index, &rw, &rewinds, &mut pending);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(last_commit + COMMIT_INTERVAL), if !pending.is_empty() => {
                    own.commit(std::mem::take(&mut pending)).await;
                    last_commit = tokio::time::Instant::now();
                    continue;
                }
                item = queue.recv() => match item {
                    Some(item) => item,
                    None => break,
                },
            };
            let mut records = Vec::new();
            gathered
                .take(index, first, &own, &progress, &mut records)
                .await;
            let deadline = tokio::time::Instant::now() + linger;
            if linger > LINGER_AWAKE {
                // A background member sleeps through its linger instead of
                // waking for every batch that arrives, unless its queue
                // fills (the consumer nudges it), then takes what came.
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = nudge.notified() => {}
                    _ = shutdown.cancelled() => {}
                }
            }
            while records.len() < topology.batch_max {
                let item = if linger > LINGER_AWAKE {
                    match queue.try_recv() {
                        Ok(item) => item,
                        Err(_) => break,
                    }
                } else {
                    match tokio::time::timeout_at(deadline, queue.recv()).await {
                        Ok(Some(item)) => item,
                        _ => break,
                    }
                };
                gathered
                    .take(index, item, &own, &progress, &mut records)
                    .await;
            }
            if records.is_empty() {
                continue;
            }
            if !worker.process(&records).await {
                // Shutdown during retries: not committed, handled again.
                break;
            }
            gathered.handled(index, &records, &progress, &mut pending);
            if let Some(cp) = checkpoints.as_mut() {
                let rw = cp.after_batch(&records).await;
                gathered.rewind(index, &rw, &rewinds, &mut pending);
            }
            if last_commit.elapsed() >= COMMIT_INTERVAL {
                own.commit(std::mem::take(&mut pending)).await;
                last_commit = tokio::time::Instant::now();
            }
        }
        if let Some(cp) = checkpoints.as_mut() {
            let rw = cp.flush().await;
            gathered.rewind(index, &rw, &rewinds, &mut pending);
        }
        own.commit(pending).await;
        drop(gauges);
        tracing::info!(pipeline = %topology.name, "pipeline stopped in its unit");
        Ok(())
    }
}

/// The partitions of `source` the unit's consumer holds now.
fn assigned_partitions(consumer: &StreamConsumer, source: &str) -> Vec<i32> {
    consumer
        .assignment()
        .map(|a| {
            a.elements()
                .iter()
                .filter(|e| e.topic() == source)
                .map(|e| e.partition())
                .collect()
        })
        .unwrap_or_default()
}

/// A member's view of where it stands on each partition.
#[derive(Default)]
struct Gathered {
    /// partition → the next offset to handle (records before it were
    /// handled, by this process or an earlier one).
    next: HashMap<i32, i64>,
    /// Partitions rewound for this member whose rewind has not come yet:
    /// their records are dropped until it does.
    rewinding: HashSet<i32>,
}

impl Gathered {
    /// Adds `item`'s records this member still has to handle to `out`.
    async fn take(
        &mut self,
        member: usize,
        item: Item,
        own: &OwnGroup,
        progress: &Progress,
        out: &mut Vec<Record>,
    ) {
        match item {
            Item::Rewound {
                member: m,
                partition,
                offset,
            } => {
                if m == member && self.rewinding.remove(&partition) {
                    self.next.insert(partition, offset);
                    progress.set(member, partition, offset, true);
                }
            }
            Item::Batch(batch) => {
                let unknown: Vec<i32> = batch
                    .iter()
                    .map(|r| r.partition)
                    .filter(|p| !self.next.contains_key(p))
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                if !unknown.is_empty() {
                    // Where this pipeline's own group stands (never
                    // committed: from the log start). Asked until the
                    // broker answers: guessing low would re-handle the
                    // whole log, guessing high would skip records.
                    let mut delay = Duration::from_millis(100);
                    let at = loop {
                        match own.committed(unknown.clone()).await {
                            Ok(at) => break at,
                            Err(_) if own.shutdown.is_triggered() => {
                                // Stopping: these partitions' records are
                                // neither handled nor reported done.
                                self.rewinding.extend(unknown.iter().copied());
                                break HashMap::new();
                            }
                            Err(e) => {
                                tracing::warn!(group = %own.group, error = %e, "cannot read the pipeline's committed offsets; retrying");
                                tokio::time::sleep(delay).await;
                                delay = (delay * 2).min(Duration::from_secs(5));
                            }
                        }
                    };
                    for p in unknown {
                        self.next.insert(p, at.get(&p).copied().unwrap_or(0));
                    }
                }
                let mut skipped: HashMap<i32, i64> = HashMap::new();
                for r in batch.iter() {
                    if self.rewinding.contains(&r.partition) {
                        continue;
                    }
                    let next = self.next.get(&r.partition).copied().unwrap_or(0);
                    if r.offset < next {
                        // Handled before (earlier run, or the rewind of
                        // another member): done already.
                        let done = skipped.entry(r.partition).or_insert(0);
                        *done = (*done).max(r.offset + 1);
                        continue;
                    }
                    out.push(r.clone());
                }
                for (partition, done) in skipped {
                    progress.set(member, partition, done, false);
                }
            }
        }
    }

    /// `records` were handled: this member is done through them.
    fn handled(
        &mut self,
        member: usize,
        records: &[Record],
        progress: &Progress,
        pending: &mut HashMap<i32, i64>,
    ) {
        for r in records {
            if self.rewinding.contains(&r.partition) {
                continue;
            }
            let next = self.next.entry(r.partition).or_insert(0);
            *next = (*next).max(r.offset + 1);
            pending.insert(r.partition, *next);
        }
        // Reported once per partition and batch, not per record.
        for (partition, next) in pending.iter() {
            progress.set(member, *partition, *next, false);
        }
    }

    /// Asks the unit's consumer to move each partition back; until it has,
    /// this member drops that partition's records and commits nothing of it.
    fn rewind(
        &mut self,
        member: usize,
        rewinds: &[Rewind],
        tx: &mpsc::UnboundedSender<(usize, Rewind)>,
        pending: &mut HashMap<i32, i64>,
    ) {
        for rw in rewinds {
            self.rewinding.insert(rw.partition);
            pending.remove(&rw.partition);
            let _ = tx.send((member, *rw));
        }
    }
}

/// Pipelines that run in no unit of `units`, by topic kind order of
/// [`super::PIPELINES`].
pub fn alone<'a>(units: &[UnitDecl], pipelines: &[&'a str]) -> Vec<&'a str> {
    pipelines
        .iter()
        .copied()
        .filter(|p| !units.iter().any(|u| u.pipelines.iter().any(|q| q == p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(name: &str) -> anyhow::Result<Topology> {
        Topology::builtin(name).ok_or_else(|| anyhow::anyhow!("unknown pipeline {name}"))
    }

    #[test]
    fn the_committed_units_are_valid_and_cover_every_shared_source() {
        let units = parse_units(BUILTIN, "units.toml", topology).unwrap();
        // Every source read by two or more pipelines is consumed once.
        let mut by_source: HashMap<String, Vec<&str>> = HashMap::new();
        // Those that run alone on purpose: their own consumer.
        for p in super::super::PIPELINES
            .iter()
            .filter(|p| !topology(p).unwrap().alone)
        {
            by_source
                .entry(topology(p).unwrap().source)
                .or_default()
                .push(p);
        }
        for (source, pipelines) in by_source.iter().filter(|(_, p)| p.len() > 1) {
            let unit = units
                .iter()
                .find(|u| &u.source == source)
                .unwrap_or_else(|| panic!("no unit reads {source}"));
            for p in pipelines {
                assert!(
                    unit.pipelines.iter().any(|q| q == p),
                    "{p} not in {}",
                    unit.name
                );
            }
        }
    }

    #[test]
    fn a_unit_mixing_sources_or_sharing_a_pipeline_is_refused() {
        let mixed = "[[unit]]\nname = \"x\"\nsource = \"group_events\"\npipelines = [\"store\", \"notify\"]\n";
        let e = parse_units(mixed, "u.toml", topology)
            .unwrap_err()
            .to_string();
        assert!(e.contains("notify") && e.contains("user_events"), "{e}");
        let twice = "[[unit]]\nname = \"a\"\nsource = \"group_events\"\npipelines = [\"store\"]\n\
                     [[unit]]\nname = \"b\"\nsource = \"group_events\"\npipelines = [\"store\"]\n";
        let e = parse_units(twice, "u.toml", topology)
            .unwrap_err()
            .to_string();
        assert!(e.contains("two units"), "{e}");
        let unknown =
            "[[unit]]\nname = \"a\"\nsource = \"group_events\"\npipelines = [\"stroe\"]\n";
        let e = parse_units(unknown, "u.toml", topology)
            .unwrap_err()
            .to_string();
        assert!(e.contains("stroe"), "{e}");
    }

    #[test]
    fn the_unit_commits_the_least_progress_of_members_that_reported() {
        let a = HashMap::from([(0, 10), (1, 7), (2, 5)]);
        let b = HashMap::from([(0, 4), (1, 9)]);
        // Partition 2: b has not reported, so nothing is committed for it.
        assert_eq!(least_progress(&[a, b]), BTreeMap::from([(0, 4), (1, 7)]));
        assert!(least_progress(&[]).is_empty());
    }
}
