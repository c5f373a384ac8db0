//! What a user sets for themselves that changes their access to a chat,
//! in Tinode's terms (issue 40): blocking the peer of a one-to-one chat is
//! a `want` without `J` (the web app's Block sends its want minus `J` and
//! `P`), muting a chat is a `want` without `P`, and a peer who blocked the
//! user takes `W` out of what the user is `given` (the app then shows
//! "Messaging disabled"). Blocks and mutes are the same events the HTTP
//! routes produce (`UserBlocked`/`UserUnblocked`, `PushSettingsChanged`),
//! put in force before the answer ([`put_in_force`]).

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use serde_json::json;
use sqlx::mysql::MySqlPool;

use crate::events::{
    BlockRef, ChatSettings, IncognitoChanged, PushSettingsChanged, UserEvent, UserEventBody,
};
use crate::kafka::topics::TopicKind;
use crate::relations::Versioned;
use crate::tinode;

use super::refusal::Refusal;
use super::Gateway;

/// Tinode's access mode letters, in their order.
const LETTERS: &str = "JRWPASDO";

/// What a user is given on `me`.
pub const ME_MODE: &str = "JPS";

/// Tinode's `acs`: what the user wants, what they are given, and the mode
/// in force (both).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Acs {
    pub want: String,
    pub given: String,
    pub mode: String,
}

impl Acs {
    /// Wanted and given alike.
    pub fn plain(mode: &str) -> Acs {
        Acs {
            want: mode.to_string(),
            given: mode.to_string(),
            mode: mode.to_string(),
        }
    }

    fn of(want: String, given: String) -> Acs {
        let mode = LETTERS
            .chars()
            .filter(|c| want.contains(*c) && given.contains(*c))
            .collect::<String>();
        Acs {
            want: or_none(want),
            given: or_none(given),
            mode: or_none(mode),
        }
    }

    /// The user's `acs` of `me`: `P` wanted unless hiding when online.
    pub fn me(incognito: bool) -> Acs {
        let want = if incognito {
            ME_MODE.replace('P', "")
        } else {
            ME_MODE.to_string()
        };
        Acs::of(want, ME_MODE.to_string())
    }

    pub fn json(&self) -> serde_json::Value {
        json!({"want": self.want, "given": self.given, "mode": self.mode})
    }
}

fn or_none(mode: String) -> String {
    if mode.is_empty() {
        "N".into()
    } else {
        mode
    }
}

fn without(mode: &str, letter: char, drop: bool) -> String {
    if drop {
        mode.replace(letter, "")
    } else {
        mode.to_string()
    }
}

/// The user's own settings that shape how they see their chats: whom they
/// blocked, who of the peers asked about blocked them, which chats they
/// muted, and each chat's own settings (hidden, `private`). Read from
/// MySQL, the ground truth the write-through and the relations projection
/// keep.
#[derive(Debug, Clone, Default)]
pub struct Personal {
    pub blocked: HashSet<i64>,
    pub blocked_by: HashSet<i64>,
    pub muted: HashSet<String>,
    /// By stored topic name.
    pub chats: HashMap<String, ChatSettings>,
}

