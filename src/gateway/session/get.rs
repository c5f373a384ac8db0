//! `{get}`: `desc`, `data` (a history page, then ctrl 208/204) and `del`.

use serde_json::json;

use crate::gateway::reads;
use crate::tinode::{self, ctrl};

use super::Session;

impl Session {
    /// `{get}`: `data` (history page, then ctrl 208/204) and `del`.
    pub(super) async fn get(&mut self, id: Option<&str>, topic: &str, query: &tinode::GetQuery) {
        let who = self.identity.clone().expect("logged in");
        // Attached or not: a member removed a moment ago reads no more
        // (one cached membership check).
        if let Err(reads::Refusal(code, text)) =
            reads::ensure_member(&self.gateway, &who.tenant, topic, who.uid).await
        {
            self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                .await;
            return;
        }
        let what: Vec<&str> = query.what.split_whitespace().collect();
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
                Err(reads::Refusal(code, text)) => {
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
                Err(reads::Refusal(code, text)) => {
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
                Err(reads::Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(&self.shown(topic)), code, &text, None))
                        .await
                }
            }
        }
    }
}
