//! Re-seeding a topic's seq allocator when its Redis state is missing
//! (ARCHITECTURE.md §3, "two traps"). The new `last_seq` must exceed every
//! seq ever acked, so it is the maximum of
//!
//! - the MySQL route mirror (everything the store pipeline committed),
//! - the uncommitted tail of the event log (acked, not yet stored), and,
//!   when the state was lost (the tenant's Redis dataset is young, or the
//!   topic already has messages, so it had an allocator that is gone now),
//!   only after the in-flight window (a send that allocated from the old
//!   state either acks or fails within the producer's delivery timeout)
//!   plus a safety margin. Only a topic without any message is new; one
//!   with no stored message and no hot index or month route in Redis is
//!   taken as new without reading the log (anyone can name a new topic, so
//!   a first send must be cheap). Log scans read only the topic's
//!   partition, at most `limits.reseed_scans` at once per process, and
//!   skip records nobody can decode.
//!
//! A topic whose state Redis still has, but written by another incarnation
//! of Redis (a restart, a promoted replica: `lua/allocate_seq.lua` answers
//! `FENCED`), is re-derived the same way as lost state: that state may be
//! older than what was acknowledged, so after the in-flight window the new
//! `last_seq` is the maximum of the stale one, the mirror and the log tail,
//! plus the margin; and the client message id claims of every message past
//! the stale `last_seq` (from the log tail and the month tables) are put
//! back, so a retry of a message that was stored is answered with its seq.
//!
//! A hole in the seqs is fine; a reused seq never is. Until the re-seed is
//! done, sends get a retryable error.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::kafka::producer::IN_FLIGHT_WINDOW_MS;
use crate::keys::{TopicKeys, CLAIM_TTL_MS};
use crate::redis_util::generation::generation_age_ms;
use crate::redis_util::RedisLock;

use super::{SendError, Sender};

/// Added to the recovered maximum when Redis lost data, for safety.
pub const MARGIN_AFTER_LOSS: i64 = 1000;
/// How long a send waits for a quick re-seed (new topics) before answering
/// "retry".
const INLINE_WAIT: Duration = Duration::from_secs(3);

static SEED_SEQ: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/seed_seq.lua")));
static SEQ_STATE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/seq_state.lua")));

/// A topic's seq state in Redis, and the incarnation that answered.
struct SeqState {
    last_seq: Option<i64>,
    month_floor: Option<String>,
    /// The incarnation (run_id) that wrote it; `None` before fencing existed.
    inc: Option<String>,
    run_id: String,
}

impl SeqState {
    async fn read(
        redis: &mut crate::redis_util::Redis,
        keys: &TopicKeys,
    ) -> redis::RedisResult<Self> {
        let v: Vec<String> = SEQ_STATE.key(keys.seq()).invoke_async(redis).await?;
        let get = |i: usize| v.get(i).filter(|s| !s.is_empty()).cloned();
        Ok(SeqState {
            last_seq: get(0).and_then(|s| s.parse().ok()),
            month_floor: get(1),
            inc: get(2),
            run_id: get(3).unwrap_or_default(),
        })
    }

    /// Written by the incarnation that answers now: allocations may go on.
    fn live(&self) -> bool {
        self.last_seq.is_some() && self.inc.as_deref() == Some(self.run_id.as_str())
    }
}

/// Re-seeds in progress in this process.
#[derive(Default, Clone)]
pub struct Reseeds {
    running: Arc<Mutex<HashSet<(String, String)>>>,
}

impl Reseeds {
    /// Starts (or joins) the re-seed of one topic; returns `Ok` once it is
    /// done, or a retryable error while it is still running.
    pub async fn reseed(
        &self,
        sender: &Sender,
        tenant: &str,
        topic: &str,
    ) -> Result<(), SendError> {
        let key = (tenant.to_string(), topic.to_string());
        let fresh = self.running.lock().expect("lock").insert(key.clone());
        if !fresh {
            return Err(SendError::Retryable(
                "re-seeding this topic's seq; retry shortly".into(),
            ));
        }
        let sender = sender.clone();
        let running = self.running.clone();
        let task = tokio::spawn(async move {
            let result = reseed_topic(&sender, &key.0, &key.1).await;
            running.lock().expect("lock").remove(&key);
            if let Err(e) = &result {
                tracing::warn!(tenant = %key.0, topic = %key.1, error = %e, "seq re-seed failed");
            }
            result
        });
        match tokio::time::timeout(INLINE_WAIT, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(SendError::Retryable("re-seed task failed".into())),
            Err(_) => Err(SendError::Retryable(
                "re-seeding this topic's seq after a Redis data loss; retry shortly".into(),
            )),
        }
    }
}

