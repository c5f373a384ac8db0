//! The hot pipeline's handler: each MessageSent becomes a 24 h snapshot in
//! Redis (see `history::hot`), at most `limits.hot_per_topic` per topic; edits update a snapshot, recalls and deletes
//! turn it into a stub. Idempotent: a snapshot is keyed by seq, and changes
//! apply only to `normal` snapshots (edits only to a newer edit).

use crate::redis_util::Redis;

use crate::events::{now_ms, EventCodec, GroupEvent, GroupEventBody};
use crate::history::hot;
use crate::store::message::StoredMessage;

use super::failure::redis_failure;
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct HotHandler {
    codec: EventCodec,
    redis: Redis,
    /// Hot messages kept per topic (`limits.hot_per_topic`).
    per_topic: i64,
}

impl HotHandler {
    pub fn new(codec: EventCodec, redis: Redis) -> Self {
        Self {
            codec,
            redis,
            per_topic: crate::config::LimitsConfig::default().hot_per_topic,
        }
    }

    /// Keeps at most `n` hot messages per topic (the newest).
    pub fn per_topic(mut self, n: i64) -> Self {
        self.per_topic = n.max(1);
        self
    }
}

impl Handler for HotHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let now = now_ms();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        // A topic's changes apply in log order: after a failed one, wait.
        let mut gate = KeyGate::new(records, failures);
        for (i, event) in events {
            if !gate.admit(i) {
                continue;
            }
            if let Err(e) = self.apply(&event, now).await {
                gate.fail(RecordFailure::new(
                    i,
                    redis_failure(&e),
                    format!("redis: {e}"),
                ));
            }
        }
        gate.outcome()
    }
}

impl HotHandler {
    async fn apply(&self, event: &GroupEvent, now: i64) -> redis::RedisResult<()> {
        let (tenant, topic) = (&event.tenant_id, &event.topic);
        let mut redis = self.redis.clone();
        let m = match &event.body {
            GroupEventBody::MessageSent(m) => m,
            GroupEventBody::MessageEdited(e) => {
                let change = hot::Amend::Edit {
                    edit_seq: e.edit_seq.unwrap_or(i64::MAX),
                    head: e.head.as_deref(),
                    content: e.content.as_deref(),
                };
                return hot::amend(&mut redis, tenant, topic, &[e.seq], &change)
                    .await
                    .map(|_| ());
            }
            GroupEventBody::MessageRecalled(r) => {
                let change = hot::Amend::Remove { status: "recalled" };
                return hot::amend(&mut redis, tenant, topic, &[r.seq], &change)
                    .await
                    .map(|_| ());
            }
            GroupEventBody::MessageDeleted(d) => {
                let change = hot::Amend::Remove { status: "deleted" };
                for r in &d.ranges {
                    let seqs = hot::seqs_in(&mut redis, tenant, topic, r.low, r.hi).await?;
                    hot::amend(&mut redis, tenant, topic, &seqs, &change).await?;
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        let snapshot = StoredMessage::sent(m);
        hot::put(&mut redis, tenant, topic, &snapshot, now, self.per_topic).await
    }
}
