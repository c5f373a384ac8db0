//! The chat list read model (issue 14): every conversation of a user — the
//! groups they are in and their one-to-one topics — with the topic's last
//! seq and activity, the user's cursors and unread count, and what a list
//! shows (the group's or the peer's profile, the last message's preview).
//!
//! Written by the `conversations` pipeline (`im_conversations`: one row per
//! user and conversation, changed only by membership; `im_conversation_topics`:
//! one row per topic, changed per message) next to the cursors of the
//! receipts pipeline (`im_subscriptions`) and the profiles of the members
//! and relations pipelines. Unread is derived when read: last seq − read
//! cursor − the user's deleted seqs after the cursor, so a message costs one
//! topic row whatever the group's size. Lists are served from the hot copy
//! in Redis ([`hot`]); the functions here read MySQL, the ground truth.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::exact::Exact;
use crate::groups::Role;

pub mod hot;

/// Longest preview kept, in characters.
pub const PREVIEW_CHARS: usize = 120;
/// Most conversations one list request returns.
pub const MAX_PAGE: i64 = 500;

/// A group or a one-to-one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Grp,
    P2p,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Grp => "grp",
            Kind::P2p => "p2p",
        }
    }
}

/// A public profile as lists show it (a group's name, photo and
/// description, or a user's full name, photo and note).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Profile {
    #[serde(rename = "fn", skip_serializing_if = "Option::is_none")]
    pub full_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub photo: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Profile {
    pub fn is_empty(&self) -> bool {
        self.full_name.is_none() && self.photo.is_none() && self.note.is_none()
    }

    /// Tinode's `public`: `{fn, photo: {ref}, note}`.
    pub fn public(&self) -> serde_json::Value {
        let mut p = serde_json::Map::new();
        if let Some(name) = &self.full_name {
            p.insert("fn".into(), name.clone().into());
        }
        // An empty photo is one removed (Tinode's delete marker).
        if let Some(photo) = self.photo.as_ref().filter(|p| !p.is_empty()) {
            p.insert("photo".into(), serde_json::json!({ "ref": photo }));
        }
        if let Some(note) = self.note.as_ref().filter(|n| !n.is_empty()) {
            p.insert("note".into(), note.clone().into());
        }
        serde_json::Value::Object(p)
    }
}

/// One entry of a user's chat list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conversation {
    /// The stored topic name (`grp…` or `p2p…`).
    pub topic: String,
    pub kind: Kind,
    /// The other user of a one-to-one topic; 0 for groups.
    pub peer: i64,
    /// The user's role in a group; `None` for one-to-one topics.
    #[serde(skip)]
    pub role: Option<Role>,
    /// The user is muted in the group (until a time still ahead).
    pub muted: bool,
    pub last_seq: i64,
    /// Epoch ms of the last message (or of joining).
    pub touched_ms: i64,
    /// Epoch ms of the last change of the entry itself (membership, profile).
    pub updated_ms: i64,
    pub last_from: i64,
    pub preview: Option<String>,
    pub read: i64,
    pub recv: i64,
    pub clear: i64,
    pub unread: i64,
    pub profile: Profile,
}

/// Where a page of the list starts: after (touched, topic) of the last
/// entry of the previous page (newest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub touched_ms: i64,
    pub topic: String,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!("{}.{}", self.touched_ms, self.topic)
    }

    pub fn parse(text: &str) -> Option<Cursor> {
        let (t, topic) = text.split_once('.')?;
        Some(Cursor {
            touched_ms: t.parse().ok()?,
            topic: topic.to_string(),
        })
    }
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Only this stored topic.
    pub topic: Option<String>,
    /// Only entries changed (touched or updated) after this epoch ms.
    pub changed_since_ms: Option<i64>,
    pub after: Option<Cursor>,
    pub limit: i64,
}

