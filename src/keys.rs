//! Redis key names, in one place (ARCHITECTURE.md §8, seeds 000 §3.3 and
//! 001 §5). Per-topic keys share the Cluster hash tag `{tenant:topic}` so a
//! script touches one slot; tenant-wide keys use `{tenant}`.

/// How long an idempotency claim ([`TopicKeys::uniq`]) lives: a claim
/// (pending or done) answers retries with the same identity for a day. A
/// pending claim never expires sooner: its event may be in the log.
pub const CLAIM_TTL_MS: u64 = 24 * 3600 * 1000;

/// Keys of one topic of one tenant.
#[derive(Debug, Clone)]
pub struct TopicKeys {
    base: String,
}

impl TopicKeys {
    pub fn new(tenant: &str, topic: &str) -> Self {
        Self {
            base: format!("im:{{{tenant}:{topic}}}"),
        }
    }

    /// The `im:{tenant:topic}` prefix of every key of this topic.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// HASH `last_seq`, `inc`, `end`, `month_floor`, `rec`, `blk`, `at`,
    /// `pf`: the topic's seq allocator, handing out seqs below `end`, the
    /// top of a block reserved in the durable mark first (`send::marks`).
    /// Its absence means "new topic or Redis lost its data".
    pub fn seq(&self) -> String {
        format!("{}:seq", self.base)
    }
    /// HASH `group_id`, `status` (`active` | `dissolved` | `none`),
    /// `mute_all`, `owner`, `prev_owner`, `version`, `inc`, `epoch`,
    /// `unsynced`, `unsynced_claim`: the group's write model (see
    /// `group_model`), with `members`, `roles`, `mutes`, `invites` and
    /// `left`, each holding a placeholder `-` so all five exist while the
    /// model does.
    pub fn meta(&self) -> String {
        format!("{}:meta", self.base)
    }
    /// SET of member uids (plus a placeholder: an empty set is still there).
    pub fn members(&self) -> String {
        format!("{}:members", self.base)
    }
    /// HASH uid → role, only for owner and admins.
    pub fn roles(&self) -> String {
        format!("{}:roles", self.base)
    }
    /// HASH uid → muted-until (epoch ms).
    pub fn mutes(&self) -> String {
        format!("{}:mutes", self.base)
    }
    /// HASH uid → inviter: pending invitations (not members yet).
    pub fn invites(&self) -> String {
        format!("{}:invites", self.base)
    }
    /// HASH uid → `left_seq|back_seq`: the last seq allocated when the user
    /// was removed (and when they came back, empty while out). A message
    /// past `left_seq` (and not past `back_seq`) is never delivered or
    /// pushed to them, whatever the projections have applied.
    pub fn left(&self) -> String {
        format!("{}:left", self.base)
    }
    /// STRING JSON: the outcome of one governance command of `actor`
    /// (its answer and its events), so a retry gets the same ones.
    pub fn command(&self, actor: i64, command_id: &str) -> String {
        format!("{}:cmd:{actor}:{command_id}", self.base)
    }
    /// STRING: no group has this name (a restore found none), for a while:
    /// every gateway answers it without asking MySQL again.
    pub fn absent(&self) -> String {
        format!("{}:absent", self.base)
    }
    /// Lock held while the group's write model is rebuilt.
    pub fn group_rebuild_lock(&self) -> String {
        format!("{}:group:rebuild_lock", self.base)
    }
    /// HASH: history-clear ranges `uid` holds in this topic (`n`, `inc`),
    /// see `caps`: `limits.dellog_per_user` checked and counted in one script.
    pub fn dellog_count(&self, uid: i64) -> String {
        format!("{}:dellog_count:{uid}", self.base)
    }
    /// Idempotency claim of one client message id.
    pub fn uniq(&self, uid: i64, client_msg_id: &str) -> String {
        format!("{}:uniq:msg:{uid}:{client_msg_id}", self.base)
    }
    /// ZSET month → first seq of the topic in that month (seed 000 §3.3).
    pub fn route(&self) -> String {
        format!("{}:groupmsg:route", self.base)
    }
    /// HASH month → `min_seq=..,max_seq=..,count=..`.
    pub fn route_meta(&self) -> String {
        format!("{}:groupmsg:route_meta", self.base)
    }
    /// Lock held while the seq allocator is re-seeded.
    pub fn reseed_lock(&self) -> String {
        format!("{}:seq:reseed_lock", self.base)
    }
    /// STRING lock: one change of the chat's pins at a time, from its
    /// produce to its write-through, so the writes happen in log order.
    pub fn pins_lock(&self) -> String {
        format!("{}:pins_lock", self.base)
    }
    /// ZSET of hot message seqs (score = seq).
    pub fn hot_seqs(&self) -> String {
        format!("{}:hot_msg_seqs", self.base)
    }
    /// STRING snapshot of one hot message.
    pub fn hot_msg(&self, seq: i64) -> String {
        format!("{}{seq}", self.hot_msg_prefix())
    }
    /// What every hot snapshot key starts with (`lua/hot_page.lua` builds
    /// them from it).
    pub fn hot_msg_prefix(&self) -> String {
        format!("{}:hot_msg:", self.base)
    }
    /// STRING `pending|done`: this message's push tasks were produced.
    pub fn push_claim(&self, seq: i64) -> String {
        format!("{}:push:{seq}", self.base)
    }
    /// Counter of delete transaction ids of a topic from before durable
    /// marks (`store::marks::next_del_id` goes on from it).
    pub fn del_id(&self) -> String {
        format!("{}:del_id", self.base)
    }
    /// STRING `seq|touched_ms|from|±preview`: the topic's chat-list state
    /// (hot copy of `im_conversation_topics`, see `conversations::hot`).
    pub fn chat(&self) -> String {
        format!("{}:chat", self.base)
    }
    /// STRING JSON: the group's public profile as chat lists show it.
    pub fn profile(&self) -> String {
        format!("{}:profile", self.base)
    }
}

