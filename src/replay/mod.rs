//! `imstream replay <pipeline>`: rebuilds a projection from the event log
//! (ARCHITECTURE.md §1, STYLE.md "replay is a first-class operation").
//!
//! Two ways:
//!
//! - **Reset** (default): the pipeline's own consumer group is reset to
//!   `--from` and the log is run through the pipeline's handler up to the
//!   high watermarks seen at the start, committing as it goes. The group
//!   must be inactive (every `imstream project <pipeline>` stopped); a
//!   replay never moves a group behind a record it has not handled.
//!   `--tenant T` re-applies only T's records (others are applied only if
//!   the group had not reached them yet).
//! - **Into a fresh target** (`--into database:<name>` or
//!   `--into redis:<url>`): the handler runs under a fresh group against a
//!   new tenant database (migrated, with the live catalog's months) or
//!   another Redis database; the live projection is untouched. Switching
//!   over is a configuration change (`tenants[].database` or `redis.url`).
//!
//! Both end with a verification per topic — message count, min/max seq and
//! a content hash ([`digest`]) — of the rebuilt projection against the one
//! it replaces (reset: as it was before; into: the live one).
//!
//! The search index (`search`) is rebuilt in place only (no `--into`):
//! its target is `search.index_dir`, so a fresh index is a replay with
//! that key pointing at an empty folder; it is verified per topic on the
//! searchable messages and their texts.
//!
//! Only projections are replayable (`store`, `hot`, `members`,
//! `receipts`, `relations`, `conversations`, `stats`, `references`, `search`); pipelines that talk to users or produce
//! (`fanout`, `control`, `commands`, `notify`, `push`, `pushsend`) are
//! refused.

pub mod offsets;
pub mod projection;
pub mod run;

use std::collections::BTreeMap;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Config;
use crate::events::EventCodec;
use crate::kafka::producer::EventProducer;
use crate::pipeline::{load_topology, Route};
use crate::shutdown::Shutdown;

use crate::digest::{Summary, TopicCheck, Verdict};
use run::{Counts, Replayer, TenantFilter};

/// Pipelines whose handler only writes its own projection.
pub const REPLAYABLE: &[&str] = &[
    "store",
    "hot",
    "members",
    "receipts",
    "relations",
    "conversations",
    "stats",
    "references",
    "search",
];

#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// Pipeline to rebuild: store, hot, members, receipts, relations,
    /// conversations, stats, references or search.
    pub pipeline: String,
    /// Where to start: `earliest`, or a time (RFC 3339 or epoch ms) looked
    /// up per partition with offsets_for_times.
    #[arg(long, default_value = "earliest")]
    pub from: String,
    /// Only this tenant's events (others are not re-applied).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Build into a fresh target instead of resetting the pipeline's group:
    /// `database:<name>` (a new tenant database; needs --tenant unless one
    /// tenant is configured) or `redis:<url>` (e.g. redis://host:6379/5).
    #[arg(long)]
    pub into: Option<String>,
    /// How long to wait for the pipeline's group to become inactive before
    /// refusing a reset.
    #[arg(long, default_value_t = 15)]
    pub wait_inactive_secs: u64,
}

/// Where a replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Earliest,
    /// Epoch ms.
    Time(i64),
}

impl Start {
    pub fn parse(text: &str) -> anyhow::Result<Start> {
        if text == "earliest" {
            return Ok(Start::Earliest);
        }
        if let Ok(ms) = text.parse::<i64>() {
            return Ok(Start::Time(ms));
        }
        let t = chrono::DateTime::parse_from_rfc3339(text)
            .with_context(|| format!("--from {text:?}: expected earliest, RFC 3339 or epoch ms"))?;
        Ok(Start::Time(t.timestamp_millis()))
    }
}

/// A fresh target of `--into`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Database(String),
    Redis(String),
}

impl Target {
    pub fn parse(text: &str) -> anyhow::Result<Target> {
        match text.split_once(':') {
            Some(("database", name)) => {
                crate::names::validate_database_name(name)
                    .map_err(|e| anyhow::anyhow!("--into database:{name}: {e}"))?;
                Ok(Target::Database(name.to_string()))
            }
            Some(("redis", url)) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Ok(Target::Redis(url.to_string()))
            }
            _ => bail!("--into {text:?}: expected database:<name> or redis:<url>"),
        }
    }
}

