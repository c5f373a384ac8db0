//! The chat list's hot copy in Redis (seed 003 §6.2: Redis serves the list
//! and the counts, MySQL is the ground truth they come back from).
//!
//! Three kinds of keys, each written by the pipeline that writes the rows
//! it copies, after its MySQL commit:
//!
//! - per user, `UserKeys::chats`: one field per conversation (kind, peer,
//!   joined, role, muted-until, updated) and one per cursor pair
//!   (`c:<topic>` → read, recv, clear). Membership changes drop the copy and
//!   bump its version (the conversations and members pipelines); cursor
//!   moves only grow it (receipts, conversations). A read that finds no
//!   complete copy fills it from MySQL, unless the version moved while it
//!   read (`lua/cache_chats.lua`).
//! - per topic, `TopicKeys::chat`: last seq, activity, sender and preview,
//!   read back from MySQL after each batch's commit and written unless a
//!   later seq is stored (`lua/chat_topic.lua`): once per topic per batch,
//!   whatever the group's size.
//! - profiles, `UserKeys::profile` and `TopicKeys::profile`: read back and
//!   written after every profile or group change.
//!
//! A read is one HGETALL and one MGET (states, profiles, dellog tokens);
//! what is missing is read from MySQL and cached only where nothing newer
//! can be (SET NX). Unread counts take each reader's deleted ranges from the
//! history's dellog cache, valid while the topic's token is unchanged.
//! Without Redis, lists come from MySQL.

use std::collections::HashMap;
use std::sync::LazyLock;

use crate::redis_util::Redis;
use redis::Script;
use serde::{Deserialize, Serialize};
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::events::now_ms;
use crate::exact::Exact;
use crate::groups::Role;
use crate::keys::{TopicKeys, UserKeys};
use crate::store::dellog::{self, Hidden};

use super::{deleted_ranges, unread, Conversation, Kind, Profile, Query};

/// How long a copy lives without being filled or written again.
const TTL_SECS: u64 = 7 * 24 * 3600;
/// A list version outlives every copy it guards.
const VERSION_TTL_SECS: u64 = 8 * 24 * 3600;
/// The field that marks a user's copy complete.
const COMPLETE: &str = "_v";
/// Keys per MGET / commands per pipeline.
const BATCH: usize = 1500;

static CACHE_CHATS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/cache_chats.lua")));
const CHAT_CURSOR: &str = include_str!("../../lua/chat_cursor.lua");
const CHAT_TOPIC: &str = include_str!("../../lua/chat_topic.lua");

#[derive(Debug, thiserror::Error)]
pub enum HotError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// One conversation of a user as their copy holds it.
#[derive(Debug, Clone, PartialEq)]
struct Membership {
    topic: String,
    kind: Kind,
    peer: i64,
    joined_ms: i64,
    role: Option<Role>,
    muted_until_ms: i64,
    updated_ms: i64,
    read: i64,
    recv: i64,
    clear: i64,
}

impl Membership {
    /// `kind|peer|joined|role|muted_until|updated`.
    fn encode(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.kind.as_str(),
            self.peer,
            self.joined_ms,
            self.role.map(Role::as_str).unwrap_or(""),
            self.muted_until_ms,
            self.updated_ms
        )
    }

    fn decode(topic: &str, text: &str) -> Option<Membership> {
        let mut parts = text.split('|');
        let kind = match parts.next()? {
            "p2p" => Kind::P2p,
            "grp" => Kind::Grp,
            _ => return None,
        };
        let peer = parts.next()?.parse().ok()?;
        let joined_ms = parts.next()?.parse().ok()?;
        let role = match (kind, parts.next()?) {
            (Kind::P2p, _) => None,
            (Kind::Grp, r) => Some(Role::parse(r)),
        };
        Some(Membership {
            topic: topic.to_string(),
            kind,
            peer,
            joined_ms,
            role,
            muted_until_ms: parts.next()?.parse().ok()?,
            updated_ms: parts.next()?.parse().ok()?,
            read: 0,
            recv: 0,
            clear: 0,
        })
    }

    /// `read|recv|clear`, as `lua/chat_cursor.lua` writes it.
    fn encode_cursors(&self) -> String {
        format!("{}|{}|{}", self.read, self.recv, self.clear)
    }

    fn decode_cursors(&mut self, text: &str) {
        let mut parts = text.split('|').map(|p| p.parse::<i64>().unwrap_or(0));
        self.read = parts.next().unwrap_or(0);
        self.recv = parts.next().unwrap_or(0);
        self.clear = parts.next().unwrap_or(0);
    }

    fn profile_key(&self, tenant: &str) -> String {
        match self.kind {
            Kind::Grp => TopicKeys::new(tenant, &self.topic).profile(),
            Kind::P2p => UserKeys::new(tenant, self.peer).profile(),
        }
    }
}

