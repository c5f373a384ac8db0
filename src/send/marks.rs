//! The seq allocator in Redis and its durable mark (issue 38,
//! ARCHITECTURE.md §3b): blocks of seqs are reserved in
//! `store::marks` before Redis hands them out, so a topic whose allocator
//! Redis lost or another incarnation wrote is restored from its mark at
//! once — no in-flight window to wait out, no log to read, no margin of a
//! thousand.
//!
//! - **Blocks.** `lua/allocate_seq.lua` hands out seqs below the block's
//!   `end`; a block used up (or a new month for the topic) asks for the
//!   next one ([`Sender::next_block`]), and a block running low is
//!   followed by the next one in the background. A block is 8 seqs, twice
//!   the last when that one lasted less than 5 s (up to 256), half when it
//!   lasted more than a minute: a quiet conversation skips at most a few
//!   seqs after a restore, a busy one pays a MySQL statement per 256.
//! - **Restore.** [`restore`]: the mark rises by one more block and the
//!   allocator continues from the old mark. A topic with no mark is new on
//!   a tenant set up with marks; on one upgraded with data it goes through
//!   the log-derived re-seed (`super::reseed`) once.
//! - **Claims.** A restored topic carries `rec`: its client message ids
//!   may have lost their claims with Redis, so for a claim's lifetime an
//!   id without one is looked up in the durable claims first
//!   ([`check_claim`]): the store's dedup rows (stored messages) and the
//!   claims the tenant's restore put back from the log's unstored tail
//!   (`crate::recovery`). So a retry of a message acknowledged before the
//!   loss gets its seq, at one primary-key read per such send.

use std::sync::LazyLock;
use std::time::Duration;

use crate::keys::{TopicKeys, CLAIM_TTL_MS};
use crate::metrics as m;
use crate::redis_util::Redis;
use crate::store::marks;

use super::{SendError, Sender};

/// The first block of a topic, and the smallest.
pub const MIN_BLOCK: i64 = 8;
/// The largest block.
pub const MAX_BLOCK: i64 = 256;
/// The block a restore reserves (what a restore may skip, at most).
pub const RESTORE_BLOCK: i64 = MIN_BLOCK;

static SEQ_STATE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/seq_state.lua")));
static SEQ_RESTORE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/seq_restore.lua")));
static SEQ_EXTEND: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/seq_extend.lua")));

/// The next block's size: doubled after a block that lasted less than 5 s,
/// halved after one that lasted more than a minute.
pub fn next_block(prev: Option<i64>, since_ms: Option<i64>) -> i64 {
    let Some(prev) = prev.filter(|b| *b > 0) else {
        return MIN_BLOCK;
    };
    match since_ms {
        Some(ms) if ms < 5_000 => (prev * 2).min(MAX_BLOCK),
        Some(ms) if ms > 60_000 => (prev / 2).max(MIN_BLOCK),
        _ => prev.clamp(MIN_BLOCK, MAX_BLOCK),
    }
}

/// A topic's seq state in Redis, and the incarnation that answered.
#[derive(Debug, Clone, Default)]
pub struct SeqState {
    pub last_seq: Option<i64>,
    pub month_floor: Option<String>,
    /// The incarnation (run_id) that wrote it.
    pub inc: Option<String>,
    pub run_id: String,
    pub end: Option<i64>,
    /// When the allocator was restored (its claims may have been lost).
    pub rec: Option<i64>,
}

impl SeqState {
    pub async fn read(redis: &mut Redis, keys: &TopicKeys) -> redis::RedisResult<Self> {
        let v: Vec<String> = SEQ_STATE.key(keys.seq()).invoke_async(redis).await?;
        let get = |i: usize| v.get(i).filter(|s| !s.is_empty()).cloned();
        Ok(SeqState {
            last_seq: get(0).and_then(|s| s.parse().ok()),
            month_floor: get(1),
            inc: get(2),
            run_id: get(3).unwrap_or_default(),
            end: get(4).and_then(|s| s.parse().ok()),
            rec: get(5).and_then(|s| s.parse().ok()),
        })
    }

    /// Written by the incarnation that answers now: allocations may go on.
    pub fn live(&self) -> bool {
        self.last_seq.is_some() && self.inc.as_deref() == Some(self.run_id.as_str())
    }

    /// Every seq this state may have handed out is <= this.
    fn floor(&self) -> i64 {
        self.last_seq.unwrap_or(0).max(self.end.unwrap_or(0))
    }
}