/// The user's conversations, newest activity first, with unread counts.
pub async fn list(pool: &MySqlPool, uid: i64, q: &Query) -> sqlx::Result<Vec<Conversation>> {
    let mut sql = String::from(
        "SELECT c.topic, c.kind, c.peer_uid, \
           CAST(UNIX_TIMESTAMP(c.joined_at) * 1000 AS SIGNED) AS joined_ms, \
           COALESCE(t.last_seq, 0) AS last_seq, COALESCE(t.touched_ms, 0) AS touched_ms, \
           COALESCE(t.last_from, 0) AS last_from, t.preview, \
           COALESCE(s.read_seq, 0) AS read_seq, COALESCE(s.recv_seq, 0) AS recv_seq, \
           COALESCE(s.clear_delid, 0) AS clear_delid, m.role, \
           (m.muted_until IS NOT NULL AND m.muted_until > CURRENT_TIMESTAMP(3)) AS muted, \
           CASE WHEN c.kind = 'p2p' THEN p.full_name ELSE g.name END AS name, \
           CASE WHEN c.kind = 'p2p' THEN p.photo ELSE g.photo END AS photo, \
           CASE WHEN c.kind = 'p2p' THEN p.note ELSE g.description END AS note, \
           CAST(UNIX_TIMESTAMP(GREATEST(c.updated_at, COALESCE(p.updated_at, c.updated_at), \
             COALESCE(m.updated_at, c.updated_at), COALESCE(g.updated_at, c.updated_at))) * 1000 AS SIGNED) AS updated_ms \
         FROM im_conversations c \
         LEFT JOIN im_conversation_topics t ON t.topic = c.topic \
         LEFT JOIN im_subscriptions s ON s.topic = c.topic AND s.uid = c.uid \
         LEFT JOIN im_group_members m ON c.kind = 'grp' AND m.topic = c.topic AND m.uid = c.uid \
         LEFT JOIN im_groups g ON c.kind = 'grp' AND g.topic = c.topic \
         LEFT JOIN im_user_profiles p ON c.kind = 'p2p' AND p.uid = c.peer_uid \
         WHERE c.uid = ?",
    );
    if q.topic.is_some() {
        sql.push_str(" AND c.topic = ?");
    }
    if q.changed_since_ms.is_some() {
        sql.push_str(
            " AND (COALESCE(t.touched_ms, 0) > ? OR GREATEST(c.updated_at, COALESCE(p.updated_at, c.updated_at), \
             COALESCE(m.updated_at, c.updated_at), COALESCE(g.updated_at, c.updated_at)) > FROM_UNIXTIME(? / 1000))",
        );
    }
    if q.after.is_some() {
        sql.push_str(
            " AND (COALESCE(t.touched_ms, 0) < ? OR (COALESCE(t.touched_ms, 0) = ? AND c.topic > ?))",
        );
    }
    sql.push_str(" ORDER BY touched_ms DESC, c.topic LIMIT ?");
    let mut query = sqlx::query(&sql).bind(uid);
    if let Some(topic) = &q.topic {
        query = query.bind(topic);
    }
    if let Some(since) = q.changed_since_ms {
        query = query.bind(since).bind(since);
    }
    if let Some(after) = &q.after {
        query = query
            .bind(after.touched_ms)
            .bind(after.touched_ms)
            .bind(&after.topic);
    }
    let rows = query.bind(page_limit(q.limit)).fetch_all(pool).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let kind = if r.try_get::<String, _>("kind")? == "p2p" {
            Kind::P2p
        } else {
            Kind::Grp
        };
        let joined_ms: i64 = r.try_get("joined_ms")?;
        let touched: i64 = r.try_get("touched_ms")?;
        let role: Option<String> = r.try_get("role")?;
        let muted: Option<i64> = r.try_get("muted")?;
        let c = Conversation {
            topic: r.try_get::<Exact, _>("topic")?.into(),
            kind,
            peer: r.try_get("peer_uid")?,
            role: match kind {
                Kind::P2p => None,
                Kind::Grp => Some(Role::parse(role.as_deref().unwrap_or("member"))),
            },
            muted: muted.unwrap_or(0) != 0,
            last_seq: r.try_get("last_seq")?,
            touched_ms: if touched > 0 { touched } else { joined_ms },
            updated_ms: r.try_get("updated_ms")?,
            last_from: r.try_get("last_from")?,
            preview: r.try_get("preview")?,
            read: r.try_get("read_seq")?,
            recv: r.try_get("recv_seq")?,
            clear: r.try_get::<i32, _>("clear_delid")? as i64,
            unread: 0,
            profile: Profile {
                full_name: r.try_get("name")?,
                photo: r.try_get("photo")?,
                note: r.try_get("note")?,
            },
        };
        out.push(c);
    }
    count_unread(pool, uid, &mut out).await?;
    Ok(out)
}

