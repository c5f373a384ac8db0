//! The members pipeline's handler: membership events into MySQL
//! (`im_groups`, `im_group_members`, `im_group_invites`) and the chat
//! lists' hot copy, then the eviction of a removed member's (or a dissolved
//! group's) sessions on every gateway. A pure projection: the group write
//! model in Redis ([`crate::group_model`]) is changed by the commands
//! themselves, before their events exist, and never by this pipeline (a
//! replay of old events must not take it back in time); it is rebuilt from
//! what this pipeline stored plus the log tail it has not committed.
//! Events are applied in log order (a topic's events after a failed one
//! wait for it); every write is an upsert or a delete, so redelivery and
//! replay converge to the same state.

use crate::redis_util::Redis;
use chrono::{TimeZone, Utc};
use sqlx::mysql::MySqlPool;

use crate::conversations::hot::{self, HotError};
use crate::events::{EventCodec, GroupEvent, GroupEventBody};
use crate::groups::{GroupError, Role};
use crate::realtime::{Envelope, Kind, TargetType};
use crate::tenant::TenantPools;

use super::failure::group_failure;
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct MembersHandler {
    codec: EventCodec,
    pools: TenantPools,
    redis: Redis,
}

impl MembersHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, redis: Redis) -> Self {
        Self {
            codec,
            pools,
            redis,
        }
    }
}

fn at(ms: i64) -> chrono::NaiveDateTime {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
        .naive_utc()
}

impl Handler for MembersHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        // In log order; a topic's events after a failed one wait for it.
        let mut gate = KeyGate::new(records, failures);
        for (i, event) in events {
            if !gate.admit(i) {
                continue;
            }
            if let Err(e) = self.apply(&event).await {
                let kind = group_failure(&e);
                tracing::warn!(tenant = %event.tenant_id, topic = %event.topic, kind = event.body.name(), error = %e, failure = ?kind, "membership event not applied");
                gate.fail(RecordFailure::new(i, kind, e.to_string()));
            }
        }
        gate.outcome()
    }
}

impl MembersHandler {
    async fn apply(&self, event: &GroupEvent) -> Result<(), GroupError> {
        let membership_event = matches!(
            event.body,
            GroupEventBody::GroupCreated(_)
                | GroupEventBody::MemberJoined(_)
                | GroupEventBody::MemberLeft(_)
                | GroupEventBody::MemberRoleChanged(_)
                | GroupEventBody::MemberMuted(_)
                | GroupEventBody::GroupMuteChanged(_)
                | GroupEventBody::GroupDissolved(_)
                | GroupEventBody::GroupProfileChanged(_)
                | GroupEventBody::MemberInvited(_)
                | GroupEventBody::MemberInviteDeclined(_)
        );
        if !membership_event {
            return Ok(());
        }
        let pool = self
            .pools
            .get(&event.tenant_id)
            .map_err(|_| GroupError::NotFound(format!("tenant {}", event.tenant_id)))?;
        if !apply_mysql(pool, event).await? {
            return Ok(());
        }
        let mut redis = self.redis.clone();
        chat_lists(pool, &mut redis, event).await?;
        // The gateway that decided a removal evicted at once; this copy
        // (the same envelope id, so a gateway acts on it once) covers a
        // gateway that died before it published.
        let evicted = match &event.body {
            GroupEventBody::MemberLeft(l) => Some(l.uid.to_string()),
            GroupEventBody::GroupDissolved(_) => Some(String::new()),
            _ => None,
        };
        if let Some(payload) = evicted {
            let envelope = Envelope {
                event_id: format!("{}:evict", event.event_id),
                tenant_id: event.tenant_id.clone(),
                kind: Kind::Evict,
                target_type: TargetType::Topic,
                target: event.topic.clone(),
                skip_sid: String::new(),
                dedup_key: String::new(),
                occurred_at: event.occurred_at,
                payload,
                exclude: Vec::new(),
            };
            crate::realtime::bus::publish(&mut redis, None, &envelope).await?;
        }
        Ok(())
    }
}

