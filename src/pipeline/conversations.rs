//! The conversations pipeline's handler: group events → the chat list read
//! model of [`crate::conversations`].
//!
//! - `MessageSent`: the topic's row (last seq, activity, preview — the
//!   greatest seq wins, so any order and redelivery converge) and the
//!   sender's own read/recv cursor (what one sends is read); a one-to-one
//!   topic's first message puts it in both users' lists. Coalesced per
//!   batch: one row per topic and one per sender, never one per member.
//!   A sender's row is marked `engaged` (they took part of their own
//!   accord: what shows their note and presence to the others), once per
//!   user and topic, and a one-to-one peer is told the new writer is online.
//! - `GroupCreated` / `MemberJoined` / `MemberLeft` / `GroupDissolved`: the
//!   per-user rows, in log order per topic (the owner, and whoever joined by
//!   their own command, engaged; members added by others not).
//! - `HistoryCleared`: the user's clear id; `MessageRecalled` /
//!   `MessageDeleted` of the last message (or of the message the last one
//!   edits): its preview is withdrawn; `MessageEdited` in place of the last
//!   message: the preview shows the new text. Both apply to the batch's
//!   pending newest message too, so a batch (a replay's above all) ends
//!   where one event at a time would.
//!
//! After each MySQL commit the hot copy follows (`conversations::hot`): the
//! touched topics' states are read back and written, cursors moved, and the
//! lists of users whose memberships changed dropped. A Redis failure fails
//! the records, which are applied again (every write is idempotent).

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use crate::redis_util::Redis;
use chrono::{DateTime, TimeZone, Utc};
use sqlx::mysql::MySqlPool;

use crate::conversations::hot::{self, CursorMove, HotError};
use crate::conversations::{preview, Kind};
use crate::events::{EventCodec, GroupEvent, GroupEventBody};
use crate::failure::{redis_failure, FailureKind};
use crate::tenant::{db_failure, TenantPools};
use crate::tinode;

use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

/// One-to-one topics already known to have both users' rows (so a busy
/// pair costs no extra write per message); forgotten when it grows past this.
const KNOWN_P2P_MAX: usize = 100_000;

pub struct ConversationsHandler {
    codec: EventCodec,
    pools: TenantPools,
    /// The lists' hot copy, written after each MySQL commit.
    redis: Redis,
    known_p2p: Mutex<HashSet<(String, String)>>,
    /// (tenant, topic, uid) whose row is known to be `engaged` (a sender's):
    /// a member who writes often costs one write, not one per batch.
    /// Forgotten for a user who leaves (a new row starts unengaged).
    known_engaged: Mutex<HashSet<(String, String, i64)>>,
}

impl ConversationsHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, redis: Redis) -> Self {
        Self {
            codec,
            pools,
            redis,
            known_p2p: Mutex::new(HashSet::new()),
            known_engaged: Mutex::new(HashSet::new()),
        }
    }
}

/// A failed write, classified for the runner.
fn hot_failure(e: HotError) -> (FailureKind, String) {
    match e {
        HotError::Db(e) => (db_failure(&e), format!("mysql: {e}")),
        HotError::Redis(e) => (redis_failure(&e), format!("redis: {e}")),
    }
}

/// The newest message of a topic in a batch.
struct Touch {
    seq: i64,
    at_ms: i64,
    from: i64,
    /// The seq it replaces (an edit), 0 if none.
    replaces: i64,
    preview: Option<String>,
    records: Vec<usize>,
}

impl Touch {
    /// A later recall or delete of the batch covering this message, or
    /// the message it edits, withdraws its preview before it is written
    /// (the log order within a batch, whatever the flush order).
    fn withdraw(&mut self, ranges: &[(i64, i64)]) {
        let hit = |seq: i64| ranges.iter().any(|(low, hi)| seq >= *low && seq < *hi);
        if hit(self.seq) || (self.replaces > 0 && hit(self.replaces)) {
            self.preview = None;
        }
    }

