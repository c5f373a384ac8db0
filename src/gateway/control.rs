//! Session control at the gateway (seed 002 §5): tokens older than the
//! user's auth_version, disabled users and revoked devices are refused at
//! login, and live sessions are re-checked on every heartbeat (in one Redis
//! round trip for all local sessions) and on uplink — so a lost Pub/Sub
//! control message still takes effect.

use redis::aio::ConnectionManager;

use crate::keys::TenantKeys;
use crate::realtime::hub::SessionHandle;

/// The user's control state, as stored by the control pipeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlState {
    pub auth_version: i64,
    pub disabled: bool,
    /// Epoch ms the device was revoked at, if ever.
    pub device_revoked_at: Option<i64>,
}

impl ControlState {
    /// Why a session or token (with `auth_version`, since `since_ms`) may no
    /// longer be used, if it may not.
    pub fn refusal(&self, auth_version: i64, since_ms: i64) -> Option<&'static str> {
        if self.disabled {
            Some("user disabled")
        } else if auth_version < self.auth_version {
            Some("signed out")
        } else if self.device_revoked_at.is_some_and(|at| at >= since_ms) {
            Some("device revoked")
        } else {
            None
        }
    }
}

/// Reads the control state of one user/device.
pub async fn state(
    redis: &mut ConnectionManager,
    tenant: &str,
    uid: i64,
    device: &str,
) -> redis::RedisResult<ControlState> {
    let k = TenantKeys::new(tenant);
    let (av, disabled, revoked): (Option<i64>, bool, Option<i64>) = redis::pipe()
        .get(k.auth_version(uid))
        .exists(k.user_disabled(uid))
        .get(k.device_revoked(uid, device))
        .query_async(redis)
        .await?;
    Ok(ControlState {
        auth_version: av.unwrap_or(0),
        disabled,
        device_revoked_at: revoked,
    })
}

/// Re-checks every given session; returns those that must close, with why.
pub async fn recheck(
    redis: &mut ConnectionManager,
    sessions: &[SessionHandle],
) -> redis::RedisResult<Vec<(SessionHandle, &'static str)>> {
    let mut out = Vec::new();
    for chunk in sessions.chunks(2000) {
        let mut pipe = redis::pipe();
        for s in chunk {
            let k = TenantKeys::new(&s.tenant);
            pipe.get(k.auth_version(s.uid))
                .exists(k.user_disabled(s.uid))
                .get(k.device_revoked(s.uid, &s.device));
        }
        let values: Vec<redis::Value> = pipe.query_async(redis).await?;
        for (s, triple) in chunk.iter().zip(values.chunks(3)) {
            let state = ControlState {
                auth_version: redis::from_redis_value::<Option<i64>>(&triple[0])
                    .ok()
                    .flatten()
                    .unwrap_or(0),
                disabled: redis::from_redis_value::<bool>(&triple[1]).unwrap_or(false),
                device_revoked_at: redis::from_redis_value::<Option<i64>>(&triple[2])
                    .ok()
                    .flatten(),
            };
            if let Some(why) = state.refusal(s.auth_version, s.since_ms) {
                out.push((s.clone(), why));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals() {
        let ok = ControlState::default();
        assert_eq!(ok.refusal(0, 100), None);
        let signed_out = ControlState {
            auth_version: 2,
            ..ok
        };
        assert_eq!(signed_out.refusal(1, 100), Some("signed out"));
        assert_eq!(signed_out.refusal(2, 100), None);
        let revoked = ControlState {
            device_revoked_at: Some(150),
            ..ok
        };
        assert_eq!(revoked.refusal(0, 100), Some("device revoked"));
        assert_eq!(
            revoked.refusal(0, 200),
            None,
            "logged in again after the revocation"
        );
        let disabled = ControlState {
            disabled: true,
            ..ok
        };
        assert_eq!(disabled.refusal(9, 999), Some("user disabled"));
    }
}