async fn reseed_topic(sender: &Sender, tenant: &str, topic: &str) -> Result<(), SendError> {
    let retry = |e: &dyn std::fmt::Display| SendError::Retryable(format!("re-seed: {e}"));
    let mut redis = sender.redis();
    let keys = TopicKeys::new(tenant, topic);
    let Some(lock) = RedisLock::acquire(&mut redis, &keys.reseed_lock(), 120_000)
        .await
        .map_err(|e| retry(&e))?
    else {
        return Err(SendError::Retryable(
            "another gateway is re-seeding this topic".into(),
        ));
    };
    let result = async {
        // A send that saw the allocator missing or fenced may get here after
        // another re-seed (this gateway's or another's) installed it: then it
        // is live and must not be recomputed, since sends allocated from it
        // may not be in the log yet.
        let state = SeqState::read(&mut redis, &keys)
            .await
            .map_err(|e| retry(&e))?;
        if state.live() {
            return Ok(());
        }
        if let Some(stale) = state.last_seq {
            return refence(sender, &mut redis, tenant, topic, &keys, &state, stale).await;
        }
        let generation_age = generation_age_ms(&mut redis, tenant)
            .await
            .map_err(|e| retry(&e))?;
        // A young dataset means Redis lost its data recently.
        let mut data_loss = generation_age < IN_FLIGHT_WINDOW_MS;
        let mut wait = (IN_FLIGHT_WINDOW_MS - generation_age).max(0);
        let mut found = None;
        if !data_loss {
            // The dataset is old, yet this topic's allocator is gone. A topic
            // with messages had one, so it was lost on its own (evicted, its
            // slot failed over, the keys deleted one by one) at a moment we
            // cannot know: wait out a whole in-flight window. Only a topic
            // with no message anywhere is new.
            // Anyone can name a new topic (`usr<N>`): one with no stored
            // message and no other trace of messages (hot index, month
            // routes) is new without reading the log.
            let stored = recover_stored(sender, tenant, topic).await?;
            let traces = has_message_traces(&mut redis, &keys)
                .await
                .map_err(|e| retry(&e))?;
            let now = if stored.seq == 0 && !traces {
                stored
            } else {
                recover(sender, tenant, topic).await?
            };
            if now.seq > 0 {
                data_loss = true;
                wait = IN_FLIGHT_WINDOW_MS;
            } else {
                found = Some(now);
            }
        }
        let found = match found {
            Some(f) => f,
            None => {
                tracing::warn!(
                    tenant,
                    topic,
                    wait_ms = wait,
                    "Redis lost this topic's seq state; waiting out in-flight sends"
                );
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
                recover(sender, tenant, topic).await?
            }
        };
        let last_seq = found.seq + if data_loss { MARGIN_AFTER_LOSS } else { 0 };
        let month_floor = found.month;
        let installed: i64 = SEED_SEQ
            .key(keys.seq())
            .arg(last_seq)
            .arg(month_floor.as_deref().unwrap_or(""))
            .arg("")
            .arg(0)
            .invoke_async(&mut redis)
            .await
            .map_err(|e| retry(&e))?;
        if installed == 0 {
            tracing::warn!(
                tenant,
                topic,
                "seq allocator appeared during the re-seed; kept it"
            );
            return Ok(());
        }
        tracing::info!(
            tenant,
            topic,
            last_seq,
            ?month_floor,
            scanned = found.scanned,
            data_loss,
            "seq allocator re-seeded"
        );
        Ok(())
    }
    .await;
    let _ = lock.release(&mut redis).await;
    result
}

