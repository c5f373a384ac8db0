//! Rebuilding one group's write model when Redis does not hold a live one:
//! missing (a new topic, a Redis that lost its data) or written by another
//! incarnation of Redis (a restart from an older AOF or RDB, a replica
//! promoted while it lagged), which may be older than what was
//! acknowledged.
//!
//! The model is what the members projection stored in MySQL
//! (`im_groups`, `im_group_members`, `im_group_invites`) with the
//! membership events of the log tail that projection has not committed
//! applied on top, in log order. Every membership event sets a fact
//! absolutely (a member in or out, a role, a mute), so applying a suffix
//! of the log again to a state that already holds part of it converges to
//! the same model, exactly as the projection does.
//!
//! An acknowledged command's events are in the log; a command that was
//! changing the old model when it was lost acks or fails within the
//! producer's delivery timeout. So when the model may have been lost (the
//! tenant's Redis dataset is young) or is stale (another incarnation), the
//! rebuild first waits out that in-flight window, as the seq re-seed does
//! (`send::reseed`). Until it is installed, commands and sends of the
//! group get a retryable answer.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use sqlx::Row;

use crate::events::{GroupEvent, GroupEventBody};
use crate::groups::{Role, MEMBERS_PLACEHOLDER};
use crate::kafka::producer::IN_FLIGHT_WINDOW_MS;
use crate::keys::TopicKeys;
use crate::redis_util::RedisLock;

use super::{Existence, Inner};

static INSTALL: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/group_install.lua")));

/// How long a "no such group" answer is kept: a name nobody created costs
/// one rebuild per this long, and a group that appears in the log without
/// a command (a replayed log, a test fixture) is seen within it.
const NONE_TTL_MS: i64 = 30_000;
/// How long a caller waits for another gateway's rebuild of the same group.
const WAIT_FOR_OTHER: Duration = Duration::from_secs(20);

/// A group as the rebuild derives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derived {
    /// `None` while no group exists.
    pub status: Option<&'static str>,
    pub group_id: i64,
    pub owner: i64,
    pub prev_owner: i64,
    pub mute_all: bool,
    /// uid → (role, muted until)
    pub members: BTreeMap<i64, (Role, Option<i64>)>,
    /// uid → inviter
    pub invites: BTreeMap<i64, i64>,
}

impl Derived {
    /// Applies one event of the group, as the members projection does.
    pub fn apply(&mut self, event: &GroupEvent) {
        if let GroupEventBody::GroupCreated(g) = &event.body {
            // A topic is one group for good: another group id is refused,
            // as the projection refuses it.
            if self.status.is_some() && self.group_id != g.group_id {
                return;
            }
            if self.status.is_none() {
                self.status = Some("active");
                self.group_id = g.group_id;
                self.owner = g.owner_uid;
            }
            for uid in g.members.iter().chain([&g.owner_uid]) {
                let role = if *uid == g.owner_uid {
                    Role::Owner
                } else {
                    Role::Member
                };
                self.members.entry(*uid).or_insert((role, None));
            }
            return;
        }
        if self.status.is_none() {
            return;
        }
        match &event.body {
            GroupEventBody::MemberJoined(j) => {
                let role = Role::parse(&j.role);
                self.members.entry(j.uid).or_insert((role, None));
                self.invites.remove(&j.uid);
            }
            GroupEventBody::MemberLeft(l) => {
                self.members.remove(&l.uid);
                self.invites.remove(&l.uid);
            }
            GroupEventBody::MemberRoleChanged(c) => {
                let role = Role::parse(&c.role);
                if let Some(m) = self.members.get_mut(&c.uid) {
                    m.0 = role;
                }
                if role == Role::Owner && self.owner != c.uid {
                    self.prev_owner = self.owner;
                    self.owner = c.uid;
                }
            }
            GroupEventBody::MemberMuted(mu) => {
                if let Some(m) = self.members.get_mut(&mu.uid) {
                    m.1 = mu.muted_until;
                }
            }
            GroupEventBody::GroupMuteChanged(g) => self.mute_all = g.mute_all,
            GroupEventBody::GroupDissolved(_) => {
                self.status = Some("dissolved");
                self.invites.clear();
            }
            // An invitation of a member is none.
            GroupEventBody::MemberInvited(i) if !self.members.contains_key(&i.uid) => {
                self.invites.insert(i.uid, i.invited_by);
            }
            GroupEventBody::MemberInviteDeclined(d) => {
                self.invites.remove(&d.uid);
            }
            _ => {}
        }
    }
}

