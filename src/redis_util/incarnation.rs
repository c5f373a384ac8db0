//! Which incarnation of Redis answers: the `run_id` of the server, or of
//! every primary of a cluster. A restarted server, a promoted replica or a
//! server restored from a copy is another process with another run_id, so
//! state another incarnation wrote is known for what it is (it may be older
//! than what that one acknowledged). The tenant's restore marker
//! (`TenantKeys::restored`) names the incarnation(s) whose write-side state
//! was restored (`crate::recovery`); and the eviction check refuses a Redis
//! that could evict the write side.

use crate::keys::TenantKeys;

use super::{cluster_primaries, Redis};

/// The run_id in an `INFO server` reply.
pub fn run_id_of(info: &str) -> Option<String> {
    let at = info.find("run_id:")?;
    let id: String = info[at + 7..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .collect();
    (id.len() == 40).then_some(id)
}

/// What `INFO server` (or another section) says, per primary: one entry
/// on one server, one per primary of a cluster.
async fn info_per_primary(redis: &mut Redis, section: &str) -> redis::RedisResult<Vec<String>> {
    match redis {
        Redis::Single(c) => {
            let info: String = redis::cmd("INFO").arg(section).query_async(c).await?;
            Ok(vec![info])
        }
        Redis::Cluster(c) => {
            let mut out = Vec::new();
            for node in cluster_primaries(c).await? {
                let mut conn = redis::Client::open(node)?
                    .get_multiplexed_async_connection()
                    .await?;
                let info: String = redis::cmd("INFO")
                    .arg(section)
                    .query_async(&mut conn)
                    .await?;
                out.push(info);
            }
            Ok(out)
        }
    }
}

/// The incarnation answering now: the run_id of the server, or of every
/// primary of a cluster, sorted and joined by `,`.
pub async fn current(redis: &mut Redis) -> redis::RedisResult<String> {
    let mut ids: Vec<String> = info_per_primary(redis, "server")
        .await?
        .iter()
        .filter_map(|i| run_id_of(i))
        .collect();
    ids.sort();
    Ok(ids.join(","))
}

/// What the tenant's restore marker says of one topic's node: `<the
/// incarnation>@<when the pass began, epoch ms>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// A pass for this incarnation began after `since`: every claim of the
    /// log's unstored tail from before then is back.
    Covers,
    /// A pass for this incarnation, but begun before `since`: the marker.
    Before(String),
    /// No pass for this incarnation yet.
    Not,
}

/// The incarnation a marker names, and when its pass began.
pub fn parse_marker(marker: &str) -> (&str, i64) {
    match marker.rsplit_once('@') {
        Some((inc, at)) => (inc, at.parse().unwrap_or(0)),
        None => (marker, 0),
    }
}

/// Whether the tenant's write side has been restored, by a pass begun at
/// or after `since` (epoch ms), for the incarnation whose run_id is
/// `run_id` (the node of one topic's keys).
pub async fn restored(
    redis: &mut Redis,
    tenant: &str,
    run_id: &str,
    since: i64,
) -> redis::RedisResult<Restore> {
    let Some(marker) = restored_marker(redis, tenant).await? else {
        return Ok(Restore::Not);
    };
    let (inc, at) = parse_marker(&marker);
    if run_id.is_empty() || !inc.split(',').any(|id| id == run_id) {
        return Ok(Restore::Not);
    }
    Ok(if at >= since {
        Restore::Covers
    } else {
        Restore::Before(marker)
    })
}

/// The restore marker, as it is.
pub async fn restored_marker(
    redis: &mut Redis,
    tenant: &str,
) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET")
        .arg(TenantKeys::new(tenant).restored())
        .query_async(redis)
        .await
}

