//! The HTTP API of group governance and of edits and deletes for everyone
//! (bearer token of the acting user). Each call is decided by
//! [`crate::governance`] on the group write model and answered `202` with
//! the ids of the events it produced: the change is in force on every
//! gateway from that answer on (the pipelines make the projections follow).
//! An `Idempotency-Key` header (1-64 of `[A-Za-z0-9_.:-]`) names the
//! command: a retry with the same key gets the same answer and the same
//! events.
//!
//! - `PATCH  /v1/groups/{topic}/messages/{seq}` — edit (body like a send)
//! - `DELETE /v1/groups/{topic}/messages/{seq}` — recall or moderate
//! - `POST   /v1/groups/{topic}/members` `{"uid": 7}` or `{"uids": [..]}` —
//!   add members (or invite them, as their add policy says)
//! - `POST   /v1/groups/{topic}/invitation` — accept the caller's invitation
//! - `DELETE /v1/groups/{topic}/invitation` — decline it
//! - `GET|PUT /v1/me/settings` `{"add_policy": "anyone"|"contacts"|"nobody"}`
//! - `DELETE /v1/groups/{topic}/members/{uid}` — kick (own uid: leave)
//! - `PUT    /v1/groups/{topic}/members/{uid}/role` `{"role": "admin"|"member"}`
//! - `PUT    /v1/groups/{topic}/members/{uid}/mute` `{"until": RFC 3339 | null}`
//! - `PUT    /v1/groups/{topic}/owner` `{"uid": 7}` — transfer ownership
//! - `PUT    /v1/groups/{topic}/mute` `{"mute_all": true}`
//! - `DELETE /v1/groups/{topic}` — dissolve

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use crate::events::SeqRange;
use crate::governance::exec::Origin;
use crate::governance::{consent, Action, Actor, Outcome};
use crate::groups::Standing;

use super::edits::{self, Caller};
use super::http::{authenticate, send_as, SendBody};
use super::refusal::{error, refused, ApiError};
use super::Gateway;
use crate::auth::Claims;

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| error(400, format!("malformed: {e}")))
}

/// Where a governance call comes from, with its command id (the
/// `Idempotency-Key` header, when the client sends one).
pub(super) fn origin(claims: &Claims, headers: &HeaderMap) -> Result<Origin, ApiError> {
    let command_id = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let key = v
                .to_str()
                .ok()
                .filter(|k| {
                    !k.is_empty()
                        && k.len() <= 64
                        && k.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
                })
                .ok_or_else(|| {
                    error(
                        400,
                        "malformed: Idempotency-Key must be 1-64 of [A-Za-z0-9_.:-]",
                    )
                })?;
            Some(key.to_string())
        }
    };
    Ok(Origin {
        device: claims.dev.clone(),
        traceparent: super::trace::traceparent(headers).unwrap_or_default(),
        command_id,
        ..Default::default()
    })
}