/// What Redis holds for the group now.
struct Seen {
    present: bool,
    inc: String,
    run_id: String,
}

impl Seen {
    async fn read(redis: &mut crate::redis_util::Redis, keys: &TopicKeys) -> Result<Seen, String> {
        let (status, inc, members): (Option<String>, Option<String>, bool) = redis::pipe()
            .hget(keys.meta(), "status")
            .hget(keys.meta(), "inc")
            .exists(keys.members())
            .query_async(redis)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Seen {
            present: status.is_some() && members,
            inc: inc.unwrap_or_default(),
            run_id: run_id(redis, keys).await?,
        })
    }

    fn live(&self) -> bool {
        self.present && !self.run_id.is_empty() && self.inc == self.run_id
    }
}

/// The run_id of the Redis server that holds the group's keys.
async fn run_id(redis: &mut crate::redis_util::Redis, keys: &TopicKeys) -> Result<String, String> {
    // Through the seq state script: it runs on the node of the topic's slot.
    let v: Vec<String> = redis::Script::new(include_str!("../../lua/seq_state.lua"))
        .key(keys.seq())
        .invoke_async(redis)
        .await
        .map_err(|e| e.to_string())?;
    Ok(v.get(3).cloned().unwrap_or_default())
}

/// Rebuilds `topic`'s model unless a live one is there (see the module
/// docs). No group of that name: nothing is written (`Absent`), unless
/// `mark_none` (a create is about to decide) installs the `none` marker.
pub(super) async fn rebuild(
    inner: &Inner,
    tenant: &str,
    topic: &str,
    mark_none: bool,
) -> Result<Existence, String> {
    let keys = TopicKeys::new(tenant, topic);
    let mut redis = inner.redis.clone();
    let seen = Seen::read(&mut redis, &keys).await?;
    if seen.live() {
        return Ok(Existence::Live);
    }
    let Some(lock) = RedisLock::acquire(&mut redis, &keys.group_rebuild_lock(), 120_000)
        .await
        .map_err(|e| e.to_string())?
    else {
        // Another gateway rebuilds it: wait for its model.
        let deadline = tokio::time::Instant::now() + WAIT_FOR_OTHER;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if Seen::read(&mut redis, &keys).await?.live() {
                return Ok(Existence::Live);
            }
        }
        return Err("another gateway is rebuilding this group".into());
    };
    let result = rebuild_locked(inner, tenant, topic, &keys, &mut redis, mark_none).await;
    let _ = lock.release(&mut redis).await;
    result
}

