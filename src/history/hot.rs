//! 24 h hot messages in Redis (seed 001 §5.4): `hot_msg_seqs` ZSET (score =
//! seq, member = `seq:created_ms`) and one JSON snapshot per seq with a TTL.
//! A page is served from here only when it is complete: it starts at the
//! cursor (or, for the latest page, at the newest stored seq), holds `limit`
//! contiguous seqs (or reaches down to `since`/seq 1), and every snapshot is
//! present. Holes and expired entries fall back to MySQL.

use crate::redis_util::Redis;

use crate::keys::TopicKeys;

use super::{HistoryError, PageQuery};
use crate::store::message::StoredMessage;

/// How long a hot message stays.
pub const HOT_TTL_SECS: i64 = 24 * 3600;

/// Writes one message snapshot and trims entries older than the TTL and
/// beyond the newest `per_topic` (a busy topic holds at most that many:
/// reads past them fall back to MySQL).
pub async fn put(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    msg: &StoredMessage,
    now_ms: i64,
    per_topic: i64,
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
    // NX: the seq is the message's identity. A second copy of its event
    // (a re-produced retry, a redelivery) must not undo a later edit or
    // recall of the snapshot.
    pipe.cmd("SET")
        .arg(keys.hot_msg(msg.seq))
        .arg(snapshot)
        .arg("NX")
        .arg("EX")
        .arg(ttl)
        .ignore();
    pipe.zadd(keys.hot_seqs(), member, msg.seq).ignore();
    pipe.expire(keys.hot_seqs(), HOT_TTL_SECS).ignore();
    pipe.query_async::<()>(redis).await?;
    trim(redis, &keys, now_ms).await?;
    cap(redis, &keys, per_topic.max(1)).await
}

/// Drops the oldest entries (and their snapshots) beyond the newest `n`.
async fn cap(redis: &mut Redis, keys: &TopicKeys, n: i64) -> redis::RedisResult<()> {
    let beyond: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.hot_seqs())
        .arg(0)
        .arg(-(n + 1))
        .query_async(redis)
        .await?;
    if beyond.is_empty() {
        return Ok(());
    }
    let snapshots: Vec<String> = beyond
        .iter()
        .filter_map(|m| m.split_once(':').and_then(|(s, _)| s.parse::<i64>().ok()))
        .map(|seq| keys.hot_msg(seq))
        .collect();
    let mut pipe = redis::pipe();
    pipe.zrem(keys.hot_seqs(), &beyond).ignore();
    if !snapshots.is_empty() {
        pipe.del(snapshots).ignore();
    }
    pipe.query_async(redis).await
}

