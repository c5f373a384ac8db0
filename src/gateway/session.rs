//! One WebSocket session speaking the Tinode protocol: handshake, login,
//! attach (sub/leave) and publish. Replies go through a bounded outbound
//! queue drained by a writer task, so a slow client never blocks others.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::events::{new_event_id, now_ms, ReceiptBody, ReceiptEvent, SeqCursor, SeqRange};
use crate::groups::Membership;
use crate::kafka::topics::TopicKind;
use crate::realtime::hub::{Outbound, SessionHandle};
use crate::realtime::{frames, presence, Envelope, Kind, TargetType};
use crate::send::{SendError, SendRequest};
use crate::shutdown::Shutdown;

use super::auth::{self, AuthError};
use super::control;
use super::edits;
use super::proto::{self, ctrl, ClientMsg, MsgLeave, MsgLogin, MsgPub, MsgSub};
use super::reads::{self, Refusal};
use super::Gateway;

/// Outbound messages queued per session before it counts as too slow and
/// is closed (room for a burst after an outage; slots are allocated only as
/// they fill, so an idle session does not pay for them).
const OUTBOUND_QUEUE: usize = 4096;

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
    out: mpsc::Sender<Outbound>,
    greeted: bool,
    identity: Option<Identity>,
    /// Registered with the hub once logged in.
    handle: Option<SessionHandle>,
    attached: HashSet<String>,
    /// Last control re-check on uplink (epoch ms).
    checked_at: i64,
    /// Bounds the sends of this session that are being produced at once.
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Last `{note what="kp"}` relayed per topic (epoch ms), for rate limiting.
    kp_at: std::collections::HashMap<String, i64>,
    /// Triggered when the session must close (see `SessionHandle::closing`).
    closing: Shutdown,
}