/// What [`restore`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// The allocator is live.
    Done,
    /// No mark, on a tenant upgraded with data: the log-derived re-seed.
    Legacy,
}

/// Restores `topic`'s allocator from its durable mark (see the module
/// docs), unless a live one is there.
pub async fn restore(sender: &Sender, tenant: &str, topic: &str) -> Result<Restored, SendError> {
    let retry = |e: &dyn std::fmt::Display| SendError::Retryable(format!("seq restore: {e}"));
    let keys = TopicKeys::new(tenant, topic);
    let mut redis = sender.redis();
    let state = SeqState::read(&mut redis, &keys)
        .await
        .map_err(|e| retry(&e))?;
    if state.live() {
        return Ok(Restored::Done);
    }
    let pool = sender.pools().get(tenant).map_err(|e| retry(&e))?;
    let stored = marks::get(pool, topic).await.map_err(|e| retry(&e))?;
    if stored.is_none() && !marks::complete(pool).await.map_err(|e| retry(&e))? {
        return Ok(Restored::Legacy);
    }
    // A topic with history may have lost claims too (see `check_claim`).
    let history = stored.is_some() || state.last_seq.is_some();
    if !history {
        // A new topic: its first block is reserved by its first send, with
        // the month that send takes.
        let _: i64 = restore_invocation(&keys, 0, 0, "", None, false)
            .invoke_async(&mut redis)
            .await
            .map_err(|e| retry(&e))?;
        return Ok(Restored::Done);
    }
    let month = stored
        .as_ref()
        .map(|m| m.month_floor.clone())
        .into_iter()
        .chain(state.month_floor.clone())
        .max()
        .unwrap_or_default();
    // Whether the topic lost its state with the whole tenant (then the
    // pass of this incarnation covers its claims) or on its own (then a
    // pass begun after this restore must): before this incarnation's pass
    // ran to its end (a restart, a failover, a flush), with the tenant;
    // after it — the pass restored and stamped every topic it knew — on its
    // own, whatever incarnation wrote the state it found (a copy rolled
    // back under the same server, a stale writer). Unsure (Redis failing):
    // on its own.
    let whole_tenant = {
        let mut redis = sender.redis();
        !crate::redis_util::incarnation::pass_done(&mut redis, tenant, &state.run_id)
            .await
            .unwrap_or(true)
    };
    let reserved = marks::reserve(pool, topic, state.floor(), RESTORE_BLOCK, &month)
        .await
        .map_err(|e| retry(&e))?;
    let installed: i64 = restore_invocation(
        &keys,
        reserved.mark - RESTORE_BLOCK,
        reserved.mark,
        &month,
        Some(crate::events::now_ms()),
        whole_tenant,
    )
    .invoke_async(&mut redis)
    .await
    .map_err(|e| retry(&e))?;
    metrics::counter!(m::SEQ_BLOCKS_TOTAL, "why" => "restore").increment(1);
    if installed == 1 {
        metrics::counter!(m::WRITE_RESTORES_TOTAL, "what" => "seq", "how" => "lazy").increment(1);
        tracing::info!(
            tenant,
            topic,
            last_seq = reserved.mark - RESTORE_BLOCK,
            stale_last_seq = ?state.last_seq,
            stale_incarnation = state.inc.as_deref().unwrap_or("-"),
            "seq allocator restored from its durable mark"
        );
    }
    Ok(Restored::Done)
}

/// The `lua/seq_restore.lua` call installing a restored allocator that
/// continues after `last_seq` below `end` (a bulk restore runs many);
/// `restored_at` for a topic with history (its claims may be lost: see
/// [`Sender::check_claim`]), and whether the whole tenant was forgotten
/// (any restore pass of this incarnation covers them) or this topic alone
/// (a pass begun after `restored_at` must).
pub fn restore_invocation(
    keys: &TopicKeys,
    last_seq: i64,
    end: i64,
    month_floor: &str,
    restored_at: Option<i64>,
    whole_tenant: bool,
) -> redis::ScriptInvocation<'static> {
    let now = crate::events::now_ms();
    let mut call = SEQ_RESTORE.prepare_invoke();
    call.key(keys.seq())
        .arg(last_seq)
        .arg(end)
        .arg(month_floor)
        .arg(restored_at.map(|t| t.to_string()).unwrap_or_default())
        .arg(end - last_seq)
        .arg(now)
        .arg(if whole_tenant { "1" } else { "" });
    call
}

