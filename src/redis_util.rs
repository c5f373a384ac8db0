//! Small Redis building blocks: connections, the lua/ scripts, a lock with
//! an owner token, the month clock.

use chrono::{DateTime, TimeZone, Utc};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use crate::store::month::ShardMonth;

/// Opens a reconnecting, multiplexed connection.
pub async fn connect(url: &str) -> redis::RedisResult<ConnectionManager> {
    let client = redis::Client::open(url)?;
    // Reconnect attempts stay short: while Redis is down every call fails
    // fast (callers retry), and the first call after it is back reconnects.
    // redis-rs uses `factor` as the backoff's multiplier from a 1 s minimum
    // and caps it at 60 s by default: without `max_delay` the two retries
    // below would hold every call for up to two minutes after a restart.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(std::time::Duration::from_secs(2))
        .set_response_timeout(std::time::Duration::from_secs(2))
        .set_number_of_retries(2)
        .set_factor(2)
        .set_max_delay(250);
    ConnectionManager::new_with_config(client, config).await
}

/// Every key matching `pattern` (SCAN, never KEYS), in no order.
pub async fn scan_keys(
    redis: &mut ConnectionManager,
    pattern: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(redis)
            .await?;
        out.extend(keys);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

static ADVANCE_MONTH: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../lua/advance_month.lua")));
static RELEASE_LOCK: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../lua/release_lock.lua")));

/// Sets `key` to `month` unless it already holds a later month; returns the
/// month in force.
pub async fn advance_month(
    redis: &mut ConnectionManager,
    key: &str,
    month: ShardMonth,
) -> redis::RedisResult<ShardMonth> {
    let in_force: String = ADVANCE_MONTH
        .key(key)
        .arg(month.to_string())
        .invoke_async(redis)
        .await?;
    Ok(ShardMonth::parse(&in_force).unwrap_or(month))
}

/// A lock held by one owner token (SET NX PX); released only by its owner.
pub struct RedisLock {
    key: String,
    token: String,
}

impl RedisLock {
    /// `None` when someone else holds it.
    pub async fn acquire(
        redis: &mut ConnectionManager,
        key: &str,
        ttl_ms: u64,
    ) -> redis::RedisResult<Option<RedisLock>> {
        let token = uuid::Uuid::new_v4().to_string();
        let ok: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(redis)
            .await?;
        Ok(ok.map(|_| RedisLock {
            key: key.to_string(),
            token,
        }))
    }

    pub async fn release(self, redis: &mut ConnectionManager) -> redis::RedisResult<()> {
        let _: i64 = RELEASE_LOCK
            .key(&self.key)
            .arg(&self.token)
            .invoke_async(redis)
            .await?;
        Ok(())
    }
}

/// Where "now" comes from for month decisions: Redis `TIME` (one clock for
/// every node) or a fixed override for tests crossing a month boundary.
#[derive(Debug, Clone)]
pub enum Clock {
    Redis,
    Fixed(DateTime<Utc>),
}

impl Clock {
    pub fn from_override(text: &str) -> Clock {
        match DateTime::parse_from_rfc3339(text) {
            Ok(t) if !text.is_empty() => Clock::Fixed(t.with_timezone(&Utc)),
            _ => Clock::Redis,
        }
    }

    pub async fn now(&self, redis: &mut ConnectionManager) -> redis::RedisResult<DateTime<Utc>> {
        match self {
            Clock::Fixed(t) => Ok(*t),
            Clock::Redis => {
                let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(redis).await?;
                Ok(Utc
                    .timestamp_opt(secs, (micros * 1000) as u32)
                    .single()
                    .unwrap_or_else(Utc::now))
            }
        }
    }
}

/// Reads a tenant's active month, if set.
pub async fn active_month(
    redis: &mut ConnectionManager,
    key: &str,
) -> redis::RedisResult<Option<ShardMonth>> {
    let v: Option<String> = redis.get(key).await?;
    Ok(v.and_then(|s| ShardMonth::parse(&s).ok()))
}