async fn rebuild_locked(
    inner: &Inner,
    tenant: &str,
    topic: &str,
    keys: &TopicKeys,
    redis: &mut crate::redis_util::Redis,
    mark_none: bool,
) -> Result<Existence, String> {
    // Another rebuild may have finished while this one waited for the lock.
    let seen = Seen::read(redis, keys).await?;
    if seen.live() {
        return Ok(Existence::Live);
    }
    let p2p = crate::tinode::parse_p2p_topic(topic);
    if p2p.is_none() {
        let wait = if seen.present {
            metrics::counter!(crate::metrics::GROUP_REBUILDS_TOTAL, "why" => "fenced").increment(1);
            tracing::warn!(
                tenant,
                topic,
                written_by = %seen.inc,
                now = %seen.run_id,
                wait_ms = IN_FLIGHT_WINDOW_MS,
                "group state written by another incarnation of Redis; re-deriving it from MySQL and the log"
            );
            IN_FLIGHT_WINDOW_MS
        } else {
            let age = crate::redis_util::generation::generation_age_ms(redis, tenant)
                .await
                .map_err(|e| e.to_string())?;
            let wait = (IN_FLIGHT_WINDOW_MS - age).max(0);
            let why = if wait > 0 { "lost" } else { "missing" };
            metrics::counter!(crate::metrics::GROUP_REBUILDS_TOTAL, "why" => why).increment(1);
            if wait > 0 {
                tracing::warn!(
                    tenant,
                    topic,
                    wait_ms = wait,
                    "Redis lost its data recently; waiting out in-flight commands before rebuilding the group"
                );
            }
            wait
        };
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
    let derived = match p2p {
        // A one-to-one topic is a group of its two users, always active.
        Some((a, b)) => Derived {
            status: Some("active"),
            members: [(a, (Role::Member, None)), (b, (Role::Member, None))]
                .into_iter()
                .collect(),
            ..Default::default()
        },
        None => derive(inner, tenant, topic).await?,
    };
    if derived.status.is_none() && !mark_none {
        // No group: a stale model (another incarnation's) of a name that is
        // no group is dropped; nothing new is written.
        if seen.present {
            let _: () = redis::cmd("DEL")
                .arg(keys.meta())
                .arg(keys.members())
                .arg(keys.roles())
                .arg(keys.mutes())
                .arg(keys.invites())
                .query_async(redis)
                .await
                .map_err(|e| e.to_string())?;
        }
        return Ok(Existence::Absent);
    }
    let mut call = INSTALL.prepare_invoke();
    call.key(keys.meta())
        .key(keys.members())
        .key(keys.roles())
        .key(keys.mutes())
        .key(keys.invites())
        .arg(if seen.present { seen.inc.as_str() } else { "" })
        .arg(if derived.status.is_none() {
            NONE_TTL_MS
        } else {
            0
        })
        .arg(derived.status.unwrap_or("none"))
        .arg(derived.group_id)
        .arg(if derived.owner > 0 {
            derived.owner.to_string()
        } else {
            String::new()
        })
        .arg(if derived.prev_owner > 0 {
            derived.prev_owner.to_string()
        } else {
            String::new()
        })
        .arg(if derived.mute_all { "1" } else { "0" })
        .arg(MEMBERS_PLACEHOLDER)
        .arg(derived.members.len());
    for (uid, (role, muted)) in &derived.members {
        call.arg(uid)
            .arg(if *role == Role::Member {
                ""
            } else {
                role.as_str()
            })
            .arg(muted.map(|m| m.to_string()).unwrap_or_default());
    }
    call.arg(derived.invites.len());
    for (uid, by) in &derived.invites {
        call.arg(uid).arg(by);
    }
    let installed: i64 = call.invoke_async(redis).await.map_err(|e| e.to_string())?;
    if installed == 1 && derived.status.is_some() {
        tracing::info!(
            tenant,
            topic,
            members = derived.members.len(),
            status = derived.status,
            "group write model rebuilt from MySQL and the log"
        );
    }
    Ok(Existence::Live)
}

/// The group from the members projection plus the uncommitted log tail.
async fn derive(inner: &Inner, tenant: &str, topic: &str) -> Result<Derived, String> {
    let pool = inner.pools.get(tenant).map_err(|e| e.to_string())?;
    let mut derived = stored(pool, topic).await.map_err(|e| e.to_string())?;
    let config = &inner.config;
    let group = format!("{}.members", config.pipelines.group_prefix);
    let _permit = scans(config).acquire().await.map_err(|e| e.to_string())?;
    let tail = crate::kafka::log_tail::events_in_tail(
        config,
        &group,
        &format!("{tenant}:{topic}"),
        &inner.codec,
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| e.to_string())?;
    for event in &tail {
        derived.apply(event);
    }
    Ok(derived)
}

/// Concurrent log-tail scans of this process (`limits.reseed_scans`).
fn scans(config: &crate::config::Config) -> &'static tokio::sync::Semaphore {
    static SCANS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SCANS.get_or_init(|| tokio::sync::Semaphore::new(config.limits.reseed_scans.max(1)))
}

