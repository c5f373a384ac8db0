//! The consistency checker (seed 000 §3.4 item 4, §3.5, §5.3, §12 item 16):
//! for a tenant, compares the three places that say where a topic's seqs
//! are — the month tables themselves (first and last seq and count per
//! topic and month), the MySQL route mirror (`im_group_message_topic_shards`)
//! and the Redis route (`route` ZSET + `route_meta` HASH) — and repairs
//! what it can from MySQL, the final source (seed 000 §3.4: "以月表实际数据和
//! MySQL 镜像修复 Redis"):
//!
//! | kind | found | repair |
//! | --- | --- | --- |
//! | `mirror_missing` | rows in a month table, no mirror row | mirror row from the table |
//! | `mirror_wrong` | mirror's min/max seq or count differ from the table | mirror row from the table |
//! | `mirror_orphan` | a mirror row for a live month whose table holds none of the topic | mirror row deleted |
//! | `redis_route` | the Redis route misses a month of the mirror, holds one it does not, or disagrees on its seqs | route rebuilt from the mirror |
//!
//! Every repair is recorded in `im_consistency_repairs` (what was found,
//! what it became): in the same transaction as a MySQL repair, before a
//! Redis one. Counts go to `imstream_consistency_*`.
//!
//! Races with the store pipeline: tables and mirror are read in one
//! snapshot (the store writes both in one transaction), and a MySQL repair
//! re-reads both with locking reads before it writes (the store's next
//! transaction for that topic and month waits for it, then adds its rows
//! on top). The store writes Redis after it commits, so a route briefly
//! behind the mirror is normal: a Redis difference is compared again after
//! [`REDIS_SETTLE`] and repaired only if it is still there.
//!
//! Months that have no table (archived and dropped, or being bulk-loaded)
//! are not compared: their mirror rows stay (the archive is read through
//! them). The same pass purges dedup rows whose window has passed
//! (`im_group_message_dedup.expires_at`), at most
//! `shards.dedup_purge_per_run` per run, in batches.

use std::collections::{BTreeMap, BTreeSet};

use chrono::NaiveDateTime;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::exact::Exact;
use crate::keys::TopicKeys;
use crate::metrics as m;
use crate::redis_util::Redis;

use super::catalog::{self, ShardStatus};
use super::month::{Family, MonthTable, ShardMonth};
use super::shards::ShardError;
use super::writer::MirrorRow;

/// How long a Redis route may lag its mirror before the checker repairs it.
pub const REDIS_SETTLE: std::time::Duration = std::time::Duration::from_millis(1_000);
/// Dedup rows deleted per statement.
const PURGE_BATCH: u64 = 1_000;

/// What one check of one tenant found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub topics: usize,
    /// Differences found, by kind.
    pub mismatches: BTreeMap<&'static str, u64>,
    /// Repairs made (each recorded in `im_consistency_repairs`), by kind.
    pub repairs: BTreeMap<&'static str, u64>,
    pub dedup_purged: u64,
    /// The last topic compared: where the next check goes on (`None`: the
    /// check reached the last topic).
    pub next_after: Option<String>,
}

impl Report {
    fn found(&mut self, kind: &'static str) {
        *self.mismatches.entry(kind).or_default() += 1;
        metrics::counter!(m::CONSISTENCY_MISMATCHES_TOTAL, "kind" => kind).increment(1);
    }

    fn repaired(&mut self, kind: &'static str) {
        *self.repairs.entry(kind).or_default() += 1;
        metrics::counter!(m::CONSISTENCY_REPAIRS_TOTAL, "kind" => kind).increment(1);
    }

    /// Adds another page's counts.
    pub fn absorb(&mut self, other: Report) {
        self.topics += other.topics;
        for (k, v) in other.mismatches {
            *self.mismatches.entry(k).or_default() += v;
        }
        for (k, v) in other.repairs {
            *self.repairs.entry(k).or_default() += v;
        }
        self.dedup_purged += other.dedup_purged;
        self.next_after = other.next_after;
    }
}

/// A topic's seqs in one month as one source sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    min_seq: i64,
    max_seq: i64,
    count: i64,
}

impl Range {
    fn text(&self) -> String {
        format!(
            "min_seq={},max_seq={},count={}",
            self.min_seq, self.max_seq, self.count
        )
    }
}

