//! The chat list and profiles as the WebSocket (`me` topic, group member
//! lists) and HTTP (`/v1/me/…`, profiles) front ends serve them: Tinode's
//! shapes built from [`crate::conversations`], and the profile changes a
//! user or a group's owner/admin makes (events in the log).

use std::collections::HashSet;

use serde::Serialize;
use serde_json::{json, Value};

use crate::conversations::{self, Conversation, Kind, Member};
use crate::events::{
    new_event_id, now_ms, GroupProfileChanged, ProfileChanged, UserEvent, UserEventBody,
};
use crate::groups::{Role, Standing};
use crate::kafka::topics::TopicKind;
use crate::keys::{TenantKeys, TopicKeys};
use crate::realtime::frames::access_mode;
use crate::tinode;

use super::refusal::Refusal;
use super::Gateway;

/// Longest full name / group name, in characters ([`crate::fields`]).
pub const MAX_NAME_CHARS: usize = crate::fields::GROUP_NAME_CHARS;
/// Longest photo reference, in characters.
pub const MAX_PHOTO_CHARS: usize = crate::fields::PHOTO_CHARS;
/// Longest user note, in characters.
pub const MAX_NOTE_CHARS: usize = crate::fields::NOTE_CHARS;
/// Longest group description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = crate::fields::DESCRIPTION_CHARS;
/// Member-list page when the client names no limit.
pub const DEFAULT_MEMBER_PAGE: i64 = 100;
/// One-to-one access mode (both users may do everything but delete for all).
pub const P2P_MODE: &str = "JRWPA";

fn unavailable(e: impl std::fmt::Display) -> Refusal {
    Refusal::unavailable(e)
}

fn pool<'a>(gw: &'a Gateway, tenant: &str) -> Result<&'a sqlx::MySqlPool, Refusal> {
    gw.pools.get(tenant).map_err(Refusal::internal)
}

/// Tinode's `acs` object for one mode.
pub fn acs(mode: &str) -> Value {
    json!({"want": mode, "given": mode, "mode": mode})
}

/// A conversation's access mode for its user.
pub fn mode_of(c: &Conversation) -> String {
    match c.kind {
        Kind::P2p => P2P_MODE.to_string(),
        Kind::Grp => access_mode(c.role, c.muted),
    }
}

/// `{meta topic="me" desc}`: the user's own profile.
pub async fn me_desc(gw: &Gateway, tenant: &str, uid: i64) -> Result<Value, Refusal> {
    let pool = pool(gw, tenant)?;
    let profile = conversations::user_profile(pool, uid)
        .await
        .map_err(unavailable)?;
    let incognito = crate::relations::incognito(pool, uid)
        .await
        .map_err(unavailable)?;
    Ok(json!({
        "created": tinode::timestamp_ms(0),
        "updated": tinode::now(),
        "public": profile.public(),
        "acs": crate::gateway::personal::Acs::me(incognito).json(),
        "defacs": {"auth": "JRWPAS", "anon": "N"},
    }))
}

/// What `{get topic="me" what="sub"}` (or the HTTP list) asks for.
pub fn list_query(q: Option<&tinode::SubQuery>, uid: i64) -> Result<conversations::Query, Refusal> {
    let Some(q) = q else {
        return Ok(conversations::Query::default());
    };
    let topic = match q.topic.as_deref() {
        None => None,
        Some(t) => Some(
            tinode::resolve_topic(t, uid)
                .filter(|t| tinode::is_conversation_topic(t))
                .ok_or_else(|| Refusal(404, "topic not found".into()))?,
        ),
    };
    let changed_since_ms = match q.ims.as_deref() {
        None => None,
        Some(ims) => Some(
            tinode::parse_timestamp_ms(ims)
                .ok_or_else(|| Refusal(400, "malformed: ims is not a timestamp".into()))?,
        ),
    };
    Ok(conversations::Query {
        topic,
        changed_since_ms,
        after: None,
        limit: q.limit.unwrap_or(0),
    })
}

/// Most messages a login catch-up returns per conversation.
pub const MAX_CATCHUP: i64 = 50;

/// A conversation's part of the login catch-up (seed 003 §9.1): its
/// unread messages, oldest first, when there are at most `n`; `None` when
/// there are more (the client shows the count) or none.
pub async fn catch_up(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    c: &Conversation,
    n: i64,
) -> Result<Option<Vec<crate::store::message::StoredMessage>>, Refusal> {
    if c.unread == 0 || c.unread > n {
        return Ok(None);
    }
    // Only what the history route would give: the chat list is a
    // projection that may not have seen a removal yet, the write model has
    // (issue 39: a removed member paged new messages here meanwhile).
    match super::reads::ensure_member(gw, tenant, &c.topic, uid).await {
        Ok(()) => {}
        Err(Refusal(code, _)) if code < 500 => return Ok(None),
        Err(e) => return Err(e),
    }
    let query = crate::history::PageQuery::new(Some(c.read + 1), None, Some(n), true)?;
    let page = gw.history.page(tenant, &c.topic, uid, query).await?;
    Ok(Some(page.messages))
}

