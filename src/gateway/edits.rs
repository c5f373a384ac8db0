//! Edits and deletes for everyone, shared by the WebSocket and HTTP front
//! ends (seed 000 §7, TINODE-PROTOCOL.md §2).
//!
//! - An edit is a new message whose head carries `replace: ":<seq>"`, sent
//!   by the original sender within `gateway.edit_window_secs`: the send
//!   path produces its `MessageSent` and then `MessageEdited` for the target.
//! - A hard delete of the caller's own messages within
//!   `gateway.recall_window_secs` is a recall (`MessageRecalled` per seq);
//!   otherwise an owner or admin deletes as a moderator (`MessageDeleted`);
//!   anyone else is refused. One delete id covers the whole request.

use crate::events::{now_ms, GroupEventBody, MessageRecalled, SeqRange};
use crate::governance::exec::Origin;
use crate::governance::{Actor, Refused};
use crate::groups::{Role, Standing};
use crate::history::PageQuery;
use crate::store::message::StoredMessage;

use super::refusal::Refusal;
use super::Gateway;

/// Most messages one recall may name (a moderator may delete more).
pub const MAX_RECALL: i64 = 100;

impl From<Refused> for Refusal {
    fn from(r: Refused) -> Self {
        Refusal(r.0, r.1)
    }
}

/// Who is acting, and from where.
pub struct Caller<'a> {
    pub tenant: &'a str,
    pub uid: i64,
    pub origin: Origin,
}

/// The target seq of a `head.replace` value (`":123"`).
pub fn replace_target(head: Option<&str>) -> Result<Option<i64>, Refusal> {
    crate::tinode::replaced_seq(head)
        .map_err(|()| Refusal(400, "malformed: head.replace must be \":<seq>\"".into()))
}

/// False only for a one-to-one topic `uid` is not one of the two of: its
/// members are in its name, and nothing needs reading to refuse.
fn p2p_party(topic: &str, uid: i64) -> bool {
    crate::tinode::parse_p2p_topic(topic).is_none_or(|(a, b)| uid == a || uid == b)
}

/// Checks that `caller` may edit message `seq` of `topic` now.
pub async fn check_edit(
    gw: &Gateway,
    caller: &Caller<'_>,
    topic: &str,
    seq: i64,
) -> Result<(), Refusal> {
    // Membership first, from the write model (state that cannot lag): to
    // anyone else a message that exists, one that does not and one in an
    // archived month are the same "not found" (issue 39: no counting other
    // people's messages through the answer).
    let not_found = || Refusal(404, format!("message {seq} not found"));
    if !p2p_party(topic, caller.uid) {
        return Err(not_found());
    }
    let standing = gw
        .governance
        .standing(caller.tenant, topic, caller.uid)
        .await?;
    if !matches!(standing, Standing::Member { .. }) {
        return Err(not_found());
    }
    let target = acknowledged(gw, caller, topic, seq)
        .await?
        .ok_or_else(not_found)?;
    refuse_archived(
        gw,
        caller,
        topic,
        &[SeqRange {
            low: seq,
            hi: seq + 1,
        }],
    )
    .await?;
    if target.from != caller.uid {
        return Err(Refusal(403, "only the sender may edit a message".into()));
    }
    if replace_target(target.head.as_deref())?.is_some() {
        return Err(Refusal(
            400,
            format!("message {seq} is itself an edit; edit the original"),
        ));
    }
    let window = gw.config.gateway.edit_window_secs as i64 * 1000;
    if now_ms() - target.ts > window {
        return Err(Refusal(
            403,
            format!("the edit window ({} s) has passed", window / 1000),
        ));
    }
    Ok(())
}