/// The months whose tables exist and may be compared.
async fn live_months(pool: &MySqlPool) -> sqlx::Result<Vec<ShardMonth>> {
    let mut out = Vec::new();
    for e in catalog::list(pool).await? {
        if matches!(e.status, ShardStatus::Archived | ShardStatus::Loading) {
            continue;
        }
        if catalog::table_exists(pool, e.month).await? {
            out.push(e.month);
        }
    }
    Ok(out)
}

/// The next `limit` topics after `after`, in byte order: every topic the
/// mirror or a live month table knows.
async fn next_topics(
    pool: &MySqlPool,
    months: &[ShardMonth],
    after: &str,
    limit: usize,
) -> sqlx::Result<Vec<String>> {
    let mut topics: BTreeSet<Vec<u8>> = BTreeSet::new();
    let from_mirror: Vec<Exact> = sqlx::query_scalar(
        "SELECT DISTINCT topic FROM im_group_message_topic_shards WHERE topic > ? ORDER BY topic LIMIT ?",
    )
    .bind(after.as_bytes())
    .bind(limit as i64)
    .fetch_all(pool)
    .await?;
    topics.extend(from_mirror.into_iter().map(|t| t.0.into_bytes()));
    for month in months {
        for family in Family::ALL {
            let table = MonthTable::new(*month).of_family(family);
            let found: Vec<Exact> = sqlx::query_scalar(&table.topics_after_sql())
                .bind(after.as_bytes())
                .bind(limit as i64)
                .fetch_all(pool)
                .await?;
            topics.extend(found.into_iter().map(|t| t.0.into_bytes()));
        }
    }
    Ok(topics
        .into_iter()
        .take(limit)
        .filter_map(|t| String::from_utf8(t).ok())
        .collect())
}

type Sources = (
    BTreeMap<(String, ShardMonth), Range>,
    BTreeMap<(String, ShardMonth), Range>,
);

/// The month tables' and the mirror's view of `topics`, in one snapshot.
async fn read_mysql(
    pool: &MySqlPool,
    months: &[ShardMonth],
    topics: &[String],
) -> sqlx::Result<Sources> {
    let mut tables = BTreeMap::new();
    let mut mirror = BTreeMap::new();
    let mut tx = pool.begin().await?;
    for month in months {
        for family in Family::ALL {
            let of_family: Vec<&String> = topics
                .iter()
                .filter(|t| Family::of_topic(t) == family)
                .collect();
            if of_family.is_empty() {
                continue;
            }
            let table = MonthTable::new(*month).of_family(family);
            let sql = table.topic_ranges_in_sql(of_family.len());
            let mut q = sqlx::query(&sql);
            for t in &of_family {
                q = q.bind(t.as_bytes());
            }
            for r in q.fetch_all(&mut *tx).await? {
                let topic: String = r.try_get::<Exact, _>(0)?.into();
                tables.insert(
                    (topic, *month),
                    Range {
                        min_seq: r.try_get(1)?,
                        max_seq: r.try_get(2)?,
                        count: r.try_get(3)?,
                    },
                );
            }
        }
    }
    let sql = format!(
        "SELECT topic, shard_month, min_seq, max_seq, message_count FROM im_group_message_topic_shards \
         WHERE topic IN ({})",
        vec!["?"; topics.len().max(1)].join(", ")
    );
    let mut q = sqlx::query(&sql);
    for t in topics {
        q = q.bind(t.as_bytes());
    }
    for r in q.fetch_all(&mut *tx).await? {
        let topic: String = r.try_get::<Exact, _>(0)?.into();
        let month: String = r.try_get(1)?;
        let Ok(month) = ShardMonth::parse(&month) else {
            continue;
        };
        mirror.insert(
            (topic, month),
            Range {
                min_seq: r.try_get(2)?,
                max_seq: r.try_get(3)?,
                count: r.try_get(4)?,
            },
        );
    }
    tx.commit().await?;
    Ok((tables, mirror))
}

