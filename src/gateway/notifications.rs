//! A user's system notifications over HTTP (bearer token of the user; see
//! [`crate::notifications`]):
//!
//! - `GET /v1/me/notifications?limit=&before=&unread=true` — newest first
//!   (`id`, `kind`, `title`, `text`, `from`, `topic`, `params`, `ts`,
//!   `read`), the user's `unread` count, and `next_before`, the cursor of
//!   the following page.
//! - `POST /v1/me/notifications/read` `{"ids": ["…"]}` or `{"all": true}` —
//!   marks them read: a `NotificationsRead` user event, which every device
//!   of the user gets live (`{pres topic="me" what="upd"
//!   event="notification.read"}`) and the relations pipeline records.
//!
//! Only the caller's own notifications are read or marked: the user comes
//! from the token, never from the request.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::events::{NotificationsRead, UserEvent, UserEventBody};
use crate::kafka::topics::TopicKind;
use crate::notifications::{self as notes, DEFAULT_PAGE, MAX_ID_BYTES, MAX_PAGE, MAX_READ_IDS};

use super::http::{authenticate, rate};
use super::refusal::{error, unavailable, ApiError};
use super::Gateway;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub limit: Option<i64>,
    pub before: Option<i64>,
    pub unread: Option<bool>,
}

/// `GET /v1/me/notifications`
pub async fn list(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let claims = authenticate(&gw, &headers).await?;
    let limit = p.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(error(400, format!("malformed: limit is 1 to {MAX_PAGE}")));
    }
    if p.before.is_some_and(|b| b <= 0) {
        return Err(error(400, "malformed: before is a cursor from next_before"));
    }
    let pool = gw.pools.get(&claims.ten).map_err(unavailable)?;
    let page = notes::list(pool, claims.uid, p.before, limit, p.unread.unwrap_or(false))
        .await
        .map_err(unavailable)?;
    Ok(Json(json!({
        "notifications": page.notifications.iter().map(|n| n.json()).collect::<Vec<_>>(),
        "unread": page.unread,
        "next_before": page.next_before,
    }))
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadBody {
    #[serde(default)]
    pub ids: Vec<String>,
    #[serde(default)]
    pub all: bool,
}

/// `POST /v1/me/notifications/read`
pub async fn read(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    let ReadBody { mut ids, all } =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    if all != ids.is_empty() {
        return Err(error(
            400,
            "malformed: give either ids (a non-empty list) or all: true",
        ));
    }
    if ids.len() > MAX_READ_IDS
        || ids
            .iter()
            .any(|id| id.is_empty() || id.len() > MAX_ID_BYTES)
    {
        return Err(error(
            400,
            format!("malformed: at most {MAX_READ_IDS} ids of 1 to {MAX_ID_BYTES} bytes"),
        ));
    }
    ids.sort_unstable();
    ids.dedup();
    rate(&gw, &claims, super::limits::Action::Receipt).await?;
    let event = UserEvent::new(
        &claims.ten,
        claims.uid,
        claims.uid,
        UserEventBody::NotificationsRead(NotificationsRead { ids, up_to: 0 }),
    );
    // "All": everything that happened up to this request.
    let event = if all {
        UserEvent {
            body: UserEventBody::NotificationsRead(NotificationsRead {
                ids: Vec::new(),
                up_to: event.occurred_at,
            }),
            ..event
        }
    } else {
        event
    };
    gw.sender
        .producer()
        .send(TopicKind::UserEvents, &event.key(), &event, None)
        .await
        .map_err(unavailable)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"events": [event.event_id]})),
    )
        .into_response())
}
