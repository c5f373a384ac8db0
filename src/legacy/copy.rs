//! `imstream legacy copy`: moves legacy rows into the month tables (seed
//! 000 §9), each month along its own `(created_at, id)` cursor, `--jobs`
//! months at a time. A job takes the oldest month nobody copies; a batch
//! (`--batch-size` rows) fills up from the next month when its month runs
//! out, so with one job the batches are those of a single cursor over the
//! whole table. Each batch is one transaction: the rows written into each
//! month it touches by the bulk path ([`super::bulk`]: multi-row inserts
//! built here from rows read by keyset ranges; a duplicate is an error, a
//! row copied before is compared, not written), the route mirror, each
//! month's cursor, the counters and the batch log. A copy can stop after
//! any batch (Ctrl-C, `--max-batches`, a crash) and resume from the
//! cursors; re-running (`--restart`) changes nothing.
//!
//! A past (`sealed`) month whose table is empty is bulk-loaded: catalog
//! `loading`, its secondary indexes built once after its last row, then
//! its status back (`--keep-indexes` keeps them all along). The live
//! months keep their indexes.
//!
//! Id mapping: `message_id = legacy id`. Deterministic, so a re-run hits
//! the same primary keys; it cannot collide with Snowflake ids, which are
//! at least 2^22 × (ms since 2024-01-01) — above 10^17 today — while an
//! auto-increment id of the legacy table stays far below.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::redis_util::Redis;
use chrono::NaiveDateTime;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use sqlx::mysql::{MySqlConnection, MySqlPool};
use sqlx::{Connection, MySql, QueryBuilder};

use crate::shutdown::Shutdown;
use crate::store::catalog::{self, ShardStatus};
use crate::store::month::{MonthTable, ShardMonth};
use crate::store::routes;
use crate::store::writer::MirrorRow;

use super::bulk::{self, LegacyRow, Load};
use super::state::{self, Batch, Cursor, MonthState};
use crate::store::legacy::table::{self, TABLE};

/// Seed 000 §9: 1,000 to 5,000 rows per batch.
pub const BATCH_MIN: usize = 1000;
pub const BATCH_MAX: usize = 5000;
/// Months copied at once by default: two keep MariaDB busy on a 2-core box
/// (one job leaves it waiting while imstream reads and builds a batch).
pub const JOBS_DEFAULT: usize = 2;
pub const JOBS_MAX: usize = 8;
/// Attempts of a batch that loses a deadlock or a lock wait.
const LOCK_ATTEMPTS: u32 = 5;

#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub batch_size: usize,
    /// Stop (resumably) after this many batches.
    pub max_batches: Option<u64>,
    /// Start over from the first row.
    pub restart: bool,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
    /// Months copied at once (1-8).
    pub jobs: usize,
    /// Keep the secondary indexes of past months during their copy (no
    /// bulk load, no `loading` status).
    pub keep_indexes: bool,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            batch_size: BATCH_MAX,
            max_batches: None,
            restart: false,
            progress: false,
            jobs: JOBS_DEFAULT,
            keep_indexes: false,
        }
    }
}

/// What one `copy` run did.
#[derive(Debug, Clone, Default)]
pub struct CopyOutcome {
    pub batches: u64,
    pub rows_read: i64,
    pub rows_inserted: i64,
    /// Every month's rows are copied (and bulk-loaded months indexed).
    pub finished: bool,
    pub elapsed: Duration,
    /// Wall time of each batch (for `bench legacy-copy`).
    pub batch_times: Vec<Duration>,
    /// Topics whose Redis route was written after the run.
    pub routes_written: usize,
    /// Bulk-loaded months whose indexes this run built.
    pub months_indexed: usize,
    /// Wall time of those index builds (within `elapsed`).
    pub index_time: Duration,
}