/// Records one repair (in `conn`: the repair's own transaction, or alone).
async fn record<'c, E: sqlx::Executor<'c, Database = sqlx::MySql>>(
    conn: E,
    topic: &str,
    month: &str,
    kind: &str,
    found: &str,
    repaired_to: &str,
    source: &str,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO im_consistency_repairs (repaired_at, topic, shard_month, kind, found, repaired_to, source) \
         VALUES (UTC_TIMESTAMP(3), ?, ?, ?, ?, ?, ?)",
    )
    .bind(topic.as_bytes())
    .bind(month)
    .bind(kind)
    .bind(found.chars().take(512).collect::<String>())
    .bind(repaired_to.chars().take(512).collect::<String>())
    .bind(source)
    .execute(conn)
    .await?;
    Ok(())
}

/// Repairs the mirror row of `(topic, month)` from the month table, under
/// locks; the kind repaired, `None` when the locked re-read agrees (the
/// difference was the store pipeline committing meanwhile).
async fn repair_mirror(
    pool: &MySqlPool,
    topic: &str,
    month: ShardMonth,
) -> sqlx::Result<Option<&'static str>> {
    let mut tx = pool.begin().await?;
    let mirror: Option<(i64, i64, i64)> = sqlx::query_as(
        "SELECT min_seq, max_seq, message_count FROM im_group_message_topic_shards \
         WHERE topic = ? AND shard_month = ? FOR UPDATE",
    )
    .bind(topic.as_bytes())
    .bind(month.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    let table = MonthTable::new(month).for_topic(topic);
    let row = sqlx::query(&table.topic_range_locked_sql())
        .bind(topic.as_bytes())
        .fetch_one(&mut *tx)
        .await?;
    let count: i64 = row.try_get(2)?;
    let mirror = mirror.map(|(min_seq, max_seq, count)| Range {
        min_seq,
        max_seq,
        count,
    });
    let month_text = month.to_string();
    let kind = if count == 0 {
        let Some(found) = mirror else {
            return Ok(None);
        };
        sqlx::query(
            "DELETE FROM im_group_message_topic_shards WHERE topic = ? AND shard_month = ?",
        )
        .bind(topic.as_bytes())
        .bind(&month_text)
        .execute(&mut *tx)
        .await?;
        record(
            &mut *tx,
            topic,
            &month_text,
            "mirror_orphan",
            &found.text(),
            "deleted",
            "month_table",
        )
        .await?;
        "mirror_orphan"
    } else {
        let actual = Range {
            min_seq: row.try_get(0)?,
            max_seq: row.try_get(1)?,
            count,
        };
        if mirror == Some(actual) {
            return Ok(None);
        }
        let (min_at, max_at): (NaiveDateTime, NaiveDateTime) = (row.try_get(3)?, row.try_get(4)?);
        sqlx::query(
            "INSERT INTO im_group_message_topic_shards \
             (topic, shard_month, min_seq, max_seq, message_count, min_created_at, max_created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
             min_seq = VALUES(min_seq), max_seq = VALUES(max_seq), message_count = VALUES(message_count), \
             min_created_at = VALUES(min_created_at), max_created_at = VALUES(max_created_at)",
        )
        .bind(topic.as_bytes())
        .bind(&month_text)
        .bind(actual.min_seq)
        .bind(actual.max_seq)
        .bind(actual.count)
        .bind(min_at)
        .bind(max_at)
        .execute(&mut *tx)
        .await?;
        let kind = if mirror.is_some() {
            "mirror_wrong"
        } else {
            "mirror_missing"
        };
        let found = mirror.map_or_else(|| "missing".to_string(), |r| r.text());
        record(
            &mut *tx,
            topic,
            &month_text,
            kind,
            &found,
            &actual.text(),
            "month_table",
        )
        .await?;
        kind
    };
    tx.commit().await?;
    Ok(Some(kind))
}

/// One topic's Redis route: month → (first seq in the ZSET, `route_meta`).
type RouteView = BTreeMap<String, (Option<i64>, Option<Range>)>;

