//! `imstream legacy verify`: the full check before the cutover — per topic,
//! the legacy rows against the rows copied from them (count, min/max seq,
//! content hash, so a missing or doubled row shows), no other message using
//! a legacy seq, the route mirror equal to the month tables, the Redis
//! routes equal to the mirror, and no month still `loading` (a bulk load
//! whose indexes are not built).

use std::collections::BTreeMap;

use crate::redis_util::Redis;
use futures::TryStreamExt;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::digest::{self, Digests, TopicCheck, Verdict};
use crate::keys::TopicKeys;
use crate::replay::projection;
use crate::store::catalog;
use crate::store::routes;

use super::state;
use crate::store::legacy::table::TABLE;

/// What `verify` found.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Legacy (before) against copied rows (after), per topic.
    pub topics: Vec<TopicCheck>,
    /// Month-table rows that were not copied but use a legacy seq.
    pub foreign_rows: i64,
    /// `topic month: what differs` between the mirror and the month tables.
    pub mirror: Vec<String>,
    /// `topic month: what differs` between Redis routes and the mirror.
    pub routes: Vec<String>,
    /// Legacy rows not yet copied (after the cursors).
    pub remaining: i64,
    /// Months still bulk-loading (catalog `loading`: indexes not built).
    pub loading: Vec<crate::store::month::ShardMonth>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.remaining == 0
            && self.foreign_rows == 0
            && self.mirror.is_empty()
            && self.routes.is_empty()
            && self.loading.is_empty()
            && self.topics.iter().all(|t| t.verdict == Verdict::Identical)
    }

    pub fn legacy_rows(&self) -> i64 {
        self.topics
            .iter()
            .filter_map(|t| t.before.as_ref())
            .map(|s| s.count)
            .sum()
    }

    pub fn copied_rows(&self) -> i64 {
        self.topics
            .iter()
            .filter_map(|t| t.after.as_ref())
            .map(|s| s.count)
            .sum()
    }
}

pub async fn verify(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
) -> anyhow::Result<VerifyReport> {
    let mut report = VerifyReport {
        remaining: super::copy::remaining(pool).await?,
        ..VerifyReport::default()
    };
    // Legacy rows.
    let mut legacy = Digests::default();
    {
        let sql = format!(
            "SELECT topic, seqid, from_user, CAST(content AS CHAR CHARACTER SET utf8mb4), status, version FROM {TABLE}"
        );
        let mut rows = sqlx::query(&sql).fetch(pool);
        while let Some(r) = rows.try_next().await? {
            projection::add_row(&mut legacy, &r)?;
        }
    }
    // Rows copied from them, in every month table.
    let mut copied = Digests::default();
    let mut tables = Vec::new();
    for entry in catalog::list(pool).await? {
        if entry.status == catalog::ShardStatus::Loading {
            report.loading.push(entry.month);
        }
        if !catalog::table_exists(pool, entry.month).await? {
            continue;
        }
        let Some((table, _)) = catalog::table(pool, entry.month).await? else {
            continue;
        };
        let sql = table.digest_copied_rows_sql(TABLE);
        let mut rows = sqlx::query(&sql).fetch(pool);
        while let Some(r) = rows.try_next().await? {
            projection::add_row(&mut copied, &r)?;
        }
        let foreign: i64 = sqlx::query_scalar(&table.foreign_rows_in_legacy_range_sql(TABLE))
            .fetch_one(pool)
            .await?;
        report.foreign_rows += foreign;
        tables.push(table);
    }
    let legacy = legacy.finish();
    report.topics = digest::compare(&legacy, &copied.finish());

    // The mirror against the month tables, and Redis against the mirror.
    for table in &tables {
        let actual: BTreeMap<String, (i64, i64, i64)> = sqlx::query(&table.topic_ranges_sql())
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| Ok((exact(r)?, (r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))))
            .collect::<Result<_, sqlx::Error>>()?;
        let month = table.month().to_string();
        let mirror: BTreeMap<String, (i64, i64, i64)> = sqlx::query(
            "SELECT topic, min_seq, max_seq, message_count FROM im_group_message_topic_shards WHERE shard_month = ?",
        )
        .bind(&month)
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| Ok((exact(r)?, (r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))))
        .collect::<Result<_, sqlx::Error>>()?;
        for (topic, a) in &actual {
            if mirror.get(topic) != Some(a) {
                report.mirror.push(format!(
                    "{topic} {month}: table min/max/count {a:?}, mirror {:?}",
                    mirror.get(topic)
                ));
            }
        }
    }
    for topic in legacy.keys() {
        let keys = TopicKeys::new(tenant, topic);
        let meta: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(keys.route_meta())
            .query_async(redis)
            .await?;
        for row in routes::mirror_rows(pool, topic).await? {
            let want = format!(
                "min_seq={},max_seq={},count={}",
                row.min_seq, row.max_seq, row.count
            );
            let got = meta.get(&row.month.to_string());
            if got != Some(&want) {
                report.routes.push(format!(
                    "{topic} {}: redis {got:?}, mirror {want}",
                    row.month
                ));
            }
        }
    }
    if report.ok() {
        state::set_status(pool, state::VERIFIED).await?;
    }
    Ok(report)
}

/// Column 0 of a row: a topic (an exact, binary column).
fn exact(r: &sqlx::mysql::MySqlRow) -> sqlx::Result<String> {
    Ok(r.try_get::<crate::exact::Exact, _>(0)?.into())
}
