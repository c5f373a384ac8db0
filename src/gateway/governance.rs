//! The HTTP API of group governance and of edits and deletes for everyone
//! (bearer token of the acting user). Each call is checked by
//! [`crate::governance`] and answered `202` with the ids of the events it
//! produced; the pipelines make them take effect on every gateway.
//!
//! - `PATCH  /v1/groups/{topic}/messages/{seq}` — edit (body like a send)
//! - `DELETE /v1/groups/{topic}/messages/{seq}` — recall or moderate
//! - `POST   /v1/groups/{topic}/members` `{"uid": 7}` — add a member
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
use crate::governance::{Action, Actor, Outcome};

use super::auth::Claims;
use super::edits::{self, Caller};
use super::http::{authenticate, error, refused, send_as, ApiError, SendBody};
use super::Gateway;

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| error(400, format!("malformed: {e}")))
}

pub(super) fn origin(claims: &Claims, headers: &HeaderMap) -> Origin {
    Origin {
        device: claims.dev.clone(),
        traceparent: super::trace::traceparent(headers).unwrap_or_default(),
        ..Default::default()
    }
}

fn accepted(topic: &str, outcome: Outcome) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(json!({"topic": topic, "events": outcome.event_ids})),
    )
        .into_response()
}

/// Authenticates, then runs `action` as the caller.
async fn act(
    gw: &Gateway,
    headers: &HeaderMap,
    topic: &str,
    action: Action,
) -> Result<Response, ApiError> {
    let claims = authenticate(gw, headers).await?;
    let gov = &gw.governance;
    let standing = gov
        .standing(&claims.ten, topic, claims.uid)
        .await
        .map_err(|r| error(r.0, r.1))?;
    let outcome = gov
        .act(
            &claims.ten,
            topic,
            Actor::User(claims.uid, standing),
            action,
            &origin(&claims, headers),
            "",
        )
        .await
        .map_err(|r| error(r.0, r.1))?;
    Ok(accepted(topic, outcome))
}

fn seq_of(s: &str) -> Result<i64, ApiError> {
    s.parse::<i64>()
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| error(400, "malformed: seq must be a positive integer"))
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
    let seq = seq_of(&seq)?;
    let caller = Caller {
        tenant: &claims.ten,
        uid: claims.uid,
        origin: origin(&claims, &headers),
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

/// `POST /v1/groups/{topic}/members`
pub async fn add_member(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let UidBody { uid } = parse(&body)?;
    if uid <= 0 {
        return Err(error(400, "malformed: uid must be positive"));
    }
    act(&gw, &headers, &topic, Action::AddMember(uid)).await
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
