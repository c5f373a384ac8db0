//! The store pipeline's transaction (seed 000 §5.2): for one tenant and one
//! shard month, in one transaction, the cross-month dedup rows, the insert
//! into the month table (a duplicate key leaves the stored row; any other
//! refusal fails the write), and the route-mirror upsert that counts only
//! rows really inserted. Correct under any order and under redelivery.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{TimeZone, Utc};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{MySql, QueryBuilder, Row, Transaction};

use super::message::NewMessage;

use super::catalog::{self, ShardStatus};
use super::month::{Family, MonthTable, ShardMonth};

/// Rows per multi-row INSERT.
const INSERT_CHUNK: usize = 500;
/// How long a dedup row protects a client message id across months.
const DEDUP_RETENTION_DAYS: i64 = 30;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("illegal shard month: {0}")]
    IllegalMonth(#[from] super::month::MonthError),
    #[error("month table for {0} does not exist yet")]
    MissingTable(ShardMonth),
    #[error("month {0} is {1}; the event needs compensation")]
    Sealed(ShardMonth, ShardStatus),
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

impl StoreError {
    /// Whether this is an outage (retried without a limit) rather than a
    /// record that can never be stored: a month table the shard manager
    /// has not made yet is an outage; the database and Redis are classified
    /// by `tenant::db_failure` and `failure::redis_failure`.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::MissingTable(_) => true,
            StoreError::Redis(e) => crate::failure::redis_failure(e).is_outage(),
            StoreError::Db(e) => crate::tenant::db_failure(e).is_outage(),
            StoreError::IllegalMonth(_) | StoreError::Sealed(..) => false,
        }
    }
}

/// One route-mirror row after the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorRow {
    pub topic: String,
    pub month: ShardMonth,
    pub min_seq: i64,
    pub max_seq: i64,
    pub count: i64,
}

/// What a write did.
#[derive(Debug, Default)]
pub struct WriteOutcome {
    pub inserted: usize,
    /// Already stored (redelivery, replay).
    pub already_stored: usize,
    /// Same client message id stored under another seq (a retry that got a
    /// new seq): not stored again.
    pub dedup_hits: usize,
    /// Messages whose `(topic, seq)` another message already holds: kept in
    /// `im_seq_collisions` (see [`record_collisions`]), never dropped.
    pub collisions: Vec<Collision>,
    pub mirror: Vec<MirrorRow>,
}

/// Checks the catalog: the month's table must exist and accept writes.
pub async fn writable_table(pool: &MySqlPool, month: ShardMonth) -> Result<MonthTable, StoreError> {
    match catalog::table(pool, month).await? {
        None => Err(StoreError::MissingTable(month)),
        Some((_, status)) if !status.accepts_writes() => Err(StoreError::Sealed(month, status)),
        Some((table, _)) => Ok(table),
    }
}

/// Stores every message of one shard month in one transaction.
pub async fn write_month(
    pool: &MySqlPool,
    month: ShardMonth,
    messages: &[NewMessage<'_>],
) -> Result<WriteOutcome, StoreError> {
    let table = writable_table(pool, month).await?;
    let mut tx = pool.begin().await?;
    // Group and one-to-one messages go to their own family's table.
    let result = async {
        let mut total = WriteOutcome::default();
        for family in Family::ALL {
            let batch: Vec<NewMessage<'_>> = messages
                .iter()
                .filter(|m| Family::of_topic(m.topic) == family)
                .cloned()
                .collect();
            if batch.is_empty() {
                continue;
            }
            let outcome = write_in_tx(&mut tx, &table.of_family(family), &batch).await?;
            total.inserted += outcome.inserted;
            total.already_stored += outcome.already_stored;
            total.dedup_hits += outcome.dedup_hits;
            total.collisions.extend(outcome.collisions);
            total.mirror.extend(outcome.mirror);
        }
        Ok::<_, StoreError>(total)
    }
    .await;
    match result {
        Ok(outcome) => {
            tx.commit().await?;
            Ok(outcome)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(match e {
                StoreError::Db(sqlx::Error::Database(db))
                    if db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|m| m.number() == 1146) =>
                {
                    StoreError::MissingTable(month)
                }
                other => other,
            })
        }
    }
}

