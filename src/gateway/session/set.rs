//! `{set}`: the user's own profile (`topic="me"`, `desc.public`), a
//! group's (`desc.public`, owner or admin), adding a user to a group
//! (`sub.user`), answering an invitation and blocking or muting a chat
//! (one's own `sub.mode`) and keeping one's own `private` of a chat (the
//! app's archive flag) and hiding when online (`me`'s `sub.mode`, the
//! app's incognito), in [`super::modes`], and a chat's pinned
//! messages (`aux.pins`, [`crate::gateway::pins`]). Everything else a
//! Tinode client may set (`private` of `me`, others' `sub` modes, `tags`,
//! `cred`) is answered 501 with the request id, so a client never waits
//! for nothing.

use crate::gateway::chats;
use crate::gateway::limits::Action;
use crate::gateway::refusal::Refusal;
use crate::governance::Actor;
use serde_json::json;

use crate::tinode::{self, ctrl, MsgSet};

use super::Session;

impl Session {
    pub(super) async fn set(&mut self, set: MsgSet) {
        let id = set.id.as_deref();
        if set.topic == super::find::FND {
            let public = set.desc.as_ref().and_then(|d| d.public.as_ref());
            return self.set_fnd(id, public).await;
        }
        let shown = self.shown(&set.topic);
        if let Some(user) = other_user(set.sub.as_ref(), self.identity.as_ref().map(|w| w.uid)) {
            if tinode::is_group_topic(&set.topic) && set.desc.is_none() {
                return self.add_to_group(id, &set.topic, user).await;
            }
        }
        if let Some(mode) = own_mode(set.sub.as_ref()) {
            if set.desc.is_none() {
                let group = tinode::is_group_topic(&set.topic);
                if group || tinode::is_p2p_topic(&set.topic) {
                    if !self.rate(id, &set.topic, Action::Change).await {
                        return;
                    }
                    if group {
                        return self.set_own_mode(id, &set.topic, &mode).await;
                    }
                    return self.set_personal_mode(id, &set.topic, &mode).await;
                }
            }
        }
        if let Some(aux) = only_aux(&set) {
            if tinode::is_conversation_topic(&set.topic) {
                if !self.rate(id, &set.topic, Action::Change).await {
                    return;
                }
                let who = self.identity.clone().expect("logged in");
                let caller = self.caller(&who);
                let reply = match crate::gateway::pins::set(&self.gateway, &caller, &set.topic, aux)
                    .await
                {
                    Ok(()) => ctrl(id, Some(&shown), 200, "ok", None),
                    Err(Refusal(code, text)) => ctrl(id, Some(&shown), code, &text, None),
                };
                self.reply(reply).await;
                return;
            }
        }
        if let Some(private) = own_private(&set) {
            if tinode::is_conversation_topic(&set.topic) {
                if !self.rate(id, &set.topic, Action::Change).await {
                    return;
                }
                return self.set_private(id, &set.topic, private).await;
            }
        }
        if set.topic == "me" && set.desc.is_none() {
            if let Some(mode) = own_mode(set.sub.as_ref()) {
                // The app's Incognito: want without P on `me`.
                if !self.rate(id, "me", Action::Change).await {
                    return;
                }
                return self.set_incognito(id, &mode).await;
            }
        }
        let unsupported = set.sub.is_some()
            || set.tags.is_some()
            || set.aux.is_some()
            || set.cred.is_some()
            || set
                .desc
                .as_ref()
                .is_some_and(|d| d.private.is_some() || d.trusted.is_some() || d.defacs.is_some());
        let public = set.desc.as_ref().and_then(|d| d.public.as_ref());
        let Some(public) = public.filter(|_| !unsupported) else {
            self.reply(ctrl(
                id,
                Some(&shown),
                501,
                "not implemented: only desc.public can be set",
                None,
            ))
            .await;
            return;
        };
        if !self.rate(id, &set.topic, Action::Change).await {
            return;
        }
        let result = self.set_public(&set.topic, public).await;
        let reply = match result {
            Ok(()) => ctrl(id, Some(&shown), 200, "ok", None),
            Err(Refusal(code, text)) => ctrl(id, Some(&shown), code, &text, None),
        };
        self.reply(reply).await;
    }

    /// `{set sub={user}}` of a group: the user is added, or invited when
    /// their add policy asks for it (Tinode's "Add members"), as
    /// `POST …/members` does, drawing on the same buckets.
    async fn add_to_group(&mut self, id: Option<&str>, topic: &str, user: Result<i64, ()>) {
        let Ok(uid) = user else {
            let text = "malformed: sub.user names the user to add (usr…)";
            self.reply(ctrl(id, Some(topic), 400, text, None)).await;
            return;
        };
        if !self.rate(id, topic, Action::MemberAdd).await {
            return;
        }
        let who = self.identity.clone().expect("logged in");
        let origin = self.caller(&who).origin;
        let added = self
            .gateway
            .governance
            .add_members(
                &who.tenant,
                topic,
                Actor::User(who.uid, crate::groups::Standing::NotMember),
                &[uid],
                &origin,
            )
            .await;
        // The new member's access, as Tinode answers a `{set sub}` (its
        // clients keep it for the member they just added): an invited
        // user is given a member's mode but wants nothing yet.
        let given = crate::realtime::frames::access_mode(Some(crate::groups::Role::Member), false);
        let reply = match added {
            Ok(outcome) if outcome.invited.contains(&uid) => {
                let acs =
                    json!({"acs": {"given": given, "want": "N", "mode": "N"}, "invited": true});
                ctrl(id, Some(topic), 200, "ok", Some(acs))
            }
            Ok(_) => {
                let acs = json!({"acs": {"given": given, "want": given, "mode": given}});
                ctrl(id, Some(topic), 200, "ok", Some(acs))
            }
            Err(r) => ctrl(id, Some(topic), r.0, &r.1, None),
        };
        self.reply(reply).await;
    }

