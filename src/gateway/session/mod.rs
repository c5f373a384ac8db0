//! One WebSocket session speaking the Tinode protocol. This module holds the
//! connection (reader, writer task, dispatch); each message kind has its
//! own file: [`login`] (`{hi}`, `{login}`), [`attach`] (`{sub}`, `{leave}`),
//! [`publish`] (`{pub}`), [`get`] (`{get}`), [`delete`] (`{del}`),
//! [`note`] (`{note}`), [`set`] (`{set}`) and [`me`] (the chat list:
//! `{sub}`, `{get}` and `{leave}` of `me`). Replies go through a bounded
//! outbound queue drained by a writer task, so a slow client never blocks
//! others.

mod account;
mod attach;
mod delete;
mod find;
mod get;
mod login;
mod me;
mod modes;
mod note;
mod publish;
mod set;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::mpsc;

use crate::events::{new_event_id, now_ms};
use crate::realtime::hub::{Outbound, SessionHandle};
use crate::realtime::presence;
use crate::shutdown::Shutdown;

use super::control;
use super::edits;
use super::Gateway;
use crate::tinode::{self, ctrl, ClientMsg};

/// Every kind of client message the session dispatches, by Tinode's name
/// (the one field of a [`ClientMsg`] that is set). tests/adversary.rs
/// attacks each kind that names a topic or a user.
pub const CLIENT_MESSAGE_KINDS: &[&str] = &[
    "hi", "login", "sub", "pub", "get", "leave", "note", "del", "set", "acc",
];

/// Each kind and whether `msg` is of it. Every field is named (no `..`),
/// so a kind added to [`ClientMsg`] does not compile until it is listed.
fn kinds(msg: &ClientMsg) -> [(&'static str, bool); 10] {
    let ClientMsg {
        hi,
        login,
        sub,
        publish,
        get,
        leave,
        note,
        del,
        set,
        acc,
    } = msg;
    [
        ("hi", hi.is_some()),
        ("login", login.is_some()),
        ("sub", sub.is_some()),
        ("pub", publish.is_some()),
        ("get", get.is_some()),
        ("leave", leave.is_some()),
        ("note", note.is_some()),
        ("del", del.is_some()),
        ("set", set.is_some()),
        ("acc", acc.is_some()),
    ]
}

/// The kind of `msg` (the first field set), if any.
fn kind_of(msg: &ClientMsg) -> Option<&'static str> {
    kinds(msg).into_iter().find(|(_, set)| *set).map(|(k, _)| k)
}

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
    /// Subscribed to `me`: its chat list gets `{pres topic="me"}`.
    on_me: bool,
    /// The `fnd` topic's search query (`{set topic="fnd"}`).
    fnd_query: Option<String>,
    /// The client's address (failed logins are counted against it).
    peer: Option<std::net::IpAddr>,
    /// When this session signed in with a password (epoch ms): `{acc}` may
    /// change it without asking for it again for a while.
    password_login_at: Option<i64>,
    /// Already sent its recent chats' newest messages (once a session).
    warmed: bool,
}

/// Sends of one session produced concurrently (their seqs are already fixed).
const IN_FLIGHT_SENDS: usize = 32;
/// How long a reply may wait for room in the outbound queue.
const REPLY_STALL: std::time::Duration = std::time::Duration::from_secs(10);
/// Uplink traffic re-checks session control at most this often.
const UPLINK_CHECK_MS: i64 = 5000;
/// How long a closing session waits for its writer to deliver what is
/// queued and the final ctrl before it drops the connection anyway.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Frames written to the socket with one flush, at most.
const WRITE_BATCH: usize = 64;