/// One verified part of a projection of one tenant.
#[derive(Debug, Clone)]
pub struct Verification {
    pub tenant: String,
    /// `month_tables`, `routes` or `hot_messages`.
    pub part: &'static str,
    pub topics: Vec<TopicCheck>,
}

/// What a replay did.
#[derive(Debug, Clone)]
pub struct Report {
    pub pipeline: String,
    pub group: String,
    pub counts: Counts,
    pub verifications: Vec<Verification>,
}

impl Report {
    /// Topics whose rebuilt projection differs from (or lacks what is in)
    /// the one it replaces.
    pub fn differences(&self) -> usize {
        self.verifications
            .iter()
            .flat_map(|v| &v.topics)
            .filter(|c| matches!(c.verdict, Verdict::Changed | Verdict::Missing))
            .count()
    }
}

/// Runs a replay to the high watermarks seen at its start and verifies it.
pub async fn replay(
    config: &Config,
    args: &ReplayArgs,
    shutdown: Shutdown,
) -> anyhow::Result<Report> {
    let pipeline = args.pipeline.as_str();
    if !REPLAYABLE.contains(&pipeline) {
        bail!(
            "pipeline {pipeline:?} is not replayable (its handler talks to users, or it is unknown); replayable: {}",
            REPLAYABLE.join(", ")
        );
    }
    if let Some(t) = &args.tenant {
        if config.tenant(t).is_none() {
            bail!("unknown tenant {t:?}");
        }
    }
    let from = Start::parse(&args.from)?;
    let target = args.into.as_deref().map(Target::parse).transpose()?;
    if pipeline == "search" && target.is_some() {
        bail!(
            "search rebuilds the index under search.index_dir: to build a fresh one, point that \
             key (IMSTREAM__SEARCH__INDEX_DIR) at an empty folder and replay without --into"
        );
    }
    let topology = load_topology(config, pipeline)?;
    let main = Route::main(config, &topology)?;

    // The sinks the handler writes: the live ones, or the fresh target.
    let mut sink = config.clone();
    let (route, filter) = match &target {
        None => {
            wait_inactive(config, &main.group, pipeline, args.wait_inactive_secs).await?;
            // A unit that runs the pipeline commits to its group without
            // being a member: its own group must be inactive too.
            for unit in crate::pipeline::unit::units(config)?
                .iter()
                .filter(|u| u.pipelines.iter().any(|p| p == pipeline))
            {
                let group = crate::pipeline::unit::unit_group_id(config, unit);
                wait_inactive(config, &group, pipeline, args.wait_inactive_secs).await?;
            }
            let filter = match &args.tenant {
                Some(t) => TenantFilter::Reset(t.clone()),
                None => TenantFilter::All,
            };
            (main.clone(), filter)
        }
        Some(target) => {
            let group = format!(
                "{}.{pipeline}.replay-{}",
                config.pipelines.group_prefix,
                crate::events::now_ms()
            );
            let filter = match &args.tenant {
                Some(t) => TenantFilter::Only(t.clone()),
                None => TenantFilter::All,
            };
            match target {
                Target::Database(db) => {
                    let tenant = match (&args.tenant, config.tenants.as_slice()) {
                        (Some(t), _) => t.clone(),
                        (None, [only]) => only.id.clone(),
                        _ => bail!("--into database:… rebuilds one tenant: add --tenant"),
                    };
                    prepare_database(config, &mut sink, &tenant, db).await?;
                    let filter = TenantFilter::Only(tenant);
                    (
                        Route {
                            group,
                            ..main.clone()
                        },
                        filter,
                    )
                }
                Target::Redis(url) => {
                    sink.redis.url = url.clone();
                    (
                        Route {
                            group,
                            ..main.clone()
                        },
                        filter,
                    )
                }
            }
        }
    };
    let tenants: Vec<String> = match &filter {
        TenantFilter::All => config.tenants.iter().map(|t| t.id.clone()).collect(),
        TenantFilter::Reset(t) | TenantFilter::Only(t) => vec![t.clone()],
    };

    // The projection being replaced, for the verification.
    let before = snapshot(
        if target.is_some() { config } else { &sink },
        pipeline,
        &tenants,
    )
    .await?;

    let spans = {
        let (cfg, r) = (config.clone(), route.clone());
        let reset = target.is_none();
        tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let marks = crate::kafka::lag::watermarks(&cfg.kafka, &r.group, &r.source)?;
            let starts = match from {
                Start::Earliest => BTreeMap::new(),
                Start::Time(ms) => offsets::offsets_for_time(&cfg, &r.group, &r.source, ms)?,
            };
            let committed = if reset {
                Some(crate::kafka::lag::committed(
                    &cfg.kafka, &r.group, &r.source,
                )?)
            } else {
                None
            };
            Ok(offsets::spans(&marks, &starts, committed.as_ref()))
        })
        .await??
    };
    let total: i64 = spans.values().map(|s| s.end - s.start).sum();
    tracing::info!(pipeline, group = %route.group, source = %route.source, records = total, ?filter, "replay starting");

    let progress = ProgressBar::new(total.max(0) as u64).with_style(
        ProgressStyle::with_template(
            "replay {msg} [{bar:30}] {pos}/{len} records {per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    progress.set_message(pipeline.to_string());
    let codec = EventCodec::new(&config.registry.url)?;
    let producer = EventProducer::new(&config.kafka, codec.clone())?;
    let replayer = Replayer {
        config,
        topology: &topology,
        route: &route,
        spans: &spans,
        filter,
        producer,
        shutdown,
        progress: progress.clone(),
    };
    let counts = crate::pipeline::with_handler(&sink, pipeline, codec, replayer).await??;
    progress.finish_and_clear();
    if pipeline == "conversations" && !matches!(target, Some(Target::Database(_))) {
        // The lists' hot copy is filled again from the rebuilt tables.
        let mut redis = crate::redis_util::connect(&sink.redis.url).await?;
        for tenant in &tenants {
            let dropped = crate::conversations::hot::drop_all(&mut redis, tenant).await?;
            tracing::info!(%tenant, dropped, "chat-list hot copy dropped");
        }
    }

    let after = snapshot(&sink, pipeline, &tenants).await?;
    let verifications = before
        .into_iter()
        .zip(after)
        .map(|((tenant, part, b), (_, _, a))| Verification {
            tenant,
            part,
            topics: crate::digest::compare(&b, &a),
        })
        .collect();
    Ok(Report {
        pipeline: pipeline.to_string(),
        group: route.group,
        counts,
        verifications,
    })
}

/// Waits until `group` has no members, or refuses the reset.
async fn wait_inactive(
    config: &Config,
    group: &str,
    pipeline: &str,
    secs: u64,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let (cfg, g) = (config.clone(), group.to_string());
        let members =
            tokio::task::spawn_blocking(move || offsets::group_members(&cfg, &g)).await??;
        if members.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "consumer group {group} is active ({} member(s): {}); stop every `imstream project {pipeline}` \
                 (and `imstream unit` or `imstream dev` that runs it) before resetting it, or replay --into a fresh target",
                members.len(),
                members.join(", ")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Creates and migrates the fresh database of `tenant` and registers the
/// live catalog's months in it; points `sink` at it.
async fn prepare_database(
    config: &Config,
    sink: &mut Config,
    tenant: &str,
    db: &str,
) -> anyhow::Result<()> {
    let live = config
        .tenant(tenant)
        .ok_or_else(|| anyhow::anyhow!("unknown tenant {tenant:?}"))?;
    if live.database == db {
        bail!("--into database:{db} is the tenant's live database");
    }
    for t in sink.tenants.iter_mut().filter(|t| t.id == tenant) {
        t.database = db.to_string();
    }
    crate::tenant::migrate(sink, Some(tenant)).await?;
    let live_pool = crate::tenant::pool_of(config, live)?;
    let fresh = sink
        .tenant(tenant)
        .ok_or_else(|| anyhow::anyhow!("unknown tenant {tenant:?}"))?;
    let new_pool = crate::tenant::pool_of(sink, fresh)?;
    for entry in crate::store::catalog::list(&live_pool).await? {
        crate::store::catalog::create_month(&new_pool, entry.month).await?;
        crate::store::catalog::set_status(&new_pool, entry.month, entry.status).await?;
    }
    Ok(())
}

type Part = (String, &'static str, BTreeMap<String, Summary>);

/// The verifiable parts of `pipeline`'s projection in `config`'s sinks.
async fn snapshot(
    config: &Config,
    pipeline: &str,
    tenants: &[String],
) -> anyhow::Result<Vec<Part>> {
    let mut out = Vec::new();
    if pipeline == "search" {
        for tenant in tenants {
            let dir = crate::search::tenant_dir(config, tenant);
            let summaries = crate::search::summaries(&dir)
                .with_context(|| format!("search index of {tenant} at {}", dir.display()))?;
            out.push((tenant.clone(), "search_index", summaries));
        }
        return Ok(out);
    }
    if !matches!(
        pipeline,
        "store" | "hot" | "conversations" | "stats" | "references"
    ) {
        return Ok(out);
    }
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    for tenant in tenants {
        if pipeline == "hot" {
            out.push((
                tenant.clone(),
                "hot_messages",
                projection::hot_messages(&mut redis, tenant).await?,
            ));
            continue;
        }
        let t = config
            .tenant(tenant)
            .ok_or_else(|| anyhow::anyhow!("unknown tenant {tenant:?}"))?;
        let pool = crate::tenant::pool_of(config, t)?;
        // A dropped database or table: nothing to compare against.
        let or_empty = |read: sqlx::Result<BTreeMap<String, Summary>>, what: &str| {
            read.unwrap_or_else(|e| {
                tracing::warn!(%tenant, error = %e, "{what} unreadable; treated as empty");
                BTreeMap::new()
            })
        };
        let (part, summaries) = match pipeline {
            "stats" => (
                "stats",
                or_empty(projection::stats_days(&pool).await, "stats"),
            ),
            "references" => (
                "references",
                or_empty(projection::references(&pool).await, "references"),
            ),
            "conversations" => (
                "conversations",
                or_empty(
                    projection::conversation_lists(&pool).await,
                    "conversation lists",
                ),
            ),
            _ => (
                "month_tables",
                or_empty(projection::month_tables(&pool).await, "month tables"),
            ),
        };
        pool.close().await;
        out.push((tenant.clone(), part, summaries));
        if pipeline != "store" {
            continue;
        }
        out.push((
            tenant.clone(),
            "routes",
            projection::routes(&mut redis, tenant).await?,
        ));
    }
    Ok(out)
}

/// `imstream replay …`: runs the replay and prints the verification.
pub async fn run_cli(config: &Config, args: ReplayArgs) -> anyhow::Result<()> {
    let shutdown = Shutdown::new();
    shutdown.trigger_on_signals();
    let report = replay(config, &args, shutdown).await?;
    println!(
        "replayed {} record(s) of {} as group {} ({} applied, {} of other tenants left out)",
        report.counts.records,
        report.pipeline,
        report.group,
        report.counts.applied,
        report.counts.skipped
    );
    for v in &report.verifications {
        let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &v.topics {
            *tally.entry(c.verdict.as_str()).or_default() += 1;
            let show = |s: &Option<Summary>| s.as_ref().map_or("-".to_string(), |s| s.to_string());
            println!(
                "{}\t{}\t{}\t{}\tbefore {}\tafter {}",
                v.tenant,
                v.part,
                c.topic,
                c.verdict.as_str(),
                show(&c.before),
                show(&c.after)
            );
        }
        let tally: Vec<String> = tally.iter().map(|(k, n)| format!("{n} {k}")).collect();
        println!(
            "{}\t{}\ttopics: {}",
            v.tenant,
            v.part,
            if tally.is_empty() {
                "none".into()
            } else {
                tally.join(", ")
            }
        );
    }
    if args.into.is_some() {
        println!("verified against the live projection; switch over by pointing the configuration at the new target");
    }
    if report.differences() > 0 {
        println!(
            "{} topic(s) differ from the projection replaced (CHANGED/MISSING above)",
            report.differences()
        );
    }
    Ok(())
}
