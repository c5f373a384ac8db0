//! The control pipeline's handler: session-control events into the MySQL
//! session-control rows (the ground truth; versions only move forward),
//! then the user's whole state into the Redis control keys, then a close
//! envelope to every gateway. Gateways also re-check the keys on
//! heartbeat, so a lost envelope still takes effect.

use crate::redis_util::Redis;

use crate::events::{EventCodec, SessionControlEvent};
use crate::session_control::{self, EnforceError};
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
        let pool = self.pools.get(&e.tenant_id).map_err(|err| {
            let kind = if err.is_retryable() {
                FailureKind::Outage
            } else {
                FailureKind::Poison
            };
            (kind, err.to_string())
        })?;
        let mut redis = self.redis.clone();
        session_control::enforce(pool, &mut redis, e, None)
            .await
            .map(|_| ())
            .map_err(|err| match &err {
                EnforceError::Mysql(m) => (crate::tenant::db_failure(m), err.to_string()),
                EnforceError::Redis(r) => (redis_failure(r), err.to_string()),
            })
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
