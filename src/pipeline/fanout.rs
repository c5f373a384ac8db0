//! The fan-out pipeline's handler: each MessageSent becomes one `{data}`
//! frame, published once to every node with online members of the topic
//! (dedup key `msg:{topic}:{seq}`). Realtime only: a lost copy is caught up
//! by seq, so failures are retried briefly and then dropped to the DLQ.

use std::collections::HashMap;

use redis::aio::ConnectionManager;

use crate::events::{now_ms, EventCodec, GroupEvent, GroupEventBody};
use crate::history::StoredMessage;
use crate::realtime::{
    envelope::node_channel, envelope::BROADCAST_CHANNEL, frames, presence, Envelope, Kind,
    TargetType,
};

use super::runner::{decode_all, outcome, Handler, Record, RecordFailure};

pub struct FanoutHandler {
    codec: EventCodec,
    redis: ConnectionManager,
}

impl FanoutHandler {
    pub fn new(codec: EventCodec, redis: ConnectionManager) -> Self {
        Self { codec, redis }
    }
}

impl Handler for FanoutHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let mut redis = self.redis.clone();
        let now = now_ms();
        let mut nodes_of: HashMap<(String, String), Option<Vec<String>>> = HashMap::new();
        let mut pipe = redis::pipe();
        let mut queued: Vec<usize> = Vec::new();
        for (i, event) in decode_all::<GroupEvent>(&self.codec, records, &mut failures).await {
            let GroupEventBody::MessageSent(m) = &event.body else {
                continue;
            };
            let key = (event.tenant_id.clone(), event.topic.clone());
            if !nodes_of.contains_key(&key) {
                match presence::online_nodes(&mut redis, &key.0, &key.1, now).await {
                    Ok(n) => {
                        nodes_of.insert(key.clone(), n);
                    }
                    Err(e) => {
                        failures.push(RecordFailure::new(i, true, e.to_string()));
                        continue;
                    }
                }
            }
            let nodes = &nodes_of[&key];
            if nodes.as_ref().is_some_and(Vec::is_empty) {
                continue; // nobody online
            }
            let snapshot = StoredMessage {
                seq: m.seq,
                from: m.from_user,
                ts: m.created_at,
                head: m.head.clone(),
                content: m.content.clone(),
                status: "normal".into(),
                version: 1,
            };
            let envelope = Envelope {
                event_id: event.event_id.clone(),
                tenant_id: event.tenant_id.clone(),
                kind: Kind::Deliver,
                target_type: TargetType::Topic,
                target: event.topic.clone(),
                skip_sid: event.source_sid.clone(),
                dedup_key: format!("msg:{}:{}", event.topic, m.seq),
                occurred_at: m.created_at,
                payload: frames::data_frame(&event.topic, &snapshot),
            };
            let text = serde_json::to_string(&envelope).unwrap_or_default();
            match nodes {
                Some(nodes) => {
                    for n in nodes {
                        pipe.publish(node_channel(n), &text).ignore();
                    }
                }
                None => {
                    pipe.publish(BROADCAST_CHANNEL, &text).ignore();
                }
            }
            queued.push(i);
        }
        if !queued.is_empty() {
            if let Err(e) = pipe.query_async::<()>(&mut redis).await {
                failures.extend(
                    queued
                        .into_iter()
                        .map(|i| RecordFailure::new(i, true, e.to_string())),
                );
            }
        }
        outcome(failures)
    }
}
