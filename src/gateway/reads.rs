//! Reads and user-view deletes shared by the WebSocket and HTTP front ends:
//! membership checks, Tinode `{data}` frames, `{get what="data"}` with
//! since/before/limit/ranges, and HistoryCleared for `{del}` without `hard`.

use serde_json::{json, Value};

use crate::events::{GroupEvent, GroupEventBody, HistoryCleared, SeqRange};
use crate::groups::Membership;
use crate::history::PageQuery;
use crate::kafka::topics::TopicKind;
use crate::keys::TopicKeys;
use crate::store::message::StoredMessage;

use super::refusal::Refusal;
use super::Gateway;
use crate::tinode;

/// Refuses non-members (403) and dissolved groups (404).
pub async fn ensure_member(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    uid: i64,
) -> Result<(), Refusal> {
    if !tinode::is_conversation_topic(topic) {
        return Err(Refusal(404, "topic not found".into()));
    }
    gw.pools.get(tenant).map_err(Refusal::internal)?;
    match gw.groups.membership(tenant, topic, uid).await {
        Ok(Membership::Member) => Ok(()),
        Ok(Membership::NotMember) => Err(Refusal(403, "permission denied".into())),
        Ok(Membership::Dissolved) => Err(Refusal(404, "topic not found".into())),
        Err(e) => Err(e.into()),
    }
}

pub use crate::realtime::frames::data_body;

/// Messages for a Tinode data query, newest first.
pub async fn query_data(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    uid: i64,
    q: &tinode::DataQuery,
) -> Result<Vec<StoredMessage>, Refusal> {
    let limit = q
        .limit
        .unwrap_or(crate::history::DEFAULT_LIMIT)
        .clamp(1, crate::history::MAX_LIMIT);
    let mut out: Vec<StoredMessage> = Vec::new();
    match &q.ranges {
        Some(ranges) if !ranges.is_empty() => {
            // One page read per range: at most `limits.get_ranges` ranges
            // spanning at most `limits.get_range_seqs` seqs in all.
            let (max_ranges, max_seqs) =
                (gw.config.limits.get_ranges, gw.config.limits.get_range_seqs);
            if ranges.len() > max_ranges {
                return Err(Refusal(
                    400,
                    format!("malformed: at most {max_ranges} ranges per request"),
                ));
            }
            let mut span: i64 = 0;
            for r in ranges {
                let hi = r.hi.unwrap_or(r.low.saturating_add(1));
                if r.low < 1 || hi <= r.low {
                    return Err(Refusal(400, "malformed: invalid range".into()));
                }
                span = span.saturating_add(hi - r.low);
            }
            if span > max_seqs {
                return Err(Refusal(
                    400,
                    format!("malformed: the ranges span more than {max_seqs} seqs"),
                ));
            }
            for r in ranges {
                let hi = r.hi.unwrap_or(r.low + 1);
                let page = gw
                    .history
                    .page(
                        tenant,
                        topic,
                        uid,
                        PageQuery::new(Some(r.low), Some(hi), Some(limit), false)?,
                    )
                    .await?;
                out.extend(page.messages);
            }
            out.sort_by(|a, b| b.seq.cmp(&a.seq));
            out.dedup_by_key(|m| m.seq);
            out.truncate(limit as usize);
        }
        _ => {
            let query = PageQuery::new(q.since, q.before, Some(limit), false)?;
            out = gw.history.page(tenant, topic, uid, query).await?.messages;
        }
    }
    Ok(out)
}

/// The chat's last seq: from Redis or, when Redis has lost it, the chat
/// list's row (0: no message yet).
pub async fn last_seq(gw: &Gateway, tenant: &str, topic: &str) -> Result<i64, Refusal> {
    let mut redis = gw.redis.clone();
    let cached: Option<i64> = redis::cmd("HGET")
        .arg(TopicKeys::new(tenant, topic).seq())
        .arg("last_seq")
        .query_async(&mut redis)
        .await
        .map_err(Refusal::unavailable)?;
    match cached {
        Some(last) => Ok(last),
        None => {
            let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
            Ok(
                sqlx::query_scalar("SELECT last_seq FROM im_conversation_topics WHERE topic = ?")
                    .bind(topic)
                    .fetch_optional(pool)
                    .await
                    .map_err(Refusal::unavailable)?
                    .unwrap_or(0),
            )
        }
    }
}

