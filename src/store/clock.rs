//! The month clock: the tenant's active month (the month sends write to)
//! and an announced switch to the next one, both in Redis under the
//! tenant's hash tag; the shard manager advances them, the send path and
//! the read path's route rebuild read them ([`active_month`],
//! [`month_state`]). When Redis lost the active month, the send path puts
//! back the latest writable month of the catalog ([`restore_active_month`],
//! never backwards).

use redis::{AsyncCommands, Script};
use sqlx::mysql::MySqlPool;

use super::catalog::{self, ShardStatus};
use super::month::ShardMonth;
use crate::redis_util::Redis;

static ADVANCE_MONTH: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/advance_month.lua")));

#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("{0}")]
    Db(#[from] sqlx::Error),
    #[error("no writable month yet (is `imstream shards` running?)")]
    NoWritableMonth,
}

/// Sets the tenant's active month to `month` unless it already holds a
/// later one, and ends an announced switch to it (or to an earlier month);
/// returns the month in force.
pub async fn advance_month(
    redis: &mut Redis,
    tenant: &str,
    month: ShardMonth,
) -> redis::RedisResult<ShardMonth> {
    let keys = crate::keys::TenantKeys::new(tenant);
    let in_force: String = ADVANCE_MONTH
        .key(keys.active_month())
        .key(keys.month_switch())
        .arg(month.to_string())
        .invoke_async(redis)
        .await?;
    Ok(ShardMonth::parse(&in_force).unwrap_or(month))
}

/// A month switch announced for an instant of the Redis clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonthSwitch {
    pub month: ShardMonth,
    /// Epoch ms (Redis `TIME`) from which the send path gives `month`.
    pub at_ms: i64,
}

impl MonthSwitch {
    /// `YYYYMM@epoch_ms`, as stored and as `lua/allocate_seq.lua` reads it.
    pub fn encode(&self) -> String {
        format!("{}@{}", self.month, self.at_ms)
    }

    pub fn parse(text: &str) -> Option<Self> {
        let (month, at) = text.split_once('@')?;
        Some(Self {
            month: ShardMonth::parse(month).ok()?,
            at_ms: at.parse().ok()?,
        })
    }
}

/// The tenant's active month and announced switch, read together (one
/// slot: both carry the tenant's hash tag).
pub async fn month_state(
    redis: &mut Redis,
    tenant: &str,
) -> redis::RedisResult<(Option<ShardMonth>, Option<MonthSwitch>)> {
    let keys = crate::keys::TenantKeys::new(tenant);
    let (active, switch): (Option<String>, Option<String>) = redis::cmd("MGET")
        .arg(keys.active_month())
        .arg(keys.month_switch())
        .query_async(redis)
        .await?;
    Ok((
        active.and_then(|s| ShardMonth::parse(&s).ok()),
        switch.as_deref().and_then(MonthSwitch::parse),
    ))
}

/// Announces that the tenant's month becomes `month` at `at_ms` (Redis
/// clock); kept until [`advance_month`] moves the active month there.
pub async fn announce_switch(
    redis: &mut Redis,
    tenant: &str,
    switch: MonthSwitch,
) -> redis::RedisResult<()> {
    let keys = crate::keys::TenantKeys::new(tenant);
    redis
        .set::<_, _, ()>(keys.month_switch(), switch.encode())
        .await
}

/// The tenant's active month as Redis holds it (`None` when Redis lost
/// it; the send path puts it back with [`restore_active_month`], a read
/// never writes).
pub async fn active_month(
    redis: &mut Redis,
    tenant: &str,
) -> redis::RedisResult<Option<ShardMonth>> {
    let keys = crate::keys::TenantKeys::new(tenant);
    let v: Option<String> = redis.get(keys.active_month()).await?;
    Ok(v.and_then(|s| ShardMonth::parse(&s).ok()))
}

/// Puts back a tenant's active month that Redis lost: the latest writable
/// month of the catalog (never backwards: a later month Redis got meanwhile
/// stays).
pub async fn restore_active_month(
    redis: &mut Redis,
    pool: &MySqlPool,
    tenant: &str,
) -> Result<ShardMonth, ClockError> {
    let writable = catalog::list(pool)
        .await?
        .into_iter()
        .filter(|e| e.status == ShardStatus::Writable)
        .map(|e| e.month)
        .max()
        .ok_or(ClockError::NoWritableMonth)?;
    Ok(advance_month(redis, tenant, writable).await?)
}