/// How many entries a page holds for a requested `limit` (≤ 0: the most).
pub fn page_limit(limit: i64) -> i64 {
    if limit <= 0 {
        MAX_PAGE
    } else {
        limit.min(MAX_PAGE)
    }
}

/// Sets `unread` of each entry: last seq − read, less the seqs after the
/// read cursor the user deleted or that were deleted for everyone.
async fn count_unread(pool: &MySqlPool, uid: i64, list: &mut [Conversation]) -> sqlx::Result<()> {
    let behind: Vec<&str> = list
        .iter()
        .filter(|c| c.last_seq > c.read)
        .map(|c| c.topic.as_str())
        .collect();
    let mut deleted = deleted_ranges(pool, uid, &behind).await?;
    for c in list.iter_mut() {
        let ranges = deleted.remove(&c.topic).unwrap_or_default();
        c.unread = unread(c.last_seq, c.read, &ranges);
    }
    Ok(())
}

/// The `[low, hi)` ranges of `topics` deleted for `uid` or for everyone.
async fn deleted_ranges(
    pool: &MySqlPool,
    uid: i64,
    topics: &[&str],
) -> sqlx::Result<HashMap<String, Vec<(i64, i64)>>> {
    let mut deleted: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for chunk in topics.chunks(200) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT topic, low, hi FROM im_dellog WHERE deletedfor IN (0, ",
        );
        q.push_bind(uid).push(") AND topic IN (");
        let mut sep = q.separated(", ");
        for t in chunk {
            sep.push_bind(*t);
        }
        q.push(")");
        for r in q.build().fetch_all(pool).await? {
            deleted
                .entry(r.try_get::<Exact, _>(0)?.into())
                .or_default()
                .push((r.try_get(1)?, r.try_get(2)?));
        }
    }
    Ok(deleted)
}

/// Seqs in `(read, last]` outside every `[low, hi)` of `deleted`.
pub fn unread(last: i64, read: i64, deleted: &[(i64, i64)]) -> i64 {
    if last <= read {
        return 0;
    }
    // Merge the ranges (they may overlap: a user's clear and a delete for
    // everyone), then subtract their part inside the window.
    let mut merged: BTreeMap<i64, i64> = BTreeMap::new();
    let mut sorted: Vec<(i64, i64)> = deleted.iter().copied().filter(|(l, h)| h > l).collect();
    sorted.sort();
    let mut current: Option<(i64, i64)> = None;
    for (low, hi) in sorted {
        current = match current {
            Some((l, h)) if low <= h => Some((l, h.max(hi))),
            Some((l, h)) => {
                merged.insert(l, h);
                Some((low, hi))
            }
            None => Some((low, hi)),
        };
    }
    if let Some((l, h)) = current {
        merged.insert(l, h);
    }
    let (from, to) = (read + 1, last + 1);
    let gone: i64 = merged
        .iter()
        .map(|(&l, &h)| (h.min(to) - l.max(from)).max(0))
        .sum();
    (last - read - gone).max(0)
}

/// The badge: unread messages over all of a user's conversations, and how
/// many conversations have some.
pub async fn badge(pool: &MySqlPool, uid: i64) -> sqlx::Result<(i64, i64)> {
    Ok(badge_of(&list_all(pool, uid).await?))
}

