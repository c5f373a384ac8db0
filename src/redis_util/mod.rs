//! Small Redis building blocks: connections (one server or a Redis
//! Cluster), a lock with an owner token, Redis's clock, and the dataset's
//! generation marker ([`generation`]). The tenant's month clock is the
//! store's (`crate::store::clock`).

pub mod bucket;
pub mod cluster;
pub mod generation;
pub mod incarnation;

use chrono::{DateTime, TimeZone, Utc};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;

use cluster::Cluster;
use redis::Script;

/// A connection to Redis, cheap to clone: one server (reconnecting,
/// multiplexed) or a Redis Cluster (every command routed to its key's
/// slot). Every Redis use in imstream takes this.
#[derive(Clone)]
pub enum Redis {
    Single(ConnectionManager),
    Cluster(Cluster),
}

/// The cluster's seed nodes when `url` names a cluster
/// (`redis+cluster://host:port,host:port,…`, `rediss+cluster://…` for TLS).
pub fn cluster_nodes(url: &str) -> Option<Vec<String>> {
    let (scheme, rest) = url.split_once("+cluster://")?;
    Some(
        rest.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(|n| format!("{scheme}://{n}"))
            .collect(),
    )
}

/// Opens a connection to the server or cluster `url` names.
pub async fn connect(url: &str) -> redis::RedisResult<Redis> {
    let timeout = std::time::Duration::from_secs(2);
    if let Some(nodes) = cluster_nodes(url) {
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .build()?;
        return Ok(Redis::Cluster(Cluster::connect(client).await?));
    }
    let client = redis::Client::open(url)?;
    // Reconnect attempts stay short: while Redis is down every call fails
    // fast (callers retry), and the first call after it is back reconnects.
    // redis-rs uses `factor` as the backoff's multiplier from a 1 s minimum
    // and caps it at 60 s by default: without `max_delay` the two retries
    // below would hold every call for up to two minutes after a restart.
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout)
        .set_number_of_retries(2)
        .set_factor(2)
        .set_max_delay(250);
    Ok(Redis::Single(
        ConnectionManager::new_with_config(client, config).await?,
    ))
}

impl ConnectionLike for Redis {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        let started = std::time::Instant::now();
        let reply = match self {
            Redis::Single(c) => c.req_packed_command(cmd),
            Redis::Cluster(c) => {
                let cluster = c.clone();
                let mut conn = c.current();
                Box::pin(async move {
                    let reply = conn.req_packed_command(cmd).await;
                    cluster.observe(&reply);
                    reply
                })
            }
        };
        Box::pin(async move {
            let reply = reply.await;
            record_latency("command", started);
            reply
        })
    }

    /// A pipeline goes to one node in one round trip when its keys share a
    /// slot. On a cluster, one whose keys span slots is sent command by
    /// command instead (each to its own slot's node): never a cross-slot
    /// request. A transaction must stay within one slot.
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        let started = std::time::Instant::now();
        let replies = match self {
            Redis::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Redis::Cluster(c) => Box::pin(async move {
                let mut conn = c.current();
                let replies = match conn.req_packed_commands(pipeline, offset, count).await {
                    Err(e)
                        if e.kind() == redis::ErrorKind::CrossSlot
                            && !pipeline.is_transaction() =>
                    {
                        per_slot(&conn, pipeline)
                            .await
                            .map(|all| all.into_iter().skip(offset).take(count).collect())
                    }
                    other => other,
                };
                c.observe(&replies);
                replies
            }),
        };
        Box::pin(async move {
            let replies = replies.await;
            record_latency("pipeline", started);
            replies
        })
    }

    fn get_db(&self) -> i64 {
        match self {
            Redis::Single(c) => c.get_db(),
            Redis::Cluster(c) => c.get_db(),
        }
    }
}

/// One round trip's time in [`crate::metrics::REDIS_COMMAND_LATENCY`]
/// (`kind`: command or pipeline), failures included.
fn record_latency(kind: &'static str, started: std::time::Instant) {
    metrics::histogram!(crate::metrics::REDIS_COMMAND_LATENCY, "kind" => kind)
        .record(started.elapsed().as_secs_f64());
}

/// The hash tag of a command's first imstream key (`im:{<tag>}:…`), which
/// decides its slot; `None` for a command without one (a `PUBLISH`).
fn hash_tag(cmd: &redis::Cmd) -> Option<&[u8]> {
    cmd.args_iter().skip(1).find_map(|arg| match arg {
        redis::Arg::Simple(bytes) if bytes.starts_with(b"im:{") => {
            let end = bytes.iter().position(|b| *b == b'}')?;
            Some(&bytes[4..end])
        }
        _ => None,
    })
}