impl Personal {
    /// Everything the user set, and which of `peers` blocked them.
    pub async fn load(pool: &MySqlPool, uid: i64, peers: &[i64]) -> sqlx::Result<Personal> {
        let blocked: Vec<i64> =
            sqlx::query_scalar("SELECT blocked_uid FROM im_blocks WHERE uid = ?")
                .bind(uid)
                .fetch_all(pool)
                .await?;
        let muted: Vec<crate::exact::Exact> =
            sqlx::query_scalar("SELECT topic FROM im_push_muted_topics WHERE uid = ?")
                .bind(uid)
                .fetch_all(pool)
                .await?;
        let mut blocked_by = HashSet::new();
        for chunk in peers.chunks(500) {
            let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                "SELECT uid FROM im_blocks WHERE blocked_uid = ",
            );
            q.push_bind(uid).push(" AND uid IN (");
            let mut list = q.separated(", ");
            for p in chunk {
                list.push_bind(*p);
            }
            q.push(")");
            let rows: Vec<i64> = q.build_query_scalar().fetch_all(pool).await?;
            blocked_by.extend(rows);
        }
        Ok(Personal {
            blocked: blocked.into_iter().collect(),
            blocked_by,
            muted: muted.into_iter().map(|t| t.into_string()).collect(),
            chats: chat_settings(pool, uid, None).await?,
        })
    }

    /// Only what bears on one chat (`topic` as stored).
    pub async fn load_for(pool: &MySqlPool, uid: i64, topic: &str) -> sqlx::Result<Personal> {
        let peer = tinode::p2p_peer(topic, uid).unwrap_or(0);
        let (blocked, blocked_by, muted): (i64, i64, i64) = sqlx::query_as(
            "SELECT \
               EXISTS(SELECT 1 FROM im_blocks WHERE uid = ? AND blocked_uid = ?), \
               EXISTS(SELECT 1 FROM im_blocks WHERE uid = ? AND blocked_uid = ?), \
               EXISTS(SELECT 1 FROM im_push_muted_topics WHERE uid = ? AND topic = ?)",
        )
        .bind(uid)
        .bind(peer)
        .bind(peer)
        .bind(uid)
        .bind(uid)
        .bind(topic)
        .fetch_one(pool)
        .await?;
        let mut p = Personal::default();
        if blocked == 1 {
            p.blocked.insert(peer);
        }
        if blocked_by == 1 {
            p.blocked_by.insert(peer);
        }
        if muted == 1 {
            p.muted.insert(topic.to_string());
        }
        p.chats = chat_settings(pool, uid, Some(topic)).await?;
        Ok(p)
    }

    /// The user's settings of one chat (defaults when none).
    pub fn chat(&self, topic: &str) -> ChatSettings {
        self.chats.get(topic).cloned().unwrap_or(ChatSettings {
            topic: topic.to_string(),
            ..Default::default()
        })
    }

    /// The chat's `private` as Tinode shows it, if any.
    pub fn private(&self, topic: &str) -> Option<serde_json::Value> {
        let text = self.chats.get(topic)?.private.as_deref()?;
        serde_json::from_str(text).ok()
    }

    /// The user's `acs` in `topic` (stored name), starting from the mode
    /// their standing gives (`base`): a blocked peer's chat is not joined
    /// (`J`), a muted chat not notified (`P`), a peer who blocked the user
    /// gives them no `W`.
    pub fn acs(&self, topic: &str, me: i64, base: &str) -> Acs {
        let peer = tinode::p2p_peer(topic, me);
        let blocked = peer.is_some_and(|p| self.blocked.contains(&p));
        let blocked_by = peer.is_some_and(|p| self.blocked_by.contains(&p));
        let muted = self.muted.contains(topic);
        let want = without(&without(base, 'J', blocked), 'P', muted || blocked);
        let given = without(base, 'W', blocked_by);
        Acs::of(want, given)
    }
}

/// `uid`'s settings of every chat (or of one), by topic.
async fn chat_settings(
    pool: &MySqlPool,
    uid: i64,
    topic: Option<&str>,
) -> sqlx::Result<HashMap<String, ChatSettings>> {
    let rows: Vec<(crate::exact::Exact, i64, Option<String>, i64)> = sqlx::query_as(
        "SELECT topic, hidden_until_seq, private, version FROM im_chat_settings \
         WHERE uid = ? AND (? IS NULL OR topic = ?)",
    )
    .bind(uid)
    .bind(topic)
    .bind(topic)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(topic, hidden_until_seq, private, version)| {
            let topic = topic.into_string();
            let settings = ChatSettings {
                topic: topic.clone(),
                hidden_until_seq,
                private,
                version,
            };
            (topic, settings)
        })
        .collect())
}

