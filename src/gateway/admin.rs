//! Admin endpoints that produce session-control events (seed 002 §5):
//! revoke a device, sign a user out everywhere, disable / enable a user;
//! `POST /v1/admin/commands`, which puts an admin command (seed 002 §7.2)
//! on the commands topic for the command pipeline; and `GET
//! /v1/admin/stats`, the summaries of [`crate::stats`].
//! Bearer: `auth.admin_token` (operator `admin`) or one of
//! `auth.admin_tokens` (operator: its name; a token with a tenant acts on
//! that tenant only, 403 elsewhere); `?tenant=` names the tenant. The
//! operator recorded (audit row, event reason) is the token's, never a
//! field of the request. The session-control routes put their event in
//! force before they answer (MySQL rows, Redis keys, closing live
//! sessions: `session_control::enforce`), as the control pipeline does
//! again for every event. Every operator route is served
//! on the operator port only (`gateway.admin_addr`), behind [`throttle`].

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::events::{
    new_event_id, now_ms, AbuseReportResolve, AdminCommand, AdminCommandBody, AuthVersion,
    DeviceRevoked, Empty, FileAuditUpdate, SessionControlBody, SessionControlEvent, TopicMember,
    TopicMemberMute, TopicMembers, TopicRef, TopicSeq, UserDevice, UserPasswordReset, UserRef,
};
use crate::kafka::topics::TopicKind;
use crate::session_control::UserControl;

use super::Gateway;

#[derive(Deserialize)]
pub struct TenantParam {
    pub tenant: String,
}

fn refuse(code: StatusCode, text: &str) -> Response {
    (code, Json(json!({"code": code.as_u16(), "error": text}))).into_response()
}

/// Who makes an admin call: the holder of the admin token it presents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The token's name (`admin` for the unnamed `auth.admin_token`).
    pub name: String,
    /// The one tenant the token may act on; `None`: every tenant.
    pub tenant: Option<String>,
}

/// The operator whose token `headers` present, if any (every configured
/// token is compared, each in constant time).
pub fn operator(gw: &Gateway, headers: &HeaderMap) -> Option<Operator> {
    let presented = crate::bearer::token(headers)?;
    let auth = &gw.config.auth;
    let mut found = None;
    if crate::bearer::matches(presented, &auth.admin_token) {
        found = Some(Operator {
            name: "admin".into(),
            tenant: None,
        });
    }
    for t in &auth.admin_tokens {
        if crate::bearer::matches(presented, &t.token) && found.is_none() {
            found = Some(Operator {
                name: t.name.clone(),
                tenant: t.tenant.clone(),
            });
        }
    }
    found
}

/// The operator of a call on `tenant`: 401 without a valid admin token,
/// 403 with a token of another tenant, 404 for a tenant not configured.
pub(super) fn check_admin(
    gw: &Gateway,
    headers: &HeaderMap,
    tenant: &str,
) -> Result<Operator, (StatusCode, &'static str)> {
    let Some(op) = operator(gw, headers) else {
        return Err((StatusCode::UNAUTHORIZED, "admin authentication required"));
    };
    if op.tenant.as_deref().is_some_and(|t| t != tenant) {
        return Err((
            StatusCode::FORBIDDEN,
            "this admin token is for another tenant",
        ));
    }
    if gw.config.tenant(tenant).is_none() {
        return Err((StatusCode::NOT_FOUND, "unknown tenant"));
    }
    Ok(op)
}

/// In front of every operator route: a call without a valid admin token
/// is refused (401) and counted against its client address; an address
/// with too many failures gets `429` + `Retry-After` for every wrong token
/// until its lockout ends, while a valid token still passes
/// ([`super::limits::AdminFailures`]).
pub async fn throttle(
    State((gw, failures)): State<(Arc<Gateway>, super::limits::AdminFailures)>,
    info: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let ip = super::server::peer_of(info.map(|axum::Extension(i)| i))
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let valid = operator(&gw, req.headers()).is_some();
    match failures.attempt(ip, valid, &gw.config.limits) {
        Err(ms) => {
            metrics::counter!(crate::metrics::RATE_LIMITED_TOTAL, "what" => "admin").increment(1);
            tracing::warn!(%ip, "admin call refused: too many failed admin tokens from this address");
            super::refusal::limited(super::limits::Limited::Over(ms)).into_response()
        }
        Ok(()) if !valid => {
            tracing::warn!(%ip, path = %req.uri().path(), "admin call with an invalid admin token");
            refuse(StatusCode::UNAUTHORIZED, "admin authentication required")
        }
        Ok(()) => next.run(req).await,
    }
}

