//! Replies (seed 000 §12 item 7), shared by the WebSocket and HTTP front
//! ends: a message whose `head.reply` names an earlier message of its topic
//! (`"123"`, as Tinode clients send it). The sender must be a member and
//! the replied message must exist for them (read from the primary, so one
//! sent a moment ago is found; else 404); its thread's root goes to the send path, which stores both
//! (`reply_seqid`, `root_seqid`): the root of a reply to a reply is the
//! first message of the thread, whatever month each is in.

use super::refusal::Refusal;
use super::Gateway;

/// The root of the thread `head` replies in (`None` when it is no reply).
pub async fn reply_root(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    uid: i64,
    head: Option<&str>,
) -> Result<Option<i64>, Refusal> {
    let Some(seq) =
        crate::send::replied_seq(head).map_err(|e| Refusal(400, format!("malformed: {e}")))?
    else {
        return Ok(None);
    };
    // Only a member learns whether a seq exists.
    super::reads::ensure_member(gw, tenant, topic, uid).await?;
    let parent = gw
        .history
        .exact_on_primary(tenant, topic, uid, seq)
        .await?
        .ok_or_else(|| Refusal(404, format!("message {seq} to reply to not found")))?;
    Ok(Some(parent.root_seq.unwrap_or(parent.seq)))
}