/// Re-derives a topic's seq state that another incarnation of Redis wrote
/// (see the module docs): waits out the in-flight window, recovers the
/// highest seq any acked send can have, puts back the claims of every
/// message past the stale `last_seq`, then installs the new allocator if
/// the state is still the stale one.
async fn refence(
    sender: &Sender,
    redis: &mut crate::redis_util::Redis,
    tenant: &str,
    topic: &str,
    keys: &TopicKeys,
    state: &SeqState,
    stale: i64,
) -> Result<(), SendError> {
    let retry = |e: &dyn std::fmt::Display| SendError::Retryable(format!("re-seed: {e}"));
    metrics::counter!(crate::metrics::SEQ_FENCES_TOTAL).increment(1);
    tracing::warn!(
        tenant,
        topic,
        stale_last_seq = stale,
        written_by = state.inc.as_deref().unwrap_or("-"),
        now = %state.run_id,
        wait_ms = IN_FLIGHT_WINDOW_MS,
        "seq state written by another incarnation of Redis (a restart or a failover); \
         re-deriving it from the log before the next seq"
    );
    // Sends allocated by the old incarnation ack or fail within the window
    // after their allocation, which was before this incarnation answered.
    tokio::time::sleep(Duration::from_millis(IN_FLIGHT_WINDOW_MS as u64)).await;
    let found = recover(sender, tenant, topic).await?;
    let mut claims = found
        .sent
        .iter()
        .filter(|m| m.seq > stale)
        .filter_map(|m| {
            let cmid = m.client_msg_id.as_deref()?;
            Some((
                keys.uniq(m.from_user, cmid),
                done_claim(m.seq, &m.month, m.message_id),
            ))
        })
        .collect::<Vec<_>>();
    claims.extend(
        stored_claims(sender, tenant, topic, keys, stale)
            .await
            .map_err(|e| retry(&e))?,
    );
    // Claims first (SET NX: a claim this incarnation already has stays);
    // no send allocates before the state below is installed.
    for chunk in claims.chunks(500) {
        let mut pipe = redis::pipe();
        for (key, value) in chunk {
            pipe.cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(CLAIM_TTL_MS)
                .ignore();
        }
        let _: () = pipe.query_async(redis).await.map_err(|e| retry(&e))?;
    }
    let last_seq = found.seq.max(stale) + MARGIN_AFTER_LOSS;
    let month_floor = found
        .month
        .into_iter()
        .chain(state.month_floor.clone())
        .max();
    let installed: i64 = SEED_SEQ
        .key(keys.seq())
        .arg(last_seq)
        .arg(month_floor.as_deref().unwrap_or(""))
        .arg(state.inc.as_deref().unwrap_or("-"))
        .arg(0)
        .invoke_async(redis)
        .await
        .map_err(|e| retry(&e))?;
    if installed == 0 {
        tracing::warn!(
            tenant,
            topic,
            "seq state changed during the re-seed; kept it"
        );
        return Ok(());
    }
    tracing::info!(
        tenant,
        topic,
        stale_last_seq = stale,
        last_seq,
        claims = claims.len(),
        scanned = found.scanned,
        "seq state re-derived after a Redis incarnation change"
    );
    Ok(())
}

/// A claim of a message known to be in the log: answered with its seq on a
/// retry (the four-field form, which carries no content digest).
fn done_claim(seq: i64, month: &str, message_id: i64) -> String {
    format!("done|{seq}|{month}|{message_id}")
}