/// A page of the user's conversations, and where the next one starts
/// when this page was full (counted before hidden chats were left out, so
/// a deleted chat never ends the paging early).
pub struct Page {
    pub list: Vec<Conversation>,
    pub next: Option<conversations::Cursor>,
}

/// The user's conversations, newest first, without the one-to-one chats
/// they deleted (until a later message). Asked for one topic the
/// projection has not reached yet (the `{pres}` of a first message can
/// arrive before it), a member gets the entry from the live state, unless
/// they deleted that chat.
pub async fn conversations_of(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    query: &conversations::Query,
) -> Result<Page, Refusal> {
    let pool = pool(gw, tenant)?;
    let redis = gw.redis.clone();
    let deletes = gw.history.dellog_cache();
    let mut list = conversations::hot::list(pool, &redis, deletes, tenant, uid, query)
        .await
        .map_err(unavailable)?;
    let next = (query.limit > 0 && list.len() as i64 == query.limit)
        .then(|| list.last())
        .flatten()
        .map(|last| conversations::Cursor {
            touched_ms: last.touched_ms,
            topic: last.topic.clone(),
        });
    let hidden = super::personal::hidden_chats(pool, uid)
        .await
        .map_err(unavailable)?;
    if !hidden.is_empty() {
        list.retain(|c| hidden.get(&c.topic).is_none_or(|until| c.last_seq > *until));
    }
    // A peer who blocked the user shows no note (nor presence, see
    // `online_flags`).
    let shown = peers_shown(gw, tenant, uid, &list).await?;
    for c in list.iter_mut() {
        if c.kind == Kind::P2p && !shown.contains(&c.peer) {
            c.profile.note = None;
        }
    }
    if let (Some(topic), true) = (&query.topic, list.is_empty()) {
        // A deleted chat only once a later message was sent (the `{pres}`
        // of which can come before the projection has it).
        let shown = match hidden.get(topic) {
            None => true,
            Some(until) => super::reads::last_seq(gw, tenant, topic).await? > *until,
        };
        if shown {
            list = live_entry(gw, tenant, uid, topic)
                .await?
                .into_iter()
                .collect();
        }
    }
    Ok(Page { list, next })
}

/// A one-to-one peer's profile as `viewer` may see it: the note only when
/// the two share a conversation and the peer did not block the viewer
/// (anyone can name anyone's one-to-one topic, so naming it shows no more
/// than the directory does).
pub async fn peer_profile(
    pool: &sqlx::MySqlPool,
    viewer: i64,
    peer: i64,
) -> sqlx::Result<conversations::Profile> {
    let mut profile = conversations::user_profile(pool, peer).await?;
    if profile.note.is_some() && !conversations::may_see_private(pool, viewer, peer).await? {
        profile.note = None;
    }
    Ok(profile)
}

/// The one-to-one peers of `list` who may show `me` their note and
/// presence (see [`conversations::peers_shown`]).
pub async fn peers_shown(
    gw: &Gateway,
    tenant: &str,
    me: i64,
    list: &[Conversation],
) -> Result<HashSet<i64>, Refusal> {
    let p2p: Vec<(&str, i64)> = list
        .iter()
        .filter(|c| c.kind == Kind::P2p)
        .map(|c| (c.topic.as_str(), c.peer))
        .collect();
    if p2p.is_empty() {
        return Ok(HashSet::new());
    }
    let pool = pool(gw, tenant)?;
    let listed = conversations::peers_shown(pool, me, &p2p)
        .await
        .map_err(unavailable)?;
    let mut shown: HashSet<i64> = listed
        .iter()
        .filter(|(_, shown)| **shown)
        .map(|(peer, _)| *peer)
        .collect();
    // A conversation just started has no row until the conversations
    // projection catches up; a friend was then shown offline until their
    // presence changed. The write model (which cannot lag) says whether
    // `me` is in it; a friend is shown unless they blocked `me` (whether
    // an unprojected peer wrote there is not known yet: not shown until
    // the projection says so). Only for a few entries: a whole list comes
    // from the projection itself.
    let missing: Vec<(&str, i64)> = p2p
        .into_iter()
        .filter(|(_, peer)| !listed.contains_key(peer))
        .collect();
    if !missing.is_empty() && missing.len() <= UNPROJECTED_PEERS_MAX {
        let mut members = Vec::with_capacity(missing.len());
        let mut redis = gw.redis.clone();
        for (topic, peer) in missing {
            if super::reads::ensure_member(gw, tenant, topic, me)
                .await
                .is_ok()
                && crate::relations::contains(
                    pool,
                    &mut redis,
                    tenant,
                    crate::relations::Set::Friends,
                    peer,
                    me,
                )
                .await
                .map_err(unavailable)?
            {
                members.push(peer);
            }
        }
        let blocked = conversations::blocked_by(pool, me, &members)
            .await
            .map_err(unavailable)?;
        shown.extend(members.into_iter().filter(|p| !blocked.contains(p)));
    }
    Ok(shown)
}

