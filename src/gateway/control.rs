//! Session control at the gateway (seed 002 §5): tokens older than the
//! user's auth_version, disabled users and tokens of a revoked device
//! (below its revocation generation) are refused at login, and live
//! sessions are re-checked on every heartbeat (in one Redis round trip for
//! all local sessions) and on uplink — so a lost Pub/Sub control message
//! still takes effect. State not cached in Redis is read from MySQL
//! ([`crate::session_control`]); when neither answers, logins are refused.

use crate::redis_util::Redis;

use crate::keys::TenantKeys;
use crate::realtime::hub::SessionHandle;
use crate::session_control::{self, DeviceControl, Unavailable};
use crate::tenant::TenantPools;

/// The user's control state, as stored by the control pipeline.
pub type ControlState = DeviceControl;

/// Why a session or token (with `auth_version`, issued under the device's
/// revocation `generation`) may no longer be used, if it may not.
pub fn refusal(state: &ControlState, auth_version: i64, generation: i64) -> Option<&'static str> {
    if state.disabled {
        Some("user disabled")
    } else if auth_version < state.auth_version {
        Some("signed out")
    } else if generation < state.generation {
        Some("device revoked")
    } else {
        None
    }
}

/// Reads the control state of one user/device (Redis, else MySQL).
pub async fn state(
    redis: &mut Redis,
    pools: &TenantPools,
    tenant: &str,
    uid: i64,
    device: &str,
) -> Result<ControlState, Unavailable> {
    session_control::read(redis, pools.get(tenant).ok(), tenant, uid, device).await
}

/// Re-checks every given session; returns those that must close, with why.
/// Sessions whose user's state is not cached are checked against MySQL.
pub async fn recheck(
    redis: &mut Redis,
    pools: &TenantPools,
    sessions: &[SessionHandle],
) -> Result<Vec<(SessionHandle, &'static str)>, Unavailable> {
    let mut out = Vec::new();
    for chunk in sessions.chunks(2000) {
        let mut pipe = redis::pipe();
        for s in chunk {
            let k = TenantKeys::new(&s.tenant);
            pipe.get(k.control_version(s.uid))
                .get(k.auth_version(s.uid))
                .exists(k.user_disabled(s.uid))
                .get(k.device_revoked(s.uid, &s.device));
        }
        let values: Option<Vec<redis::Value>> = match pipe.query_async(redis).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "session control: redis unavailable, reading MySQL");
                None
            }
        };
        for (i, s) in chunk.iter().enumerate() {
            let cached = values.as_ref().and_then(|v| {
                let four = &v[i * 4..i * 4 + 4];
                let int =
                    |v: &redis::Value| redis::from_redis_value::<Option<i64>>(v).ok().flatten();
                int(&four[0])?;
                Some(ControlState {
                    auth_version: int(&four[1]).unwrap_or(0),
                    disabled: redis::from_redis_value::<bool>(&four[2]).unwrap_or(false),
                    generation: int(&four[3]).unwrap_or(0),
                })
            });
            let state = match cached {
                Some(c) => c,
                None => state(redis, pools, &s.tenant, s.uid, &s.device).await?,
            };
            if let Some(why) = refusal(&state, s.auth_version, s.generation) {
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
        assert_eq!(refusal(&ok, 0, 0), None);
        let signed_out = ControlState {
            auth_version: 2,
            ..ok
        };
        assert_eq!(refusal(&signed_out, 1, 0), Some("signed out"));
        assert_eq!(refusal(&signed_out, 2, 0), None);
        let revoked = ControlState {
            generation: 3,
            ..ok
        };
        assert_eq!(refusal(&revoked, 0, 2), Some("device revoked"));
        assert_eq!(
            refusal(&revoked, 0, 3),
            None,
            "issued under the revocation's generation: after it"
        );
        let disabled = ControlState {
            disabled: true,
            ..ok
        };
        assert_eq!(refusal(&disabled, 9, 9), Some("user disabled"));
    }
}
