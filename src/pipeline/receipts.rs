//! The receipts pipeline's handler: read/recv cursors into
//! `im_subscriptions` (max wins, so any order and redelivery converge),
//! then `{info}` to the topic's online sessions (except the sender's) and
//! `{pres topic="me" what="read"|"recv"}` to the user's own other sessions.

use crate::redis_util::Redis;

use crate::conversations::hot::{self, CursorMove};

use crate::events::{EventCodec, ReceiptBody, ReceiptEvent};
use crate::realtime::{bus, frames, presence, Envelope, Kind, TargetType};
use crate::tenant::{db_failure, TenantPools};
use crate::tinode;

use super::failure::{redis_failure, FailureKind};
use super::records::{apply_in_order, Handler, Record, RecordFailure};

pub struct ReceiptsHandler {
    codec: EventCodec,
    pools: TenantPools,
    redis: Redis,
}

impl ReceiptsHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, redis: Redis) -> Self {
        Self {
            codec,
            pools,
            redis,
        }
    }

    async fn apply(&self, e: &ReceiptEvent) -> Result<(), (FailureKind, String)> {
        let (what, seq) = match &e.body {
            ReceiptBody::ReadReceipt(c) => ("read", c.seq),
            ReceiptBody::RecvReceipt(c) => ("recv", c.seq),
        };
        let pool = self
            .pools
            .get(&e.tenant_id)
            .map_err(|err| (FailureKind::Poison, err.to_string()))?;
        let column = if what == "read" {
            "read_seq"
        } else {
            "recv_seq"
        };
        sqlx::query(&format!(
            "INSERT INTO im_subscriptions (topic, uid, {column}) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE {column} = GREATEST({column}, VALUES({column}))"
        ))
        .bind(&e.topic)
        .bind(e.uid)
        .bind(seq)
        .execute(pool)
        .await
        .map_err(|err| (db_failure(&err), format!("mysql: {err}")))?;

        let rd = |err: redis::RedisError| (redis_failure(&err), format!("redis: {err}"));
        let mut redis = self.redis.clone();
        let moved = CursorMove {
            uid: e.uid,
            topic: e.topic.clone(),
            read: if what == "read" { seq } else { 0 },
            recv: if what == "recv" { seq } else { 0 },
            clear: 0,
        };
        hot::move_cursors(&mut redis, &e.tenant_id, &[moved])
            .await
            .map_err(rd)?;
        let nodes =
            presence::online_nodes(&mut redis, &e.tenant_id, &e.topic, crate::events::now_ms())
                .await
                .map_err(rd)?;
        let mut to_topic = Envelope {
            event_id: e.event_id.clone(),
            tenant_id: e.tenant_id.clone(),
            kind: Kind::Deliver,
            target_type: TargetType::Topic,
            target: e.topic.clone(),
            skip_sid: e.source_sid.clone(),
            // Each receipt event is its own delivery (a repeated note is
            // forwarded again); the event id dedups redeliveries.
            dedup_key: String::new(),
            occurred_at: e.occurred_at,
            payload: frames::info_frame(&e.topic, e.uid, what, Some(seq)),
            exclude: Vec::new(),
        };
        // One-to-one: the peer's devices see the topic as `usr<reader>`.
        if let Some(peer) = tinode::p2p_peer(&e.topic, e.uid) {
            to_topic.target_type = TargetType::User;
            to_topic.target = peer.to_string();
            to_topic.payload = frames::info_frame(&tinode::user_id(e.uid), e.uid, what, Some(seq));
        }
        let to_user = Envelope {
            event_id: format!("{}:me", e.event_id),
            target_type: TargetType::User,
            target: e.uid.to_string(),
            // Tinode's shape: the chat list of the user's other devices
            // moves its read/recv cursor (the unread badge clears).
            payload: frames::pres_me_seq_frame(&tinode::client_topic(&e.topic, e.uid), what, seq),
            ..to_topic.clone()
        };
        if to_topic.target_type == TargetType::User {
            bus::publish(&mut redis, None, &to_topic)
                .await
                .map_err(rd)?;
        } else if nodes.as_ref().is_none_or(|n| !n.is_empty()) {
            bus::publish(&mut redis, nodes.as_deref(), &to_topic)
                .await
                .map_err(rd)?;
        }
        // The user's own sessions may be on any node.
        bus::publish(&mut redis, None, &to_user).await.map_err(rd)?;
        Ok(())
    }
}

impl Handler for ReceiptsHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        // Cursors converge in any order, but their `{info}` frames go out
        // in log order: after a failed one, the key's later ones wait.
        apply_in_order(&self.codec, records, |event: ReceiptEvent| async move {
            self.apply(&event).await
        })
        .await
    }
}
