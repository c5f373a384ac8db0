//! Executes governance: reads standings from the group cache, asks the
//! rules, and produces the events (key `{tenant}:{topic}`, acks=all). The
//! members, store, hot and fan-out pipelines make them take effect.

use crate::redis_util::Redis;
use sha2::{Digest, Sha256};

use crate::events::{new_event_id, now_ms, GroupEvent, GroupEventBody, MessageDeleted, SeqRange};
use crate::groups::{self, Standing};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::keys::TopicKeys;
use crate::tenant::TenantPools;
use crate::tinode;

use super::{authorize, events, Action, Actor, Refused};

/// Most ranges one delete may name.
pub const MAX_RANGES: usize = 100;

/// Where an action came from, stamped on its events.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub device: String,
    pub sid: String,
    pub traceparent: String,
    /// Set for admin commands: event ids derive from it, so executing the
    /// same command again produces the same events (projections dedup).
    pub command_id: Option<String>,
}

impl Origin {
    fn event_id(&self, n: usize) -> String {
        match &self.command_id {
            Some(c) => derived_event_id(c, n),
            None => new_event_id(),
        }
    }
}

/// The `n`th event id of a command: stable across re-executions.
pub fn derived_event_id(command_id: &str, n: usize) -> String {
    let digest = Sha256::digest(format!("{command_id}\n{n}").as_bytes());
    let h = hex::encode(&digest[..16]);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// What an executed action produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub event_ids: Vec<String>,
    /// The delete transaction id, for deletes.
    pub del_id: Option<i32>,
}

fn unavailable(e: impl std::fmt::Display) -> Refused {
    let request_id = crate::request_id::current();
    tracing::warn!(%request_id, error = %e, "governance: dependency failed");
    Refused(503, "service unavailable, retry".into())
}

/// Everything governance needs; cheap to clone.
#[derive(Clone)]
pub struct Executor {
    pools: TenantPools,
    redis: Redis,
    producer: EventProducer,
    node: String,
}

impl Executor {
    pub fn new(pools: TenantPools, redis: Redis, producer: EventProducer, node: String) -> Self {
        Self {
            pools,
            redis,
            producer,
            node,
        }
    }

    fn pool(&self, tenant: &str) -> Result<&sqlx::MySqlPool, Refused> {
        self.pools
            .get(tenant)
            .map_err(|_| Refused(404, format!("unknown tenant {tenant}")))
    }

    /// `uid`'s standing in `topic` (cache-aside).
    pub async fn standing(&self, tenant: &str, topic: &str, uid: i64) -> Result<Standing, Refused> {
        if !tinode::is_conversation_topic(topic) {
            return Ok(Standing::NoGroup);
        }
        let pool = self.pool(tenant)?;
        let mut redis = self.redis.clone();
        groups::standing(pool, &mut redis, tenant, topic, uid)
            .await
            .map_err(unavailable)
    }

    /// Authorizes and produces one governance action (not moderation: see
    /// [`moderate`](Self::moderate)).
    pub async fn act(
        &self,
        tenant: &str,
        topic: &str,
        actor: Actor,
        action: Action,
        origin: &Origin,
        reason: &str,
    ) -> Result<Outcome, Refused> {
        if !tinode::is_group_topic(topic) {
            return Err(Refused(404, "group not found".into()));
        }
        if action == Action::Moderate {
            return Err(Refused(
                400,
                "moderation names the messages to delete".into(),
            ));
        }
        if action == Action::EditProfile {
            return Err(Refused(400, "a profile change names the profile".into()));
        }
        if let Actor::User(_, Standing::NoGroup) = actor {
            return Err(Refused(404, "group not found".into()));
        }
        let target = match action.target() {
            Some(uid) => self.standing(tenant, topic, uid).await?,
            None => Standing::NotMember,
        };
        // An operator has no standing of their own: a group-wide action
        // still needs the group to exist (uid 0 is the cache's placeholder).
        if actor == Actor::Operator
            && action.target().is_none()
            && self.standing(tenant, topic, 0).await? == Standing::NoGroup
        {
            return Err(Refused(404, "group not found".into()));
        }
        authorize(actor, action, target)?;
        let owner = match action {
            Action::TransferOwner(_) => groups::owner(self.pool(tenant)?, topic)
                .await
                .map_err(unavailable)?,
            _ => None,
        };
        let actor_uid = match actor {
            Actor::User(uid, _) => uid,
            Actor::Operator => 0,
        };
        let bodies = events(action, actor_uid, owner, reason);
        let ids = self
            .produce(tenant, topic, actor_uid, bodies, origin)
            .await?;
        Ok(Outcome {
            event_ids: ids,
            del_id: None,
        })
    }

    /// Deletes messages for everyone as a moderator (owner, admin or
    /// operator): `MessageDeleted` with a new delete id. Ranges are
    /// `[low, hi)`, clamped to the topic's last seq.
    pub async fn moderate(
        &self,
        tenant: &str,
        topic: &str,
        actor: Actor,
        ranges: &[SeqRange],
        origin: &Origin,
        reason: &str,
    ) -> Result<Outcome, Refused> {
        if !tinode::is_conversation_topic(topic) {
            return Err(Refused(404, "group not found".into()));
        }
        if matches!(actor, Actor::Operator)
            && self.standing(tenant, topic, 0).await? == Standing::NoGroup
        {
            return Err(Refused(404, "group not found".into()));
        }
        authorize(actor, Action::Moderate, Standing::NotMember)?;
        let ranges = self.clamp(tenant, topic, ranges).await?;
        self.refuse_archived(tenant, topic, &ranges).await?;
        let del_id = self.next_del_id(tenant, topic).await?;
        let actor_uid = match actor {
            Actor::User(uid, _) => uid,
            Actor::Operator => 0,
        };
        let body = GroupEventBody::MessageDeleted(MessageDeleted {
            ranges,
            del_id,
            moderation: true,
            reason: reason.to_string(),
            deleted_at: now_ms(),
        });
        let ids = self
            .produce(tenant, topic, actor_uid, vec![body], origin)
            .await?;
        Ok(Outcome {
            event_ids: ids,
            del_id: Some(del_id),
        })
    }

