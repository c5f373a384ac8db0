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

/// What a re-check found.
#[derive(Default)]
pub struct Rechecked {
    /// Sessions that must close, with why.
    pub refused: Vec<(SessionHandle, &'static str)>,
    /// Sessions whose state neither Redis nor MySQL could give: nothing
    /// may be served to them until it can be read again.
    pub unknown: Vec<(SessionHandle, Unavailable)>,
}

/// Re-checks every given session. Sessions whose user's state is not
/// cached are checked against MySQL; one that cannot be checked does not
/// stop the others from being checked.
pub async fn recheck(
    redis: &mut Redis,
    pools: &TenantPools,
    sessions: &[SessionHandle],
) -> Rechecked {
    let mut out = Rechecked::default();
    for chunk in sessions.chunks(2000) {
        let mut pipe = redis::pipe();
        for s in chunk {
            pipe.cmd("HMGET")
                .arg(TenantKeys::new(&s.tenant).control(s.uid))
                .arg(&session_control::cached_fields(&s.device));
        }
        let values: Option<Vec<session_control::CachedFields>> = match pipe.query_async(redis).await
        {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "session control: redis unavailable, reading MySQL");
                None
            }
        };
        for (i, s) in chunk.iter().enumerate() {
            // Not cached, or not readable: MySQL decides.
            let cached = values
                .as_ref()
                .and_then(|v| session_control::parse_cached(&v[i]).ok().flatten());
            let state = match cached {
                Some(c) => c,
                None => match state(redis, pools, &s.tenant, s.uid, &s.device).await {
                    Ok(c) => c,
                    Err(e) => {
                        out.unknown.push((s.clone(), e));
                        continue;
                    }
                },
            };
            if let Some(why) = refusal(&state, s.auth_version, s.generation) {
                out.refused.push((s.clone(), why));
            }
        }
    }
    out
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