/// A pipeline whose keys span slots, as one sub-pipeline per hash tag
/// (commands of one tag keep their order), sent concurrently; the replies
/// in the pipeline's order. Every imstream key carries its hash tag, so a
/// sub-pipeline never crosses a slot. A command without one (a `PUBLISH`,
/// which the cluster client routes to a primary of a random slot, so two of
/// them "cross slots") goes alone.
async fn per_slot(
    c: &ClusterConnection,
    pipeline: &redis::Pipeline,
) -> redis::RedisResult<Vec<redis::Value>> {
    let mut groups: Vec<(Option<&[u8]>, redis::Pipeline, Vec<usize>)> = Vec::new();
    for (i, cmd) in pipeline.cmd_iter().enumerate() {
        let tag = hash_tag(cmd);
        let at = match groups
            .iter()
            .position(|(t, _, _)| tag.is_some() && *t == tag)
        {
            Some(at) => at,
            None => {
                groups.push((tag, redis::pipe(), Vec::new()));
                groups.len() - 1
            }
        };
        groups[at].1.add_command(cmd.clone());
        groups[at].2.push(i);
    }
    let replies = futures::future::try_join_all(groups.iter().map(|(_, sub, _)| {
        let mut c = c.clone();
        async move { c.req_packed_commands(sub, 0, sub.len()).await }
    }))
    .await?;
    let mut out = vec![redis::Value::Nil; pipeline.len()];
    for ((_, _, at), values) in groups.iter().zip(replies) {
        for (i, v) in at.iter().zip(values) {
            out[*i] = v;
        }
    }
    Ok(out)
}

/// Every key matching `pattern` (SCAN, never KEYS), in no order; on a
/// cluster, every primary's keys.
pub async fn scan_keys(redis: &mut Redis, pattern: &str) -> redis::RedisResult<Vec<String>> {
    match redis {
        Redis::Single(c) => scan_node(c, pattern).await,
        Redis::Cluster(c) => {
            let mut out = Vec::new();
            for node in cluster_primaries(c).await? {
                let mut conn = redis::Client::open(node)?
                    .get_multiplexed_async_connection()
                    .await?;
                out.extend(scan_node(&mut conn, pattern).await?);
            }
            Ok(out)
        }
    }
}

/// `redis://host:port` of each primary of the cluster (`CLUSTER NODES`).
async fn cluster_primaries(c: &Cluster) -> redis::RedisResult<Vec<String>> {
    let nodes = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async::<String>(&mut c.current())
        .await;
    c.observe(&nodes);
    let nodes = nodes?;
    Ok(nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            // `host:port@cport[,hostname]`
            let addr = fields.get(1)?.split('@').next()?;
            Some(format!("redis://{addr}"))
        })
        .collect())
}

async fn scan_node(
    conn: &mut impl ConnectionLike,
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
            .query_async(conn)
            .await?;
        out.extend(keys);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

static SET_IF_HELD: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/set_if_held.lua")));
static RELEASE_LOCK: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/release_lock.lua")));

static RENEW_LOCK: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/renew_lock.lua")));

/// Redis `TIME` in epoch ms.
pub async fn redis_now_ms(redis: &mut Redis) -> redis::RedisResult<i64> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(redis).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// A lock held by one owner token (SET NX PX); released only by its owner.
#[derive(Clone)]
pub struct RedisLock {
    key: String,
    token: String,
}

impl RedisLock {
    /// `None` when someone else holds it.
    pub async fn acquire(
        redis: &mut Redis,
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

    /// [`RedisLock::acquire`], waiting up to `wait` while another holder
    /// has it (a request like this one, for milliseconds), asking every
    /// 50 ms; `None` when it stayed taken.
    pub async fn acquire_waiting(
        redis: &mut Redis,
        key: &str,
        ttl_ms: u64,
        wait: std::time::Duration,
    ) -> redis::RedisResult<Option<RedisLock>> {
        const EVERY: std::time::Duration = std::time::Duration::from_millis(50);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(lock) = RedisLock::acquire(redis, key, ttl_ms).await? {
                return Ok(Some(lock));
            }
            if tokio::time::Instant::now() + EVERY > deadline {
                return Ok(None);
            }
            tokio::time::sleep(EVERY).await;
        }
    }

    /// Extends the lock to `ttl_ms` from now; `false` when it is not ours
    /// any more (it expired and someone else took it).
    pub async fn renew(&self, redis: &mut Redis, ttl_ms: u64) -> redis::RedisResult<bool> {
        let renewed: i64 = RENEW_LOCK
            .key(&self.key)
            .arg(&self.token)
            .arg(ttl_ms)
            .invoke_async(redis)
            .await?;
        Ok(renewed == 1)
    }

    /// Sets `key` (of the lock's slot) to `value` only while the lock is
    /// ours; `false` when it is not (it expired, or Redis lost it).
    pub async fn set_while_held(
        &self,
        redis: &mut Redis,
        key: &str,
        value: &str,
    ) -> redis::RedisResult<bool> {
        let set: i64 = SET_IF_HELD
            .key(&self.key)
            .key(key)
            .arg(&self.token)
            .arg(value)
            .invoke_async(redis)
            .await?;
        Ok(set == 1)
    }

    pub async fn release(self, redis: &mut Redis) -> redis::RedisResult<()> {
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

    pub async fn now(&self, redis: &mut Redis) -> redis::RedisResult<DateTime<Utc>> {
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
