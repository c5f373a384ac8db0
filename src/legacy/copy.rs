//! `imstream legacy copy`: moves legacy rows into the month tables in
//! batches along the `(created_at, id)` cursor (seed 000 §9). Each batch is
//! one transaction: `INSERT … SELECT` (a duplicate key changes nothing) into each month it touches,
//! a check that every row arrived with the same content (count and a
//! per-row SHA-256, combined into the batch's hash), the route mirror, and
//! the cursor with the batch log. A copy can stop after any batch (Ctrl-C,
//! `--max-batches`, a crash) and resume from the cursor; re-running
//! (`--restart`) changes nothing.
//!
//! Id mapping: `message_id = legacy id`. Deterministic, so a re-run hits
//! the same primary keys; it cannot collide with Snowflake ids, which are
//! at least 2^22 × (ms since 2024-01-01) — above 10^17 today — while an
//! auto-increment id of the legacy table stays far below.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::redis_util::Redis;
use chrono::NaiveDateTime;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{Connection, MySql, QueryBuilder, Row};

use crate::shutdown::Shutdown;
use crate::store::catalog;
use crate::store::month::{MonthTable, ShardMonth};
use crate::store::routes;
use crate::store::writer::MirrorRow;

use super::state::{self, Batch};
use super::table::{batch_range, row_hash_sql, AFTER_CURSOR, COPY_COLUMNS, CURSOR_INDEX, TABLE};

/// Seed 000 §9: 1,000 to 5,000 rows per batch.
pub const BATCH_MIN: usize = 1000;
pub const BATCH_MAX: usize = 5000;

#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub batch_size: usize,
    /// Stop (resumably) after this many batches.
    pub max_batches: Option<u64>,
    /// Start over from the first row.
    pub restart: bool,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            batch_size: BATCH_MAX,
            max_batches: None,
            restart: false,
            progress: false,
        }
    }
}

/// What one `copy` run did.
#[derive(Debug, Clone, Default)]
pub struct CopyOutcome {
    pub batches: u64,
    pub rows_read: i64,
    pub rows_inserted: i64,
    /// The cursor reached the end of the legacy table.
    pub finished: bool,
    pub elapsed: Duration,
    /// Wall time of each batch (for `bench legacy-copy`).
    pub batch_times: Vec<Duration>,
    /// Topics whose Redis route was written after the run.
    pub routes_written: usize,
}

impl CopyOutcome {
    pub fn rows_per_sec(&self) -> f64 {
        self.rows_read as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("run `imstream legacy plan` first")]
    NotPlanned,
    #[error("the migration is cut over already")]
    CutOver,
    #[error("another copy of this tenant is running")]
    Busy,
    #[error("batch after cursor {cursor:?} failed its check: {why}")]
    Check {
        cursor: Option<(NaiveDateTime, i64)>,
        why: String,
    },
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// One legacy row's cursor key (read from the cursor index alone).
struct Key {
    id: i64,
    created_at: NaiveDateTime,
}

/// A legacy row as checked after its copy.
struct Checked {
    id: i64,
    topic: String,
    seq: i64,
    created_at: NaiveDateTime,
    hash: String,
    /// The copy's hash; `None` when the copy is missing.
    copy: Option<String>,
}

/// Copies from the persisted cursor until the end, `max_batches`, or `shutdown`.
pub async fn copy(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    options: &CopyOptions,
    shutdown: &Shutdown,
) -> Result<CopyOutcome, CopyError> {
    let batch_size = options.batch_size.clamp(BATCH_MIN, BATCH_MAX);
    let Some(st) = state::load(pool).await? else {
        return Err(CopyError::NotPlanned);
    };
    if st.status == state::CUT_OVER {
        return Err(CopyError::CutOver);
    }
    let mut conn = pool.acquire().await?;
    let locked: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('imstream.legacy.copy.', DATABASE()), 0)")
            .fetch_one(&mut *conn)
            .await?;
    if locked != Some(1) {
        return Err(CopyError::Busy);
    }
    let result = copy_locked(
        &mut *conn, pool, redis, tenant, options, batch_size, shutdown,
    )
    .await;
    let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('imstream.legacy.copy.', DATABASE()))")
        .execute(&mut *conn)
        .await;
    result
}

