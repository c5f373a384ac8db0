//! `GET /v1/search?q=&topic=&from=&to=&limit=&cursor=` (bearer token of
//! the user): messages of the caller's conversations (or of one, `topic`)
//! whose text has every word of `q`, newest first, each with a highlighted
//! snippet.
//!
//! The index ([`crate::search`]) only says where a message is, `(topic,
//! seq)`. Each hit is then read through the normal read path (routes →
//! month table, [`crate::history::History::exact`]), which applies the
//! message's status and the caller's delete ranges as they are now, and the
//! caller's membership of the hit's conversation is checked again (seed 000
//! §6.6). A hit any of these refuses is left out; the page is filled from
//! further hits, at most [`MAX_ROUNDS`] index queries deep, and `next` is
//! the cursor after the last hit examined.
//!
//! With `search.enabled = false` the `LIKE` search over at most three
//! months of one conversation answers instead (`topic` required).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::metrics as m;
use crate::search::entry::plain_text;
use crate::search::query::{Cursor, Request, Scope, MAX_TOPICS};
use crate::search::SearchError;
use crate::tinode;

use super::http::{authenticate, instant, message_json, rate};
use super::refusal::{error, refused, unavailable, ApiError};
use super::Gateway;

/// Hits per page when the client gives no `limit`.
pub const DEFAULT_LIMIT: usize = 20;
/// Largest `limit`.
pub const MAX_LIMIT: usize = 50;
/// Longest `q`, in characters.
pub const MAX_QUERY_CHARS: usize = 200;
/// Index queries one request may make to fill a page whose hits the read
/// path refused.
pub const MAX_ROUNDS: usize = 4;
/// The `LIKE` fallback's default window when `from` is not given (it may
/// span at most three calendar months).
const LIKE_DEFAULT_DAYS: i64 = 60;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    pub q: Option<String>,
    pub topic: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub limit: Option<i64>,
    pub cursor: Option<String>,
}

/// Validated parameters.
struct Parsed {
    q: String,
    topic: Option<String>,
    from: Option<i64>,
    to: Option<i64>,
    limit: usize,
    cursor: Option<Cursor>,
}

fn parse(p: SearchParams) -> Result<Parsed, ApiError> {
    let q = p.q.unwrap_or_default().trim().to_string();
    if q.is_empty() || q.chars().count() > MAX_QUERY_CHARS {
        return Err(error(
            400,
            format!("malformed: q is required, 1 to {MAX_QUERY_CHARS} characters"),
        ));
    }
    let time = |text: &Option<String>, name: &str| match text.as_deref() {
        None | Some("") => Ok(None),
        Some(t) => instant(t)
            .map(Some)
            .ok_or_else(|| error(400, format!("malformed: {name} is RFC 3339 or epoch ms"))),
    };
    let (from, to) = (time(&p.from, "from")?, time(&p.to, "to")?);
    if let (Some(f), Some(t)) = (from, to) {
        if f >= t {
            return Err(error(400, "malformed: from must be before to"));
        }
    }
    let limit = match p.limit {
        None => DEFAULT_LIMIT,
        Some(n) if (1..=MAX_LIMIT as i64).contains(&n) => n as usize,
        Some(_) => return Err(error(400, format!("malformed: limit is 1 to {MAX_LIMIT}"))),
    };
    let cursor = match p.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(Cursor::parse(c).ok_or_else(|| error(400, "malformed: cursor"))?),
    };
    let topic = p.topic.filter(|t| !t.is_empty());
    if topic
        .as_deref()
        .is_some_and(|t| !tinode::is_conversation_topic(t))
    {
        return Err(error(400, "malformed: topic"));
    }
    Ok(Parsed {
        q,
        topic,
        from,
        to,
        limit,
        cursor,
    })
}

pub async fn search(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    params: Result<Query<SearchParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| error(400, format!("malformed: {e}")))?;
    let p = parse(p)?;
    let claims = authenticate(&gw, &headers).await?;
    rate(&gw, &claims, super::limits::Action::Search).await?;
    if let Some(topic) = &p.topic {
        super::reads::ensure_member(&gw, &claims.ten, topic, claims.uid)
            .await
            .map_err(refused)?;
    }
    let started = Instant::now();
    let (source, body) = if gw.config.search.enabled {
        ("index", from_index(&gw, &claims.ten, claims.uid, p).await?)
    } else {
        ("like", like(&gw, &claims.ten, claims.uid, p).await?)
    };
    metrics::histogram!(m::SEARCH_QUERY_LATENCY, "source" => source)
        .record(started.elapsed().as_secs_f64());
    Ok(Json(body).into_response())
}

