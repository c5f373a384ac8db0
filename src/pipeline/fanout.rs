//! The fan-out pipeline's handler: each MessageSent becomes one `{data}`
//! frame, published once to every node with online members of the topic
//! (dedup key `msg:{topic}:{seq}`). Deletes for everyone become `{pres
//! what="del"}`; membership, role and mute changes `{pres what="acs"}` to
//! the topic and to the user's `me`; a removed member's sessions and every
//! session of a dissolved group are evicted. Realtime only: a lost copy is
//! caught up by seq (or on the next attach). Redis unreachable is an
//! outage, waited out like any other.

use std::collections::HashMap;

use crate::redis_util::Redis;

use crate::events::{now_ms, EventCodec, GroupEvent, GroupEventBody};
use crate::groups::Role;
use crate::realtime::{
    envelope::node_channel, envelope::BROADCAST_CHANNEL, frames, presence, Envelope, Kind,
    TargetType,
};
use crate::store::message::StoredMessage;
use crate::tinode;

use super::failure::redis_failure;
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct FanoutHandler {
    codec: EventCodec,
    redis: Redis,
    /// Who left each group when (the group write model): a message is never
    /// delivered to someone removed before it was sent, even while the
    /// members projection (and so their eviction) lags.
    model: crate::group_model::GroupModel,
}

impl FanoutHandler {
    pub fn new(codec: EventCodec, redis: Redis, model: crate::group_model::GroupModel) -> Self {
        Self {
            codec,
            redis,
            model,
        }
    }
}

type Departures = HashMap<i64, (i64, Option<i64>)>;

/// Where an envelope goes: the nodes with online members of its topic, or
/// every node (a user's sessions may be anywhere).
enum Reach {
    Topic,
    All,
}

impl Handler for FanoutHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let mut redis = self.redis.clone();
        let now = now_ms();
        let mut nodes_of: HashMap<(String, String), Option<Vec<String>>> = HashMap::new();
        let mut departures_of: HashMap<(String, String), Departures> = HashMap::new();
        let mut pipe = redis::pipe();
        let mut queued: Vec<usize> = Vec::new();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        // A topic's frames go out in log order: after a failed one, wait.
        let mut gate = KeyGate::new(records, failures);
        for (i, event) in events {
            let mut outgoing = envelopes(&event);
            if outgoing.is_empty() || !gate.admit(i) {
                continue;
            }
            let key = (event.tenant_id.clone(), event.topic.clone());
            if let GroupEventBody::MessageSent(m) = &event.body {
                if tinode::is_group_topic(&event.topic) {
                    if !departures_of.contains_key(&key) {
                        match self.model.departures(&key.0, &key.1).await {
                            Ok(d) => {
                                departures_of.insert(key.clone(), d);
                            }
                            Err(e) => {
                                gate.fail(RecordFailure::outage(i, e.to_string()));
                                continue;
                            }
                        }
                    }
                    let exclude = crate::group_model::excluded_users(m.seq, &departures_of[&key]);
                    for (envelope, _) in outgoing.iter_mut() {
                        if matches!(
                            envelope.target_type,
                            TargetType::Topic | TargetType::Watchers
                        ) {
                            envelope.exclude = exclude.clone();
                        }
                    }
                }
            }
            if !nodes_of.contains_key(&key) {
                match presence::online_nodes(&mut redis, &key.0, &key.1, now).await {
                    Ok(n) => {
                        nodes_of.insert(key.clone(), n);
                    }
                    Err(e) => {
                        gate.fail(RecordFailure::new(
                            i,
                            redis_failure(&e),
                            format!("redis: {e}"),
                        ));
                        continue;
                    }
                }
            }
            let nodes = &nodes_of[&key];
            for (envelope, reach) in outgoing {
                let text = serde_json::to_string(&envelope).unwrap_or_default();
                match (reach, nodes) {
                    (Reach::Topic, Some(nodes)) => {
                        for n in nodes {
                            pipe.publish(node_channel(n), &text).ignore();
                        }
                    }
                    _ => {
                        pipe.publish(BROADCAST_CHANNEL, &text).ignore();
                    }
                }
            }
            queued.push(i);
        }
        if !queued.is_empty() {
            if let Err(e) = pipe.query_async::<()>(&mut redis).await {
                // Published together, failed together.
                let kind = redis_failure(&e);
                for i in queued {
                    gate.fail(RecordFailure::new(i, kind, format!("redis: {e}")));
                }
            }
        }
        gate.outcome()
    }
}