fn admit(gw: &Gateway, headers: &HeaderMap, tenant: &str) -> Result<Operator, Response> {
    check_admin(gw, headers, tenant).map_err(|(code, text)| refuse(code, text))
}

async fn produce(
    gw: &Gateway,
    headers: &HeaderMap,
    tenant: &str,
    uid: &str,
    next_auth: bool,
    body: impl FnOnce(&UserControl, i64) -> SessionControlBody,
) -> Response {
    let op = match admit(gw, headers, tenant) {
        Ok(op) => op,
        Err(refused) => return refused,
    };
    let Some(uid) = uid.parse::<i64>().ok().filter(|u| *u > 0) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "malformed: uid must be a positive integer",
        );
    };
    let Ok(pool) = gw.pools.get(tenant) else {
        return refuse(StatusCode::NOT_FOUND, "unknown tenant");
    };
    // One change of the user's at a time, from its produce to its writes,
    // so they happen in log order (a late write of an earlier disable can
    // never land after a later enable); the projection applies the same
    // events in that order again.
    let mut redis = gw.redis.clone();
    let key = crate::keys::UserKeys::new(tenant, uid).control_lock();
    let lock = match crate::redis_util::RedisLock::acquire_waiting(
        &mut redis,
        &key,
        CONTROL_LOCK_MS,
        std::time::Duration::from_secs(2),
    )
    .await
    {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "another session-control change of this user is in progress; try again",
            )
        }
        Err(e) => return super::refusal::unavailable(e).into_response(),
    };
    let answer = produce_locked(gw, pool, tenant, uid, &op.name, next_auth, body).await;
    let _ = lock.release(&mut redis).await;
    answer
}

/// How long one session-control change may hold the user's lock.
const CONTROL_LOCK_MS: u64 = 30_000;

async fn produce_locked(
    gw: &Gateway,
    pool: &sqlx::MySqlPool,
    tenant: &str,
    uid: i64,
    operator: &str,
    next_auth: bool,
    body: impl FnOnce(&UserControl, i64) -> SessionControlBody,
) -> Response {
    // Versions are bumped past the ground truth (MySQL), not the cache; a
    // new auth version is taken atomically (two quick sign-outs never
    // share one).
    let current = match crate::session_control::load(pool, uid).await {
        Ok(c) => c,
        Err(e) => return super::refusal::unavailable(e).into_response(),
    };
    let auth_version = if next_auth {
        match crate::session_control::next_auth_version(pool, uid).await {
            Ok(v) => v,
            Err(e) => return super::refusal::unavailable(e).into_response(),
        }
    } else {
        current.auth_version
    };
    let event = SessionControlEvent {
        event_id: new_event_id(),
        tenant_id: tenant.to_string(),
        uid,
        occurred_at: now_ms(),
        actor_uid: 0,
        reason: format!("admin {operator}"),
        body: body(&current, auth_version),
    };
    if let Err(e) = gw
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
        return super::refusal::unavailable(e).into_response();
    }
    // In force before the answer: the user's next request is refused
    // (token checks read the row or its cache; this gateway's sessions
    // close at once, the others' on the close envelope) with no projection
    // running. Recorded but not yet in force (a store did not answer): the
    // projection puts it in force; the answer says so.
    let mut redis = gw.redis.clone();
    let in_force =
        match crate::session_control::enforce(pool, &mut redis, &event, Some(&gw.hub)).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, uid, "session control: recorded, not yet in force");
                false
            }
        };
    (
        StatusCode::ACCEPTED,
        Json(json!({"event_id": event.event_id, "in_force": in_force})),
    )
        .into_response()
}

