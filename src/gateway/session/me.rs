//! The `me` topic: the chat list (`{meta sub}` with one entry per
//! conversation), the user's own profile (`{meta desc}`), the login
//! catch-up (`{get what="data"}`: each conversation's unread messages), and the live
//! `{pres topic="me"}` a subscribed session gets for the conversations it
//! is not attached to (see [`crate::realtime::hub::Hub::watch`]).

use serde_json::{json, Value};

use crate::gateway::chats;
use crate::gateway::reads;
use crate::gateway::refusal::Refusal;
use crate::tinode::{self, ctrl};

use super::Session;

/// Messages per conversation a catch-up returns when the client names no limit.
const DEFAULT_CATCHUP: i64 = 10;

impl Session {
    /// `{sub topic="me"}`: ctrl 200, then whatever `get` asks for.
    pub(super) async fn subscribe_me(&mut self, id: Option<&str>, get: Option<&tinode::GetQuery>) {
        self.on_me = true;
        let who = self.identity.clone().expect("logged in");
        let incognito = match self.gateway.pools.get(&who.tenant) {
            Ok(pool) => crate::relations::incognito(pool, who.uid)
                .await
                .unwrap_or(false),
            Err(_) => false,
        };
        let params = json!({"acs": crate::gateway::personal::Acs::me(incognito).json()});
        self.reply(ctrl(id, Some("me"), 200, "ok", Some(params)))
            .await;
        if let Some(query) = get {
            self.get_me(id, query).await;
            if cold_list(query) && !self.warmed {
                self.warmed = true;
                self.warm_recent_chats().await;
            }
        }
    }

