//! The HTTP API of the gateway: send a message and create a group, with a
//! bearer token. Errors are JSON `{"code": 403, "error": "..."}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::events::{new_event_id, now_ms, GroupCreated, GroupEvent, GroupEventBody};
use crate::kafka::topics::TopicKind;
use crate::send::SendRequest;

use super::auth::Claims;
use super::proto;
use super::session::{send_error_reply, split_head};
use super::Gateway;

pub struct ApiError(StatusCode, String, Option<Value>);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"code": self.0.as_u16(), "error": self.1});
        if let Some(p) = self.2 {
            body["params"] = p;
        }
        (self.0, Json(body)).into_response()
    }
}

fn error(code: u16, text: impl Into<String>) -> ApiError {
    ApiError(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        text.into(),
        None,
    )
}

fn authenticate(gw: &Gateway, headers: &HeaderMap) -> Result<Claims, ApiError> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| error(401, "authentication required"))?;
    let claims = gw
        .tokens
        .verify(token)
        .map_err(|_| error(401, "authentication failed"))?;
    if gw.config.tenant(&claims.ten).is_none() {
        return Err(error(401, "authentication failed"));
    }
    Ok(claims)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendBody {
    pub content: Value,
    #[serde(default)]
    pub head: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub client_msg_id: Option<String>,
}

/// `POST /v1/groups/{topic}/messages`
pub async fn send_message(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers)?;
    if !proto::is_group_topic(&topic) {
        return Err(error(404, "topic not found"));
    }
    let body: SendBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    let (head_cmid, head) = split_head(body.head);
    let request = SendRequest {
        tenant: claims.ten,
        topic: topic.clone(),
        uid: claims.uid,
        device: claims.dev,
        sid: String::new(),
        client_msg_id: body.client_msg_id.or(head_cmid),
        head,
        content: body.content.to_string(),
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
    };
    match gw.sender.send(request).await {
        Ok(sent) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"topic": topic, "seq": sent.seq, "duplicate": sent.duplicate})),
        )
            .into_response()),
        Err(e) => {
            let (code, text, params) = send_error_reply(&e);
            Err(ApiError(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                text,
                params,
            ))
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateGroupBody {
    /// Optional topic name (`grp…`); generated when absent.
    #[serde(default)]
    pub topic: Option<String>,
    #[serde(default)]
    pub name: String,
    /// Initial members besides the creator, as uids.
    #[serde(default)]
    pub members: Vec<i64>,
}

/// `POST /v1/groups`: the caller becomes the owner. Produces GroupCreated;
/// the members pipeline makes the group usable shortly after.
pub async fn create_group(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers)?;
    let body: CreateGroupBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    let group_id = gw
        .snowflake
        .next_id()
        .map_err(|e| error(503, e.to_string()))?;
    let topic = body.topic.unwrap_or_else(|| format!("grp{group_id:x}"));
    if !proto::is_group_topic(&topic) {
        return Err(error(
            400,
            "malformed: topic must be grp followed by 1-61 of [A-Za-z0-9_-]",
        ));
    }
    if body.members.iter().any(|m| *m <= 0) || body.members.len() > 100_000 {
        return Err(error(
            400,
            "malformed: members must be positive uids (at most 100000)",
        ));
    }
    let pool = gw
        .sender
        .pools()
        .get(&claims.ten)
        .map_err(|e| error(500, e.to_string()))?;
    let exists: Option<i64> = sqlx::query_scalar("SELECT group_id FROM im_groups WHERE topic = ?")
        .bind(&topic)
        .fetch_optional(pool)
        .await
        .map_err(|e| error(503, e.to_string()))?;
    if exists.is_some() {
        return Err(error(409, "topic already exists"));
    }
    let event = GroupEvent {
        event_id: new_event_id(),
        tenant_id: claims.ten.clone(),
        topic: topic.clone(),
        occurred_at: now_ms(),
        actor_uid: claims.uid,
        actor_device: claims.dev,
        source_sid: String::new(),
        source_node: gw.node_id.clone(),
        traceparent: String::new(),
        body: GroupEventBody::GroupCreated(GroupCreated {
            group_id,
            name: body.name,
            owner_uid: claims.uid,
            members: body.members,
        }),
    };
    gw.sender
        .producer()
        .send(
            TopicKind::GroupEvents,
            &format!("{}:{topic}", claims.ten),
            &event,
            None,
        )
        .await
        .map_err(|e| error(503, e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"topic": topic, "group_id": group_id})),
    )
        .into_response())
}