impl Sender {
    /// Reserves the topic's next block as `lua/allocate_seq.lua` asked
    /// (`NEEDBLOCK`: last_seq, end, month, block, at, run_id) and makes it
    /// usable. Concurrent asks of one topic in this process share one
    /// reservation.
    pub(super) async fn next_block(
        &self,
        tenant: &str,
        topic: &str,
        reply: &[String],
    ) -> Result<(), SendError> {
        let get = |i: usize| reply.get(i).map(String::as_str).unwrap_or("");
        let last: i64 = get(1).parse().unwrap_or(0);
        let end: Option<i64> = get(2).parse().ok();
        let why = match end {
            None => "first",
            Some(e) if last < e => "month",
            Some(_) => "used_up",
        };
        let ask = BlockAsk {
            floor: last.max(end.unwrap_or(0)),
            month: get(3).to_string(),
            block: next_block(get(4).parse().ok(), block_age(get(5))),
            run_id: get(6).to_string(),
        };
        self.reserve_block(tenant, topic, ask, why).await
    }

    /// Reserves the next block in the background (the allocator said its
    /// block runs low), so the sends that follow do not wait for MySQL.
    pub(super) fn prefetch_block(&self, tenant: &str, topic: &str) {
        let sender = self.clone();
        let (tenant, topic) = (tenant.to_string(), topic.to_string());
        tokio::spawn(async move {
            let keys = TopicKeys::new(&tenant, &topic);
            let mut redis = sender.redis();
            let fields: Result<
                (
                    Option<i64>,
                    Option<i64>,
                    Option<String>,
                    Option<i64>,
                    Option<String>,
                ),
                _,
            > = redis::cmd("HMGET")
                .arg(keys.seq())
                .arg("last_seq")
                .arg("end")
                .arg("month_floor")
                .arg("blk")
                .arg("inc")
                .query_async(&mut redis)
                .await;
            let Ok((Some(last), end, floor, blk, Some(inc))) = fields else {
                return;
            };
            let ask = BlockAsk {
                floor: last.max(end.unwrap_or(0)),
                month: floor.unwrap_or_default(),
                block: next_block(blk, Some(0)),
                run_id: inc,
            };
            if let Err(e) = sender.reserve_block(&tenant, &topic, ask, "prefetch").await {
                tracing::warn!(%tenant, %topic, error = %e, "reserving the next seq block ahead failed; the next send asks again");
            }
        });
    }

    async fn reserve_block(
        &self,
        tenant: &str,
        topic: &str,
        ask: BlockAsk,
        why: &'static str,
    ) -> Result<(), SendError> {
        let sender = self.clone();
        let (t, tp) = (tenant.to_string(), topic.to_string());
        self.inner
            .blocks
            .run((t.clone(), tp.clone()), async move {
                let retry = |e: &dyn std::fmt::Display| format!("seq block: {e}");
                let pool = sender.pools().get(&t).map_err(|e| retry(&e))?;
                let reserved = marks::reserve(pool, &tp, ask.floor, ask.block, &ask.month)
                    .await
                    .map_err(|e| retry(&e))?;
                metrics::counter!(m::SEQ_BLOCKS_TOTAL, "why" => why).increment(1);
                let mut redis = sender.redis();
                let _: i64 = SEQ_EXTEND
                    .key(TopicKeys::new(&t, &tp).seq())
                    .arg(&ask.run_id)
                    .arg(reserved.mark)
                    .arg(&ask.month)
                    .arg(ask.block)
                    .arg(crate::events::now_ms())
                    .invoke_async(&mut redis)
                    .await
                    .map_err(|e| retry(&e))?;
                Ok(())
            })
            .await
            .map_err(SendError::Retryable)
    }

