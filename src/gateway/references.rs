//! References to messages over HTTP (seed 000 §12 item 8). Each keeps only
//! `(topic, seq)`; every read resolves the message through the read path
//! for its reader, so a reference finds its message after a month switch
//! or an archive, and a message taken back shows as `recalled` /
//! `deleted` without its text.
//!
//! Members (bearer token of the user):
//! - `POST /v1/groups/{topic}/messages/{seq}/report` `{"reason"}` — report
//!   a message to the tenant's moderators (once per message and reporter).
//! - `PUT /v1/me/favorites/{topic}/{seq}`, `DELETE` the same, and
//!   `GET /v1/me/favorites?limit=&cursor=` — saved messages, newest saved
//!   first; a conversation the user has left shows as `no_access`. A
//!   one-to-one conversation is named `usr<peer>` as on the WebSocket.
//! - `GET /v1/groups/{topic}/files?before=&limit=` — the conversation's file
//!   messages, newest first.
//!
//! Operators (admin token, `?tenant=`):
//! - `GET /v1/admin/reports?tenant=&status=open&limit=&cursor=` — the
//!   moderation queue, oldest first, each with the message as stored.
//! - `POST /v1/admin/reports/{report_id}/resolve?tenant=`
//!   `{"resolution": "dismissed"|"actioned", "note"}` — close a report.
//!
//! Writes produce events (`MessageReported`, `MessageReportResolved` on
//! the group events topic, `FavoriteAdded` / `FavoriteRemoved` on the user
//! events topic) and answer `202`; the references and relations pipelines
//! apply them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::events::{
    FavoriteRef, GroupEvent, GroupEventBody, MessageReportResolved, MessageReported, UserEvent,
    UserEventBody,
};
use crate::groups::Membership;
use crate::kafka::topics::TopicKind;
use crate::references::{self, favorites, files, reports, Resolved, State as RefState};
use crate::tinode;

use super::http::{authenticate, message_json, rate, reader};
use super::refusal::{error, refused, unavailable, ApiError};
use super::Gateway;
use crate::auth::Claims;

fn seq_of(text: &str) -> Result<i64, ApiError> {
    crate::fields::seq_text(text).ok_or_else(|| error(400, "malformed: seq"))
}

fn pool<'g>(gw: &'g Gateway, tenant: &str) -> Result<&'g sqlx::MySqlPool, ApiError> {
    gw.pools
        .get(tenant)
        .map_err(|_| error(404, "unknown tenant"))
}

/// The message `seq` as `claims`' user may read it now (a member's check
/// is the caller's).
async fn readable(
    gw: &Gateway,
    claims: &Claims,
    topic: &str,
    seq: i64,
) -> Result<Resolved, ApiError> {
    references::resolve(&gw.history, &claims.ten, claims.uid, topic, seq)
        .await
        .map_err(|e| refused(e.into()))
}