/// The chat lists' hot copy: the lists of members whose role, mute or
/// membership changed are dropped (filled again from MySQL), and the
/// group's profile row is written as it now is.
async fn chat_lists(
    pool: &MySqlPool,
    redis: &mut Redis,
    event: &GroupEvent,
) -> Result<(), GroupError> {
    let changed: Vec<i64> = match &event.body {
        GroupEventBody::GroupCreated(g) => g.members.iter().copied().chain([g.owner_uid]).collect(),
        GroupEventBody::MemberJoined(j) => vec![j.uid],
        GroupEventBody::MemberLeft(l) => vec![l.uid],
        GroupEventBody::MemberRoleChanged(c) => vec![c.uid],
        GroupEventBody::MemberMuted(m) => vec![m.uid],
        GroupEventBody::MemberInvited(i) => vec![i.uid],
        GroupEventBody::MemberInviteDeclined(d) => vec![d.uid],
        _ => Vec::new(),
    };
    hot::forget(redis, &event.tenant_id, &changed).await?;
    hot::refresh_group_profile(pool, redis, &event.tenant_id, &event.topic)
        .await
        .map_err(|e| match e {
            HotError::Db(e) => GroupError::Db(e),
            HotError::Redis(e) => GroupError::Redis(e),
        })
}

