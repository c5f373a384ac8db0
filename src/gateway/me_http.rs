//! The chat list and profiles over HTTP (bearer token of the user):
//!
//! - `GET /v1/me/conversations?limit=&cursor=&catchup=` — conversations
//!   newest first with `unread`, the last message's preview and the total
//!   badge; `next` is the cursor of the following page. With `catchup=N`
//!   (seed 003 §9.1) each conversation with unread messages also carries
//!   its newest ≤ N of them, or only the count when there are more.
//! - `GET /v1/me/unread` — the badge: unread messages and conversations.
//! - `PUT /v1/me/profile` `{"fn", "photo", "note"}` — the user's profile.
//! - `PUT /v1/groups/{topic}/profile` `{"fn"|"name", "photo", "note"|"description"}`
//!   — a group's profile (owner or admin).
//! - `GET /v1/groups/{topic}/subscribers?limit=&user=` — the member list.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::conversations::{self, Cursor};
use crate::governance::Actor;
use crate::tinode;

use super::chats::{self, MAX_CATCHUP};
use super::governance::origin;
use super::http::{authenticate, message_json};
use super::refusal::{error, refused, ApiError};
use super::Gateway;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub limit: Option<i64>,
    pub cursor: Option<String>,
    pub catchup: Option<i64>,
}

pub async fn conversations(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let claims = authenticate(&gw, &headers).await?;
    let after = match p.cursor.as_deref() {
        None => None,
        Some(c) => Some(Cursor::parse(c).ok_or_else(|| error(400, "malformed: cursor"))?),
    };
    let catchup = match p.catchup {
        None => 0,
        Some(n) if (1..=MAX_CATCHUP).contains(&n) => n,
        Some(_) => {
            return Err(error(
                400,
                format!("malformed: catchup is 1 to {MAX_CATCHUP}"),
            ))
        }
    };
    let limit = p.limit.unwrap_or(50).clamp(1, conversations::MAX_PAGE);
    let query = conversations::Query {
        topic: None,
        changed_since_ms: None,
        after,
        limit,
    };
    let chats::Page { list, next } = chats::conversations_of(&gw, &claims.ten, claims.uid, &query)
        .await
        .map_err(refused)?;
    let online = chats::online_flags(&gw, &claims.ten, claims.uid, &list).await;
    let personal = chats::personal_of(&gw, &claims.ten, claims.uid, &list)
        .await
        .map_err(refused)?;
    let mut entries = Vec::with_capacity(list.len());
    for (c, online) in list.iter().zip(online) {
        let mut entry = chats::http_entry(c, claims.uid, online, &personal);
        if catchup > 0 && c.unread > 0 {
            let messages = chats::catch_up(&gw, &claims.ten, claims.uid, c, catchup)
                .await
                .map_err(refused)?
                .map(|page| page.iter().map(message_json).collect::<Vec<Value>>());
            entry["catchup"] = json!({"unread": c.unread, "messages": messages});
        }
        entries.push(entry);
    }
    let next = next.map(|c| c.encode());
    // A first page that holds every conversation is the badge already;
    // only a partial page needs the whole list read again.
    let whole = p.cursor.is_none() && next.is_none();
    let (unread, with_unread) = if whole {
        conversations::badge_of(&list)
    } else {
        badge(&gw, &claims.ten, claims.uid).await?
    };
    Ok(Json(json!({
        "conversations": entries,
        "next": next,
        "unread": unread,
        "conversations_with_unread": with_unread,
    }))
    .into_response())
}

async fn badge(gw: &Gateway, tenant: &str, uid: i64) -> Result<(i64, i64), ApiError> {
    let pool = gw
        .pools
        .get(tenant)
        .map_err(|_| error(500, "internal error"))?;
    conversations::hot::badge(
        pool,
        &gw.redis.clone(),
        gw.history.dellog_cache(),
        tenant,
        uid,
    )
    .await
    .map_err(super::refusal::unavailable)
}

/// `GET /v1/me/unread`
pub async fn unread(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    let (unread, with_unread) = badge(&gw, &claims.ten, claims.uid).await?;
    Ok(Json(json!({"unread": unread, "conversations_with_unread": with_unread})).into_response())
}

fn body_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| error(400, format!("malformed: {e}")))
}

/// `PUT /v1/me/profile`
pub async fn set_profile(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &claims, super::limits::Action::Change).await?;
    let change = chats::user_profile_change(&body_json(&body)?).map_err(refused)?;
    super::files::picture(&gw, &claims.ten, claims.uid, change.photo.as_deref())
        .await
        .map_err(refused)?;
    let id = chats::set_user_profile(&gw, &claims.ten, claims.uid, change)
        .await
        .map_err(refused)?;
    Ok((StatusCode::ACCEPTED, Json(json!({"events": [id]}))).into_response())
}

/// `PUT /v1/groups/{topic}/profile`
pub async fn set_group_profile(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    super::http::rate(&gw, &claims, super::limits::Action::Change).await?;
    let change = chats::group_profile_change(&body_json(&body)?).map_err(refused)?;
    super::files::picture(&gw, &claims.ten, claims.uid, change.photo.as_deref())
        .await
        .map_err(refused)?;
    let gov = &gw.governance;
    let standing = gov
        .standing(&claims.ten, &topic, claims.uid)
        .await
        .map_err(|r| error(r.0, r.1))?;
    let outcome = gov
        .set_profile(
            &claims.ten,
            &topic,
            Actor::User(claims.uid, standing),
            change,
            &origin(&claims, &headers)?,
        )
        .await
        .map_err(|r| error(r.0, r.1))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"topic": topic, "events": outcome.event_ids})),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembersParams {
    pub limit: Option<i64>,
    pub user: Option<String>,
}

/// `GET /v1/groups/{topic}/subscribers`
pub async fn members(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    params: Result<Query<MembersParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let claims = authenticate(&gw, &headers).await?;
    if !tinode::is_group_topic(&topic) {
        return Err(error(404, "group not found"));
    }
    super::reads::ensure_member(&gw, &claims.ten, &topic, claims.uid)
        .await
        .map_err(refused)?;
    let q = tinode::SubQuery {
        limit: p.limit,
        user: p.user,
        ..Default::default()
    };
    let subs = chats::group_members(&gw, &claims.ten, &topic, claims.uid, Some(&q))
        .await
        .map_err(refused)?;
    Ok(Json(json!({"topic": topic, "subscribers": subs})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasswordBody {
    pub old_password: String,
    pub new_password: String,
}

/// `PUT /v1/me/password` `{old_password, new_password}`: the caller changes
/// their own password login ([`super::password::change`], the old password
/// checked like a login). The answer carries a new token for the calling
/// device, under the new auth version.
pub async fn change_password(
    State(gw): State<Arc<Gateway>>,
    info: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    let body: PasswordBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    let ip = super::server::peer_of(info.map(|axum::Extension(i)| i));
    let who = super::password::Who {
        tenant: &claims.ten,
        uid: claims.uid,
        device: &claims.dev,
        sid: "",
    };
    let proof = super::password::Proof::OldPassword {
        old: &body.old_password,
        ip,
    };
    let issued = super::password::change(&gw, who, proof, &body.new_password).await?;
    Ok(Json(json!({"token": issued.token, "expires": issued.expires})).into_response())
}