#[allow(clippy::too_many_arguments)]
async fn copy_locked(
    conn: &mut MySqlConnection,
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    options: &CopyOptions,
    batch_size: usize,
    shutdown: &Shutdown,
) -> Result<CopyOutcome, CopyError> {
    if options.restart {
        state::restart(pool).await?;
    }
    let st = state::load(pool).await?.ok_or(CopyError::NotPlanned)?;
    let mut cursor = st.cursor;
    let progress = if options.progress {
        ProgressBar::new(st.rows_total.max(0) as u64)
    } else {
        ProgressBar::hidden()
    };
    progress.set_style(
        ProgressStyle::with_template(
            "legacy copy [{bar:30}] {pos}/{len} rows {per_sec} eta {eta} {msg}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    progress.set_position(st.rows_copied.max(0) as u64);
    progress.reset_eta();
    // Month tables come from the catalog only (created there when missing).
    let mut known: BTreeMap<ShardMonth, MonthTable> = BTreeMap::new();
    for entry in catalog::list(pool).await? {
        if let Some((table, _)) = catalog::table(pool, entry.month).await? {
            known.insert(entry.month, table);
        }
    }
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let mut months: BTreeSet<ShardMonth> = BTreeSet::new();
    let mut out = CopyOutcome::default();
    let started = Instant::now();
    loop {
        if shutdown.is_triggered() || options.max_batches.is_some_and(|m| out.batches >= m) {
            break;
        }
        let batch_started = Instant::now();
        let keys = batch_keys(conn, cursor, batch_size).await?;
        let Some(last) = keys.last() else {
            out.finished = true;
            break;
        };
        let to = (last.created_at, last.id);
        for k in &keys {
            let month = ShardMonth::of(k.created_at.and_utc());
            if !known.contains_key(&month) {
                known.insert(month, catalog::create_month(pool, month).await?);
            }
        }
        match copy_batch(conn, &known, cursor, to, &keys).await {
            Ok((inserted, topics)) => {
                out.rows_inserted += inserted;
                touched.extend(topics);
            }
            Err(CopyError::Check { cursor, why }) => {
                let batch = Batch {
                    from: cursor,
                    to,
                    rows_read: keys.len() as i64,
                    rows_inserted: 0,
                    hash: "",
                };
                let _ = state::failed(pool, &batch, &why).await;
                return Err(CopyError::Check { cursor, why });
            }
            Err(e) => return Err(e),
        }
        out.batches += 1;
        out.rows_read += keys.len() as i64;
        out.batch_times.push(batch_started.elapsed());
        months.extend(keys.iter().map(|k| ShardMonth::of(k.created_at.and_utc())));
        progress.inc(keys.len() as u64);
        cursor = Some(to);
        if keys.len() < batch_size {
            out.finished = true;
            break;
        }
    }
    progress.finish_and_clear();
    out.elapsed = started.elapsed();
    if out.finished {
        state::set_status(pool, state::COPIED).await?;
        // Topics a killed earlier run touched are written too.
        touched = sqlx::query_scalar(&format!("SELECT DISTINCT topic FROM {TABLE}"))
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect();
        let (first, last): (Option<NaiveDateTime>, Option<NaiveDateTime>) = sqlx::query_as(
            &format!("SELECT MIN(created_at), MAX(created_at) FROM {TABLE}"),
        )
        .fetch_one(pool)
        .await?;
        months.extend(
            first
                .into_iter()
                .chain(last)
                .map(|t| ShardMonth::of(t.and_utc())),
        );
    }
    let span = months.first().copied().zip(months.last().copied());
    out.routes_written = match span {
        Some(span) => write_routes(pool, redis, tenant, &touched, span).await?,
        None => 0,
    };
    Ok(out)
}

/// The next batch's cursor keys after `cursor` (an index-only scan).
async fn batch_keys(
    conn: &mut MySqlConnection,
    cursor: Option<(NaiveDateTime, i64)>,
    limit: usize,
) -> Result<Vec<Key>, CopyError> {
    let sql = format!(
        "SELECT id, created_at FROM {TABLE} FORCE INDEX ({CURSOR_INDEX}) {} ORDER BY created_at, id LIMIT ?",
        if cursor.is_some() { format!("WHERE {AFTER_CURSOR}") } else { String::new() }
    );
    let mut q = sqlx::query_as::<_, (i64, NaiveDateTime)>(&sql);
    if let Some((at, id)) = cursor {
        q = q.bind(at).bind(at).bind(id);
    }
    let rows = q.bind(limit as i64).fetch_all(&mut *conn).await?;
    Ok(rows
        .into_iter()
        .map(|(id, created_at)| Key { id, created_at })
        .collect())
}

/// One batch in one transaction; returns the rows really inserted.
async fn copy_batch(
    conn: &mut MySqlConnection,
    tables: &BTreeMap<ShardMonth, MonthTable>,
    from: Option<(NaiveDateTime, i64)>,
    to: (NaiveDateTime, i64),
    keys: &[Key],
) -> Result<(i64, BTreeSet<String>), CopyError> {
    let mut per_month: BTreeMap<ShardMonth, usize> = BTreeMap::new();
    for k in keys {
        *per_month
            .entry(ShardMonth::of(k.created_at.and_utc()))
            .or_default() += 1;
    }
    let check = |why: String| CopyError::Check { cursor: from, why };
    let filter = batch_range(from.is_none());
    let (legacy_hash, copy_hash) = (row_hash_sql("l"), row_hash_sql("m"));
    let mut tx = conn.begin().await?;
    let mut inserted = 0i64;
    let mut checked: Vec<Checked> = Vec::with_capacity(keys.len());
    let mut exact: Vec<(&MonthTable, String)> = Vec::new();
    for (month, expected) in &per_month {
        let table = &tables[month];
        let bind_range = |sql| range_query(sql, from, to, *month);
        // Copies already there (a re-run), by primary key: the insert's
        // affected-rows count would count them too (found rows).
        let ids: Vec<i64> = keys
            .iter()
            .filter(|k| ShardMonth::of(k.created_at.and_utc()) == *month)
            .map(|k| k.id)
            .collect();
        let count_sql = table.count_message_ids_sql(ids.len());
        let mut present = sqlx::query_scalar::<_, i64>(&count_sql);
        for id in &ids {
            present = present.bind(id);
        }
        let before = present.fetch_one(&mut *tx).await?;
        let sql = table.copy_from_legacy_sql(TABLE, CURSOR_INDEX, COPY_COLUMNS, &filter);
        bind_range(&sql).execute(&mut *tx).await?;
        // Every legacy row of the range next to its copy.
        let sql = table.check_copied_sql(TABLE, CURSOR_INDEX, &legacy_hash, &copy_hash, &filter);
        let start = checked.len();
        for r in bind_range(&sql).fetch_all(&mut *tx).await? {
            checked.push(Checked {
                id: r.try_get(0)?,
                topic: r.try_get(1)?,
                seq: r.try_get(2)?,
                created_at: r.try_get(3)?,
                hash: r.try_get(4)?,
                copy: r.try_get(5)?,
            });
        }
        let rows = &checked[start..];
        if rows.len() != *expected {
            return Err(check(format!(
                "{} legacy rows in {month} for {expected} keys",
                rows.len()
            )));
        }
        let n = rows.iter().filter(|c| c.copy.is_some()).count() as i64 - before;
        inserted += n;
        if n == *expected as i64 {
            upsert_mirror(&mut tx, *month, rows).await?;
        } else {
            // Some rows were there already (a re-run): recount exactly.
            let topics: BTreeSet<&str> = rows.iter().map(|k| k.topic.as_str()).collect();
            exact.extend(topics.into_iter().map(|t| (table, t.to_string())));
        }
    }
    // Count and content: every key arrived, byte for byte.
    checked.sort_by_key(|c| c.id);
    let mut source = Sha256::new();
    let mut target = Sha256::new();
    for c in &checked {
        source.update(c.hash.as_bytes());
        match &c.copy {
            Some(h) => target.update(h.as_bytes()),
            None => {
                return Err(check(format!(
                    "legacy id {} ({} seq {}) is not in its month table (seq taken by another message?)",
                    c.id, c.topic, c.seq
                )))
            }
        }
    }
    let (source, target) = (
        hex::encode(source.finalize()),
        hex::encode(target.finalize()),
    );
    if source != target {
        let bad = checked
            .iter()
            .find(|c| c.copy.as_ref() != Some(&c.hash))
            .map(|c| c.id);
        return Err(check(format!(
            "content hash differs (first differing legacy id {bad:?})"
        )));
    }
    for (table, topic) in &exact {
        recount_mirror(&mut tx, table, topic).await?;
    }
    state::advance(
        &mut tx,
        &Batch {
            from,
            to,
            rows_read: keys.len() as i64,
            rows_inserted: inserted,
            hash: &source,
        },
    )
    .await?;
    tx.commit().await?;
    Ok((inserted, checked.into_iter().map(|c| c.topic).collect()))
}

/// A query over one batch's range in one month (see `table::batch_range`).
fn range_query(
    sql: &str,
    from: Option<(NaiveDateTime, i64)>,
    to: (NaiveDateTime, i64),
    month: ShardMonth,
) -> sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments> {
    let mut q = sqlx::query(sql);
    if let Some((at, id)) = from {
        q = q.bind(at).bind(at).bind(id);
    }
    q.bind(to.0)
        .bind(to.0)
        .bind(to.1)
        .bind(month.start().naive_utc())
        .bind(month.end().naive_utc())
}

/// Adds freshly inserted rows to the route mirror (as the store writer does).
async fn upsert_mirror(
    tx: &mut sqlx::Transaction<'_, MySql>,
    month: ShardMonth,
    rows: &[Checked],
) -> Result<(), CopyError> {
    struct Agg {
        min_seq: i64,
        max_seq: i64,
        count: i64,
        min_at: NaiveDateTime,
        max_at: NaiveDateTime,
    }
    let mut per_topic: BTreeMap<&str, Agg> = BTreeMap::new();
    for k in rows {
        let a = per_topic.entry(&k.topic).or_insert(Agg {
            min_seq: k.seq,
            max_seq: k.seq,
            count: 0,
            min_at: k.created_at,
            max_at: k.created_at,
        });
        a.min_seq = a.min_seq.min(k.seq);
        a.max_seq = a.max_seq.max(k.seq);
        a.count += 1;
        a.min_at = a.min_at.min(k.created_at);
        a.max_at = a.max_at.max(k.created_at);
    }
    let month = month.to_string();
    let mut q: QueryBuilder<MySql> = QueryBuilder::new(
        "INSERT INTO im_group_message_topic_shards \
         (topic, shard_month, min_seq, max_seq, message_count, min_created_at, max_created_at) ",
    );
    q.push_values(per_topic, |mut b, (topic, a)| {
        b.push_bind(topic)
            .push_bind(&month)
            .push_bind(a.min_seq)
            .push_bind(a.max_seq)
            .push_bind(a.count)
            .push_bind(a.min_at)
            .push_bind(a.max_at);
    });
    q.push(
        " ON DUPLICATE KEY UPDATE min_seq = LEAST(min_seq, VALUES(min_seq)), \
         max_seq = GREATEST(max_seq, VALUES(max_seq)), message_count = message_count + VALUES(message_count), \
         min_created_at = LEAST(min_created_at, VALUES(min_created_at)), \
         max_created_at = GREATEST(max_created_at, VALUES(max_created_at))",
    );
    q.build().execute(&mut **tx).await?;
    Ok(())
}

/// Sets one topic's mirror row of a month from the month table itself.
async fn recount_mirror(
    tx: &mut sqlx::Transaction<'_, MySql>,
    table: &MonthTable,
    topic: &str,
) -> Result<(), CopyError> {
    let month = table.month();
    let row = sqlx::query(&table.topic_range_sql())
        .bind(topic)
        .fetch_one(&mut **tx)
        .await?;
    let count: i64 = row.try_get(2)?;
    if count == 0 {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO im_group_message_topic_shards \
         (topic, shard_month, min_seq, max_seq, message_count, min_created_at, max_created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE min_seq = VALUES(min_seq), \
         max_seq = VALUES(max_seq), message_count = VALUES(message_count), \
         min_created_at = VALUES(min_created_at), max_created_at = VALUES(max_created_at)",
    )
    .bind(topic)
    .bind(month.to_string())
    .bind(row.try_get::<i64, _>(0)?)
    .bind(row.try_get::<i64, _>(1)?)
    .bind(count)
    .bind(row.try_get::<NaiveDateTime, _>(3)?)
    .bind(row.try_get::<NaiveDateTime, _>(4)?)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Writes the Redis route of `topics` from the mirror, for the months
/// `first..=last` that legacy rows were copied into (fields are overwritten,
/// none deleted, other months left to the store pipeline). Returns the
/// topics written.
pub async fn write_routes(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topics: &BTreeSet<String>,
    (first, last): (ShardMonth, ShardMonth),
) -> Result<usize, CopyError> {
    for topic in topics {
        let rows: Vec<MirrorRow> = routes::mirror_rows(pool, topic)
            .await?
            .into_iter()
            .filter(|r| r.month >= first && r.month <= last)
            .collect();
        routes::apply(redis, tenant, &rows).await?;
    }
    Ok(topics.len())
}

/// Whether the legacy table has rows after the persisted cursor.
pub async fn remaining(pool: &MySqlPool) -> Result<i64, CopyError> {
    let st = state::load(pool).await?.ok_or(CopyError::NotPlanned)?;
    let n: i64 = match st.cursor {
        None => {
            sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {TABLE}"))
                .fetch_one(pool)
                .await?
        }
        Some((at, id)) => {
            sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM {TABLE} FORCE INDEX ({CURSOR_INDEX}) WHERE {AFTER_CURSOR}"
            ))
            .bind(at)
            .bind(at)
            .bind(id)
            .fetch_one(pool)
            .await?
        }
    };
    Ok(n)
}
