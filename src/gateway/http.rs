//! The HTTP API of the gateway: send a message and create a group, with a
//! bearer token. Errors are JSON `{"code": 403, "error": "..."}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::events::GroupCreated;
use crate::send::{split_head, SendRequest};

use super::refusal::{error, limited, refused, send_error_reply, unavailable, ApiError};
use super::Gateway;
use crate::auth::Claims;
use crate::tinode;

/// Takes one token of `action` for the caller, or refuses.
pub(super) async fn rate(
    gw: &Gateway,
    claims: &Claims,
    action: super::limits::Action,
) -> Result<(), ApiError> {
    let mut redis = gw.redis.clone();
    super::limits::take(
        &mut redis,
        &gw.config.limits,
        &claims.ten,
        claims.uid,
        action,
    )
    .await
    .map_err(limited)
}

/// Verifies the bearer token, then session control: a signed-out, disabled
/// or revoked token is refused here exactly as at WebSocket login.
pub(super) async fn authenticate(gw: &Gateway, headers: &HeaderMap) -> Result<Claims, ApiError> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| error(401, "authentication required"))?;
    authenticate_token(gw, token).await
}

/// [`authenticate`] of a token however it came (Tinode's file requests
/// carry it in their own header or the address).
pub(super) async fn authenticate_token(gw: &Gateway, token: &str) -> Result<Claims, ApiError> {
    let claims = gw
        .tokens
        .verify(token)
        .map_err(|_| error(401, "authentication failed"))?;
    if gw.config.tenant(&claims.ten).is_none() {
        return Err(error(401, "authentication failed"));
    }
    let mut redis = gw.redis.clone();
    // Fails closed: when neither Redis nor MySQL answers, nobody is let in.
    let state = super::control::state(&mut redis, &gw.pools, &claims.ten, claims.uid, &claims.dev)
        .await
        .map_err(unavailable)?;
    if let Some(why) = super::control::refusal(&state, claims.av, claims.gen) {
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "authentication failed".into(),
            Some(json!({"reason": why})),
        ));
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

/// `POST /v1/groups/{topic}/messages` (a `head.replace` makes it an edit).
pub async fn send_message(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    if !tinode::is_conversation_topic(&topic) {
        return Err(error(404, "topic not found"));
    }
    let body: SendBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    send_as(&gw, claims, &topic, body, None, &headers).await
}