    /// A later in-place edit of the batch's newest message.
    fn edit(&mut self, seq: i64, content: Option<&str>) {
        if self.seq == seq || self.replaces == seq {
            self.preview = preview(content);
        }
    }
}

type TopicKey = (String, String);

impl Handler for ConversationsHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        let mut gate = KeyGate::new(records, failures);
        let mut touches: BTreeMap<TopicKey, Touch> = BTreeMap::new();
        // (tenant, topic, uid) → (greatest seq sent, records)
        let mut senders: BTreeMap<(String, String, i64), (i64, Vec<usize>)> = BTreeMap::new();
        let mut new_p2p: BTreeMap<TopicKey, (i64, i64, i64, Vec<usize>)> = BTreeMap::new();
        // Who left (None: everyone, a dissolved group) in this batch.
        let mut left: Vec<(TopicKey, Option<i64>)> = Vec::new();
        for (i, event) in events {
            if !gate.admit(i) {
                continue;
            }
            let key = (event.tenant_id.clone(), event.topic.clone());
            if let GroupEventBody::MessageSent(m) = &event.body {
                let t = touches.entry(key.clone()).or_insert(Touch {
                    seq: 0,
                    at_ms: 0,
                    from: 0,
                    replaces: 0,
                    preview: None,
                    records: Vec::new(),
                });
                if m.seq > t.seq {
                    t.seq = m.seq;
                    t.at_ms = m.created_at;
                    t.from = m.from_user;
                    // A malformed replace was refused at the gateway; here
                    // it is just not an edit.
                    t.replaces = tinode::replaced_seq(m.head.as_deref())
                        .ok()
                        .flatten()
                        .unwrap_or(0);
                    t.preview = preview(m.content.as_deref());
                }
                t.records.push(i);
                let s = senders
                    .entry((key.0.clone(), key.1.clone(), m.from_user))
                    .or_insert((0, Vec::new()));
                s.0 = s.0.max(m.seq);
                s.1.push(i);
                if let Some((a, b)) = tinode::parse_p2p_topic(&event.topic) {
                    let known = self.known_p2p.lock().expect("p2p set").contains(&key);
                    if !known {
                        let e = new_p2p
                            .entry(key)
                            .or_insert((a, b, m.created_at, Vec::new()));
                        e.2 = e.2.min(m.created_at);
                        e.3.push(i);
                    }
                }
                continue;
            }
            // Everything else changes little and is applied in log order:
            // to the batch's pending newest message, and to the stored row.
            if let Some(t) = touches.get_mut(&key) {
                match &event.body {
                    GroupEventBody::MessageRecalled(r) => t.withdraw(&[(r.seq, r.seq + 1)]),
                    GroupEventBody::MessageDeleted(d) => {
                        t.withdraw(&d.ranges.iter().map(|r| (r.low, r.hi)).collect::<Vec<_>>())
                    }
                    GroupEventBody::MessageEdited(e) if e.edit_seq.is_none() => {
                        t.edit(e.seq, e.content.as_deref())
                    }
                    _ => {}
                }
            }
            match &event.body {
                GroupEventBody::MemberLeft(l) => left.push((key.clone(), Some(l.uid))),
                GroupEventBody::GroupDissolved(_) => left.push((key.clone(), None)),
                _ => {}
            }
            let result = match self.pools.get(&event.tenant_id) {
                Ok(pool) => apply(pool, &mut self.redis.clone(), &event).await,
                Err(e) => Err((FailureKind::Poison, e.to_string())),
            };
            if let Err((kind, reason)) = result {
                gate.fail(RecordFailure::new(i, kind, reason));
            }
        }
        self.flush(&mut gate, touches, senders, new_p2p).await;
        // Whoever left starts a new row unengaged if they come back.
        if !left.is_empty() {
            let mut engaged = self.known_engaged.lock().expect("engaged set");
            for ((tenant, topic), uid) in &left {
                engaged.retain(|(t, tp, u)| {
                    !(t == tenant && tp == topic && uid.is_none_or(|uid| uid == *u))
                });
            }
        }
        gate.outcome()
    }
}