/// Keys of one user of one tenant that are read or written per user (the
/// chat list): their own hash tag `{tenant:u<uid>}`, so a busy tenant is
/// not one slot.
#[derive(Debug, Clone)]
pub struct UserKeys {
    base: String,
}

impl UserKeys {
    pub fn new(tenant: &str, uid: i64) -> Self {
        Self {
            base: format!("im:{{{tenant}:u{uid}}}"),
        }
    }

    /// HASH: the user's chat list hot copy — `<topic>` → membership,
    /// `c:<topic>` → cursors, `_v` present once the copy is complete.
    pub fn chats(&self) -> String {
        format!("{}:chats", self.base)
    }
    /// STRING counter bumped by every change a fill must not overwrite
    /// (`lua/cache_chats.lua`).
    pub fn chats_version(&self) -> String {
        format!("{}:chats_ver", self.base)
    }
    /// STRING JSON: the user's public profile as chat lists show it.
    pub fn profile(&self) -> String {
        format!("{}:profile", self.base)
    }
    /// STRING lock: one block, unblock, mute, unmute or chat setting of the user at a
    /// time, from its produce to its write-through, so the writes happen in
    /// log order.
    pub fn blocks_lock(&self) -> String {
        format!("{}:blocks_lock", self.base)
    }
    /// STRING: held while an operator's session-control change of the user
    /// is produced and put in force, so those writes happen in log order.
    pub fn control_lock(&self) -> String {
        format!("{}:control_lock", self.base)
    }
    /// HASH: the user's favorites cap (`n`, `inc`, `i:<topic|seq>`), see
    /// `caps`: `limits.favorites_per_user` checked and taken in one script.
    pub fn favorites(&self) -> String {
        format!("{}:favorites", self.base)
    }
}

/// Tenant-wide keys, and per-user or per-node keys of the tenant that are
/// touched per session or per message: those carry the user's or the
/// node's own hash tag, so one busy tenant is not one Redis Cluster slot.
#[derive(Debug, Clone)]
pub struct TenantKeys {
    base: String,
    tenant: String,
}

impl TenantKeys {
    pub fn new(tenant: &str) -> Self {
        Self {
            base: format!("im:{{{tenant}}}"),
            tenant: tenant.to_string(),
        }
    }

    /// The `im:{tenant}` prefix of every tenant-wide key.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The `im:{tenant:u<uid>}` prefix of a user's keys (one slot per user).
    pub fn user_base(&self, uid: i64) -> String {
        format!("im:{{{}:u{uid}}}", self.tenant)
    }

