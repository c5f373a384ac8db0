//! `{pub}`: a message or an edit, acknowledged `{ctrl 202 seq}` once produced.

use serde_json::{json, Value};

use crate::gateway::edits;
use crate::gateway::limits::Action;
use crate::gateway::reads::Refusal;
use crate::realtime::hub::Outbound;
use crate::send::{SendError, SendRequest};
use crate::tinode::{self, ctrl, MsgPub};

use super::Session;

impl Session {
    pub(super) async fn publish(&mut self, publish: MsgPub) {
        let id = publish.id.as_deref();
        let topic = publish.topic.as_str();
        if !self.is_attached(topic) {
            self.reply(ctrl(
                id,
                Some(&self.shown(topic)),
                409,
                "must attach first",
                None,
            ))
            .await;
            return;
        }
        let Some(content) = publish.content else {
            self.reply(ctrl(
                id,
                Some(&self.shown(topic)),
                400,
                "malformed: no content",
                None,
            ))
            .await;
            return;
        };
        if !self.rate(id, topic, Action::Send).await {
            return;
        }
        let who = self.identity.clone().expect("logged in");
        let (client_msg_id, head) = split_head(publish.head);
        let edit_of = match edits::replace_target(head.as_deref()) {
            Ok(target) => target,
            Err(Refusal(code, text)) => {
                self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                    .await;
                return;
            }
        };
        if let Some(target) = edit_of {
            let caller = self.caller(&who);
            if let Err(Refusal(code, text)) =
                edits::check_edit(&self.gateway, &caller, topic, target).await
            {
                self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                    .await;
                return;
            }
        }
        let reply_root = match crate::gateway::replies::reply_root(
            &self.gateway,
            &who.tenant,
            topic,
            who.uid,
            head.as_deref(),
        )
        .await
        {
            Ok(root) => root,
            Err(Refusal(code, text)) => {
                self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                    .await;
                return;
            }
        };
        let request = SendRequest {
            tenant: who.tenant,
            topic: topic.to_string(),
            uid: who.uid,
            device: who.device,
            sid: self.sid.clone(),
            client_msg_id,
            head,
            content: content.to_string(),
            traceparent: None,
            edit_of,
            reply_root,
        };
        // Seqs are allocated in arrival order; producing and acking overlap
        // (at most IN_FLIGHT_SENDS per session).
        let sender = self.gateway.sender.clone();
        let allocation = sender.allocate(&request).await;
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            return;
        };
        let out = self.out.clone();
        let (id, topic) = (id.map(str::to_string), self.shown(topic));
        tokio::spawn(async move {
            let reply = match sender.commit(&request, allocation).await {
                Ok(sent) => ctrl(
                    id.as_deref(),
                    Some(&topic),
                    202,
                    "accepted",
                    Some(json!({"seq": sent.seq})),
                ),
                Err(e) => {
                    let (code, text, params) = send_error_reply(&e);
                    ctrl(id.as_deref(), Some(&topic), code, &text, params)
                }
            };
            let _ =
                tokio::time::timeout(super::REPLY_STALL, out.send(Outbound::Frame(reply.into())))
                    .await;
            drop(permit);
        });
    }
}

/// Takes `client_mid` out of a pub head (it is an idempotency key, never
/// stored or delivered); returns it and the remaining head as JSON text.
pub fn split_head(
    head: Option<serde_json::Map<String, Value>>,
) -> (Option<String>, Option<String>) {
    let Some(mut head) = head else {
        return (None, None);
    };
    let cmid = head.remove("client_mid").and_then(|v| match v {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    });
    let rest = (!head.is_empty()).then(|| Value::Object(head).to_string());
    (cmid, rest)
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
            "service unavailable, retry".into(),
            Some(json!({"retry": true, "request_id": crate::gateway::log_internal(why)})),
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