/// Which of `uid`'s one-to-one chats are hidden, up to which seq (a chat
/// the user deleted, until a later message).
pub async fn hidden_chats(pool: &MySqlPool, uid: i64) -> sqlx::Result<HashMap<String, i64>> {
    let rows: Vec<(crate::exact::Exact, i64)> = sqlx::query_as(
        "SELECT topic, hidden_until_seq FROM im_chat_settings \
         WHERE uid = ? AND hidden_until_seq > 0",
    )
    .bind(uid)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(t, s)| (t.into_string(), s))
        .collect())
}

/// A user's setting, put in force by [`put_in_force`].
#[derive(Debug, Clone)]
pub enum Setting {
    /// Block (or unblock) another user.
    Block { other: i64, blocked: bool },
    /// Mute (or unmute) a chat (`topic` as stored).
    Mute { topic: String, muted: bool },
    /// A change of one chat's own settings (`topic` as stored), applied
    /// to what is stored under the user's lock.
    Chat { topic: String, change: ChatChange },
    /// Hide (or show again) when the user is online (incognito).
    Incognito { on: bool },
}

/// A change of a chat's own settings.
#[derive(Debug, Clone)]
pub enum ChatChange {
    /// Hidden from the list up to this seq (a later message shows it).
    Hide { until_seq: i64 },
    /// Tinode's `private`, merged: each key set, or removed by the delete
    /// marker (`␡`).
    Private(serde_json::Map<String, serde_json::Value>),
}

impl ChatChange {
    /// `current` with this change applied; a `private` past
    /// [`crate::fields::CHAT_PRIVATE_CHARS`] is refused (`413`).
    pub fn apply(&self, mut current: ChatSettings) -> Result<ChatSettings, Refusal> {
        current.version += 1;
        match self {
            ChatChange::Hide { until_seq } => {
                current.hidden_until_seq = current.hidden_until_seq.max(*until_seq);
            }
            ChatChange::Private(patch) => {
                let mut private: serde_json::Map<String, serde_json::Value> = current
                    .private
                    .as_deref()
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or_default();
                for (key, value) in patch {
                    if value.as_str() == Some(tinode::DEL_CHAR) || value.is_null() {
                        private.remove(key);
                    } else {
                        private.insert(key.clone(), value.clone());
                    }
                }
                current.private = if private.is_empty() {
                    None
                } else {
                    let text = serde_json::Value::Object(private).to_string();
                    if text.chars().count() > crate::fields::CHAT_PRIVATE_CHARS {
                        return Err(Refusal(
                            413,
                            format!(
                                "private is too large (at most {} characters as JSON)",
                                crate::fields::CHAT_PRIVATE_CHARS
                            ),
                        ));
                    }
                    Some(text)
                };
            }
        }
        Ok(current)
    }
}

impl Setting {
    /// The versioned block or mute this is, if it is one.
    fn versioned(&self) -> Option<(Versioned, bool)> {
        match self {
            Setting::Block { other, blocked } => {
                Some((Versioned::Block { other: *other }, *blocked))
            }
            Setting::Mute { topic, muted } => Some((
                Versioned::Mute {
                    topic: topic.clone(),
                },
                *muted,
            )),
            Setting::Incognito { on } => Some((Versioned::Incognito, *on)),
            Setting::Chat { .. } => None,
        }
    }