/// A topic's row of `im_conversation_topics` as the list uses it.
#[derive(Debug, Clone, Default, PartialEq)]
struct TopicState {
    seq: i64,
    touched_ms: i64,
    from: i64,
    preview: Option<String>,
}

impl TopicState {
    /// `seq|touched|from|` then `-` (no preview) or `+preview`.
    fn encode(&self) -> String {
        let preview = match &self.preview {
            Some(p) => format!("+{p}"),
            None => "-".to_string(),
        };
        format!("{}|{}|{}|{preview}", self.seq, self.touched_ms, self.from)
    }

    fn decode(text: &str) -> Option<TopicState> {
        let mut parts = text.splitn(4, '|');
        let seq = parts.next()?.parse().ok()?;
        let touched_ms = parts.next()?.parse().ok()?;
        let from = parts.next()?.parse().ok()?;
        let rest = parts.next()?;
        let preview = match rest.strip_prefix('+') {
            Some(p) => Some(p.to_string()),
            None if rest == "-" => None,
            None => return None,
        };
        Some(TopicState {
            seq,
            touched_ms,
            from,
            preview,
        })
    }
}

/// A profile with the time of its row's last change.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct CachedProfile {
    #[serde(rename = "n", skip_serializing_if = "Option::is_none", default)]
    full_name: Option<String>,
    #[serde(rename = "p", skip_serializing_if = "Option::is_none", default)]
    photo: Option<String>,
    #[serde(rename = "o", skip_serializing_if = "Option::is_none", default)]
    note: Option<String>,
    #[serde(rename = "u", default)]
    updated_ms: i64,
}

impl CachedProfile {
    fn encode(&self) -> String {
        serde_json::to_string(self).expect("a profile serializes")
    }

    fn profile(self) -> Profile {
        Profile {
            full_name: self.full_name,
            photo: self.photo,
            note: self.note,
        }
    }
}

/// A page of `uid`'s conversations (as [`super::list`] returns them), from
/// the hot copy; from MySQL alone when Redis does not answer.
pub async fn list(
    pool: &MySqlPool,
    redis: &Redis,
    deletes: &dellog::Cache,
    tenant: &str,
    uid: i64,
    q: &Query,
) -> sqlx::Result<Vec<Conversation>> {
    let limit = super::page_limit(q.limit) as usize;
    match read(
        pool,
        &mut redis.clone(),
        deletes,
        tenant,
        uid,
        q,
        Want::Page(limit),
    )
    .await
    {
        Ok(list) => Ok(list),
        Err(HotError::Db(e)) => Err(e),
        Err(HotError::Redis(e)) => {
            tracing::warn!(error = %e, "chat list read from MySQL: Redis did not answer");
            super::list(pool, uid, q).await
        }
    }
}

/// The badge over all of `uid`'s conversations (see [`super::badge_of`]).
pub async fn badge(
    pool: &MySqlPool,
    redis: &Redis,
    deletes: &dellog::Cache,
    tenant: &str,
    uid: i64,
) -> sqlx::Result<(i64, i64)> {
    let all = Query::default();
    match read(
        pool,
        &mut redis.clone(),
        deletes,
        tenant,
        uid,
        &all,
        Want::Counts,
    )
    .await
    {
        Ok(list) => Ok(super::badge_of(&list)),
        Err(HotError::Db(e)) => Err(e),
        Err(HotError::Redis(e)) => {
            tracing::warn!(error = %e, "unread badge read from MySQL: Redis did not answer");
            super::badge(pool, uid).await
        }
    }
}

/// What a read is for.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// A page of at most this many entries, with profiles.
    Page(usize),
    /// Every entry's unread count only (the badge).
    Counts,
}

