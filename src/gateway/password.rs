//! A user's change of their own password login (Argon2id), for both front
//! ends: `PUT /v1/me/password` with the old password, and Tinode's `{acc}`
//! from a session that signed in with the password moments ago (the web
//! app sends only the new one, issue 40). The caller's `password_changes`
//! bucket bounds the hashing. On success every session of the user is
//! signed out (a `PasswordReset` session-control event, in force before the
//! answer) and a token for the calling device is issued under the new auth
//! version. A login of the configuration's development users cannot be
//! changed here (`409`).

use axum::http::StatusCode;
use serde_json::json;

use super::refusal::{error, ApiError};
use super::Gateway;

/// Whose password changes, from which device.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    pub tenant: &'a str,
    pub uid: i64,
    pub device: &'a str,
    /// The WebSocket session asking, left open by the sign-out so it can
    /// be answered (it closes itself then); empty over HTTP.
    pub sid: &'a str,
}

/// How the caller shows they know the current password.
#[derive(Debug, Clone, Copy)]
pub enum Proof<'a> {
    /// Given with the change: checked like a login (the attempt is counted
    /// against the login's name and the client address before it is
    /// verified, [`super::limits::LoginSubjects`]), so a stolen token
    /// guesses no faster here than at `{login}`; a locked-out name gets
    /// `429`.
    OldPassword {
        old: &'a str,
        ip: Option<std::net::IpAddr>,
    },
    /// The session making the change signed in with it within
    /// [`FRESH_LOGIN_MS`].
    FreshLogin,
}

/// How recent a session's password login must be for `{acc}` to change the
/// password without asking for it again.
pub const FRESH_LOGIN_MS: i64 = 10 * 60 * 1000;

/// Changes the password of `who` to `new_password`.
pub async fn change(
    gw: &Gateway,
    who: Who<'_>,
    proof: Proof<'_>,
    new_password: &str,
) -> Result<crate::auth::Issued, ApiError> {
    crate::users::check_password(new_password)
        .map_err(|e| error(400, format!("malformed: new_password: {e}")))?;
    if let Proof::OldPassword { old, .. } = &proof {
        if old.len() > crate::users::MAX_PASSWORD_BYTES {
            return Err(error(400, "malformed: old_password is too long"));
        }
    }
    let mut redis = gw.redis.clone();
    super::limits::take(
        &mut redis,
        &gw.config.limits,
        who.tenant,
        who.uid,
        super::limits::Action::PasswordChange,
    )
    .await
    .map_err(super::refusal::limited)?;
    if gw
        .config
        .auth
        .dev_users
        .iter()
        .any(|u| u.tenant == who.tenant && u.uid == who.uid)
    {
        return Err(error(
            409,
            "this login is defined in the configuration; change it there",
        ));
    }
    let pool = gw
        .pools
        .get(&who.tenant)
        .map_err(|_| error(401, "authentication failed"))?;
    let Some((login, stored)) = crate::users::login_of(pool, who.uid)
        .await
        .map_err(super::refusal::unavailable)?
    else {
        return Err(error(404, "no password login for this user"));
    };
    if let Proof::OldPassword { old, ip } = proof {
        let subjects = super::limits::LoginSubjects::new(Some(&login), ip, &gw.config.limits);
        let mut redis = gw.redis.clone();
        subjects
            .reserve(&mut redis, &gw.config.limits)
            .await
            .map_err(super::refusal::limited)?;
        let (old, hash) = (old.to_string(), stored.clone());
        let right = tokio::task::spawn_blocking(move || crate::users::verify_password(&old, &hash))
            .await
            .unwrap_or(false);
        if !right {
            // The reserved attempt stays counted as a failed login.
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                "the old password is wrong".into(),
                Some(json!({"code": "WRONG_PASSWORD"})),
            ));
        }
        subjects.succeeded(&mut redis).await;
    }
    let new_hash = crate::users::hash_password_async(new_password)
        .await
        .map_err(super::refusal::unavailable)?;
    if !crate::users::replace_password_hash(pool, who.uid, &stored, &new_hash)
        .await
        .map_err(super::refusal::unavailable)?
    {
        return Err(error(
            409,
            "the password changed meanwhile; try again with the current one",
        ));
    }
    // Every token issued so far is refused from now on; the caller gets one
    // under the new auth version (its device keeps its generation).
    let current = crate::session_control::load(pool, who.uid)
        .await
        .map_err(super::refusal::unavailable)?;
    let auth_version = crate::session_control::next_auth_version(pool, who.uid)
        .await
        .map_err(super::refusal::unavailable)?;
    let event = crate::events::SessionControlEvent {
        event_id: crate::events::new_event_id(),
        tenant_id: who.tenant.to_string(),
        uid: who.uid,
        occurred_at: crate::events::now_ms(),
        actor_uid: who.uid,
        reason: "password changed by the user".into(),
        body: crate::events::SessionControlBody::PasswordReset(crate::events::AuthVersion {
            auth_version,
        }),
    };
    gw.sender
        .producer()
        .send(
            crate::kafka::topics::TopicKind::SessionControl,
            &format!("{}:{}", who.tenant, who.uid),
            &event,
            None,
        )
        .await
        .map_err(super::refusal::unavailable)?;
    // Every older token refused from the answer on (a stolen one included),
    // whether or not the control projection runs; the sign-out only moves
    // the auth version forward, so the projection's later write agrees.
    let mut redis = gw.redis.clone();
    if let Err(e) =
        crate::session_control::enforce_sparing(pool, &mut redis, &event, Some(&gw.hub), who.sid)
            .await
    {
        tracing::warn!(error = %e, uid = who.uid, "password change: signed out by the projection, not yet here");
    }
    let issued = gw.tokens.issue(
        &who.tenant,
        who.uid,
        who.device,
        auth_version,
        current.generation(who.device),
    );
    tracing::info!(tenant = %who.tenant, uid = who.uid, "password changed by the user; sessions signed out");
    Ok(issued)
}
