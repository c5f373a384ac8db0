//! 24 h hot messages in Redis (seed 001 §5.4): `hot_msg_seqs` ZSET (score =
//! seq, member = `seq:created_ms`) and one JSON snapshot per seq with a TTL.
//! A page is served from here only when it is complete: it starts at the
//! cursor (or, for the latest page, at the newest stored seq), holds `limit`
//! contiguous seqs (or reaches down to `since`/seq 1), and every snapshot is
//! present. Holes and expired entries fall back to MySQL.

use redis::aio::ConnectionManager;

use crate::keys::TopicKeys;

use super::{HistoryError, PageQuery, StoredMessage};

/// How long a hot message stays.
pub const HOT_TTL_SECS: i64 = 24 * 3600;

/// Writes one message snapshot and trims entries older than the TTL.
pub async fn put(
    redis: &mut ConnectionManager,
    tenant: &str,
    topic: &str,
    msg: &StoredMessage,
    now_ms: i64,
) -> redis::RedisResult<()> {
    let keys = TopicKeys::new(tenant, topic);
    let age_ms = now_ms - msg.ts;
    // Capped: an event stamped ahead of this clock stays at most 24 h.
    let ttl = (HOT_TTL_SECS - age_ms / 1000).min(HOT_TTL_SECS);
    if ttl <= 0 {
        return Ok(()); // replaying old events: not hot any more
    }
    let snapshot = serde_json::to_string(msg).unwrap_or_default();
    let member = format!("{}:{}", msg.seq, msg.ts);
    let mut pipe = redis::pipe();
    pipe.set_ex(keys.hot_msg(msg.seq), snapshot, ttl as u64)
        .ignore();
    pipe.zadd(keys.hot_seqs(), member, msg.seq).ignore();
    pipe.expire(keys.hot_seqs(), HOT_TTL_SECS).ignore();
    pipe.query_async::<()>(redis).await?;
    trim(redis, &keys, now_ms).await
}

/// Removes the oldest entries whose time is past the TTL.
async fn trim(
    redis: &mut ConnectionManager,
    keys: &TopicKeys,
    now_ms: i64,
) -> redis::RedisResult<()> {
    let oldest: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.hot_seqs())
        .arg(0)
        .arg(31)
        .query_async(redis)
        .await?;
    let cutoff = now_ms - HOT_TTL_SECS * 1000;
    let expired: Vec<&String> = oldest
        .iter()
        .filter(|m| {
            m.split_once(':')
                .and_then(|(_, t)| t.parse::<i64>().ok())
                .is_some_and(|t| t < cutoff)
        })
        .collect();
    if !expired.is_empty() {
        let _: () = redis::cmd("ZREM")
            .arg(keys.hot_seqs())
            .arg(expired)
            .query_async(redis)
            .await?;
    }
    Ok(())
}

/// Removes one message's snapshot (recall, delete).
pub async fn remove(
    redis: &mut ConnectionManager,
    tenant: &str,
    topic: &str,
    seq: i64,
) -> redis::RedisResult<()> {
    let keys = TopicKeys::new(tenant, topic);
    let _: () = redis::pipe()
        .del(keys.hot_msg(seq))
        .cmd("ZREMRANGEBYSCORE")
        .arg(keys.hot_seqs())
        .arg(seq)
        .arg(seq)
        .query_async(redis)
        .await?;
    Ok(())
}

/// A newest-first page if the hot set covers it completely. `newest` is the
/// newest seq known stored (from the route); without it a page with no
/// `before` cannot be proven complete at the top.
pub async fn page(
    redis: &mut ConnectionManager,
    tenant: &str,
    topic: &str,
    query: &PageQuery,
    newest: Option<i64>,
) -> Result<Option<Vec<StoredMessage>>, HistoryError> {
    let keys = TopicKeys::new(tenant, topic);
    let high = query.high();
    let low = query.low();
    let max = if high == i64::MAX {
        "+inf".to_string()
    } else {
        format!("({high}")
    };
    let members: Vec<String> = redis::cmd("ZREVRANGEBYSCORE")
        .arg(keys.hot_seqs())
        .arg(&max)
        .arg(low)
        .arg("LIMIT")
        .arg(0)
        .arg(query.limit)
        .query_async(redis)
        .await?;
    let seqs: Vec<i64> = members
        .iter()
        .filter_map(|m| m.split_once(':').and_then(|(s, _)| s.parse().ok()))
        .collect();
    if seqs.is_empty() {
        return Ok(None);
    }
    // The top must be the page's first seq: `before - 1` with a cursor,
    // else at least the newest stored message (a missing newest entry —
    // trimmed, lost, or the hot pipeline lagging — is a hole at the top).
    if high != i64::MAX && seqs[0] != high - 1 {
        return Ok(None);
    }
    if high == i64::MAX && !newest.is_some_and(|n| seqs[0] >= n) {
        return Ok(None);
    }
    if seqs.windows(2).any(|w| w[0] != w[1] + 1) {
        return Ok(None);
    }
    let reached_bottom = *seqs.last().expect("non-empty") == low;
    if (seqs.len() as i64) < query.limit && !reached_bottom {
        return Ok(None);
    }
    let snapshot_keys: Vec<String> = seqs.iter().map(|s| keys.hot_msg(*s)).collect();
    let snapshots: Vec<Option<String>> = redis::cmd("MGET")
        .arg(snapshot_keys)
        .query_async(redis)
        .await?;
    let mut out = Vec::with_capacity(seqs.len());
    for snap in snapshots {
        let Some(msg) = snap.and_then(|s| serde_json::from_str::<StoredMessage>(&s).ok()) else {
            return Ok(None);
        };
        out.push(msg);
    }
    Ok(Some(out))
}