/// Sends `body` as `claims`; `edit_of` forces an edit of that seq (else a
/// `head.replace` in the body asks for one). Edits are checked first.
pub(super) async fn send_as(
    gw: &Gateway,
    claims: Claims,
    topic: &str,
    body: SendBody,
    edit_of: Option<i64>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    rate(gw, &claims, super::limits::Action::Send).await?;
    // An `Idempotency-Key` is the message's client id when the body names
    // none: a retried send or edit is the same message, not a second one.
    let key = super::governance::origin(&claims, headers)?.command_id;
    let (head_cmid, mut head) = split_head(body.head);
    if let Some(target) = edit_of {
        let mut map: serde_json::Map<String, Value> = head
            .as_deref()
            .and_then(|h| serde_json::from_str(h).ok())
            .unwrap_or_default();
        map.insert("replace".into(), json!(format!(":{target}")));
        head = Some(Value::Object(map).to_string());
    }
    let edit_of = super::edits::replace_target(head.as_deref()).map_err(refused)?;
    let traceparent = super::trace::traceparent(headers);
    if let Some(target) = edit_of {
        let caller = super::edits::Caller {
            tenant: &claims.ten,
            uid: claims.uid,
            origin: Default::default(),
        };
        super::edits::check_edit(gw, &caller, topic, target)
            .await
            .map_err(refused)?;
    }
    let reply_root =
        super::replies::reply_root(gw, &claims.ten, topic, claims.uid, head.as_deref())
            .await
            .map_err(refused)?;
    let shared = super::files::shared_in(gw, &claims.ten, claims.uid, &body.content)
        .await
        .map_err(refused)?;
    let request = SendRequest {
        tenant: claims.ten,
        topic: topic.to_string(),
        uid: claims.uid,
        device: claims.dev,
        sid: String::new(),
        client_msg_id: body.client_msg_id.or(head_cmid).or(key),
        head,
        content: body.content.to_string(),
        traceparent,
        edit_of,
        reply_root,
    };
    let allocation = gw.sender.allocate(&request).await;
    if let (Some(seq), false) = (allocation.seq(), shared.is_empty()) {
        // An edit's files go with the message it replaces (recalling that
        // one takes them too).
        let seq = request.edit_of.unwrap_or(seq);
        super::files::record_refs(gw, &request.tenant, &request.topic, seq, &shared)
            .await
            .map_err(refused)?;
    }
    match gw.sender.commit(&request, allocation).await {
        Ok(sent) => {
            let mut out = json!({"topic": topic, "seq": sent.seq, "duplicate": sent.duplicate});
            if let Some(target) = edit_of {
                out["edited"] = json!(target);
            }
            Ok((StatusCode::ACCEPTED, Json(out)).into_response())
        }
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

/// `POST /v1/groups`: the caller becomes the owner. Decided on the group
/// write model (one create of a name wins, `409` for the others); each
/// member is added, or invited when their add policy asks for it, and
/// nobody who blocked the caller is added (`403`). At most
/// `limits.members_per_request` members (`400`), counted against the
/// caller's `limits.member_adds`.
pub async fn create_group(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let claims = authenticate(&gw, &headers).await?;
    let body: CreateGroupBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    let most = gw.config.limits.members_per_request;
    if body.members.len() > most {
        return Err(error(
            400,
            format!(
                "too many members: at most {most} per request (limits.members_per_request); \
                 add more later, or as an operator through the group.member.add admin command"
            ),
        ));
    }
    if body.members.iter().any(|m| *m <= 0) {
        return Err(error(400, "malformed: members must be positive uids"));
    }
    let origin = super::governance::origin(&claims, &headers)?;
    rate(&gw, &claims, super::limits::Action::GroupCreate).await?;
    let others = body.members.iter().filter(|m| **m != claims.uid).count() as u32;
    if others > 0 {
        let mut redis = gw.redis.clone();
        super::limits::take_n(
            &mut redis,
            &gw.config.limits,
            &claims.ten,
            claims.uid,
            super::limits::Action::MemberAdd,
            others,
        )
        .await
        .map_err(limited)?;
    }
    let (topic, group_id, outcome) = create_as(
        &gw,
        &claims.ten,
        claims.uid,
        body.topic,
        body.name,
        body.members,
        &origin,
    )
    .await
    .map_err(refused)?;
    let mut answer = json!({"topic": topic, "group_id": group_id, "events": outcome.event_ids});
    if !outcome.invited.is_empty() {
        answer["invited"] = json!(outcome.invited);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Creates group `topic` (a generated `grp…` name when `None`) owned by
/// `uid`, as the HTTP route and the WebSocket `{sub topic="new…"}` do:
/// the group's name, its id (a retry's is the first create's) and what
/// the command did. The callers draw on the buckets first.
pub(super) async fn create_as(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    topic: Option<String>,
    name: String,
    members: Vec<i64>,
    origin: &crate::governance::exec::Origin,
) -> Result<(String, i64, crate::governance::exec::Outcome), super::refusal::Refusal> {
    use super::refusal::Refusal;
    let group_id = gw.snowflake.next_id().map_err(Refusal::unavailable)?;
    let topic = topic.unwrap_or_else(|| format!("grp{group_id:x}"));
    if !tinode::is_group_topic(&topic) {
        return Err(Refusal(
            400,
            "malformed: topic must be grp followed by 1-61 of [A-Za-z0-9_-]".into(),
        ));
    }
    let created = GroupCreated {
        group_id,
        name,
        owner_uid: uid,
        members,
    };
    let outcome = gw
        .governance
        .create(tenant, &topic, uid, created, origin)
        .await
        .map_err(|r| Refusal(r.0, r.1))?;
    // A retry of the same create answers with the group it made.
    let group_id = outcome.group_id.unwrap_or(group_id);
    Ok((topic, group_id, outcome))
}

pub(super) async fn reader(
    gw: &Gateway,
    headers: &HeaderMap,
    topic: &str,
) -> Result<Claims, ApiError> {
    let claims = authenticate(gw, headers).await?;
    super::reads::ensure_member(gw, &claims.ten, topic, claims.uid)
        .await
        .map_err(refused)?;
    Ok(claims)
}

pub(super) fn message_json(m: &crate::store::message::StoredMessage) -> Value {
    serde_json::to_value(MessageJson(m)).expect("a message renders")
}

/// A stored message as the API shows it, serialized straight into the
/// response: head and content are the stored JSON text itself (checked,
/// not rebuilt as a tree), or a string when the text is not JSON.
pub(super) struct MessageJson<'a>(pub &'a crate::store::message::StoredMessage);

impl serde::Serialize for MessageJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let m = self.0;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("seq", &m.seq)?;
        map.serialize_entry("from", &tinode::user_id(m.from))?;
        map.serialize_entry("ts", &tinode::timestamp_ms(m.ts))?;
        map.serialize_entry("head", &m.head.as_deref().map(JsonText))?;
        map.serialize_entry("content", &m.content.as_deref().map(JsonText))?;
        map.serialize_entry("status", &m.status)?;
        map.serialize_entry("version", &m.version)?;
        if let Some(reply) = m.reply_seq {
            map.serialize_entry("reply_seq", &reply)?;
        }
        if let Some(root) = m.root_seq {
            map.serialize_entry("root_seq", &root)?;
        }
        map.end()
    }
}

/// Stored JSON text, written as it is when it is JSON, as a string if not.
struct JsonText<'a>(&'a str);