    /// The `im:{tenant:n:<node>}` prefix of a gateway node's keys.
    pub fn node_base(&self, node: &str) -> String {
        format!("im:{{{}:n:{node}}}", self.tenant)
    }

    /// STRING `YYYYMM`: the month new messages go to (only moves forward).
    pub fn active_month(&self) -> String {
        format!("{}:groupmsg:active_month", self.base)
    }
    /// STRING `YYYYMM@epoch_ms`: a month switch the shard manager announced;
    /// from that instant of the Redis clock `lua/allocate_seq.lua` gives
    /// that month, until the active month itself moves and this is removed.
    pub fn month_switch(&self) -> String {
        format!("{}:groupmsg:month_switch", self.base)
    }
    /// Lock of the shard manager's month switch.
    pub fn shard_lock(&self) -> String {
        format!("{}:groupmsg:shard_lock", self.base)
    }
    /// STRING `<id>|<created_ms>`: set once per Redis dataset. A young
    /// generation means Redis may have lost data recently.
    pub fn generation(&self) -> String {
        format!("{}:generation", self.base)
    }
    /// SET of a user's friends (cache; `0` marks an empty cached set).
    pub fn friends(&self, uid: i64) -> String {
        format!("{}:user:{uid}:friends", self.base)
    }
    /// SET of the users a user blocked (cache; `0` marks an empty set).
    pub fn blocks(&self, uid: i64) -> String {
        format!("{}:user:{uid}:blocks", self.base)
    }
    /// STRING present while a user is in do-not-disturb.
    pub fn dnd(&self, uid: i64) -> String {
        format!("{}:user:{uid}:dnd", self.base)
    }
    /// SET of topics a user muted for push.
    pub fn push_muted(&self, uid: i64) -> String {
        format!("{}:user:{uid}:push_muted", self.base)
    }
    /// ZSET `topic\ncommand key` → ms: governance commands whose events
    /// may not be in the log yet (a gateway died between the change and
    /// the produce); swept by every gateway.
    pub fn governance_pending(&self) -> String {
        format!("{}:gov:pending", self.base)
    }
    /// STRING: the incarnation(s) of Redis whose write-side state has been
    /// restored for this tenant (`recovery`): the run_id of the server, or
    /// of every primary of a cluster, sorted and joined by `,`.
    pub fn restored(&self) -> String {
        format!("{}:restored", self.base)
    }
    /// STRING `<incarnation>@<began ms>`: a restore pass of that
    /// incarnation ran to its end (every conversation's allocator and
    /// model restored, not only the claims `restored` covers).
    pub fn restore_done(&self) -> String {
        format!("{}:restore_done", self.base)
    }
    /// Lock held by the process restoring the tenant's write-side state.
    pub fn restore_lock(&self) -> String {
        format!("{}:restore_lock", self.base)
    }
    /// STRING: a push task was delivered (dedup of the push sender).
    pub fn push_sent(&self, task_id: &str) -> String {
        format!("{}:push:sent:{task_id}", self.base)
    }
}

/// Keys shared by every tenant (leases of process identities).
pub fn snowflake_worker(worker: u16) -> String {
    format!("im:{{global}}:snowflake:worker:{worker}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_keys_share_one_hash_tag() {
        let k = TopicKeys::new("acme", "grpX");
        for key in [
            k.seq(),
            k.members(),
            k.uniq(7, "c1"),
            k.route(),
            k.route_meta(),
        ] {
            assert!(key.starts_with("im:{acme:grpX}:"), "{key}");
        }
        assert_eq!(k.route(), "im:{acme:grpX}:groupmsg:route");
        let u = UserKeys::new("acme", 7);
        assert_eq!(u.chats(), "im:{acme:u7}:chats");
        assert!(u.chats_version().starts_with("im:{acme:u7}:"));
        let t = TenantKeys::new("acme");
        assert_eq!(t.active_month(), "im:{acme}:groupmsg:active_month");
        // Per session and per message: the user's or the node's own slot.
        assert_eq!(t.presence_user(7), "im:{acme:u7}:presence");
        assert_eq!(t.control(7), "im:{acme:u7}:control");
        assert!(t.presence_node_users("gw1").starts_with("im:{acme:n:gw1}:"));
    }
}
