//! The `fnd` topic: Tinode's user search, how a person finds someone to
//! start a one-to-one chat with. `{set topic="fnd" desc={public:"query"}}`
//! keeps the query on the session; `{get topic="fnd" what="sub"}` answers
//! the users of the caller's tenant whose name starts with a term of it,
//! or whose id (`usr…`) it names, as `{meta sub}` entries (`user`,
//! `public` with name and photo only: never a note, never presence). A
//! user who blocked the caller is not found. Each search takes a token of
//! the caller's `limits.finds` bucket. Nothing is stored; other tenants
//! are never searched.

use serde_json::{json, Value};

use crate::gateway::refusal::Refusal;
use crate::tinode::{self, ctrl};

use super::Session;

pub(super) const FND: &str = "fnd";

/// Terms one query may carry, and the longest term.
const MAX_TERMS: usize = 8;
const MAX_TERM_CHARS: usize = 64;
/// Shorter name terms match too much to be useful (and would list the
/// whole directory).
const MIN_TERM_CHARS: usize = 2;

/// A query as Tinode clients send it (terms separated by spaces or
/// commas; a `prefix:` such as `basic:` or `email:` is dropped): the name
/// terms and the user ids it names.
pub(super) fn find_terms(query: &str) -> (Vec<String>, Vec<i64>) {
    let mut names = Vec::new();
    let mut ids = Vec::new();
    for raw in query
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|t| !t.is_empty())
        .take(MAX_TERMS)
    {
        let term = raw.rsplit(':').next().unwrap_or(raw).trim();
        if let Some(uid) = tinode::parse_user_id(term) {
            ids.push(uid);
        } else if (MIN_TERM_CHARS..=MAX_TERM_CHARS).contains(&term.chars().count()) {
            names.push(term.to_string());
        }
    }
    (names, ids)
}

impl Session {
    /// `{sub topic="fnd"}`: ctrl 200, then whatever `get` asks for.
    pub(super) async fn subscribe_fnd(&mut self, id: Option<&str>, get: Option<&tinode::GetQuery>) {
        self.reply(ctrl(id, Some(FND), 200, "ok", None)).await;
        if let Some(query) = get {
            self.get_fnd(id, query).await;
        }
    }

    /// `{set topic="fnd" desc={public:"query"}}`: the next search.
    pub(super) async fn set_fnd(&mut self, id: Option<&str>, public: Option<&Value>) {
        let reply = match public {
            Some(Value::String(q)) if q.chars().count() <= MAX_TERMS * (MAX_TERM_CHARS + 1) => {
                self.fnd_query = Some(q.clone());
                ctrl(id, Some(FND), 200, "ok", None)
            }
            // Tinode's way of clearing the query.
            Some(Value::Null) | None => {
                self.fnd_query = None;
                ctrl(id, Some(FND), 200, "ok", None)
            }
            Some(Value::String(_)) => ctrl(id, Some(FND), 400, "malformed: query too long", None),
            Some(_) => ctrl(id, Some(FND), 400, "malformed: the query is a string", None),
        };
        self.reply(reply).await;
    }

    /// `{get topic="fnd"}`: `sub` is the search; every other part is empty.
    pub(super) async fn get_fnd(&mut self, id: Option<&str>, query: &tinode::GetQuery) {
        if query.what.split_whitespace().next().is_none() {
            self.reply(ctrl(id, Some(FND), 400, "malformed: what", None))
                .await;
            return;
        }
        for part in query.what.split_whitespace() {
            let answer = match part {
                "sub" => {
                    // Each search costs index scans: a bucket per user.
                    if !self
                        .rate(id, FND, crate::gateway::limits::Action::Find)
                        .await
                    {
                        continue;
                    }
                    self.found().await
                }
                _ => Ok(None),
            };
            match answer {
                Ok(Some(body)) => self.reply_meta(id, FND, body).await,
                Ok(None) => {
                    self.reply(ctrl(
                        id,
                        Some(FND),
                        204,
                        "no content",
                        Some(json!({"what": part})),
                    ))
                    .await
                }
                Err(Refusal(code, text)) => {
                    self.reply(ctrl(id, Some(FND), code, &text, None)).await
                }
            }
        }
    }

    async fn found(&self) -> Result<Option<Value>, Refusal> {
        let who = self.identity.clone().expect("logged in");
        let Some(query) = &self.fnd_query else {
            return Ok(None);
        };
        let (names, ids) = find_terms(query);
        let pool = self
            .gateway
            .pools
            .get(&who.tenant)
            .map_err(Refusal::internal)?;
        let users = crate::conversations::find_users(pool, &names, &ids, who.uid)
            .await
            .map_err(Refusal::unavailable)?;
        if users.is_empty() {
            return Ok(None);
        }
        let entries: Vec<Value> = users
            .iter()
            .map(|(uid, profile)| {
                json!({
                    "user": tinode::user_id(*uid),
                    "public": profile.public(),
                    "acs": crate::gateway::chats::acs(crate::gateway::chats::P2P_MODE),
                    "updated": tinode::now(),
                })
            })
            .collect();
        Ok(Some(json!({ "sub": entries })))
    }
}

#[cfg(test)]
mod tests {
    use super::find_terms;

    #[test]
    fn names_and_ids_are_told_apart() {
        let (names, ids) = find_terms("alice, usr1002 basic:bob");
        assert_eq!(names, vec!["alice".to_string(), "bob".to_string()]);
        assert_eq!(ids, vec![1002]);
    }

    #[test]
    fn single_letters_and_empty_queries_find_nothing() {
        assert_eq!(find_terms("a ,  "), (vec![], vec![]));
        assert_eq!(find_terms(""), (vec![], vec![]));
    }

    #[test]
    fn a_query_is_bounded() {
        let long = "x".repeat(65);
        let (names, _) = find_terms(&format!("{long} ok"));
        assert_eq!(names, vec!["ok".to_string()]);
        let many = (0..20)
            .map(|i| format!("n{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(find_terms(&many).0.len(), 8);
    }

    #[test]
    fn chinese_names_count_characters_not_bytes() {
        let (names, _) = find_terms("王芳");
        assert_eq!(names, vec!["王芳".to_string()]);
    }
}