/// Removes the oldest entries whose time is past the TTL.
async fn trim(redis: &mut Redis, keys: &TopicKeys, now_ms: i64) -> redis::RedisResult<()> {
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

/// A change to hot snapshots, mirroring `store::revisions`.
#[derive(Debug, Clone)]
pub enum Amend<'a> {
    /// New content; applies only when `edit_seq` is newer than the last edit.
    Edit {
        edit_seq: i64,
        head: Option<&'a str>,
        content: Option<&'a str>,
    },
    /// Recalled or deleted for everyone: a stub with this status.
    Remove { status: &'static str },
}

/// Applies `change` to the snapshots of `seqs` that are hot (others are
/// not hot any more, or never were). Idempotent: a snapshot changes only
/// while `normal` and, for edits, only to a newer edit. The TTL is kept.
pub async fn amend(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    seqs: &[i64],
    change: &Amend<'_>,
) -> redis::RedisResult<usize> {
    if seqs.is_empty() {
        return Ok(0);
    }
    let keys = TopicKeys::new(tenant, topic);
    let names: Vec<String> = seqs.iter().map(|s| keys.hot_msg(*s)).collect();
    let snapshots: Vec<Option<String>> = redis::cmd("MGET").arg(&names).query_async(redis).await?;
    let mut pipe = redis::pipe();
    let mut changed = 0;
    for (name, snap) in names.iter().zip(snapshots) {
        let Some(mut msg) = snap.and_then(|s| serde_json::from_str::<StoredMessage>(&s).ok())
        else {
            continue;
        };
        if msg.status != "normal" {
            continue;
        }
        match change {
            Amend::Edit {
                edit_seq,
                head,
                content,
            } => {
                if msg.edit_seq.is_some_and(|e| e >= *edit_seq) {
                    continue;
                }
                msg.content = content.map(str::to_string);
                if let Some(h) = head {
                    msg.head = Some(h.to_string());
                }
                msg.edit_seq = Some(*edit_seq);
            }
            Amend::Remove { status } => {
                msg.status = status.to_string();
                msg.content = None;
                msg.head = None;
            }
        }
        msg.version += 1;
        let text = serde_json::to_string(&msg).unwrap_or_default();
        pipe.cmd("SET").arg(name).arg(text).arg("KEEPTTL").ignore();
        changed += 1;
    }
    if changed > 0 {
        pipe.query_async::<()>(redis).await?;
    }
    Ok(changed)
}

/// The hot seqs of a topic in `[low, hi)`.
pub async fn seqs_in(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    low: i64,
    hi: i64,
) -> redis::RedisResult<Vec<i64>> {
    let keys = TopicKeys::new(tenant, topic);
    let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(keys.hot_seqs())
        .arg(low)
        .arg(format!("({hi}"))
        .query_async(redis)
        .await?;
    Ok(members
        .iter()
        .filter_map(|m| m.split_once(':').and_then(|(s, _)| s.parse().ok()))
        .collect())
}

/// Removes one message's snapshot (recall, delete).
pub async fn remove(
    redis: &mut Redis,
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

static HOT_PAGE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/hot_page.lua")));

/// What one round trip (`lua/hot_page.lua`) read for a newest-first page:
/// the topic's route, its dellog token and the hot messages of the page.
#[derive(Debug)]
pub struct HotRead {
    /// `route_meta` fields (see `route::complete_segments`).
    pub route_meta: Vec<(String, String)>,
    /// The topic's dellog token, read with the page (see `dellog::Cache`).
    pub dellog_token: Option<String>,
    seqs: Vec<i64>,
    snapshots: Vec<Option<String>>,
}

impl HotRead {
    /// The page, if the hot set covers it completely. `newest` is the
    /// newest seq known stored (from the route); without it a page with no
    /// `before` cannot be proven complete at the top.
    pub fn page(&self, query: &PageQuery, newest: Option<i64>) -> Option<Vec<StoredMessage>> {
        if !covers(&self.seqs, query, newest) || self.snapshots.len() != self.seqs.len() {
            return None;
        }
        decode(self.snapshots.clone())
    }
}

/// Reads a newest-first page's route, dellog token and hot messages in one
/// round trip.
pub async fn read(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    query: &PageQuery,
) -> Result<HotRead, HistoryError> {
    let keys = TopicKeys::new(tenant, topic);
    let (meta, dellog_token, members, snapshots): (
        Vec<String>,
        Option<String>,
        Vec<String>,
        Vec<Option<String>>,
    ) = HOT_PAGE
        .key(keys.route_meta())
        .key(keys.hot_seqs())
        .key(keys.dellog_token())
        .arg(max_score(query))
        .arg(query.low())
        .arg(query.limit)
        .arg(keys.hot_msg_prefix())
        .invoke_async(redis)
        .await?;
    let route_meta = meta
        .chunks_exact(2)
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect();
    Ok(HotRead {
        route_meta,
        dellog_token,
        seqs: seqs_of(&members),
        snapshots,
    })
}

/// The ZSET score bound above a newest-first page.
fn max_score(query: &PageQuery) -> String {
    let high = query.high();
    if high == i64::MAX {
        "+inf".to_string()
    } else {
        format!("({high}")
    }
}

/// Seqs of hot-set members (`seq:ts`).
fn seqs_of(members: &[String]) -> Vec<i64> {
    members
        .iter()
        .filter_map(|m| m.split_once(':').and_then(|(s, _)| s.parse().ok()))
        .collect()
}

/// Whether `seqs` (newest first) are the whole page: no hole at the top,
/// none between, and either a full page or the bottom of the range.
fn covers(seqs: &[i64], query: &PageQuery, newest: Option<i64>) -> bool {
    let (high, low) = (query.high(), query.low());
    let Some(top) = seqs.first() else {
        return false;
    };
    // The top must be the page's first seq: `before - 1` with a cursor,
    // else at least the newest stored message (a missing newest entry —
    // trimmed, lost, or the hot pipeline lagging — is a hole at the top).
    if high != i64::MAX && *top != high - 1 {
        return false;
    }
    if high == i64::MAX && !newest.is_some_and(|n| *top >= n) {
        return false;
    }
    if seqs.windows(2).any(|w| w[0] != w[1] + 1) {
        return false;
    }
    let reached_bottom = *seqs.last().expect("non-empty") == low;
    (seqs.len() as i64) >= query.limit || reached_bottom
}

/// Every snapshot decoded, or `None` when one is missing or unreadable.
fn decode(snapshots: Vec<Option<String>>) -> Option<Vec<StoredMessage>> {
    snapshots
        .into_iter()
        .map(|snap| snap.and_then(|s| serde_json::from_str::<StoredMessage>(&s).ok()))
        .collect()
}
