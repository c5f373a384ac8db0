//! One WebSocket session speaking the Tinode protocol: handshake, login,
//! attach (sub/leave) and publish. Replies go through a bounded outbound
//! queue drained by a writer task, so a slow client never blocks others.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::events::{new_event_id, now_ms, GroupEvent, GroupEventBody, MemberLeft};
use crate::groups::Membership;
use crate::kafka::topics::TopicKind;
use crate::send::{SendError, SendRequest};

use super::auth::{self, AuthError};
use super::proto::{self, ctrl, ClientMsg, MsgLeave, MsgLogin, MsgPub, MsgSub};
use super::Gateway;

/// Outbound messages queued per session before it counts as slow.
const OUTBOUND_QUEUE: usize = 256;

/// Who the session is, once logged in.
#[derive(Debug, Clone)]
pub struct Identity {
    pub tenant: String,
    pub uid: i64,
    pub device: String,
}

struct Session {
    gateway: Arc<Gateway>,
    sid: String,
    out: mpsc::Sender<String>,
    greeted: bool,
    identity: Option<Identity>,
    attached: HashSet<String>,
}

/// Serves one upgraded WebSocket until it closes or the gateway stops.
pub async fn serve(gateway: Arc<Gateway>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<String>(OUTBOUND_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(text) = rx.recv().await {
            if sink.send(Message::Text(text.into())).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let shutdown = gateway.shutdown.clone();
    let mut session = Session {
        sid: new_event_id(),
        gateway,
        out: tx,
        greeted: false,
        identity: None,
        attached: HashSet::new(),
    };
    loop {
        let frame = tokio::select! {
            _ = shutdown.cancelled() => break,
            f = stream.next() => f,
        };
        let Some(Ok(frame)) = frame else { break };
        let text = match frame {
            Message::Text(t) => t.to_string(),
            Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            Message::Close(_) => break,
            _ => continue,
        };
        session.dispatch(&text).await;
    }
    drop(session);
    let _ = writer.await;
}

impl Session {
    async fn reply(&self, text: String) {
        if self.out.try_send(text).is_err() {
            tracing::warn!(sid = %self.sid, "outbound queue full; dropping reply");
        }
    }

    async fn dispatch(&mut self, text: &str) {
        if text == "1" {
            // Tinode's network probe.
            self.reply("0".into()).await;
            return;
        }
        let limit = self.gateway.config.gateway.max_message_size + 4096;
        if text.len() > limit {
            self.reply(ctrl(None, None, 413, "message too large", None))
                .await;
            return;
        }
        let msg: ClientMsg = match serde_json::from_str(text) {
            Ok(m) => m,
            Err(_) => {
                self.reply(ctrl(None, None, 400, "malformed", None)).await;
                return;
            }
        };
        if let Some(hi) = msg.hi {
            return self.hello(hi).await;
        }
        if !self.greeted {
            let id = message_id(&msg);
            self.reply(ctrl(
                id.as_deref(),
                None,
                409,
                "command out of sequence",
                None,
            ))
            .await;
            return;
        }
        if let Some(login) = msg.login {
            return self.login(login).await;
        }
        if self.identity.is_none() {
            let id = message_id(&msg);
            let topic = message_topic(&msg);
            self.reply(ctrl(
                id.as_deref(),
                topic.as_deref(),
                401,
                "authentication required",
                None,
            ))
            .await;
            return;
        }
        if let Some(sub) = msg.sub {
            self.subscribe(sub).await
        } else if let Some(publish) = msg.publish {
            self.publish(publish).await
        } else if let Some(leave) = msg.leave {
            self.leave(leave).await
        } else if let Some(get) = msg.get {
            self.reply(ctrl(
                get.id.as_deref(),
                Some(&get.topic),
                501,
                "not implemented",
                None,
            ))
            .await
        } else if let Some(del) = msg.del {
            self.reply(ctrl(
                del.id.as_deref(),
                Some(&del.topic),
                501,
                "not implemented",
                None,
            ))
            .await
        } else if msg.note.is_some() {
            // Notes get no reply.
        } else {
            let id = message_id(&msg);
            self.reply(ctrl(id.as_deref(), None, 400, "malformed", None))
                .await
        }
    }

    async fn hello(&mut self, hi: proto::MsgHi) {
        let id = hi.id.as_deref();
        let Some(version) = hi.ver.as_deref().and_then(proto::parse_version) else {
            self.reply(ctrl(id, None, 400, "malformed", None)).await;
            return;
        };
        if version < proto::MIN_VERSION {
            self.reply(ctrl(id, None, 505, "version not supported", None))
                .await;
            return;
        }
        self.greeted = true;
        let params = json!({
            "ver": proto::VERSION,
            "build": concat!("imstream:", env!("CARGO_PKG_VERSION")),
            "sid": self.sid,
            "maxMessageSize": self.gateway.config.gateway.max_message_size,
            "msgDelAge": 600,
        });
        self.reply(ctrl(id, None, 201, "created", Some(params)))
            .await;
    }

    async fn login(&mut self, login: MsgLogin) {
        let id = login.id.as_deref();
        if self.identity.is_some() {
            self.reply(ctrl(id, None, 409, "already authenticated", None))
                .await;
            return;
        }
        let gw = &self.gateway;
        let identity = match login.scheme.as_str() {
            "token" => gw.tokens.verify(&login.secret).map(|c| Identity {
                tenant: c.ten,
                uid: c.uid,
                device: c.dev,
            }),
            "basic" => {
                auth::check_basic(&gw.config.auth, &login.secret).map(|(tenant, uid)| Identity {
                    tenant,
                    uid,
                    device: format!("basic-{}", &self.sid[..8]),
                })
            }
            _ => Err(AuthError::UnknownScheme),
        };
        let identity = match identity {
            Ok(i) if gw.config.tenant(&i.tenant).is_some() => i,
            Ok(_) | Err(AuthError::Failed) => {
                self.reply(ctrl(id, None, 401, "authentication failed", None))
                    .await;
                return;
            }
            Err(AuthError::UnknownScheme) => {
                self.reply(ctrl(id, None, 401, "unknown authentication scheme", None))
                    .await;
                return;
            }
        };
        let issued = gw
            .tokens
            .issue(&identity.tenant, identity.uid, &identity.device, 0);
        let params = json!({
            "user": proto::user_id(identity.uid),
            "authlvl": "auth",
            "token": issued.token,
            "expires": proto::timestamp(issued.expires),
        });
        self.identity = Some(identity);
        self.reply(ctrl(id, None, 200, "ok", Some(params))).await;
    }

    async fn subscribe(&mut self, sub: MsgSub) {
        let id = sub.id.as_deref();
        let topic = sub.topic.as_str();
        if topic == "me" {
            self.reply(ctrl(id, Some(topic), 200, "ok", None)).await;
            return;
        }
        if !proto::is_group_topic(topic) {
            self.reply(ctrl(id, Some(topic), 404, "topic not found", None))
                .await;
            return;
        }
        if self.attached.contains(topic) {
            self.reply(ctrl(id, Some(topic), 304, "already subscribed", None))
                .await;
            return;
        }
        let who = self.identity.clone().expect("logged in");
        let Ok(pool) = self.gateway.sender.pools().get(&who.tenant) else {
            self.reply(ctrl(id, Some(topic), 500, "internal error", None))
                .await;
            return;
        };
        let mut redis = self.gateway.sender.redis();
        match crate::groups::membership(pool, &mut redis, &who.tenant, topic, who.uid).await {
            Ok(Membership::Member) => {
                self.attached.insert(topic.to_string());
                let acs = json!({"acs": {"want": "JRWPS", "given": "JRWPS", "mode": "JRWPS"}});
                self.reply(ctrl(id, Some(topic), 200, "ok", Some(acs)))
                    .await;
            }
            Ok(Membership::NotMember) => {
                self.reply(ctrl(id, Some(topic), 403, "permission denied", None))
                    .await
            }
            Ok(Membership::Dissolved) => {
                self.reply(ctrl(id, Some(topic), 404, "topic not found", None))
                    .await
            }
            Err(e) => {
                tracing::warn!(error = %e, "membership check failed");
                self.reply(ctrl(
                    id,
                    Some(topic),
                    503,
                    "service unavailable, retry",
                    None,
                ))
                .await
            }
        }
    }

    async fn publish(&mut self, publish: MsgPub) {
        let id = publish.id.as_deref();
        let topic = publish.topic.as_str();
        if !self.attached.contains(topic) {
            self.reply(ctrl(id, Some(topic), 409, "must attach first", None))
                .await;
            return;
        }
        let Some(content) = publish.content else {
            self.reply(ctrl(id, Some(topic), 400, "malformed: no content", None))
                .await;
            return;
        };
        let who = self.identity.clone().expect("logged in");
        let (client_msg_id, head) = split_head(publish.head);
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
        };
        match self.gateway.sender.send(request).await {
            Ok(sent) => {
                let params = json!({"seq": sent.seq});
                self.reply(ctrl(id, Some(topic), 202, "accepted", Some(params)))
                    .await
            }
            Err(e) => {
                let (code, text, params) = send_error_reply(&e);
                self.reply(ctrl(id, Some(topic), code, &text, params)).await
            }
        }
    }

    async fn leave(&mut self, leave: MsgLeave) {
        let id = leave.id.as_deref();
        let topic = leave.topic.as_str();
        if !self.attached.remove(topic) {
            self.reply(ctrl(id, Some(topic), 304, "not joined", None))
                .await;
            return;
        }
        if leave.unsub {
            let who = self.identity.clone().expect("logged in");
            let event = GroupEvent {
                event_id: new_event_id(),
                tenant_id: who.tenant.clone(),
                topic: topic.to_string(),
                occurred_at: now_ms(),
                actor_uid: who.uid,
                actor_device: who.device.clone(),
                source_sid: self.sid.clone(),
                source_node: self.gateway.node_id.clone(),
                traceparent: String::new(),
                body: GroupEventBody::MemberLeft(MemberLeft {
                    uid: who.uid,
                    kicked: false,
                }),
            };
            let key = format!("{}:{topic}", who.tenant);
            if let Err(e) = self
                .gateway
                .sender
                .producer()
                .send(TopicKind::GroupEvents, &key, &event, None)
                .await
            {
                tracing::warn!(error = %e, "unsubscribe event not produced");
                self.attached.insert(topic.to_string());
                self.reply(ctrl(
                    id,
                    Some(topic),
                    503,
                    "service unavailable, retry",
                    None,
                ))
                .await;
                return;
            }
        }
        self.reply(ctrl(id, Some(topic), 200, "ok", None)).await;
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
        SendError::Dissolved => (404, "topic not found".into(), None),
        SendError::Muted(until) => (
            403,
            "muted".into(),
            Some(json!({"what": "muted", "until": proto::timestamp_ms(*until)})),
        ),
        SendError::MutedAll => (403, "group muted".into(), Some(json!({"what": "muted"}))),
        SendError::TooLarge(_) => (413, "message too large".into(), None),
        SendError::BadRequest(why) => (400, format!("malformed: {why}"), None),
        SendError::Retryable(why) => (
            503,
            "service unavailable, retry".into(),
            Some(json!({"retry": true, "reason": why})),
        ),
    }
}

fn message_id(msg: &ClientMsg) -> Option<String> {
    msg.sub
        .as_ref()
        .and_then(|m| m.id.clone())
        .or_else(|| msg.publish.as_ref().and_then(|m| m.id.clone()))
        .or_else(|| msg.get.as_ref().and_then(|m| m.id.clone()))
        .or_else(|| msg.leave.as_ref().and_then(|m| m.id.clone()))
        .or_else(|| msg.del.as_ref().and_then(|m| m.id.clone()))
        .or_else(|| msg.login.as_ref().and_then(|m| m.id.clone()))
}

fn message_topic(msg: &ClientMsg) -> Option<String> {
    msg.sub
        .as_ref()
        .map(|m| m.topic.clone())
        .or_else(|| msg.publish.as_ref().map(|m| m.topic.clone()))
        .or_else(|| msg.get.as_ref().map(|m| m.topic.clone()))
        .or_else(|| msg.leave.as_ref().map(|m| m.topic.clone()))
        .or_else(|| msg.del.as_ref().map(|m| m.topic.clone()))
}