impl CopyOutcome {
    pub fn rows_per_sec(&self) -> f64 {
        self.rows_read as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn absorb(&mut self, job: JobOutcome) {
        self.batches += job.batches;
        self.rows_read += job.rows_read;
        self.rows_inserted += job.rows_inserted;
        self.batch_times.extend(job.batch_times);
        self.months_indexed += job.months_indexed;
        self.index_time += job.index_time;
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
    Check { cursor: Option<Cursor>, why: String },
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("copy job: {0}")]
    Job(String),
}

/// Copies from the persisted cursors until the end, `max_batches`, or `shutdown`.
pub async fn copy(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    options: &CopyOptions,
    shutdown: &Shutdown,
) -> Result<CopyOutcome, CopyError> {
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
    let result = copy_locked(pool, redis, tenant, options, shutdown).await;
    let _ = sqlx::query("SELECT RELEASE_LOCK(CONCAT('imstream.legacy.copy.', DATABASE()))")
        .execute(&mut *conn)
        .await;
    result
}

/// The months between the oldest and the newest legacy row, and the
/// highest legacy id.
async fn legacy_span(pool: &MySqlPool) -> Result<(Vec<ShardMonth>, i64), CopyError> {
    let (first, last, max_id): (Option<NaiveDateTime>, Option<NaiveDateTime>, Option<i64>) =
        sqlx::query_as(&format!(
            "SELECT MIN(created_at), MAX(created_at), MAX(id) FROM {TABLE}"
        ))
        .fetch_one(pool)
        .await?;
    let mut months = Vec::new();
    if let (Some(first), Some(last)) = (first, last) {
        let (mut m, last) = (
            ShardMonth::of(first.and_utc()),
            ShardMonth::of(last.and_utc()),
        );
        while m <= last {
            months.push(m);
            m = m.next();
        }
    }
    Ok((months, max_id.unwrap_or(0)))
}

/// Every month's progress row, created where missing: starting from the
/// global cursor (a copy from before per-month cursors), with no fresh
/// mark unless the month table holds copies already.
async fn month_states(
    pool: &MySqlPool,
    global: Option<Cursor>,
) -> Result<Vec<MonthState>, CopyError> {
    let (months, max_id) = legacy_span(pool).await?;
    let known: BTreeSet<ShardMonth> = state::months(pool).await?.iter().map(|m| m.month).collect();
    for month in months.iter().filter(|m| !known.contains(m)) {
        let table = match catalog::table(pool, *month).await? {
            Some((table, _)) => table,
            None => catalog::create_month(pool, *month).await?,
        };
        let fresh = if bulk::has_copies(pool, &table, max_id).await? {
            Some((month.end().naive_utc(), i64::MAX))
        } else {
            None
        };
        state::ensure_month(pool, *month, state::initial_cursor(global, *month), fresh).await?;
    }
    let wanted: BTreeSet<ShardMonth> = months.into_iter().collect();
    Ok(state::months(pool)
        .await?
        .into_iter()
        .filter(|m| wanted.contains(&m.month))
        .collect())
}

/// What the jobs of one run share.
struct Run {
    pool: MySqlPool,
    batch_size: usize,
    keep_indexes: bool,
    /// Months not taken by a job yet, oldest first.
    queue: Mutex<VecDeque<MonthState>>,
    /// Every month's committed cursor and whether all its rows are copied:
    /// the global cursor is computed from it.
    committed: Mutex<BTreeMap<ShardMonth, (Option<Cursor>, bool)>>,
    /// Batches left under `--max-batches`.
    tickets: Option<AtomicU64>,
    /// A job failed: the others stop after their batch.
    failed: AtomicBool,
    shutdown: Shutdown,
    progress: ProgressBar,
}

impl Run {
    fn stopping(&self) -> bool {
        self.shutdown.is_triggered() || self.failed.load(Ordering::Relaxed)
    }

    fn take_ticket(&self) -> bool {
        self.tickets.as_ref().is_none_or(|t| {
            t.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        })
    }