/// The Redis route of each topic as `month → range` (ZSET score as the
/// first seq; `route_meta` for the rest), months of either key.
async fn read_redis(
    redis: &mut Redis,
    tenant: &str,
    topics: &[String],
) -> redis::RedisResult<BTreeMap<String, RouteView>> {
    let mut pipe = redis::pipe();
    for t in topics {
        let keys = TopicKeys::new(tenant, t);
        pipe.cmd("ZRANGE")
            .arg(keys.route())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        pipe.cmd("HGETALL").arg(keys.route_meta());
    }
    let replies: Vec<redis::Value> = pipe.query_async(redis).await?;
    let mut out = BTreeMap::new();
    for (i, t) in topics.iter().enumerate() {
        let zset: Vec<(String, i64)> = redis::from_redis_value(&replies[2 * i])?;
        let meta: Vec<(String, String)> = redis::from_redis_value(&replies[2 * i + 1])?;
        let mut months = RouteView::new();
        for (month, first) in zset {
            months.entry(month).or_default().0 = Some(first);
        }
        for (field, value) in meta {
            if field == super::routes::COMPLETE_FIELD {
                continue;
            }
            months.entry(field).or_default().1 = parse_meta(&value);
        }
        out.insert(t.clone(), months);
    }
    Ok(out)
}

fn parse_meta(value: &str) -> Option<Range> {
    let (mut min_seq, mut max_seq, mut count) = (None, None, None);
    for part in value.split(',') {
        match part.split_once('=') {
            Some(("min_seq", v)) => min_seq = v.parse().ok(),
            Some(("max_seq", v)) => max_seq = v.parse().ok(),
            Some(("count", v)) => count = v.parse().ok(),
            _ => {}
        }
    }
    Some(Range {
        min_seq: min_seq?,
        max_seq: max_seq?,
        count: count?,
    })
}

/// How `route` (Redis) differs from `mirror` (one topic), as text; `None`
/// when they agree. A route no key of which exists is not a difference:
/// reads rebuild it from the mirror when they need it (seed 000 §3.4 item
/// 3), and every topic's route would otherwise be "repaired" after a
/// Redis loss in one sweep.
fn route_difference(route: &RouteView, mirror: &BTreeMap<String, Range>) -> Option<String> {
    if route.is_empty() {
        return None;
    }
    let mut diffs = Vec::new();
    for (month, want) in mirror {
        match route.get(month) {
            Some((Some(first), Some(have))) if *first == want.min_seq && have == want => {}
            other => diffs.push(format!(
                "{month}: {}",
                match other {
                    None => "missing".to_string(),
                    Some((first, have)) => format!(
                        "first={},{}",
                        first.map_or("none".into(), |f| f.to_string()),
                        have.map_or("meta=none".into(), |h| h.text())
                    ),
                }
            )),
        }
    }
    for month in route.keys().filter(|m| !mirror.contains_key(*m)) {
        diffs.push(format!("{month}: not in the mirror"));
    }
    (!diffs.is_empty()).then(|| diffs.join("; "))
}

/// The mirror rows of `topics`, by topic then month.
async fn mirror_of(
    pool: &MySqlPool,
    topics: &[String],
) -> sqlx::Result<BTreeMap<String, BTreeMap<String, Range>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Range>> = topics
        .iter()
        .map(|t| (t.clone(), BTreeMap::new()))
        .collect();
    for t in topics {
        for r in super::routes::mirror_rows(pool, t).await? {
            out.entry(t.clone()).or_default().insert(
                r.month.to_string(),
                Range {
                    min_seq: r.min_seq,
                    max_seq: r.max_seq,
                    count: r.count,
                },
            );
        }
    }
    Ok(out)
}

/// Rebuilds one topic's Redis route from the mirror, complete.
async fn rebuild_route(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
) -> Result<Vec<MirrorRow>, ShardError> {
    let rows = super::routes::rebuild_topic(pool, redis, tenant, topic)
        .await
        .map_err(|e| ShardError::Check(e.to_string()))?;
    let keys = TopicKeys::new(tenant, topic);
    let _: () = redis::cmd("HSET")
        .arg(keys.route_meta())
        .arg(super::routes::COMPLETE_FIELD)
        .arg(crate::events::now_ms())
        .query_async(redis)
        .await?;
    Ok(rows)
}

