//! Session-control state (seed 002 §5: auth version, disabled flag, device
//! revocation generations) with MySQL as ground truth and Redis as its
//! cache. The control pipeline changes the rows, then caches the user's
//! whole state; readers take Redis and, when a user's state is not cached
//! (a Redis loss), rebuild it from MySQL — a missing key never means "no
//! revocations". Every cached state carries the row version it was read
//! at, so a slow rebuild cannot overwrite a newer state.

use crate::redis_util::Redis;
use sqlx::MySqlPool;

use crate::events::{SessionControlBody, SessionControlEvent};
use crate::exact::Exact;
use crate::keys::TenantKeys;
use crate::realtime::hub::{Hub, Outbound};
use crate::realtime::{bus, Envelope, Kind, TargetType};

/// A user without a row is cached this long (the key set stays bounded by
/// active users); a user with a row is cached for good.
const EMPTY_STATE_TTL_SECS: i64 = 86_400;

/// One user's control state, as of row `version` (0: no row yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserControl {
    pub version: i64,
    pub auth_version: i64,
    pub disabled: bool,
    /// (device, revocation generation) of every revoked device.
    pub devices: Vec<(String, i64)>,
}

impl UserControl {
    /// The revocation generation of `device` (0: never revoked).
    pub fn generation(&self, device: &str) -> i64 {
        self.devices
            .iter()
            .find(|(d, _)| d == device)
            .map_or(0, |(_, g)| *g)
    }
}

/// One change to a user's control state; versions only move forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Signed out everywhere or password reset: tokens below are refused.
    AuthVersion(i64),
    Disable {
        auth_version: i64,
    },
    Enable,
    /// Tokens of `device` below `generation` are refused.
    RevokeDevice {
        device: String,
        generation: i64,
    },
}

/// What one session-control event does: the change to the user's rows,
/// and which sessions close and why (none for an enable).
struct Enforcement {
    change: Change,
    target_type: TargetType,
    target: String,
    reason: &'static str,
}

fn enforcement(e: &SessionControlEvent) -> Enforcement {
    let user = |change, reason| Enforcement {
        change,
        target_type: TargetType::User,
        target: e.uid.to_string(),
        reason,
    };
    match &e.body {
        SessionControlBody::DeviceRevoked(d) => Enforcement {
            change: Change::RevokeDevice {
                device: d.device.clone(),
                generation: d.device_version,
            },
            target_type: TargetType::Device,
            target: format!("{}/{}", e.uid, d.device),
            reason: "device revoked",
        },
        SessionControlBody::SignedOutEverywhere(v) | SessionControlBody::PasswordReset(v) => {
            user(Change::AuthVersion(v.auth_version), "signed out")
        }
        SessionControlBody::UserDisabled(v) => user(
            Change::Disable {
                auth_version: v.auth_version,
            },
            "user disabled",
        ),
        SessionControlBody::UserEnabled(_) => user(Change::Enable, ""),
    }
}

