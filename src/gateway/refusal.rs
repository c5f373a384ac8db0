//! One mapping of failures to answers, for both front ends. A [`Refusal`]
//! is a Tinode code and text (reads, deletes, governance); a refused send
//! also carries params ([`send_error_reply`]). The WebSocket sends them as
//! `{ctrl}`; HTTP as [`ApiError`] (JSON `{"code", "error", "params"}` with
//! the status, and `Retry-After` for a limit). Internal failures are logged
//! under the request id and answered only with
//! [`crate::tinode::UNAVAILABLE`] or "internal error".

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::history::HistoryError;
use crate::send::SendError;
use crate::tinode;

/// Why a read or delete was refused, as a Tinode code and text.
#[derive(Debug)]
pub struct Refusal(pub u16, pub String);

impl Refusal {
    /// An internal failure that may pass (a database, Redis, the broker):
    /// the detail is logged under the request id, the client is told only
    /// to retry (and, by the front end, the request id).
    pub fn unavailable(e: impl std::fmt::Display) -> Refusal {
        super::log_internal(&e);
        Refusal(503, tinode::UNAVAILABLE.into())
    }

    /// An internal failure that will not pass by itself (logged likewise).
    pub fn internal(e: impl std::fmt::Display) -> Refusal {
        super::log_internal(&e);
        Refusal(500, "internal error".into())
    }
}

impl From<crate::group_model::ModelError> for Refusal {
    /// An asker over their lookups of unknown groups is told when to retry
    /// (429); anything else is an outage (503).
    fn from(e: crate::group_model::ModelError) -> Self {
        match e {
            crate::group_model::ModelError::Throttled(ms) => Refusal(
                429,
                format!("too many lookups of unknown groups; retry in {ms} ms"),
            ),
            e => Refusal::unavailable(e),
        }
    }
}

impl From<HistoryError> for Refusal {
    fn from(e: HistoryError) -> Self {
        match e {
            HistoryError::BadRequest(why) => Refusal(400, format!("malformed: {why}")),
            // An archived month whose archive cannot be read: the server's
            // fault, named by month (503 when the store may come back); the
            // detail (object names, store errors) only in the log.
            HistoryError::Archive(e) => {
                let request_id = crate::request_id::current();
                tracing::error!(%request_id, error = %e, "archived month unreadable");
                use crate::store::archive::reader::ArchiveReadError as A;
                let what = match &e {
                    A::Missing { .. } => "missing",
                    A::Damaged { .. } => "damaged",
                    A::Unreachable { .. } => "unreachable, retry",
                };
                Refusal(
                    if e.retryable() { 503 } else { 500 },
                    format!("archive of month {} is {what}", e.month()),
                )
            }
            other => Refusal::unavailable(other),
        }
    }
}

/// Tinode code, text and params for a refused send.
pub fn send_error_reply(e: &SendError) -> (u16, String, Option<Value>) {
    match e {
        SendError::NotMember => (403, "permission denied".into(), None),
        SendError::Dissolved => (
            404,
            "topic not found".into(),
            Some(json!({"code": "GROUP_DISSOLVED"})),
        ),
        SendError::Muted(until) => (
            403,
            "muted".into(),
            Some(
                json!({"what": "muted", "code": "GROUP_MUTED", "until": tinode::timestamp_ms(*until)}),
            ),
        ),
        SendError::MutedAll => (
            403,
            "group muted".into(),
            Some(json!({"what": "muted", "code": "GROUP_MUTED"})),
        ),
        SendError::Blocked => (
            403,
            "blocked by the recipient".into(),
            Some(json!({"code": "BLOCKED"})),
        ),
        SendError::NotFriends => (
            403,
            "only friends may send one-to-one messages".into(),
            Some(json!({"code": "NOT_FRIENDS"})),
        ),
        SendError::TooLarge(_) => (413, "message too large".into(), None),
        SendError::ClientIdReused => (
            409,
            "client_mid was already used for a different message".into(),
            Some(json!({"code": "CLIENT_MID_REUSED"})),
        ),
        SendError::BadRequest(why) => (400, format!("malformed: {why}"), None),
        SendError::Retryable(why) => (
            503,
            tinode::UNAVAILABLE.into(),
            Some(json!({"retry": true, "request_id": super::log_internal(why)})),
        ),
        SendError::Throttled(ms) => (
            429,
            "too many requests".into(),
            Some(json!({"retry_after_ms": ms, "code": "UNKNOWN_NAMES"})),
        ),
        SendError::Overloaded => (
            503,
            "overloaded, retry".into(),
            Some(json!({
                "retry": true,
                "code": "OVERLOADED",
                "retry_after_ms": crate::send::OVERLOADED_RETRY_MS,
            })),
        ),
    }
}

pub struct ApiError(pub StatusCode, pub String, pub Option<Value>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"code": self.0.as_u16(), "error": self.1});
        // A limit's retry-after, also as the standard header (whole seconds).
        let retry_after = self
            .2
            .as_ref()
            .and_then(|p| p.get("retry_after_ms"))
            .and_then(Value::as_u64)
            .map(|ms| ms.div_ceil(1000).max(1));
        if let Some(p) = self.2 {
            body["params"] = p;
        }
        let mut response = (self.0, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// An internal failure (a database, Redis or the broker): the detail goes
/// to the log under a request id; the client gets a generic answer with
/// that id, never the internal text.
pub fn unavailable(e: impl std::fmt::Display) -> ApiError {
    let request_id = super::log_internal(&e);
    ApiError(
        StatusCode::SERVICE_UNAVAILABLE,
        tinode::UNAVAILABLE.into(),
        Some(json!({"retry": true, "request_id": request_id})),
    )
}

/// A request refused by a limit: `429` with `Retry-After`, or `503` when
/// the limiter could not be asked.
pub fn limited(l: super::limits::Limited) -> ApiError {
    let (code, text, params) = l.ctrl_parts();
    ApiError(
        StatusCode::from_u16(code).unwrap_or(StatusCode::TOO_MANY_REQUESTS),
        text.into(),
        Some(params),
    )
}

/// An HTTP answer with a Tinode code as its status.
pub fn error(code: u16, text: impl Into<String>) -> ApiError {
    ApiError(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        text.into(),
        None,
    )
}

/// A [`Refusal`] as an HTTP answer.
pub fn refused(r: Refusal) -> ApiError {
    error(r.0, r.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::archive::reader::ArchiveReadError;
    use crate::store::month::ShardMonth;

    #[test]
    fn an_unreadable_archive_is_named_by_month_never_by_its_objects() {
        let month = ShardMonth::parse("202609").unwrap();
        let detail = "s3://bucket/tenants/acme/202609/index.json: 404 from 10.0.0.7".to_string();
        for (e, code, text) in [
            (
                ArchiveReadError::Missing {
                    month,
                    detail: detail.clone(),
                },
                500,
                "archive of month 202609 is missing",
            ),
            (
                ArchiveReadError::Damaged {
                    month,
                    detail: detail.clone(),
                },
                500,
                "archive of month 202609 is damaged",
            ),
            (
                ArchiveReadError::Unreachable {
                    month,
                    detail: detail.clone(),
                },
                503,
                "archive of month 202609 is unreachable, retry",
            ),
        ] {
            let Refusal(c, t) = HistoryError::Archive(e).into();
            assert_eq!((c, t.as_str()), (code, text));
        }
    }
}