    fn return_ticket(&self) {
        if let Some(t) = &self.tickets {
            t.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The global cursor if `parts` commit.
    fn prefix_with(&self, parts: &[Part]) -> Option<Cursor> {
        let mut months = self.committed.lock().expect("lock").clone();
        for p in parts {
            let e = months.entry(p.run.state.month).or_default();
            if let Some(last) = p.rows.last() {
                e.0 = Some(last.cursor());
            }
            e.1 |= p.exhausted;
        }
        state::prefix_cursor(months.into_values())
    }

    fn committed(&self, parts: &[Part]) {
        let mut months = self.committed.lock().expect("lock");
        for p in parts {
            let e = months.entry(p.run.state.month).or_default();
            if let Some(last) = p.rows.last() {
                e.0 = Some(last.cursor());
            }
            e.1 |= p.exhausted;
        }
    }

    /// The oldest month no job has taken, ready for its load (a bulk load
    /// begun: `loading`, indexes dropped).
    async fn claim(&self, conn: &mut MySqlConnection) -> Result<Option<MonthRun>, CopyError> {
        let Some(state) = self.queue.lock().expect("lock").pop_front() else {
            return Ok(None);
        };
        let (table, status) = match catalog::table(&self.pool, state.month).await? {
            Some(t) => t,
            None => (
                catalog::create_month(&self.pool, state.month).await?,
                ShardStatus::Prepared,
            ),
        };
        let empty = status == ShardStatus::Sealed
            && state.loading_from.is_none()
            && !self.keep_indexes
            && bulk::table_empty(&self.pool, &table).await?;
        let load = bulk::choose_load(status, state.loading_from, empty, self.keep_indexes);
        if let Load::Bulk { from } = load {
            bulk::begin(&self.pool, conn, &table, &state, from).await?;
        }
        tracing::debug!(month = %state.month, ?load, "copying month");
        Ok(Some(MonthRun { state, table, load }))
    }

    /// After a month's last row: its indexes built (bulk) and the month done.
    async fn finish(
        &self,
        conn: &mut MySqlConnection,
        run: &MonthRun,
        out: &mut JobOutcome,
    ) -> Result<(), CopyError> {
        match run.load {
            Load::Bulk { from } => {
                let started = Instant::now();
                bulk::finish(&self.pool, conn, &run.table, run.state.month, from).await?;
                out.index_time += started.elapsed();
                out.months_indexed += 1;
            }
            Load::Indexed => state::month_done(&self.pool, run.state.month).await?,
        }
        Ok(())
    }
}

/// A month a job is copying.
#[derive(Debug, Clone)]
struct MonthRun {
    /// Its progress as committed (cursor and fresh mark move after each batch).
    state: MonthState,
    table: MonthTable,
    load: Load,
}

/// One month's rows of a batch.
struct Part {
    run: MonthRun,
    rows: Vec<LegacyRow>,
    /// The month has no rows after these.
    exhausted: bool,
}

/// What one job did.
#[derive(Default)]
struct JobOutcome {
    batches: u64,
    rows_read: i64,
    rows_inserted: i64,
    batch_times: Vec<Duration>,
    topics: BTreeSet<String>,
    months: BTreeSet<ShardMonth>,
    months_indexed: usize,
    index_time: Duration,
}

async fn copy_locked(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    options: &CopyOptions,
    shutdown: &Shutdown,
) -> Result<CopyOutcome, CopyError> {
    if options.restart {
        state::restart(pool).await?;
    }
    let st = state::load(pool).await?.ok_or(CopyError::NotPlanned)?;
    let months = month_states(pool, st.cursor).await?;
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
    let run = Arc::new(Run {
        pool: pool.clone(),
        batch_size: options.batch_size.clamp(BATCH_MIN, BATCH_MAX),
        keep_indexes: options.keep_indexes,
        queue: Mutex::new(months.iter().filter(|m| !m.done).cloned().collect()),
        committed: Mutex::new(
            months
                .iter()
                .map(|m| (m.month, (m.cursor, m.done)))
                .collect(),
        ),
        tickets: options.max_batches.map(AtomicU64::new),
        failed: AtomicBool::new(false),
        shutdown: shutdown.clone(),
        progress: progress.clone(),
    });
    let jobs = options.jobs.clamp(1, JOBS_MAX);
    let started = Instant::now();
    let handles: Vec<_> = (0..jobs)
        .map(|_| {
            let run = run.clone();
            tokio::spawn(async move {
                let result = job(&run).await;
                if result.is_err() {
                    run.failed.store(true, Ordering::Relaxed);
                }
                result
            })
        })
        .collect();
    let mut out = CopyOutcome::default();
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let mut copied_months: BTreeSet<ShardMonth> = BTreeSet::new();
    let mut first_error = None;
    for handle in handles {
        match handle.await {
            Ok(Ok(mut job)) => {
                touched.append(&mut job.topics);
                copied_months.append(&mut job.months);
                out.absorb(job);
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(CopyError::Job(e.to_string()));
            }
        }
    }
    progress.finish_and_clear();
    out.elapsed = started.elapsed();
    if let Some(e) = first_error {
        return Err(e);
    }
    let committed = run.committed.lock().expect("lock").clone();
    let prefix = state::prefix_cursor(committed.values().copied());
    state::raise_cursor(pool, prefix).await?;
    out.finished = state::months(pool)
        .await?
        .iter()
        .filter(|m| committed.contains_key(&m.month))
        .all(|m| m.done);
    if out.finished {
        state::set_status(pool, state::COPIED).await?;
        // Topics a killed earlier run touched are written too.
        touched = sqlx::query_scalar::<_, crate::exact::Exact>(&format!(
            "SELECT DISTINCT topic FROM {TABLE}"
        ))
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(String::from)
        .collect();
        copied_months.extend(committed.keys().next().copied());
        copied_months.extend(committed.keys().next_back().copied());
    }
    let span = copied_months
        .first()
        .copied()
        .zip(copied_months.last().copied());
    out.routes_written = match span {
        Some(span) => write_routes(pool, redis, tenant, &touched, span).await?,
        None => 0,
    };
    Ok(out)
}

/// One job: batches from the months it takes, until none is left, the
/// tickets run out, shutdown or another job's failure.
async fn job(run: &Run) -> Result<JobOutcome, CopyError> {
    let mut conn = run.pool.acquire().await?;
    let conn: &mut MySqlConnection = &mut conn;
    let mut out = JobOutcome::default();
    let mut lane: Option<MonthRun> = None;
    loop {
        if run.stopping() || !run.take_ticket() {
            break;
        }
        if lane.is_none() {
            lane = run.claim(conn).await?;
            if lane.is_none() {
                run.return_ticket();
                break;
            }
        }
        let started = Instant::now();
        // Fill the batch from this month, then from the next ones.
        let mut parts: Vec<Part> = Vec::new();
        let mut want = run.batch_size;
        while want > 0 {
            let Some(month) = lane.take() else {
                break;
            };
            let rows = bulk::read_month(conn, month.state.month, month.state.cursor, want).await?;
            let exhausted = rows.len() < want;
            want -= rows.len();
            if !exhausted {
                lane = Some(month.clone());
            }
            parts.push(Part {
                run: month,
                rows,
                exhausted,
            });
            if exhausted {
                lane = run.claim(conn).await?;
            }
        }
        let rows: usize = parts.iter().map(|p| p.rows.len()).sum();
        if rows == 0 {
            run.return_ticket();
        } else {
            let inserted = commit_with_retry(run, conn, &parts).await?;
            run.committed(&parts);
            out.batches += 1;
            out.rows_read += rows as i64;
            out.rows_inserted += inserted;
            out.batch_times.push(started.elapsed());
            for p in &parts {
                out.topics.extend(p.rows.iter().map(|r| r.topic.clone()));
                if !p.rows.is_empty() {
                    out.months.insert(p.run.state.month);
                }
            }
            run.progress.inc(rows as u64);
            if let (Some(month), Some(last)) = (lane.as_mut(), parts.last()) {
                if last.run.state.month == month.state.month {
                    if let Some(r) = last.rows.last() {
                        month.state.cursor = Some(r.cursor());
                        month.state.fresh_after = month.state.fresh_after.max(Some(r.cursor()));
                    }
                }
            }
        }
        for p in parts.iter().filter(|p| p.exhausted) {
            if rows == 0 {
                run.committed(std::slice::from_ref(p));
            }
            run.finish(conn, &p.run, &mut out).await?;
        }
    }
    Ok(out)
}

/// [`commit_batch`], again after a deadlock or a lock wait timeout (the
/// transaction was rolled back; the batch is the same).
async fn commit_with_retry(
    run: &Run,
    conn: &mut MySqlConnection,
    parts: &[Part],
) -> Result<i64, CopyError> {
    let prefix = run.prefix_with(parts);
    let mut attempt = 0;
    loop {
        attempt += 1;
        match commit_batch(conn, parts, prefix).await {
            Err(CopyError::Db(e)) if bulk::is_lock_conflict(&e) && attempt < LOCK_ATTEMPTS => {
                tracing::info!(attempt, error = %e, "legacy copy: batch lost a lock conflict; running it again");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
            }
            Err(CopyError::Check { cursor, why }) => {
                let to = parts
                    .iter()
                    .rev()
                    .find_map(|p| p.rows.last())
                    .map(LegacyRow::cursor)
                    .unwrap_or_default();
                let batch = Batch {
                    from: cursor,
                    to,
                    rows_read: parts.iter().map(|p| p.rows.len() as i64).sum(),
                    rows_inserted: 0,
                    hash: "",
                };
                let _ = state::failed(&run.pool, &batch, &why).await;
                return Err(CopyError::Check { cursor, why });
            }
            other => return other,
        }
    }
}

/// One batch in one transaction; returns the rows really inserted.
async fn commit_batch(
    conn: &mut MySqlConnection,
    parts: &[Part],
    prefix: Option<Cursor>,
) -> Result<i64, CopyError> {
    let from = parts.first().and_then(|p| p.run.state.cursor);
    let check = |why: String| CopyError::Check { cursor: from, why };
    let mut tx = conn.begin().await?;
    let mut inserted = 0i64;
    let mut digests: Vec<(i64, String)> = Vec::new();
    let mut to = None;
    for part in parts.iter().filter(|p| !p.rows.is_empty()) {
        let (month, table) = (part.run.state.month, &part.run.table);
        let fresh_after = part.run.state.fresh_after;
        let mine: Vec<String> = part.rows.iter().map(LegacyRow::digest).collect();
        // No copy exists after the fresh mark: insert without looking.
        let absent: Vec<&LegacyRow> = if fresh_after.is_none_or(|f| part.rows[0].cursor() > f) {
            part.rows.iter().collect()
        } else {
            let ids: Vec<i64> = part.rows.iter().map(|r| r.id).collect();
            let present = bulk::present_digests(&mut tx, table, &ids).await?;
            let mut absent = Vec::new();
            for (row, digest) in part.rows.iter().zip(&mine) {
                match present.get(&row.id) {
                    None => absent.push(row),
                    Some(copy) if copy == digest => {}
                    Some(_) => {
                        return Err(check(format!(
                            "the copy of legacy id {} ({} seq {}) in {table} differs from it",
                            row.id, row.topic, row.seq
                        )))
                    }
                }
            }
            absent
        };
        match bulk::insert(&mut tx, table, &absent).await {
            Ok(n) if n == absent.len() as u64 => {}
            Ok(n) => {
                return Err(check(format!(
                    "{n} of {} legacy rows stored in {table}",
                    absent.len()
                )))
            }
            Err(e) if bulk::is_duplicate_key(&e) => {
                return Err(check(format!(
                    "a legacy row clashes with a message in {table} (seq or client id taken by another message?): {e}"
                )))
            }
            Err(e) => return Err(e.into()),
        }
        if !absent.is_empty() {
            upsert_mirror(&mut tx, month, &absent).await?;
        }
        let last = part.rows[part.rows.len() - 1].cursor();
        state::advance_month(
            &mut tx,
            month,
            last,
            fresh_after.max(Some(last)).unwrap_or(last),
            part.rows.len() as i64,
        )
        .await?;
        inserted += absent.len() as i64;
        digests.extend(part.rows.iter().map(|r| r.id).zip(mine));
        to = Some(last);
    }
    let Some(to) = to else {
        return Ok(0);
    };
    // The batch's content hash: every row's digest in id order.
    digests.sort_unstable_by_key(|d| d.0);
    let mut hash = Sha256::new();
    for (_, d) in &digests {
        hash.update(d.as_bytes());
    }
    let hash = hex::encode(hash.finalize());
    state::advance(
        &mut tx,
        &Batch {
            from,
            to,
            rows_read: digests.len() as i64,
            rows_inserted: inserted,
            hash: &hash,
        },
        prefix,
    )
    .await?;
    tx.commit().await?;
    Ok(inserted)
}

/// Adds freshly inserted rows to the route mirror (as the store writer does).
async fn upsert_mirror(
    tx: &mut sqlx::Transaction<'_, MySql>,
    month: ShardMonth,
    rows: &[&LegacyRow],
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

/// Legacy rows not copied yet: in each month, the rows after its cursor.
pub async fn remaining(pool: &MySqlPool) -> Result<i64, CopyError> {
    let st = state::load(pool).await?.ok_or(CopyError::NotPlanned)?;
    let cursors: BTreeMap<ShardMonth, Option<Cursor>> = state::months(pool)
        .await?
        .into_iter()
        .map(|m| (m.month, m.cursor))
        .collect();
    let (months, _) = legacy_span(pool).await?;
    let mut n = 0;
    for month in months {
        let cursor = match cursors.get(&month) {
            Some(c) => *c,
            None => state::initial_cursor(st.cursor, month),
        };
        let sql = table::month_remaining_sql(cursor.is_some());
        let mut q = sqlx::query_scalar::<_, i64>(&sql);
        if let Some((at, id)) = cursor {
            q = q.bind(at).bind(at).bind(id);
        }
        n += q
            .bind(month.start().naive_utc())
            .bind(month.end().naive_utc())
            .fetch_one(pool)
            .await?;
    }
    Ok(n)
}