/// Every conversation of `uid`, newest first, page after page.
pub async fn list_all(pool: &MySqlPool, uid: i64) -> sqlx::Result<Vec<Conversation>> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let query = Query {
            after: after.take(),
            limit: MAX_PAGE,
            ..Default::default()
        };
        let page = list(pool, uid, &query).await?;
        let full = page.len() as i64 == MAX_PAGE;
        after = page.last().map(|c| Cursor {
            touched_ms: c.touched_ms,
            topic: c.topic.clone(),
        });
        all.extend(page);
        if !full {
            return Ok(all);
        }
    }
}

/// (unread messages, conversations with some) of a list.
pub fn badge_of(list: &[Conversation]) -> (i64, i64) {
    (
        list.iter().map(|c| c.unread).sum(),
        list.iter().filter(|c| c.unread > 0).count() as i64,
    )
}

/// A user's public profile, if they set one.
pub async fn user_profile(pool: &MySqlPool, uid: i64) -> sqlx::Result<Profile> {
    let row: Option<(Option<String>, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT full_name, photo, note FROM im_user_profiles WHERE uid = ?")
            .bind(uid)
            .fetch_optional(pool)
            .await?;
    let (full_name, photo, note) = row.unwrap_or_default();
    Ok(Profile {
        full_name,
        photo,
        note,
    })
}

/// Most users one directory search returns.
pub const FIND_MAX: usize = 20;

/// The directory search behind Tinode's `fnd` topic: users of the tenant
/// whose profile name starts with one of `terms` (case-insensitive, as the
/// column's collation compares), or whose id is one of `ids`; never
/// `searcher`, and never a user who blocked `searcher`. Only users with a
/// profile are found, and only their name and photo: a note is private
/// (shown where the two share a conversation, never in the directory).
///
/// Bounded cost: each term is a range scan of the `full_name` index in its
/// order that stops after [`FIND_MAX`] rows (no `%term%` scan of the
/// table), each id a primary-key lookup, each block check one primary-key
/// lookup of `im_blocks`. Measured on 100,000 profiles (MariaDB 10.11):
/// a two-term search reads under 200 index entries, where the former
/// `LIKE '%term%'` read all 100,001 rows and sorted them.
pub async fn find_users(
    pool: &MySqlPool,
    terms: &[String],
    ids: &[i64],
    searcher: i64,
) -> sqlx::Result<Vec<(i64, Profile)>> {
    if terms.is_empty() && ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new("SELECT uid, full_name, photo FROM (");
    let mut parts = 0;
    let found = |q: &mut sqlx::QueryBuilder<'_, sqlx::MySql>| {
        // The block check as an anti-join: one primary-key lookup per
        // row (MariaDB and MySQL alike), never a scan of `im_blocks`.
        q.push(
            "(SELECT p.uid, p.full_name, p.photo FROM im_user_profiles p \
             LEFT JOIN im_blocks b ON b.uid = p.uid AND b.blocked_uid = ",
        )
        .push_bind(searcher)
        .push(" WHERE b.uid IS NULL AND p.uid <> ")
        .push_bind(searcher)
        .push(" AND ");
    };
    for term in terms {
        if parts > 0 {
            q.push(" UNION ");
        }
        parts += 1;
        found(&mut q);
        q.push("p.full_name LIKE ")
            .push_bind(format!("{}%", like_escaped(term)))
            .push(" ESCAPE '!' ORDER BY p.full_name, p.uid LIMIT ")
            .push_bind(FIND_MAX as i64)
            .push(")");
    }
    if !ids.is_empty() {
        if parts > 0 {
            q.push(" UNION ");
        }
        found(&mut q);
        q.push("p.uid IN (");
        let mut sep = q.separated(", ");
        for id in ids {
            sep.push_bind(*id);
        }
        q.push("))");
    }
    q.push(") found ORDER BY full_name, uid LIMIT ")
        .push_bind(FIND_MAX as i64);
    q.build()
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| {
            Ok((
                r.try_get(0)?,
                Profile {
                    full_name: r.try_get(1)?,
                    photo: r.try_get(2)?,
                    note: None,
                },
            ))
        })
        .collect()
}

