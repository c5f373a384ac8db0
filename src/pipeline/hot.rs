//! The hot pipeline's handler: each MessageSent becomes a 24 h snapshot in
//! Redis (see `history::hot`); edits update a snapshot, recalls and deletes
//! turn it into a stub. Idempotent: a snapshot is keyed by seq, and changes
//! apply only to `normal` snapshots (edits only to a newer edit).

use redis::aio::ConnectionManager;

use crate::events::{now_ms, EventCodec, GroupEvent, GroupEventBody};
use crate::history::{hot, StoredMessage};

use super::runner::{decode_all, outcome, Handler, Record, RecordFailure};

pub struct HotHandler {
    codec: EventCodec,
    redis: ConnectionManager,
}

impl HotHandler {
    pub fn new(codec: EventCodec, redis: ConnectionManager) -> Self {
        Self { codec, redis }
    }
}

impl Handler for HotHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let now = now_ms();
        for (i, event) in decode_all::<GroupEvent>(&self.codec, records, &mut failures).await {
            let (tenant, topic) = (&event.tenant_id, &event.topic);
            let m = match &event.body {
                GroupEventBody::MessageSent(m) => m,
                GroupEventBody::MessageEdited(e) => {
                    let change = hot::Amend::Edit {
                        edit_seq: e.edit_seq.unwrap_or(i64::MAX),
                        head: e.head.as_deref(),
                        content: e.content.as_deref(),
                    };
                    let mut redis = self.redis.clone();
                    if let Err(e) = hot::amend(&mut redis, tenant, topic, &[e.seq], &change).await {
                        failures.push(RecordFailure::new(i, true, e.to_string()));
                    }
                    continue;
                }
                GroupEventBody::MessageRecalled(r) => {
                    let change = hot::Amend::Remove { status: "recalled" };
                    let mut redis = self.redis.clone();
                    if let Err(e) = hot::amend(&mut redis, tenant, topic, &[r.seq], &change).await {
                        failures.push(RecordFailure::new(i, true, e.to_string()));
                    }
                    continue;
                }
                GroupEventBody::MessageDeleted(d) => {
                    let change = hot::Amend::Remove { status: "deleted" };
                    let mut redis = self.redis.clone();
                    for r in &d.ranges {
                        let result = match hot::seqs_in(&mut redis, tenant, topic, r.low, r.hi)
                            .await
                        {
                            Ok(seqs) => hot::amend(&mut redis, tenant, topic, &seqs, &change).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = result {
                            failures.push(RecordFailure::new(i, true, e.to_string()));
                            break;
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            let snapshot = StoredMessage {
                seq: m.seq,
                from: m.from_user,
                ts: m.created_at,
                head: m.head.clone(),
                content: m.content.clone(),
                status: "normal".into(),
                version: 1,
                edit_seq: None,
            };
            let mut redis = self.redis.clone();
            if let Err(e) =
                hot::put(&mut redis, &event.tenant_id, &event.topic, &snapshot, now).await
            {
                failures.push(RecordFailure::new(i, true, e.to_string()));
            }
        }
        outcome(failures)
    }
}