/// Clears every message of `topic` from `uid`'s view (deleting a
/// one-to-one chat for oneself): [`clear_history`] of `[1, last]`
/// ([`last_seq`]).
/// The delete id and the last seq cleared; `None` when there is nothing
/// to clear.
pub async fn clear_all(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    uid: i64,
    device: &str,
    sid: &str,
) -> Result<Option<(i32, i64)>, Refusal> {
    let last = last_seq(gw, tenant, topic).await?;
    if last < 1 {
        return Ok(None);
    }
    let all = [tinode::SeqRangeMsg {
        low: 1,
        hi: Some(last + 1),
    }];
    clear_history(gw, tenant, topic, uid, device, sid, &all)
        .await
        .map(|del_id| Some((del_id, last)))
}

/// Hides `ranges` (`[low, hi)`, `hi` missing = one message) from `uid`'s
/// view: produces HistoryCleared; returns the new delete id.
pub async fn clear_history(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    uid: i64,
    device: &str,
    sid: &str,
    ranges: &[tinode::SeqRangeMsg],
) -> Result<i32, Refusal> {
    if ranges.is_empty() || ranges.len() > 100 {
        return Err(Refusal(400, "malformed: 1 to 100 ranges".into()));
    }
    let keys = TopicKeys::new(tenant, topic);
    let mut redis = gw.redis.clone();
    // Every read filters by the reader's delete log: it stays bounded.
    // Checked and counted in one step (`caps`), so concurrent clears never
    // pass the cap together; a clear refused below after this leaves the
    // count conservative until it is derived from MySQL again.
    let cap = gw.config.limits.dellog_per_user;
    let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
    for r in ranges {
        if r.low < 1 || r.hi.is_some_and(|hi| hi <= r.low) {
            return Err(Refusal(400, "malformed: invalid range".into()));
        }
    }
    let taken = crate::caps::take(
        &mut redis,
        pool,
        tenant,
        crate::caps::Cap::Dellog { topic, uid },
        cap,
        ranges.len() as i64,
        None,
    )
    .await
    .map_err(Refusal::unavailable)?;
    if let crate::caps::Taken::Full(_) = taken {
        return Err(Refusal(
            409,
            format!("too many history clears in this topic (at most {cap} ranges per user)"),
        ));
    }
    let last: Option<i64> = redis::cmd("HGET")
        .arg(keys.seq())
        .arg("last_seq")
        .query_async(&mut redis)
        .await
        .map_err(Refusal::unavailable)?;
    let last = last.unwrap_or(i64::MAX - 1);
    let mut clean = Vec::with_capacity(ranges.len());
    for r in ranges {
        let hi = r.hi.unwrap_or(r.low + 1).min(last + 1);
        if r.low < 1 || hi <= r.low {
            return Err(Refusal(400, "malformed: invalid range".into()));
        }
        clean.push(SeqRange { low: r.low, hi });
    }
    let del_id = gw.governance.next_del_id(tenant, topic).await?;
    let event = GroupEvent {
        actor_device: device.to_string(),
        source_sid: sid.to_string(),
        source_node: gw.node_id.clone(),
        ..GroupEvent::new(
            &tenant,
            &topic,
            uid,
            GroupEventBody::HistoryCleared(HistoryCleared {
                uid,
                ranges: clean,
                del_id,
            }),
        )
    };
    gw.sender
        .producer()
        .send(
            TopicKind::GroupEvents,
            &format!("{tenant}:{topic}"),
            &event,
            None,
        )
        .await
        .map_err(Refusal::unavailable)?;
    Ok(del_id)
}

