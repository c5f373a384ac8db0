//! `imstream shards`: the shard manager (seed 000 §4). For every tenant it
//! keeps the previous, current and next two months' tables (one template),
//! registers them in the catalog with their status, and advances the
//! tenant's `active_month` — under a Redis lock, and only after the new
//! month's table exists. A `sealing` month becomes `sealed` once
//! [`super::sealing`] finds nothing that holds it (sealing period, store
//! lag, pending store dead letters); archiving and dropping a sealed month
//! are explicit commands ([`super::archive`]).

use crate::redis_util::Redis;
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlPool;

use super::clock::advance_month;
use crate::config::Config;
use crate::keys::TenantKeys;
use crate::redis_util::{Clock, RedisLock};
use crate::shutdown::Shutdown;

use super::catalog::{self, ShardStatus};
use super::month::ShardMonth;
use super::sealing::{Hold, SealError, SealGate, StoreBacklog, StoreTopics};

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("sealing check: {0}")]
    Seal(#[from] SealError),
    #[error("consistency check: {0}")]
    Check(String),
}

/// What one pass did for one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPass {
    pub tables: Vec<ShardMonth>,
    /// The active month after the pass (`None` if the lock was held elsewhere).
    pub active_month: Option<ShardMonth>,
    /// Months this pass moved from `sealing` to `sealed`.
    pub sealed: Vec<ShardMonth>,
    /// Months still `sealing`, with what holds each.
    pub held: Vec<(ShardMonth, Vec<Hold>)>,
}

/// The months the manager keeps ready around `now`.
pub fn window(now: DateTime<Utc>) -> [ShardMonth; 4] {
    let cur = ShardMonth::of(now);
    [cur.prev(), cur, cur.next(), cur.next().next()]
}

/// One pass for one tenant at time `now`.
pub async fn run_once(
    tenant: &str,
    pool: &MySqlPool,
    redis: &mut Redis,
    now: DateTime<Utc>,
) -> Result<ShardPass, ShardError> {
    let months = window(now);
    let current = months[1];
    for month in months {
        catalog::create_month(pool, month).await?;
    }
    for entry in catalog::list(pool).await? {
        let wanted = if entry.month == current {
            (entry.status == ShardStatus::Prepared).then_some(ShardStatus::Writable)
        } else if entry.month < current {
            (entry.status == ShardStatus::Writable || entry.status == ShardStatus::Prepared)
                .then_some(ShardStatus::Sealing)
        } else {
            None
        };
        if let Some(status) = wanted {
            catalog::set_status(pool, entry.month, status).await?;
            tracing::info!(tenant, month = %entry.month, %status, "shard status changed");
        }
    }
    let keys = TenantKeys::new(tenant);
    let Some(lock) = RedisLock::acquire(redis, &keys.shard_lock(), 10_000).await? else {
        return Ok(ShardPass {
            tables: months.to_vec(),
            active_month: None,
            sealed: Vec::new(),
            held: Vec::new(),
        });
    };
    let result = async {
        if !catalog::table_exists(pool, current).await? {
            tracing::error!(tenant, month = %current, "current month table missing; active month not advanced");
            return Ok::<_, ShardError>(None);
        }
        Ok(Some(switch_month(redis, tenant, current).await?))
    }
    .await;
    lock.release(redis).await?;
    Ok(ShardPass {
        tables: months.to_vec(),
        active_month: result?,
        sealed: Vec::new(),
        held: Vec::new(),
    })
}

/// How long before it takes effect a month switch is announced: more than
/// the 1 s a gateway on a Redis Cluster caches the tenant's month state
/// (`send::ACTIVE_MONTH_CACHE`), so every gateway passes the announcement
/// to `lua/allocate_seq.lua` before its instant.
pub const SWITCH_LEAD_MS: i64 = 2_000;