/// Most one-to-one entries of a list checked against the write model when
/// their conversation row is missing (see [`peers_shown`]).
const UNPROJECTED_PEERS_MAX: usize = 4;

/// A conversation entry built from the send path's state (Redis seq, the
/// group cache) for a member, or `None` for anyone else.
async fn live_entry(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    topic: &str,
) -> Result<Option<Conversation>, Refusal> {
    if super::reads::ensure_member(gw, tenant, topic, uid)
        .await
        .is_err()
    {
        return Ok(None);
    }
    let pool = pool(gw, tenant)?;
    let (kind, peer, role, muted, profile) = match tinode::p2p_peer(topic, uid) {
        Some(peer) => (
            Kind::P2p,
            peer,
            None,
            false,
            peer_profile(pool, uid, peer).await.map_err(unavailable)?,
        ),
        None => {
            let standing = gw
                .governance
                .standing(tenant, topic, uid)
                .await
                .map_err(|r| Refusal(r.0, r.1))?;
            let muted =
                matches!(standing, Standing::Member { muted_until: Some(t), .. } if t > now_ms());
            (
                Kind::Grp,
                0,
                standing_role(standing),
                muted,
                conversations::group_profile(pool, topic)
                    .await
                    .map_err(unavailable)?,
            )
        }
    };
    let mut redis = gw.redis.clone();
    let last: Option<i64> = redis::cmd("HGET")
        .arg(TopicKeys::new(tenant, topic).seq())
        .arg("last_seq")
        .query_async(&mut redis)
        .await
        .map_err(unavailable)?;
    let cursors: Option<(i64, i64, i32)> = sqlx::query_as(
        "SELECT read_seq, recv_seq, clear_delid FROM im_subscriptions WHERE topic = ? AND uid = ?",
    )
    .bind(topic)
    .bind(uid)
    .fetch_optional(pool)
    .await
    .map_err(unavailable)?;
    let (read, recv, clear) = cursors.unwrap_or((0, 0, 0));
    let last_seq = last.unwrap_or(0);
    let now = now_ms();
    Ok(Some(Conversation {
        topic: topic.to_string(),
        kind,
        peer,
        role,
        muted,
        last_seq,
        touched_ms: now,
        updated_ms: now,
        last_from: 0,
        preview: None,
        read,
        recv,
        clear: clear as i64,
        unread: (last_seq - read).max(0),
        profile,
    }))
}

/// Which of `uids` have a session online anywhere and do not hide it
/// (a failed read: none).
pub async fn online_users(gw: &Gateway, tenant: &str, uids: &[i64]) -> HashSet<i64> {
    if uids.is_empty() {
        return HashSet::new();
    }
    let keys = TenantKeys::new(tenant);
    let mut pipe = redis::pipe();
    for uid in uids {
        crate::realtime::presence::read_shown(&mut pipe, &keys, *uid);
    }
    let mut redis = gw.redis.clone();
    let flags: Vec<(Option<String>, Option<String>)> =
        pipe.query_async(&mut redis).await.unwrap_or_default();
    uids.iter()
        .zip(flags)
        .filter(|(_, f)| crate::realtime::presence::shown_online(f))
        .map(|(u, _)| *u)
        .collect()
}

/// One `{meta topic="me" sub}` entry, as user `me` sees it: typed, so a
/// list of hundreds is written straight to JSON (no map per entry).
#[derive(Debug, Serialize)]
pub struct MeSub<'a> {
    topic: String,
    acs: Acs,
    updated: String,
    touched: String,
    seq: i64,
    read: i64,
    recv: i64,
    clear: i64,
    online: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    public: Option<Public<'a>>,
    /// The user's own `private` of the chat (the web app's archive flag).
    #[serde(skip_serializing_if = "Option::is_none")]
    private: Option<Value>,
}