/// How long a reference to an acknowledged message waits for its store.
const STORE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`readable`] for a message the caller is about to refer to (a favorite,
/// a report): a message acknowledged (its seq allocated) but not yet
/// stored — a client can see it delivered a moment before the pipelines
/// store it, or while they catch up after an outage — is waited for a
/// little, then answered with a retryable 503, never a 404.
async fn readable_when_stored(
    gw: &Gateway,
    claims: &Claims,
    topic: &str,
    seq: i64,
) -> Result<Resolved, ApiError> {
    let found = readable(gw, claims, topic, seq).await?;
    if found.state != RefState::Gone {
        return Ok(found);
    }
    let mut redis = gw.redis.clone();
    let allocated: Option<i64> = redis::cmd("HGET")
        .arg(crate::keys::TopicKeys::new(&claims.ten, topic).seq())
        .arg("last_seq")
        .query_async(&mut redis)
        .await
        .map_err(unavailable)?;
    if allocated.is_none_or(|last| seq > last) {
        return Ok(found);
    }
    let deadline = tokio::time::Instant::now() + STORE_WAIT;
    loop {
        // Stored, yet gone for this reader: they cleared it.
        let stored = gw
            .history
            .message(&claims.ten, topic, seq)
            .await
            .map_err(|e| refused(e.into()))?;
        if stored.is_some() {
            return readable(gw, claims, topic, seq).await;
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Err(ApiError(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("message {seq} is not stored yet; retry"),
        Some(json!({"retry_after_ms": 1000})),
    ))
}

/// The caller and the stored topic a client names (`usr<peer>` is the
/// one-to-one topic of the pair).
async fn conversation_of(
    gw: &Gateway,
    headers: &HeaderMap,
    topic: &str,
) -> Result<(Claims, String), ApiError> {
    let claims = authenticate(gw, headers).await?;
    let topic = tinode::resolve_topic(topic, claims.uid)
        .filter(|t| tinode::is_conversation_topic(t))
        .ok_or_else(|| error(404, "topic not found"))?;
    Ok((claims, topic))
}

/// A reference as clients get it: its state and the message (without
/// content when taken back; none when gone or out of reach).
fn resolved_json(r: &Resolved) -> Value {
    json!({
        "state": r.state,
        "message": r.message.as_ref().map(message_json),
    })
}

async fn produce_user_event(
    gw: &Gateway,
    claims: &Claims,
    body: UserEventBody,
) -> Result<(), ApiError> {
    let event = UserEvent::new(&claims.ten, claims.uid, claims.uid, body);
    gw.sender
        .producer()
        .send(TopicKind::UserEvents, &event.key(), &event, None)
        .await
        .map(|_| ())
        .map_err(unavailable)
}

async fn produce_group_event(gw: &Gateway, event: GroupEvent) -> Result<(), ApiError> {
    gw.sender
        .producer()
        .send(TopicKind::GroupEvents, &event.key(), &event, None)
        .await
        .map(|_| ())
        .map_err(unavailable)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    pub reason: String,
}

/// `POST /v1/groups/{topic}/messages/{seq}/report`
pub async fn report(
    State(gw): State<Arc<Gateway>>,
    Path((topic, seq)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let seq = seq_of(&seq)?;
    let body: ReportBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    let reason = body.reason.trim();
    if reason.is_empty() || reason.chars().count() > reports::MAX_REASON {
        return Err(error(
            400,
            format!(
                "malformed: reason must be 1 to {} characters",
                reports::MAX_REASON
            ),
        ));
    }
    let claims = reader(&gw, &headers, &topic).await?;
    rate(&gw, &claims, super::limits::Action::Report).await?;
    let found = readable_when_stored(&gw, &claims, &topic, seq).await?;
    let message = match (&found.state, &found.message) {
        (RefState::Ok, Some(m)) => m,
        (RefState::Recalled | RefState::Deleted, _) => {
            return Err(error(409, "the message was taken back; nothing to report"))
        }
        _ => return Err(error(404, "message not found")),
    };
    if message.from == claims.uid {
        return Err(error(400, "you cannot report your own message"));
    }
    let report_id = reports::report_id(&topic, seq, claims.uid);
    if let Some(r) = reports::get(pool(&gw, &claims.ten)?, &report_id)
        .await
        .map_err(unavailable)?
    {
        return Ok(Json(json!({"report_id": r.report_id, "status": r.status})).into_response());
    }
    let event = GroupEvent {
        actor_device: claims.dev.clone(),
        ..GroupEvent::new(
            &claims.ten,
            &topic,
            claims.uid,
            GroupEventBody::MessageReported(MessageReported {
                report_id: report_id.clone(),
                seq,
                reason: reason.to_string(),
            }),
        )
    };
    produce_group_event(&gw, event).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"report_id": report_id, "status": "open"})),
    )
        .into_response())
}

/// `PUT /v1/me/favorites/{topic}/{seq}`: saves a message the user can read.
pub async fn add_favorite(
    State(gw): State<Arc<Gateway>>,
    Path((topic, seq)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let seq = seq_of(&seq)?;
    let (claims, topic) = conversation_of(&gw, &headers, &topic).await?;
    rate(&gw, &claims, super::limits::Action::Change).await?;
    super::reads::ensure_member(&gw, &claims.ten, &topic, claims.uid)
        .await
        .map_err(refused)?;
    let found = readable_when_stored(&gw, &claims, &topic, seq).await?;
    if found.state != RefState::Ok {
        return Err(error(404, "message not found"));
    }
    // Checked and taken in one step (`caps`): concurrent saves never pass
    // the cap together.
    let cap = gw.config.limits.favorites_per_user;
    let mut redis = gw.redis.clone();
    let taken = crate::caps::take(
        &mut redis,
        pool(&gw, &claims.ten)?,
        &claims.ten,
        crate::caps::Cap::Favorites { uid: claims.uid },
        cap,
        1,
        Some(&crate::caps::favorite_item(&topic, seq)),
    )
    .await
    .map_err(unavailable)?;
    if let crate::caps::Taken::Full(_) = taken {
        return Err(error(
            409,
            format!("at most {cap} favorites; remove some first"),
        ));
    }
    favorite_event(&gw, &claims, topic, seq, UserEventBody::FavoriteAdded).await
}

/// Produces the caller's favorite change; `202 {topic, seq}`.
async fn favorite_event(
    gw: &Gateway,
    claims: &Claims,
    topic: String,
    seq: i64,
    change: fn(FavoriteRef) -> UserEventBody,
) -> Result<Response, ApiError> {
    let body = change(FavoriteRef {
        topic: topic.clone(),
        seq,
    });
    produce_user_event(gw, claims, body).await?;
    let shown = tinode::client_topic(&topic, claims.uid);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"topic": shown, "seq": seq})),
    )
        .into_response())
}