/// Serves one upgraded WebSocket until it closes or the gateway stops.
/// `_counted` is this connection's place in the per-address count, held
/// for as long as the socket is open.
pub async fn serve(
    gateway: Arc<Gateway>,
    socket: WebSocket,
    peer: Option<std::net::IpAddr>,
    _counted: Option<super::server::Counted>,
) {
    let limits = &gateway.config.limits;
    let login_deadline = Duration::from_secs(limits.login_deadline_secs.max(1));
    let idle = Duration::from_secs(limits.idle_timeout_secs.max(1));
    let (mut sink, mut stream) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Outbound>(OUTBOUND_QUEUE);
    // Cancelled when the gateway stops or the session is evicted.
    let closed: Shutdown = gateway.shutdown.child();
    let writer_closed = closed.clone();
    // Stops when the queue ends, after the final ctrl of a close, or when
    // `closed` fires — even in the middle of a send a client does not read.
    let writer = tokio::spawn(async move {
        // Pings keep a quiet but live client from counting as idle (its
        // pongs are frames); a client that answers nothing is closed.
        let period = (idle / 3).max(Duration::from_millis(100));
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            let out = tokio::select! {
                out = rx.recv() => out,
                _ = writer_closed.cancelled() => None,
                _ = ping.tick() => {
                    let pinged = tokio::select! {
                        r = sink.send(Message::Ping(Vec::new().into())) => r.is_ok(),
                        _ = writer_closed.cancelled() => false,
                    };
                    if !pinged {
                        break;
                    }
                    continue;
                }
            };
            let Some(first) = out else { break };
            // What is already queued goes out together: frames are fed to
            // the socket and flushed once, so a burst costs one write, not
            // one per frame.
            let mut batch = vec![first];
            while batch.len() < WRITE_BATCH {
                match rx.try_recv() {
                    Ok(out) => batch.push(out),
                    Err(_) => break,
                }
            }
            let mut last = false;
            let written = async {
                for out in batch {
                    let text = match out {
                        Outbound::Frame(text) => text,
                        Outbound::Close(reason) => {
                            last = true;
                            ctrl(
                                None,
                                None,
                                401,
                                "session closed",
                                Some(json!({"reason": &*reason})),
                            )
                            .into()
                        }
                    };
                    sink.feed(Message::Text(text)).await?;
                    if last {
                        break;
                    }
                }
                sink.flush().await
            };
            let sent = tokio::select! {
                r = written => r.is_ok(),
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
        on_me: false,
        fnd_query: None,
        peer,
        password_login_at: None,
        warmed: false,
    };
    let connected = tokio::time::Instant::now();
    let mut last_frame = connected;
    loop {
        // Not logged in by the login deadline, or silent for the idle
        // timeout: closed with a final ctrl naming why.
        let (deadline, why) =
            if session.identity.is_none() && connected + login_deadline < last_frame + idle {
                (connected + login_deadline, "login deadline passed")
            } else {
                (last_frame + idle, "idle timeout")
            };
        let frame = tokio::select! {
            _ = closed.cancelled() => break,
            _ = session.closing.cancelled() => {
                // The writer ends after the final ctrl; a client that does
                // not read is dropped after the grace anyway.
                let _ = tokio::time::timeout(CLOSE_GRACE, closed.cancelled()).await;
                break;
            }
            _ = tokio::time::sleep_until(deadline) => {
                tracing::info!(sid = %session.sid, why, "closing session");
                session.close(why);
                continue;
            }
            f = stream.next() => f,
        };
        last_frame = tokio::time::Instant::now();
        let Some(Ok(frame)) = frame else { break };
        let text = match frame {
            Message::Text(t) => t.to_string(),
            Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
            Message::Close(_) => break,
            _ => continue,
        };
        // Boxed: a handler's state lives only while it runs, so an idle
        // session holds none of it (its future is most of a session's
        // memory otherwise).
        // Each client message is one request (its id made only if needed).
        Box::pin(crate::request_id::scope(None, session.dispatch(&text))).await;
    }
    closed.trigger();
    Box::pin(session.finish()).await;
    drop(session);
    let _ = writer.await;
}

impl Session {
    /// Queues a reply. Replies are never dropped: a client that stops
    /// reading stalls its own session (its uplink is not read meanwhile),
    /// and after `REPLY_STALL` it is disconnected.
    pub(super) async fn reply(&self, text: String) {
        let out = Outbound::Frame(text.into());
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
    pub(super) async fn finish(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        // The user's presence first, then the topics' `{pres off}`: whoever
        // sees "off" finds the user's presence already updated.
        self.gateway.hub.remove_session(&handle);
        let still_here = !self
            .gateway
            .hub
            .user_sessions(&handle.tenant, handle.uid, None, "")
            .is_empty();
        let mut redis = self.gateway.redis.clone();
        let last = presence::user_offline(
            &mut redis,
            &handle.tenant,
            handle.uid,
            &self.sid,
            &self.gateway.node_id,
            still_here,
            now_ms(),
        )
        .await;
        if last.is_ok_and(|l| l) {
            let (gw, tenant, uid) = (self.gateway.clone(), handle.tenant.to_string(), handle.uid);
            tokio::spawn(async move {
                crate::gateway::chats::announce_to_peers(&gw, &tenant, uid, "off").await
            });
        }
        let topics: Vec<String> = self.attached.drain().collect();
        for topic in topics {
            self.detach(&handle, &topic).await;
        }
    }

    /// Rewrites the message's topic to the stored name; `Err(name)` when
    /// the name means no topic this user can have (`usr<self>`, someone
    /// else's p2p topic).
    pub(super) fn resolve_topic(&self, msg: &mut ClientMsg) -> Result<(), String> {
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
        } else if let Some(m) = msg.set.as_mut() {
            Some(&mut m.topic)
        } else {
            msg.note.as_mut().map(|m| &mut m.topic)
        };
        let Some(topic) = slot else { return Ok(()) };
        if topic == "me" || topic == find::FND || tinode::is_group_topic(topic) {
            return Ok(());
        }
        match tinode::resolve_topic(topic, who.uid) {
            Some(stored) => {
                *topic = stored;
                Ok(())
            }
            None => Err(topic.clone()),
        }
    }

    /// The name this user knows a stored topic by (`usr<peer>` for p2p).
    pub(super) fn shown(&self, topic: &str) -> String {
        match &self.identity {
            Some(who) => tinode::client_topic(topic, who.uid),
            None => topic.to_string(),
        }
    }

    /// This session as the actor of an edit, delete or governance action.
    pub(super) fn caller<'a>(&self, who: &'a Identity) -> edits::Caller<'a> {
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

    /// Ends the session: the final ctrl 401 with `reason` if it can still be
    /// queued, and the connection is dropped shortly after in any case.
    pub(super) fn close(&self, reason: &str) {
        let _ = self.out.try_send(Outbound::Close(Arc::from(reason)));
        self.closing.trigger();
    }

    /// Takes one token of `action` for this session's user; on refusal
    /// answers `{ctrl 429 params.retry_after_ms}` (or 503 when the limiter
    /// is unreachable) to request `id` and returns false. The session and
    /// its other requests are unaffected.
    pub(super) async fn rate(
        &self,
        id: Option<&str>,
        topic: &str,
        action: super::limits::Action,
    ) -> bool {
        let Some(who) = &self.identity else {
            return false;
        };
        let mut redis = self.gateway.redis.clone();
        match super::limits::take(
            &mut redis,
            &self.gateway.config.limits,
            &who.tenant,
            who.uid,
            action,
        )
        .await
        {
            Ok(()) => true,
            Err(l) => {
                let (code, text, params) = l.ctrl_parts();
                self.reply(ctrl(id, Some(&self.shown(topic)), code, text, Some(params)))
                    .await;
                false
            }
        }
    }

    /// Closes the session if session control says so (checked at most every
    /// few seconds on uplink). Returns false when the command must not run:
    /// the session is closing, or its state could be read from neither
    /// Redis nor MySQL (the command is refused with 503 and the next one
    /// checks again: fail closed, without dropping the connection).
    pub(super) async fn still_allowed(&mut self, msg: &ClientMsg) -> bool {
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
        let mut redis = self.gateway.redis.clone();
        let checked = control::recheck(
            &mut redis,
            &self.gateway.pools,
            std::slice::from_ref(handle),
        )
        .await;
        if let Some((_, why)) = checked.refused.first() {
            self.close(why);
            return false;
        }
        if let Some((_, e)) = checked.unknown.first() {
            tracing::warn!(error = %e, sid = %self.sid, "session control unavailable on uplink; refusing the command");
            self.checked_at = 0;
            let (id, topic) = (message_id(msg), message_topic(msg));
            self.reply(ctrl(
                id.as_deref(),
                topic.as_deref(),
                503,
                tinode::UNAVAILABLE,
                None,
            ))
            .await;
            return false;
        }
        true
    }

    pub(super) async fn dispatch(&mut self, text: &str) {
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
            Err(e) => {
                // Answered with the request's id when it can be read, so a
                // client learns which of its requests was refused and why.
                let (id, topic) = malformed_ids(text);
                let why = malformed_reason(&e);
                self.reply(ctrl(id.as_deref(), topic.as_deref(), 400, &why, None))
                    .await;
                return;
            }
        };
        tracing::trace!(sid = %self.sid, kind = kind_of(&msg).unwrap_or("none"), "client message");
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
            if let Some(acc) = msg.acc {
                // Sign-up and password reset come before any login.
                return self.account(acc).await;
            }
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
        if !self.still_allowed(&msg).await {
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
        } else if let Some(set) = msg.set {
            self.set(set).await
        } else if let Some(acc) = msg.acc {
            self.account(acc).await
        } else {
            let id = message_id(&msg);
            self.reply(ctrl(id.as_deref(), None, 400, "malformed", None))
                .await
        }
    }
}