use super::personal::{Acs, Personal};

/// A profile as Tinode's `public`: `{fn, photo: {ref}, note}`.
#[derive(Debug)]
pub struct Public<'a>(&'a conversations::Profile);

impl Serialize for Public<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        #[derive(Serialize)]
        struct Photo<'b> {
            #[serde(rename = "ref")]
            reference: &'b str,
        }
        let p = self.0;
        let mut map = s.serialize_map(None)?;
        if let Some(name) = &p.full_name {
            map.serialize_entry("fn", name)?;
        }
        // An empty photo is one removed (Tinode's delete marker).
        if let Some(photo) = p.photo.as_deref().filter(|p| !p.is_empty()) {
            map.serialize_entry("photo", &Photo { reference: photo })?;
        }
        if let Some(note) = p.note.as_deref().filter(|n| !n.is_empty()) {
            map.serialize_entry("note", note)?;
        }
        map.end()
    }
}

/// One entry, with the access the user's own settings leave them
/// ([`Personal`]: blocked, muted, blocked by the peer).
pub fn me_sub_entry<'a>(
    c: &'a Conversation,
    me: i64,
    online: bool,
    personal: &Personal,
) -> MeSub<'a> {
    MeSub {
        topic: tinode::client_topic(&c.topic, me),
        acs: personal.acs(&c.topic, me, &mode_of(c)),
        updated: tinode::timestamp_ms(c.updated_ms),
        touched: tinode::timestamp_ms(c.touched_ms),
        seq: c.last_seq,
        read: c.read,
        recv: c.recv,
        clear: c.clear,
        online,
        public: (!c.profile.is_empty()).then_some(Public(&c.profile)),
        private: personal.private(&c.topic),
    }
}

/// A pending invitation of the user to a group (the members projection).
#[derive(Debug, Clone)]
pub struct Invitation {
    pub topic: String,
    pub invited_ms: i64,
    pub profile: conversations::Profile,
}

/// The user's pending invitations, newest first (at most 100); expired
/// ones (`gateway.invitation_ttl_secs`) are gone.
pub async fn invitations(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    topic: Option<&str>,
) -> Result<Vec<Invitation>, Refusal> {
    let cutoff =
        crate::governance::consent::invitation_cutoff(gw.config.gateway.invitation_ttl_secs);
    let rows: Vec<(crate::exact::Exact, i64, String, Option<String>)> = sqlx::query_as(
        "SELECT i.topic, CAST(UNIX_TIMESTAMP(i.invited_at) * 1000 AS SIGNED), g.name, g.photo \
         FROM im_group_invites i JOIN im_groups g ON g.topic = i.topic \
         WHERE i.uid = ? AND i.invited_at >= ? AND g.status = 'active' \
           AND (? IS NULL OR i.topic = ?) \
         ORDER BY i.invited_at DESC LIMIT 100",
    )
    .bind(uid)
    .bind(cutoff)
    .bind(topic)
    .bind(topic)
    .fetch_all(pool(gw, tenant)?)
    .await
    .map_err(unavailable)?;
    Ok(rows
        .into_iter()
        .map(|(topic, invited_ms, name, photo)| Invitation {
            topic: topic.into_string(),
            invited_ms,
            profile: conversations::Profile {
                full_name: (!name.is_empty()).then_some(name),
                photo,
                note: None,
            },
        })
        .collect())
}

/// An invitation as a `{meta sub}` entry: access given, not wanted yet
/// (Tinode's web app shows Accept / Ignore / Block for it).
pub fn invitation_entry(i: &Invitation) -> MeSub<'_> {
    let when = tinode::timestamp_ms(i.invited_ms);
    MeSub {
        topic: i.topic.clone(),
        acs: Acs {
            want: crate::realtime::frames::INVITED_WANT.into(),
            given: crate::realtime::frames::INVITED_GIVEN.into(),
            mode: crate::realtime::frames::INVITED_WANT.into(),
        },
        updated: when.clone(),
        touched: when,
        seq: 0,
        read: 0,
        recv: 0,
        clear: 0,
        online: false,
        public: (!i.profile.is_empty()).then_some(Public(&i.profile)),
        private: None,
    }
}

/// The `{meta sub}` entries of a list, with their online state and the
/// access the user's own settings leave them.
pub async fn me_sub_entries<'a>(
    gw: &Gateway,
    tenant: &str,
    me: i64,
    list: &'a [Conversation],
    personal: &Personal,
) -> Vec<MeSub<'a>> {
    let online = online_flags(gw, tenant, me, list).await;
    list.iter()
        .zip(online)
        .map(|(c, online)| me_sub_entry(c, me, online, personal))
        .collect()
}

