//! The notify pipeline's handler: user events delivered to every online
//! session of their user, on whichever gateway (seed 002 §5–§6.2: friend
//! requests, relation changes synced across devices, system notifications
//! and their reading on another device, unread badge refreshes). The frame
//! is Tinode's `{pres topic="me" what="upd"}` with imstream's `event`
//! naming what changed and `params`. Realtime only: a missed frame is
//! caught up from the HTTP API (`GET /v1/me/notifications`).

use crate::redis_util::Redis;
use serde_json::{json, Value};

use crate::events::{EventCodec, FileAvailabilityChanged, UserEvent, UserEventBody};
use crate::realtime::{bus, Envelope, Kind, TargetType};
use crate::tinode;

use super::failure::redis_failure;
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct NotifyHandler {
    codec: EventCodec,
    redis: Redis,
}

impl NotifyHandler {
    pub fn new(codec: EventCodec, redis: Redis) -> Self {
        Self { codec, redis }
    }
}

/// `(src, event, params)` of the frame a user event becomes.
fn describe(e: &UserEvent) -> (String, &'static str, Value) {
    let user = tinode::user_id;
    match &e.body {
        // `id`: the notification it left, to mark read.
        UserEventBody::FriendRequestCreated(r) => (
            user(r.from_uid),
            "friend.request",
            json!({"from": user(r.from_uid), "message": r.message, "id": e.event_id}),
        ),
        UserEventBody::FriendRequestAccepted(a) => (
            user(a.by_uid),
            "friend.accepted",
            json!({"by": user(a.by_uid), "id": e.event_id}),
        ),
        UserEventBody::FriendAdded(f) => (user(f.friend_uid), "friend.added", json!({})),
        UserEventBody::FriendRemoved(f) => (user(f.friend_uid), "friend.removed", json!({})),
        UserEventBody::UserBlocked(b) => (user(b.blocked_uid), "user.blocked", json!({})),
        UserEventBody::UserUnblocked(b) => (user(b.blocked_uid), "user.unblocked", json!({})),
        // The notification as listed (`id`, `kind`, `title`, `text`, …).
        UserEventBody::SystemNotification(_) => (
            "sys".into(),
            "notification",
            crate::notifications::of_user_event(e)
                .first()
                .map(|n| n.json())
                .unwrap_or_default(),
        ),
        // Read on one device: every device clears them.
        UserEventBody::NotificationsRead(r) => (
            "sys".into(),
            "notification.read",
            json!({"ids": r.ids, "up_to": (r.up_to > 0).then(|| tinode::timestamp_ms(r.up_to))}),
        ),
        UserEventBody::BadgeRefresh(b) => ("sys".into(), "badge", json!({"unread": b.unread})),
        UserEventBody::ProfileChanged(p) => (
            user(e.uid),
            "profile",
            json!({"fn": p.full_name, "photo": p.photo, "note": p.note}),
        ),
        // The user's other devices keep their saved list in step.
        UserEventBody::FavoriteAdded(f) => (
            "sys".into(),
            "favorite.added",
            json!({"topic": tinode::client_topic(&f.topic, e.uid), "seq": f.seq}),
        ),
        UserEventBody::FavoriteRemoved(f) => (
            "sys".into(),
            "favorite.removed",
            json!({"topic": tinode::client_topic(&f.topic, e.uid), "seq": f.seq}),
        ),
        // The user's other devices read the chat's entry again.
        UserEventBody::ChatSettingsChanged(c) => (
            tinode::client_topic(&c.topic, e.uid),
            "chat.settings",
            json!({}),
        ),
        // The user's other devices may show their uploads.
        UserEventBody::FileUploaded(f) => (
            "sys".into(),
            "file.uploaded",
            json!({"url": format!("/v0/file/s/{}", f.file_id), "size": f.size, "mime": f.mime}),
        ),
        // The uploader's devices; the conversations referring to it are
        // told by `file_frames`.
        UserEventBody::FileAvailabilityChanged(f) => (
            "sys".into(),
            file_event(f),
            json!({"url": file_url(&f.file_id), "by": f.by}),
        ),
        UserEventBody::IncognitoChanged(i) => (
            "sys".into(),
            "presence.settings",
            json!({"incognito": i.incognito}),
        ),
        UserEventBody::PushSettingsChanged(p) => (
            "sys".into(),
            "push.settings",
            json!({"dnd": p.dnd, "topic": p.topic.as_deref().map(|t| tinode::client_topic(t, e.uid)), "muted": p.topic_muted}),
        ),
    }
}

