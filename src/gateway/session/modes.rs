//! The caller's own settings of a chat ([`crate::gateway::personal`]):
//! `{set sub={mode}}` of their subscription, as Tinode's web app sends it
//! for Block / Unblock (want without, then with `J` and `P`) and Mute /
//! Unmute (want without, then with `P`), in a one-to-one chat or a group
//! the caller is in, answered with the `acs` now in force, which the app
//! keeps (the caller's other sessions and, for a block, the peer are told
//! with `{pres what="acs"}`); and `{set desc={private}}`, their own
//! `private` of the chat, merged (the app's Archive / Restore); and
//! `{set topic="me" sub={mode}}`, the app's Incognito (a `me` want
//! without `P`): the user shows offline to everyone while online.

use serde_json::json;

use crate::gateway::personal::{self, Personal, Setting};
use crate::gateway::refusal::Refusal;
use crate::tinode::{self, ctrl};

use super::Session;

impl Session {
    /// Block, unblock, mute or unmute by the wanted mode (`topic` stored).
    pub(super) async fn set_personal_mode(&mut self, id: Option<&str>, topic: &str, want: &str) {
        let shown = self.shown(topic);
        let reply = match self.apply_personal_mode(topic, want).await {
            Ok(acs) => ctrl(
                id,
                Some(&shown),
                200,
                "ok",
                Some(json!({"acs": acs.json()})),
            ),
            Err(Refusal(code, text)) => ctrl(id, Some(&shown), code, &text, None),
        };
        self.reply(reply).await;
    }

    /// Incognito on (a `me` want without `P`) or off, answered with `me`'s
    /// `acs` now in force (the app's checkbox reads it). Contacts are told
    /// the user went offline (or is online again), as are the groups this
    /// session is in.
    pub(super) async fn set_incognito(&mut self, id: Option<&str>, want: &str) {
        if want.is_empty() || want.len() > 16 || !want.chars().all(|c| "JRWPASDON".contains(c)) {
            let text = "malformed: sub.mode is an access mode (letters of JRWPASDO, or N)";
            self.reply(ctrl(id, Some("me"), 400, text, None)).await;
            return;
        }
        let who = self.identity.clone().expect("logged in");
        let on = !want.contains('P');
        let setting = Setting::Incognito { on };
        if let Err(Refusal(code, text)) =
            personal::put_in_force(&self.gateway, &who.tenant, who.uid, setting).await
        {
            self.reply(ctrl(id, Some("me"), code, &text, None)).await;
            return;
        }
        let acs = personal::Acs::me(on);
        self.reply(ctrl(
            id,
            Some("me"),
            200,
            "ok",
            Some(json!({"acs": acs.json()})),
        ))
        .await;
        // Told even when it was so already: "off" of a hidden user and "on"
        // of a shown one are what the peers should see anyway.
        let what = if on { "off" } else { "on" };
        let (gw, tenant, uid) = (self.gateway.clone(), who.tenant.clone(), who.uid);
        tokio::spawn(
            async move { crate::gateway::chats::tell_peers(&gw, &tenant, uid, what).await },
        );
        let groups: Vec<String> = self
            .attached
            .iter()
            .filter(|t| tinode::is_group_topic(t))
            .cloned()
            .collect();
        for topic in groups {
            let frame =
                crate::realtime::frames::pres_frame(&topic, &tinode::user_id(who.uid), what);
            self.announce(&who.tenant, &topic, frame).await;
        }
    }

