//! Redis routes of a topic (seed 000 §3.3): `route` ZSET month → first seq,
//! `route_meta` HASH month → `min_seq=..,max_seq=..,count=..`. Written from
//! the MySQL mirror after the store pipeline commits; rebuilt from it when
//! missing. No TTL.

use crate::redis_util::Redis;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::keys::TopicKeys;

use super::month::ShardMonth;
use super::writer::MirrorRow;

/// `route_meta` field saying the route holds every month of the mirror
/// (`crate::history::route` completes a route without it).
pub const COMPLETE_FIELD: &str = "complete";

/// Writes the Redis route of every mirror row (one pipeline round trip).
pub async fn apply(redis: &mut Redis, tenant: &str, rows: &[MirrorRow]) -> redis::RedisResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for r in rows {
        let keys = TopicKeys::new(tenant, &r.topic);
        let month = r.month.to_string();
        pipe.zadd(keys.route(), &month, r.min_seq).ignore();
        pipe.hset(
            keys.route_meta(),
            &month,
            format!(
                "min_seq={},max_seq={},count={}",
                r.min_seq, r.max_seq, r.count
            ),
        )
        .ignore();
    }
    pipe.query_async::<()>(redis).await
}

/// The mirror rows of one topic, oldest month first.
pub async fn mirror_rows(pool: &MySqlPool, topic: &str) -> sqlx::Result<Vec<MirrorRow>> {
    let rows = sqlx::query(
        "SELECT shard_month, min_seq, max_seq, message_count FROM im_group_message_topic_shards \
         WHERE topic = ? ORDER BY shard_month",
    )
    .bind(topic)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let month: String = r.try_get(0)?;
        let Ok(month) = ShardMonth::parse(&month) else {
            tracing::warn!(%topic, %month, "ignoring mirror row with an illegal month");
            continue;
        };
        out.push(MirrorRow {
            topic: topic.to_string(),
            month,
            min_seq: r.try_get(1)?,
            max_seq: r.try_get(2)?,
            count: r.try_get(3)?,
        });
    }
    Ok(out)
}

/// Rebuilds one topic's Redis route from the mirror; returns the rows.
pub async fn rebuild_topic(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
) -> Result<Vec<MirrorRow>, crate::store::writer::StoreError> {
    let rows = mirror_rows(pool, topic).await?;
    let keys = TopicKeys::new(tenant, topic);
    let _: () = redis::pipe()
        .del(keys.route())
        .del(keys.route_meta())
        .query_async(redis)
        .await?;
    apply(redis, tenant, &rows).await?;
    Ok(rows)
}
