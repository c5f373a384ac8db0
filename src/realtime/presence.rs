//! Presence in Redis (seeds 001 §5.1, 002): users, their sessions, the
//! nodes' users, and per topic which nodes have online members — the index
//! the fan-out pipeline uses to publish only where someone listens. Every
//! key carries a TTL refreshed by the gateway's heartbeat, so a dead node's
//! presence disappears by itself.

use crate::redis_util::Redis;

use crate::keys::{TenantKeys, TopicKeys};

/// Groups larger than this get no `{pres on/off}` per member: in a big
/// group every reconnect would notify every attached session (N² frames
/// when a 10,000-member group comes back online at once).
pub const PRESENCE_ANNOUNCE_MAX_MEMBERS: i64 = 500;

/// Presence keys expire this long after the last heartbeat.
pub const PRESENCE_TTL_SECS: i64 = 90;
/// A member of each topic's online-node index that is no node: its score is
/// when the index is complete (one heartbeat after it was made, when every
/// node with members online has put itself in). Until then readers reach
/// every node.
const COMPLETE_MARKER: &str = "~complete";
/// Added to the heartbeat for that.
const COMPLETE_SLACK_MS: i64 = 2_000;

impl TenantKeys {
    pub fn presence_user(&self, uid: i64) -> String {
        format!("{}:presence", self.user_base(uid))
    }
    pub fn presence_sessions(&self, uid: i64) -> String {
        format!("{}:presence:sessions", self.user_base(uid))
    }
    pub fn presence_node_users(&self, node: &str) -> String {
        format!("{}:presence:users", self.node_base(node))
    }
    /// HASH: the user's whole session-control state (`session_control`),
    /// fields `v` (row version; absent: not cached, read MySQL), `av`
    /// (auth version), `disabled` (present while disabled) and
    /// `d:<device>` (a revoked device's generation). One key, so Redis
    /// evicts or loses it whole, never a revocation out of a cached state.
    pub fn control(&self, uid: i64) -> String {
        format!("{}:control", self.user_base(uid))
    }
}

impl TopicKeys {
    /// SET of online member uids (all nodes).
    pub fn online_members(&self) -> String {
        format!("{}:online_members", self.base())
    }
    /// SET of online member uids on one node.
    pub fn node_online_members(&self, node: &str) -> String {
        format!("{}:node:{node}:online_members", self.base())
    }
    /// ZSET node → last heartbeat ms: nodes with online members.
    pub fn online_nodes(&self) -> String {
        format!("{}:online_nodes", self.base())
    }
    /// HASH uid → attached session count across nodes (pres on/off).
    pub fn online_sessions(&self) -> String {
        format!("{}:online_sessions", self.base())
    }
}

/// A session logged in on `node`; returns the user's session count after
/// it (1: the user just came online). The user is written hidden: the
/// caller then puts whether they hide (incognito) as committed.
pub async fn user_online(
    redis: &mut Redis,
    tenant: &str,
    uid: i64,
    sid: &str,
    node: &str,
    now_ms: i64,
) -> redis::RedisResult<i64> {
    let k = TenantKeys::new(tenant);
    let mut pipe = redis::pipe();
    pipe.sadd(k.presence_sessions(uid), sid).ignore();
    pipe.expire(k.presence_sessions(uid), PRESENCE_TTL_SECS)
        .ignore();
    pipe.hset_multiple(
        k.presence_user(uid),
        &[
            ("online", "1".to_string()),
            // Hidden until the caller has put what is committed
            // (`relations::sync_hidden`): never shown against one's wish.
            ("hidden", "1".to_string()),
            ("node_id", node.to_string()),
            ("last_active_at", now_ms.to_string()),
        ],
    )
    .ignore();
    pipe.hincr(k.presence_user(uid), "session_count", 1);
    pipe.expire(k.presence_user(uid), PRESENCE_TTL_SECS)
        .ignore();
    pipe.sadd(k.presence_node_users(node), uid).ignore();
    let (count,): (i64,) = pipe.query_async(redis).await?;
    Ok(count)
}

