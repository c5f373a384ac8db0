//! Reads a projection back as per-topic [`Summary`]s: the month tables of a
//! tenant database, the Redis hot messages and the Redis routes of a tenant.

use std::collections::BTreeMap;

use crate::redis_util::Redis;
use futures::TryStreamExt;
use sha2::{Digest, Sha256};
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::keys::TopicKeys;
use crate::store::catalog;
use crate::store::message::StoredMessage;
use crate::store::month::Family;

use crate::digest::{Digests, Summary};

/// Every message in the tenant's month tables (every month the catalog
/// knows whose tables exist, both families).
pub async fn month_tables(pool: &MySqlPool) -> sqlx::Result<BTreeMap<String, Summary>> {
    let mut digests = Digests::default();
    for entry in catalog::list(pool).await? {
        if !catalog::table_exists(pool, entry.month).await? {
            continue;
        }
        let Some((table, _)) = catalog::table(pool, entry.month).await? else {
            continue;
        };
        // Group and one-to-one messages: both table families of the month.
        for family in Family::ALL {
            let sql = table.of_family(family).digest_rows_sql();
            let mut rows = sqlx::query(&sql).fetch(pool);
            while let Some(r) = rows.try_next().await? {
                add_row(&mut digests, &r)?;
            }
        }
    }
    Ok(digests.finish())
}

/// Every user's chat list (the conversations projection): one summary per
/// user (`usr<uid>`), one row per conversation with its seq, cursors,
/// unread count, activity and preview.
pub async fn conversation_lists(pool: &MySqlPool) -> sqlx::Result<BTreeMap<String, Summary>> {
    let mut digests = Digests::default();
    let uids: Vec<i64> =
        sqlx::query_scalar("SELECT DISTINCT uid FROM im_conversations ORDER BY uid")
            .fetch_all(pool)
            .await?;
    for uid in uids {
        let mut all = crate::conversations::list_all(pool, uid).await?;
        all.sort_by(|a, b| a.topic.cmp(&b.topic));
        for c in all {
            let content = format!(
                "{}|{}|{}|{}|{}|{}",
                c.topic,
                c.read,
                c.recv,
                c.clear,
                c.unread,
                c.preview.as_deref().unwrap_or("")
            );
            digests.add_row(
                &crate::tinode::user_id(uid),
                c.last_seq,
                c.last_from,
                Some(&content),
                c.kind.as_str(),
                c.touched_ms,
            );
        }
    }
    Ok(digests.finish())
}

/// The admin statistics (the stats projection): one summary per topic, one
/// row per UTC day with its counts, seq sets and number of senders.
pub async fn stats_days(pool: &MySqlPool) -> sqlx::Result<BTreeMap<String, Summary>> {
    let mut digests = Digests::default();
    let mut rows = sqlx::query(
        "SELECT d.topic, TO_DAYS(d.day), CONCAT_WS('|', d.messages, d.edits, d.recalls, d.deletes,            d.message_seqs, d.edit_seqs, d.recall_seqs, d.delete_seqs,            (SELECT COUNT(*) FROM im_stats_senders s WHERE s.day = d.day AND s.topic = d.topic))          FROM im_stats_daily d ORDER BY d.topic, d.day",
    )
    .fetch(pool);
    while let Some(r) = rows.try_next().await? {
        let topic: String = r.try_get::<crate::exact::Exact, _>(0)?.into();
        let day: i64 = r.try_get(1)?;
        let content: String = r.try_get(2)?;
        digests.add_row(&topic, day, 0, Some(&content), "stats", 0);
    }
    Ok(digests.finish())
}

/// The references projection: per topic, its file messages (seq, kind,
/// audit, time) and the reports of its messages (seq, reporter, reason, status,
/// who closed it, note; times of reports are the events').
pub async fn references(pool: &MySqlPool) -> sqlx::Result<BTreeMap<String, Summary>> {
    let mut digests = Digests::default();
    let mut files = sqlx::query(
        "SELECT topic, seq, CONCAT_WS('|', kind, audit, DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f'))          FROM im_group_files ORDER BY topic, seq",
    )
    .fetch(pool);
    while let Some(r) = files.try_next().await? {
        let content: String = r.try_get(2)?;
        digests.add_row(
            &r.try_get::<crate::exact::Exact, _>(0)?,
            r.try_get(1)?,
            0,
            Some(&content),
            "file",
            0,
        );
    }
    drop(files);
    let mut reports = sqlx::query(
        "SELECT topic, seq, reporter_uid, CONCAT_WS('|', reason, status, COALESCE(resolved_by, ''), note,            DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f'), COALESCE(DATE_FORMAT(resolved_at, '%Y-%m-%d %H:%i:%s.%f'), ''))          FROM im_message_reports ORDER BY topic, seq, reporter_uid",
    )
    .fetch(pool);
    while let Some(r) = reports.try_next().await? {
        let content: String = r.try_get(3)?;
        digests.add_row(
            &r.try_get::<crate::exact::Exact, _>(0)?,
            r.try_get(1)?,
            r.try_get(2)?,
            Some(&content),
            "report",
            0,
        );
    }
    Ok(digests.finish())
}