/// The reader's delete log as Tinode's `{meta del}` body, if any.
pub async fn deleted_ranges(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    uid: i64,
) -> Result<Option<Value>, Refusal> {
    let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
    let rows: Vec<(i32, i64, i64)> = sqlx::query_as(
        "SELECT delid, low, hi FROM im_dellog WHERE topic = ? AND deletedfor IN (0, ?) ORDER BY delid, low",
    )
    .bind(topic)
    .bind(uid)
    .fetch_all(pool)
    .await
    .map_err(Refusal::unavailable)?;
    if rows.is_empty() {
        return Ok(None);
    }
    let clear = rows.iter().map(|r| r.0).max().unwrap_or(0);
    let delseq: Vec<Value> = rows
        .iter()
        .map(|(_, low, hi)| {
            if *hi == low + 1 {
                json!({"low": low})
            } else {
                json!({"low": low, "hi": hi})
            }
        })
        .collect();
    Ok(Some(json!({"clear": clear, "delseq": delseq})))
}

/// Tinode's `{meta desc}` body for a member: access mode, the topic's last
/// seq and the reader's read/recv cursors.
pub async fn describe(gw: &Gateway, tenant: &str, topic: &str, uid: i64) -> Result<Value, Refusal> {
    let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
    let keys = TopicKeys::new(tenant, topic);
    let mut redis = gw.redis.clone();
    let last: Option<i64> = redis::cmd("HGET")
        .arg(keys.seq())
        .arg("last_seq")
        .query_async(&mut redis)
        .await
        .map_err(Refusal::unavailable)?;
    let group: Option<(i64, i64)> = sqlx::query_as(
        "SELECT CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED), CAST(UNIX_TIMESTAMP(updated_at) * 1000 AS SIGNED) \
         FROM im_groups WHERE topic = ?",
    )
    .bind(topic)
    .fetch_optional(pool)
    .await
    .map_err(Refusal::unavailable)?;
    let cursors: Option<(i64, i64)> = sqlx::query_as(
        "SELECT read_seq, recv_seq FROM im_subscriptions WHERE topic = ? AND uid = ?",
    )
    .bind(topic)
    .bind(uid)
    .fetch_optional(pool)
    .await
    .map_err(Refusal::unavailable)?;
    let (created, updated) = group.unwrap_or((0, 0));
    let (read, recv) = cursors.unwrap_or((0, 0));
    // What the conversation shows: the group's profile, or the peer's; and
    // the access mode of the reader's role.
    let (profile, mode) = match tinode::p2p_peer(topic, uid) {
        Some(peer) => (
            super::chats::peer_profile(pool, uid, peer)
                .await
                .map_err(Refusal::unavailable)?,
            super::chats::P2P_MODE.to_string(),
        ),
        None => {
            let standing = gw
                .governance
                .standing(tenant, topic, uid)
                .await
                .map_err(Refusal::unavailable)?;
            (
                crate::conversations::group_profile(pool, topic)
                    .await
                    .map_err(Refusal::unavailable)?,
                super::chats::standing_mode(standing),
            )
        }
    };
    // The reader's own settings: their access, their `private`.
    let personal = super::personal::Personal::load_for(pool, uid, topic)
        .await
        .map_err(Refusal::unavailable)?;
    let mut desc = json!({
        "created": tinode::timestamp_ms(created),
        "updated": tinode::timestamp_ms(updated),
        "touched": tinode::timestamp_ms(updated),
        "defacs": {"auth": "JRWPS", "anon": "N"},
        "acs": personal.acs(topic, uid, &mode).json(),
        "seq": last.unwrap_or(0),
        "read": read,
        "recv": recv,
    });
    if !profile.is_empty() {
        desc["public"] = profile.public();
    }
    if let Some(private) = personal.private(topic) {
        desc["private"] = private;
    }
    Ok(desc)
}