/// Whether `subject` may show `viewer` their note and presence: `subject`
/// did not block `viewer`, and either the two are friends or they share a
/// conversation `subject` took part in of their own accord (sent a message
/// there, created the group, accepted an invitation: the row's `engaged`).
/// A stranger's unsolicited message, or adding someone to a group, unlocks
/// nothing. Reads the subject's conversations by primary key, each checked
/// against the viewer's by primary key (never a group's whole member list).
pub async fn may_see_private(pool: &MySqlPool, viewer: i64, subject: i64) -> sqlx::Result<bool> {
    if viewer == subject {
        return Ok(true);
    }
    let shared: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM DUAL \
         WHERE NOT EXISTS (SELECT 1 FROM im_blocks b WHERE b.uid = ? AND b.blocked_uid = ?) \
           AND (EXISTS (SELECT 1 FROM im_friends f WHERE f.uid = ? AND f.friend_uid = ?) \
             OR EXISTS (SELECT 1 FROM im_conversations s STRAIGHT_JOIN im_conversations v \
                          ON v.uid = ? AND v.topic = s.topic \
                        WHERE s.uid = ? AND s.engaged = 1))",
    )
    .bind(subject)
    .bind(viewer)
    .bind(subject)
    .bind(viewer)
    .bind(viewer)
    .bind(subject)
    .fetch_optional(pool)
    .await?;
    Ok(shared.is_some())
}

/// The peers of `viewer`'s one-to-one `topics` (`(topic, peer)`) that are
/// in the viewer's list (projected), each with whether the peer may show
/// `viewer` their note and presence: the peer took part in the
/// conversation (wrote there; see [`may_see_private`]) or is the viewer's
/// friend, and did not block the viewer (primary-key lookups only). A
/// peer missing from the answer has no row yet (the projection lags).
pub async fn peers_shown(
    pool: &MySqlPool,
    viewer: i64,
    topics: &[(&str, i64)],
) -> sqlx::Result<std::collections::HashMap<i64, bool>> {
    let mut listed = std::collections::HashMap::new();
    for chunk in topics.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT c.peer_uid, \
               NOT EXISTS (SELECT 1 FROM im_blocks b \
                 WHERE b.uid = c.peer_uid AND b.blocked_uid = c.uid) \
               AND (COALESCE(p.engaged, 0) = 1 \
                 OR EXISTS (SELECT 1 FROM im_friends f \
                   WHERE f.uid = c.peer_uid AND f.friend_uid = c.uid)) \
             FROM im_conversations c \
             LEFT JOIN im_conversations p ON p.uid = c.peer_uid AND p.topic = c.topic \
             WHERE c.uid = ",
        );
        q.push_bind(viewer).push(" AND c.topic IN (");
        let mut sep = q.separated(", ");
        for (topic, _) in chunk {
            sep.push_bind(*topic);
        }
        q.push(")");
        for r in q.build().fetch_all(pool).await? {
            let shown: i64 = r.try_get(1)?;
            listed.insert(r.try_get::<i64, _>(0)?, shown == 1);
        }
    }
    // Only the peer the topic is with (a row names its own peer).
    listed.retain(|p, _| topics.iter().any(|(_, peer)| peer == p));
    Ok(listed)
}