/// The user's own settings as they bear on `list` ([`Personal`]).
pub async fn personal_of(
    gw: &Gateway,
    tenant: &str,
    me: i64,
    list: &[Conversation],
) -> Result<Personal, Refusal> {
    let peers: Vec<i64> = list
        .iter()
        .filter(|c| c.kind == Kind::P2p)
        .map(|c| c.peer)
        .collect();
    Personal::load(pool(gw, tenant)?, me, &peers)
        .await
        .map_err(unavailable)
}

/// Users `me` blocked with whom they share no chat in `list`, as entries
/// of the `me` list (Tinode's web app builds its "Blocked contacts" from
/// the list: an entry whose mode has no `J`), so a block made anywhere
/// can be seen and undone there.
pub async fn blocked_entries(
    gw: &Gateway,
    tenant: &str,
    me: i64,
    list: &[Conversation],
    personal: &Personal,
) -> Result<Vec<BlockedEntry>, Refusal> {
    let mut uids: Vec<i64> = personal
        .blocked
        .iter()
        .copied()
        .filter(|u| !list.iter().any(|c| c.kind == Kind::P2p && c.peer == *u))
        .collect();
    uids.sort_unstable();
    uids.truncate(conversations::MAX_PAGE as usize);
    let profiles = conversations::user_profiles(pool(gw, tenant)?, &uids)
        .await
        .map_err(unavailable)?;
    Ok(uids
        .into_iter()
        .map(|uid| BlockedEntry {
            topic: tinode::p2p_topic(me, uid),
            // Never the note: only someone who shares a chat may see it,
            // and these share none (anyone can block anyone).
            profile: profiles
                .get(&uid)
                .map(|p| conversations::Profile {
                    note: None,
                    ..p.clone()
                })
                .unwrap_or_default(),
        })
        .collect())
}

/// A blocked user with no chat (see [`blocked_entries`]).
#[derive(Debug, Clone)]
pub struct BlockedEntry {
    /// The one-to-one topic the two would have (stored name).
    pub topic: String,
    pub profile: conversations::Profile,
}

/// A [`BlockedEntry`] as a `{meta sub}` entry: no history, not joined.
pub fn blocked_entry<'a>(b: &'a BlockedEntry, me: i64, personal: &Personal) -> MeSub<'a> {
    let never = tinode::timestamp_ms(0);
    MeSub {
        topic: tinode::client_topic(&b.topic, me),
        acs: personal.acs(&b.topic, me, P2P_MODE),
        updated: never.clone(),
        touched: never,
        seq: 0,
        read: 0,
        recv: 0,
        clear: 0,
        online: false,
        public: (!b.profile.is_empty()).then_some(Public(&b.profile)),
        private: personal.private(&b.topic),
    }
}

/// Each conversation's `online`, as Tinode shows it in the `me` topic: a
/// one-to-one peer with a session anywhere (only a peer who shares the
/// conversation and did not block `me`); a group with another member
/// attached to it somewhere (what lets a client show who is typing). One
/// Redis round trip; a failed read counts as offline.
pub async fn online_flags(gw: &Gateway, tenant: &str, me: i64, list: &[Conversation]) -> Vec<bool> {
    let shown = peers_shown(gw, tenant, me, list).await.unwrap_or_default();
    let peers: Vec<i64> = list
        .iter()
        .filter(|c| c.kind == Kind::P2p && shown.contains(&c.peer))
        .map(|c| c.peer)
        .collect();
    let users = online_users(gw, tenant, &peers).await;
    let groups: Vec<&str> = list
        .iter()
        .filter(|c| c.kind == Kind::Grp)
        .map(|c| c.topic.as_str())
        .collect();
    let attached = groups_with_others_shown(gw, tenant, me, &groups).await;
    list.iter()
        .map(|c| match c.kind {
            Kind::P2p => users.contains(&c.peer),
            Kind::Grp => attached.contains(c.topic.as_str()),
        })
        .collect()
}

/// Members of each group's attached set looked at for its `online`.
const ATTACHED_SAMPLE: usize = 8;