/// Longest `id` or `topic` echoed in the refusal of a malformed message.
const ECHOED_FIELD_BYTES: usize = 256;

/// The `id` and `topic` of a message that did not parse as a client
/// message, where it is at least a JSON object of one verb with string
/// fields of those names.
fn malformed_ids(text: &str) -> (Option<String>, Option<String>) {
    let Ok(serde_json::Value::Object(outer)) = serde_json::from_str::<serde_json::Value>(text)
    else {
        return (None, None);
    };
    let Some(serde_json::Value::Object(inner)) = outer.values().next() else {
        return (None, None);
    };
    let field = |name: &str| {
        inner
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|s| s.len() <= ECHOED_FIELD_BYTES)
            .map(String::from)
    };
    (field("id"), field("topic"))
}

/// What was wrong, in serde's words without the position, clipped (a
/// value quoted back is the client's own, never more than a line).
fn malformed_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let text = match text.rfind(" at line ") {
        Some(at) => &text[..at],
        None => &text,
    };
    let mut clipped: String = text.chars().take(120).collect();
    if clipped.len() < text.len() {
        clipped.push('…');
    }
    format!("malformed: {clipped}")
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
        .or_else(|| msg.set.as_ref().and_then(|m| m.id.clone()))
        .or_else(|| msg.acc.as_ref().and_then(|m| m.id.clone()))
}