impl serde::Serialize for JsonText<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_str::<&serde_json::value::RawValue>(self.0) {
            Ok(raw) => raw.serialize(s),
            Err(_) => s.serialize_str(self.0),
        }
    }
}

/// One page of `list_messages`: the cursor's name says its direction.
#[derive(serde::Serialize)]
struct PageJson<'a> {
    topic: &'a str,
    messages: Vec<MessageJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_since: Option<Option<i64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_before: Option<Option<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    pub before: Option<i64>,
    pub since: Option<i64>,
    pub limit: Option<i64>,
}

/// `GET /v1/groups/{topic}/messages?before=&since=&limit=`: newest first
/// with `before` (or neither); oldest first with `since` alone (catch-up).
/// `next` is the cursor for the following page.
pub async fn list_messages(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    params: Result<axum::extract::Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let claims = reader(&gw, &headers, &topic).await?;
    let ascending = p.since.is_some() && p.before.is_none();
    let query = crate::history::PageQuery::new(p.since, p.before, p.limit, ascending)
        .map_err(|e| refused(e.into()))?;
    let page = gw
        .history
        .page(&claims.ten, &topic, claims.uid, query)
        .await
        .map_err(|e| refused(e.into()))?;
    let (next_since, next_before) = if ascending {
        (Some(page.next.map(|s| s + 1)), None)
    } else {
        (None, Some(page.next))
    };
    Ok(Json(PageJson {
        topic: &topic,
        messages: page.messages.iter().map(MessageJson).collect(),
        next_since,
        next_before,
    })
    .into_response())
}

