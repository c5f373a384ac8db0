//! The hot pipeline's handler: each MessageSent becomes a 24 h snapshot in
//! Redis (see `history::hot`). Idempotent: a snapshot is keyed by seq.

use redis::aio::ConnectionManager;

use crate::events::{now_ms, CodecError, EventCodec, GroupEvent, GroupEventBody};
use crate::history::{hot, StoredMessage};

use super::runner::{Handler, Record, RecordFailure};

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
        for (i, r) in records.iter().enumerate() {
            let event = match self.codec.decode::<GroupEvent>(r.payload.as_deref()).await {
                Ok(e) => e,
                Err(CodecError::UnknownKind { .. }) => continue,
                Err(e) => {
                    failures.push(RecordFailure::new(i, e.is_retryable(), e.to_string()));
                    continue;
                }
            };
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
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }
}