/// Which of `groups` someone other than `me` shows as attached to (a
/// sample of each group's attached members, without the ones who hide
/// when online): the group's `online` in `me`'s list. Two Redis round
/// trips; a failed read counts as nobody.
pub async fn groups_with_others_shown<'a>(
    gw: &Gateway,
    tenant: &str,
    me: i64,
    groups: &[&'a str],
) -> HashSet<&'a str> {
    if groups.is_empty() {
        return HashSet::new();
    }
    let mut pipe = redis::pipe();
    for topic in groups {
        pipe.srandmember_multiple(
            TopicKeys::new(tenant, topic).online_members(),
            ATTACHED_SAMPLE,
        );
    }
    let mut redis = gw.redis.clone();
    let samples: Vec<Vec<i64>> = pipe.query_async(&mut redis).await.unwrap_or_default();
    let mut others: Vec<i64> = samples
        .iter()
        .flatten()
        .copied()
        .filter(|u| *u != me)
        .collect();
    others.sort_unstable();
    others.dedup();
    let shown = online_users(gw, tenant, &others).await;
    groups
        .iter()
        .zip(samples)
        .filter(|(_, sample)| sample.iter().any(|u| shown.contains(u)))
        .map(|(topic, _)| *topic)
        .collect()
}

/// The same list for HTTP: with `unread` and the last message's preview.
pub fn http_entry(c: &Conversation, me: i64, online: bool, personal: &Personal) -> Value {
    let mut entry =
        serde_json::to_value(me_sub_entry(c, me, online, personal)).expect("an entry serializes");
    entry["unread"] = json!(c.unread);
    entry["kind"] = json!(c.kind.as_str());
    if c.last_seq > 0 {
        entry["last"] = json!({
            "seq": c.last_seq,
            "from": tinode::user_id(c.last_from),
            "ts": tinode::timestamp_ms(c.touched_ms),
            "preview": c.preview,
        });
    }
    entry
}

/// A page of a group's members (`{get topic=grp what="sub"}`).
pub async fn group_members(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    viewer: i64,
    q: Option<&tinode::SubQuery>,
) -> Result<Vec<Value>, Refusal> {
    let only = match q.and_then(|q| q.user.as_deref()) {
        None => None,
        Some(user) => Some(
            tinode::parse_user_id(user)
                .ok_or_else(|| Refusal(400, "malformed: sub.user".into()))?,
        ),
    };
    let since = match q.and_then(|q| q.ims.as_deref()) {
        None => None,
        Some(ims) => Some(
            tinode::parse_timestamp_ms(ims)
                .ok_or_else(|| Refusal(400, "malformed: ims is not a timestamp".into()))?,
        ),
    };
    let limit = q
        .and_then(|q| q.limit)
        .filter(|l| *l > 0)
        .unwrap_or(DEFAULT_MEMBER_PAGE);
    let mut members = conversations::members(pool(gw, tenant)?, topic, only, 0, since, limit)
        .await
        .map_err(unavailable)?;
    // A member shows their note and presence only to members of a group
    // they took part in of their own accord or to friends, never to
    // someone they blocked (see [`conversations::members_shown`]).
    let uids: Vec<i64> = members.iter().map(|m| m.uid).collect();
    let shown = if uids.is_empty() {
        HashSet::new()
    } else {
        conversations::members_shown(pool(gw, tenant)?, viewer, topic, &uids)
            .await
            .map_err(unavailable)?
    };
    for m in members.iter_mut().filter(|m| !shown.contains(&m.uid)) {
        m.profile.note = None;
    }
    // Online: attached to the topic somewhere, and not hiding it.
    let keys = TopicKeys::new(tenant, topic);
    let mut pipe = redis::pipe();
    for m in &members {
        pipe.sismember(keys.online_members(), m.uid);
    }
    let mut redis = gw.redis.clone();
    let attached: Vec<bool> = if members.is_empty() {
        Vec::new()
    } else {
        pipe.query_async(&mut redis).await.unwrap_or_default()
    };
    let attached: Vec<i64> = members
        .iter()
        .zip(attached)
        .filter(|(_, a)| *a)
        .map(|(m, _)| m.uid)
        .collect();
    let not_hidden = online_users(gw, tenant, &attached).await;
    Ok(members
        .iter()
        .map(|m| {
            let online = not_hidden.contains(&m.uid) && shown.contains(&m.uid);
            member_entry(m, online)
        })
        .collect())
}

fn member_entry(m: &Member, online: bool) -> Value {
    let mut entry = json!({
        "user": tinode::user_id(m.uid),
        "acs": acs(&access_mode(Some(m.role), m.muted)),
        "role": m.role.as_str(),
        "updated": tinode::timestamp_ms(m.updated_ms),
        "read": m.read,
        "recv": m.recv,
        "online": online,
    });
    if !m.profile.is_empty() {
        entry["public"] = m.profile.public();
    }
    entry
}

