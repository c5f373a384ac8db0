//! A group from before durable models (a tenant upgraded with data, see
//! `store::marks::complete`), derived once when Redis does not hold a live
//! model of it, then stored (`super::durable`) so it never is again.
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
//! derivation first waits out that in-flight window. Groups of a tenant
//! set up with durable models never come here.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::Row;

use crate::events::{GroupEvent, GroupEventBody};
use crate::groups::Role;
use crate::kafka::producer::IN_FLIGHT_WINDOW_MS;
use crate::keys::TopicKeys;
use crate::redis_util::RedisLock;

use super::{durable, Inner};

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

/// Derives a group of a tenant from before durable models (see the module
/// docs): `None` when no group has the name there either.
pub(super) async fn legacy(
    inner: &Inner,
    tenant: &str,
    topic: &str,
) -> Result<Option<durable::Model>, String> {
    let keys = TopicKeys::new(tenant, topic);
    let mut redis = inner.redis.clone();
    // One gateway derives it; the others wait for its stored model.
    let Some(lock) = RedisLock::acquire(&mut redis, &keys.group_rebuild_lock(), 120_000)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Err("another gateway is deriving this group".into());
    };
    let result = async {
        let stale: Option<String> = redis::cmd("HGET")
            .arg(keys.meta())
            .arg("status")
            .query_async(&mut redis)
            .await
            .map_err(|e| e.to_string())?;
        let wait = if stale.is_some() {
            IN_FLIGHT_WINDOW_MS
        } else {
            let age = crate::redis_util::generation::generation_age_ms(&mut redis, tenant)
                .await
                .map_err(|e| e.to_string())?;
            (IN_FLIGHT_WINDOW_MS - age).max(0)
        };
        metrics::counter!(crate::metrics::GROUP_REBUILDS_TOTAL, "why" => if wait > 0 { "lost" } else { "missing" })
            .increment(1);
        if wait > 0 {
            tracing::warn!(
                tenant,
                topic,
                wait_ms = wait,
                "a group from before durable models, not live in Redis: waiting out in-flight commands, then deriving it from MySQL and the log"
            );
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        let derived = derive(inner, tenant, topic).await?;
        Ok(derived.into_model())
    }
    .await;
    let _ = lock.release(&mut redis).await;
    result
}

impl Derived {
    /// The derived group as a durable model (version 1: its line of
    /// versions starts here), `None` when there is no group.
    fn into_model(self) -> Option<durable::Model> {
        let status = self.status?;
        let mut rows: Vec<durable::Row> = self
            .members
            .iter()
            .map(|(uid, (role, muted))| durable::Row {
                uid: *uid,
                place: role.as_str().to_string(),
                muted_until: *muted,
                inviter: None,
                left_seq: None,
                back_seq: None,
            })
            .collect();
        rows.extend(self.invites.iter().map(|(uid, by)| durable::Row {
            uid: *uid,
            place: "invited".into(),
            muted_until: None,
            inviter: Some(*by),
            left_seq: None,
            back_seq: None,
        }));
        Some(durable::Model {
            meta: durable::Meta {
                group_id: self.group_id,
                status: status.to_string(),
                owner: self.owner,
                prev_owner: self.prev_owner,
                mute_all: self.mute_all,
            },
            version: 1,
            epoch: 0,
            rows,
        })
    }
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