/// Checks (and repairs) up to `limit` topics of one tenant after `after`
/// ("" from the first). Does not purge dedup rows ([`purge_dedup`]).
pub async fn check_topics(
    tenant: &str,
    pool: &MySqlPool,
    redis: &mut Redis,
    after: &str,
    limit: usize,
) -> Result<Report, ShardError> {
    let mut report = Report::default();
    let months = live_months(pool).await?;
    let topics = next_topics(pool, &months, after, limit.max(1)).await?;
    report.topics = topics.len();
    report.next_after = (topics.len() == limit.max(1))
        .then(|| topics.last().cloned())
        .flatten();
    if topics.is_empty() {
        return Ok(report);
    }
    metrics::counter!(m::CONSISTENCY_TOPICS_TOTAL).increment(topics.len() as u64);

    // Month tables against the mirror, in one snapshot; each difference
    // repaired under locks.
    let (tables, mirror) = read_mysql(pool, &months, &topics).await?;
    let mut keys: BTreeSet<(String, ShardMonth)> = tables.keys().cloned().collect();
    keys.extend(
        mirror
            .keys()
            .filter(|(_, month)| months.contains(month))
            .cloned(),
    );
    for (topic, month) in keys {
        let table = tables.get(&(topic.clone(), month)).copied();
        let row = mirror.get(&(topic.clone(), month)).copied();
        let kind = match (table, row) {
            (Some(t), Some(r)) if t == r => continue,
            (Some(_), Some(_)) => "mirror_wrong",
            (Some(_), None) => "mirror_missing",
            (None, Some(_)) => "mirror_orphan",
            (None, None) => continue,
        };
        report.found(kind);
        if let Some(done) = repair_mirror(pool, &topic, month).await? {
            tracing::warn!(tenant, %topic, %month, kind = done, "route mirror repaired from the month table");
            report.repaired(done);
        }
    }

    // The Redis route against the (repaired) mirror; a difference still
    // there after the store had time to write Redis is repaired.
    let differing = |redis_view: &BTreeMap<String, RouteView>,
                     mirror: &BTreeMap<String, BTreeMap<String, Range>>| {
        topics
            .iter()
            .filter_map(|t| {
                let (no_route, no_rows) = (BTreeMap::new(), BTreeMap::new());
                route_difference(
                    redis_view.get(t).unwrap_or(&no_route),
                    mirror.get(t).unwrap_or(&no_rows),
                )
                .map(|d| (t.clone(), d))
            })
            .collect::<Vec<(String, String)>>()
    };
    let first = differing(
        &read_redis(redis, tenant, &topics).await?,
        &mirror_of(pool, &topics).await?,
    );
    if first.is_empty() {
        return Ok(report);
    }
    tokio::time::sleep(REDIS_SETTLE).await;
    let suspects: Vec<String> = first.into_iter().map(|(t, _)| t).collect();
    let still = {
        let redis_view = read_redis(redis, tenant, &suspects).await?;
        let mirror = mirror_of(pool, &suspects).await?;
        suspects
            .iter()
            .filter_map(|t| {
                let (no_route, no_rows) = (BTreeMap::new(), BTreeMap::new());
                route_difference(
                    redis_view.get(t).unwrap_or(&no_route),
                    mirror.get(t).unwrap_or(&no_rows),
                )
                .map(|d| (t.clone(), d, mirror.get(t).cloned().unwrap_or_default()))
            })
            .collect::<Vec<_>>()
    };
    for (topic, found, mirror) in still {
        report.found("redis_route");
        let to: Vec<String> = mirror
            .iter()
            .map(|(m, r)| format!("{m}: {}", r.text()))
            .collect();
        // Recorded first: a repair that fails halfway is found (and
        // recorded) again by the next check.
        record(
            pool,
            &topic,
            "",
            "redis_route",
            &found,
            &to.join("; "),
            "mirror",
        )
        .await?;
        rebuild_route(pool, redis, tenant, &topic).await?;
        tracing::warn!(tenant, %topic, %found, "Redis route repaired from the mirror");
        report.repaired("redis_route");
    }
    Ok(report)
}

/// Deletes dedup rows whose window has passed, at most `max`, in batches
/// (seed 000 §3.5: kept 7 to 30 days, not a permanent index); how many.
pub async fn purge_dedup(pool: &MySqlPool, max: u64) -> sqlx::Result<u64> {
    let mut purged = 0;
    while purged < max {
        let batch = PURGE_BATCH.min(max - purged);
        let done = sqlx::query(
            "DELETE FROM im_group_message_dedup WHERE expires_at < UTC_TIMESTAMP(3) ORDER BY expires_at LIMIT ?",
        )
        .bind(batch)
        .execute(pool)
        .await?;
        purged += done.rows_affected();
        if done.rows_affected() < batch {
            break;
        }
    }
    metrics::counter!(m::DEDUP_PURGED_TOTAL).increment(purged);
    Ok(purged)
}

