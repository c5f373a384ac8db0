//! The notifications pipeline's handler: group events addressed to one
//! user — added to a group by someone else, removed, a new role, a mute,
//! the outcome of one's report — into that user's notifications
//! (`im_user_notifications`, see [`crate::notifications`]), then a live
//! `{pres topic="me" what="upd" event="notification"}` to every device of
//! the user, on whichever gateway, once the row is written (a client that
//! lists after the frame finds it). Rows are keyed by (user, event id), so
//! redelivery and replay write nothing twice; a replay may repeat a frame,
//! which carries the notification's id. A topic's events go in log order.

use crate::redis_util::Redis;

use crate::events::{EventCodec, GroupEvent};
use crate::notifications;
use crate::realtime::{bus, Envelope, Kind, TargetType};
use crate::tenant::{db_failure, TenantPools};

use super::failure::{redis_failure, FailureKind};
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct NotificationsHandler {
    codec: EventCodec,
    pools: TenantPools,
    redis: Redis,
}

impl NotificationsHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, redis: Redis) -> Self {
        Self {
            codec,
            pools,
            redis,
        }
    }

    async fn apply(&self, e: &GroupEvent) -> Result<(), (FailureKind, String)> {
        let notices = notifications::of_group_event(e);
        if notices.is_empty() {
            return Ok(());
        }
        let pool = self
            .pools
            .get(&e.tenant_id)
            .map_err(|err| (FailureKind::Poison, err.to_string()))?;
        notifications::record(pool, &notices)
            .await
            .map_err(|err| (db_failure(&err), format!("mysql: {err}")))?;
        let mut redis = self.redis.clone();
        for n in &notices {
            let envelope = Envelope {
                // Not the event's own id: the fan-out pipeline delivers
                // that event to this user too (`{pres what="acs"}`).
                event_id: format!("{}:notification", e.event_id),
                tenant_id: e.tenant_id.clone(),
                kind: Kind::Deliver,
                target_type: TargetType::User,
                target: n.uid.to_string(),
                skip_sid: String::new(),
                dedup_key: String::new(),
                occurred_at: e.occurred_at,
                payload: n.frame(),
                exclude: Vec::new(),
            };
            bus::publish(&mut redis, None, &envelope)
                .await
                .map_err(|err| (redis_failure(&err), format!("redis: {err}")))?;
        }
        Ok(())
    }
}

impl Handler for NotificationsHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        let mut gate = KeyGate::new(records, failures);
        for (i, e) in events {
            if !gate.admit(i) {
                continue;
            }
            if let Err((kind, why)) = self.apply(&e).await {
                tracing::warn!(tenant = %e.tenant_id, topic = %e.topic, kind = e.body.name(), error = %why, failure = ?kind, "notification not recorded");
                gate.fail(RecordFailure::new(i, kind, why));
            }
        }
        gate.outcome()
    }
}