/// Which of a group's members `uids` may show `viewer` their note and
/// presence in `topic`: the viewer, and members who took part there of
/// their own accord (created it, accepted an invitation, wrote: the row's
/// `engaged`) or are the viewer's friends, and did not block the viewer.
/// Being added to someone's group shows them nothing (primary-key lookups).
pub async fn members_shown(
    pool: &MySqlPool,
    viewer: i64,
    topic: &str,
    uids: &[i64],
) -> sqlx::Result<std::collections::HashSet<i64>> {
    let mut out = std::collections::HashSet::new();
    if uids.contains(&viewer) {
        out.insert(viewer);
    }
    for chunk in uids.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT c.uid FROM im_conversations c WHERE c.topic = ",
        );
        q.push_bind(topic).push(" AND c.uid IN (");
        let mut sep = q.separated(", ");
        for uid in chunk {
            sep.push_bind(*uid);
        }
        q.push(
            ") AND NOT EXISTS (SELECT 1 FROM im_blocks b \
             WHERE b.uid = c.uid AND b.blocked_uid = ",
        )
        .push_bind(viewer)
        .push(
            ") AND (c.engaged = 1 OR EXISTS (SELECT 1 FROM im_friends f \
             WHERE f.uid = c.uid AND f.friend_uid = ",
        )
        .push_bind(viewer)
        .push("))");
        for r in q.build().fetch_all(pool).await? {
            out.insert(r.try_get::<i64, _>(0)?);
        }
    }
    Ok(out)
}

/// Which of `subjects` blocked `viewer` (primary-key lookups).
pub async fn blocked_by(
    pool: &MySqlPool,
    viewer: i64,
    subjects: &[i64],
) -> sqlx::Result<std::collections::HashSet<i64>> {
    let mut out = std::collections::HashSet::new();
    for chunk in subjects.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT uid FROM im_blocks WHERE blocked_uid = ",
        );
        q.push_bind(viewer).push(" AND uid IN (");
        let mut sep = q.separated(", ");
        for s in chunk {
            sep.push_bind(*s);
        }
        q.push(")");
        for r in q.build().fetch_all(pool).await? {
            out.insert(r.try_get::<i64, _>(0)?);
        }
    }
    Ok(out)
}

/// A `(uid, full_name, photo, note)` row of `im_user_profiles`.
fn profile_row(r: &sqlx::mysql::MySqlRow) -> sqlx::Result<(i64, Profile)> {
    Ok((
        r.try_get(0)?,
        Profile {
            full_name: r.try_get(1)?,
            photo: r.try_get(2)?,
            note: r.try_get(3)?,
        },
    ))
}

/// `s` with LIKE's wildcards taken literally (escape character `!`).
fn like_escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out
}

/// Profiles of several users (missing ones are absent).
pub async fn user_profiles(pool: &MySqlPool, uids: &[i64]) -> sqlx::Result<HashMap<i64, Profile>> {
    let mut out = HashMap::new();
    for chunk in uids.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT uid, full_name, photo, note FROM im_user_profiles WHERE uid IN (",
        );
        let mut sep = q.separated(", ");
        for u in chunk {
            sep.push_bind(*u);
        }
        q.push(")");
        for r in q.build().fetch_all(pool).await? {
            let (uid, profile) = profile_row(&r)?;
            out.insert(uid, profile);
        }
    }
    Ok(out)
}

/// A group's public profile (name, photo, description).
pub async fn group_profile(pool: &MySqlPool, topic: &str) -> sqlx::Result<Profile> {
    let row: Option<(String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT name, photo, description FROM im_groups WHERE topic = ?")
            .bind(topic)
            .fetch_optional(pool)
            .await?;
    Ok(match row {
        Some((name, photo, note)) => Profile {
            full_name: (!name.is_empty()).then_some(name),
            photo,
            note,
        },
        None => Profile::default(),
    })
}

/// One member of a group as its member list shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub uid: i64,
    pub role: Role,
    pub muted: bool,
    pub updated_ms: i64,
    pub read: i64,
    pub recv: i64,
    pub profile: Profile,
}