/// One scheduled check of a tenant: `limit` topics after `after`, then the
/// dedup purge.
pub async fn check_tenant(
    tenant: &str,
    pool: &MySqlPool,
    redis: &mut Redis,
    after: &str,
    limit: usize,
    purge_max: u64,
) -> Result<Report, ShardError> {
    let mut report = check_topics(tenant, pool, redis, after, limit).await?;
    report.dedup_purged = purge_dedup(pool, purge_max).await?;
    Ok(report)
}

/// `imstream shards reopen`: a `sealed` month accepts late events again
/// (`sealing`), recorded in `im_consistency_repairs` as `month_reopened`.
/// The shard manager seals it again once nothing holds it (its dead letters
/// replayed: `imstream dlq replay store`). Refused for any other status: an
/// archived month's table is gone, a writable or sealing one takes writes.
pub async fn reopen(pool: &MySqlPool, month: ShardMonth) -> Result<(), String> {
    let entry = catalog::entry(pool, month)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("month {month} is not in the catalog"))?;
    match entry.status {
        ShardStatus::Sealed => {}
        ShardStatus::Archived => {
            return Err(format!(
            "month {month} is archived: its table was dropped (restore it from the archive first)"
        ))
        }
        other => {
            return Err(format!(
                "month {month} is {other}: it takes late events already"
            ))
        }
    }
    if !catalog::table_exists(pool, month)
        .await
        .map_err(|e| e.to_string())?
    {
        return Err(format!("month {month} has no table"));
    }
    let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
    let done = sqlx::query(
        "UPDATE im_group_message_shards SET status = 'sealing' WHERE shard_month = ? AND status = 'sealed'",
    )
    .bind(month.to_string())
    .execute(&mut *tx)
    .await
    .map_err(|e| e.to_string())?;
    if done.rows_affected() != 1 {
        return Err(format!(
            "month {month} changed status meanwhile; look again"
        ));
    }
    record(
        &mut *tx,
        "",
        &month.to_string(),
        "month_reopened",
        "sealed",
        "sealing",
        "operator",
    )
    .await
    .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())?;
    tracing::warn!(%month, "sealed month reopened for late events");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(min_seq: i64, max_seq: i64, count: i64) -> Range {
        Range {
            min_seq,
            max_seq,
            count,
        }
    }

    #[test]
    fn a_route_differs_from_its_mirror_only_where_it_disagrees() {
        let mirror = BTreeMap::from([
            ("202609".to_string(), range(1, 10, 10)),
            ("202610".to_string(), range(11, 12, 2)),
        ]);
        let route = |entries: &[(&str, Option<i64>, Option<Range>)]| {
            entries
                .iter()
                .map(|(m, f, r)| (m.to_string(), (*f, *r)))
                .collect::<BTreeMap<_, _>>()
        };
        let same = route(&[
            ("202609", Some(1), Some(range(1, 10, 10))),
            ("202610", Some(11), Some(range(11, 12, 2))),
        ]);
        assert_eq!(route_difference(&same, &mirror), None);
        // No key at all: reads rebuild it, not a difference.
        assert_eq!(route_difference(&BTreeMap::new(), &mirror), None);
        let missing = route(&[("202610", Some(11), Some(range(11, 12, 2)))]);
        assert_eq!(
            route_difference(&missing, &mirror).as_deref(),
            Some("202609: missing")
        );
        let wrong = route(&[
            ("202609", Some(1), Some(range(1, 9, 9))),
            ("202610", Some(11), Some(range(11, 12, 2))),
            ("202611", Some(13), None),
        ]);
        assert_eq!(
            route_difference(&wrong, &mirror).as_deref(),
            Some("202609: first=1,min_seq=1,max_seq=9,count=9; 202611: not in the mirror")
        );
        assert_eq!(
            parse_meta("min_seq=1,max_seq=9,count=9"),
            Some(range(1, 9, 9))
        );
        assert_eq!(parse_meta("garbage"), None);
    }
}