/// Claims of the topic's stored messages past `after`: the month tables of
/// the mirror's months that reach past it.
async fn stored_claims(
    sender: &Sender,
    tenant: &str,
    topic: &str,
    keys: &TopicKeys,
    after: i64,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let Ok(pool) = sender.pools().get(tenant) else {
        return Ok(Vec::new());
    };
    let months: Vec<String> = sqlx::query_scalar(
        "SELECT shard_month FROM im_group_message_topic_shards WHERE topic = ? AND max_seq > ?",
    )
    .bind(topic)
    .bind(after)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::new();
    for month in months {
        let Ok(month) = crate::store::month::ShardMonth::parse(&month) else {
            continue;
        };
        let Some((table, _)) = crate::store::catalog::table(pool, month).await? else {
            continue;
        };
        let rows: Vec<(i64, crate::exact::Exact, i64, i64)> = sqlx::query_as(&format!(
            "SELECT from_user, client_msg_id, seqid, message_id FROM `{}` \
             WHERE topic = ? AND seqid > ? AND client_msg_id IS NOT NULL",
            table.for_topic(topic).name()
        ))
        .bind(topic)
        .bind(after)
        .fetch_all(pool)
        .await?;
        let month = month.to_string();
        out.extend(rows.into_iter().map(|(from, cmid, seq, message_id)| {
            (keys.uniq(from, &cmid), done_claim(seq, &month, message_id))
        }));
    }
    Ok(out)
}

/// The highest seq and month of a topic that any acked send can have: the
/// MySQL mirror (stored), the log tail the store pipeline has not
/// committed yet, and — during a legacy migration — the legacy table.
struct Recovered {
    seq: i64,
    month: Option<String>,
    scanned: u64,
    /// The messages of the log tail.
    sent: Vec<crate::kafka::log_tail::TailSent>,
}

async fn recover(sender: &Sender, tenant: &str, topic: &str) -> Result<Recovered, SendError> {
    let retry = |e: &dyn std::fmt::Display| SendError::Retryable(format!("re-seed: {e}"));
    let stored = recover_stored(sender, tenant, topic).await?;
    let config = sender.config();
    // Scans are bounded per process (`limits.reseed_scans`); the others
    // wait (their sends get "retry" meanwhile).
    let scans =
        SCANS.get_or_init(|| tokio::sync::Semaphore::new(config.limits.reseed_scans.max(1)));
    let _permit = scans.acquire().await.map_err(|e| retry(&e))?;
    let store_group = format!("{}.store", config.pipelines.group_prefix);
    let tail = crate::kafka::log_tail::max_in_tail(
        config,
        &store_group,
        &format!("{tenant}:{topic}"),
        sender.producer().codec(),
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| retry(&e))?;
    Ok(Recovered {
        seq: stored.seq.max(tail.seq.unwrap_or(0)),
        month: stored.month.into_iter().chain(tail.month).max(),
        scanned: tail.scanned,
        sent: tail.sent,
    })
}

/// Concurrent log-tail scans of this process.
static SCANS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();

/// Whether the topic's Redis state shows it had messages (its hot index
/// or month routes) although its allocator is gone.
async fn has_message_traces(
    redis: &mut crate::redis_util::Redis,
    keys: &TopicKeys,
) -> redis::RedisResult<bool> {
    let n: i64 = redis::cmd("EXISTS")
        .arg(keys.hot_seqs())
        .arg(keys.route())
        .query_async(redis)
        .await?;
    Ok(n > 0)
}

/// The highest stored seq and month: the MySQL route mirror and, during a
/// legacy migration, the legacy table (no log scan).
async fn recover_stored(
    sender: &Sender,
    tenant: &str,
    topic: &str,
) -> Result<Recovered, SendError> {
    let retry = |e: &dyn std::fmt::Display| SendError::Retryable(format!("re-seed: {e}"));
    let pool = sender.pools().get(tenant).map_err(|e| retry(&e))?;
    let (mirror_seq, mirror_month): (Option<i64>, Option<String>) = sqlx::query_as(
        "SELECT MAX(max_seq), MAX(shard_month) FROM im_group_message_topic_shards WHERE topic = ?",
    )
    .bind(topic)
    .fetch_one(pool)
    .await
    .map_err(|e| retry(&e))?;
    // During a legacy migration, seqs not yet copied live only there.
    let legacy_seq = crate::store::legacy::table::max_seq(pool, topic)
        .await
        .map_err(|e| retry(&e))?;
    Ok(Recovered {
        seq: mirror_seq.unwrap_or(0).max(legacy_seq.unwrap_or(0)),
        month: mirror_month,
        scanned: 0,
        sent: Vec::new(),
    })
}