/// A page of a group's members in uid order (after `after_uid`), or one
/// member; with their cursors and profiles.
pub async fn members(
    pool: &MySqlPool,
    topic: &str,
    only: Option<i64>,
    after_uid: i64,
    changed_since_ms: Option<i64>,
    limit: i64,
) -> sqlx::Result<Vec<Member>> {
    let mut sql = String::from(
        "SELECT m.uid, m.role, (m.muted_until IS NOT NULL AND m.muted_until > CURRENT_TIMESTAMP(3)) AS muted, \
           CAST(UNIX_TIMESTAMP(GREATEST(m.updated_at, COALESCE(p.updated_at, m.updated_at))) * 1000 AS SIGNED) AS updated_ms, \
           COALESCE(s.read_seq, 0), COALESCE(s.recv_seq, 0), p.full_name, p.photo, p.note \
         FROM im_group_members m \
         LEFT JOIN im_subscriptions s ON s.topic = m.topic AND s.uid = m.uid \
         LEFT JOIN im_user_profiles p ON p.uid = m.uid \
         WHERE m.topic = ? AND m.uid > ?",
    );
    if only.is_some() {
        sql.push_str(" AND m.uid = ?");
    }
    if changed_since_ms.is_some() {
        sql.push_str(
            " AND GREATEST(m.updated_at, COALESCE(p.updated_at, m.updated_at)) > FROM_UNIXTIME(? / 1000)",
        );
    }
    sql.push_str(" ORDER BY m.uid LIMIT ?");
    let mut q = sqlx::query(&sql).bind(topic).bind(after_uid);
    if let Some(uid) = only {
        q = q.bind(uid);
    }
    if let Some(since) = changed_since_ms {
        q = q.bind(since);
    }
    let rows = q.bind(limit.clamp(1, MAX_PAGE)).fetch_all(pool).await?;
    rows.iter()
        .map(|r| {
            Ok(Member {
                uid: r.try_get(0)?,
                role: Role::parse(&r.try_get::<String, _>(1)?),
                muted: r.try_get::<Option<i64>, _>(2)?.unwrap_or(0) != 0,
                updated_ms: r.try_get(3)?,
                read: r.try_get(4)?,
                recv: r.try_get(5)?,
                profile: Profile {
                    full_name: r.try_get(6)?,
                    photo: r.try_get(7)?,
                    note: r.try_get(8)?,
                },
            })
        })
        .collect()
}

/// The plain text a list shows for a message's content (a string, or a
/// Drafty document's `txt`), cut to [`PREVIEW_CHARS`].
pub fn preview(content: Option<&str>) -> Option<String> {
    let text = content?;
    let value: serde_json::Value =
        serde_json::from_str(text).unwrap_or(serde_json::Value::String(text.to_string()));
    let plain = match &value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(o) => o.get("txt")?.as_str()?.to_string(),
        _ => return None,
    };
    Some(plain.chars().take(PREVIEW_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_subtracts_deleted_seqs_after_the_cursor() {
        assert_eq!(unread(10, 4, &[]), 6);
        assert_eq!(unread(10, 10, &[]), 0);
        assert_eq!(unread(10, 12, &[]), 0);
        // 5..8 deleted (5, 6, 7), and an overlapping 6..9 (adds 8).
        assert_eq!(unread(10, 4, &[(5, 8), (6, 9)]), 2);
        // Deleted before the cursor does not count.
        assert_eq!(unread(10, 4, &[(1, 4)]), 6);
        // A range that covers everything.
        assert_eq!(unread(10, 0, &[(1, 100)]), 0);
        // Empty and inverted ranges are ignored.
        assert_eq!(unread(10, 0, &[(5, 5), (7, 3)]), 10);
    }

    #[test]
    fn previews_are_plain_and_short() {
        assert_eq!(preview(Some("\"hello\"")).as_deref(), Some("hello"));
        assert_eq!(
            preview(Some(r#"{"txt":"hi there","fmt":[]}"#)).as_deref(),
            Some("hi there")
        );
        assert_eq!(preview(Some("not json")).as_deref(), Some("not json"));
        assert_eq!(preview(Some("42")), None);
        assert_eq!(preview(None), None);
        let long = format!("\"{}\"", "字".repeat(500));
        assert_eq!(preview(Some(&long)).unwrap().chars().count(), PREVIEW_CHARS);
    }

    #[test]
    fn cursors_round_trip() {
        let c = Cursor {
            touched_ms: 1_790_000_000_000,
            topic: "grpA.b".into(),
        };
        assert_eq!(Cursor::parse(&c.encode()), Some(c));
        assert_eq!(Cursor::parse("x"), None);
    }
}