    async fn apply_personal_mode(
        &mut self,
        topic: &str,
        want: &str,
    ) -> Result<personal::Acs, Refusal> {
        let who = self.identity.clone().expect("logged in");
        let gw = self.gateway.clone();
        let peer = tinode::p2p_peer(topic, who.uid);
        if tinode::is_p2p_topic(topic) && peer.is_none() {
            // Someone else's one-to-one chat, by its stored name.
            return Err(Refusal(404, "topic not found".into()));
        }
        let base = match peer {
            Some(_) => crate::gateway::chats::P2P_MODE.to_string(),
            None => {
                let standing = gw
                    .governance
                    .standing(&who.tenant, topic, who.uid)
                    .await
                    .map_err(|crate::governance::Refused(code, text)| Refusal(code, text))?;
                if !matches!(standing, crate::groups::Standing::Member { .. }) {
                    return Err(Refusal(404, "topic not found".into()));
                }
                if !want.contains('J') {
                    return Err(Refusal(
                        403,
                        "a group cannot be blocked: mute it, or leave it".into(),
                    ));
                }
                crate::gateway::chats::standing_mode(standing)
            }
        };
        let pool = gw.pools.get(&who.tenant).map_err(Refusal::internal)?;
        let mut now = Personal::load_for(pool, who.uid, topic)
            .await
            .map_err(Refusal::unavailable)?;
        // What the mode asks for is put in force as asked, an event each
        // time even when the row already says so: a row the relations
        // projection has not caught up on may say so only for a moment
        // (an earlier block replayed before a later unblock), and the
        // request's own event is what the log ends with.
        let block = !want.contains('J');
        if let Some(peer) = peer {
            let changed = block != now.blocked.contains(&peer);
            let setting = Setting::Block {
                other: peer,
                blocked: block,
            };
            personal::put_in_force(&gw, &who.tenant, who.uid, setting).await?;
            if block {
                now.blocked.insert(peer);
            } else {
                now.blocked.remove(&peer);
            }
            if changed {
                personal::tell_peer_of_block(&gw, &who.tenant, who.uid, peer, block).await;
            }
        }
        // A block drops `P` with `J`; the mute is what `P` says otherwise.
        let mute = !want.contains('P');
        if !block {
            let setting = Setting::Mute {
                topic: topic.to_string(),
                muted: mute,
            };
            personal::put_in_force(&gw, &who.tenant, who.uid, setting).await?;
            if mute {
                now.muted.insert(topic.to_string());
            } else {
                now.muted.remove(topic);
            }
        }
        let acs = now.acs(topic, who.uid, &base);
        // The user's other sessions keep the same mode.
        let pres = json!({"pres": {"topic": "me", "src": self.shown(topic), "what": "acs",
            "dacs": {"want": acs.want, "given": acs.given}}});
        self.announce_to_user(&who.tenant, who.uid, pres.to_string())
            .await;
        Ok(acs)
    }

    /// `{set desc={private}}`: the keys of `private` set, or removed by the
    /// delete marker, in the caller's own settings of the chat.
    pub(super) async fn set_private(
        &mut self,
        id: Option<&str>,
        topic: &str,
        private: &serde_json::Value,
    ) {
        let shown = self.shown(topic);
        let reply = match self.apply_private(topic, private).await {
            Ok(()) => ctrl(id, Some(&shown), 200, "ok", None),
            Err(Refusal(code, text)) => ctrl(id, Some(&shown), code, &text, None),
        };
        self.reply(reply).await;
    }

    async fn apply_private(
        &mut self,
        topic: &str,
        private: &serde_json::Value,
    ) -> Result<(), Refusal> {
        let who = self.identity.clone().expect("logged in");
        let gw = self.gateway.clone();
        let Some(patch) = private.as_object() else {
            return Err(Refusal(400, "malformed: private is an object".into()));
        };
        // Refused before anything is read when it could never be kept.
        let limit = crate::fields::CHAT_PRIVATE_CHARS;
        if private.to_string().chars().count() > limit {
            return Err(Refusal(
                413,
                format!("private is too large (at most {limit} characters as JSON)"),
            ));
        }
        let mine = match tinode::p2p_peer(topic, who.uid) {
            // A chat with messages (settings are kept per chat the user
            // has, never for any name they can spell), by the live last
            // seq: the chat list's projection may not have it yet.
            Some(_) => crate::gateway::reads::last_seq(&gw, &who.tenant, topic).await? > 0,
            None if tinode::is_group_topic(topic) => matches!(
                gw.governance
                    .standing(&who.tenant, topic, who.uid)
                    .await
                    .map_err(|crate::governance::Refused(code, text)| Refusal(code, text))?,
                crate::groups::Standing::Member { .. }
            ),
            None => false,
        };
        if !mine {
            return Err(Refusal(404, "topic not found".into()));
        }
        let setting = Setting::Chat {
            topic: topic.to_string(),
            change: personal::ChatChange::Private(patch.clone()),
        };
        personal::put_in_force(&gw, &who.tenant, who.uid, setting)
            .await
            .map(|_| ())
    }
}