impl ConversationsHandler {
    /// Writes the batch's coalesced message effects, one statement per
    /// tenant and table; a failure fails the records that fed it.
    async fn flush(
        &self,
        gate: &mut KeyGate<'_>,
        touches: BTreeMap<TopicKey, Touch>,
        senders: BTreeMap<(String, String, i64), (i64, Vec<usize>)>,
        new_p2p: BTreeMap<TopicKey, (i64, i64, i64, Vec<usize>)>,
    ) {
        let tenants: HashSet<&String> = touches.keys().map(|(t, _)| t).collect();
        for tenant in tenants {
            let fail_all = |gate: &mut KeyGate<'_>,
                            idx: &mut dyn Iterator<Item = usize>,
                            kind,
                            reason: &str| {
                for i in idx {
                    gate.fail(RecordFailure::new(i, kind, reason));
                }
            };
            let ours = |k: &TopicKey| &k.0 == tenant;
            let indexes = || -> Vec<usize> {
                touches
                    .iter()
                    .filter(|(k, _)| ours(k))
                    .flat_map(|(_, t)| t.records.iter().copied())
                    .collect()
            };
            let pool = match self.pools.get(tenant) {
                Ok(p) => p,
                Err(e) => {
                    fail_all(
                        gate,
                        &mut indexes().into_iter(),
                        FailureKind::Poison,
                        &e.to_string(),
                    );
                    continue;
                }
            };
            // One transaction: a reader never sees a conversation without
            // its topic's state (a first one-to-one message).
            let result = async {
                let mut tx = pool.begin().await?;
                let p2p: Vec<_> = new_p2p.iter().filter(|(k, _)| ours(k)).collect();
                if !p2p.is_empty() {
                    let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                        "INSERT INTO im_conversations (uid, topic, kind, peer_uid, joined_at) ",
                    );
                    let rows: Vec<(i64, &str, i64, i64)> = p2p
                        .iter()
                        .flat_map(|((_, topic), (a, b, at, _))| {
                            [(*a, topic.as_str(), *b, *at), (*b, topic.as_str(), *a, *at)]
                        })
                        .collect();
                    q.push_values(rows, |mut r, (uid, topic, peer, at)| {
                        r.push_bind(uid)
                            .push_bind(topic)
                            .push_bind(Kind::P2p.as_str())
                            .push_bind(peer)
                            .push_bind(at_time(at));
                    });
                    q.push(" ON DUPLICATE KEY UPDATE peer_uid = VALUES(peer_uid)");
                    q.build().execute(&mut *tx).await?;
                }
                let rows: Vec<_> = touches.iter().filter(|(k, _)| ours(k)).collect();
                let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                    "INSERT INTO im_conversation_topics (topic, last_seq, touched_ms, last_from, last_replaces, preview) ",
                );
                q.push_values(rows, |mut r, ((_, topic), t)| {
                    r.push_bind(topic)
                        .push_bind(t.seq)
                        .push_bind(t.at_ms)
                        .push_bind(t.from)
                        .push_bind(t.replaces)
                        .push_bind(&t.preview);
                });
                // Assignments run left to right: last_seq moves last, so the
                // others compare against the old value. The greatest seq wins.
                q.push(
                    " ON DUPLICATE KEY UPDATE \
                     touched_ms = IF(VALUES(last_seq) > last_seq, VALUES(touched_ms), touched_ms), \
                     last_from = IF(VALUES(last_seq) > last_seq, VALUES(last_from), last_from), \
                     last_replaces = IF(VALUES(last_seq) > last_seq, VALUES(last_replaces), last_replaces), \
                     preview = IF(VALUES(last_seq) > last_seq, VALUES(preview), preview), \
                     last_seq = GREATEST(last_seq, VALUES(last_seq))",
                );
                q.build().execute(&mut *tx).await?;
                // Senders took part of their own accord (what shows their
                // note and presence to the others); once per user and topic.
                let engaging: Vec<&(String, String, i64)> = {
                    let known = self.known_engaged.lock().expect("engaged set");
                    senders
                        .keys()
                        .filter(|k| &k.0 == tenant && !known.contains(*k))
                        .collect()
                };
                for chunk in engaging.chunks(500) {
                    let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                        "UPDATE im_conversations SET engaged = 1 WHERE engaged = 0 AND (uid, topic) IN (",
                    );
                    let mut sep = q.separated(", ");
                    for (_, topic, uid) in chunk {
                        sep.push("(")
                            .push_bind_unseparated(*uid)
                            .push_unseparated(", ")
                            .push_bind_unseparated(topic.as_str())
                            .push_unseparated(")");
                    }
                    q.push(")");
                    q.build().execute(&mut *tx).await?;
                }
                let cursors: Vec<_> = senders.iter().filter(|((t, _, _), _)| t == tenant).collect();
                let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                    "INSERT INTO im_subscriptions (topic, uid, read_seq, recv_seq) ",
                );
                q.push_values(cursors, |mut r, ((_, topic, uid), (seq, _))| {
                    r.push_bind(topic).push_bind(*uid).push_bind(*seq).push_bind(*seq);
                });
                q.push(
                    " ON DUPLICATE KEY UPDATE read_seq = GREATEST(read_seq, VALUES(read_seq)), \
                     recv_seq = GREATEST(recv_seq, VALUES(recv_seq))",
                );
                q.build().execute(&mut *tx).await?;
                tx.commit().await.map_err(HotError::Db)?;
                // The hot copy, from what MySQL now holds.
                let mut redis = self.redis.clone();
                let topics: Vec<&str> = touches
                    .keys()
                    .filter(|k| ours(k))
                    .map(|(_, t)| t.as_str())
                    .collect();
                hot::refresh_topics(pool, &mut redis, tenant, &topics).await?;
                let moves: Vec<CursorMove> = senders
                    .iter()
                    .filter(|((t, _, _), _)| t == tenant)
                    .map(|((_, topic, uid), (seq, _))| CursorMove {
                        uid: *uid,
                        topic: topic.clone(),
                        read: *seq,
                        recv: *seq,
                        clear: 0,
                    })
                    .collect();
                hot::move_cursors(&mut redis, tenant, &moves).await?;
                let pairs: Vec<i64> = p2p.iter().flat_map(|(_, (a, b, _, _))| [*a, *b]).collect();
                hot::forget(&mut redis, tenant, &pairs).await?;
                announce_engaged(&mut redis, tenant, &engaging).await;
                Ok::<(), HotError>(())
            }
            .await;
            match result {
                Ok(()) => {
                    let mut known = self.known_p2p.lock().expect("p2p set");
                    if known.len() > KNOWN_P2P_MAX {
                        known.clear();
                    }
                    known.extend(new_p2p.keys().filter(|k| ours(k)).cloned());
                    drop(known);
                    let mut engaged = self.known_engaged.lock().expect("engaged set");
                    if engaged.len() > KNOWN_P2P_MAX {
                        engaged.clear();
                    }
                    engaged.extend(senders.keys().filter(|k| &k.0 == tenant).cloned());
                }
                Err(e) => {
                    let mut all = indexes();
                    all.extend(
                        new_p2p
                            .iter()
                            .filter(|(k, _)| ours(k))
                            .flat_map(|(_, v)| v.3.iter().copied()),
                    );
                    let (kind, reason) = hot_failure(e);
                    fail_all(gate, &mut all.into_iter(), kind, &reason);
                }
            }
        }
    }
}

