//! The generation marker of a tenant's Redis dataset: when Redis lost its
//! data (a restart without persistence, a promoted replica that lagged),
//! the marker is young, and whoever rebuilds state from Redis (the seq
//! re-seed, the group model) first waits out the sends still in flight.

use crate::events::now_ms;
use crate::keys::TenantKeys;

/// Milliseconds since this Redis dataset got its generation marker; a
/// missing marker is created now (age 0: data may just have been lost).
pub async fn generation_age_ms(
    redis: &mut crate::redis_util::Redis,
    tenant: &str,
) -> redis::RedisResult<i64> {
    let key = TenantKeys::new(tenant).generation();
    let now = now_ms();
    let candidate = format!("{}|{now}", uuid::Uuid::new_v4().simple());
    let _: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg(&candidate)
        .arg("NX")
        .query_async(redis)
        .await?;
    let current: Option<String> = redis::cmd("GET").arg(&key).query_async(redis).await?;
    let created = current
        .as_deref()
        .and_then(|v| v.split('|').nth(1))
        .and_then(|t| t.parse::<i64>().ok())
        .unwrap_or(now);
    Ok(now - created)
}

/// Marks the tenant's Redis dataset as established long ago (a fresh
/// deployment has no earlier data to lose). Called by `migrate`/`dev` on a
/// tenant's first setup, never after data could exist.
pub async fn establish_generation(
    redis: &mut crate::redis_util::Redis,
    tenant: &str,
) -> redis::RedisResult<bool> {
    let key = TenantKeys::new(tenant).generation();
    let value = format!("{}|0", uuid::Uuid::new_v4().simple());
    let set: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg(value)
        .arg("NX")
        .query_async(redis)
        .await?;
    Ok(set.is_some())
}
