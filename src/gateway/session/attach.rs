//! `{sub}` and `{leave}`: attaching to a topic, presence, and the frames
//! announced to the topic's other sessions.

use serde_json::json;

use crate::events::{new_event_id, now_ms};
use crate::gateway::limits::Action;
use crate::gateway::refusal::Refusal;
use crate::groups::Membership;
use crate::realtime::hub::SessionHandle;
use crate::realtime::{frames, presence, Envelope, Kind, TargetType};
use crate::tinode::{self, ctrl, MsgLeave, MsgSub};

use super::Session;

/// Longest `new…` name a client may give a group it creates (Tinode's
/// clients send `new` and a short unique suffix).
const NEW_TOPIC_MAX: usize = 64;

impl Session {
    /// `{sub topic="new…" set={desc={public}}}`: a group created by the
    /// caller (its owner) the way `POST /v1/groups` creates one, named
    /// `grp…` by the server, then attached as any group: the reply's
    /// `topic` is the new name (Tinode's clients rename the topic by it).
    async fn create_and_subscribe(&mut self, mut sub: MsgSub) {
        let id = sub.id.clone();
        let asked = sub.topic.clone();
        if !self.rate(id.as_deref(), &asked, Action::GroupCreate).await {
            return;
        }
        let who = self.identity.clone().expect("logged in");
        let public = sub
            .set
            .take()
            .and_then(|s| s.desc)
            .and_then(|d| d.public)
            .filter(|p| p.as_object().is_some_and(|o| !o.is_empty()));
        let name = match public.as_ref().map(|p| &p["fn"]) {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(n)) => n.clone(),
            Some(_) => {
                let text = "malformed: desc.public.fn is the group's name, a string";
                self.reply(ctrl(id.as_deref(), Some(&asked), 400, text, None))
                    .await;
                return;
            }
        };
        // The whole description is checked before anything is created: a
        // picture or note the group could not keep refuses the create.
        let checked = match public
            .as_ref()
            .map(crate::gateway::chats::group_profile_change)
        {
            Some(Err(refusal)) => Err(refusal),
            // An uploaded picture must be the creator's own.
            Some(Ok(change)) => {
                crate::gateway::files::picture(
                    &self.gateway,
                    &who.tenant,
                    who.uid,
                    change.photo.as_deref(),
                )
                .await
            }
            None => Ok(()),
        };
        if let Err(Refusal(code, text)) = checked {
            self.reply(ctrl(id.as_deref(), Some(&asked), code, &text, None))
                .await;
            return;
        }
        let origin = self.caller(&who).origin;
        let created = crate::gateway::http::create_as(
            &self.gateway,
            &who.tenant,
            who.uid,
            None,
            name,
            Vec::new(),
            &origin,
        )
        .await;
        let topic = match created {
            Ok((topic, _, _)) => topic,
            Err(Refusal(code, text)) => {
                self.reply(ctrl(id.as_deref(), Some(&asked), code, &text, None))
                    .await;
                return;
            }
        };
        // The rest of the description (a photo, a note), checked above, as
        // the owner's first profile change; only an outage can refuse it
        // now, and the group then keeps its name alone (logged).
        if let Some(public) =
            public.filter(|p| p.as_object().is_some_and(|o| o.keys().any(|k| k != "fn")))
        {
            if let Err(Refusal(code, text)) = self.set_public(&topic, &public).await {
                tracing::warn!(%topic, code, %text, "a new group's picture or note was not kept");
            }
        }
        sub.topic = topic;
        self.subscribe(sub).await
    }

    pub(super) async fn subscribe(&mut self, sub: MsgSub) {
        let id = sub.id.as_deref();
        let topic = sub.topic.as_str();
        if topic == "me" {
            return self.subscribe_me(id, sub.get.as_ref()).await;
        }
        if topic == super::find::FND {
            return self.subscribe_fnd(id, sub.get.as_ref()).await;
        }
        if topic.starts_with("new") && topic.len() <= NEW_TOPIC_MAX {
            return Box::pin(self.create_and_subscribe(sub)).await;
        }
        if !tinode::is_conversation_topic(topic) {
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
        let Ok(_pool) = self.gateway.pools.get(&who.tenant) else {
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
        let mut redis = self.gateway.redis.clone();
        let membership = self
            .gateway
            .groups
            .membership(&who.tenant, topic, who.uid)
            .await;
        match membership {
            Ok(Membership::Member) => {
                self.attached.insert(topic.to_string());
                let mut change = None;
                if let Some(handle) = self.handle.clone() {
                    self.gateway.hub.attach(&handle, topic);
                    change = presence::attach(
                        &mut redis,
                        &who.tenant,
                        topic,
                        who.uid,
                        &self.gateway.node_id,
                        now_ms(),
                        self.gateway.config.gateway.heartbeat_secs as i64 * 1000,
                    )
                    .await
                    .ok()
                    .filter(|_| tinode::is_group_topic(topic));
                    if let Some(change) = change {
                        self.announce_attached(&who.tenant, topic, who.uid, change)
                            .await;
                    }
                }
                // The access mode the member's role gives (see docs/api.md: roles).
                let mode = match tinode::parse_p2p_topic(topic) {
                    Some(_) => crate::gateway::chats::P2P_MODE.to_string(),
                    None => match self
                        .gateway
                        .governance
                        .standing(&who.tenant, topic, who.uid)
                        .await
                    {
                        Ok(standing) => crate::gateway::chats::standing_mode(standing),
                        Err(_) => "JRWPS".to_string(),
                    },
                };
                let acs = match crate::gateway::chats::topic_acs(
                    &self.gateway,
                    &who.tenant,
                    who.uid,
                    topic,
                    &mode,
                )
                .await
                {
                    Ok(acs) => json!({ "acs": acs.json() }),
                    Err(_) => json!({ "acs": crate::gateway::chats::acs(&mode) }),
                };
                let asked_sub = sub
                    .get
                    .as_ref()
                    .is_some_and(|q| q.what.split_whitespace().any(|w| w == "sub"));
                if tinode::is_p2p_topic(topic) && !asked_sub {
                    // A new chat is attached with a bare `{sub}`: the two
                    // users anyway, unasked, since Tinode's clients draw
                    // the peer's read and received ticks from them (and
                    // ignore `{info}` of a user they do not know). Before
                    // the answer, so it is part of it.
                    if let Ok(subs) = self.p2p_subs(&who, topic).await {
                        self.reply_meta(None, &self.shown(topic), json!({ "sub": subs }))
                            .await;
                    }
                }
                self.reply(ctrl(id, Some(&self.shown(topic)), 200, "ok", Some(acs)))
                    .await;
                if let (Some(change), true) = (change, self.on_me) {
                    // Whether another member is here (not hiding it): the
                    // group's `online` in this session's chat list.
                    let shown = change.others_attached()
                        && !crate::gateway::chats::groups_with_others_shown(
                            &self.gateway,
                            &who.tenant,
                            who.uid,
                            &[topic],
                        )
                        .await
                        .is_empty();
                    let others = if shown { "on" } else { "off" };
                    self.reply(frames::pres_me_frame(topic, others)).await;
                }
                if let Some(query) = &sub.get {
                    self.get(id, topic, query).await;
                }
            }
            Ok(Membership::NotMember) => {
                // An invited user sees the invitation (Tinode's `given`
                // without `want`) and nothing of the group's messages: not
                // attached until they accept.
                if let Ok(crate::group_model::Read::State(s)) = self
                    .gateway
                    .groups
                    .read(&who.tenant, topic, &[who.uid], None)
                    .await
                {
                    if s.inviter(who.uid).is_some() {
                        use crate::realtime::frames::{INVITED_GIVEN, INVITED_WANT};
                        let acs = json!({"acs": {"want": INVITED_WANT, "given": INVITED_GIVEN, "mode": INVITED_WANT}});
                        self.reply(ctrl(id, Some(&self.shown(topic)), 200, "ok", Some(acs)))
                            .await;
                        return;
                    }
                }
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
                tracing::warn!(request_id = %crate::request_id::current(), error = %e, "membership check failed");
                self.reply(ctrl(
                    id,
                    Some(&self.shown(topic)),
                    503,
                    tinode::UNAVAILABLE,
                    None,
                ))
                .await
            }
        }
    }

    pub(super) async fn leave(&mut self, leave: MsgLeave) {
        let id = leave.id.as_deref();
        let topic = leave.topic.as_str();
        if topic == "me" {
            return self.leave_me(id).await;
        }
        if topic == super::find::FND {
            self.fnd_query = None;
            self.reply(ctrl(id, Some(topic), 200, "ok", None)).await;
            return;
        }
        if !self.is_attached(topic) || !self.attached.remove(topic) {
            self.reply(ctrl(id, Some(&self.shown(topic)), 304, "not joined", None))
                .await;
            return;
        }
        if leave.unsub
            && !self
                .rate(id, topic, crate::gateway::limits::Action::Change)
                .await
        {
            // A leave is an event like every change: the same bucket as
            // over HTTP. The session stays attached.
            self.attached.insert(topic.to_string());
            return;
        }
        if leave.unsub {
            // Off the local hub first: the member pipeline's eviction of
            // the leaver must not reach this session before its own answer
            // (a client that hears `gone` before `ctrl 200` trips).
            if let Some(handle) = &self.handle {
                self.gateway.hub.detach(handle, topic);
            }
            // Through governance: an owner may not leave (403).
            let result = self
                .govern(topic, |_| Ok(crate::governance::Action::Leave))
                .await;
            if let Err(Refusal(code, text)) = result {
                self.attached.insert(topic.to_string());
                if let Some(handle) = &self.handle {
                    self.gateway.hub.attach(handle, topic);
                }
                self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
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

    /// Leaves a topic locally and in presence; tells the others when this was
    /// the user's last attached session.
    pub(super) async fn detach(&self, handle: &SessionHandle, topic: &str) {
        let still_here = self.gateway.hub.detach(handle, topic);
        let mut redis = self.gateway.redis.clone();
        let change = presence::detach(
            &mut redis,
            &handle.tenant,
            topic,
            handle.uid,
            &self.gateway.node_id,
            still_here,
        )
        .await;
        if let (Ok(change), true) = (change, tinode::is_group_topic(topic)) {
            self.announce_attached(&handle.tenant, topic, handle.uid, change)
                .await;
        }
    }

    /// Tells a group's attached sessions that the user came (`"on"`, not
    /// while the user hides it: incognito) or went (`"off"`): the member's
    /// presence on the topic, and, when it
    /// flipped the others' view of the group, the group's `online` in their
    /// `me` topic (Tinode's web app shows typing only in an online topic).
    async fn announce_attached(
        &self,
        tenant: &str,
        topic: &str,
        uid: i64,
        change: presence::Change,
    ) {
        let what = if change.attached { "on" } else { "off" };
        // An "off" reveals nothing (a hidden user shows offline anyway)
        // and ends an "on" told before the user hid, by any device.
        if change.attached
            && (change.announce || change.flips_group_online())
            && crate::gateway::personal::hides_presence(&self.gateway, tenant, uid).await
        {
            return;
        }
        if change.announce {
            self.announce(
                tenant,
                topic,
                frames::pres_frame(topic, &tinode::user_id(uid), what),
            )
            .await;
        }
        if change.flips_group_online() {
            self.announce(tenant, topic, frames::pres_me_frame(topic, what))
                .await;
        }
    }

    /// Publishes a frame to every session attached to `topic` (all nodes)
    /// except this one.
    pub(super) async fn announce(&self, tenant: &str, topic: &str, frame: String) {
        let envelope = self.envelope(tenant, TargetType::Topic, topic.to_string(), frame);
        let mut redis = self.gateway.redis.clone();
        let nodes = presence::online_nodes(&mut redis, tenant, topic, now_ms())
            .await
            .ok()
            .flatten();
        if let Err(e) = crate::realtime::bus::publish(&mut redis, nodes.as_deref(), &envelope).await
        {
            tracing::warn!(error = %e, "realtime publish failed");
        }
    }

    /// Publishes a frame to every session of user `uid` (all nodes) except
    /// this one.
    pub(super) async fn announce_to_user(&self, tenant: &str, uid: i64, frame: String) {
        let envelope = self.envelope(tenant, TargetType::User, uid.to_string(), frame);
        let mut redis = self.gateway.redis.clone();
        if let Err(e) = crate::realtime::bus::publish(&mut redis, None, &envelope).await {
            tracing::warn!(error = %e, "realtime publish failed");
        }
    }

    fn envelope(
        &self,
        tenant: &str,
        target_type: TargetType,
        target: String,
        frame: String,
    ) -> Envelope {
        Envelope {
            event_id: new_event_id(),
            tenant_id: tenant.to_string(),
            kind: Kind::Deliver,
            target_type,
            target,
            skip_sid: self.sid.clone(),
            dedup_key: String::new(),
            occurred_at: now_ms(),
            payload: frame,
            exclude: Vec::new(),
        }
    }

    /// Whether this session is attached to `topic`. A session the group
    /// evicted (kicked, dissolved) is no longer in the hub: it forgets the
    /// topic here too.
    pub(super) fn is_attached(&mut self, topic: &str) -> bool {
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
}