async fn read(
    pool: &MySqlPool,
    redis: &mut Redis,
    deletes: &dellog::Cache,
    tenant: &str,
    uid: i64,
    q: &Query,
    want: Want,
) -> Result<Vec<Conversation>, HotError> {
    let (limit, with_profiles) = match want {
        Want::Page(limit) => (limit, true),
        Want::Counts => (usize::MAX, false),
    };
    let mut entries = memberships(pool, redis, tenant, uid).await?;
    if let Some(topic) = &q.topic {
        entries.retain(|m| &m.topic == topic);
    }
    if entries.is_empty() {
        return Ok(Vec::new());
    }
    // One MGET: each entry's topic state, profile (unless only counts are
    // asked for) and dellog token.
    let mut keys = Vec::with_capacity(entries.len() * 3);
    for m in &entries {
        let topic = TopicKeys::new(tenant, &m.topic);
        keys.push(topic.chat());
        if with_profiles {
            keys.push(m.profile_key(tenant));
        }
        keys.push(topic.dellog_token());
    }
    let mut values: Vec<Option<String>> = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(BATCH) {
        let part: Vec<Option<String>> = redis::cmd("MGET").arg(chunk).query_async(redis).await?;
        values.extend(part);
    }
    let mut states: Vec<Option<TopicState>> = Vec::with_capacity(entries.len());
    let mut profiles: Vec<Option<CachedProfile>> = Vec::with_capacity(entries.len());
    let mut tokens: Vec<Option<String>> = Vec::with_capacity(entries.len());
    let mut values = values.into_iter();
    for _ in &entries {
        let state = values.next();
        let profile = if with_profiles {
            values.next()
        } else {
            Some(Some("{}".to_string()))
        };
        let token = values.next();
        states.push(state.flatten().as_deref().and_then(TopicState::decode));
        profiles.push(
            profile
                .flatten()
                .and_then(|p| serde_json::from_str(&p).ok()),
        );
        tokens.push(token.flatten());
    }
    fill_states(pool, redis, tenant, &entries, &mut states).await?;
    fill_profiles(pool, redis, tenant, &entries, &mut profiles).await?;

    let now = now_ms();
    let mut list: Vec<(Conversation, Option<String>)> = entries
        .into_iter()
        .zip(states)
        .zip(profiles)
        .zip(tokens)
        .map(|(((m, state), profile), token)| {
            let state = state.unwrap_or_default();
            let profile = profile.unwrap_or_default();
            let c = Conversation {
                kind: m.kind,
                peer: m.peer,
                role: m.role,
                muted: m.muted_until_ms > now,
                last_seq: state.seq,
                touched_ms: if state.touched_ms > 0 {
                    state.touched_ms
                } else {
                    m.joined_ms
                },
                updated_ms: m.updated_ms.max(profile.updated_ms),
                last_from: state.from,
                preview: state.preview,
                read: m.read,
                recv: m.recv,
                clear: m.clear,
                unread: 0,
                profile: profile.profile(),
                topic: m.topic,
            };
            (c, token)
        })
        .collect();
    if let Some(since) = q.changed_since_ms {
        list.retain(|(c, _)| c.touched_ms > since || c.updated_ms > since);
    }
    list.sort_by(|(a, _), (b, _)| {
        b.touched_ms
            .cmp(&a.touched_ms)
            .then_with(|| a.topic.cmp(&b.topic))
    });
    if let Some(after) = &q.after {
        list.retain(|(c, _)| {
            c.touched_ms < after.touched_ms
                || (c.touched_ms == after.touched_ms && c.topic > after.topic)
        });
    }
    list.truncate(limit);
    count_unread(pool, deletes, tenant, uid, &mut list).await?;
    Ok(list.into_iter().map(|(c, _)| c).collect())
}