/// The groups `uid` belongs to now (one-to-one topics are matched by user
/// in the index).
async fn groups_of(gw: &Gateway, tenant: &str, uid: i64) -> Result<Vec<String>, ApiError> {
    let pool = gw
        .pools
        .get(tenant)
        .map_err(|_| error(500, "internal error"))?;
    let topics: Vec<crate::exact::Exact> = sqlx::query_scalar(
        "SELECT topic FROM im_group_members WHERE uid = ? ORDER BY topic LIMIT ?",
    )
    .bind(uid)
    .bind(MAX_TOPICS as i64)
    .fetch_all(pool)
    .await
    .map_err(unavailable)?;
    Ok(topics.into_iter().map(String::from).collect())
}

async fn from_index(gw: &Gateway, tenant: &str, uid: i64, p: Parsed) -> Result<Value, ApiError> {
    let scope = match &p.topic {
        Some(t) => Scope::Topic(t.clone()),
        None => Scope::Member {
            uid,
            groups: groups_of(gw, tenant, uid).await?,
        },
    };
    let mut request = Request {
        text: p.q.clone(),
        scope,
        from: p.from,
        to: p.to,
        after: p.cursor,
        limit: p.limit,
    };
    // Membership per conversation, asked once per request.
    let mut member: HashMap<String, bool> = HashMap::new();
    if let Some(t) = &p.topic {
        member.insert(t.clone(), true);
    }
    let mut hits: Vec<Value> = Vec::with_capacity(p.limit);
    let mut next: Option<Cursor> = None;
    'rounds: for _ in 0..MAX_ROUNDS {
        let missing = p.limit - hits.len();
        // Ask for a few more than missing: some may be refused below.
        request.limit = missing + missing / 2 + 1;
        let (indexes, t, r) = (gw.search.clone(), tenant.to_string(), request.clone());
        let mut found = tokio::task::spawn_blocking(move || indexes.search(&t, &r))
            .await
            .map_err(unavailable)?
            .map_err(|e| match e {
                SearchError::BadRequest(why) => error(400, format!("malformed: {why}")),
                other => unavailable(other),
            })?;
        next = None;
        for hit in std::mem::take(&mut found.hits) {
            request.after = Some(hit.cursor);
            let allowed = match member.get(&hit.topic) {
                Some(a) => *a,
                None => {
                    let a = match super::reads::ensure_member(gw, tenant, &hit.topic, uid).await {
                        Ok(()) => true,
                        Err(r) if r.0 == 403 || r.0 == 404 => false,
                        Err(r) => return Err(refused(r)),
                    };
                    member.insert(hit.topic.clone(), a);
                    a
                }
            };
            if !allowed {
                metrics::counter!(m::SEARCH_HITS_DROPPED_TOTAL, "why" => "member").increment(1);
                continue;
            }
            let message = match gw.history.exact(tenant, &hit.topic, uid, hit.seq).await {
                Ok(Some(msg)) if msg.replaces().is_none() => msg,
                Ok(_) => {
                    // Recalled, deleted or cleared by this user.
                    metrics::counter!(m::SEARCH_HITS_DROPPED_TOTAL, "why" => "hidden").increment(1);
                    continue;
                }
                Err(e) => return Err(refused(e.into())),
            };
            let text = plain_text(message.content.as_deref());
            hits.push(json!({
                "topic": hit.topic,
                "seq": hit.seq,
                "snippet": found.snippet(&text),
                "message": message_json(&message),
            }));
            if hits.len() == p.limit {
                next = Some(hit.cursor);
                break 'rounds;
            }
        }
        if !found.more {
            break;
        }
        next = request.after;
    }
    Ok(json!({
        "hits": hits,
        "next": next.map(|c| c.encode()),
        "source": "index",
    }))
}

/// The fallback: the `LIKE` search of one conversation (at most three
/// months; the last 60 days unless `from` says otherwise).
async fn like(gw: &Gateway, tenant: &str, uid: i64, p: Parsed) -> Result<Value, ApiError> {
    let Some(topic) = p.topic else {
        return Err(error(
            400,
            "malformed: topic is required while the search index is off (search.enabled)",
        ));
    };
    if p.cursor.is_some() {
        return Err(error(
            400,
            "malformed: cursor is not supported while the search index is off",
        ));
    }
    let to = p.to.unwrap_or_else(|| crate::events::now_ms() + 1);
    let from = p.from.unwrap_or(to - LIKE_DEFAULT_DAYS * 86_400_000);
    let messages = gw
        .history
        .search(tenant, &topic, uid, &p.q, from, to, p.limit as i64)
        .await
        .map_err(|e| refused(e.into()))?;
    let hits: Vec<Value> = messages
        .iter()
        .filter(|m| m.replaces().is_none())
        .map(|m| {
            json!({
                "topic": topic,
                "seq": m.seq,
                "snippet": crate::search::query::plain_snippet(&plain_text(m.content.as_deref())),
                "message": message_json(m),
            })
        })
        .collect();
    Ok(json!({"hits": hits, "next": null, "source": "like"}))
}