/// The realtime envelopes one event becomes (Tinode shapes).
fn envelopes(event: &GroupEvent) -> Vec<(Envelope, Reach)> {
    let topic = event.topic.as_str();
    let base =
        |suffix: &str, kind: Kind, target_type: TargetType, target: String, payload: String| {
            Envelope {
                event_id: format!("{}{suffix}", event.event_id),
                tenant_id: event.tenant_id.clone(),
                kind,
                target_type,
                target,
                skip_sid: String::new(),
                dedup_key: String::new(),
                occurred_at: event.occurred_at,
                payload,
                exclude: Vec::new(),
            }
        };
    let to_topic = |payload: String| {
        (
            base(
                "",
                Kind::Deliver,
                TargetType::Topic,
                topic.to_string(),
                payload,
            ),
            Reach::Topic,
        )
    };
    let to_user = |uid: i64, payload: String| {
        (
            base(
                ":me",
                Kind::Deliver,
                TargetType::User,
                uid.to_string(),
                payload,
            ),
            Reach::All,
        )
    };
    let actor = tinode::user_id(event.actor_uid);
    // A one-to-one topic: every device of both users gets the frame, each
    // under its own name for the topic (`usr<peer>`); the sending session
    // is skipped.
    if let Some((a, b)) = tinode::parse_p2p_topic(topic) {
        let frame_for = |shown: &str| match &event.body {
            GroupEventBody::MessageSent(m) => {
                Some(frames::data_frame(shown, &StoredMessage::sent(m)))
            }
            GroupEventBody::MessageRecalled(r) => Some(frames::pres_del_frame(
                shown,
                &actor,
                r.del_id,
                &[(r.seq, r.seq + 1)],
            )),
            GroupEventBody::MessageDeleted(d) => {
                let ranges: Vec<(i64, i64)> = d.ranges.iter().map(|r| (r.low, r.hi)).collect();
                Some(frames::pres_del_frame(shown, &actor, d.del_id, &ranges))
            }
            GroupEventBody::PinsChanged(_) => Some(frames::pres_frame(shown, shown, "aux")),
            _ => None,
        };
        let mut out = Vec::new();
        for (me, peer) in [(a, b), (b, a)] {
            let Some(frame) = frame_for(&tinode::user_id(peer)) else {
                continue;
            };
            let mut envelope = base(
                &format!(":{me}"),
                Kind::Deliver,
                TargetType::User,
                me.to_string(),
                frame,
            );
            envelope.skip_sid = event.source_sid.clone();
            if let GroupEventBody::MessageSent(m) = &event.body {
                envelope.dedup_key = format!("msg:{topic}:{}:{me}", m.seq);
                envelope.occurred_at = m.created_at;
                // The chat lists of both users' sessions that are not in
                // the conversation: re-sort, badge (the sender's own too:
                // its other devices see the conversation move up).
                let mut pres = base(
                    &format!(":me:{me}"),
                    Kind::Deliver,
                    TargetType::UserOutside,
                    format!("{me}:{topic}"),
                    frames::pres_me_msg_frame(&tinode::user_id(peer), m.seq, m.from_user),
                );
                pres.dedup_key = format!("pres:{topic}:{}:{me}", m.seq);
                pres.skip_sid = event.source_sid.clone();
                out.push((pres, Reach::All));
            }
            out.push((envelope, Reach::All));
        }
        return out;
    }
    match &event.body {
        GroupEventBody::MessageSent(m) => {
            let snapshot = StoredMessage::sent(m);
            let mut envelope = to_topic(frames::data_frame(topic, &snapshot)).0;
            envelope.skip_sid = event.source_sid.clone();
            envelope.dedup_key = format!("msg:{topic}:{}", m.seq);
            envelope.occurred_at = m.created_at;
            // Members' sessions that watch the topic in their chat list
            // but are not attached to it: one envelope per node, never one
            // per member, so a big group costs what a small one does.
            let mut pres = base(
                ":watchers",
                Kind::Deliver,
                TargetType::Watchers,
                topic.to_string(),
                frames::pres_me_msg_frame(topic, m.seq, m.from_user),
            );
            pres.dedup_key = format!("pres:{topic}:{}", m.seq);
            vec![(envelope, Reach::Topic), (pres, Reach::All)]
        }
        GroupEventBody::MessageRecalled(r) => vec![to_topic(frames::pres_del_frame(
            topic,
            &actor,
            r.del_id,
            &[(r.seq, r.seq + 1)],
        ))],
        GroupEventBody::MessageDeleted(d) => {
            let ranges: Vec<(i64, i64)> = d.ranges.iter().map(|r| (r.low, r.hi)).collect();
            vec![to_topic(frames::pres_del_frame(topic, &actor, d.del_id, &ranges))]
        }
        GroupEventBody::MemberJoined(j) => {
            let role = Role::parse(&j.role);
            let mode = frames::access_mode(Some(role), false);
            // Added by someone else, the group is new to the member's
            // clients: told as a new chat, which they ask the chat list
            // about (Tinode's web app throws on an `acs` change of a chat
            // it does not know, issue 40). Joined by themselves (an
            // accepted invitation), their clients know it: its new mode.
            let to_member = if event.actor_uid == j.uid {
                frames::pres_me_acs_frame(topic, &mode, Some(role.as_str()))
            } else {
                frames::pres_me_new_chat_frame(topic, &actor)
            };
            vec![
                to_topic(frames::pres_acs_frame(topic, j.uid, &mode, Some(role.as_str()))),
                to_user(j.uid, to_member),
            ]
        }
        // The eviction comes from the members pipeline, once membership
        // says so.
        GroupEventBody::MemberLeft(l) => vec![to_topic(frames::pres_acs_frame(
            topic, l.uid, "N", None,
        ))],
        GroupEventBody::MemberRoleChanged(c) => {
            let role = Role::parse(&c.role);
            let mode = frames::access_mode(Some(role), false);
            vec![
                to_topic(frames::pres_acs_frame(topic, c.uid, &mode, Some(role.as_str()))),
                to_user(c.uid, frames::pres_me_acs_frame(topic, &mode, Some(role.as_str()))),
            ]
        }
        GroupEventBody::MemberMuted(mu) => {
            let muted = mu.muted_until.is_some_and(|t| t > now_ms());
            let mode = frames::access_mode(Some(Role::Member), muted);
            vec![
                to_topic(frames::pres_acs_frame(topic, mu.uid, &mode, None)),
                to_user(mu.uid, frames::pres_me_acs_frame(topic, &mode, None)),
            ]
        }
        GroupEventBody::GroupMuteChanged(g) => vec![to_topic(
            serde_json::json!({"pres": {"topic": topic, "src": topic, "what": "upd", "mute_all": g.mute_all}})
                .to_string(),
        )],
        GroupEventBody::GroupDissolved(_) => Vec::new(),
        GroupEventBody::GroupProfileChanged(_) => vec![
            to_topic(frames::pres_frame(topic, topic, "upd")),
            (
                base(
                    ":watchers",
                    Kind::Deliver,
                    TargetType::Watchers,
                    topic.to_string(),
                    frames::pres_me_frame(topic, "upd"),
                ),
                Reach::All,
            ),
        ],
        // Reports are for the tenant's moderators only: never delivered.
        // An invitation shows in the invitee's chat list (Tinode's `given`
        // without `want`); its answer changes their access again.
        // Told as a new chat too; the list gives the invitation's mode.
        GroupEventBody::MemberInvited(i) => vec![to_user(
            i.uid,
            frames::pres_me_new_chat_frame(topic, &tinode::user_id(i.invited_by)),
        )],
        GroupEventBody::MemberInviteDeclined(d) => vec![to_user(
            d.uid,
            frames::pres_me_acs_frame(topic, "N", None),
        )],
        GroupEventBody::MessageEdited(_)
        | GroupEventBody::HistoryCleared(_)
        | GroupEventBody::GroupCreated(_)
        | GroupEventBody::MessageReported(_)
        | GroupEventBody::MessageReportResolved(_)
        | GroupEventBody::FileAuditUpdated(_) => Vec::new(),
        // Members' sessions ask for the chat's `aux` again.
        GroupEventBody::PinsChanged(_) => vec![to_topic(frames::pres_frame(topic, topic, "aux"))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{GroupEvent, GroupEventBody, MessageSent};

    fn sent(topic: &str) -> GroupEvent {
        GroupEvent::new(
            "acme",
            topic,
            1001,
            GroupEventBody::MessageSent(MessageSent {
                message_id: 1,
                group_id: 1,
                seq: 42,
                shard_month: "202612".into(),
                client_msg_id: None,
                from_user: 1001,
                msg_type: "text".into(),
                head: None,
                content: Some("\"hi\"".into()),
                mentioned_user_ids: Vec::new(),
                mention_all: false,
                reply_seq: None,
                root_seq: None,
                file_count: 0,
                content_size: 4,
                has_risk: false,
                audit_status: "pass".into(),
                created_at: 1_700_000_000_000,
                expires_at: None,
            }),
        )
    }

    /// A gateway filling a gap after a lost subscription hands over a
    /// message under the identity the fan-out gave it: a session gets it
    /// once, whichever way comes first.
    #[test]
    fn a_gap_fill_is_the_fan_outs_delivery_under_the_same_identity() {
        for topic in ["grpX", &crate::tinode::p2p_topic(1001, 1002)] {
            let event = sent(topic);
            let GroupEventBody::MessageSent(m) = &event.body else {
                unreachable!()
            };
            let stored = StoredMessage::sent(m);
            let ours: Vec<(String, String, String, String)> = envelopes(&event)
                .into_iter()
                .map(|(e, _)| e)
                .filter(|e| e.dedup_key.starts_with("msg:"))
                .map(|e| {
                    (
                        format!("{:?}", e.target_type),
                        e.target,
                        e.dedup_key,
                        e.payload,
                    )
                })
                .collect();
            let refilled: Vec<(String, String, String, String)> =
                crate::realtime::bus::message_envelopes("acme", topic, &stored)
                    .into_iter()
                    .map(|e| {
                        (
                            format!("{:?}", e.target_type),
                            e.target,
                            e.dedup_key,
                            e.payload,
                        )
                    })
                    .collect();
            assert!(!ours.is_empty());
            assert_eq!(ours, refilled, "{topic}");
        }
    }
}