fn file_url(file_id: &str) -> String {
    format!("/v0/file/s/{file_id}")
}

fn file_event(f: &FileAvailabilityChanged) -> &'static str {
    if f.available {
        "file.available"
    } else {
        "file.unavailable"
    }
}

/// Beyond its uploader, who is told that a file became unavailable (or
/// available again): every session that can see a message referring to
/// it, in each conversation of `f.topics` — a group's sessions attached
/// to it and those whose chat list holds it, both users of a one-to-one
/// chat (each with the chat as they name it). The frame is the same
/// `{pres topic="me" what="upd" src="sys" event="file.unavailable"}`,
/// `params.topic` naming the conversation.
fn file_frames(e: &UserEvent, f: &FileAvailabilityChanged) -> Vec<Envelope> {
    let frame = |topic: String| {
        json!({"pres": {"topic": "me", "src": "sys", "what": "upd", "event": file_event(f),
            "params": {"url": file_url(&f.file_id), "by": f.by, "topic": topic}}})
        .to_string()
    };
    let mut out = Vec::new();
    for topic in &f.topics {
        match tinode::parse_p2p_topic(topic) {
            Some((a, b)) => {
                for uid in [a, b] {
                    let shown = tinode::client_topic(topic, uid);
                    out.push(envelope(e, TargetType::User, uid.to_string(), frame(shown)));
                }
            }
            None => {
                for target_type in [TargetType::Topic, TargetType::Watchers] {
                    out.push(envelope(
                        e,
                        target_type,
                        topic.clone(),
                        frame(topic.clone()),
                    ));
                }
            }
        }
        // One event, several conversations of one user: each is told (a
        // later event about the same file is told again: its own id).
        for told in out.iter_mut().filter(|o| o.dedup_key.is_empty()) {
            told.dedup_key = format!("{}:{topic}", e.event_id);
        }
    }
    out
}

/// `payload`, from event `e`, for `target`.
fn envelope(e: &UserEvent, target_type: TargetType, target: String, payload: String) -> Envelope {
    Envelope {
        event_id: e.event_id.clone(),
        tenant_id: e.tenant_id.clone(),
        kind: Kind::Deliver,
        target_type,
        target,
        skip_sid: String::new(),
        dedup_key: String::new(),
        occurred_at: e.occurred_at,
        payload,
        exclude: Vec::new(),
    }
}

/// The `{pres topic="me" what="upd"}` frame of a user event.
pub fn frame(e: &UserEvent) -> String {
    let (src, event, params) = describe(e);
    json!({"pres": {"topic": "me", "src": src, "what": "upd", "event": event, "params": params}})
        .to_string()
}

impl Handler for NotifyHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let mut redis = self.redis.clone();
        let events = decode_all::<UserEvent>(&self.codec, records, &mut failures).await;
        // A user's frames go out in log order.
        let mut gate = KeyGate::new(records, failures);
        for (i, e) in events {
            if !gate.admit(i) {
                continue;
            }
            let mut envelopes = vec![envelope(&e, TargetType::User, e.uid.to_string(), frame(&e))];
            if let UserEventBody::FileAvailabilityChanged(f) = &e.body {
                envelopes.extend(file_frames(&e, f));
            }
            // A user's sessions may be on any gateway.
            for envelope in &envelopes {
                if let Err(err) = bus::publish(&mut redis, None, envelope).await {
                    gate.fail(RecordFailure::new(
                        i,
                        redis_failure(&err),
                        format!("redis: {err}"),
                    ));
                    break;
                }
            }
        }
        gate.outcome()
    }
}