/// Tells the peer of each one-to-one topic a user just wrote in for the
/// first time that the user is online, if they are: writing there is what
/// shows the user's presence to the peer (see
/// [`crate::conversations::may_see_private`]), and a peer whose list got
/// the conversation before the projection had it was shown them offline.
/// Best effort, as presence is: the next list read corrects a lost one.
async fn announce_engaged(redis: &mut Redis, tenant: &str, engaging: &[&(String, String, i64)]) {
    let writers: Vec<(i64, i64, &str)> = engaging
        .iter()
        .filter_map(|(_, topic, uid)| {
            tinode::p2p_peer(topic, *uid).map(|peer| (*uid, peer, topic.as_str()))
        })
        .collect();
    if writers.is_empty() {
        return;
    }
    let keys = crate::keys::TenantKeys::new(tenant);
    let mut pipe = redis::pipe();
    for (uid, _, _) in &writers {
        crate::realtime::presence::read_shown(&mut pipe, &keys, *uid);
    }
    let online: Vec<(Option<String>, Option<String>)> = match pipe.query_async(redis).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(error = %e, "presence of new writers unreadable");
            return;
        }
    };
    for ((uid, peer, topic), flag) in writers.iter().zip(online) {
        if !crate::realtime::presence::shown_online(&flag) {
            continue;
        }
        let envelope = crate::realtime::Envelope::presence_to(
            format!("engaged:{topic}:{uid}"),
            tenant,
            *peer,
            *uid,
            "on",
        );
        if let Err(e) = crate::realtime::bus::publish(redis, None, &envelope).await {
            tracing::warn!(error = %e, "presence of a new writer not published");
            return;
        }
    }
}

