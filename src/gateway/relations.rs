//! The HTTP API of relations, push settings and user notifications. Each
//! call produces user events (`im.user.events.v1`, key `{tenant}:{uid}`);
//! the relations pipeline projects them and the notify pipeline tells every
//! online device of the user.
//!
//! - `POST   /v1/friends/requests` `{"uid": 7, "message": ""}`
//! - `POST   /v1/friends/requests/{uid}/accept`
//! - `DELETE /v1/friends/{uid}`
//! - `POST   /v1/blocks` `{"uid": 7}` · `DELETE /v1/blocks/{uid}`
//! - `PUT    /v1/me/push` `{"dnd": true}`
//! - `PUT    /v1/me/push/topics/{topic}` `{"muted": true}` (`usr<peer>` or `grp…`)
//! - `POST   /v1/admin/notifications` `{tenant, uid, title, text}` (admin token)
//! - `POST   /v1/admin/badges` `{tenant, uid, unread}` (admin token)

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use crate::events::{
    BadgeRefresh, FriendRef, FriendRequestAccepted, FriendRequestCreated, PushSettingsChanged,
    SystemNotification, UserEvent, UserEventBody,
};
use crate::kafka::topics::TopicKind;
use crate::relations::{contains, Set};

use super::http::authenticate;
use super::refusal::{error, ApiError};
use super::Gateway;
use crate::tinode;

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| error(400, format!("malformed: {e}")))
}

fn other_user(me: i64, s: &str) -> Result<i64, ApiError> {
    s.strip_prefix("usr")
        .unwrap_or(s)
        .parse::<i64>()
        .ok()
        .filter(|u| *u > 0 && *u != me)
        .ok_or_else(|| error(400, "malformed: uid must be another user's positive uid"))
}

/// Produces `events` in order; `202` with their ids.
async fn produce(gw: &Gateway, events: Vec<UserEvent>) -> Result<Response, ApiError> {
    let mut ids = Vec::with_capacity(events.len());
    for e in events {
        gw.sender
            .producer()
            .send(TopicKind::UserEvents, &e.key(), &e, None)
            .await
            .map_err(super::refusal::unavailable)?;
        ids.push(e.event_id);
    }
    Ok((StatusCode::ACCEPTED, Json(json!({"events": ids}))).into_response())
}

/// A setting put in force before the answer ([`super::personal`]): `202`
/// with its event's id.
async fn in_force(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    setting: super::personal::Setting,
) -> Result<Response, ApiError> {
    let id = super::personal::put_in_force(gw, tenant, uid, setting)
        .await
        .map_err(super::refusal::refused)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"events": [id]}))).into_response())
}

/// Whether either of the two ever asked the other to be friends: a
/// friendship accepted a moment ago (not projected yet) or half removed
/// (a retry) can be removed; a stranger cannot.
async fn asked_either_way(gw: &Gateway, tenant: &str, a: i64, b: i64) -> Result<bool, ApiError> {
    let pool = gw.pools.get(tenant).map_err(super::refusal::unavailable)?;
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM im_friend_requests \
         WHERE (from_uid = ? AND to_uid = ?) OR (from_uid = ? AND to_uid = ?) LIMIT 1",
    )
    .bind(a)
    .bind(b)
    .bind(b)
    .bind(a)
    .fetch_optional(pool)
    .await
    .map_err(|_| error(503, tinode::UNAVAILABLE))?;
    Ok(found.is_some())
}