/// A session ended; `still_on_node` tells whether the user has another
/// session on this node (the node keeps listing the user while it does).
/// Returns whether it was the user's last session anywhere.
pub async fn user_offline(
    redis: &mut Redis,
    tenant: &str,
    uid: i64,
    sid: &str,
    node: &str,
    still_on_node: bool,
    now_ms: i64,
) -> redis::RedisResult<bool> {
    let k = TenantKeys::new(tenant);
    let (left,): (i64,) = redis::pipe()
        .srem(k.presence_sessions(uid), sid)
        .ignore()
        .hincr(k.presence_user(uid), "session_count", -1)
        .query_async(redis)
        .await?;
    let mut pipe = redis::pipe();
    if !still_on_node {
        pipe.srem(k.presence_node_users(node), uid).ignore();
    }
    if left <= 0 {
        pipe.hset_multiple(
            k.presence_user(uid),
            &[
                ("online", "0".to_string()),
                ("last_seen_at", now_ms.to_string()),
            ],
        )
        .ignore()
        .hset(k.presence_user(uid), "session_count", 0)
        .ignore();
    }
    pipe.query_async::<()>(redis).await?;
    Ok(left <= 0)
}

/// Adds to `pipe` the read of how `uid` shows to others: answered by a
/// pair for [`shown_online`].
pub fn read_shown(pipe: &mut redis::Pipeline, keys: &TenantKeys, uid: i64) {
    pipe.cmd("HMGET")
        .arg(keys.presence_user(uid))
        .arg("online")
        .arg("hidden");
}

/// Whether a user shows as online to others, from [`read_shown`]'s
/// answer: online, and not hiding it (incognito).
pub fn shown_online(fields: &(Option<String>, Option<String>)) -> bool {
    fields.0.as_deref() == Some("1") && fields.1.as_deref() != Some("1")
}

/// Whether `uid` hides when online (incognito), as their presence says:
/// `None` when it does not say (no presence, after a Redis loss, or
/// unreadable); ask MySQL then.
pub async fn hidden(redis: &mut Redis, tenant: &str, uid: i64) -> Option<bool> {
    let flag: redis::RedisResult<Option<String>> = redis::cmd("HGET")
        .arg(TenantKeys::new(tenant).presence_user(uid))
        .arg("hidden")
        .query_async(redis)
        .await;
    flag.ok().flatten().map(|f| f == "1")
}

/// What attaching or detaching a session changed in a topic's presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The user's first attached session anywhere came (attach) or the last
    /// one went (detach), and the group is small enough to tell every
    /// attached session (→ `{pres topic=T src=usr… what="on"|"off"}`).
    pub announce: bool,
    /// Members with an attached session after the change.
    pub online_members: i64,
    /// An attach (else a detach).
    pub attached: bool,
}

impl Change {
    /// After an attach: whether another member is attached too, the
    /// group's `online` in the attaching member's `me` topic.
    pub fn others_attached(&self) -> bool {
        self.online_members > 1
    }

    /// Whether the attached members' `online` of the group in their `me`
    /// topic flipped: with two attached each sees another member (on), with
    /// one left the remaining member sees nobody (off). Only told when the
    /// member change itself is announced (small groups).
    pub fn flips_group_online(&self) -> bool {
        self.announce && self.online_members == if self.attached { 2 } else { 1 }
    }
}

/// A user's session attached to a topic.
/// `heartbeat_ms` is the node's heartbeat interval.
pub async fn attach(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    uid: i64,
    node: &str,
    now_ms: i64,
    heartbeat_ms: i64,
) -> redis::RedisResult<Change> {
    let k = TopicKeys::new(tenant, topic);
    let (count, members, online_members): (i64, i64, i64) = redis::pipe()
        .sadd(k.online_members(), uid)
        .ignore()
        .expire(k.online_members(), PRESENCE_TTL_SECS)
        .ignore()
        .sadd(k.node_online_members(node), uid)
        .ignore()
        .expire(k.node_online_members(node), PRESENCE_TTL_SECS)
        .ignore()
        .zadd(k.online_nodes(), node, now_ms)
        .ignore()
        .cmd("ZADD")
        .arg(k.online_nodes())
        .arg("NX")
        .arg(now_ms + heartbeat_ms + COMPLETE_SLACK_MS)
        .arg(COMPLETE_MARKER)
        .ignore()
        .expire(k.online_nodes(), PRESENCE_TTL_SECS)
        .ignore()
        .hincr(k.online_sessions(), uid, 1)
        .expire(k.online_sessions(), PRESENCE_TTL_SECS)
        .ignore()
        .scard(k.members())
        .scard(k.online_members())
        .query_async(redis)
        .await?;
    Ok(Change {
        announce: count == 1 && members <= PRESENCE_ANNOUNCE_MAX_MEMBERS,
        online_members,
        attached: true,
    })
}