/// The user's memberships and cursors: the copy, or MySQL (then cached).
async fn memberships(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    uid: i64,
) -> Result<Vec<Membership>, HotError> {
    let keys = UserKeys::new(tenant, uid);
    let raw: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.chats())
        .query_async(redis)
        .await?;
    if raw.iter().any(|(field, _)| field == COMPLETE) {
        let mut cursors: HashMap<&str, &str> = HashMap::new();
        let mut out = Vec::with_capacity(raw.len() / 2);
        for (field, value) in &raw {
            if let Some(topic) = field.strip_prefix("c:") {
                cursors.insert(topic, value);
            } else if field != COMPLETE {
                match Membership::decode(field, value) {
                    Some(m) => out.push(m),
                    None => tracing::warn!(%field, "unreadable chat list entry skipped"),
                }
            }
        }
        for m in &mut out {
            if let Some(c) = cursors.get(m.topic.as_str()) {
                m.decode_cursors(c);
            }
        }
        return Ok(out);
    }
    // Read the version first: a change committed after it moves it.
    let version: Option<String> = redis::cmd("GET")
        .arg(keys.chats_version())
        .query_async(redis)
        .await?;
    let rows = memberships_from_mysql(pool, uid).await?;
    let mut fill = CACHE_CHATS.prepare_invoke();
    fill.key(keys.chats())
        .key(keys.chats_version())
        .arg(version.unwrap_or_default())
        .arg(TTL_SECS);
    for m in &rows {
        fill.arg(&m.topic)
            .arg(m.encode())
            .arg(format!("c:{}", m.topic))
            .arg(m.encode_cursors());
    }
    let _: i64 = fill.invoke_async(redis).await?;
    Ok(rows)
}

async fn memberships_from_mysql(pool: &MySqlPool, uid: i64) -> sqlx::Result<Vec<Membership>> {
    let rows = sqlx::query(
        "SELECT c.topic, c.kind, c.peer_uid, \
           CAST(UNIX_TIMESTAMP(c.joined_at) * 1000 AS SIGNED), m.role, \
           CAST(UNIX_TIMESTAMP(m.muted_until) * 1000 AS SIGNED), \
           CAST(UNIX_TIMESTAMP(GREATEST(c.updated_at, COALESCE(m.updated_at, c.updated_at))) * 1000 AS SIGNED), \
           COALESCE(s.read_seq, 0), COALESCE(s.recv_seq, 0), COALESCE(s.clear_delid, 0) \
         FROM im_conversations c \
         LEFT JOIN im_subscriptions s ON s.topic = c.topic AND s.uid = c.uid \
         LEFT JOIN im_group_members m ON c.kind = 'grp' AND m.topic = c.topic AND m.uid = c.uid \
         WHERE c.uid = ?",
    )
    .bind(uid)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            let kind = if r.try_get::<String, _>(1)? == "p2p" {
                Kind::P2p
            } else {
                Kind::Grp
            };
            let role: Option<String> = r.try_get(4)?;
            Ok(Membership {
                topic: r.try_get::<Exact, _>(0)?.into(),
                kind,
                peer: r.try_get(2)?,
                joined_ms: r.try_get(3)?,
                role: match kind {
                    Kind::P2p => None,
                    Kind::Grp => Some(Role::parse(role.as_deref().unwrap_or("member"))),
                },
                muted_until_ms: r.try_get::<Option<i64>, _>(5)?.unwrap_or(0),
                updated_ms: r.try_get(6)?,
                read: r.try_get(7)?,
                recv: r.try_get(8)?,
                clear: r.try_get::<i32, _>(9)? as i64,
            })
        })
        .collect()
}

/// Fills the states Redis lacks from MySQL, caching each unless a newer
/// one was written meanwhile (SET NX: the pipeline's write wins).
async fn fill_states(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    entries: &[Membership],
    states: &mut [Option<TopicState>],
) -> Result<(), HotError> {
    let missing: Vec<&str> = entries
        .iter()
        .zip(states.iter())
        .filter(|(_, s)| s.is_none())
        .map(|(m, _)| m.topic.as_str())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut found = topic_states_from_mysql(pool, &missing).await?;
    let mut pipe = redis::pipe();
    for (m, state) in entries.iter().zip(states.iter_mut()) {
        if state.is_some() {
            continue;
        }
        // A topic the projection has no row of yet is cached as seq 0: the
        // pipeline's first write replaces it.
        let s = found.remove(&m.topic).unwrap_or_default();
        cache_nx(
            &mut pipe,
            &TopicKeys::new(tenant, &m.topic).chat(),
            &s.encode(),
        );
        *state = Some(s);
    }
    let _: () = pipe.query_async(redis).await?;
    Ok(())
}