/// Moves the tenant's active month to `month` (never back) so that every
/// node's sends change month at one instant: a first switch of an empty
/// tenant (or one whose key Redis lost) is set at once; otherwise the
/// switch is announced for Redis `TIME` + [`SWITCH_LEAD_MS`], this pass
/// waits until then, and the active month is set and the announcement
/// removed. The allocation script gives the announced month from that
/// instant on, whatever a gateway cached. A switch announced by a pass
/// that died before finishing is finished first (its instant may have
/// passed: scripts already give its month). Called under the shard lock.
pub async fn switch_month(
    redis: &mut Redis,
    tenant: &str,
    month: ShardMonth,
) -> Result<ShardMonth, ShardError> {
    let (active, announced) = super::clock::month_state(redis, tenant).await?;
    if let Some(a) = announced {
        let now = crate::redis_util::redis_now_ms(redis).await?;
        if a.at_ms <= now || active.is_none() {
            advance_month(redis, tenant, a.month).await?;
        }
    }
    let (active, _) = super::clock::month_state(redis, tenant).await?;
    match active {
        Some(a) if a >= month => return Ok(a),
        None => return Ok(advance_month(redis, tenant, month).await?),
        Some(_) => {}
    }
    let at_ms = crate::redis_util::redis_now_ms(redis).await? + SWITCH_LEAD_MS;
    let switch = super::clock::MonthSwitch { month, at_ms };
    super::clock::announce_switch(redis, tenant, switch).await?;
    tracing::info!(tenant, %month, at_ms, "month switch announced");
    loop {
        let now = crate::redis_util::redis_now_ms(redis).await?;
        if now >= at_ms {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(
            (at_ms - now).clamp(1, 500) as u64,
        ))
        .await;
    }
    let in_force = advance_month(redis, tenant, month).await?;
    tracing::info!(tenant, month = %in_force, "active month switched");
    Ok(in_force)
}

/// The month lifecycle gauges of one tenant after a pass (alerts
/// `ActiveMonthMissing`, `NextMonthTableMissing`,
/// `CurrentMonthNotWritable`) and its MySQL server's query counters (alert
/// `MySQLSlowQueryRateHigh`). A gauge that cannot be read is left as it was
/// (logged): a pass that could not read it has failed elsewhere too.
pub async fn export_gauges(tenant: &str, pool: &MySqlPool, redis: &mut Redis, now: DateTime<Utc>) {
    use crate::metrics as m;
    let current = ShardMonth::of(now);
    let t = tenant.to_string();
    match super::clock::month_state(redis, tenant).await {
        Ok((active, _)) => {
            let number = active.map_or(0.0, |a| a.to_string().parse::<f64>().unwrap_or(0.0));
            metrics::gauge!(m::SHARD_ACTIVE_MONTH, "tenant" => t.clone()).set(number);
        }
        Err(e) => tracing::warn!(tenant, error = %e, "active month not read for its gauge"),
    }
    let ready = |b: bool| if b { 1.0 } else { 0.0 };
    match catalog::table_exists(pool, current.next()).await {
        Ok(exists) => {
            metrics::gauge!(m::SHARD_NEXT_MONTH_READY, "tenant" => t.clone()).set(ready(exists))
        }
        Err(e) => tracing::warn!(tenant, error = %e, "next month's table not checked"),
    }
    let writable = async {
        Ok::<_, sqlx::Error>(
            catalog::table_exists(pool, current).await?
                && catalog::entry(pool, current)
                    .await?
                    .is_some_and(|e| e.status == ShardStatus::Writable),
        )
    };
    match writable.await {
        Ok(w) => {
            metrics::gauge!(m::SHARD_CURRENT_MONTH_WRITABLE, "tenant" => t.clone()).set(ready(w))
        }
        Err(e) => tracing::warn!(tenant, error = %e, "current month not checked"),
    }
    let status: Result<Vec<(String, String)>, _> =
        sqlx::query_as("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Slow_queries')")
            .fetch_all(pool)
            .await;
    match status {
        Ok(rows) => {
            for (name, value) in rows {
                let Ok(value) = value.parse::<u64>() else {
                    continue;
                };
                match name.as_str() {
                    "Questions" => metrics::counter!(m::MYSQL_QUERIES_TOTAL, "tenant" => t.clone())
                        .absolute(value),
                    "Slow_queries" => {
                        metrics::counter!(m::MYSQL_SLOW_QUERIES_TOTAL, "tenant" => t.clone())
                            .absolute(value)
                    }
                    _ => {}
                }
            }
        }
        Err(e) => tracing::warn!(tenant, error = %e, "MySQL query counters not read"),
    }
}

