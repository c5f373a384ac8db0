//! The hot pipeline's handler: each MessageSent becomes a 24 h snapshot in
//! Redis (see `history::hot`). Idempotent: a snapshot is keyed by seq.

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
            let GroupEventBody::MessageSent(m) = &event.body else {
                continue;
            };
            let snapshot = StoredMessage {
                seq: m.seq,
                from: m.from_user,
                ts: m.created_at,
                head: m.head.clone(),
                content: m.content.clone(),
                status: "normal".into(),
                version: 1,
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