/// Adds to `pipe` a fill of `key` that never replaces a pipeline's write.
fn cache_nx(pipe: &mut redis::Pipeline, key: &str, value: &str) {
    pipe.cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("EX")
        .arg(TTL_SECS)
        .ignore();
}

async fn topic_states_from_mysql(
    pool: &MySqlPool,
    topics: &[&str],
) -> sqlx::Result<HashMap<String, TopicState>> {
    let rows = select_in(
        pool,
        "SELECT topic, last_seq, touched_ms, last_from, preview \
         FROM im_conversation_topics WHERE topic IN (",
        topics,
    )
    .await?;
    rows.iter()
        .map(|r| {
            let state = TopicState {
                seq: r.try_get(1)?,
                touched_ms: r.try_get(2)?,
                from: r.try_get(3)?,
                preview: r.try_get(4)?,
            };
            Ok((r.try_get::<Exact, _>(0)?.into(), state))
        })
        .collect()
}

/// The rows of `select … IN (` for `keys`, 500 keys per query.
async fn select_in<'k, K>(
    pool: &MySqlPool,
    select: &str,
    keys: &'k [K],
) -> sqlx::Result<Vec<sqlx::mysql::MySqlRow>>
where
    K: sqlx::Encode<'k, sqlx::MySql> + sqlx::Type<sqlx::MySql> + Copy + Send + Sync + 'k,
{
    let mut out = Vec::new();
    for chunk in keys.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(select);
        let mut sep = q.separated(", ");
        for k in chunk {
            sep.push_bind(*k);
        }
        q.push(")");
        out.extend(q.build().fetch_all(pool).await?);
    }
    Ok(out)
}

/// Fills the profiles Redis lacks from MySQL (SET NX, as for states); a
/// user or group without a profile row is cached as an empty profile.
async fn fill_profiles(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    entries: &[Membership],
    profiles: &mut [Option<CachedProfile>],
) -> Result<(), HotError> {
    let mut groups = Vec::new();
    let mut users = Vec::new();
    for (m, p) in entries.iter().zip(profiles.iter()) {
        match (p, m.kind) {
            (Some(_), _) => {}
            (None, Kind::Grp) => groups.push(m.topic.as_str()),
            (None, Kind::P2p) => users.push(m.peer),
        }
    }
    if groups.is_empty() && users.is_empty() {
        return Ok(());
    }
    let mut by_group = group_profiles_from_mysql(pool, &groups).await?;
    let mut by_user = user_profiles_from_mysql(pool, &users).await?;
    let mut pipe = redis::pipe();
    for (m, profile) in entries.iter().zip(profiles.iter_mut()) {
        if profile.is_some() {
            continue;
        }
        let p = match m.kind {
            Kind::Grp => by_group.remove(&m.topic),
            Kind::P2p => by_user.remove(&m.peer),
        }
        .unwrap_or_default();
        cache_nx(&mut pipe, &m.profile_key(tenant), &p.encode());
        *profile = Some(p);
    }
    let _: () = pipe.query_async(redis).await?;
    Ok(())
}

async fn group_profiles_from_mysql(
    pool: &MySqlPool,
    topics: &[&str],
) -> sqlx::Result<HashMap<String, CachedProfile>> {
    let found: HashMap<Exact, CachedProfile> = profiles_from_mysql(
        pool,
        "SELECT topic, name, photo, description, \
           CAST(UNIX_TIMESTAMP(updated_at) * 1000 AS SIGNED) FROM im_groups WHERE topic IN (",
        topics,
    )
    .await?;
    Ok(found.into_iter().map(|(k, v)| (k.0, v)).collect())
}

async fn user_profiles_from_mysql(
    pool: &MySqlPool,
    uids: &[i64],
) -> sqlx::Result<HashMap<i64, CachedProfile>> {
    profiles_from_mysql(
        pool,
        "SELECT uid, full_name, photo, note, \
           CAST(UNIX_TIMESTAMP(updated_at) * 1000 AS SIGNED) FROM im_user_profiles WHERE uid IN (",
        uids,
    )
    .await
}