/// Applies `event` to MySQL; `false` when it is refused for good (a
/// `GroupCreated` of a topic that already belongs to another group).
async fn apply_mysql(pool: &MySqlPool, event: &GroupEvent) -> Result<bool, sqlx::Error> {
    let topic = &event.topic;
    let when = at(event.occurred_at);
    match &event.body {
        GroupEventBody::GroupCreated(g) => {
            let mut tx = pool.begin().await?;
            // A topic is one group for good: a second create of its name
            // (a race, a replayed forgery) must not make its caller an
            // owner of the existing group. Redelivery has the same id.
            let existing: Option<i64> =
                sqlx::query_scalar("SELECT group_id FROM im_groups WHERE topic = ? FOR UPDATE")
                    .bind(topic)
                    .fetch_optional(&mut *tx)
                    .await?;
            if existing.is_some_and(|id| id != g.group_id) {
                tracing::warn!(tenant = %event.tenant_id, %topic, group_id = g.group_id, existing = ?existing, actor = event.actor_uid, "GroupCreated for a topic of another group refused");
                metrics::counter!(crate::metrics::PIPELINE_EVENTS_TOTAL, "pipeline" => "members", "outcome" => "refused_create").increment(1);
                return Ok(false);
            }
            sqlx::query(
                "INSERT INTO im_groups (topic, group_id, name, owner_uid, status, created_at) VALUES (?, ?, ?, ?, 'active', ?) \
                 ON DUPLICATE KEY UPDATE name = VALUES(name)",
            )
            .bind(topic)
            .bind(g.group_id)
            .bind(&g.name)
            .bind(g.owner_uid)
            .bind(when)
            .execute(&mut *tx)
            .await?;
            let mut all: Vec<i64> = g.members.clone();
            if !all.contains(&g.owner_uid) {
                all.push(g.owner_uid);
            }
            for chunk in all.chunks(1000) {
                let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
                    "INSERT INTO im_group_members (topic, uid, role, joined_at) ",
                );
                q.push_values(chunk, |mut b, uid| {
                    let role = if *uid == g.owner_uid {
                        "owner"
                    } else {
                        "member"
                    };
                    b.push_bind(topic)
                        .push_bind(*uid)
                        .push_bind(role)
                        .push_bind(when);
                });
                // A member already there (redelivery) is kept as is; any
                // other refusal fails the event.
                q.push(" ON DUPLICATE KEY UPDATE uid = uid");
                q.build().execute(&mut *tx).await?;
            }
            tx.commit().await?;
        }
        GroupEventBody::MemberJoined(j) => {
            let role = if j.role.is_empty() {
                "member"
            } else {
                j.role.as_str()
            };
            sqlx::query(
                "INSERT INTO im_group_members (topic, uid, role, joined_at) VALUES (?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE role = role",
            )
            .bind(topic)
            .bind(j.uid)
            .bind(role)
            .bind(when)
            .execute(pool)
            .await?;
            sqlx::query("DELETE FROM im_group_invites WHERE topic = ? AND uid = ?")
                .bind(topic)
                .bind(j.uid)
                .execute(pool)
                .await?;
        }
        GroupEventBody::MemberInvited(i) => {
            // An invitation of someone who is a member already is none.
            sqlx::query(
                "INSERT INTO im_group_invites (topic, uid, invited_by, invited_at) \
                 SELECT ?, ?, ?, ? FROM DUAL WHERE NOT EXISTS \
                 (SELECT 1 FROM im_group_members WHERE topic = ? AND uid = ?) \
                 ON DUPLICATE KEY UPDATE invited_by = VALUES(invited_by), \
                   invited_at = GREATEST(invited_at, VALUES(invited_at))",
            )
            .bind(topic)
            .bind(i.uid)
            .bind(i.invited_by)
            .bind(when)
            .bind(topic)
            .bind(i.uid)
            .execute(pool)
            .await?;
        }
        GroupEventBody::MemberInviteDeclined(d) => {
            sqlx::query("DELETE FROM im_group_invites WHERE topic = ? AND uid = ?")
                .bind(topic)
                .bind(d.uid)
                .execute(pool)
                .await?;
        }
        GroupEventBody::MemberLeft(l) => {
            for table in ["im_group_members", "im_group_invites"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE topic = ? AND uid = ?"))
                    .bind(topic)
                    .bind(l.uid)
                    .execute(pool)
                    .await?;
            }
        }
        GroupEventBody::MemberRoleChanged(c) => {
            sqlx::query("UPDATE im_group_members SET role = ? WHERE topic = ? AND uid = ?")
                .bind(Role::parse(&c.role).as_str())
                .bind(topic)
                .bind(c.uid)
                .execute(pool)
                .await?;
            if c.role == "owner" {
                sqlx::query("UPDATE im_groups SET owner_uid = ? WHERE topic = ?")
                    .bind(c.uid)
                    .bind(topic)
                    .execute(pool)
                    .await?;
            }
        }
        GroupEventBody::MemberMuted(mu) => {
            sqlx::query("UPDATE im_group_members SET muted_until = ? WHERE topic = ? AND uid = ?")
                .bind(mu.muted_until.map(at))
                .bind(topic)
                .bind(mu.uid)
                .execute(pool)
                .await?;
        }
        GroupEventBody::GroupMuteChanged(g) => {
            sqlx::query("UPDATE im_groups SET mute_all = ? WHERE topic = ?")
                .bind(g.mute_all)
                .bind(topic)
                .execute(pool)
                .await?;
        }
        GroupEventBody::GroupDissolved(_) => {
            sqlx::query("UPDATE im_groups SET status = 'dissolved' WHERE topic = ?")
                .bind(topic)
                .execute(pool)
                .await?;
            sqlx::query("DELETE FROM im_group_invites WHERE topic = ?")
                .bind(topic)
                .execute(pool)
                .await?;
        }
        GroupEventBody::GroupProfileChanged(p) => {
            sqlx::query(
                "UPDATE im_groups SET name = COALESCE(?, name), photo = COALESCE(?, photo), \
                 description = COALESCE(?, description) WHERE topic = ?",
            )
            .bind(&p.name)
            .bind(&p.photo)
            .bind(&p.description)
            .bind(topic)
            .execute(pool)
            .await?;
        }
        _ => {}
    }
    if matches!(
        event.body,
        GroupEventBody::GroupCreated(_)
            | GroupEventBody::MemberJoined(_)
            | GroupEventBody::MemberLeft(_)
    ) {
        sqlx::query(
            "UPDATE im_groups SET member_count = (SELECT COUNT(*) FROM im_group_members WHERE topic = ?) WHERE topic = ?",
        )
        .bind(topic)
        .bind(topic)
        .execute(pool)
        .await?;
    }
    Ok(true)
}