fn message_topic(msg: &ClientMsg) -> Option<String> {
    msg.sub
        .as_ref()
        .map(|m| m.topic.clone())
        .or_else(|| msg.publish.as_ref().map(|m| m.topic.clone()))
        .or_else(|| msg.get.as_ref().map(|m| m.topic.clone()))
        .or_else(|| msg.leave.as_ref().map(|m| m.topic.clone()))
        .or_else(|| msg.del.as_ref().map(|m| m.topic.clone()))
        .or_else(|| msg.set.as_ref().map(|m| m.topic.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listed_kinds_are_the_dispatched_ones() {
        let listed: Vec<&str> = kinds(&ClientMsg::default()).map(|(k, _)| k).to_vec();
        assert_eq!(listed, CLIENT_MESSAGE_KINDS);
        for kind in CLIENT_MESSAGE_KINDS {
            let body = match *kind {
                "hi" | "acc" => json!({}),
                "login" => json!({"scheme": "token", "secret": "x"}),
                "note" => json!({"topic": "grpA", "what": "kp"}),
                "del" => json!({"topic": "grpA", "what": "msg"}),
                "get" => json!({"topic": "grpA", "what": "data"}),
                _ => json!({"topic": "grpA"}),
            };
            let msg: ClientMsg = serde_json::from_value(json!({ *kind: body }))
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(kind_of(&msg), Some(*kind));
        }
        assert_eq!(kind_of(&ClientMsg::default()), None);
    }
}
