//! `{get}`: `desc`, `data` (a history page, then ctrl 208/204) and `del`.

use serde_json::json;

use crate::gateway::reads;
use crate::gateway::refusal::Refusal;
use crate::tinode::{self, ctrl};

use super::Session;

/// The parts of a conversation `{get}` answers (`tags` and `cred`
/// with an empty answer each).
const KNOWN_PARTS: &[&str] = &["desc", "sub", "data", "del", "aux", "tags", "cred"];

impl Session {
    /// The two users of a one-to-one topic as `{meta sub}` entries.
    pub(super) async fn p2p_subs(
        &self,
        who: &super::Identity,
        topic: &str,
    ) -> Result<Vec<serde_json::Value>, Refusal> {
        let Some((a, b)) = tinode::parse_p2p_topic(topic) else {
            return Ok(Vec::new());
        };
        let pool = self
            .gateway
            .pools
            .get(&who.tenant)
            .map_err(Refusal::internal)?;
        let mut profiles = crate::conversations::user_profiles(pool, &[a, b])
            .await
            .map_err(Refusal::unavailable)?;
        let peer = if a == who.uid { b } else { a };
        // The peer's note and presence only for someone they share a
        // conversation with and did not block.
        let private = crate::conversations::may_see_private(pool, who.uid, peer)
            .await
            .map_err(Refusal::unavailable)?;
        let mut online =
            crate::gateway::chats::online_users(&self.gateway, &who.tenant, &[a, b]).await;
        if !private {
            online.remove(&peer);
            if let Some(p) = profiles.get_mut(&peer) {
                p.note = None;
            }
        }
        // The reader's own entry carries their access as their settings
        // leave it (Tinode's clients take their mode from it): blocked,
        // muted, or blocked by the peer (issue 40).
        let own = crate::gateway::chats::topic_acs(
            &self.gateway,
            &who.tenant,
            who.uid,
            topic,
            crate::gateway::chats::P2P_MODE,
        )
        .await?
        .json();
        Ok([a, b]
            .iter()
            .map(|u| {
                let acs = if *u == who.uid {
                    own.clone()
                } else {
                    crate::gateway::chats::acs(crate::gateway::chats::P2P_MODE)
                };
                let mut e = json!({
                    "user": tinode::user_id(*u),
                    "acs": acs,
                    "updated": tinode::now(),
                    "online": online.contains(u),
                });
                if let Some(p) = profiles.get(u).filter(|p| !p.is_empty()) {
                    e["public"] = p.public();
                }
                e
            })
            .collect())
    }

    /// `{get}` of a conversation: `what` names parts of [`KNOWN_PARTS`]
    /// (`data` is a history page, then ctrl 208/204); none of them is `400`.
    pub(super) async fn get(&mut self, id: Option<&str>, topic: &str, query: &tinode::GetQuery) {
        if topic == "me" {
            return self.get_me(id, query).await;
        }
        if topic == super::find::FND {
            return self.get_fnd(id, query).await;
        }
        let what: Vec<&str> = query.what.split_whitespace().collect();
        if !what.iter().any(|w| KNOWN_PARTS.contains(w)) {
            // Nothing it could answer: a clear refusal, not silence.
            let text = format!("malformed: what names none of {}", KNOWN_PARTS.join(" "));
            self.reply(ctrl(id, Some(&self.shown(topic)), 400, &text, None))
                .await;
            return;
        }
        let who = self.identity.clone().expect("logged in");
        // Attached or not: a member removed a moment ago reads no more
        // (one cached membership check).
        if let Err(Refusal(code, text)) =
            reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid).await
        {
            self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                .await;
            return;
        }
        if what.contains(&"desc") {
            match reads::describe(&self.gateway, &who.tenant, topic, who.uid).await {
                Ok(desc) => {
                    let mut meta =
                        json!({"topic": self.shown(topic), "desc": desc, "ts": tinode::now()});
                    if let Some(id) = id {
                        meta["id"] = json!(id);
                    }
                    self.reply(json!({ "meta": meta }).to_string()).await
                }
                Err(Refusal(code, text)) => {
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
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
        if what.contains(&"del") {
            match reads::deleted_ranges(&self.gateway, &who.tenant, topic, who.uid).await {
                Ok(Some(del)) => {
                    let mut meta =
                        json!({"topic": self.shown(topic), "del": del, "ts": tinode::now()});
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
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
        if what.contains(&"sub") {
            let answer = if tinode::is_group_topic(topic) {
                crate::gateway::chats::group_members(
                    &self.gateway,
                    &who.tenant,
                    topic,
                    who.uid,
                    query.sub.as_ref(),
                )
                .await
            } else {
                self.p2p_subs(&who, topic).await
            };
            match answer {
                Ok(subs) if subs.is_empty() => {
                    self.reply(ctrl(
                        id,
                        Some(&self.shown(topic)),
                        204,
                        "no content",
                        Some(json!({"what": "sub"})),
                    ))
                    .await
                }
                Ok(subs) => {
                    self.reply_meta(id, &self.shown(topic), json!({ "sub": subs }))
                        .await
                }
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
        if what.contains(&"aux") {
            let pins = match self.gateway.pools.get(&who.tenant) {
                Ok(pool) => crate::pins::read(pool, topic)
                    .await
                    .map_err(Refusal::unavailable),
                Err(e) => Err(Refusal::internal(e)),
            };
            match pins {
                // None pinned: the delete marker, so a client that had
                // pins drops them (Tinode's clients merge `aux`).
                Ok(pins) => {
                    let pins = if pins.is_empty() {
                        json!(tinode::DEL_CHAR)
                    } else {
                        json!(pins)
                    };
                    self.reply_meta(id, &self.shown(topic), json!({"aux": {"pins": pins}}))
                        .await
                }
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
        // Parts imstream keeps nothing for: an empty answer each.
        for part in ["tags", "cred"] {
            if what.contains(&part) {
                self.reply(ctrl(
                    id,
                    Some(&self.shown(topic)),
                    204,
                    "no content",
                    Some(json!({ "what": part })),
                ))
                .await;
            }
        }
    }
}
