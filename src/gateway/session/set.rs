//! `{set}`: the user's own profile (`topic="me"`, `desc.public`) and a
//! group's (`desc.public`, owner or admin). Everything else a Tinode client
//! may set (`private`, `sub` modes, `tags`, `aux`, `cred`) is answered 501
//! with the request id, so a client never waits for nothing.

use crate::gateway::chats;
use crate::gateway::reads::Refusal;
use crate::governance::Actor;
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
        let result = self.set_public(&set.topic, public).await;
        let reply = match result {
            Ok(()) => ctrl(id, Some(&shown), 200, "ok", None),
            Err(Refusal(code, text)) => ctrl(id, Some(&shown), code, &text, None),
        };
        self.reply(reply).await;
    }

    async fn set_public(&mut self, topic: &str, public: &serde_json::Value) -> Result<(), Refusal> {
        let who = self.identity.clone().expect("logged in");
        if topic == "me" {
            let change = chats::user_profile_change(public)?;
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