async fn write_in_tx(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    messages: &[NewMessage<'_>],
) -> Result<WriteOutcome, StoreError> {
    let mut outcome = WriteOutcome::default();

    // 1. Cross-month dedup: a client message id already stored under another
    //    seq is a duplicate; within the batch the first occurrence wins.
    let claimed = existing_dedup(tx, messages).await?;
    let mut seen_cmid: HashSet<(&str, i64, &str)> = HashSet::new();
    let mut candidates: Vec<&NewMessage<'_>> = Vec::with_capacity(messages.len());
    for m in messages {
        if let Some(cmid) = m.msg.client_msg_id.as_deref() {
            let key = (m.topic, m.msg.from_user, cmid);
            let stored_seq = claimed.get(&(m.topic.to_string(), m.msg.from_user, cmid.to_string()));
            if stored_seq.is_some_and(|s| *s != m.msg.seq) || !seen_cmid.insert(key) {
                outcome.dedup_hits += 1;
                continue;
            }
        }
        candidates.push(m);
    }
    insert_dedup(tx, table.month(), &candidates).await?;

    // 2. Which (topic, seq) are stored already: by this very message (a
    //    redelivery, a replay) or by another one (a seq handed out twice: a
    //    collision, kept aside whole, never dropped).
    let before = rows_present(tx, table, &candidates).await?;
    let mut colliding = Vec::new();
    let mut fresh: Vec<&NewMessage<'_>> = Vec::with_capacity(candidates.len());
    for m in candidates.iter().copied() {
        match before.get(&(m.topic.to_string(), m.msg.seq)) {
            None => fresh.push(m),
            Some(held) if *held == m.msg.message_id => outcome.already_stored += 1,
            Some(held) => colliding.push((m, *held)),
        }
    }
    outcome.collisions = record_collisions(tx, table.month(), &colliding).await?;

    // 3. Insert; count what really went in. (The affected-rows count says
    //    nothing here: the connection reports found rows.) Message ids are
    //    unique, so a fresh message whose id has a row now is ours.
    let mut ours = 0usize;
    for chunk in fresh.chunks(INSERT_CHUNK) {
        insert_messages(tx, table, chunk).await?;
        ours += count_message_ids(tx, table, chunk).await?;
    }
    let inserted: Vec<&NewMessage<'_>> = if ours == fresh.len() {
        fresh
    } else {
        // Some rows were kept out by another unique key (a client id stored
        // under another seq without a dedup row): keep only rows now ours.
        let after = rows_present(tx, table, &fresh).await?;
        outcome.dedup_hits += fresh.len() - ours;
        fresh
            .into_iter()
            .filter(|m| after.get(&(m.topic.to_string(), m.msg.seq)) == Some(&m.msg.message_id))
            .collect()
    };
    outcome.inserted = inserted.len();

    // 4. Route mirror: one upsert per topic, counting only inserted rows.
    outcome.mirror = upsert_mirror(tx, table.month(), &inserted).await?;

    // 5. Topics with nothing new (a redelivery, e.g. after a crash between
    //    the commit and the Redis route write) report their mirror row as it
    //    is, so the route is written again rather than left stale.
    let reported: HashSet<&str> = outcome.mirror.iter().map(|r| r.topic.as_str()).collect();
    let quiet: BTreeSet<&str> = messages
        .iter()
        .map(|m| m.topic)
        .filter(|t| !reported.contains(t))
        .collect();
    for topic in quiet {
        if let Some(row) = mirror_row(tx, topic, table.month()).await? {
            outcome.mirror.push(row);
        }
    }
    Ok(outcome)
}

/// A message that found its `(topic, seq)` held by another message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collision {
    pub topic: String,
    pub seq: i64,
    pub message_id: i64,
    pub event_id: String,
    pub client_msg_id: Option<String>,
    pub held_by_message_id: i64,
}