/// The user's `acs` in one chat (`topic` as stored) from the mode their
/// standing gives, with their own settings applied ([`Personal`]).
pub async fn topic_acs(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    topic: &str,
    base: &str,
) -> Result<Acs, Refusal> {
    let personal = Personal::load_for(pool(gw, tenant)?, uid, topic)
        .await
        .map_err(unavailable)?;
    Ok(personal.acs(topic, uid, base))
}

/// A member's access mode in a group, from their standing.
pub fn standing_mode(standing: Standing) -> String {
    match standing {
        Standing::Member { role, muted_until } => {
            access_mode(Some(role), muted_until.is_some_and(|t| t > now_ms()))
        }
        _ => "N".into(),
    }
}

/// The role of a standing, for display.
pub fn standing_role(standing: Standing) -> Option<Role> {
    match standing {
        Standing::Member { role, .. } => Some(role),
        _ => None,
    }
}

/// A text field of a `public` object: absent → `None` (unchanged); a
/// string within `max` characters; anything else is refused.
fn text_field(public: &Value, name: &str, max: usize) -> Result<Option<String>, Refusal> {
    match public.get(name) {
        None | Some(Value::Null) => Ok(None),
        // Tinode's delete marker: the field is cleared.
        Some(Value::String(s)) if s == tinode::DEL_CHAR => Ok(Some(String::new())),
        Some(Value::String(s)) if s.chars().count() <= max => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(Refusal(
            400,
            format!("malformed: public.{name} is longer than {max} characters"),
        )),
        Some(_) => Err(Refusal(
            400,
            format!("malformed: public.{name} must be text"),
        )),
    }
}

/// `public.photo`: a reference (`{"ref": url}` or a URL string), or a
/// small picture inline (`{"data", "type"}`), kept as a `data:` URI.
fn photo_field(public: &Value) -> Result<Option<String>, Refusal> {
    let reference = match public.get("photo") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        // Tinode's clients send a small picture inline (`data`, with `ref`
        // the delete marker to drop an older reference) and a large one as
        // an uploaded file's `ref` (with `data` the delete marker).
        Some(Value::Object(o)) => {
            let data = o
                .get("data")
                .filter(|d| d.as_str() != Some(tinode::DEL_CHAR));
            match (data, o.get("ref")) {
                (Some(Value::String(data)), _) => inline_photo(data, o.get("type"))?,
                (Some(_), _) => return Err(Refusal(400, "malformed: public.photo.data".into())),
                (None, Some(Value::String(r))) => r.clone(),
                _ => return Err(Refusal(400, "malformed: public.photo".into())),
            }
        }
        Some(_) => return Err(Refusal(400, "malformed: public.photo".into())),
    };
    // Tinode's delete marker: no picture any more.
    if reference == tinode::DEL_CHAR {
        return Ok(Some(String::new()));
    }
    if reference.chars().count() > MAX_PHOTO_CHARS {
        return Err(Refusal(
            413,
            format!(
                "public.photo is longer than {MAX_PHOTO_CHARS} characters: upload the picture and pass its reference"
            ),
        ));
    }
    Ok(Some(reference))
}

/// Picture types kept inline (raster images a browser shows in `<img>`).
const INLINE_PHOTO_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// A picture sent as base64 bytes, as the `data:` URI it is kept as.
fn inline_photo(data: &str, kind: Option<&Value>) -> Result<String, Refusal> {
    // Tinode's web app names the subtype alone (`png`).
    let kind = match kind.and_then(Value::as_str).unwrap_or("image/jpeg") {
        k if k.contains('/') => k.to_string(),
        k => format!("image/{k}"),
    };
    if !INLINE_PHOTO_TYPES.contains(&kind.as_str()) {
        return Err(Refusal(
            415,
            format!(
                "public.photo.type must be one of {}",
                INLINE_PHOTO_TYPES.join(", ")
            ),
        ));
    }
    let base64 = data.len() % 4 == 0
        && !data.is_empty()
        && data
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=');
    if !base64 {
        return Err(Refusal(
            400,
            "malformed: public.photo.data is not base64".into(),
        ));
    }
    Ok(format!("data:{kind};base64,{data}"))
}

/// A user's `public` as a profile change.
pub fn user_profile_change(public: &Value) -> Result<ProfileChanged, Refusal> {
    if !public.is_object() {
        return Err(Refusal(400, "malformed: public must be an object".into()));
    }
    let change = ProfileChanged {
        full_name: text_field(public, "fn", MAX_NAME_CHARS)?,
        photo: photo_field(public)?,
        note: text_field(public, "note", MAX_NOTE_CHARS)?,
    };
    if change == ProfileChanged::default() {
        return Err(Refusal(
            400,
            "malformed: nothing to change in public".into(),
        ));
    }
    Ok(change)
}

