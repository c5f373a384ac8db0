//! The `me` topic: the chat list (`{meta sub}` with one entry per
//! conversation), the user's own profile (`{meta desc}`), and the live
//! `{pres topic="me"}` a subscribed session gets for the conversations it
//! is not attached to (see [`crate::realtime::hub::Hub::watch`]).

use serde_json::{json, Value};

use crate::gateway::chats;
use crate::gateway::reads::Refusal;
use crate::tinode::{self, ctrl};

use super::Session;

impl Session {
    /// `{sub topic="me"}`: ctrl 200, then whatever `get` asks for.
    pub(super) async fn subscribe_me(&mut self, id: Option<&str>, get: Option<&tinode::GetQuery>) {
        self.on_me = true;
        let params = json!({"acs": chats::acs("JPS")});
        self.reply(ctrl(id, Some("me"), 200, "ok", Some(params)))
            .await;
        if let Some(query) = get {
            self.get_me(id, query).await;
        }
    }

    /// `{leave topic="me"}`: no more chat-list updates.
    pub(super) async fn leave_me(&mut self, id: Option<&str>) {
        if !self.on_me {
            self.reply(ctrl(id, Some("me"), 304, "not joined", None))
                .await;
            return;
        }
        self.on_me = false;
        if let Some(handle) = &self.handle {
            self.gateway.hub.unwatch_all(&handle.sid);
        }
        self.reply(ctrl(id, Some("me"), 200, "ok", None)).await;
    }

    /// `{get topic="me"}`: `desc`, `sub`; `tags` and `cred` are empty
    /// (204), anything else 204 too: every part gets an answer.
    pub(super) async fn get_me(&mut self, id: Option<&str>, query: &tinode::GetQuery) {
        let who = self.identity.clone().expect("logged in");
        let what: Vec<&str> = query.what.split_whitespace().collect();
        if what.is_empty() {
            self.reply(ctrl(id, Some("me"), 400, "malformed: what", None))
                .await;
            return;
        }
        for part in what {
            let answer = match part {
                "desc" => chats::me_desc(&self.gateway, &who.tenant, who.uid)
                    .await
                    .map(|desc| Some(json!({"desc": desc}))),
                "sub" => self.me_subs(query.sub.as_ref()).await,
                _ => Ok(None),
            };
            match answer {
                Ok(Some(body)) => self.reply_meta(id, "me", body).await,
                Ok(None) => {
                    self.reply(ctrl(
                        id,
                        Some("me"),
                        204,
                        "no content",
                        Some(json!({"what": part})),
                    ))
                    .await
                }
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some("me"), code, &text, None)).await
                }
            }
        }
    }

    /// The chat list (or one entry of it); the session watches what it was
    /// told about, so later messages there reach it as `{pres}`.
    async fn me_subs(&mut self, q: Option<&tinode::SubQuery>) -> Result<Option<Value>, Refusal> {
        let who = self.identity.clone().expect("logged in");
        let query = chats::list_query(q, who.uid)?;
        let list = chats::conversations_of(&self.gateway, &who.tenant, who.uid, &query).await?;
        if let (true, Some(handle)) = (self.on_me, &self.handle) {
            let topics: Vec<String> = list.iter().map(|c| c.topic.clone()).collect();
            self.gateway.hub.watch(handle, &topics);
        }
        if list.is_empty() {
            return Ok(None);
        }
        let entries = chats::me_sub_entries(&self.gateway, &who.tenant, who.uid, &list).await;
        Ok(Some(json!({ "sub": entries })))
    }

    /// `{meta}` with `topic`, `ts` and the request id around `body`.
    pub(super) async fn reply_meta(&self, id: Option<&str>, topic: &str, body: Value) {
        let mut meta = body;
        meta["topic"] = json!(topic);
        meta["ts"] = json!(tinode::now());
        if let Some(id) = id {
            meta["id"] = json!(id);
        }
        self.reply(json!({ "meta": meta }).to_string()).await
    }
}