/// What the members projection stored.
async fn stored(pool: &sqlx::MySqlPool, topic: &str) -> Result<Derived, sqlx::Error> {
    let Some(row) =
        sqlx::query("SELECT group_id, status, mute_all, owner_uid FROM im_groups WHERE topic = ?")
            .bind(topic)
            .fetch_optional(pool)
            .await?
    else {
        return Ok(Derived::default());
    };
    let status: String = row.try_get(1)?;
    let mut derived = Derived {
        status: Some(if status == "dissolved" {
            "dissolved"
        } else {
            "active"
        }),
        group_id: row.try_get(0)?,
        mute_all: row.try_get::<i8, _>(2)? != 0,
        owner: row.try_get::<Option<i64>, _>(3)?.unwrap_or(0),
        ..Default::default()
    };
    let members = sqlx::query(
        "SELECT uid, role, CAST(UNIX_TIMESTAMP(muted_until) * 1000 AS SIGNED) \
         FROM im_group_members WHERE topic = ?",
    )
    .bind(topic)
    .fetch_all(pool)
    .await?;
    for r in members {
        derived.members.insert(
            r.try_get(0)?,
            (
                Role::parse(&r.try_get::<String, _>(1)?),
                r.try_get::<Option<i64>, _>(2)?,
            ),
        );
    }
    let invites: Vec<(i64, i64)> =
        sqlx::query_as("SELECT uid, invited_by FROM im_group_invites WHERE topic = ?")
            .bind(topic)
            .fetch_all(pool)
            .await?;
    derived.invites = invites.into_iter().collect();
    Ok(derived)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::*;

    fn event(body: GroupEventBody) -> GroupEvent {
        GroupEvent::new("t", "grpX", 1, body)
    }

    #[test]
    fn the_tail_applies_on_top_of_what_was_stored_and_again_changes_nothing() {
        let tail = vec![
            event(GroupEventBody::GroupCreated(GroupCreated {
                group_id: 9,
                name: "x".into(),
                owner_uid: 1,
                members: vec![2, 3],
            })),
            event(GroupEventBody::MemberLeft(MemberLeft {
                uid: 2,
                kicked: true,
            })),
            event(GroupEventBody::MemberRoleChanged(MemberRoleChanged {
                uid: 3,
                role: "owner".into(),
            })),
            event(GroupEventBody::MemberRoleChanged(MemberRoleChanged {
                uid: 1,
                role: "admin".into(),
            })),
            event(GroupEventBody::MemberInvited(MemberInvited {
                uid: 4,
                invited_by: 3,
            })),
            // Another group's create of the same name changes nothing.
            event(GroupEventBody::GroupCreated(GroupCreated {
                group_id: 777,
                name: "forged".into(),
                owner_uid: 5,
                members: vec![5],
            })),
        ];
        let mut d = Derived::default();
        for e in &tail {
            d.apply(e);
        }
        let once = d.clone();
        // The projection had applied part of the tail already.
        for e in &tail {
            d.apply(e);
        }
        assert_eq!(d, once);
        assert_eq!(d.status, Some("active"));
        assert_eq!((d.owner, d.prev_owner), (3, 1));
        assert_eq!(
            d.members.keys().copied().collect::<Vec<_>>(),
            vec![1, 3],
            "{d:?}"
        );
        assert_eq!(d.members[&3].0, Role::Owner);
        assert_eq!(d.invites.get(&4), Some(&3));
    }
}