/// `POST /v1/admin/users/{uid}/devices/{device}/revoke?tenant=`
pub async fn revoke_device(
    State(gw): State<Arc<Gateway>>,
    Path((uid, device)): Path<(String, String)>,
    Query(t): Query<TenantParam>,
    headers: HeaderMap,
) -> Response {
    if device.is_empty() || device.len() > crate::session_control::MAX_DEVICE_LEN {
        return refuse(
            StatusCode::BAD_REQUEST,
            "malformed: device must be 1-191 bytes",
        );
    }
    produce(&gw, &headers, &t.tenant, &uid, false, |c, _| {
        // Every token of the device issued so far is below this generation.
        let device_version = c.generation(&device) + 1;
        SessionControlBody::DeviceRevoked(DeviceRevoked {
            device,
            device_version,
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
    produce(&gw, &headers, &t.tenant, &uid, true, |_, auth_version| {
        SessionControlBody::SignedOutEverywhere(AuthVersion { auth_version })
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
    produce(&gw, &headers, &t.tenant, &uid, true, |_, auth_version| {
        SessionControlBody::UserDisabled(AuthVersion { auth_version })
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
    produce(&gw, &headers, &t.tenant, &uid, false, |_, _| {
        SessionControlBody::UserEnabled(Empty {})
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    pub command_id: String,
    pub tenant: String,
    /// Ignored (kept for old clients): the operator recorded is the name
    /// of the admin token the call presents.
    #[serde(default)]
    pub operator: Option<String>,
    #[serde(default)]
    pub reason: String,
    /// A seed 002 §7.2 kind: `user.disable`, `group.admin.set`, …
    pub kind: String,
    #[serde(default)]
    pub topic: Option<String>,
    #[serde(default)]
    pub uid: Option<i64>,
    /// For `group.member.add` (bulk membership, no add policy or limit).
    #[serde(default)]
    pub uids: Option<Vec<i64>>,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub seq: Option<i64>,
    /// RFC 3339, for `group.member.mute` (absent lifts the mute).
    #[serde(default)]
    pub until: Option<String>,
    /// `user.password.reset`: the new password, hashed here (Argon2id)
    /// before the command is produced: only its hash travels. Absent: the
    /// old password stops working and none is set.
    #[serde(default)]
    pub password: Option<String>,
    /// `file.audit.update`: `ok` or `blocked`.
    #[serde(default)]
    pub status: Option<String>,
    /// `abuse.report.resolve`: the report, `dismissed` or `actioned`, and
    /// an optional note.
    #[serde(default)]
    pub report_id: Option<String>,
    #[serde(default)]
    pub resolution: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
}

/// The command's body from its kind and the fields that kind needs
/// (`password_hash`: the Argon2id hash of `password`, made by the caller
/// off the async threads).
pub fn command_body(c: &CommandBody, password_hash: &str) -> Result<AdminCommandBody, String> {
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
        "user.password.reset" => AdminCommandBody::UserPasswordReset(UserPasswordReset {
            uid: uid()?,
            password_hash: password_hash.to_string(),
        }),
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
        "group.member.add" => AdminCommandBody::GroupMemberAdd(TopicMembers {
            topic: topic()?,
            uids: match (&c.uids, c.uid) {
                (Some(uids), None) if !uids.is_empty() => uids.clone(),
                (None, Some(uid)) => vec![uid],
                _ => return Err("group.member.add needs uids (or one uid)".into()),
            },
        }),
        "message.moderate" => AdminCommandBody::MessageModerate(TopicSeq {
            topic: topic()?,
            seq: c.seq.ok_or("message.moderate needs seq")?,
        }),
        "file.audit.update" => AdminCommandBody::FileAuditUpdate(FileAuditUpdate {
            topic: topic()?,
            seq: c.seq.ok_or("file.audit.update needs seq")?,
            status: c
                .status
                .clone()
                .filter(|s| crate::references::files::Audit::parse(s).is_some())
                .ok_or("file.audit.update needs status: ok or blocked")?,
        }),
        "abuse.report.resolve" => AdminCommandBody::AbuseReportResolve(AbuseReportResolve {
            report_id: c
                .report_id
                .clone()
                .filter(|r| !r.is_empty())
                .ok_or("abuse.report.resolve needs report_id")?,
            resolution: c
                .resolution
                .clone()
                .filter(|r| r == "dismissed" || r == "actioned")
                .ok_or("abuse.report.resolve needs resolution: dismissed or actioned")?,
            note: c.note.clone().unwrap_or_default(),
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
    if operator(&gw, &headers).is_none() {
        return refuse(StatusCode::UNAUTHORIZED, "admin authentication required");
    }
    let c: CommandBody = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("malformed: {e}")),
    };
    let op = match admit(&gw, &headers, &c.tenant) {
        Ok(op) => op,
        Err(refused) => return refused,
    };
    if c.command_id.is_empty() || c.command_id.len() > 64 {
        return refuse(
            StatusCode::BAD_REQUEST,
            "malformed: command_id must be 1-64 characters",
        );
    }
    // The new password of a reset is hashed here: only its hash travels.
    let password_hash = match (c.kind.as_str(), &c.password) {
        ("user.password.reset", Some(p)) => {
            if let Err(e) = crate::users::check_password(p) {
                return refuse(StatusCode::BAD_REQUEST, &format!("malformed: {e}"));
            }
            match crate::users::hash_password_async(p).await {
                Ok(h) => h,
                Err(e) => return super::refusal::unavailable(e).into_response(),
            }
        }
        (_, Some(_)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "malformed: password is for user.password.reset only",
            )
        }
        (_, None) => String::new(),
    };
    let body = match command_body(&c, &password_hash) {
        Ok(b) => b,
        Err(why) => return refuse(StatusCode::BAD_REQUEST, &format!("malformed: {why}")),
    };
    let command = AdminCommand {
        command_id: c.command_id.clone(),
        tenant_id: c.tenant,
        issued_at: now_ms(),
        operator: op.name,
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
        Err(e) => super::refusal::unavailable(e).into_response(),
    }
}

/// Longest range `GET /v1/admin/stats` reads, in days.
const STATS_MAX_DAYS: i64 = 366;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsParams {
    pub tenant: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub topic: Option<String>,
}

/// `GET /v1/admin/stats?tenant=&from=YYYY-MM-DD&to=YYYY-MM-DD&topic=`: the
/// tenant's counts per UTC day and month (messages, edits, recalls,
/// deletes, active senders) from the summary tables only. Defaults: the
/// 30 days up to today; at most 366 days.
pub async fn stats(
    State(gw): State<Arc<Gateway>>,
    params: Result<Query<StatsParams>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let Query(p) = match params {
        Ok(p) => p,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("malformed: {e}")),
    };
    if let Err(refused) = admit(&gw, &headers, &p.tenant) {
        return refused;
    }
    let day = |text: &Option<String>, name: &str| match text {
        None => Ok(None),
        Some(t) => chrono::NaiveDate::parse_from_str(t, "%Y-%m-%d")
            .map(Some)
            .map_err(|_| format!("malformed: {name} is a date, YYYY-MM-DD")),
    };
    let (from, to) = match (day(&p.from, "from"), day(&p.to, "to")) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => return refuse(StatusCode::BAD_REQUEST, &e),
    };
    let to = to.unwrap_or_else(|| chrono::Utc::now().date_naive());
    let from = from.unwrap_or(to - chrono::Duration::days(29));
    if from > to {
        return refuse(StatusCode::BAD_REQUEST, "malformed: from is after to");
    }
    if (to - from).num_days() + 1 > STATS_MAX_DAYS {
        return refuse(
            StatusCode::BAD_REQUEST,
            &format!("a report spans at most {STATS_MAX_DAYS} days"),
        );
    }
    if p.topic
        .as_ref()
        .is_some_and(|t| t.is_empty() || t.len() > 64)
    {
        return refuse(StatusCode::BAD_REQUEST, "malformed: topic");
    }
    let Ok(pool) = gw.pools.get(&p.tenant) else {
        return refuse(StatusCode::NOT_FOUND, "unknown tenant");
    };
    match crate::stats::report(pool, from, to, p.topic.as_deref()).await {
        Ok(r) => Json(json!({
            "tenant": p.tenant,
            "from": from.to_string(),
            "to": to.to_string(),
            "topic": p.topic,
            "days": r.days,
            "months": r.months,
            "total": r.total,
        }))
        .into_response(),
        Err(e) => super::refusal::unavailable(e).into_response(),
    }
}