/// A group's `public` as a profile change (`fn` is the group's name, as
/// Tinode clients show it; `name` is accepted too).
pub fn group_profile_change(public: &Value) -> Result<GroupProfileChanged, Refusal> {
    if !public.is_object() {
        return Err(Refusal(400, "malformed: public must be an object".into()));
    }
    let name = match text_field(public, "fn", MAX_NAME_CHARS)? {
        Some(n) => Some(n),
        None => text_field(public, "name", MAX_NAME_CHARS)?,
    };
    let description = match text_field(public, "note", MAX_DESCRIPTION_CHARS)? {
        Some(d) => Some(d),
        None => text_field(public, "description", MAX_DESCRIPTION_CHARS)?,
    };
    let change = GroupProfileChanged {
        name,
        photo: photo_field(public)?,
        description,
    };
    if change == GroupProfileChanged::default() {
        return Err(Refusal(
            400,
            "malformed: nothing to change in public".into(),
        ));
    }
    Ok(change)
}

/// Most one-to-one peers told when a user comes online or goes offline
/// (the most recently active conversations first).
pub const PRESENCE_PEERS_MAX: i64 = 200;

/// Tells the user's one-to-one peers (their chat lists) that the user came
/// online (`what="on"`) or went offline (`"off"`): only in conversations
/// the user took part in or with friends (see
/// [`conversations::may_see_private`]), never a peer the user blocked nor
/// one who deleted the chat (Tinode's web app throws on the presence of a
/// chat it no longer has), and "on" to nobody while the user hides it
/// (incognito). Best effort: presence is a hint, a lost one is corrected by
/// the next list read.
pub async fn announce_to_peers(gw: &Gateway, tenant: &str, uid: i64, what: &str) {
    let Ok(pool) = pool(gw, tenant) else { return };
    // An "off" reveals nothing and ends an "on" told before the user hid.
    if what == "off" {
        return tell_peers(gw, tenant, uid, what).await;
    }
    match crate::relations::incognito(pool, uid).await {
        Ok(false) => tell_peers(gw, tenant, uid, what).await,
        Ok(true) => {}
        Err(e) => tracing::warn!(error = %e, "incognito unreadable: presence not told"),
    }
}

/// Tells the peers [`announce_to_peers`] names, whether or not the user
/// hides (the change of incognito itself: "off" as it starts, "on" as it
/// ends).
pub async fn tell_peers(gw: &Gateway, tenant: &str, uid: i64, what: &str) {
    let Ok(pool) = pool(gw, tenant) else { return };
    let peers: Vec<i64> = match sqlx::query_scalar(
        "SELECT c.peer_uid FROM im_conversations c \
         LEFT JOIN im_conversation_topics t ON t.topic = c.topic \
         WHERE c.uid = ? AND c.kind = 'p2p' \
           AND (c.engaged = 1 OR EXISTS (SELECT 1 FROM im_friends f WHERE f.uid = ? AND f.friend_uid = c.peer_uid)) \
           AND NOT EXISTS (SELECT 1 FROM im_blocks b WHERE b.uid = ? AND b.blocked_uid = c.peer_uid) \
           AND NOT EXISTS (SELECT 1 FROM im_chat_settings h WHERE h.uid = c.peer_uid \
             AND h.topic = c.topic AND h.hidden_until_seq >= COALESCE(t.last_seq, 0) \
             AND h.hidden_until_seq > 0) \
         ORDER BY t.touched_ms DESC LIMIT ?",
    )
    .bind(uid)
    .bind(uid)
    .bind(uid)
    .bind(PRESENCE_PEERS_MAX)
    .fetch_all(pool)
    .await
    {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "peers for presence unreadable");
            return;
        }
    };
    let mut redis = gw.redis.clone();
    for peer in peers {
        let envelope =
            crate::realtime::Envelope::presence_to(new_event_id(), tenant, peer, uid, what);
        if let Err(e) = crate::realtime::bus::publish(&mut redis, None, &envelope).await {
            tracing::warn!(error = %e, "presence to a peer not published");
            return;
        }
    }
}

/// Produces the user's `ProfileChanged`; returns its event id.
pub async fn set_user_profile(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    change: ProfileChanged,
) -> Result<String, Refusal> {
    let event = UserEvent {
        event_id: new_event_id(),
        tenant_id: tenant.to_string(),
        uid,
        occurred_at: now_ms(),
        actor_uid: uid,
        body: UserEventBody::ProfileChanged(change),
    };
    gw.sender
        .producer()
        .send(TopicKind::UserEvents, &event.key(), &event, None)
        .await
        .map_err(unavailable)?;
    Ok(event.event_id)
}