async fn related(
    gw: &Gateway,
    tenant: &str,
    set: Set,
    uid: i64,
    other: i64,
) -> Result<bool, ApiError> {
    let pool = gw.pools.get(tenant).map_err(super::refusal::unavailable)?;
    let mut redis = gw.redis.clone();
    contains(pool, &mut redis, tenant, set, uid, other)
        .await
        .map_err(|_| error(503, tinode::UNAVAILABLE))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestBody {
    pub uid: i64,
    #[serde(default)]
    pub message: String,
}

/// `POST /v1/friends/requests`
pub async fn request_friend(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let me = authenticate(&gw, &headers).await?;
    let RequestBody { uid, message } = parse(&body)?;
    let to = other_user(me.uid, &uid.to_string())?;
    if message.len() > 512 {
        return Err(error(400, "malformed: message longer than 512 bytes"));
    }
    super::http::rate(&gw, &me, super::limits::Action::FriendRequest).await?;
    if related(&gw, &me.ten, Set::Blocks, to, me.uid).await? {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "blocked by the recipient".into(),
            Some(json!({"code": "BLOCKED"})),
        ));
    }
    if related(&gw, &me.ten, Set::Friends, me.uid, to).await? {
        return Err(error(409, "already friends"));
    }
    let body = UserEventBody::FriendRequestCreated(FriendRequestCreated {
        from_uid: me.uid,
        message,
    });
    produce(&gw, vec![UserEvent::new(&me.ten, to, me.uid, body)]).await
}

/// `POST /v1/friends/requests/{uid}/accept`: both become friends.
pub async fn accept_friend(
    State(gw): State<Arc<Gateway>>,
    Path(uid): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let me = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &me, super::limits::Action::Change).await?;
    let from = other_user(me.uid, &uid)?;
    let pool = gw.pools.get(&me.ten).map_err(super::refusal::unavailable)?;
    let pending: Option<String> = sqlx::query_scalar(
        "SELECT status FROM im_friend_requests WHERE from_uid = ? AND to_uid = ?",
    )
    .bind(from)
    .bind(me.uid)
    .fetch_optional(pool)
    .await
    .map_err(|_| error(503, tinode::UNAVAILABLE))?;
    match pending.as_deref() {
        None => return Err(error(404, "no friend request from this user")),
        Some("accepted") => return Err(error(409, "already accepted")),
        Some(_) => {}
    }
    let (t, m) = (me.ten.as_str(), me.uid);
    produce(
        &gw,
        vec![
            UserEvent::new(
                t,
                from,
                m,
                UserEventBody::FriendRequestAccepted(FriendRequestAccepted { by_uid: m }),
            ),
            UserEvent::new(
                t,
                m,
                m,
                UserEventBody::FriendAdded(FriendRef { friend_uid: from }),
            ),
            UserEvent::new(
                t,
                from,
                m,
                UserEventBody::FriendAdded(FriendRef { friend_uid: m }),
            ),
        ],
    )
    .await
}

/// `DELETE /v1/friends/{uid}`: both stop being friends.
pub async fn remove_friend(
    State(gw): State<Arc<Gateway>>,
    Path(uid): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let me = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &me, super::limits::Action::Change).await?;
    let other = other_user(me.uid, &uid)?;
    // Only a friend can be removed: else the call would notify a stranger
    // (`{pres friend.removed}`) on every try (issue 39).
    if !related(&gw, &me.ten, Set::Friends, me.uid, other).await?
        && !asked_either_way(&gw, &me.ten, me.uid, other).await?
    {
        return Err(error(404, "not a friend"));
    }
    let (t, m) = (me.ten.as_str(), me.uid);
    produce(
        &gw,
        vec![
            UserEvent::new(
                t,
                m,
                m,
                UserEventBody::FriendRemoved(FriendRef { friend_uid: other }),
            ),
            UserEvent::new(
                t,
                other,
                m,
                UserEventBody::FriendRemoved(FriendRef { friend_uid: m }),
            ),
        ],
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UidBody {
    pub uid: i64,
}

/// `POST /v1/blocks`
pub async fn block(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let me = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &me, super::limits::Action::Change).await?;
    let UidBody { uid } = parse(&body)?;
    let whom = other_user(me.uid, &uid.to_string())?;
    let setting = super::personal::Setting::Block {
        other: whom,
        blocked: true,
    };
    let answer = in_force(&gw, &me.ten, me.uid, setting).await?;
    super::personal::tell_peer_of_block(&gw, &me.ten, me.uid, whom, true).await;
    Ok(answer)
}