/// Feeds one `topic, seqid, from_user, content, status, version` row.
pub fn add_row(digests: &mut Digests, r: &sqlx::mysql::MySqlRow) -> sqlx::Result<()> {
    let topic: String = r.try_get::<crate::exact::Exact, _>(0)?.into();
    let content: Option<String> = r.try_get(3)?;
    let status: String = r.try_get(4)?;
    let version: i32 = r.try_get(5)?;
    digests.add_row(
        &topic,
        r.try_get(1)?,
        r.try_get(2)?,
        content.as_deref(),
        &status,
        version as i64,
    );
    Ok(())
}

/// Topics of `tenant` that have a key ending in `suffix` (SCAN, no KEYS).
async fn topics_with(
    redis: &mut Redis,
    tenant: &str,
    suffix: &str,
) -> redis::RedisResult<Vec<String>> {
    let prefix = format!("im:{{{tenant}:");
    let end = format!("}}:{suffix}");
    let pattern = format!("{prefix}*{end}");
    let mut out: Vec<String> = crate::redis_util::scan_keys(redis, &pattern)
        .await?
        .iter()
        .filter_map(|k| k.strip_prefix(&prefix).and_then(|r| r.strip_suffix(&end)))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// The tenant's hot messages: every seq in `hot_msg_seqs` with its snapshot
/// (a seq whose snapshot expired counts with empty content).
pub async fn hot_messages(
    redis: &mut Redis,
    tenant: &str,
) -> redis::RedisResult<BTreeMap<String, Summary>> {
    let mut digests = Digests::default();
    for topic in topics_with(redis, tenant, "hot_msg_seqs").await? {
        let keys = TopicKeys::new(tenant, &topic);
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.hot_seqs())
            .arg(0)
            .arg(-1)
            .query_async(redis)
            .await?;
        let seqs: Vec<i64> = members
            .iter()
            .filter_map(|m| m.split_once(':').and_then(|(s, _)| s.parse().ok()))
            .collect();
        for chunk in seqs.chunks(500) {
            let snap_keys: Vec<String> = chunk.iter().map(|s| keys.hot_msg(*s)).collect();
            let snaps: Vec<Option<String>> =
                redis::cmd("MGET").arg(snap_keys).query_async(redis).await?;
            for (seq, snap) in chunk.iter().zip(snaps) {
                match snap.and_then(|s| serde_json::from_str::<StoredMessage>(&s).ok()) {
                    Some(m) => digests.add_row(
                        &topic,
                        m.seq,
                        m.from,
                        m.content.as_deref(),
                        &m.status,
                        m.version as i64,
                    ),
                    None => digests.add_row(&topic, *seq, 0, None, "expired", 0),
                }
            }
        }
    }
    Ok(digests.finish())
}

/// The tenant's Redis routes: per topic, the months of `route_meta`
/// (the read path's `complete` marker is not part of the route) and the
/// `route` ZSET. Count is the sum of the month counts; the hash covers each
/// month's `min_seq,max_seq,count` and its ZSET score.
pub async fn routes(
    redis: &mut Redis,
    tenant: &str,
) -> redis::RedisResult<BTreeMap<String, Summary>> {
    let mut out = BTreeMap::new();
    for topic in topics_with(redis, tenant, "groupmsg:route_meta").await? {
        let keys = TopicKeys::new(tenant, &topic);
        let meta: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(keys.route_meta())
            .query_async(redis)
            .await?;
        let zset: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(keys.route())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(redis)
            .await?;
        let scores: BTreeMap<String, i64> = zset.into_iter().collect();
        let mut hasher = Sha256::new();
        let (mut count, mut min_seq, mut max_seq) = (0, i64::MAX, i64::MIN);
        for (month, value) in &meta {
            if month == crate::store::routes::COMPLETE_FIELD {
                continue;
            }
            let field = |name: &str| {
                value
                    .split(',')
                    .filter_map(|p| p.split_once('='))
                    .find(|(k, _)| *k == name)
                    .and_then(|(_, v)| v.parse::<i64>().ok())
                    .unwrap_or(-1)
            };
            count += field("count").max(0);
            min_seq = min_seq.min(field("min_seq"));
            max_seq = max_seq.max(field("max_seq"));
            let score = scores.get(month).copied().unwrap_or(-1);
            hasher.update(format!("{month}:{value}:{score}\n").as_bytes());
        }
        if count > 0 || min_seq != i64::MAX {
            out.insert(
                topic,
                Summary {
                    count,
                    min_seq,
                    max_seq,
                    hash: hex::encode(hasher.finalize()),
                },
            );
        }
    }
    Ok(out)
}