/// A user's session detached; `still_on_node` tells whether another of the
/// user's sessions on this node is still attached.
pub async fn detach(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    uid: i64,
    node: &str,
    still_on_node: bool,
) -> redis::RedisResult<Change> {
    let k = TopicKeys::new(tenant, topic);
    let (count, members): (i64, i64) = redis::pipe()
        .hincr(k.online_sessions(), uid, -1)
        .scard(k.members())
        .query_async(redis)
        .await?;
    let mut pipe = redis::pipe();
    if !still_on_node {
        pipe.srem(k.node_online_members(node), uid).ignore();
    }
    if count <= 0 {
        pipe.hdel(k.online_sessions(), uid).ignore();
        pipe.srem(k.online_members(), uid).ignore();
    }
    pipe.scard(k.online_members());
    let (online_members,): (i64,) = pipe.query_async(redis).await?;
    Ok(Change {
        announce: count <= 0 && members <= PRESENCE_ANNOUNCE_MAX_MEMBERS,
        online_members,
        attached: false,
    })
}

/// Nodes that have had online members of `topic` within the presence TTL.
pub async fn online_nodes(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    now_ms: i64,
) -> redis::RedisResult<Option<Vec<String>>> {
    let k = TopicKeys::new(tenant, topic);
    let (exists, complete_at, nodes): (bool, Option<f64>, Vec<String>) = redis::pipe()
        .exists(k.online_nodes())
        .zscore(k.online_nodes(), COMPLETE_MARKER)
        .cmd("ZRANGEBYSCORE")
        .arg(k.online_nodes())
        .arg(now_ms - PRESENCE_TTL_SECS * 1000)
        .arg("+inf")
        .query_async(redis)
        .await?;
    // Missing, or made anew (after a Redis loss) less than one heartbeat
    // ago so that some nodes have not put themselves back yet: every node.
    if !exists || complete_at.is_some_and(|t| (now_ms as f64) < t) {
        return Ok(None);
    }
    Ok(Some(
        nodes.into_iter().filter(|n| n != COMPLETE_MARKER).collect(),
    ))
}

/// Heartbeat of one node: refreshes the TTLs of its users and topics.
pub async fn refresh(
    redis: &mut Redis,
    node: &str,
    users: &[(String, i64)],
    topics: &[(String, String)],
    now_ms: i64,
    heartbeat_ms: i64,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for (tenant, uid) in users {
        let k = TenantKeys::new(tenant);
        pipe.expire(k.presence_user(*uid), PRESENCE_TTL_SECS)
            .ignore();
        pipe.expire(k.presence_sessions(*uid), PRESENCE_TTL_SECS)
            .ignore();
        pipe.expire(k.presence_node_users(node), PRESENCE_TTL_SECS)
            .ignore();
    }
    for (tenant, topic) in topics {
        let k = TopicKeys::new(tenant, topic);
        pipe.zadd(k.online_nodes(), node, now_ms).ignore();
        pipe.cmd("ZADD")
            .arg(k.online_nodes())
            .arg("NX")
            .arg(now_ms + heartbeat_ms + COMPLETE_SLACK_MS)
            .arg(COMPLETE_MARKER)
            .ignore();
        for key in [
            k.online_nodes(),
            k.online_members(),
            k.node_online_members(node),
            k.online_sessions(),
        ] {
            pipe.expire(key, PRESENCE_TTL_SECS).ignore();
        }
    }
    pipe.query_async(redis).await
}

#[cfg(test)]
mod tests {
    use super::Change;

    fn change(attached: bool, online_members: i64) -> Change {
        Change {
            announce: true,
            online_members,
            attached,
        }
    }

    #[test]
    fn the_group_turns_online_for_the_first_member_when_a_second_comes() {
        assert!(!change(true, 1).flips_group_online());
        assert!(change(true, 2).flips_group_online());
        assert!(!change(true, 3).flips_group_online());
    }

    #[test]
    fn the_group_turns_offline_for_the_last_member_left() {
        assert!(change(false, 1).flips_group_online());
        assert!(!change(false, 2).flips_group_online());
        assert!(!change(false, 0).flips_group_online());
    }

    #[test]
    fn big_groups_are_not_told() {
        let quiet = Change {
            announce: false,
            ..change(true, 2)
        };
        assert!(!quiet.flips_group_online());
    }
}
