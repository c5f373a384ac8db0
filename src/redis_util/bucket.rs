//! One user's token bucket in Redis (`lua/rate_limit.lua`): the primitive
//! under the gateway's per-user limits (`gateway::limits`) and the group
//! model's bound on lookups of names it does not hold.

use std::sync::LazyLock;

use redis::Script;

use crate::config::BucketConfig;

static RATE_LIMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/rate_limit.lua")));

/// `im:{<tenant>:u:<uid>}:rl:<what>`: under the user's own hash tag, so the
/// limiter spreads over the cluster with the users (never a tenant-wide
/// hot key).
pub fn key(tenant: &str, uid: i64, what: &str) -> String {
    format!("im:{{{tenant}:u:{uid}}}:rl:{what}")
}

/// Takes `cost` tokens from the bucket `key`: 0 when taken, else the
/// milliseconds until they could be.
pub async fn take(
    redis: &mut super::Redis,
    key: &str,
    bucket: BucketConfig,
    cost: u32,
) -> redis::RedisResult<u64> {
    RATE_LIMIT
        .key(key)
        .arg(bucket.burst.max(1))
        .arg(bucket.per_minute.max(1))
        .arg(cost.max(1))
        .invoke_async(redis)
        .await
}