/// Seals every `sealing` month of one tenant that nothing holds; returns
/// the months sealed and the months held with their reasons. `backlog` is
/// read only when some month is past its sealing period.
pub async fn seal_ready(
    tenant: &str,
    pool: &MySqlPool,
    now: DateTime<Utc>,
    sealing_days: u32,
    backlog: &mut LazyBacklog<'_>,
) -> Result<(Vec<ShardMonth>, Vec<(ShardMonth, Vec<Hold>)>), ShardError> {
    let (mut sealed, mut held) = (Vec::new(), Vec::new());
    for entry in catalog::list(pool).await? {
        if entry.status != ShardStatus::Sealing {
            continue;
        }
        // The sealing period alone first: Kafka is read only past it.
        let mut holds = StoreBacklog::default().holds(tenant, entry.month, now, sealing_days);
        if holds.is_empty() {
            holds = match backlog.get().await {
                Ok(seen) => seen.holds(tenant, entry.month, now, sealing_days),
                Err(reason) => vec![Hold::Unchecked { reason }],
            };
        }
        if holds.is_empty() {
            catalog::set_status(pool, entry.month, ShardStatus::Sealed).await?;
            tracing::info!(tenant, month = %entry.month, "shard sealed");
            sealed.push(entry.month);
        } else {
            let why: Vec<String> = holds.iter().map(ToString::to_string).collect();
            tracing::info!(tenant, month = %entry.month, holds = ?why, "shard stays sealing");
            held.push((entry.month, holds));
        }
    }
    Ok((sealed, held))
}

/// The store backlog, read at most once per pass and only when needed. A
/// failed read is kept too (as its message), so one pass does not retry it
/// for every tenant.
pub struct LazyBacklog<'a> {
    gate: &'a SealGate,
    seen: Option<Result<StoreBacklog, String>>,
}

impl<'a> LazyBacklog<'a> {
    pub fn new(gate: &'a SealGate) -> Self {
        Self { gate, seen: None }
    }

    async fn get(&mut self) -> Result<&StoreBacklog, String> {
        if self.seen.is_none() {
            let seen = self.gate.observe().await.map_err(|e| {
                tracing::warn!(error = %e, "reading the store backlog failed; nothing sealed");
                e.to_string()
            });
            self.seen = Some(seen);
        }
        match self.seen.as_ref().expect("just set") {
            Ok(b) => Ok(b),
            Err(e) => Err(e.clone()),
        }
    }
}

/// The shard manager of a deployment: every configured tenant.
pub struct ShardManager {
    tenants: Vec<(String, MySqlPool)>,
    redis: Redis,
    clock: Clock,
    interval: std::time::Duration,
    gate: SealGate,
    sealing_days: u32,
    /// The consistency check's schedule (`None`: off), topics per run and
    /// dedup rows purged per run.
    check_every: Option<std::time::Duration>,
    check_topics: usize,
    purge_max: u64,
    /// Where uploaded files live, and how long they are kept
    /// (`files::sweep`); `None` when the store cannot be opened.
    files: Option<(crate::files::store::FileStore, crate::config::FilesConfig)>,
}

impl ShardManager {
    pub async fn connect(
        config: &Config,
        clock: Clock,
        topics: StoreTopics,
    ) -> Result<Self, ShardError> {
        let redis = crate::redis_util::connect(&config.redis.url).await?;
        let mut tenants = Vec::new();
        for t in &config.tenants {
            tenants.push((t.id.clone(), crate::tenant::pool_of(config, t)?));
        }
        Ok(Self {
            tenants,
            redis,
            clock,
            interval: std::time::Duration::from_secs(config.shards.interval_secs.max(1)),
            gate: SealGate::new(config, topics)?,
            sealing_days: config.shards.sealing_days,
            check_every: (config.shards.check_interval_secs > 0)
                .then(|| std::time::Duration::from_secs(config.shards.check_interval_secs)),
            check_topics: config.shards.check_topics_per_run.max(1),
            purge_max: config.shards.dedup_purge_per_run,
            files: match crate::files::store::FileStore::from_config(&config.files) {
                Ok(store) => Some((store, config.files.clone())),
                Err(e) => {
                    tracing::error!(error = %e, "files.store_url: uploads are not swept");
                    None
                }
            },
        })
    }