/// `DELETE /v1/blocks/{uid}`
pub async fn unblock(
    State(gw): State<Arc<Gateway>>,
    Path(uid): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let me = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &me, super::limits::Action::Change).await?;
    let whom = other_user(me.uid, &uid)?;
    let setting = super::personal::Setting::Block {
        other: whom,
        blocked: false,
    };
    let answer = in_force(&gw, &me.ten, me.uid, setting).await?;
    super::personal::tell_peer_of_block(&gw, &me.ten, me.uid, whom, false).await;
    Ok(answer)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DndBody {
    pub dnd: bool,
}

/// `PUT /v1/me/push`
pub async fn set_dnd(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let me = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &me, super::limits::Action::Change).await?;
    let DndBody { dnd } = parse(&body)?;
    let body = UserEventBody::PushSettingsChanged(PushSettingsChanged {
        dnd: Some(dnd),
        topic: None,
        topic_muted: false,
        version: 0,
    });
    produce(&gw, vec![UserEvent::new(&me.ten, me.uid, me.uid, body)]).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MutedBody {
    pub muted: bool,
}

/// `PUT /v1/me/push/topics/{topic}`
pub async fn mute_topic(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let me = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &me, super::limits::Action::Change).await?;
    let MutedBody { muted } = parse(&body)?;
    let topic = tinode::resolve_topic(&topic, me.uid)
        .filter(|t| tinode::is_conversation_topic(t))
        .ok_or_else(|| error(404, "topic not found"))?;
    in_force(
        &gw,
        &me.ten,
        me.uid,
        super::personal::Setting::Mute { topic, muted },
    )
    .await
}

/// The operator of an admin call on `tenant` (see [`super::admin::operator`]):
/// 401 without an admin token, 403 with a token of another tenant.
fn admin(gw: &Gateway, headers: &HeaderMap, tenant: &str) -> Result<(), ApiError> {
    match super::admin::operator(gw, headers) {
        None => Err(error(401, "admin authentication required")),
        Some(op) if op.tenant.as_deref().is_some_and(|t| t != tenant) => {
            Err(error(403, "this admin token is for another tenant"))
        }
        Some(_) => Ok(()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotificationBody {
    pub tenant: String,
    pub uid: i64,
    pub title: String,
    #[serde(default)]
    pub text: String,
}

/// `POST /v1/admin/notifications`: a system notification to one user.
pub async fn notify(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    if super::admin::operator(&gw, &headers).is_none() {
        return Err(error(401, "admin authentication required"));
    }
    let n: NotificationBody = parse(&body)?;
    admin(&gw, &headers, &n.tenant)?;
    if gw.config.tenant(&n.tenant).is_none() {
        return Err(error(404, "unknown tenant"));
    }
    if n.uid <= 0 || n.title.is_empty() {
        return Err(error(400, "malformed: uid and title are required"));
    }
    let body = UserEventBody::SystemNotification(SystemNotification {
        notification_id: crate::events::new_event_id(),
        title: n.title,
        text: n.text,
    });
    produce(&gw, vec![UserEvent::new(&n.tenant, n.uid, 0, body)]).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BadgeBody {
    pub tenant: String,
    pub uid: i64,
    #[serde(default)]
    pub unread: i64,
}

/// `POST /v1/admin/badges`: tells a user's devices to refresh unread badges.
pub async fn badge(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    if super::admin::operator(&gw, &headers).is_none() {
        return Err(error(401, "admin authentication required"));
    }
    let b: BadgeBody = parse(&body)?;
    admin(&gw, &headers, &b.tenant)?;
    if gw.config.tenant(&b.tenant).is_none() {
        return Err(error(404, "unknown tenant"));
    }
    if b.uid <= 0 {
        return Err(error(400, "malformed: uid must be positive"));
    }
    let body = UserEventBody::BadgeRefresh(BadgeRefresh { unread: b.unread });
    produce(&gw, vec![UserEvent::new(&b.tenant, b.uid, 0, body)]).await
}