    /// Changes a group's public profile (owner, admin or operator):
    /// `GroupProfileChanged`; a `None` field stays as it is.
    pub async fn set_profile(
        &self,
        tenant: &str,
        topic: &str,
        actor: Actor,
        profile: crate::events::GroupProfileChanged,
        origin: &Origin,
    ) -> Result<Outcome, Refused> {
        if !tinode::is_group_topic(topic) {
            return Err(Refused(404, "group not found".into()));
        }
        let group = match actor {
            Actor::User(_, standing) => standing,
            Actor::Operator => self.standing(tenant, topic, 0).await?,
        };
        if group == Standing::NoGroup {
            return Err(Refused(404, "group not found".into()));
        }
        authorize(actor, Action::EditProfile, Standing::NotMember)?;
        let actor_uid = match actor {
            Actor::User(uid, _) => uid,
            Actor::Operator => 0,
        };
        let body = GroupEventBody::GroupProfileChanged(profile);
        let ids = self
            .produce(tenant, topic, actor_uid, vec![body], origin)
            .await?;
        Ok(Outcome {
            event_ids: ids,
            del_id: None,
        })
    }

    /// Refuses (409) a change to messages of an archived month: they are
    /// read from the archive and can no longer change (the store would
    /// only dead-letter the event).
    pub async fn refuse_archived(
        &self,
        tenant: &str,
        topic: &str,
        ranges: &[SeqRange],
    ) -> Result<(), Refused> {
        let pool = self.pool(tenant)?;
        for r in ranges {
            let month: Option<String> = sqlx::query_scalar(
                "SELECT t.shard_month FROM im_group_message_topic_shards t \
                 JOIN im_group_message_shards s ON s.shard_month = t.shard_month \
                 WHERE t.topic = ? AND t.min_seq < ? AND t.max_seq >= ? AND s.status = 'archived' \
                 ORDER BY t.shard_month LIMIT 1",
            )
            .bind(topic)
            .bind(r.hi)
            .bind(r.low)
            .fetch_optional(pool)
            .await
            .map_err(unavailable)?;
            if let Some(month) = month {
                return Err(Refused(
                    409,
                    format!("messages of month {month} are archived and can no longer be changed"),
                ));
            }
        }
        Ok(())
    }

    /// Validates `[low, hi)` ranges and clamps them to the last seq.
    pub async fn clamp(
        &self,
        tenant: &str,
        topic: &str,
        ranges: &[SeqRange],
    ) -> Result<Vec<SeqRange>, Refused> {
        if ranges.is_empty() || ranges.len() > MAX_RANGES {
            return Err(Refused(400, format!("malformed: 1 to {MAX_RANGES} ranges")));
        }
        let last = self.last_seq(tenant, topic).await?;
        let mut out = Vec::with_capacity(ranges.len());
        for r in ranges {
            if r.low < 1 || r.hi <= r.low {
                return Err(Refused(400, "malformed: invalid range".into()));
            }
            if r.low > last {
                return Err(Refused(404, format!("no message {} yet", r.low)));
            }
            out.push(SeqRange {
                low: r.low,
                hi: r.hi.min(last + 1),
            });
        }
        Ok(out)
    }

    /// The topic's last allocated seq (0 when none).
    pub async fn last_seq(&self, tenant: &str, topic: &str) -> Result<i64, Refused> {
        let mut redis = self.redis.clone();
        let last: Option<i64> = redis::cmd("HGET")
            .arg(TopicKeys::new(tenant, topic).seq())
            .arg("last_seq")
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        Ok(last.unwrap_or(0))
    }

    /// A new delete transaction id of the topic (Tinode's `clear`).
    pub async fn next_del_id(&self, tenant: &str, topic: &str) -> Result<i32, Refused> {
        let mut redis = self.redis.clone();
        let id: i64 = redis::cmd("INCR")
            .arg(TopicKeys::new(tenant, topic).del_id())
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        Ok(id as i32)
    }

    /// Produces `bodies` in order as events of one topic; their ids.
    pub async fn produce(
        &self,
        tenant: &str,
        topic: &str,
        actor_uid: i64,
        bodies: Vec<GroupEventBody>,
        origin: &Origin,
    ) -> Result<Vec<String>, Refused> {
        let mut ids = Vec::with_capacity(bodies.len());
        for (n, body) in bodies.into_iter().enumerate() {
            let event = GroupEvent {
                event_id: origin.event_id(n),
                actor_device: origin.device.clone(),
                source_sid: origin.sid.clone(),
                source_node: self.node.clone(),
                traceparent: origin.traceparent.clone(),
                ..GroupEvent::new(tenant, topic, actor_uid, body)
            };
            let tp = (!origin.traceparent.is_empty()).then_some(origin.traceparent.as_str());
            self.producer
                .send(TopicKind::GroupEvents, &event.key(), &event, tp)
                .await
                .map_err(unavailable)?;
            ids.push(event.event_id);
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let a = super::derived_event_id("cmd-1", 0);
        assert_eq!(a, super::derived_event_id("cmd-1", 0));
        assert_ne!(a, super::derived_event_id("cmd-1", 1));
        assert_ne!(a, super::derived_event_id("cmd-2", 0));
        assert_eq!(a.len(), 36);
    }
}