fn accepted(topic: &str, outcome: Outcome) -> Response {
    let mut body = json!({"topic": topic, "events": outcome.event_ids});
    if !outcome.invited.is_empty() {
        body["invited"] = json!(outcome.invited);
    }
    if outcome.replayed {
        body["replayed"] = json!(true);
    }
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

/// Authenticates, then runs `action` as the caller.
async fn act(
    gw: &Gateway,
    headers: &HeaderMap,
    topic: &str,
    action: Action,
) -> Result<Response, ApiError> {
    let claims = authenticate(gw, headers).await?;
    super::http::rate(gw, &claims, super::limits::Action::Change).await?;
    let origin = origin(&claims, headers)?;
    // The standing is the write model's, read by `act` with the target's.
    let outcome = gw
        .governance
        .act(
            &claims.ten,
            topic,
            Actor::User(claims.uid, Standing::NotMember),
            action,
            &origin,
            "",
        )
        .await
        .map_err(|r| error(r.0, r.1))?;
    Ok(accepted(topic, outcome))
}

fn seq_of(s: &str) -> Result<i64, ApiError> {
    crate::fields::seq_text(s).ok_or_else(|| {
        error(
            400,
            format!(
                "malformed: seq must be an integer from 1 to {}",
                crate::fields::SEQ_MAX
            ),
        )
    })
}

fn uid_of(s: &str) -> Result<i64, ApiError> {
    let s = s.strip_prefix("usr").unwrap_or(s);
    s.parse::<i64>()
        .ok()
        .filter(|u| *u > 0)
        .ok_or_else(|| error(400, "malformed: uid must be a positive integer"))
}

/// `PATCH /v1/groups/{topic}/messages/{seq}`
pub async fn edit_message(
    State(gw): State<Arc<Gateway>>,
    Path((topic, seq)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    let seq = seq_of(&seq)?;
    let body: SendBody = parse(&body)?;
    send_as(&gw, claims, &topic, body, Some(seq), &headers).await
}

/// `DELETE /v1/groups/{topic}/messages/{seq}`
pub async fn delete_message(
    State(gw): State<Arc<Gateway>>,
    Path((topic, seq)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &claims, super::limits::Action::Change).await?;
    let seq = seq_of(&seq)?;
    let caller = Caller {
        tenant: &claims.ten,
        uid: claims.uid,
        origin: origin(&claims, &headers)?,
    };
    let range = [SeqRange {
        low: seq,
        hi: seq + 1,
    }];
    let done = edits::hard_delete(&gw, &caller, &topic, &range)
        .await
        .map_err(refused)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"topic": topic, "del": done.del_id(), "action": done.action()})),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UidBody {
    pub uid: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddBody {
    #[serde(default)]
    pub uid: Option<i64>,
    #[serde(default)]
    pub uids: Vec<i64>,
}

/// `POST /v1/groups/{topic}/members`: `{"uid": 7}` or `{"uids": [..]}`
/// (at most `limits.members_per_request`); each is added or invited, as
/// their add policy says. `202 {events, invited}`.
pub async fn add_member(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let AddBody { uid, mut uids } = parse(&body)?;
    uids.extend(uid);
    let most = gw.config.limits.members_per_request;
    if uids.is_empty() || uids.iter().any(|u| *u <= 0) {
        return Err(error(400, "malformed: name positive uids (uid or uids)"));
    }
    if uids.len() > most {
        return Err(error(
            400,
            format!(
                "too many members: at most {most} per request (limits.members_per_request); \
                 operators add more through the group.member.add admin command"
            ),
        ));
    }
    let claims = authenticate(&gw, &headers).await?;
    let origin = origin(&claims, &headers)?;
    let mut redis = gw.redis.clone();
    super::limits::take_n(
        &mut redis,
        &gw.config.limits,
        &claims.ten,
        claims.uid,
        super::limits::Action::MemberAdd,
        uids.len() as u32,
    )
    .await
    .map_err(super::refusal::limited)?;
    let outcome = gw
        .governance
        .add_members(
            &claims.ten,
            &topic,
            Actor::User(claims.uid, Standing::NotMember),
            &uids,
            &origin,
        )
        .await
        .map_err(|r| error(r.0, r.1))?;
    Ok(accepted(&topic, outcome))
}

/// `POST /v1/groups/{topic}/invitation`: the caller accepts their
/// invitation and joins.
pub async fn accept_invitation(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    answer_invitation(&gw, &headers, &topic, true).await
}

/// `DELETE /v1/groups/{topic}/invitation`: the caller declines it.
pub async fn decline_invitation(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    answer_invitation(&gw, &headers, &topic, false).await
}

async fn answer_invitation(
    gw: &Gateway,
    headers: &HeaderMap,
    topic: &str,
    accept: bool,
) -> Result<Response, ApiError> {
    let claims = authenticate(gw, headers).await?;
    super::http::rate(gw, &claims, super::limits::Action::Change).await?;
    let origin = origin(&claims, headers)?;
    let outcome = gw
        .governance
        .answer_invitation(&claims.ten, topic, claims.uid, accept, &origin)
        .await
        .map_err(|r| error(r.0, r.1))?;
    Ok(accepted(topic, outcome))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsBody {
    pub add_policy: String,
}

/// `GET /v1/me/settings`: who may add the caller to a group directly.
pub async fn settings(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    let pool = gw
        .pools
        .get(&claims.ten)
        .map_err(super::refusal::unavailable)?;
    let policy = consent::policy(pool, claims.uid)
        .await
        .map_err(|r| error(r.0, r.1))?;
    Ok(Json(json!({"add_policy": policy.as_str()})).into_response())
}

/// `PUT /v1/me/settings` `{"add_policy": "anyone"|"contacts"|"nobody"}`.
pub async fn set_settings(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let SettingsBody { add_policy } = parse(&body)?;
    let policy = consent::AddPolicy::parse(&add_policy).ok_or_else(|| {
        error(
            400,
            "malformed: add_policy must be anyone, contacts or nobody",
        )
    })?;
    let claims = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &claims, super::limits::Action::Change).await?;
    let pool = gw
        .pools
        .get(&claims.ten)
        .map_err(super::refusal::unavailable)?;
    consent::set_policy(pool, claims.uid, policy)
        .await
        .map_err(|r| error(r.0, r.1))?;
    Ok(Json(json!({"add_policy": policy.as_str()})).into_response())
}

/// `DELETE /v1/groups/{topic}/members/{uid}`: the caller's own uid leaves.
pub async fn remove_member(
    State(gw): State<Arc<Gateway>>,
    Path((topic, uid)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let uid = uid_of(&uid)?;
    let claims = authenticate(&gw, &headers).await?;
    let action = if uid == claims.uid {
        Action::Leave
    } else {
        Action::Kick(uid)
    };
    act(&gw, &headers, &topic, action).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleBody {
    pub role: String,
}

/// `PUT /v1/groups/{topic}/members/{uid}/role`
pub async fn set_role(
    State(gw): State<Arc<Gateway>>,
    Path((topic, uid)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let uid = uid_of(&uid)?;
    let RoleBody { role } = parse(&body)?;
    let action = match role.as_str() {
        "admin" => Action::SetAdmin(uid),
        "member" => Action::RemoveAdmin(uid),
        other => {
            return Err(error(
                400,
                format!("malformed: role must be admin or member (got {other:?}); use /owner to transfer ownership"),
            ))
        }
    };
    act(&gw, &headers, &topic, action).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MuteBody {
    /// RFC 3339; `null` lifts the mute.
    pub until: Option<String>,
}

/// `PUT /v1/groups/{topic}/members/{uid}/mute`
pub async fn mute_member(
    State(gw): State<Arc<Gateway>>,
    Path((topic, uid)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let uid = uid_of(&uid)?;
    let MuteBody { until } = parse(&body)?;
    let until = match until {
        None => None,
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(&t)
                .map_err(|_| error(400, "malformed: until must be RFC 3339"))?
                .timestamp_millis(),
        ),
    };
    act(&gw, &headers, &topic, Action::Mute(uid, until)).await
}

/// `PUT /v1/groups/{topic}/owner`
pub async fn transfer_owner(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let UidBody { uid } = parse(&body)?;
    act(&gw, &headers, &topic, Action::TransferOwner(uid)).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MuteAllBody {
    pub mute_all: bool,
}

/// `PUT /v1/groups/{topic}/mute`
pub async fn mute_all(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let MuteAllBody { mute_all } = parse(&body)?;
    act(&gw, &headers, &topic, Action::MuteAll(mute_all)).await
}

/// `DELETE /v1/groups/{topic}`
pub async fn dissolve(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    act(&gw, &headers, &topic, Action::Dissolve).await
}