/// Why [`enforce`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum EnforceError {
    #[error("mysql: {0}")]
    Mysql(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Puts event `e` in force: the MySQL rows (the ground truth), then the
/// user's whole state into the Redis cache, then the sessions it ends
/// closed: those of `local` (this gateway's hub) at once, every gateway's
/// through a close envelope. Run by the control projection for every
/// event (in log order), and by the operator's routes before they answer
/// (one at a time per user, from produce to here), so a refusal holds from
/// the acknowledgement with no projection running; running it again
/// changes nothing more.
pub async fn enforce(
    pool: &MySqlPool,
    redis: &mut Redis,
    e: &SessionControlEvent,
    local: Option<&Hub>,
) -> Result<UserControl, EnforceError> {
    enforce_sparing(pool, redis, e, local, "").await
}

/// [`enforce`], leaving session `spare_sid` open (the session whose user
/// asked for the change, answered before it closes itself).
pub async fn enforce_sparing(
    pool: &MySqlPool,
    redis: &mut Redis,
    e: &SessionControlEvent,
    local: Option<&Hub>,
    spare_sid: &str,
) -> Result<UserControl, EnforceError> {
    let plan = enforcement(e);
    let state = apply(pool, e.uid, &plan.change).await?;
    cache(redis, &e.tenant_id, e.uid, &state).await?;
    if plan.change == Change::Enable {
        return Ok(state);
    }
    if let Some(hub) = local {
        let device = match &plan.change {
            Change::RevokeDevice { device, .. } => Some(device.as_str()),
            _ => None,
        };
        let close = Outbound::Close(std::sync::Arc::from(plan.reason));
        for session in hub.user_sessions(&e.tenant_id, e.uid, device, spare_sid) {
            session.offer(close.clone());
        }
    }
    let envelope = Envelope {
        event_id: e.event_id.clone(),
        tenant_id: e.tenant_id.clone(),
        kind: Kind::Close,
        target_type: plan.target_type,
        target: plan.target,
        skip_sid: spare_sid.to_string(),
        dedup_key: String::new(),
        occurred_at: e.occurred_at,
        payload: plan.reason.to_string(),
        exclude: Vec::new(),
    };
    bus::publish(redis, None, &envelope).await?;
    Ok(state)
}

/// Longest device id a revocation can name (the column's width).
pub const MAX_DEVICE_LEN: usize = 191;

/// The user's state from MySQL.
pub async fn load(pool: &MySqlPool, uid: i64) -> sqlx::Result<UserControl> {
    let row: Option<(i64, i64, bool)> = sqlx::query_as(
        "SELECT version, auth_version, disabled FROM im_session_control_users WHERE uid = ?",
    )
    .bind(uid)
    .fetch_optional(pool)
    .await?;
    let devices: Vec<(Exact, i64)> = sqlx::query_as(
        "SELECT device, generation FROM im_session_control_devices WHERE uid = ? ORDER BY device",
    )
    .bind(uid)
    .fetch_all(pool)
    .await?;
    let (version, auth_version, disabled) = row.unwrap_or((0, 0, false));
    Ok(UserControl {
        version,
        auth_version,
        disabled,
        devices: exact_devices(devices),
    })
}

fn exact_devices(devices: Vec<(Exact, i64)>) -> Vec<(String, i64)> {
    devices.into_iter().map(|(d, g)| (d.0, g)).collect()
}

/// Takes the user's next auth version, atomically, in the row the
/// projection keeps (issue 39: computed from that row as the projection
/// had left it, two quick bumps took the same version, and a token issued
/// under the first survived the second). The projection writes the same
/// version again (`GREATEST`), so nothing goes back.
pub async fn next_auth_version(pool: &MySqlPool, uid: i64) -> sqlx::Result<i64> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO im_session_control_users (uid, version, auth_version, disabled) \
         VALUES (?, 0, 1, 0) ON DUPLICATE KEY UPDATE auth_version = auth_version + 1",
    )
    .bind(uid)
    .execute(&mut *tx)
    .await?;
    let taken: i64 =
        sqlx::query_scalar("SELECT auth_version FROM im_session_control_users WHERE uid = ?")
            .bind(uid)
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(taken)
}

/// Applies `change` in one transaction (bumping the row version) and
/// returns the state after it.
pub async fn apply(pool: &MySqlPool, uid: i64, change: &Change) -> sqlx::Result<UserControl> {
    let mut tx = pool.begin().await?;
    let (av, disabled_sql) = match change {
        Change::AuthVersion(v) => (*v, "disabled"),
        Change::Disable { auth_version } => (*auth_version, "1"),
        Change::Enable => (0, "0"),
        Change::RevokeDevice { .. } => (0, "disabled"),
    };
    let initial_disabled = matches!(change, Change::Disable { .. });
    // `VALUES()` rather than a row alias: MariaDB has no `AS new`.
    sqlx::query(&format!(
        "INSERT INTO im_session_control_users (uid, version, auth_version, disabled) \
         VALUES (?, 1, ?, ?) ON DUPLICATE KEY UPDATE version = version + 1, \
         auth_version = GREATEST(auth_version, VALUES(auth_version)), disabled = {disabled_sql}"
    ))
    .bind(uid)
    .bind(av)
    .bind(initial_disabled)
    .execute(&mut *tx)
    .await?;
    if let Change::RevokeDevice { device, generation } = change {
        sqlx::query(
            "INSERT INTO im_session_control_devices (uid, device, generation) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE generation = GREATEST(generation, VALUES(generation))",
        )
        .bind(uid)
        .bind(device)
        .bind(generation)
        .execute(&mut *tx)
        .await?;
    }
    let row: (i64, i64, bool) = sqlx::query_as(
        "SELECT version, auth_version, disabled FROM im_session_control_users WHERE uid = ?",
    )
    .bind(uid)
    .fetch_one(&mut *tx)
    .await?;
    let devices: Vec<(Exact, i64)> = sqlx::query_as(
        "SELECT device, generation FROM im_session_control_devices WHERE uid = ? ORDER BY device",
    )
    .bind(uid)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(UserControl {
        version: row.0,
        auth_version: row.1,
        disabled: row.2,
        devices: exact_devices(devices),
    })
}

/// Caches `state` in Redis unless a newer version is cached already.
pub async fn cache(
    redis: &mut Redis,
    tenant: &str,
    uid: i64,
    state: &UserControl,
) -> redis::RedisResult<()> {
    let k = TenantKeys::new(tenant);
    let script = redis::Script::new(include_str!("../lua/cache_control.lua"));
    let mut call = script.key(k.control(uid));
    call.arg(state.version)
        .arg(state.auth_version)
        .arg(if state.disabled { 1 } else { 0 })
        .arg(if state.version == 0 {
            EMPTY_STATE_TTL_SECS
        } else {
            0
        });
    for (device, generation) in &state.devices {
        call.arg(device).arg(*generation);
    }
    let _: i64 = call.invoke_async(redis).await?;
    Ok(())
}