    /// A client message id without a claim on a restored topic (see the
    /// module docs): its durable claim, put back when found. Until a
    /// restore pass of the incarnation `run_id`, begun at or after `since`
    /// (0 when the whole tenant was forgotten: any such pass), has put back
    /// the claims of the log's unstored tail, an id cannot be told from a
    /// retry of one of those: the send waits up to 3 s for it, then is
    /// answered "retry".
    pub(super) async fn check_claim(
        &self,
        tenant: &str,
        topic: &str,
        uid: i64,
        client_msg_id: &str,
        run_id: &str,
        since: i64,
    ) -> Result<(), SendError> {
        let retry = |e: &dyn std::fmt::Display| SendError::Retryable(format!("claim check: {e}"));
        let keys = TopicKeys::new(tenant, topic);
        let mut redis = self.redis();
        let deadline = tokio::time::Instant::now() + CLAIMS_WAIT;
        loop {
            if self.restored_for(tenant, run_id, since).await? {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(SendError::Retryable(
                    "restoring after Redis forgot; retry shortly".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let pool = self.pools().get(tenant).map_err(|e| retry(&e))?;
        let stored: Option<(i64, String, Option<i64>)> = sqlx::query_as(
            "SELECT seqid, shard_month, message_id FROM im_group_message_dedup \
             WHERE topic = ? AND from_user = ? AND client_msg_id = ?",
        )
        .bind(topic)
        .bind(uid)
        .bind(client_msg_id)
        .fetch_optional(pool)
        .await
        .map_err(|e| retry(&e))?;
        metrics::counter!(m::CLAIM_CHECKS_TOTAL, "found" => if stored.is_some() { "yes" } else { "no" })
            .increment(1);
        if let Some((seq, month, message_id)) = stored {
            let _: Option<String> = redis::cmd("SET")
                .arg(keys.uniq(uid, client_msg_id))
                .arg(format!("done|{seq}|{month}|{}", message_id.unwrap_or(0)))
                .arg("NX")
                .arg("PX")
                .arg(CLAIM_TTL_MS)
                .query_async(&mut redis)
                .await
                .map_err(|e| retry(&e))?;
        }
        Ok(())
    }
}

impl Sender {
    /// Whether a restore pass begun at or after `since` covers the
    /// incarnation `run_id` of the tenant (the marker, cached a second: a
    /// marker that covers keeps covering). A topic restored after the last
    /// pass began asks for another pass.
    async fn restored_for(
        &self,
        tenant: &str,
        run_id: &str,
        since: i64,
    ) -> Result<bool, SendError> {
        use crate::redis_util::incarnation::{parse_marker, Restore};
        let retry = |e: &dyn std::fmt::Display| SendError::Retryable(format!("claim check: {e}"));
        let covers = |marker: &str| {
            let (inc, at) = parse_marker(marker);
            !run_id.is_empty() && inc.split(',').any(|id| id == run_id) && at >= since
        };
        if let Some((marker, at)) = self.inner.markers.lock().expect("lock").get(tenant) {
            if at.elapsed() < Duration::from_secs(1) && covers(marker) {
                return Ok(true);
            }
        }
        let mut redis = self.redis();
        match crate::redis_util::incarnation::restored(&mut redis, tenant, run_id, since)
            .await
            .map_err(|e| retry(&e))?
        {
            Restore::Covers => {
                if let Ok(Some(marker)) =
                    crate::redis_util::incarnation::restored_marker(&mut redis, tenant).await
                {
                    self.inner
                        .markers
                        .lock()
                        .expect("lock")
                        .insert(tenant.to_string(), (marker, std::time::Instant::now()));
                }
                Ok(true)
            }
            Restore::Before(marker) => {
                crate::redis_util::incarnation::ask_restore(&mut redis, tenant, &marker)
                    .await
                    .map_err(|e| retry(&e))?;
                Ok(false)
            }
            Restore::Not => Ok(false),
        }
    }
}

/// How long a send waits for the tenant's restore to put back the claims
/// of the log's unstored tail before answering "retry".
const CLAIMS_WAIT: Duration = Duration::from_secs(3);

/// What a block reservation needs.
#[derive(Debug, Clone)]
struct BlockAsk {
    /// Every seq handed out so far is <= this.
    floor: i64,
    month: String,
    block: i64,
    /// The incarnation the allocator was read from (the block is installed
    /// only there).
    run_id: String,
}

/// Milliseconds since the last block was reserved (`at`), if known.
fn block_age(at: &str) -> Option<i64> {
    at.parse::<i64>()
        .ok()
        .map(|at| crate::events::now_ms() - at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_grows_while_it_is_used_up_fast_and_shrinks_when_idle() {
        assert_eq!(next_block(None, None), MIN_BLOCK);
        assert_eq!(next_block(Some(8), Some(1_000)), 16);
        assert_eq!(next_block(Some(256), Some(10)), MAX_BLOCK);
        assert_eq!(next_block(Some(64), Some(30_000)), 64);
        assert_eq!(next_block(Some(64), Some(120_000)), 32);
        assert_eq!(next_block(Some(8), Some(120_000)), MIN_BLOCK);
        assert_eq!(next_block(Some(0), None), MIN_BLOCK);
    }
}