/// Records that the tenant's write side is restored for `incarnation` by
/// a pass that began at `began_ms`, only while the pass still holds the
/// tenant's restore lock: a FLUSHALL or restart during the pass took the
/// lock with it, and what the pass put back before it is gone. `false`
/// then (the next pass runs).
pub async fn mark_restored(
    redis: &mut Redis,
    tenant: &str,
    incarnation: &str,
    began_ms: i64,
    lock: &super::RedisLock,
) -> redis::RedisResult<bool> {
    let key = TenantKeys::new(tenant).restored();
    set_marker(redis, &key, incarnation, began_ms, lock).await
}

/// Records that a pass of `incarnation` begun at `began_ms` ran to its
/// end (while it still holds the tenant's restore lock).
pub async fn mark_pass_done(
    redis: &mut Redis,
    tenant: &str,
    incarnation: &str,
    began_ms: i64,
    lock: &super::RedisLock,
) -> redis::RedisResult<bool> {
    let key = TenantKeys::new(tenant).restore_done();
    set_marker(redis, &key, incarnation, began_ms, lock).await
}

/// `key` := `<incarnation>@<began_ms>` (what [`parse_marker`] reads), only
/// while `lock` is held.
async fn set_marker(
    redis: &mut Redis,
    key: &str,
    incarnation: &str,
    began_ms: i64,
    lock: &super::RedisLock,
) -> redis::RedisResult<bool> {
    lock.set_while_held(redis, key, &format!("{incarnation}@{began_ms}"))
        .await
}

/// Whether a pass of the incarnation whose run_id is `run_id` ran to its
/// end: after it, a topic whose state is missing lost it on its own.
pub async fn pass_done(redis: &mut Redis, tenant: &str, run_id: &str) -> redis::RedisResult<bool> {
    let done: Option<String> = redis::cmd("GET")
        .arg(TenantKeys::new(tenant).restore_done())
        .query_async(redis)
        .await?;
    Ok(done.is_some_and(|d| {
        !run_id.is_empty() && parse_marker(&d).0.split(',').any(|id| id == run_id)
    }))
}

/// Asks for another pass (the watchers see no marker): only while the
/// marker is still `seen`, so many askers make one request.
pub async fn ask_restore(redis: &mut Redis, tenant: &str, seen: &str) -> redis::RedisResult<()> {
    let _: i64 = redis::Script::new(include_str!("../../lua/release_lock.lua"))
        .key(TenantKeys::new(tenant).restored())
        .arg(seen)
        .invoke_async(redis)
        .await?;
    Ok(())
}

/// Refuses a Redis that could evict the write side (seq allocators, group
/// models, claims: keys with and without a TTL alike): a `maxmemory` with
/// any policy but `noeviction`. Every primary of a cluster is asked.
pub async fn check_no_eviction(redis: &mut Redis) -> Result<(), String> {
    let infos = info_per_primary(redis, "memory")
        .await
        .map_err(|e| format!("reading Redis's memory settings (INFO memory): {e}"))?;
    for info in infos {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().to_string())
        };
        let maxmemory: u64 = field("maxmemory").and_then(|v| v.parse().ok()).unwrap_or(0);
        let policy = field("maxmemory_policy").unwrap_or_else(|| "noeviction".into());
        if maxmemory > 0 && policy != "noeviction" {
            return Err(format!(
                "Redis runs with maxmemory {maxmemory} and maxmemory-policy {policy}: it could \
                 evict the write side (seq allocators, group models, idempotency claims), whose \
                 loss would refuse or repeat acknowledged work. Set maxmemory-policy noeviction \
                 (or maxmemory 0) on every Redis server imstream uses."
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_names_its_incarnation_and_when_its_pass_began() {
        assert_eq!(parse_marker("a,b@1700"), ("a,b", 1700));
        assert_eq!(parse_marker("a"), ("a", 0));
    }

    #[test]
    fn the_run_id_is_read_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\ntcp_port:6379\r\n";
        assert_eq!(
            run_id_of(info).as_deref(),
            Some("0123456789abcdef0123456789abcdef01234567")
        );
        assert_eq!(run_id_of("run_id:short\r\n"), None);
        assert_eq!(run_id_of("# Server\r\n"), None);
    }
}