/// `key, name, photo, note, updated_ms` rows of `select … IN (` for `keys`.
async fn profiles_from_mysql<'k, K, Out>(
    pool: &MySqlPool,
    select: &str,
    keys: &'k [K],
) -> sqlx::Result<HashMap<Out, CachedProfile>>
where
    K: sqlx::Encode<'k, sqlx::MySql> + sqlx::Type<sqlx::MySql> + Copy + Send + Sync + 'k,
    Out: for<'r> sqlx::Decode<'r, sqlx::MySql> + sqlx::Type<sqlx::MySql> + Eq + std::hash::Hash,
{
    select_in(pool, select, keys)
        .await?
        .iter()
        .map(|r| {
            let profile = CachedProfile {
                full_name: r.try_get(1)?,
                photo: r.try_get(2)?,
                note: r.try_get(3)?,
                updated_ms: r.try_get(4)?,
            };
            Ok((r.try_get(0)?, profile))
        })
        .collect()
}

/// Unread counts of the page: the reader's deleted ranges of each topic
/// with messages after the cursor, from the dellog cache under the token
/// read in the MGET, the rest in one MySQL query.
async fn count_unread(
    pool: &MySqlPool,
    deletes: &dellog::Cache,
    tenant: &str,
    uid: i64,
    list: &mut [(Conversation, Option<String>)],
) -> sqlx::Result<()> {
    let behind: Vec<(&str, Option<&str>)> = list
        .iter()
        .filter(|(c, _)| c.last_seq > c.read)
        .map(|(c, token)| (c.topic.as_str(), token.as_deref()))
        .collect();
    let found = deletes.cached_many(tenant, uid, &behind);
    let mut misses: Vec<&str> = Vec::new();
    let mut hidden: HashMap<String, Hidden> = HashMap::new();
    for ((topic, _), h) in behind.iter().zip(found) {
        match h {
            Some(h) => {
                hidden.insert(topic.to_string(), h);
            }
            None => misses.push(topic),
        }
    }
    if !misses.is_empty() {
        let mut read = deleted_ranges(pool, uid, &misses).await?;
        let misses: std::collections::HashSet<&str> = misses.into_iter().collect();
        for (c, token) in list.iter() {
            if misses.contains(c.topic.as_str()) {
                let h = Hidden::new(read.remove(&c.topic).unwrap_or_default());
                deletes.insert(tenant, &c.topic, uid, token.clone(), h.clone());
                hidden.insert(c.topic.clone(), h);
            }
        }
    }
    for (c, _) in list.iter_mut() {
        if c.last_seq > c.read {
            let ranges = hidden.get(&c.topic).map(Hidden::ranges).unwrap_or(&[]);
            c.unread = unread(c.last_seq, c.read, ranges);
        }
    }
    Ok(())
}

// --- Writes, by the pipelines, after their MySQL commit. ---

/// Drops the copies of `uids`' lists (their memberships changed) and moves
/// their versions, so a fill in flight is not cached either.
pub async fn forget(redis: &mut Redis, tenant: &str, uids: &[i64]) -> redis::RedisResult<()> {
    for chunk in uids.chunks(BATCH / 3) {
        let mut pipe = redis::pipe();
        for uid in chunk {
            let keys = UserKeys::new(tenant, *uid);
            pipe.cmd("INCR")
                .arg(keys.chats_version())
                .ignore()
                .cmd("EXPIRE")
                .arg(keys.chats_version())
                .arg(VERSION_TTL_SECS)
                .ignore()
                .cmd("DEL")
                .arg(keys.chats())
                .ignore();
        }
        let _: () = pipe.query_async(redis).await?;
    }
    Ok(())
}

/// A user's cursors of one conversation moved (0: unchanged).
#[derive(Debug, Clone)]
pub struct CursorMove {
    pub uid: i64,
    pub topic: String,
    pub read: i64,
    pub recv: i64,
    pub clear: i64,
}

/// Moves cursors forward in the copies that exist (`lua/chat_cursor.lua`).
pub async fn move_cursors(
    redis: &mut Redis,
    tenant: &str,
    moves: &[CursorMove],
) -> redis::RedisResult<()> {
    for chunk in moves.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for m in chunk {
            let keys = UserKeys::new(tenant, m.uid);
            pipe.cmd("EVAL")
                .arg(CHAT_CURSOR)
                .arg(2)
                .arg(keys.chats())
                .arg(keys.chats_version())
                .arg(&m.topic)
                .arg(m.read)
                .arg(m.recv)
                .arg(m.clear)
                .arg(VERSION_TTL_SECS)
                .ignore();
        }
        let _: () = pipe.query_async(redis).await?;
    }
    Ok(())
}

