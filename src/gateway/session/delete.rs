//! `{del what="msg"}`: clearing one's own view, recalling, or deleting for everyone.

use serde_json::json;

use crate::events::SeqRange;
use crate::gateway::edits;
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
            // topic): the invitation is declined. Anything else is not
            // deleted this way (the owner dissolves with HTTP). An event
            // like every change: the same bucket as over HTTP.
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
                Err(r) if r.0 == 404 || r.0 == 409 => ctrl(
                    id,
                    Some(&self.shown(topic)),
                    501,
                    "not implemented: only an invitation can be deleted",
                    None,
                ),
                Err(r) => ctrl(id, Some(&self.shown(topic)), r.0, &r.1, None),
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