/// Longest a member's edit waits for a message handed out a seq but not
/// stored yet (the store projection is behind the acknowledgement).
const UNSTORED_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The stored message `seq` of `topic`, read on the primary; a seq the
/// topic has handed out but the store has not written yet (an edit right
/// after the send's acknowledgement) is waited for, up to
/// [`UNSTORED_WAIT`]: a hole (a send that failed after its seq) stays
/// `None`. Only for members (the caller checked).
async fn acknowledged(
    gw: &Gateway,
    caller: &Caller<'_>,
    topic: &str,
    seq: i64,
) -> Result<Option<crate::store::message::StoredMessage>, Refusal> {
    let deadline = tokio::time::Instant::now() + UNSTORED_WAIT;
    let mut handed_out: Option<bool> = None;
    loop {
        let found = gw
            .history
            .exact_on_primary(caller.tenant, topic, caller.uid, seq)
            .await?;
        if found.is_some() || tokio::time::Instant::now() >= deadline {
            return Ok(found);
        }
        if handed_out.is_none() {
            let mut redis = gw.redis.clone();
            let last: Option<i64> = redis::cmd("HGET")
                .arg(crate::keys::TopicKeys::new(caller.tenant, topic).seq())
                .arg("last_seq")
                .query_async(&mut redis)
                .await
                .map_err(|e| Refusal::unavailable(e.to_string()))?;
            handed_out = Some(last.is_some_and(|last| seq <= last));
        }
        if handed_out != Some(true) {
            return Ok(None);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// What a hard delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Recalled(i32),
    Moderated(i32),
}

impl Deleted {
    pub fn del_id(self) -> i32 {
        match self {
            Deleted::Recalled(d) | Deleted::Moderated(d) => d,
        }
    }
    pub fn action(self) -> &'static str {
        match self {
            Deleted::Recalled(_) => "recalled",
            Deleted::Moderated(_) => "deleted",
        }
    }
}

/// Deletes `[low, hi)` ranges of `topic` for everyone: a recall when they
/// are all the caller's own recent messages, else moderation when the
/// caller is the owner or an admin.
pub async fn hard_delete(
    gw: &Gateway,
    caller: &Caller<'_>,
    topic: &str,
    ranges: &[SeqRange],
) -> Result<Deleted, Refusal> {
    let requested = ranges;
    let gov = &gw.governance;
    // Another pair's one-to-one chat is refused from its name, before any
    // model is read (a read would install one).
    if !p2p_party(topic, caller.uid) {
        return Err(Refusal(403, "permission denied".into()));
    }
    let standing = gov.standing(caller.tenant, topic, caller.uid).await?;
    let role = match standing {
        Standing::NoGroup => return Err(Refusal(404, "topic not found".into())),
        Standing::NotMember => return Err(Refusal(403, "permission denied".into())),
        Standing::Member { role, .. } => role,
    };
    let privileged = matches!(role, Role::Owner | Role::Admin);
    let ranges = gov.clamp(caller.tenant, topic, ranges).await?;
    let ranges = with_edits(gw, caller, topic, ranges).await?;
    refuse_archived(gw, caller, topic, &ranges).await?;
    let count: i64 = ranges.iter().map(|r| r.hi - r.low).sum();
    // One delete is one transaction of the store: bounded in width.
    let width = gw.config.limits.delete_width;
    if count > width {
        return Err(Refusal(
            400,
            format!("malformed: one delete spans at most {width} messages; split it"),
        ));
    }
    let refusal = if count > MAX_RECALL {
        Some(Refusal(
            403,
            format!(
                "a recall names at most {MAX_RECALL} messages; owners and admins may delete more"
            ),
        ))
    } else {
        let messages = read_ranges(gw, caller, topic, &ranges).await?;
        if messages.is_empty() {
            return Err(Refusal(404, "no such messages".into()));
        }
        let window = gw.config.gateway.recall_window_secs as i64 * 1000;
        let now = now_ms();
        if messages.iter().any(|m| m.from != caller.uid) {
            Some(Refusal(
                403,
                "only the sender may recall a message; owners and admins may delete any".into(),
            ))
        } else if messages.iter().any(|m| now - m.ts > window) {
            Some(Refusal(
                403,
                format!("the recall window ({} s) has passed", window / 1000),
            ))
        } else {
            let del_id = gov.next_del_id(caller.tenant, topic).await?;
            let bodies = messages
                .iter()
                .map(|m| {
                    GroupEventBody::MessageRecalled(MessageRecalled {
                        seq: m.seq,
                        recalled_at: now,
                        del_id,
                    })
                })
                .collect();
            gov.produce(
                caller.tenant,
                topic,
                caller.uid,
                &crate::governance::exec::request_target("recall", requested),
                bodies,
                &caller.origin,
            )
            .await?;
            return Ok(Deleted::Recalled(del_id));
        }
    };
    if !privileged {
        return Err(refusal.expect("refused when not recalled"));
    }
    let outcome = gov
        .moderate_request(
            caller.tenant,
            topic,
            Actor::User(caller.uid, standing),
            &ranges,
            requested,
            &caller.origin,
            "",
        )
        .await?;
    Ok(Deleted::Moderated(outcome.del_id.unwrap_or(0)))
}

/// Messages of an archived month are read from its archive and can no
/// longer change: an edit, recall or delete touching one is refused (409)
/// before anything is produced.
async fn refuse_archived(
    gw: &Gateway,
    caller: &Caller<'_>,
    topic: &str,
    ranges: &[SeqRange],
) -> Result<(), Refusal> {
    Ok(gw
        .governance
        .refuse_archived(caller.tenant, topic, ranges)
        .await?)
}

/// `ranges` and the edits (replacement messages) of the messages in them:
/// taking a message back takes every text it had. The edits come from the
/// hot copy (the newest) and the revisions table (all the store has seen).
async fn with_edits(
    gw: &Gateway,
    caller: &Caller<'_>,
    topic: &str,
    ranges: Vec<SeqRange>,
) -> Result<Vec<SeqRange>, Refusal> {
    let mut edits: Vec<i64> = read_ranges(gw, caller, topic, &ranges)
        .await?
        .iter()
        .filter_map(|m| m.edit_seq)
        .collect();
    let pool = gw.pools.get(caller.tenant).map_err(Refusal::internal)?;
    for r in &ranges {
        let seqs: Vec<i64> = sqlx::query_scalar(
            "SELECT edit_seq FROM im_message_revisions \
             WHERE topic = ? AND action = 'edit' AND edit_seq IS NOT NULL AND seqid >= ? AND seqid < ?",
        )
        .bind(topic)
        .bind(r.low)
        .bind(r.hi)
        .fetch_all(pool)
        .await
        .map_err(Refusal::unavailable)?;
        edits.extend(seqs);
    }
    Ok(merged(ranges, &edits))
}

/// `ranges` plus the single seqs `extra`, sorted and merged (as a reader's
/// hidden ranges are).
fn merged(ranges: Vec<SeqRange>, extra: &[i64]) -> Vec<SeqRange> {
    let rows = ranges
        .iter()
        .map(|r| (r.low, r.hi))
        .chain(extra.iter().map(|s| (*s, s + 1)))
        .collect();
    crate::store::dellog::Hidden::new(rows)
        .ranges()
        .iter()
        .map(|&(low, hi)| SeqRange { low, hi })
        .collect()
}

/// The messages in `ranges` the caller can still see.
async fn read_ranges(
    gw: &Gateway,
    caller: &Caller<'_>,
    topic: &str,
    ranges: &[SeqRange],
) -> Result<Vec<StoredMessage>, Refusal> {
    let mut out = Vec::new();
    for r in ranges {
        let limit = (r.hi - r.low).min(crate::history::MAX_LIMIT);
        let q = PageQuery::new(Some(r.low), Some(r.hi), Some(limit), true)?.on_primary();
        out.extend(
            gw.history
                .page(caller.tenant, topic, caller.uid, q)
                .await?
                .messages,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::merged;
    use crate::events::SeqRange;

    fn r(low: i64, hi: i64) -> SeqRange {
        SeqRange { low, hi }
    }

    #[test]
    fn edits_join_the_ranges_they_follow_or_stand_alone() {
        assert_eq!(merged(vec![r(31, 32)], &[32]), vec![r(31, 33)]);
        assert_eq!(
            merged(vec![r(31, 32)], &[40, 35]),
            vec![r(31, 32), r(35, 36), r(40, 41)]
        );
        assert_eq!(merged(vec![r(5, 10)], &[7]), vec![r(5, 10)]);
        assert_eq!(merged(vec![r(8, 9), r(1, 3)], &[]), vec![r(1, 3), r(8, 9)]);
    }
}