    /// `{set sub={mode}}` of the caller's own subscription to a group: to
    /// an invited user it answers the invitation (a mode that joins and
    /// reads, `J` and `R`, accepts; one without `J` declines: Tinode's web
    /// app Accept / Block); a member mutes or unmutes it (`P`, see
    /// [`super::modes`]).
    async fn set_own_mode(&mut self, id: Option<&str>, topic: &str, mode: &str) {
        let who = self.identity.clone().expect("logged in");
        let shown = self.shown(topic);
        let gov = &self.gateway.governance;
        let invited = match gov.model().read(&who.tenant, topic, &[who.uid], None).await {
            Ok(crate::group_model::Read::State(s)) => s.inviter(who.uid).is_some(),
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(request_id = %crate::request_id::current(), error = %e, "invitation check failed");
                self.reply(ctrl(id, Some(&shown), 503, tinode::UNAVAILABLE, None))
                    .await;
                return;
            }
        };
        if !invited {
            // A member's own mode: mute or unmute.
            return self.set_personal_mode(id, topic, mode).await;
        }
        let accept = mode.contains('J') && mode.contains('R');
        if mode.contains('J') && !accept {
            self.reply(ctrl(
                id,
                Some(&shown),
                400,
                "malformed: accept with a mode that reads (J and R), decline without J",
                None,
            ))
            .await;
            return;
        }
        let origin = self.caller(&who).origin;
        match gov
            .answer_invitation(&who.tenant, topic, who.uid, accept, &origin)
            .await
        {
            Ok(_) => {
                let mode = if accept {
                    crate::realtime::frames::access_mode(Some(crate::groups::Role::Member), false)
                } else {
                    "N".to_string()
                };
                if accept {
                    // The session asked for the topic before: it is attached
                    // now that it may read.
                    if let Some(handle) = self.handle.clone() {
                        self.attached.insert(topic.to_string());
                        self.gateway.hub.attach(&handle, topic);
                    }
                }
                let acs = json!({"acs": {"want": mode, "given": mode, "mode": mode}});
                self.reply(ctrl(id, Some(&shown), 200, "ok", Some(acs)))
                    .await;
            }
            Err(r) => self.reply(ctrl(id, Some(&shown), r.0, &r.1, None)).await,
        }
    }

    pub(super) async fn set_public(
        &mut self,
        topic: &str,
        public: &serde_json::Value,
    ) -> Result<(), Refusal> {
        let who = self.identity.clone().expect("logged in");
        if topic == "me" {
            let change = chats::user_profile_change(public)?;
            crate::gateway::files::picture(
                &self.gateway,
                &who.tenant,
                who.uid,
                change.photo.as_deref(),
            )
            .await?;
            chats::set_user_profile(&self.gateway, &who.tenant, who.uid, change).await?;
            return Ok(());
        }
        if !tinode::is_group_topic(topic) {
            return Err(Refusal(
                403,
                "only your own profile and groups' profiles can be set".into(),
            ));
        }
        let change = chats::group_profile_change(public)?;
        crate::gateway::files::picture(
            &self.gateway,
            &who.tenant,
            who.uid,
            change.photo.as_deref(),
        )
        .await?;
        let gov = &self.gateway.governance;
        let standing = gov
            .standing(&who.tenant, topic, who.uid)
            .await
            .map_err(|r| Refusal(r.0, r.1))?;
        let caller = self.caller(&who);
        gov.set_profile(
            &who.tenant,
            topic,
            Actor::User(who.uid, standing),
            change,
            &caller.origin,
        )
        .await
        .map(|_| ())
        .map_err(|r| Refusal(r.0, r.1))
    }
}

/// `{set sub={user: "usr…"}}` naming someone else: the user to add (a
/// `mode` beside it is the app's default for a new member, not a role).
fn other_user(sub: Option<&serde_json::Value>, me: Option<i64>) -> Option<Result<i64, ()>> {
    let sub = sub?.as_object()?;
    let user = sub.get("user")?;
    let uid = user.as_str().and_then(tinode::parse_user_id);
    match uid {
        Some(u) if Some(u) == me => None,
        Some(u) => Some(Ok(u)),
        None => Some(Err(())),
    }
}

/// The mode of `{set sub={mode}}` about the caller's own subscription (no
/// `user`, or nothing else).
fn own_mode(sub: Option<&serde_json::Value>) -> Option<String> {
    let sub = sub?.as_object()?;
    if sub.keys().any(|k| k != "mode") {
        return None;
    }
    sub.get("mode")?.as_str().map(str::to_string)
}

/// `{set desc={private}}` alone: the caller's own `private` of the chat.
fn own_private(set: &MsgSet) -> Option<&serde_json::Value> {
    let desc = set.desc.as_ref()?;
    let only = set.sub.is_none()
        && set.tags.is_none()
        && set.aux.is_none()
        && set.cred.is_none()
        && desc.public.is_none()
        && desc.trusted.is_none()
        && desc.defacs.is_none();
    desc.private.as_ref().filter(|_| only)
}

/// `{set aux}` alone: the chat's pins ([`crate::gateway::pins`]).
fn only_aux(set: &MsgSet) -> Option<&serde_json::Value> {
    let only = set.sub.is_none() && set.tags.is_none() && set.cred.is_none() && set.desc.is_none();
    set.aux.as_ref().filter(|_| only)
}