/// A membership, clear, recall or delete event: MySQL, then the hot copy.
async fn apply(
    pool: &MySqlPool,
    redis: &mut Redis,
    e: &GroupEvent,
) -> Result<(), (FailureKind, String)> {
    apply_to(pool, redis, e).await.map_err(hot_failure)
}

async fn apply_to(pool: &MySqlPool, redis: &mut Redis, e: &GroupEvent) -> Result<(), HotError> {
    let tenant = e.tenant_id.as_str();
    let topic = e.topic.as_str();
    // (uid, engaged): engaged when the user joined of their own accord.
    let join = |uids: Vec<(i64, bool)>| async move {
        if uids.is_empty() {
            return Ok::<Vec<i64>, sqlx::Error>(Vec::new());
        }
        for chunk in uids.chunks(1000) {
            let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                "INSERT INTO im_conversations (uid, topic, kind, peer_uid, joined_at, engaged) ",
            );
            q.push_values(chunk, |mut r, (uid, engaged)| {
                r.push_bind(*uid)
                    .push_bind(topic)
                    .push_bind(Kind::Grp.as_str())
                    .push_bind(0i64)
                    .push_bind(at_time(e.occurred_at))
                    .push_bind(*engaged);
            });
            q.push(
                " ON DUPLICATE KEY UPDATE kind = VALUES(kind), \
                 engaged = GREATEST(engaged, VALUES(engaged))",
            );
            q.build().execute(pool).await?;
        }
        // The topic's row exists from the start (its activity: creation).
        sqlx::query(
            "INSERT INTO im_conversation_topics (topic, last_seq, touched_ms) VALUES (?, 0, ?) \
             ON DUPLICATE KEY UPDATE touched_ms = IF(last_seq = 0, LEAST(touched_ms, VALUES(touched_ms)), touched_ms)",
        )
        .bind(topic)
        .bind(e.occurred_at)
        .execute(pool)
        .await?;
        Ok(uids.into_iter().map(|(uid, _)| uid).collect())
    };
    match &e.body {
        GroupEventBody::GroupCreated(g) => {
            // The owner created it; the members were added by the owner.
            let mut uids: Vec<(i64, bool)> = g
                .members
                .iter()
                .filter(|uid| **uid != g.owner_uid)
                .map(|uid| (*uid, false))
                .collect();
            uids.push((g.owner_uid, true));
            uids.sort_unstable();
            uids.dedup();
            let joined = join(uids).await?;
            hot::forget(redis, tenant, &joined).await?;
            hot::refresh_topics(pool, redis, tenant, &[topic]).await
        }
        GroupEventBody::MemberJoined(j) => {
            // Joined by their own command (an accepted invitation), or
            // added by someone else.
            join(vec![(j.uid, j.uid == e.actor_uid)]).await?;
            hot::forget(redis, tenant, &[j.uid]).await?;
            hot::refresh_topics(pool, redis, tenant, &[topic]).await
        }
        GroupEventBody::MemberLeft(l) => {
            sqlx::query("DELETE FROM im_conversations WHERE uid = ? AND topic = ?")
                .bind(l.uid)
                .bind(topic)
                .execute(pool)
                .await?;
            Ok(hot::forget(redis, tenant, &[l.uid]).await?)
        }
        GroupEventBody::GroupDissolved(_) => {
            // Whose lists held it: the rows about to go, and the members
            // (still there when this is redelivered after the delete).
            let uids: Vec<i64> = sqlx::query_scalar(
                "SELECT uid FROM im_conversations WHERE topic = ? \
                 UNION SELECT uid FROM im_group_members WHERE topic = ?",
            )
            .bind(topic)
            .bind(topic)
            .fetch_all(pool)
            .await?;
            sqlx::query("DELETE FROM im_conversations WHERE topic = ?")
                .bind(topic)
                .execute(pool)
                .await?;
            Ok(hot::forget(redis, tenant, &uids).await?)
        }
        GroupEventBody::HistoryCleared(c) => {
            sqlx::query(
                "INSERT INTO im_subscriptions (topic, uid, clear_delid) VALUES (?, ?, ?) \
                 ON DUPLICATE KEY UPDATE clear_delid = GREATEST(clear_delid, VALUES(clear_delid))",
            )
            .bind(topic)
            .bind(c.uid)
            .bind(c.del_id)
            .execute(pool)
            .await?;
            let clear = CursorMove {
                uid: c.uid,
                topic: topic.to_string(),
                read: 0,
                recv: 0,
                clear: c.del_id as i64,
            };
            Ok(hot::move_cursors(redis, tenant, &[clear]).await?)
        }
        GroupEventBody::MessageRecalled(r) => {
            withdraw(pool, topic, &[(r.seq, r.seq + 1)]).await?;
            hot::refresh_topics(pool, redis, tenant, &[topic]).await
        }
        GroupEventBody::MessageDeleted(d) => {
            let ranges: Vec<(i64, i64)> = d.ranges.iter().map(|r| (r.low, r.hi)).collect();
            withdraw(pool, topic, &ranges).await?;
            hot::refresh_topics(pool, redis, tenant, &[topic]).await
        }
        // An edit in place (a replacement message is a MessageSent of its
        // own): the preview shows the new text while it is the last one.
        GroupEventBody::MessageEdited(ed) if ed.edit_seq.is_none() => {
            sqlx::query(
                "UPDATE im_conversation_topics SET preview = ? \
                 WHERE topic = ? AND preview IS NOT NULL AND (last_seq = ? OR last_replaces = ?)",
            )
            .bind(preview(ed.content.as_deref()))
            .bind(topic)
            .bind(ed.seq)
            .bind(ed.seq)
            .execute(pool)
            .await?;
            hot::refresh_topics(pool, redis, tenant, &[topic]).await
        }
        _ => Ok(()),
    }
}

/// The preview goes when the last message, or the message it edits, is
/// among `ranges`.
async fn withdraw(pool: &MySqlPool, topic: &str, ranges: &[(i64, i64)]) -> sqlx::Result<()> {
    for (low, hi) in ranges {
        sqlx::query(
            "UPDATE im_conversation_topics SET preview = NULL \
             WHERE topic = ? AND ((last_seq >= ? AND last_seq < ?) \
             OR (last_replaces >= ? AND last_replaces < ?))",
        )
        .bind(topic)
        .bind(low)
        .bind(hi)
        .bind(low)
        .bind(hi)
        .execute(pool)
        .await?;
    }
    Ok(())
}

fn at_time(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
}