/// `DELETE /v1/me/favorites/{topic}/{seq}`: a user may always drop their
/// own reference, member or not.
pub async fn remove_favorite(
    State(gw): State<Arc<Gateway>>,
    Path((topic, seq)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let seq = seq_of(&seq)?;
    let (claims, topic) = conversation_of(&gw, &headers, &topic).await?;
    rate(&gw, &claims, super::limits::Action::Change).await?;
    let response = favorite_event(
        &gw,
        &claims,
        topic.clone(),
        seq,
        UserEventBody::FavoriteRemoved,
    )
    .await?;
    // Its place under the cap is free once the removal is in the log.
    let mut redis = gw.redis.clone();
    crate::caps::give(
        &mut redis,
        &claims.ten,
        crate::caps::Cap::Favorites { uid: claims.uid },
        &crate::caps::favorite_item(&topic, seq),
    )
    .await
    .map_err(unavailable)?;
    Ok(response)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FavoritesParams {
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// `GET /v1/me/favorites?limit=&cursor=`
pub async fn list_favorites(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    params: Result<Query<FavoritesParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let limit = page_limit(p.limit, 20, favorites::MAX_LIMIT)?;
    let after = match p.cursor.as_deref() {
        None => None,
        Some(c) => {
            Some(favorites::Cursor::parse(c).ok_or_else(|| error(400, "malformed: cursor"))?)
        }
    };
    let claims = authenticate(&gw, &headers).await?;
    let pool = pool(&gw, &claims.ten)?;
    let page = favorites::list(pool, claims.uid, after.as_ref(), limit)
        .await
        .map_err(unavailable)?;
    let mut member: HashMap<&str, bool> = HashMap::new();
    let mut entries = Vec::with_capacity(page.len());
    for f in &page {
        let may_read = match member.get(f.topic.as_str()) {
            Some(m) => *m,
            None => {
                let m = gw
                    .groups
                    .membership(&claims.ten, &f.topic, claims.uid)
                    .await
                    .map_err(unavailable)?;
                let m = m == Membership::Member;
                member.insert(&f.topic, m);
                m
            }
        };
        let r = if may_read {
            readable(&gw, &claims, &f.topic, f.seq).await?
        } else {
            Resolved::no_access()
        };
        let mut entry = resolved_json(&r);
        entry["topic"] = json!(tinode::client_topic(&f.topic, claims.uid));
        entry["seq"] = json!(f.seq);
        entry["saved_at"] = json!(tinode::timestamp_ms(f.saved_at));
        entries.push(entry);
    }
    let next = (page.len() as i64 == limit)
        .then(|| page.last().map(|f| favorites::Cursor::of(f).text()))
        .flatten();
    Ok(Json(json!({"favorites": entries, "next": next})).into_response())
}

/// A page size: `default` when absent, else 1 to `max`.
fn page_limit(limit: Option<i64>, default: i64, max: i64) -> Result<i64, ApiError> {
    let limit = limit.unwrap_or(default);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(error(400, format!("malformed: limit must be 1 to {max}")))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesParams {
    pub before: Option<i64>,
    pub limit: Option<i64>,
}

/// `GET /v1/groups/{topic}/files?before=&limit=`: newest first; a file the
/// reader cleared from their view is left out, one taken back shows as
/// such without its file.
pub async fn list_files(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    params: Result<Query<FilesParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let limit = page_limit(p.limit, 20, files::MAX_LIMIT)?;
    if p.before.is_some_and(|b| b < 1) {
        return Err(error(400, "malformed: before"));
    }
    let claims = reader(&gw, &headers, &topic).await?;
    let page = files::list(pool(&gw, &claims.ten)?, &topic, p.before, limit)
        .await
        .map_err(unavailable)?;
    let mut entries = Vec::with_capacity(page.len());
    for f in &page {
        let r = readable(&gw, &claims, &topic, f.seq).await?;
        let Some(m) = &r.message else {
            continue;
        };
        // A file an operator blocked is listed without its file.
        let file = m
            .content
            .as_deref()
            .filter(|_| f.audit != files::Audit::Blocked.as_str())
            .and_then(|c| serde_json::from_str::<Value>(c).ok())
            .and_then(|c| files::attachment(&c));
        entries.push(json!({
            "seq": f.seq,
            "kind": f.kind,
            "audit": f.audit,
            "state": r.state,
            "from": tinode::user_id(m.from),
            "ts": tinode::timestamp_ms(m.ts),
            "file": file,
        }));
    }
    let next = (page.len() as i64 == limit)
        .then(|| page.last().map(|f| f.seq))
        .flatten();
    Ok(Json(json!({"topic": topic, "files": entries, "next_before": next})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportsParams {
    pub tenant: String,
    pub status: Option<String>,
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

fn report_json(r: &reports::Report, message: &Resolved) -> Value {
    json!({
        "report_id": r.report_id,
        "topic": r.topic,
        "seq": r.seq,
        "reporter": tinode::user_id(r.reporter),
        "reason": r.reason,
        "status": r.status,
        "created_at": tinode::timestamp_ms(r.created_at),
        "resolved_at": r.resolved_at.map(tinode::timestamp_ms),
        "resolved_by": r.resolved_by,
        "note": r.note,
        "message": resolved_json(message),
    })
}

/// `GET /v1/admin/reports?tenant=&status=open&limit=&cursor=`: oldest
/// first; `cursor` is the `next` of the previous page.
pub async fn list_reports(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    params: Result<Query<ReportsParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    super::admin::check_admin(&gw, &headers, &p.tenant).map_err(admin_refusal)?;
    let status = match p.status.as_deref() {
        None => reports::Status::Open,
        Some(s) => reports::Status::parse(s)
            .ok_or_else(|| error(400, "malformed: status is open, dismissed or actioned"))?,
    };
    let limit = page_limit(p.limit, 50, reports::MAX_LIMIT)?;
    let after = match p.cursor.as_deref() {
        None => None,
        Some(c) => Some(
            c.split_once('.')
                .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id)))
                .filter(|(_, id)| !id.is_empty())
                .ok_or_else(|| error(400, "malformed: cursor"))?,
        ),
    };
    let page = reports::list(pool(&gw, &p.tenant)?, status, after, limit)
        .await
        .map_err(unavailable)?;
    let mut entries = Vec::with_capacity(page.len());
    for r in &page {
        // An operator reads as no user: no one's cleared view applies.
        let message = references::resolve(&gw.history, &p.tenant, 0, &r.topic, r.seq)
            .await
            .map_err(|e| refused(e.into()))?;
        entries.push(report_json(r, &message));
    }
    let next = (page.len() as i64 == limit)
        .then(|| {
            page.last()
                .map(|r| format!("{}.{}", r.created_at, r.report_id))
        })
        .flatten();
    Ok(Json(
        json!({"tenant": p.tenant, "status": status.as_str(), "reports": entries, "next": next}),
    )
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveBody {
    pub resolution: String,
    #[serde(default)]
    pub note: String,
}

/// `POST /v1/admin/reports/{report_id}/resolve?tenant=`
pub async fn resolve_report(
    State(gw): State<Arc<Gateway>>,
    Path(report_id): Path<String>,
    headers: HeaderMap,
    params: Result<Query<super::admin::TenantParam>, axum::extract::rejection::QueryRejection>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let op = super::admin::check_admin(&gw, &headers, &p.tenant).map_err(admin_refusal)?;
    let body: ResolveBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    let resolution = reports::Status::parse(&body.resolution)
        .filter(|s| *s != reports::Status::Open)
        .ok_or_else(|| error(400, "malformed: resolution is dismissed or actioned"))?;
    if body.note.chars().count() > reports::MAX_REASON {
        return Err(error(
            400,
            format!(
                "malformed: note is at most {} characters",
                reports::MAX_REASON
            ),
        ));
    }
    let Some(report) = reports::get(pool(&gw, &p.tenant)?, &report_id)
        .await
        .map_err(unavailable)?
    else {
        return Err(error(404, "no such report"));
    };
    if report.status != reports::Status::Open.as_str() {
        return Err(error(
            409,
            format!("the report is already {}", report.status),
        ));
    }
    let event = GroupEvent {
        actor_device: op.name.clone(),
        ..GroupEvent::new(
            &p.tenant,
            &report.topic,
            0,
            GroupEventBody::MessageReportResolved(MessageReportResolved {
                report_id: report.report_id.clone(),
                resolution: resolution.as_str().into(),
                note: body.note,
            }),
        )
    };
    produce_group_event(&gw, event).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"report_id": report.report_id, "status": resolution.as_str()})),
    )
        .into_response())
}

/// The admin check's refusal as this module's error type.
fn admin_refusal((code, text): (StatusCode, &'static str)) -> ApiError {
    ApiError(code, text.into(), None)
}
