//! `imstream legacy plan`: prepares a tenant for the copy, idempotently —
//! the cursor index on the legacy table (online DDL), a month table and a
//! catalog row for every month that holds legacy rows, the seq allocators
//! raised above the legacy seqs, and the state row with dual read on.

use std::collections::BTreeMap;

use crate::redis_util::Redis;
use chrono::{NaiveDateTime, Utc};
use sqlx::mysql::MySqlPool;

use crate::keys::TopicKeys;
use crate::store::catalog::{self, ShardStatus};
use crate::store::month::ShardMonth;

use super::state;
use crate::store::legacy::table::{self, CURSOR_INDEX, TABLE};

/// What `plan` found and prepared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub rows: i64,
    /// Months holding legacy rows, with their row counts.
    pub months: BTreeMap<ShardMonth, i64>,
    pub topics: i64,
    /// Seq allocators raised to the legacy max seq.
    pub allocators_raised: i64,
}

/// Raises a live allocator's `last_seq` to at least ARGV[1]; a missing
/// allocator is left to the re-seed (which reads the legacy table too).
static RAISE_SEQ: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "local cur = redis.call('HGET', KEYS[1], 'last_seq')\n\
         if not cur then return -1 end\n\
         if tonumber(cur) < tonumber(ARGV[1]) then redis.call('HSET', KEYS[1], 'last_seq', ARGV[1]) return 1 end\n\
         return 0",
    )
});

pub async fn plan(pool: &MySqlPool, redis: &mut Redis, tenant: &str) -> anyhow::Result<Plan> {
    if !table::exists(pool).await? {
        anyhow::bail!(
            "tenant {tenant}: no legacy table {TABLE} (already cut over, or never had one)"
        );
    }
    ensure_cursor_index(pool).await?;
    let mut out = Plan::default();
    let months = legacy_months(pool).await?;
    let current = ShardMonth::of(Utc::now());
    for (month, rows) in &months {
        let known = catalog::entry(pool, *month).await?.is_some();
        catalog::create_month(pool, *month).await?;
        if !known && *month < current.prev() {
            // A past month only the migration writes: no live event targets it.
            catalog::set_status(pool, *month, ShardStatus::Sealed).await?;
        }
        out.rows += rows;
    }
    out.months = months;
    let maxima: Vec<(crate::exact::Exact, i64)> = sqlx::query_as(&format!(
        "SELECT topic, MAX(seqid) FROM {TABLE} GROUP BY topic"
    ))
    .fetch_all(pool)
    .await?;
    out.topics = maxima.len() as i64;
    for (topic, max) in &maxima {
        let raised: i64 = RAISE_SEQ
            .key(TopicKeys::new(tenant, topic).seq())
            .arg(*max)
            .invoke_async(redis)
            .await?;
        if raised == 1 {
            out.allocators_raised += 1;
        }
    }
    state::plan(pool, out.rows).await?;
    Ok(out)
}

async fn ensure_cursor_index(pool: &MySqlPool) -> sqlx::Result<()> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() \
         AND table_name = ? AND index_name = ?",
    )
    .bind(TABLE)
    .bind(CURSOR_INDEX)
    .fetch_one(pool)
    .await?;
    if n == 0 {
        tracing::info!(
            index = CURSOR_INDEX,
            "adding the copy cursor index to the legacy table"
        );
        sqlx::query(&format!(
            "ALTER TABLE {TABLE} ADD INDEX {CURSOR_INDEX} (created_at, id), ALGORITHM=INPLACE, LOCK=NONE"
        ))
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Months (UTC) that hold legacy rows, with row counts, found by index
/// range scans between the oldest and newest row.
async fn legacy_months(pool: &MySqlPool) -> sqlx::Result<BTreeMap<ShardMonth, i64>> {
    let (first, last): (Option<NaiveDateTime>, Option<NaiveDateTime>) = sqlx::query_as(&format!(
        "SELECT MIN(created_at), MAX(created_at) FROM {TABLE}"
    ))
    .fetch_one(pool)
    .await?;
    let mut out = BTreeMap::new();
    let (Some(first), Some(last)) = (first, last) else {
        return Ok(out);
    };
    let mut month = ShardMonth::of(first.and_utc());
    let last = ShardMonth::of(last.and_utc());
    loop {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {TABLE} FORCE INDEX ({CURSOR_INDEX}) WHERE created_at >= ? AND created_at < ?"
        ))
        .bind(month.start().naive_utc())
        .bind(month.end().naive_utc())
        .fetch_one(pool)
        .await?;
        if n > 0 {
            out.insert(month, n);
        }
        if month >= last {
            break;
        }
        month = month.next();
    }
    Ok(out)
}
