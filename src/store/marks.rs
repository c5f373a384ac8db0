//! A topic's durable seq mark (`im_seq_marks`, issue 38): the ceiling of
//! every seq Redis may hand out for the topic, reserved here a block at a
//! time before Redis allocates from it (WeChat seqsvr's high-water mark).
//! A Redis that restarted, failed over, came back older or lost every key
//! continues above the mark: no seq is reused, nothing waits or reads the
//! log. Holes are allowed (the unused rest of a block); reuse never.
//!
//! The mark only ever rises (`GREATEST`), also past what Redis reports
//! (after a database failover lost a reservation, the live allocator above
//! it lifts it again). The same row keeps the topic's month floor (shard
//! months never go back) and its delete transaction ids (Tinode's `clear`),
//! which are handed out here, one statement each.
//!
//! Whether a topic without a row is new or only older than the mark is
//! decided by the tenant's [`complete`] flag.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::MySqlPool;

use crate::exact::Exact;

/// A topic's durable mark as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// Every seq ever handed out is <= this.
    pub mark: i64,
    /// The newest shard month of the topic ('' for none yet).
    pub month_floor: String,
}

/// What a reservation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// The new mark: the block is `(mark - block, mark]`.
    pub mark: i64,
    /// The topic had a mark before (an existing topic, not a new one).
    pub existed: bool,
}

/// The topic's mark, `None` when it has none (a new topic, or one from
/// before marks on a tenant that is not [`complete`]).
pub async fn get(pool: &MySqlPool, topic: &str) -> Result<Option<Mark>, sqlx::Error> {
    let row: Option<(Option<i64>, String)> =
        sqlx::query_as("SELECT mark, month_floor FROM im_seq_marks WHERE topic = ?")
            .bind(topic)
            .fetch_optional(pool)
            .await?;
    Ok(row.and_then(|(mark, month_floor)| mark.map(|mark| Mark { mark, month_floor })))
}

/// Reserves the next block of `block` seqs: the mark rises to
/// `max(mark, floor) + block`, and the month floor to at least `month`.
/// `floor` is what the caller knows was handed out already (the live
/// allocator's last seq and block end), so a mark that a database failover
/// set back rises past it again.
pub async fn reserve(
    pool: &MySqlPool,
    topic: &str,
    floor: i64,
    block: i64,
    month: &str,
) -> Result<Reserved, sqlx::Error> {
    let floor = floor.max(0);
    let done = sqlx::query(
        "INSERT INTO im_seq_marks (topic, mark, month_floor) VALUES (?, ?, ?) \
         ON DUPLICATE KEY UPDATE \
           mark = LAST_INSERT_ID(GREATEST(COALESCE(mark, 0), ?) + ?), \
           month_floor = GREATEST(month_floor, ?)",
    )
    .bind(topic)
    .bind(floor + block)
    .bind(month)
    .bind(floor)
    .bind(block)
    .bind(month)
    .execute(pool)
    .await?;
    // 1: inserted; 2: updated (the mark always rises, so never 0).
    Ok(if done.rows_affected() == 1 {
        Reserved {
            mark: floor + block,
            existed: false,
        }
    } else {
        Reserved {
            mark: done.last_insert_id() as i64,
            existed: true,
        }
    })
}

/// Reserves one more block for each of `topics` at once (a bulk restore):
/// `(topic, old mark, month floor)` for every topic that has a mark, in
/// one transaction of two statements. Seqs `(old, old + block]` are the
/// topic's to hand out.
pub async fn reserve_many(
    pool: &MySqlPool,
    topics: &[String],
    block: i64,
) -> Result<Vec<(String, i64, String)>, sqlx::Error> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let marks = placeholders(topics.len());
    let mut tx = pool.begin().await?;
    let select_sql = format!(
        "SELECT topic, mark, month_floor FROM im_seq_marks \
         WHERE topic IN ({marks}) AND mark IS NOT NULL FOR UPDATE"
    );
    let mut select = sqlx::query_as::<_, (Exact, i64, String)>(&select_sql);
    for t in topics {
        select = select.bind(t);
    }
    let found = select.fetch_all(&mut *tx).await?;
    let update_sql = format!(
        "UPDATE im_seq_marks SET mark = mark + ? WHERE topic IN ({marks}) AND mark IS NOT NULL"
    );
    let mut update = sqlx::query(&update_sql).bind(block);
    for t in topics {
        update = update.bind(t);
    }
    update.execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(found
        .into_iter()
        .map(|(t, mark, floor)| (t.into_string(), mark, floor))
        .collect())
}

/// Topics with a mark after `after` (in byte order), at most `limit`: a
/// bulk restore walks them page by page.
pub async fn topics_after(
    pool: &MySqlPool,
    after: &str,
    limit: usize,
) -> Result<Vec<String>, sqlx::Error> {
    let rows: Vec<Exact> = sqlx::query_scalar(
        "SELECT topic FROM im_seq_marks WHERE topic > ? AND mark IS NOT NULL \
         ORDER BY topic LIMIT ?",
    )
    .bind(after)
    .bind(limit as i64)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(Exact::into_string).collect())
}

/// The topic's next delete transaction id (Tinode's `clear`, from 1), never
/// one handed out before, also after Redis forgot: `floor` is the last one
/// a counter kept elsewhere handed out (the Redis counter of a topic from
/// before marks), so the ids go on from it.
pub async fn next_del_id(pool: &MySqlPool, topic: &str, floor: i64) -> Result<i32, sqlx::Error> {
    let floor = floor.clamp(0, i32::MAX as i64 - 1);
    let done = sqlx::query(
        "INSERT INTO im_seq_marks (topic, mark, del_mark) VALUES (?, NULL, ?) \
         ON DUPLICATE KEY UPDATE del_mark = LAST_INSERT_ID(GREATEST(del_mark, ?) + 1)",
    )
    .bind(topic)
    .bind(floor + 1)
    .bind(floor)
    .execute(pool)
    .await?;
    Ok(if done.rows_affected() == 1 {
        (floor + 1) as i32
    } else {
        done.last_insert_id() as i32
    })
}

/// Whether every topic and group of the tenant has had its durable state
/// from its first use (`im_write_state`, set by the migration that made
/// these tables on an empty database). There, a topic without a mark is
/// new and a name without a model row is no group. Cached per database
/// for a minute (it only ever turns true by a migration).
pub async fn complete(pool: &MySqlPool) -> Result<bool, sqlx::Error> {
    static CACHE: std::sync::LazyLock<Mutex<HashMap<String, (bool, Instant)>>> =
        std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));
    let key = pool_key(pool);
    if let Some((v, at)) = CACHE.lock().expect("cache").get(&key) {
        if at.elapsed() < Duration::from_secs(60) {
            return Ok(*v);
        }
    }
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_write_state WHERE id = 1")
        .fetch_one(pool)
        .await?;
    let v = n > 0;
    CACHE
        .lock()
        .expect("cache")
        .insert(key, (v, Instant::now()));
    Ok(v)
}

/// One key per database a pool reaches (its connect options).
fn pool_key(pool: &MySqlPool) -> String {
    format!("{:?}", pool.connect_options())
}

/// `?, ?, …` for `n` values.
pub(crate) fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}