    /// A cold client's most recent chats, warmed (issue 40: Tinode's web
    /// app draws a chat's preview only from messages it holds, so a fresh
    /// login showed none): the newest `gateway.warm_messages` of each of
    /// the `gateway.warm_chats` most recent chats, as `{data}` frames of
    /// the chat after the list, as if the client's own cache had loaded
    /// them. Opening such a chat, the app asks only for later messages and
    /// pages back from the oldest it holds, as after its cache. Once a
    /// session (a client that subscribes again has them). Only what
    /// the history route would give (membership from the write model);
    /// best effort: a chat that cannot be read now is left cold.
    async fn warm_recent_chats(&mut self) {
        let (chats, per_chat) = (
            self.gateway.config.gateway.warm_chats,
            self.gateway.config.gateway.warm_messages,
        );
        if chats == 0 || per_chat < 1 {
            return;
        }
        let who = self.identity.clone().expect("logged in");
        let gw = self.gateway.clone();
        let recent = crate::conversations::Query {
            limit: chats as i64,
            ..Default::default()
        };
        let Ok(page) = chats::conversations_of(&gw, &who.tenant, who.uid, &recent).await else {
            return;
        };
        let Ok(newest) = crate::history::PageQuery::new(None, None, Some(per_chat), false) else {
            return;
        };
        for c in page.list.iter().filter(|c| c.last_seq > 0).take(chats) {
            if reads::ensure_member(&gw, &who.tenant, &c.topic, who.uid)
                .await
                .is_err()
            {
                continue;
            }
            let Ok(messages) = gw
                .history
                .page(&who.tenant, &c.topic, who.uid, newest.clone())
                .await
            else {
                continue;
            };
            let topic = tinode::client_topic(&c.topic, who.uid);
            for m in &messages.messages {
                self.reply(json!({"data": reads::data_body(&topic, m)}).to_string())
                    .await;
            }
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

    /// `{get topic="me"}`: `desc`, `sub`, `data` (the catch-up); `tags` and
    /// `cred` are empty (204), anything else 204 too: every part gets an
    /// answer.
    pub(super) async fn get_me(&mut self, id: Option<&str>, query: &tinode::GetQuery) {
        let who = self.identity.clone().expect("logged in");
        let what: Vec<&str> = query.what.split_whitespace().collect();
        if what.is_empty() {
            self.reply(ctrl(id, Some("me"), 400, "malformed: what", None))
                .await;
            return;
        }
        for part in what {
            if part == "data" {
                self.me_catch_up(id, query.data.as_ref()).await;
                continue;
            }
            if part == "sub" {
                if let Err(Refusal(code, text)) = self.me_subs(id, query.sub.as_ref()).await {
                    self.reply(ctrl(id, Some("me"), code, &text, None)).await;
                }
                continue;
            }
            let answer = match part {
                "desc" => chats::me_desc(&self.gateway, &who.tenant, who.uid)
                    .await
                    .map(|desc| Some(json!({"desc": desc}))),
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

    /// `{get topic="me" what="data" data={limit:N}}`: the login catch-up
    /// (seed 003 §9.1) in Tinode's shapes. Every conversation with at most
    /// N unread messages gets them as `{data}` frames of its own topic (the
    /// client files them under that topic, as after `{get what="data"}`
    /// there); the others are counted in the closing `{ctrl 208}`'s
    /// `params.unread` (topic → unread), as the list's `seq`/`read` say.
    async fn me_catch_up(&mut self, id: Option<&str>, data: Option<&tinode::DataQuery>) {
        let who = self.identity.clone().expect("logged in");
        let n = data.and_then(|d| d.limit).unwrap_or(DEFAULT_CATCHUP);
        if !(1..=chats::MAX_CATCHUP).contains(&n) {
            let text = format!("malformed: data.limit is 1 to {}", chats::MAX_CATCHUP);
            self.reply(ctrl(id, Some("me"), 400, &text, None)).await;
            return;
        }
        let all = crate::conversations::Query::default();
        let list = match chats::conversations_of(&self.gateway, &who.tenant, who.uid, &all).await {
            Ok(page) => page.list,
            Err(Refusal(code, text)) => {
                self.reply(ctrl(id, Some("me"), code, &text, None)).await;
                return;
            }
        };
        let (mut count, mut only_counted) = (0usize, serde_json::Map::new());
        for c in list.iter().filter(|c| c.unread > 0) {
            let topic = tinode::client_topic(&c.topic, who.uid);
            match chats::catch_up(&self.gateway, &who.tenant, who.uid, c, n).await {
                Ok(Some(messages)) => {
                    for m in &messages {
                        self.reply(json!({"data": reads::data_body(&topic, m)}).to_string())
                            .await;
                    }
                    count += messages.len();
                }
                Ok(None) => {
                    only_counted.insert(topic, json!(c.unread));
                }
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some("me"), code, &text, None)).await;
                    return;
                }
            }
        }
        let params = json!({"what": "data", "count": count, "unread": only_counted});
        let (code, text) = if count == 0 && only_counted.is_empty() {
            (204, "no content")
        } else {
            (208, "delivered")
        };
        self.reply(ctrl(id, Some("me"), code, text, Some(params)))
            .await;
    }

    /// The chat list (or one entry of it) as one `{meta sub}` (written
    /// straight from the typed entries), or `{ctrl 204}` when empty; the
    /// session watches what it was told about, so later messages there
    /// reach it as `{pres}`.
    async fn me_subs(
        &mut self,
        id: Option<&str>,
        q: Option<&tinode::SubQuery>,
    ) -> Result<(), Refusal> {
        let who = self.identity.clone().expect("logged in");
        let query = chats::list_query(q, who.uid)?;
        let list = chats::conversations_of(&self.gateway, &who.tenant, who.uid, &query)
            .await?
            .list;
        if let (true, Some(handle)) = (self.on_me, &self.handle) {
            let topics: Vec<String> = list.iter().map(|c| c.topic.clone()).collect();
            self.gateway.hub.watch(handle, &topics);
        }
        // Pending invitations, with the whole list (or asked for by topic).
        let invitations = if query.after.is_none() && query.changed_since_ms.is_none() {
            chats::invitations(&self.gateway, &who.tenant, who.uid, query.topic.as_deref())
                .await?
                .into_iter()
                .filter(|i| !list.iter().any(|c| c.topic == i.topic))
                .collect()
        } else {
            Vec::new()
        };
        let personal = chats::personal_of(&self.gateway, &who.tenant, who.uid, &list).await?;
        // Users blocked with no chat, with the whole list (or asked for by
        // their topic): the app's "Blocked contacts" (issue 40).
        let blocked = if query.after.is_none() && query.changed_since_ms.is_none() {
            let mut b =
                chats::blocked_entries(&self.gateway, &who.tenant, who.uid, &list, &personal)
                    .await?;
            b.retain(|e| query.topic.as_deref().is_none_or(|t| t == e.topic));
            b
        } else {
            Vec::new()
        };
        if list.is_empty() && invitations.is_empty() && blocked.is_empty() {
            let params = json!({"what": "sub"});
            self.reply(ctrl(id, Some("me"), 204, "no content", Some(params)))
                .await;
            return Ok(());
        }
        let mut entries =
            chats::me_sub_entries(&self.gateway, &who.tenant, who.uid, &list, &personal).await;
        entries.extend(invitations.iter().map(chats::invitation_entry));
        entries.extend(
            blocked
                .iter()
                .map(|b| chats::blocked_entry(b, who.uid, &personal)),
        );
        #[derive(serde::Serialize)]
        struct Frame<'a> {
            meta: MetaSub<'a>,
        }
        #[derive(serde::Serialize)]
        struct MetaSub<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            id: Option<&'a str>,
            topic: &'static str,
            ts: String,
            sub: Vec<chats::MeSub<'a>>,
        }
        let frame = Frame {
            meta: MetaSub {
                id,
                topic: "me",
                ts: tinode::now(),
                sub: entries,
            },
        };
        self.reply(serde_json::to_string(&frame).expect("a list serializes"))
            .await;
        Ok(())
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

/// Whether a `{get}` of `me` asks for the whole list with nothing cached
/// on the client: `sub` without `ims` (changes since), a topic, a user or
/// a page size.
fn cold_list(q: &tinode::GetQuery) -> bool {
    q.what.split_whitespace().any(|w| w == "sub")
        && q.sub.as_ref().is_none_or(|s| {
            s.ims.is_none() && s.topic.is_none() && s.user.is_none() && s.limit.is_none()
        })
}
