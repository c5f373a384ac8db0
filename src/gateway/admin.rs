//! Admin endpoints that produce session-control events (seed 002 §5):
//! revoke a device, sign a user out everywhere, disable / enable a user.
//! Bearer `auth.admin_token`; `?tenant=` names the tenant. The control
//! pipeline applies the events (version keys, closing live sessions).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::events::{
    new_event_id, now_ms, AuthVersion, DeviceRevoked, Empty, SessionControlBody,
    SessionControlEvent,
};
use crate::kafka::topics::TopicKind;
use crate::keys::TenantKeys;

use super::Gateway;

#[derive(Deserialize)]
pub struct TenantParam {
    pub tenant: String,
}

fn refuse(code: StatusCode, text: &str) -> Response {
    (code, Json(json!({"code": code.as_u16(), "error": text}))).into_response()
}

fn authorized(gw: &Gateway, headers: &HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == gw.config.auth.admin_token)
}

async fn produce(
    gw: &Gateway,
    headers: &HeaderMap,
    tenant: &str,
    uid: &str,
    body: impl FnOnce(i64) -> SessionControlBody,
) -> Response {
    if !authorized(gw, headers) {
        return refuse(StatusCode::UNAUTHORIZED, "admin authentication required");
    }
    if gw.config.tenant(tenant).is_none() {
        return refuse(StatusCode::NOT_FOUND, "unknown tenant");
    }
    let Ok(uid) = uid.parse::<i64>() else {
        return refuse(StatusCode::BAD_REQUEST, "malformed: uid");
    };
    let mut redis = gw.sender.redis();
    let current: Option<i64> = redis::cmd("GET")
        .arg(TenantKeys::new(tenant).auth_version(uid))
        .query_async(&mut redis)
        .await
        .unwrap_or(None);
    let event = SessionControlEvent {
        event_id: new_event_id(),
        tenant_id: tenant.to_string(),
        uid,
        occurred_at: now_ms(),
        actor_uid: 0,
        reason: "admin".into(),
        body: body(current.unwrap_or(0) + 1),
    };
    match gw
        .sender
        .producer()
        .send(
            TopicKind::SessionControl,
            &format!("{tenant}:{uid}"),
            &event,
            None,
        )
        .await
    {
        Ok(_) => (
            StatusCode::ACCEPTED,
            Json(json!({"event_id": event.event_id})),
        )
            .into_response(),
        Err(e) => refuse(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
    }
}

/// `POST /v1/admin/users/{uid}/devices/{device}/revoke?tenant=`
pub async fn revoke_device(
    State(gw): State<Arc<Gateway>>,
    Path((uid, device)): Path<(String, String)>,
    Query(t): Query<TenantParam>,
    headers: HeaderMap,
) -> Response {
    produce(&gw, &headers, &t.tenant, &uid, |_| {
        SessionControlBody::DeviceRevoked(DeviceRevoked {
            device,
            device_version: now_ms(),
        })
    })
    .await
}

/// `POST /v1/admin/users/{uid}/signout?tenant=`
pub async fn sign_out_everywhere(
    State(gw): State<Arc<Gateway>>,
    Path(uid): Path<String>,
    Query(t): Query<TenantParam>,
    headers: HeaderMap,
) -> Response {
    produce(&gw, &headers, &t.tenant, &uid, |v| {
        SessionControlBody::SignedOutEverywhere(AuthVersion { auth_version: v })
    })
    .await
}

/// `POST /v1/admin/users/{uid}/disable?tenant=`
pub async fn disable_user(
    State(gw): State<Arc<Gateway>>,
    Path(uid): Path<String>,
    Query(t): Query<TenantParam>,
    headers: HeaderMap,
) -> Response {
    produce(&gw, &headers, &t.tenant, &uid, |v| {
        SessionControlBody::UserDisabled(AuthVersion { auth_version: v })
    })
    .await
}

/// `POST /v1/admin/users/{uid}/enable?tenant=`
pub async fn enable_user(
    State(gw): State<Arc<Gateway>>,
    Path(uid): Path<String>,
    Query(t): Query<TenantParam>,
    headers: HeaderMap,
) -> Response {
    produce(&gw, &headers, &t.tenant, &uid, |_| {
        SessionControlBody::UserEnabled(Empty {})
    })
    .await
}
