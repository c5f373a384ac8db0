//! The control pipeline's handler: session-control events into the Redis
//! control keys (versions only move forward), then a close envelope to
//! every gateway. Gateways also re-check the keys on heartbeat, so a lost
//! envelope still takes effect.

use redis::aio::ConnectionManager;

use crate::events::{EventCodec, SessionControlBody, SessionControlEvent};
use crate::keys::TenantKeys;
use crate::realtime::{bus, Envelope, Kind, TargetType};

use super::failure::redis_failure;
use super::runner::{decode_all, Handler, KeyGate, Record, RecordFailure};

/// Sets a key to a number unless it already holds a larger one.
const SET_MAX: &str = "local cur = tonumber(redis.call('GET', KEYS[1]) or '0') \
    if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) end return 1";

pub struct ControlHandler {
    codec: EventCodec,
    redis: ConnectionManager,
}

impl ControlHandler {
    pub fn new(codec: EventCodec, redis: ConnectionManager) -> Self {
        Self { codec, redis }
    }

    async fn apply(&self, e: &SessionControlEvent) -> redis::RedisResult<()> {
        let k = TenantKeys::new(&e.tenant_id);
        let mut redis = self.redis.clone();
        let set_max = redis::Script::new(SET_MAX);
        let (target_type, target, reason) = match &e.body {
            SessionControlBody::DeviceRevoked(d) => {
                let _: i64 = set_max
                    .key(k.device_revoked(e.uid, &d.device))
                    .arg(e.occurred_at)
                    .invoke_async(&mut redis)
                    .await?;
                (
                    TargetType::Device,
                    format!("{}/{}", e.uid, d.device),
                    "device revoked",
                )
            }
            SessionControlBody::SignedOutEverywhere(v) | SessionControlBody::PasswordReset(v) => {
                let _: i64 = set_max
                    .key(k.auth_version(e.uid))
                    .arg(v.auth_version)
                    .invoke_async(&mut redis)
                    .await?;
                (TargetType::User, e.uid.to_string(), "signed out")
            }
            SessionControlBody::UserDisabled(v) => {
                let _: i64 = set_max
                    .key(k.auth_version(e.uid))
                    .arg(v.auth_version)
                    .invoke_async(&mut redis)
                    .await?;
                let _: () = redis::cmd("SET")
                    .arg(k.user_disabled(e.uid))
                    .arg(e.occurred_at)
                    .query_async(&mut redis)
                    .await?;
                (TargetType::User, e.uid.to_string(), "user disabled")
            }
            SessionControlBody::UserEnabled(_) => {
                let _: () = redis::cmd("DEL")
                    .arg(k.user_disabled(e.uid))
                    .query_async(&mut redis)
                    .await?;
                return Ok(());
            }
        };
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
        };
        bus::publish(&mut redis, None, &envelope).await
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
            if let Err(e) = self.apply(&event).await {
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
