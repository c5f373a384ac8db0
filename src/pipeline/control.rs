//! The control pipeline's handler: session-control events into the MySQL
//! session-control rows (the ground truth; versions only move forward),
//! then the user's whole state into the Redis control keys, then a close
//! envelope to every gateway. Gateways also re-check the keys on
//! heartbeat, so a lost envelope still takes effect.

use crate::redis_util::Redis;

use crate::events::{EventCodec, SessionControlBody, SessionControlEvent};
use crate::realtime::{bus, Envelope, Kind, TargetType};
use crate::session_control::{self, Change};
use crate::tenant::TenantPools;

use super::failure::{redis_failure, FailureKind};
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct ControlHandler {
    codec: EventCodec,
    pools: TenantPools,
    redis: Redis,
}

impl ControlHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, redis: Redis) -> Self {
        Self {
            codec,
            pools,
            redis,
        }
    }

    async fn apply(&self, e: &SessionControlEvent) -> Result<(), (FailureKind, String)> {
        let (change, target_type, target, reason) = match &e.body {
            SessionControlBody::DeviceRevoked(d) => (
                Change::RevokeDevice {
                    device: d.device.clone(),
                    generation: d.device_version,
                },
                TargetType::Device,
                format!("{}/{}", e.uid, d.device),
                "device revoked",
            ),
            SessionControlBody::SignedOutEverywhere(v) | SessionControlBody::PasswordReset(v) => (
                Change::AuthVersion(v.auth_version),
                TargetType::User,
                e.uid.to_string(),
                "signed out",
            ),
            SessionControlBody::UserDisabled(v) => (
                Change::Disable {
                    auth_version: v.auth_version,
                },
                TargetType::User,
                e.uid.to_string(),
                "user disabled",
            ),
            SessionControlBody::UserEnabled(_) => {
                (Change::Enable, TargetType::User, e.uid.to_string(), "")
            }
        };
        let pool = self.pools.get(&e.tenant_id).map_err(|err| {
            let kind = if err.is_retryable() {
                FailureKind::Outage
            } else {
                FailureKind::Poison
            };
            (kind, err.to_string())
        })?;
        // MySQL first (the ground truth), then the cache, then the close.
        let state = session_control::apply(pool, e.uid, &change)
            .await
            .map_err(|err| (crate::tenant::db_failure(&err), format!("mysql: {err}")))?;
        let mut redis = self.redis.clone();
        session_control::cache(&mut redis, &e.tenant_id, e.uid, &state)
            .await
            .map_err(|err| (redis_failure(&err), format!("redis: {err}")))?;
        if change == Change::Enable {
            return Ok(());
        }
        let envelope = Envelope {
            event_id: e.event_id.clone(),
            tenant_id: e.tenant_id.clone(),
            kind: Kind::Close,
            target_type,
            target,
            skip_sid: String::new(),
            dedup_key: String::new(),
            occurred_at: e.occurred_at,
            payload: reason.to_string(),
            exclude: Vec::new(),
        };
        bus::publish(&mut redis, None, &envelope)
            .await
            .map_err(|err| (redis_failure(&err), format!("redis: {err}")))
    }
}

impl Handler for ControlHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let events = decode_all::<SessionControlEvent>(&self.codec, records, &mut failures).await;
        // A user's control events apply in log order (a retried
        // `UserDisabled` must not land after the `UserEnabled` that
        // followed it): after a failed one, the user's later ones wait.
        let mut gate = KeyGate::new(records, failures);
        for (i, event) in events {
            if !gate.admit(i) {
                continue;
            }
            if let Err((kind, why)) = self.apply(&event).await {
                gate.fail(RecordFailure::new(i, kind, why));
            }
        }
        gate.outcome()
    }
}