    /// One consistency check of every tenant (`store::consistency`): each
    /// goes on from `cursors` (the last topic the previous check compared)
    /// and compares `check_topics` topics, then purges expired dedup rows.
    /// A tenant whose check fails is logged and tried again next time.
    pub async fn check(
        &self,
        cursors: &mut std::collections::HashMap<String, String>,
    ) -> Vec<(String, super::consistency::Report)> {
        let mut redis = self.redis.clone();
        let mut out = Vec::new();
        for (tenant, pool) in &self.tenants {
            let after = cursors.get(tenant).cloned().unwrap_or_default();
            match super::consistency::check_tenant(
                tenant,
                pool,
                &mut redis,
                &after,
                self.check_topics,
                self.purge_max,
            )
            .await
            {
                Ok(report) => {
                    match &report.next_after {
                        Some(t) => cursors.insert(tenant.clone(), t.clone()),
                        None => cursors.remove(tenant),
                    };
                    tracing::info!(%tenant, topics = report.topics, mismatches = ?report.mismatches,
                        repairs = ?report.repairs, dedup_purged = report.dedup_purged, "consistency check done");
                    out.push((tenant.clone(), report));
                }
                Err(e) => tracing::error!(%tenant, error = %e, "consistency check failed"),
            }
        }
        out
    }

    /// One pass over every tenant at the clock's "now".
    pub async fn pass(&self) -> Result<Vec<(String, ShardPass)>, ShardError> {
        let mut redis = self.redis.clone();
        let now = self.clock.now(&mut redis).await?;
        let mut backlog = LazyBacklog::new(&self.gate);
        let mut out = Vec::new();
        for (tenant, pool) in &self.tenants {
            let mut pass = run_once(tenant, pool, &mut redis, now).await?;
            (pass.sealed, pass.held) =
                seal_ready(tenant, pool, now, self.sealing_days, &mut backlog).await?;
            export_gauges(tenant, pool, &mut redis, now).await;
            // Files left behind never fail the pass: the next one goes on.
            if let Some((store, files)) = &self.files {
                match crate::files::sweep::sweep(tenant, pool, store, files).await {
                    Ok(swept) if swept != Default::default() => {
                        tracing::info!(%tenant, ?swept, "files swept")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(%tenant, error = %e, "file sweep failed"),
                }
            }
            out.push((tenant.clone(), pass));
        }
        metrics::gauge!(crate::metrics::SHARD_LAST_PASS)
            .set(chrono::Utc::now().timestamp_millis() as f64 / 1000.0);
        Ok(out)
    }

    /// Passes every interval until shutdown; a failed pass is logged and
    /// retried at the next tick (the active month never moves without its
    /// table).
    pub async fn run(&self, shutdown: Shutdown) {
        let mut cursors = std::collections::HashMap::new();
        let mut checked: Option<std::time::Instant> = None;
        loop {
            match self.pass().await {
                Ok(passes) => {
                    for (tenant, pass) in passes {
                        tracing::debug!(%tenant, active = ?pass.active_month, "shard pass done");
                    }
                }
                Err(e) => tracing::error!(error = %e, "shard pass failed"),
            }
            if let Some(every) = self.check_every {
                if checked.is_none_or(|at| at.elapsed() >= every) {
                    self.check(&mut cursors).await;
                    checked = Some(std::time::Instant::now());
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_spans_previous_to_two_ahead() {
        let now = DateTime::parse_from_rfc3339("2026-12-15T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let w: Vec<String> = window(now).iter().map(|m| m.to_string()).collect();
        assert_eq!(w, ["202611", "202612", "202701", "202702"]);
    }
}
