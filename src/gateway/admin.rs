//! Admin endpoints that produce session-control events (seed 002 §5):
//! revoke a device, sign a user out everywhere, disable / enable a user;
//! and `POST /v1/admin/commands`, which puts an admin command (seed 002
//! §7.2) on the commands topic for the command pipeline.
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
    new_event_id, now_ms, AdminCommand, AdminCommandBody, AuthVersion, DeviceRevoked, Empty,
    SessionControlBody, SessionControlEvent, TopicMember, TopicMemberMute, TopicRef, TopicSeq,
    UserDevice, UserRef,
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
    crate::bearer::presented(headers, &gw.config.auth.admin_token)
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
    let Some(uid) = uid.parse::<i64>().ok().filter(|u| *u > 0) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "malformed: uid must be a positive integer",
        );
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
        Err(e) => super::http::unavailable(e).into_response(),
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    pub command_id: String,
    pub tenant: String,
    pub operator: String,
    #[serde(default)]
    pub reason: String,
    /// A seed 002 §7.2 kind: `user.disable`, `group.admin.set`, …
    pub kind: String,
    #[serde(default)]
    pub topic: Option<String>,
    #[serde(default)]
    pub uid: Option<i64>,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub seq: Option<i64>,
    /// RFC 3339, for `group.member.mute` (absent lifts the mute).
    #[serde(default)]
    pub until: Option<String>,
}

/// The command's body from its kind and the fields that kind needs.
pub fn command_body(c: &CommandBody) -> Result<AdminCommandBody, String> {
    let uid = || c.uid.ok_or_else(|| format!("{} needs uid", c.kind));
    let topic = || {
        c.topic
            .clone()
            .ok_or_else(|| format!("{} needs topic", c.kind))
    };
    let member = || -> Result<TopicMember, String> {
        Ok(TopicMember {
            topic: topic()?,
            uid: uid()?,
        })
    };
    Ok(match c.kind.as_str() {
        "user.disable" => AdminCommandBody::UserDisable(UserRef { uid: uid()? }),
        "user.enable" => AdminCommandBody::UserEnable(UserRef { uid: uid()? }),
        "user.password.reset" => AdminCommandBody::UserPasswordReset(UserRef { uid: uid()? }),
        "user.device.revoke" => AdminCommandBody::UserDeviceRevoke(UserDevice {
            uid: uid()?,
            device: c.device.clone().ok_or("user.device.revoke needs device")?,
        }),
        "group.delete" => AdminCommandBody::GroupDelete(TopicRef { topic: topic()? }),
        "group.member.remove" => AdminCommandBody::GroupMemberRemove(member()?),
        "group.admin.set" => AdminCommandBody::GroupAdminSet(member()?),
        "group.admin.remove" => AdminCommandBody::GroupAdminRemove(member()?),
        "group.member.mute" => AdminCommandBody::GroupMemberMute(TopicMemberMute {
            topic: topic()?,
            uid: uid()?,
            until: match &c.until {
                None => None,
                Some(t) => Some(
                    chrono::DateTime::parse_from_rfc3339(t)
                        .map_err(|_| "until must be RFC 3339")?
                        .timestamp_millis(),
                ),
            },
        }),
        "message.moderate" => AdminCommandBody::MessageModerate(TopicSeq {
            topic: topic()?,
            seq: c.seq.ok_or("message.moderate needs seq")?,
        }),
        other => return Err(format!("unknown command kind {other:?}")),
    })
}

/// `POST /v1/admin/commands`: puts one admin command on the commands topic
/// (the command pipeline executes it and writes its result).
pub async fn submit_command(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !authorized(&gw, &headers) {
        return refuse(StatusCode::UNAUTHORIZED, "admin authentication required");
    }
    let c: CommandBody = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("malformed: {e}")),
    };
    if gw.config.tenant(&c.tenant).is_none() {
        return refuse(StatusCode::NOT_FOUND, "unknown tenant");
    }
    if c.command_id.is_empty() || c.command_id.len() > 64 {
        return refuse(
            StatusCode::BAD_REQUEST,
            "malformed: command_id must be 1-64 characters",
        );
    }
    let body = match command_body(&c) {
        Ok(b) => b,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, &format!("malformed: {why}")),
    };
    let command = AdminCommand {
        command_id: c.command_id.clone(),
        tenant_id: c.tenant,
        issued_at: now_ms(),
        operator: c.operator,
        reason: c.reason,
        body,
    };
    match gw
        .sender
        .producer()
        .send(
            TopicKind::AdminCommands,
            &command.command_id,
            &command,
            None,
        )
        .await
    {
        Ok(_) => (
            StatusCode::ACCEPTED,
            Json(json!({"command_id": command.command_id})),
        )
            .into_response(),
        Err(e) => super::http::unavailable(e).into_response(),
    }
}