/// Sends of one session produced concurrently (their seqs are already fixed).
const IN_FLIGHT_SENDS: usize = 32;
/// How long a reply may wait for room in the outbound queue.
const REPLY_STALL: std::time::Duration = std::time::Duration::from_secs(10);
/// Minimum spacing of relayed typing notifications per session and topic.
const KP_INTERVAL_MS: i64 = 3000;
/// Uplink traffic re-checks session control at most this often.
const UPLINK_CHECK_MS: i64 = 5000;
/// How long a closing session waits for its writer to deliver what is
/// queued and the final ctrl before it drops the connection anyway.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Serves one upgraded WebSocket until it closes or the gateway stops.
pub async fn serve(gateway: Arc<Gateway>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Outbound>(OUTBOUND_QUEUE);
    // Cancelled when the gateway stops or the session is evicted.
    let closed: Shutdown = gateway.shutdown.child();
    let writer_closed = closed.clone();
    // Stops when the queue ends, after the final ctrl of a close, or when
    // `closed` fires — even in the middle of a send a client does not read.
    let writer = tokio::spawn(async move {
        loop {
            let out = tokio::select! {
                out = rx.recv() => out,
                _ = writer_closed.cancelled() => None,
            };
            let (text, last) = match out {
                None => break,
                Some(Outbound::Frame(text)) => (text.as_ref().to_string(), false),
                Some(Outbound::Close(reason)) => (
                    ctrl(
                        None,
                        None,
                        401,
                        "session closed",
                        Some(json!({"reason": &*reason})),
                    ),
                    true,
                ),
            };
            let sent = tokio::select! {
                r = sink.send(Message::Text(text.into())) => r.is_ok(),
                _ = writer_closed.cancelled() => false,
            };
            if !sent || last {
                break;
            }
        }
        writer_closed.trigger();
        let _ = tokio::time::timeout(CLOSE_GRACE, sink.close()).await;
    });
    let mut session = Session {
        sid: new_event_id(),
        gateway,
        out: tx,
        greeted: false,
        identity: None,
        handle: None,
        attached: HashSet::new(),
        checked_at: 0,
        kp_at: std::collections::HashMap::new(),
        in_flight: Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT_SENDS)),
        closing: Shutdown::new(),
    };
    loop {
        let frame = tokio::select! {
            _ = closed.cancelled() => break,
            _ = session.closing.cancelled() => {
                // The writer ends after the final ctrl; a client that does
                // not read is dropped after the grace anyway.
                let _ = tokio::time::timeout(CLOSE_GRACE, closed.cancelled()).await;
                break;
            }
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
    closed.trigger();
    session.finish().await;
    drop(session);
    let _ = writer.await;
}

impl Session {
    /// Queues a reply. Replies are never dropped: a client that stops
    /// reading stalls its own session (its uplink is not read meanwhile),
    /// and after `REPLY_STALL` it is disconnected.
    async fn reply(&self, text: String) {
        let out = Outbound::Frame(Arc::from(text));
        match tokio::time::timeout(REPLY_STALL, self.out.send(out)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {}
            Err(_) => {
                tracing::warn!(sid = %self.sid, "client not reading replies; closing session");
                self.close("not reading");
            }
        }
    }

    /// Detaches everything and marks the user offline on this node.
    async fn finish(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        let topics: Vec<String> = self.attached.drain().collect();
        for topic in topics {
            self.detach(&handle, &topic).await;
        }
        self.gateway.hub.remove_session(&handle);
        let still_here = !self
            .gateway
            .hub
            .user_sessions(&handle.tenant, handle.uid, None, "")
            .is_empty();
        let mut redis = self.gateway.sender.redis();
        let _ = presence::user_offline(
            &mut redis,
            &handle.tenant,
            handle.uid,
            &self.sid,
            &self.gateway.node_id,
            still_here,
            now_ms(),
        )
        .await;
    }

    /// Leaves a topic locally and in presence; tells the others when this was
    /// the user's last attached session.
    async fn detach(&self, handle: &SessionHandle, topic: &str) {
        let still_here = self.gateway.hub.detach(handle, topic);
        let mut redis = self.gateway.sender.redis();
        let last = presence::detach(
            &mut redis,
            &handle.tenant,
            topic,
            handle.uid,
            &self.gateway.node_id,
            still_here,
        )
        .await
        .unwrap_or(false);
        if last {
            self.announce(
                &handle.tenant,
                topic,
                frames::pres_frame(topic, &proto::user_id(handle.uid), "off"),
            )
            .await;
        }
    }

    /// Publishes a frame to every session attached to `topic` (all nodes)
    /// except this one.
    async fn announce(&self, tenant: &str, topic: &str, frame: String) {
        let envelope = Envelope {
            event_id: new_event_id(),
            tenant_id: tenant.to_string(),
            kind: Kind::Deliver,
            target_type: TargetType::Topic,
            target: topic.to_string(),
            skip_sid: self.sid.clone(),
            dedup_key: String::new(),
            occurred_at: now_ms(),
            payload: frame,
        };
        let mut redis = self.gateway.sender.redis();
        let nodes = presence::online_nodes(&mut redis, tenant, topic, now_ms())
            .await
            .ok()
            .flatten();
        if let Err(e) = crate::realtime::bus::publish(&mut redis, nodes.as_deref(), &envelope).await
        {
            tracing::warn!(error = %e, "realtime publish failed");
        }
    }

    /// Ends the session: the final ctrl 401 with `reason` if it can still be
    /// queued, and the connection is dropped shortly after in any case.
    /// Rewrites the message's topic to the stored name; `Err(name)` when
    /// the name means no topic this user can have (`usr<self>`, someone
    /// else's p2p topic).
    fn resolve_topic(&self, msg: &mut ClientMsg) -> Result<(), String> {
        let Some(who) = &self.identity else {
            return Ok(());
        };
        let slot: Option<&mut String> = if let Some(m) = msg.sub.as_mut() {
            Some(&mut m.topic)
        } else if let Some(m) = msg.publish.as_mut() {
            Some(&mut m.topic)
        } else if let Some(m) = msg.leave.as_mut() {
            Some(&mut m.topic)
        } else if let Some(m) = msg.get.as_mut() {
            Some(&mut m.topic)
        } else if let Some(m) = msg.del.as_mut() {
            Some(&mut m.topic)
        } else {
            msg.note.as_mut().map(|m| &mut m.topic)
        };
        let Some(topic) = slot else { return Ok(()) };
        if topic == "me" || proto::is_group_topic(topic) {
            return Ok(());
        }
        match proto::resolve_topic(topic, who.uid) {
            Some(stored) => {
                *topic = stored;
                Ok(())
            }
            None => Err(topic.clone()),
        }
    }

    /// Whether this session is attached to `topic`. A session the group
    /// evicted (kicked, dissolved) is no longer in the hub: it forgets the
    /// topic here too.
    fn is_attached(&mut self, topic: &str) -> bool {
        if !self.attached.contains(topic) {
            return false;
        }
        let (Some(handle), Some(who)) = (&self.handle, &self.identity) else {
            return true;
        };
        if self
            .gateway
            .hub
            .is_attached(&who.tenant, topic, &handle.sid)
        {
            return true;
        }
        self.attached.remove(topic);
        false
    }

    /// The name this user knows a stored topic by (`usr<peer>` for p2p).
    fn shown(&self, topic: &str) -> String {
        match &self.identity {
            Some(who) => proto::client_topic(topic, who.uid),
            None => topic.to_string(),
        }
    }

    /// This session as the actor of an edit, delete or governance action.
    fn caller<'a>(&self, who: &'a Identity) -> edits::Caller<'a> {
        edits::Caller {
            tenant: &who.tenant,
            uid: who.uid,
            origin: crate::governance::exec::Origin {
                device: who.device.clone(),
                sid: self.sid.clone(),
                ..Default::default()
            },
        }
    }

    fn close(&self, reason: &str) {
        let _ = self.out.try_send(Outbound::Close(Arc::from(reason)));
        self.closing.trigger();
    }

    /// Closes the session if session control says so (checked at most every
    /// few seconds on uplink). Returns false when the session is closing.
    async fn still_allowed(&mut self) -> bool {
        if self.closing.is_triggered() {
            return false;
        }
        let Some(handle) = &self.handle else {
            return true;
        };
        let now = now_ms();
        if now - self.checked_at < UPLINK_CHECK_MS {
            return true;
        }
        self.checked_at = now;
        let mut redis = self.gateway.sender.redis();
        match control::recheck(&mut redis, std::slice::from_ref(handle)).await {
            Ok(refused) if !refused.is_empty() => {
                self.close(refused[0].1);
                false
            }
            _ => true,
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
        if !self.still_allowed().await {
            return;
        }
        // Clients name a one-to-one topic by the peer (`usr<peer>`); every
        // handler works with the stored name and answers with the client's.
        let mut msg = msg;
        if let Err(client) = self.resolve_topic(&mut msg) {
            let id = message_id(&msg);
            self.reply(ctrl(
                id.as_deref(),
                Some(&client),
                404,
                "topic not found",
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
            self.get(get.id.as_deref(), &get.topic, &get.query).await
        } else if let Some(del) = msg.del {
            self.delete(del).await
        } else if let Some(note) = msg.note {
            // Notes get no reply; invalid ones are dropped silently.
            self.note(note).await
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
        let gw = self.gateway.clone();
        // (identity, token auth_version, token issued at ms); the claims of
        // a token login, whose expiry the reply keeps.
        let mut presented: Option<auth::Claims> = None;
        let identity = match login.scheme.as_str() {
            "token" => gw.tokens.verify(&login.secret).map(|c| {
                presented = Some(c.clone());
                (
                    Identity {
                        tenant: c.ten,
                        uid: c.uid,
                        device: c.dev,
                    },
                    Some(c.av),
                    c.iat * 1000,
                )
            }),
            "basic" => auth::check_basic(&gw.config.auth, &login.secret).map(|(tenant, uid)| {
                let device = format!("basic-{}", &self.sid[..8]);
                (
                    Identity {
                        tenant,
                        uid,
                        device,
                    },
                    None,
                    now_ms(),
                )
            }),
            _ => Err(AuthError::UnknownScheme),
        };
        let (identity, token_av, issued_ms) = match identity {
            Ok(i) if gw.config.tenant(&i.0.tenant).is_some() => i,
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
        let mut redis = gw.sender.redis();
        let Ok(state) =
            control::state(&mut redis, &identity.tenant, identity.uid, &identity.device).await
        else {
            self.reply(ctrl(id, None, 503, "service unavailable, retry", None))
                .await;
            return;
        };
        // A password login is as new as the current auth_version.
        let auth_version = token_av.unwrap_or(state.auth_version);
        if let Some(why) = state.refusal(auth_version, issued_ms) {
            self.reply(ctrl(
                id,
                None,
                401,
                "authentication failed",
                Some(json!({"reason": why})),
            ))
            .await;
            return;
        }
        let issued = match &presented {
            // No sliding expiry: a token login keeps its token's lifetime.
            Some(claims) => gw.tokens.reissue(claims),
            None => gw.tokens.issue(
                &identity.tenant,
                identity.uid,
                &identity.device,
                auth_version,
            ),
        };
        let handle = SessionHandle {
            sid: Arc::from(self.sid.as_str()),
            tenant: Arc::from(identity.tenant.as_str()),
            uid: identity.uid,
            device: Arc::from(identity.device.as_str()),
            auth_version,
            since_ms: issued_ms,
            tx: self.out.clone(),
            closing: self.closing.clone(),
        };
        gw.hub.add_session(&handle);
        let _ = presence::user_online(
            &mut redis,
            &identity.tenant,
            identity.uid,
            &self.sid,
            &gw.node_id,
            now_ms(),
        )
        .await;
        self.handle = Some(handle);
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
            self.reply(ctrl(id, Some(&self.shown(topic)), 200, "ok", None))
                .await;
            return;
        }
        if !proto::is_conversation_topic(topic) {
            self.reply(ctrl(
                id,
                Some(&self.shown(topic)),
                404,
                "topic not found",
                None,
            ))
            .await;
            return;
        }
        if self.is_attached(topic) {
            self.reply(ctrl(
                id,
                Some(&self.shown(topic)),
                304,
                "already subscribed",
                None,
            ))
            .await;
            return;
        }
        let who = self.identity.clone().expect("logged in");
        let Ok(pool) = self.gateway.sender.pools().get(&who.tenant) else {
            self.reply(ctrl(
                id,
                Some(&self.shown(topic)),
                500,
                "internal error",
                None,
            ))
            .await;
            return;
        };
        let mut redis = self.gateway.sender.redis();
        match crate::groups::membership(pool, &mut redis, &who.tenant, topic, who.uid).await {
            Ok(Membership::Member) => {
                self.attached.insert(topic.to_string());
                if let Some(handle) = self.handle.clone() {
                    self.gateway.hub.attach(&handle, topic);
                    let first = presence::attach(
                        &mut redis,
                        &who.tenant,
                        topic,
                        who.uid,
                        &self.gateway.node_id,
                        now_ms(),
                        self.gateway.config.gateway.heartbeat_secs as i64 * 1000,
                    )
                    .await
                    .unwrap_or(false);
                    if first && proto::is_group_topic(topic) {
                        self.announce(
                            &who.tenant,
                            topic,
                            frames::pres_frame(topic, &proto::user_id(who.uid), "on"),
                        )
                        .await;
                    }
                }
                let acs = json!({"acs": {"want": "JRWPS", "given": "JRWPS", "mode": "JRWPS"}});
                self.reply(ctrl(id, Some(&self.shown(topic)), 200, "ok", Some(acs)))
                    .await;
                if let Some(query) = &sub.get {
                    self.get(id, topic, query).await;
                }
            }
            Ok(Membership::NotMember) => {
                self.reply(ctrl(
                    id,
                    Some(&self.shown(topic)),
                    403,
                    "permission denied",
                    None,
                ))
                .await
            }
            Ok(Membership::Dissolved) => {
                self.reply(ctrl(
                    id,
                    Some(&self.shown(topic)),
                    404,
                    "topic not found",
                    None,
                ))
                .await
            }
            Err(e) => {
                tracing::warn!(error = %e, "membership check failed");
                self.reply(ctrl(
                    id,
                    Some(&self.shown(topic)),
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
            let _ = tokio::time::timeout(REPLY_STALL, out.send(Outbound::Frame(Arc::from(reply))))
                .await;
            drop(permit);
        });
    }

    /// `{get}`: `data` (history page, then ctrl 208/204) and `del`.
    async fn get(&mut self, id: Option<&str>, topic: &str, query: &proto::GetQuery) {
        let who = self.identity.clone().expect("logged in");
        // Attached or not: a member removed a moment ago reads no more
        // (one cached membership check).
        if let Err(reads::Refusal(code, text)) =
            reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid).await
        {
            self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                .await;
            return;
        }
        let what: Vec<&str> = query.what.split_whitespace().collect();
        if what.contains(&"desc") {
            match reads::describe(&self.gateway, &who.tenant, topic, who.uid).await {
                Ok(desc) => {
                    let mut meta =
                        json!({"topic": self.shown(topic), "desc": desc, "ts": proto::now()});
                    if let Some(id) = id {
                        meta["id"] = json!(id);
                    }
                    self.reply(json!({ "meta": meta }).to_string()).await
                }
                Err(reads::Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
        if what.contains(&"data") {
            let data = query.data.clone().unwrap_or_default();
            match reads::query_data(&self.gateway, &who.tenant, topic, who.uid, &data).await {
                Ok(messages) if messages.is_empty() => {
                    self.reply(ctrl(
                        id,
                        Some(&self.shown(topic)),
                        204,
                        "no content",
                        Some(json!({"what": "data"})),
                    ))
                    .await
                }
                Ok(messages) => {
                    for m in &messages {
                        self.reply(
                            json!({"data": reads::data_body(&self.shown(topic), m)}).to_string(),
                        )
                        .await;
                    }
                    let params = json!({"what": "data", "count": messages.len()});
                    self.reply(ctrl(
                        id,
                        Some(&self.shown(topic)),
                        208,
                        "delivered",
                        Some(params),
                    ))
                    .await
                }
                Err(reads::Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
        if what.contains(&"del") {
            match reads::deleted_ranges(&self.gateway, &who.tenant, topic, who.uid).await {
                Ok(Some(del)) => {
                    let mut meta =
                        json!({"topic": self.shown(topic), "del": del, "ts": proto::now()});
                    if let Some(id) = id {
                        meta["id"] = json!(id);
                    }
                    self.reply(json!({"meta": meta}).to_string()).await
                }
                Ok(None) => {
                    self.reply(ctrl(
                        id,
                        Some(&self.shown(topic)),
                        204,
                        "no content",
                        Some(json!({"what": "del"})),
                    ))
                    .await
                }
                Err(reads::Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
    }

    /// `{del what="msg"}`: without `hard` hides ranges from this user's
    /// view; with `hard` recalls the user's own messages or, for an owner
    /// or admin, deletes them for everyone (see [`edits`]).
    async fn delete(&mut self, del: proto::MsgDel) {
        let id = del.id.as_deref();
        let topic = del.topic.as_str();
        if del.what != "msg" {
            self.reply(ctrl(
                id,
                Some(&self.shown(topic)),
                501,
                "not implemented",
                None,
            ))
            .await;
            return;
        }
        if del.hard {
            let who = self.identity.clone().expect("logged in");
            let ranges: Vec<SeqRange> = del
                .delseq
                .unwrap_or_default()
                .iter()
                .map(|r| SeqRange {
                    low: r.low,
                    hi: r.hi.unwrap_or(r.low.saturating_add(1)),
                })
                .collect();
            let caller = self.caller(&who);
            let reply = match edits::hard_delete(&self.gateway, &caller, topic, &ranges).await {
                Ok(done) => ctrl(
                    id,
                    Some(&self.shown(topic)),
                    200,
                    "ok",
                    Some(json!({"del": done.del_id()})),
                ),
                Err(Refusal(code, text)) => ctrl(id, Some(&self.shown(topic)), code, &text, None),
            };
            self.reply(reply).await;
            return;
        }
        let who = self.identity.clone().expect("logged in");
        if let Err(reads::Refusal(code, text)) =
            reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid).await
        {
            self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                .await;
            return;
        }
        let ranges = del.delseq.unwrap_or_default();
        match reads::clear_history(
            &self.gateway,
            &who.tenant,
            topic,
            who.uid,
            &who.device,
            &self.sid,
            &ranges,
        )
        .await
        {
            Ok(del_id) => {
                self.reply(ctrl(
                    id,
                    Some(&self.shown(topic)),
                    200,
                    "ok",
                    Some(json!({"del": del_id})),
                ))
                .await
            }
            Err(reads::Refusal(code, text)) => {
                self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                    .await
            }
        }
    }

    /// `{note}`: recv/read go to the receipts topic (the receipts pipeline
    /// stores the cursor and relays `{info}`); kp is relayed in real time only.
    async fn note(&mut self, note: proto::MsgNote) {
        let topic = note.topic.as_str();
        if !self.is_attached(topic) {
            return;
        }
        let who = self.identity.clone().expect("logged in");
        if reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid)
            .await
            .is_err()
        {
            return;
        }
        match (note.what.as_str(), note.seq) {
            ("kp", None) => {
                let now = now_ms();
                let last = self.kp_at.get(topic).copied().unwrap_or(0);
                if now - last < KP_INTERVAL_MS {
                    return;
                }
                self.kp_at.insert(topic.to_string(), now);
                self.announce(
                    &who.tenant,
                    topic,
                    frames::info_frame(topic, who.uid, "kp", None),
                )
                .await;
            }
            (what @ ("recv" | "read"), Some(seq)) if seq > 0 => {
                let keys = crate::keys::TopicKeys::new(&who.tenant, topic);
                let mut redis = self.gateway.sender.redis();
                let last: Option<i64> = redis::cmd("HGET")
                    .arg(keys.seq())
                    .arg("last_seq")
                    .query_async(&mut redis)
                    .await
                    .ok()
                    .flatten();
                if last.is_some_and(|l| seq > l) {
                    return;
                }
                let cursor = SeqCursor { seq };
                let body = if what == "read" {
                    ReceiptBody::ReadReceipt(cursor)
                } else {
                    ReceiptBody::RecvReceipt(cursor)
                };
                let event = ReceiptEvent {
                    event_id: new_event_id(),
                    tenant_id: who.tenant.clone(),
                    topic: topic.to_string(),
                    occurred_at: now_ms(),
                    uid: who.uid,
                    device: who.device.clone(),
                    source_sid: self.sid.clone(),
                    source_node: self.gateway.node_id.clone(),
                    body,
                };
                let key = format!("{}:{topic}", who.tenant);
                if let Err(e) = self
                    .gateway
                    .sender
                    .producer()
                    .send(TopicKind::Receipts, &key, &event, None)
                    .await
                {
                    tracing::warn!(error = %e, "receipt not produced");
                }
            }
            _ => {}
        }
    }

    async fn leave(&mut self, leave: MsgLeave) {
        let id = leave.id.as_deref();
        let topic = leave.topic.as_str();
        if !self.is_attached(topic) || !self.attached.remove(topic) {
            self.reply(ctrl(id, Some(&self.shown(topic)), 304, "not joined", None))
                .await;
            return;
        }
        if leave.unsub {
            // Through governance: an owner may not leave (403).
            let who = self.identity.clone().expect("logged in");
            let caller = self.caller(&who);
            let gov = &self.gateway.governance;
            let result = match gov.standing(&who.tenant, topic, who.uid).await {
                Ok(standing) => gov
                    .act(
                        &who.tenant,
                        topic,
                        crate::governance::Actor::User(who.uid, standing),
                        crate::governance::Action::Leave,
                        &caller.origin,
                        "",
                    )
                    .await
                    .map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(refused) = result {
                self.attached.insert(topic.to_string());
                self.reply(ctrl(
                    id,
                    Some(&self.shown(topic)),
                    refused.0,
                    &refused.1,
                    None,
                ))
                .await;
                return;
            }
        }
        if let Some(handle) = self.handle.clone() {
            self.detach(&handle, topic).await;
        }
        self.reply(ctrl(id, Some(&self.shown(topic)), 200, "ok", None))
            .await;
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
                json!({"what": "muted", "code": "GROUP_MUTED", "until": proto::timestamp_ms(*until)}),
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
            Some(json!({"retry": true, "request_id": super::log_internal(why)})),
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