/// `GET /v1/groups/{topic}/messages/{seq}`
pub async fn get_message(
    State(gw): State<Arc<Gateway>>,
    Path((topic, seq)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let seq = crate::fields::seq_text(&seq).ok_or_else(|| error(400, "malformed: seq"))?;
    let claims = reader(&gw, &headers, &topic).await?;
    match gw
        .history
        .exact(&claims.ten, &topic, claims.uid, seq)
        .await
        .map_err(|e| refused(e.into()))?
    {
        Some(m) => Ok(Json(message_json(&m)).into_response()),
        None => Err(error(404, "message not found")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextParams {
    pub n: Option<i64>,
}

/// `GET /v1/groups/{topic}/messages/{seq}/context?n=20`: oldest first; for
/// a reply also `reply_to` (the message it answers) and `root` (its
/// thread's first message, when that is another), wherever they are.
pub async fn message_context(
    State(gw): State<Arc<Gateway>>,
    Path((topic, seq)): Path<(String, String)>,
    headers: HeaderMap,
    params: Result<axum::extract::Query<ContextParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let seq = crate::fields::seq_text(&seq).ok_or_else(|| error(400, "malformed: seq"))?;
    let n = p.n.unwrap_or(20);
    if !(1..=50).contains(&n) {
        return Err(error(400, "malformed: n must be 1 to 50"));
    }
    let claims = reader(&gw, &headers, &topic).await?;
    let messages = gw
        .history
        .context(&claims.ten, &topic, claims.uid, seq, n)
        .await
        .map_err(|e| refused(e.into()))?;
    let mut out = json!({"topic": topic, "seq": seq, "messages": messages.iter().map(message_json).collect::<Vec<_>>()});
    // A reply comes with what it answers, however far back (another month,
    // an archive): its parent and its thread's first message.
    if let Some(target) = messages.iter().find(|m| m.seq == seq) {
        let parents = [("reply_to", target.reply_seq), ("root", target.root_seq)];
        for (name, parent) in parents {
            let Some(parent) = parent.filter(|p| *p != seq) else {
                continue;
            };
            if name == "root" && target.reply_seq == Some(parent) {
                continue;
            }
            if let Some(m) = gw
                .history
                .exact(&claims.ten, &topic, claims.uid, parent)
                .await
                .map_err(|e| refused(e.into()))?
            {
                out[name] = message_json(&m);
            }
        }
    }
    Ok(Json(out).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    pub q: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub limit: Option<i64>,
}

pub(super) fn instant(text: &str) -> Option<i64> {
    text.parse::<i64>().ok().or_else(|| {
        chrono::DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| t.timestamp_millis())
    })
}

/// `GET /v1/groups/{topic}/search?q=&from=&to=`: a time range (RFC 3339 or
/// epoch ms) is required and may span at most 3 months.
pub async fn search(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    params: Result<axum::extract::Query<SearchParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let axum::extract::Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let q =
        p.q.filter(|q| !q.is_empty())
            .ok_or_else(|| error(400, "malformed: q is required"))?;
    let (Some(from), Some(to)) = (
        p.from.as_deref().and_then(instant),
        p.to.as_deref().and_then(instant),
    ) else {
        return Err(error(
            400,
            "malformed: from and to (RFC 3339 or epoch ms) are required",
        ));
    };
    let claims = reader(&gw, &headers, &topic).await?;
    rate(&gw, &claims, super::limits::Action::Search).await?;
    let messages = gw
        .history
        .search(
            &claims.ten,
            &topic,
            claims.uid,
            &q,
            from,
            to,
            p.limit.unwrap_or(50),
        )
        .await
        .map_err(|e| refused(e.into()))?;
    Ok(Json(
        json!({"topic": topic, "messages": messages.iter().map(message_json).collect::<Vec<_>>()}),
    )
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearBody {
    pub ranges: Vec<RangeBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeBody {
    pub low: i64,
    pub hi: Option<i64>,
}

/// `POST /v1/groups/{topic}/history/clear`: hides `[low, hi)` ranges from
/// the caller's own view (Tinode's soft `{del}`).
pub async fn clear_history(
    State(gw): State<Arc<Gateway>>,
    Path(topic): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: ClearBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    let claims = reader(&gw, &headers, &topic).await?;
    rate(&gw, &claims, super::limits::Action::Clear).await?;
    let ranges: Vec<tinode::SeqRangeMsg> = body
        .ranges
        .iter()
        .map(|r| tinode::SeqRangeMsg {
            low: r.low,
            hi: r.hi,
        })
        .collect();
    let del_id = super::reads::clear_history(
        &gw,
        &claims.ten,
        &topic,
        claims.uid,
        &claims.dev,
        "",
        &ranges,
    )
    .await
    .map_err(refused)?;
    Ok(Json(json!({"topic": topic, "del": del_id})).into_response())
}

/// The p2p topic between the caller and `usr{peer}` / `{peer}`.
async fn p2p_of(
    gw: &Gateway,
    headers: &HeaderMap,
    peer: &str,
) -> Result<(Claims, String), ApiError> {
    let claims = authenticate(gw, headers).await?;
    let peer = peer
        .strip_prefix("usr")
        .unwrap_or(peer)
        .parse::<i64>()
        .ok()
        .filter(|p| *p > 0 && *p != claims.uid)
        .ok_or_else(|| error(400, "malformed: peer must be another user's uid"))?;
    let topic = tinode::p2p_topic(claims.uid, peer);
    Ok((claims, topic))
}

/// `POST /v1/users/{peer}/messages`: a one-to-one message.
pub async fn send_p2p(
    State(gw): State<Arc<Gateway>>,
    Path(peer): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let (claims, topic) = p2p_of(&gw, &headers, &peer).await?;
    let body: SendBody =
        serde_json::from_slice(&body).map_err(|e| error(400, format!("malformed: {e}")))?;
    send_as(&gw, claims, &topic, body, None, &headers).await
}

/// `GET /v1/users/{peer}/messages?before=&since=&limit=`: one-to-one history.
pub async fn list_p2p(
    State(gw): State<Arc<Gateway>>,
    Path(peer): Path<String>,
    headers: HeaderMap,
    params: Result<axum::extract::Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let (_, topic) = p2p_of(&gw, &headers, &peer).await?;
    list_messages(State(gw), Path(topic), headers, params).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::message::StoredMessage;

    fn stored(head: Option<&str>, content: Option<&str>) -> StoredMessage {
        StoredMessage {
            seq: 7,
            from: 42,
            ts: 1_700_000_000_123,
            head: head.map(str::to_string),
            content: content.map(str::to_string),
            status: "normal".into(),
            version: 2,
            edit_seq: None,
            reply_seq: None,
            root_seq: None,
        }
    }

    #[test]
    fn a_message_renders_its_stored_json_as_json_and_other_text_as_a_string() {
        let m = stored(
            Some(r#"{"mime": "text/x-drafty"}"#),
            Some(r#"{"txt":"hi \u4f60"}"#),
        );
        let text = serde_json::to_string(&MessageJson(&m)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            json!({"seq": 7, "from": "usr42", "ts": tinode::timestamp_ms(m.ts),
                   "head": {"mime": "text/x-drafty"}, "content": {"txt": "hi 你"},
                   "status": "normal", "version": 2})
        );
        // The Value form (other endpoints) is the same document.
        assert_eq!(message_json(&m), v);

        let odd = stored(None, Some("not json {"));
        let v = serde_json::to_value(MessageJson(&odd)).unwrap();
        assert_eq!(v["content"], json!("not json {"));
        assert_eq!(v["head"], Value::Null);
    }

    #[test]
    fn a_page_names_its_cursor_by_direction() {
        let m = stored(None, Some("\"x\""));
        let page = |since, before| {
            serde_json::to_value(PageJson {
                topic: "grpA",
                messages: vec![MessageJson(&m)],
                next_since: since,
                next_before: before,
            })
            .unwrap()
        };
        let newest_first = page(None, Some(None));
        assert_eq!(newest_first["next_before"], Value::Null);
        assert!(newest_first.get("next_since").is_none());
        let catch_up = page(Some(Some(8)), None);
        assert_eq!(catch_up["next_since"], json!(8));
        assert!(catch_up.get("next_before").is_none());
        assert_eq!(catch_up["messages"][0]["content"], json!("x"));
    }
}