/// Keeps each colliding message whole in `im_seq_collisions` (once per
/// message id: a redelivery changes nothing), for an operator to repair.
async fn record_collisions(
    tx: &mut Transaction<'_, MySql>,
    month: ShardMonth,
    colliding: &[(&NewMessage<'_>, i64)],
) -> Result<Vec<Collision>, StoreError> {
    if colliding.is_empty() {
        return Ok(Vec::new());
    }
    let month = month.to_string();
    let now = Utc::now().naive_utc();
    for chunk in colliding.chunks(INSERT_CHUNK) {
        let mut q: QueryBuilder<MySql> = QueryBuilder::new(
            "INSERT INTO im_seq_collisions (message_id, topic, seqid, shard_month, held_by_message_id, \
             event_id, from_user, client_msg_id, msg_type, content, head, created_at, detected_at) ",
        );
        q.push_values(chunk, |mut b, (m, held)| {
            b.push_bind(m.msg.message_id)
                .push_bind(m.topic)
                .push_bind(m.msg.seq)
                .push_bind(&month)
                .push_bind(*held)
                .push_bind(m.event_id)
                .push_bind(m.msg.from_user)
                .push_bind(m.msg.client_msg_id.as_deref())
                .push_bind(&m.msg.msg_type)
                .push_bind(json_or_null(m.msg.content.as_deref()))
                .push_bind(json_or_null(m.msg.head.as_deref()))
                .push_bind(datetime(m.msg.created_at))
                .push_bind(now);
        });
        q.push(" ON DUPLICATE KEY UPDATE message_id = message_id");
        q.build().execute(&mut **tx).await?;
    }
    Ok(colliding
        .iter()
        .map(|(m, held)| Collision {
            topic: m.topic.to_string(),
            seq: m.msg.seq,
            message_id: m.msg.message_id,
            event_id: m.event_id.to_string(),
            client_msg_id: m.msg.client_msg_id.clone(),
            held_by_message_id: *held,
        })
        .collect())
}

/// One topic's mirror row for a month, if it has one.
async fn mirror_row(
    tx: &mut Transaction<'_, MySql>,
    topic: &str,
    month: ShardMonth,
) -> Result<Option<MirrorRow>, StoreError> {
    let row = sqlx::query(
        "SELECT min_seq, max_seq, message_count FROM im_group_message_topic_shards WHERE topic = ? AND shard_month = ?",
    )
    .bind(topic)
    .bind(month.to_string())
    .fetch_optional(&mut **tx)
    .await?;
    row.map(|row| {
        Ok(MirrorRow {
            topic: topic.to_string(),
            month,
            min_seq: row.try_get(0)?,
            max_seq: row.try_get(1)?,
            count: row.try_get(2)?,
        })
    })
    .transpose()
}

type DedupKey = (String, i64, String);

async fn existing_dedup(
    tx: &mut Transaction<'_, MySql>,
    messages: &[NewMessage<'_>],
) -> Result<HashMap<DedupKey, i64>, StoreError> {
    let with_cmid: Vec<_> = messages
        .iter()
        .filter_map(|m| {
            m.msg
                .client_msg_id
                .as_deref()
                .map(|c| (m.topic, m.msg.from_user, c))
        })
        .collect();
    let mut out = HashMap::new();
    for chunk in with_cmid.chunks(INSERT_CHUNK) {
        let mut q: QueryBuilder<MySql> = QueryBuilder::new(
            "SELECT topic, from_user, client_msg_id, seqid FROM im_group_message_dedup WHERE (topic, from_user, client_msg_id) IN ",
        );
        q.push_tuples(chunk, |mut b, (topic, uid, cmid)| {
            b.push_bind(*topic).push_bind(*uid).push_bind(*cmid);
        });
        for row in q.build().fetch_all(&mut **tx).await? {
            out.insert(
                (
                    row.try_get::<crate::exact::Exact, _>(0)?.into(),
                    row.try_get(1)?,
                    row.try_get::<crate::exact::Exact, _>(2)?.into(),
                ),
                row.try_get::<i64, _>(3)?,
            );
        }
    }
    Ok(out)
}

async fn insert_dedup(
    tx: &mut Transaction<'_, MySql>,
    month: ShardMonth,
    messages: &[&NewMessage<'_>],
) -> Result<(), StoreError> {
    let rows: Vec<_> = messages
        .iter()
        .filter(|m| m.msg.client_msg_id.is_some())
        .collect();
    let expires = Utc::now() + chrono::Duration::days(DEDUP_RETENTION_DAYS);
    let month = month.to_string();
    for chunk in rows.chunks(INSERT_CHUNK) {
        let mut q: QueryBuilder<MySql> = QueryBuilder::new(
            "INSERT INTO im_group_message_dedup (topic, from_user, client_msg_id, seqid, shard_month, message_id, status, expires_at) ",
        );
        q.push_values(chunk, |mut b, m| {
            b.push_bind(m.topic)
                .push_bind(m.msg.from_user)
                .push_bind(m.msg.client_msg_id.as_deref())
                .push_bind(m.msg.seq)
                .push_bind(&month)
                .push_bind(m.msg.message_id)
                .push_bind("done")
                .push_bind(expires.naive_utc());
        });
        // The first seq stored for a client id stays its seq.
        q.push(" ON DUPLICATE KEY UPDATE seqid = seqid");
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

/// `(topic, seq) → message_id` of the rows present for these messages.
async fn rows_present(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    messages: &[&NewMessage<'_>],
) -> Result<HashMap<(String, i64), i64>, StoreError> {
    let mut by_topic: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for m in messages {
        by_topic.entry(m.topic).or_default().push(m.msg.seq);
    }
    let mut out = HashMap::new();
    for (topic, seqs) in by_topic {
        for chunk in seqs.chunks(INSERT_CHUNK) {
            let sql = table.rows_by_seq_sql(chunk.len());
            let mut q = sqlx::query(&sql).bind(topic);
            for s in chunk {
                q = q.bind(s);
            }
            for row in q.fetch_all(&mut **tx).await? {
                let row: MySqlRow = row;
                out.insert((topic.to_string(), row.try_get(0)?), row.try_get(1)?);
            }
        }
    }
    Ok(out)
}

/// Epoch milliseconds as a UTC `DATETIME(3)` value.
pub fn naive(ms: i64) -> chrono::NaiveDateTime {
    datetime(ms)
}

fn datetime(ms: i64) -> chrono::NaiveDateTime {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
        .naive_utc()
}

/// How many of these messages have their row (by message id).
async fn count_message_ids(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    rows: &[&NewMessage<'_>],
) -> Result<usize, StoreError> {
    let sql = table.count_message_ids_sql(rows.len());
    let mut q = sqlx::query_scalar::<_, i64>(&sql);
    for m in rows {
        q = q.bind(m.msg.message_id);
    }
    Ok(q.fetch_one(&mut **tx).await? as usize)
}

async fn insert_messages(
    tx: &mut Transaction<'_, MySql>,
    table: &MonthTable,
    rows: &[&NewMessage<'_>],
) -> Result<u64, StoreError> {
    let sql = table.insert_sql(rows.len());
    let mut q = sqlx::query(&sql);
    for m in rows {
        let msg = m.msg;
        let mentions = if msg.mentioned_user_ids.is_empty() {
            None
        } else {
            Some(serde_json::to_string(&msg.mentioned_user_ids).unwrap_or_default())
        };
        let created = datetime(msg.created_at);
        q = q
            .bind(msg.message_id)
            .bind(m.topic)
            .bind(msg.group_id)
            .bind(msg.seq)
            .bind(msg.from_user)
            .bind(msg.client_msg_id.as_deref())
            .bind(&msg.msg_type)
            .bind("normal")
            .bind(json_or_null(msg.content.as_deref()))
            .bind(json_or_null(msg.head.as_deref()))
            .bind(mentions)
            .bind(msg.mention_all)
            .bind(msg.reply_seq)
            .bind(msg.root_seq)
            .bind(msg.file_count)
            .bind(msg.content_size)
            .bind(msg.has_risk)
            .bind(&msg.audit_status)
            .bind(1i32)
            .bind(msg.expires_at.map(datetime))
            .bind(created)
            .bind(created);
    }
    Ok(q.execute(&mut **tx).await?.rows_affected())
}

/// JSON columns take only valid JSON; anything else is stored as a JSON string.
fn json_or_null(text: Option<&str>) -> Option<String> {
    let text = text?;
    if serde_json::from_str::<serde_json::Value>(text).is_ok() {
        Some(text.to_string())
    } else {
        Some(serde_json::Value::String(text.to_string()).to_string())
    }
}

async fn upsert_mirror(
    tx: &mut Transaction<'_, MySql>,
    month: ShardMonth,
    inserted: &[&NewMessage<'_>],
) -> Result<Vec<MirrorRow>, StoreError> {
    #[derive(Default)]
    struct Agg {
        min_seq: i64,
        max_seq: i64,
        count: i64,
        min_at: i64,
        max_at: i64,
    }
    let mut per_topic: BTreeMap<&str, Agg> = BTreeMap::new();
    for m in inserted {
        let a = per_topic.entry(m.topic).or_insert(Agg {
            min_seq: i64::MAX,
            max_seq: i64::MIN,
            count: 0,
            min_at: i64::MAX,
            max_at: i64::MIN,
        });
        a.min_seq = a.min_seq.min(m.msg.seq);
        a.max_seq = a.max_seq.max(m.msg.seq);
        a.count += 1;
        a.min_at = a.min_at.min(m.msg.created_at);
        a.max_at = a.max_at.max(m.msg.created_at);
    }
    let month_text = month.to_string();
    let mut out = Vec::with_capacity(per_topic.len());
    for (topic, a) in per_topic {
        sqlx::query(
            "INSERT INTO im_group_message_topic_shards \
             (topic, shard_month, min_seq, max_seq, message_count, min_created_at, max_created_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE \
             min_seq = LEAST(min_seq, VALUES(min_seq)), \
             max_seq = GREATEST(max_seq, VALUES(max_seq)), \
             message_count = message_count + VALUES(message_count), \
             min_created_at = LEAST(min_created_at, VALUES(min_created_at)), \
             max_created_at = GREATEST(max_created_at, VALUES(max_created_at))",
        )
        .bind(topic)
        .bind(&month_text)
        .bind(a.min_seq)
        .bind(a.max_seq)
        .bind(a.count)
        .bind(datetime(a.min_at))
        .bind(datetime(a.max_at))
        .execute(&mut **tx)
        .await?;
        out.extend(mirror_row(tx, topic, month).await?);
    }
    Ok(out)
}
