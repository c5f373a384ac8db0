//! `imstream shards`: the shard manager (seed 000 §4). For every tenant it
//! keeps the previous, current and next two months' tables (one template),
//! registers them in the catalog with their status, and advances the
//! tenant's `active_month` — under a Redis lock, and only after the new
//! month's table exists.

use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;
use sqlx::mysql::MySqlPool;

use crate::config::Config;
use crate::keys::TenantKeys;
use crate::redis_util::{advance_month, Clock, RedisLock};
use crate::shutdown::Shutdown;

use super::catalog::{self, ShardStatus};
use super::month::ShardMonth;

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// What one pass did for one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPass {
    pub tables: Vec<ShardMonth>,
    /// The active month after the pass (`None` if the lock was held elsewhere).
    pub active_month: Option<ShardMonth>,
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
    redis: &mut ConnectionManager,
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
        });
    };
    let result = async {
        if !catalog::table_exists(pool, current).await? {
            tracing::error!(tenant, month = %current, "current month table missing; active month not advanced");
            return Ok::<_, ShardError>(None);
        }
        let in_force = advance_month(redis, &keys.active_month(), current).await?;
        Ok(Some(in_force))
    }
    .await;
    lock.release(redis).await?;
    Ok(ShardPass {
        tables: months.to_vec(),
        active_month: result?,
    })
}

/// The shard manager of a deployment: every configured tenant.
pub struct ShardManager {
    tenants: Vec<(String, MySqlPool)>,
    redis: ConnectionManager,
    clock: Clock,
    interval: std::time::Duration,
}

impl ShardManager {
    pub async fn connect(config: &Config, clock: Clock) -> Result<Self, ShardError> {
        let redis = crate::redis_util::connect(&config.redis.url).await?;
        let mut tenants = Vec::new();
        for t in &config.tenants {
            tenants.push((
                t.id.clone(),
                crate::tenant::database_pool(&config.mysql, &t.database)?,
            ));
        }
        Ok(Self {
            tenants,
            redis,
            clock,
            interval: std::time::Duration::from_secs(config.shards.interval_secs.max(1)),
        })
    }

    /// One pass over every tenant at the clock's "now".
    pub async fn pass(&self) -> Result<Vec<(String, ShardPass)>, ShardError> {
        let mut redis = self.redis.clone();
        let now = self.clock.now(&mut redis).await?;
        let mut out = Vec::new();
        for (tenant, pool) in &self.tenants {
            out.push((
                tenant.clone(),
                run_once(tenant, pool, &mut redis, now).await?,
            ));
        }
        Ok(out)
    }

    /// Passes every interval until shutdown; a failed pass is logged and
    /// retried at the next tick (the active month never moves without its
    /// table).
    pub async fn run(&self, shutdown: Shutdown) {
        loop {
            match self.pass().await {
                Ok(passes) => {
                    for (tenant, pass) in passes {
                        tracing::debug!(%tenant, active = ?pass.active_month, "shard pass done");
                    }
                }
                Err(e) => tracing::error!(error = %e, "shard pass failed"),
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
