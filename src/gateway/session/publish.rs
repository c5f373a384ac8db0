//! `{pub}`: a message or an edit, acknowledged `{ctrl 202 seq}` once produced.

use serde_json::json;

use crate::gateway::edits;
use crate::gateway::limits::Action;
use crate::gateway::refusal::{send_error_reply, Refusal};
use crate::realtime::hub::Outbound;
use crate::send::{split_head, SendRequest};
use crate::tinode::{ctrl, MsgPub};

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
        let shared =
            match crate::gateway::files::shared_in(&self.gateway, &who.tenant, who.uid, &content)
                .await
            {
                Ok(ids) => ids,
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
        if let (Some(seq), false) = (allocation.seq(), shared.is_empty()) {
            // An edit's files go with the message it replaces (recalling
            // that one takes them too).
            let seq = request.edit_of.unwrap_or(seq);
            let recorded = crate::gateway::files::record_refs(
                &self.gateway,
                &request.tenant,
                &request.topic,
                seq,
                &shared,
            )
            .await;
            if let Err(Refusal(code, text)) = recorded {
                self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                    .await;
                return;
            }
        }
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