/// Why a user's state could not be read from either store.
#[derive(Debug, thiserror::Error)]
#[error("session control unavailable: redis: {redis}; mysql: {mysql}")]
pub struct Unavailable {
    pub redis: String,
    pub mysql: String,
}

/// What a reader needs of one user and device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceControl {
    pub auth_version: i64,
    pub disabled: bool,
    /// The device's revocation generation: tokens below it are refused.
    pub generation: i64,
}

impl From<(&UserControl, &str)> for DeviceControl {
    fn from((u, device): (&UserControl, &str)) -> Self {
        Self {
            auth_version: u.auth_version,
            disabled: u.disabled,
            generation: u.generation(device),
        }
    }
}

/// What [`read`] asks of a user's control hash: `HMGET` of these fields.
pub type CachedFields = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The hash fields of `device`'s state: version, auth version, disabled
/// flag, the device's generation.
pub fn cached_fields(device: &str) -> [String; 4] {
    [
        "v".to_string(),
        "av".to_string(),
        "disabled".to_string(),
        format!("d:{device}"),
    ]
}

/// The cached state in `HMGET` answer `c`: `None` when not cached (no
/// version); an error when a field is not a number (never read as "no
/// revocation").
pub fn parse_cached(c: &CachedFields) -> Result<Option<DeviceControl>, String> {
    let int = |v: &Option<String>| -> Result<i64, String> {
        v.as_deref().map_or(Ok(0), |s| {
            s.parse::<i64>()
                .map_err(|_| format!("session control cache holds {s:?}"))
        })
    };
    if c.0.is_none() {
        return Ok(None);
    }
    int(&c.0)?;
    Ok(Some(DeviceControl {
        auth_version: int(&c.1)?,
        disabled: c.2.is_some(),
        generation: int(&c.3)?,
    }))
}

/// The state of `uid`'s `device`: from Redis when cached, else from MySQL
/// (cached again on the way). Fails only when neither store answers; the
/// caller then refuses (security checks fail closed).
pub async fn read(
    redis: &mut Redis,
    pool: Option<&MySqlPool>,
    tenant: &str,
    uid: i64,
    device: &str,
) -> Result<DeviceControl, Unavailable> {
    let k = TenantKeys::new(tenant);
    let cached: redis::RedisResult<CachedFields> = redis::cmd("HMGET")
        .arg(k.control(uid))
        .arg(&cached_fields(device))
        .query_async(redis)
        .await;
    let redis_error = match cached.map(|c| parse_cached(&c)) {
        Ok(Ok(Some(state))) => return Ok(state),
        Ok(Ok(None)) => None,
        // A cached state that does not parse is no answer: read MySQL.
        Ok(Err(bad)) => Some(bad),
        Err(e) => Some(e.to_string()),
    };
    let state = rebuild(redis, pool, tenant, uid, redis_error.is_none())
        .await
        .map_err(|mysql| Unavailable {
            redis: redis_error
                .clone()
                .unwrap_or_else(|| "not cached".to_string()),
            mysql,
        })?;
    Ok(DeviceControl::from((&state, device)))
}

/// Loads `uid`'s state from MySQL and, when Redis answers, caches it.
pub async fn rebuild(
    redis: &mut Redis,
    pool: Option<&MySqlPool>,
    tenant: &str,
    uid: i64,
    redis_up: bool,
) -> Result<UserControl, String> {
    let pool = pool.ok_or_else(|| format!("unknown tenant {tenant:?}"))?;
    let state = load(pool, uid).await.map_err(|e| e.to_string())?;
    if redis_up {
        if let Err(e) = cache(redis, tenant, uid, &state).await {
            tracing::warn!(tenant, uid, error = %e, "session control: caching the rebuilt state failed");
        }
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_state_is_all_or_nothing() {
        let some = |s: &str| Some(s.to_string());
        // No version: not cached, whatever else is there.
        assert_eq!(
            parse_cached(&(None, some("3"), some("1"), some("9"))),
            Ok(None)
        );
        assert_eq!(
            parse_cached(&(some("4"), some("3"), some("1"), some("9"))),
            Ok(Some(DeviceControl {
                auth_version: 3,
                disabled: true,
                generation: 9
            }))
        );
        assert_eq!(
            parse_cached(&(some("4"), None, None, None)),
            Ok(Some(DeviceControl::default()))
        );
        // Garbage is no answer (MySQL decides), never "no revocation".
        assert!(parse_cached(&(some("4"), None, None, some("x"))).is_err());
        assert_eq!(
            cached_fields("web"),
            ["v", "av", "disabled", "d:web"].map(String::from)
        );
    }
}