    /// Its event: a block or mute of `version`, or the chat's settings as
    /// they become.
    fn body(&self, version: i64, chat: Option<&ChatSettings>) -> UserEventBody {
        match self {
            Setting::Block {
                other,
                blocked: true,
            } => UserEventBody::UserBlocked(BlockRef {
                blocked_uid: *other,
                version,
            }),
            Setting::Block {
                other,
                blocked: false,
            } => UserEventBody::UserUnblocked(BlockRef {
                blocked_uid: *other,
                version,
            }),
            Setting::Mute { topic, muted } => {
                UserEventBody::PushSettingsChanged(PushSettingsChanged {
                    dnd: None,
                    topic: Some(topic.clone()),
                    topic_muted: *muted,
                    version,
                })
            }
            Setting::Incognito { on } => UserEventBody::IncognitoChanged(IncognitoChanged {
                incognito: *on,
                version,
            }),
            Setting::Chat { .. } => {
                UserEventBody::ChatSettingsChanged(chat.cloned().unwrap_or_default())
            }
        }
    }
}

/// How long one setting may hold the user's lock (its produce and its
/// write-through take milliseconds; the producer gives up well before).
const SETTINGS_LOCK_MS: u64 = 30_000;

/// A block, unblock, mute, unmute, incognito or chat setting, in effect before the
/// call answers (issue 39: a send right after an acknowledged block was
/// delivered while the relations pipeline had not projected it yet): its
/// event goes to the
/// log, then it is written to MySQL and Redis as the projection writes it
/// (a failure there leaves the projection to apply it, and the caller's
/// retry to finish it). One at a time per user, from produce to
/// write-through, so the writes happen in log order and the last one
/// written is the last event, as the projection's last write is: a late
/// write of an earlier block can never land after a later unblock.
/// Returns the event's id.
pub async fn put_in_force(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    setting: Setting,
) -> Result<String, Refusal> {
    let pool = gw.pools.get(tenant).map_err(Refusal::unavailable)?;
    let mut redis = gw.redis.clone();
    let key = crate::keys::UserKeys::new(tenant, uid).blocks_lock();
    // Another of the user's settings holds it for milliseconds: wait a little.
    let lock = crate::redis_util::RedisLock::acquire_waiting(
        &mut redis,
        &key,
        SETTINGS_LOCK_MS,
        std::time::Duration::from_secs(2),
    )
    .await
    .map_err(Refusal::unavailable)?
    .ok_or_else(|| {
        Refusal(
            503,
            "another change of your settings is in progress; try again".into(),
        )
    })?;
    let done = async {
        // A chat's settings change from what is stored now, read under
        // the lock: two changes of the user never lose one another.
        let chat = match &setting {
            Setting::Chat { topic, change } => {
                let stored = chat_settings(pool, uid, Some(topic))
                    .await
                    .map_err(Refusal::unavailable)?;
                let current = stored.get(topic.as_str()).cloned().unwrap_or(ChatSettings {
                    topic: topic.clone(),
                    ..Default::default()
                });
                Some(change.apply(current)?)
            }
            _ => None,
        };
        // A block's, mute's or incognito's version, handed out before the
        // event is produced (see `relations::reserve_version`).
        let versioned = setting.versioned();
        let version = match &versioned {
            Some((what, _)) => {
                crate::relations::reserve_version(pool, uid, what, crate::events::now_ms())
                    .await
                    .map_err(Refusal::unavailable)?
            }
            None => 0,
        };
        let event = UserEvent::new(tenant, uid, uid, setting.body(version, chat.as_ref()));
        gw.sender
            .producer()
            .send(TopicKind::UserEvents, &event.key(), &event, None)
            .await
            .map_err(Refusal::unavailable)?;
        match (&versioned, &chat) {
            (Some((what, on)), _) => {
                crate::relations::set_versioned(pool, &mut redis, tenant, uid, what, *on, version)
                    .await
                    .map(|_| ())
            }
            (None, chat) => {
                let chat = chat
                    .as_ref()
                    .expect("a setting that is not versioned is a chat's");
                crate::relations::set_chat_settings(pool, uid, chat).await
            }
        }
        .map_err(Refusal::unavailable)?;
        Ok(event.event_id)
    }
    .await;
    let mut redis = gw.redis.clone();
    let _ = lock.release(&mut redis).await;
    done
}

