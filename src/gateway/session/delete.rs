//! `{del}`: `what="msg"` clears one's own view, recalls, or deletes for
//! everyone; `what="topic"` on a group declines an invitation, dissolves
//! (owner) or leaves, on a one-to-one chat clears and hides it for
//! oneself;
//! `what="sub"` removes a member.

use serde_json::json;

use crate::events::SeqRange;
use crate::gateway::edits;
use crate::gateway::personal;
use crate::gateway::reads;
use crate::gateway::refusal::Refusal;
use crate::tinode::{self, ctrl};

use super::Session;

impl Session {
    /// `{del what="msg"}`: without `hard` hides ranges from this user's
    /// view; with `hard` recalls the user's own messages or, for an owner
    /// or admin, deletes them for everyone (see [`edits`]).
    pub(super) async fn delete(&mut self, del: tinode::MsgDel) {
        let id = del.id.as_deref();
        let topic = del.topic.as_str();
        if del.what == "topic" && tinode::is_group_topic(topic) {
            // An invited user's "Ignore" (Tinode's web app deletes the
            // topic): the invitation is declined; else the owner's
            // "Delete" dissolves and a member's leaves. An event like
            // every change: the same bucket as over HTTP.
            if !self
                .rate(id, topic, crate::gateway::limits::Action::Change)
                .await
            {
                return;
            }
            let who = self.identity.clone().expect("logged in");
            let origin = self.caller(&who).origin;
            let reply = match self
                .gateway
                .governance
                .answer_invitation(&who.tenant, topic, who.uid, false, &origin)
                .await
            {
                Ok(_) => ctrl(id, Some(&self.shown(topic)), 200, "ok", None),
                // Not invited: the owner dissolves the group, a member
                // leaves it (Tinode's "Delete" and "Leave").
                Err(r) if r.0 == 404 || r.0 == 409 => self.delete_group(id, topic).await,
                Err(r) => ctrl(id, Some(&self.shown(topic)), r.0, &r.1, None),
            };
            self.reply(reply).await;
            return;
        }
        if del.what == "topic" && tinode::is_p2p_topic(topic) {
            // "Delete" of a one-to-one chat: its messages are cleared from
            // this user's view (the peer keeps theirs) and it leaves their
            // list until a later message.
            let who = self.identity.clone().expect("logged in");
            let shown = self.shown(topic);
            if let Err(Refusal(code, text)) =
                reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid).await
            {
                self.reply(ctrl(id, Some(&shown), code, &text, None)).await;
                return;
            }
            if !self
                .rate(id, topic, crate::gateway::limits::Action::Clear)
                .await
            {
                return;
            }
            let cleared = reads::clear_all(
                &self.gateway,
                &who.tenant,
                topic,
                who.uid,
                &who.device,
                &self.sid,
            )
            .await;
            // Then hidden from the list until a later message (Tinode's
            // delete of a one-to-one subscription, for this user only).
            let hidden = match cleared {
                Ok(Some((del_id, last))) => {
                    let change = personal::ChatChange::Hide { until_seq: last };
                    let setting = personal::Setting::Chat {
                        topic: topic.to_string(),
                        change,
                    };
                    personal::put_in_force(&self.gateway, &who.tenant, who.uid, setting)
                        .await
                        .map(|_| Some(del_id))
                }
                Ok(None) => Ok(None),
                Err(r) => Err(r),
            };
            let reply = match hidden {
                Ok(Some(del_id)) => ctrl(id, Some(&shown), 200, "ok", Some(json!({"del": del_id}))),
                Ok(None) => ctrl(id, Some(&shown), 200, "ok", None),
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&shown), code, &text, None)).await;
                    return;
                }
            };
            if self.attached.remove(topic) {
                if let Some(handle) = self.handle.clone() {
                    self.detach(&handle, topic).await;
                }
            }
            self.reply(reply).await;
            // The user's other sessions drop it too.
            let gone = json!({"pres": {"topic": "me", "src": shown, "what": "gone"}});
            self.announce_to_user(&who.tenant, who.uid, gone.to_string())
                .await;
            return;
        }
        if del.what == "sub" && tinode::is_group_topic(topic) {
            // Removing a member (owner or admin; Tinode's "Remove").
            let reply = match del.user.as_deref().and_then(tinode::parse_user_id) {
                None => ctrl(
                    id,
                    Some(topic),
                    400,
                    "malformed: user names the member to remove (usr…)",
                    None,
                ),
                Some(uid) => {
                    if !self
                        .rate(id, topic, crate::gateway::limits::Action::Change)
                        .await
                    {
                        return;
                    }
                    match self
                        .govern(topic, |_| Ok(crate::governance::Action::Kick(uid)))
                        .await
                    {
                        Ok(()) => ctrl(id, Some(topic), 200, "ok", None),
                        Err(Refusal(code, text)) => ctrl(id, Some(topic), code, &text, None),
                    }
                }
            };
            self.reply(reply).await;
            return;
        }
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
            if !self
                .rate(id, topic, crate::gateway::limits::Action::Change)
                .await
            {
                return;
            }
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
        if let Err(Refusal(code, text)) =
            reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid).await
        {
            self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                .await;
            return;
        }
        if !self
            .rate(id, topic, crate::gateway::limits::Action::Clear)
            .await
        {
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
            Err(Refusal(code, text)) => {
                self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                    .await
            }
        }
    }
}

impl Session {
    /// `{del what="topic"}` of a group the caller is in: the owner
    /// dissolves it, anyone else leaves it; this session lets go of it.
    async fn delete_group(&mut self, id: Option<&str>, topic: &str) -> String {
        let chosen = self
            .govern(topic, |standing| match standing {
                crate::groups::Standing::Member {
                    role: crate::groups::Role::Owner,
                    ..
                } => Ok(crate::governance::Action::Dissolve),
                crate::groups::Standing::Member { .. } => Ok(crate::governance::Action::Leave),
                _ => Err(Refusal(404, "topic not found".into())),
            })
            .await;
        if let Err(Refusal(code, text)) = chosen {
            return ctrl(id, Some(topic), code, &text, None);
        }
        if self.attached.remove(topic) {
            if let Some(handle) = self.handle.clone() {
                self.detach(&handle, topic).await;
            }
        }
        ctrl(id, Some(topic), 200, "ok", None)
    }

    /// A governance action of the caller on `topic`, chosen by `action`
    /// from the caller's standing in the write model (read once) and
    /// decided on it.
    pub(super) async fn govern(
        &mut self,
        topic: &str,
        action: impl FnOnce(crate::groups::Standing) -> Result<crate::governance::Action, Refusal>,
    ) -> Result<(), Refusal> {
        let who = self.identity.clone().expect("logged in");
        let origin = self.caller(&who).origin;
        let gov = &self.gateway.governance;
        let standing = gov
            .standing(&who.tenant, topic, who.uid)
            .await
            .map_err(|crate::governance::Refused(code, text)| Refusal(code, text))?;
        let action = action(standing)?;
        gov.act(
            &who.tenant,
            topic,
            crate::governance::Actor::User(who.uid, standing),
            action,
            &origin,
            "",
        )
        .await
        .map(|_| ())
        .map_err(|crate::governance::Refused(code, text)| Refusal(code, text))
    }
}