/// Writes the states of `topics` as MySQL now holds them.
pub async fn refresh_topics(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topics: &[&str],
) -> Result<(), HotError> {
    if topics.is_empty() {
        return Ok(());
    }
    let states = topic_states_from_mysql(pool, topics).await?;
    let rows: Vec<_> = states.into_iter().collect();
    for chunk in rows.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for (topic, s) in chunk {
            pipe.cmd("EVAL")
                .arg(CHAT_TOPIC)
                .arg(1)
                .arg(TopicKeys::new(tenant, topic).chat())
                .arg(s.seq)
                .arg(s.encode())
                .arg(TTL_SECS)
                .ignore();
        }
        let _: () = pipe.query_async(redis).await?;
    }
    Ok(())
}

/// Writes `uid`'s profile as MySQL now holds it.
pub async fn refresh_user_profile(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    uid: i64,
) -> Result<(), HotError> {
    let p = user_profiles_from_mysql(pool, &[uid])
        .await?
        .remove(&uid)
        .unwrap_or_default();
    set(redis, &UserKeys::new(tenant, uid).profile(), &p.encode()).await?;
    Ok(())
}

/// Writes `topic`'s group profile as MySQL now holds it.
pub async fn refresh_group_profile(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
) -> Result<(), HotError> {
    let p = group_profiles_from_mysql(pool, &[topic])
        .await?
        .remove(topic)
        .unwrap_or_default();
    set(redis, &TopicKeys::new(tenant, topic).profile(), &p.encode()).await?;
    Ok(())
}

/// Drops every chat-list copy of `tenant` (lists, topic states, profiles):
/// after a replay rebuilt MySQL, readers fill them again from it. Returns
/// how many keys went.
pub async fn drop_all(redis: &mut Redis, tenant: &str) -> redis::RedisResult<u64> {
    let mut dropped = 0;
    for pattern in [
        format!("im:{{{tenant}:u*}}:chats"),
        format!("im:{{{tenant}:*}}:chat"),
        format!("im:{{{tenant}:*}}:profile"),
    ] {
        let keys = crate::redis_util::scan_keys(redis, &pattern).await?;
        for chunk in keys.chunks(1000) {
            let n: u64 = redis::cmd("UNLINK").arg(chunk).query_async(redis).await?;
            dropped += n;
        }
    }
    Ok(dropped)
}

async fn set(redis: &mut Redis, key: &str, value: &str) -> redis::RedisResult<()> {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("EX")
        .arg(TTL_SECS)
        .query_async(redis)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let m = Membership {
            topic: "grpA".into(),
            kind: Kind::Grp,
            peer: 0,
            joined_ms: 1_700_000_000_123,
            role: Some(Role::Admin),
            muted_until_ms: 0,
            updated_ms: 1_700_000_000_456,
            read: 0,
            recv: 0,
            clear: 0,
        };
        assert_eq!(Membership::decode("grpA", &m.encode()), Some(m.clone()));
        let p = Membership {
            topic: "p2pX".into(),
            kind: Kind::P2p,
            peer: 42,
            role: None,
            ..m
        };
        assert_eq!(Membership::decode("p2pX", &p.encode()), Some(p.clone()));
        let mut c = p.clone();
        c.decode_cursors("7|9|2");
        assert_eq!((c.read, c.recv, c.clear), (7, 9, 2));
        assert_eq!(Membership::decode("x", "what|1"), None);
    }

    #[test]
    fn states_keep_previews_with_separators() {
        for preview in [None, Some(""), Some("a|b|c"), Some("+-字")] {
            let s = TopicState {
                seq: 12,
                touched_ms: 34,
                from: 56,
                preview: preview.map(str::to_string),
            };
            assert_eq!(TopicState::decode(&s.encode()), Some(s));
        }
        assert_eq!(TopicState::decode("1|2|3|x"), None);
    }
}