/// Whether `uid` hides when online (incognito): their presence says, or
/// else MySQL (after a Redis loss the presence comes back only with a
/// login); unreadable, hidden, since being shown against one's wish is
/// worse than a missing hint.
pub async fn hides_presence(gw: &Gateway, tenant: &str, uid: i64) -> bool {
    let mut redis = gw.redis.clone();
    if let Some(hidden) = crate::realtime::presence::hidden(&mut redis, tenant, uid).await {
        return hidden;
    }
    match gw.pools.get(tenant) {
        Ok(pool) => crate::relations::incognito(pool, uid).await.unwrap_or(true),
        Err(_) => true,
    }
}

/// Tells `peer`, whom `uid` blocked (or unblocked), that they may no
/// longer write there (or may again): Tinode's change of what they are
/// given, `{pres topic="me" src=usr<uid> what="acs" dacs={given:"-W"}}`,
/// to every session of theirs, when the chat is in their list (the web app
/// fails on a change of a chat it does not know). Best effort: their next
/// read of the chat shows it anyway.
pub async fn tell_peer_of_block(gw: &Gateway, tenant: &str, uid: i64, peer: i64, blocked: bool) {
    let Ok(pool) = gw.pools.get(tenant) else {
        return;
    };
    let topic = tinode::p2p_topic(uid, peer);
    let known: Option<i64> =
        match sqlx::query_scalar("SELECT 1 FROM im_conversations WHERE uid = ? AND topic = ?")
            .bind(peer)
            .bind(&topic)
            .fetch_optional(pool)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "the peer's chat list could not be read");
                return;
            }
        };
    if known.is_none() {
        return;
    }
    let given = if blocked { "-W" } else { "+W" };
    let pres = json!({"pres": {"topic": "me", "src": tinode::user_id(uid), "what": "acs",
        "dacs": {"given": given}}});
    let envelope = crate::realtime::Envelope::to_user(
        crate::events::new_event_id(),
        tenant,
        peer,
        pres.to_string(),
    );
    let mut redis = gw.redis.clone();
    if let Err(e) = crate::realtime::bus::publish(&mut redis, None, &envelope).await {
        tracing::warn!(error = %e, "a block not told to the peer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: i64 = 5;
    const PEER: i64 = 9;

    fn p2p() -> String {
        tinode::p2p_topic(ME, PEER)
    }

    #[test]
    fn nothing_set_leaves_the_base_mode() {
        let acs = Personal::default().acs(&p2p(), ME, "JRWPA");
        assert_eq!(acs, Acs::plain("JRWPA"));
    }

    #[test]
    fn blocking_the_peer_drops_join_and_notify_from_want() {
        let mut p = Personal::default();
        p.blocked.insert(PEER);
        let acs = p.acs(&p2p(), ME, "JRWPA");
        assert_eq!(acs.want, "RWA");
        assert_eq!(acs.given, "JRWPA");
        assert_eq!(acs.mode, "RWA");
    }

    #[test]
    fn being_blocked_takes_write_from_given() {
        let mut p = Personal::default();
        p.blocked_by.insert(PEER);
        let acs = p.acs(&p2p(), ME, "JRWPA");
        assert_eq!(acs.want, "JRWPA");
        assert_eq!(acs.given, "JRPA");
        assert_eq!(acs.mode, "JRPA");
    }

    #[test]
    fn a_muted_group_is_wanted_without_notify() {
        let mut p = Personal::default();
        p.muted.insert("grpX".into());
        let acs = p.acs("grpX", ME, "JRWPASDO");
        assert_eq!(acs.want, "JRWASDO");
        assert_eq!(acs.mode, "JRWASDO");
        // A block names a user, never a group.
        p.blocked.insert(PEER);
        assert_eq!(p.acs("grpY", ME, "JRWPS"), Acs::plain("JRWPS"));
    }
}
