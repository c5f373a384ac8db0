//! The push pipeline's handler (seed 001 §5.4, seed 003 §9): for each new
//! message, one push task per recipient with no online session, on
//! `im.push.tasks.v1`. The task carries only tenant, topic, seq and sender
//! — never the content. Recipients in do-not-disturb, or who muted the
//! topic, get none. A per-message claim (`push:{seq}`: pending → done)
//! makes redelivery and replay produce no second set of tasks; task ids
//! `{topic}:{seq}:{uid}` let the sender drop any duplicate a crash leaves.
//! Push never affects messages: this is its own consumer group. In groups
//! bigger than `limits.push_group_members` only the members a message
//! mentions are pushed (Drafty `MN` entities, see `send::derive`), or, for
//! an owner's or admin's `@all`, offline members up to that many: one
//! message never costs more tasks than that. A message older
//! than `push.horizon_secs` when the pipeline reaches it (a lag, a replay)
//! is pushed to nobody, so catching up is bounded work. Within a batch only
//! a topic's newest message is pushed: a phone shows one notification per
//! conversation, and a pipeline that fell behind (its recipients went
//! offline meanwhile) would otherwise turn every message of the backlog
//! into a task per member. An older message of the batch that mentions
//! someone still pushes the members it names (a mention is its own
//! notification). Tasks are logged per batch, not per task.

use std::collections::HashMap;

use crate::redis_util::Redis;
use futures::future::join_all;

use crate::events::{now_ms, EventCodec, GroupEvent, GroupEventBody, MessageSent, PushTask};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::keys::{TenantKeys, TopicKeys};
use crate::metrics as m;
use crate::tenant::TenantPools;
use crate::tinode;

use super::failure::{produce_failure, redis_failure, FailureKind};
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

/// How long a message's push claim is kept.
const CLAIM_TTL_SECS: u64 = 7 * 24 * 3600;
/// Presence probes per Redis round trip.
const PROBE_CHUNK: usize = 1000;

pub struct PushHandler {
    codec: EventCodec,
    pools: TenantPools,
    redis: Redis,
    model: crate::group_model::GroupModel,
    producer: EventProducer,
    /// Groups with more members push only to mentioned users
    /// (`limits.push_group_members`): one message never fans out into
    /// more push tasks (and sender dedup keys) than this.
    group_cap: usize,
    /// Messages older than this (ms) are not pushed; 0: no horizon.
    horizon_ms: i64,
}

impl PushHandler {
    pub fn new(
        codec: EventCodec,
        pools: TenantPools,
        redis: Redis,
        producer: EventProducer,
        model: crate::group_model::GroupModel,
    ) -> Self {
        Self {
            codec,
            pools,
            redis,
            model,
            producer,
            group_cap: crate::config::LimitsConfig::default().push_group_members,
            horizon_ms: crate::config::PushConfig::default().horizon_secs as i64 * 1000,
        }
    }

    /// No push for messages older than `secs` when handled (0: all).
    pub fn horizon_secs(mut self, secs: u64) -> Self {
        self.horizon_ms = secs.saturating_mul(1000) as i64;
        self
    }

    /// Pushes to every offline member only in groups of at most `n`.
    pub fn group_cap(mut self, n: usize) -> Self {
        self.group_cap = n;
        self
    }

    /// Members of the topic other than the sender that message `m` may
    /// push (all of them, or in a big group those it mentions); with
    /// `mentions_only`, only members it mentions by id, whatever the size.
    async fn recipients(
        &self,
        e: &GroupEvent,
        m: &MessageSent,
        mentions_only: bool,
    ) -> Result<Vec<i64>, Failed> {
        if let Some(peer) = tinode::p2p_peer(&e.topic, m.from_user) {
            return Ok(vec![peer]);
        }
        self.pools
            .get(&e.tenant_id)
            .map_err(|e| (FailureKind::Poison, e.to_string()))?;
        // The members now, from the group's write model (not a projection
        // that may not have applied a removal yet); nobody removed before
        // this message was allocated is pushed (`group_model::excluded`).
        let audience = self
            .model
            .audience(&e.tenant_id, &e.topic)
            .await
            .map_err(|e| (FailureKind::Outage, e.to_string()))?;
        let mut members = audience.members;
        members.retain(|u| {
            *u > 0
                && *u != m.from_user
                && !audience
                    .left
                    .get(u)
                    .is_some_and(|d| crate::group_model::excluded(m.seq, *d))
        });
        let everyone = !mentions_only && (members.len() <= self.group_cap || m.mention_all);
        if !everyone {
            // A big group (or a coalesced message): only the members it
            // mentions. The cap applies once the offline ones are known.
            let mentioned: std::collections::HashSet<i64> =
                m.mentioned_user_ids.iter().copied().collect();
            members.retain(|u| mentioned.contains(u));
        }
        Ok(members)
    }

    /// Recipients with no online session, not in do-not-disturb and not
    /// muting the topic. Presence first (one probe per member); settings
    /// only for those offline.
    async fn offline(&self, tenant: &str, topic: &str, uids: &[i64]) -> Result<Vec<i64>, Failed> {
        let keys = TenantKeys::new(tenant);
        let mut redis = self.redis.clone();
        let mut offline = Vec::new();
        for chunk in uids.chunks(PROBE_CHUNK) {
            let mut pipe = redis::pipe();
            for uid in chunk {
                pipe.scard(keys.presence_sessions(*uid));
            }
            let sessions: Vec<i64> = pipe.query_async(&mut redis).await.map_err(rd)?;
            offline.extend(
                chunk
                    .iter()
                    .zip(sessions)
                    .filter(|(_, n)| *n == 0)
                    .map(|(u, _)| *u),
            );
        }
        let mut out = Vec::with_capacity(offline.len());
        for chunk in offline.chunks(PROBE_CHUNK) {
            let mut pipe = redis::pipe();
            for uid in chunk {
                pipe.exists(keys.dnd(*uid))
                    .sismember(keys.push_muted(*uid), topic);
            }
            let quiet: Vec<bool> = pipe.query_async(&mut redis).await.map_err(rd)?;
            out.extend(
                chunk
                    .iter()
                    .zip(quiet.chunks(2))
                    .filter(|(_, q)| !q.iter().any(|b| *b))
                    .map(|(u, _)| *u),
            );
        }
        Ok(out)
    }

    async fn push(
        &self,
        e: &GroupEvent,
        m: &MessageSent,
        mentions_only: bool,
    ) -> Result<Pushed, Failed> {
        if self.horizon_ms > 0 && now_ms() - m.created_at > self.horizon_ms {
            metrics::counter!(m::PUSH_TASKS_TOTAL, "status" => "past_horizon").increment(1);
            return Ok(Pushed::PastHorizon);
        }
        let mut redis = self.redis.clone();
        let claim = TopicKeys::new(&e.tenant_id, &e.topic).push_claim(m.seq);
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&claim)
            .arg("pending")
            .arg("NX")
            .arg("EX")
            .arg(CLAIM_TTL_SECS)
            .query_async(&mut redis)
            .await
            .map_err(rd)?;
        if claimed.is_none() {
            let state: Option<String> = redis::cmd("GET")
                .arg(&claim)
                .query_async(&mut redis)
                .await
                .map_err(rd)?;
            if state.as_deref() == Some("done") {
                metrics::counter!(m::PUSH_TASKS_TOTAL, "status" => "duplicate").increment(1);
                return Ok(Pushed::Tasks(0));
            }
            // `pending`: an earlier attempt stopped half-way; do it again
            // (the sender drops task ids it already delivered).
        }
        let recipients = self.recipients(e, m, mentions_only).await?;
        let mut offline = self.offline(&e.tenant_id, &e.topic, &recipients).await?;
        // No message costs more tasks than the cap (an `@all` in a big
        // group reaches that many of its offline members).
        if tinode::is_group_topic(&e.topic) {
            offline.truncate(self.group_cap);
        }
        let tasks: Vec<PushTask> = offline
            .iter()
            .map(|uid| PushTask {
                task_id: format!("{}:{}:{uid}", e.topic, m.seq),
                tenant_id: e.tenant_id.clone(),
                topic: e.topic.clone(),
                seq: m.seq,
                sender_uid: m.from_user,
                recipient_uid: *uid,
                created_at: now_ms(),
            })
            .collect();
        let sends = tasks.iter().map(|t| {
            let key = format!("{}:{}", t.tenant_id, t.recipient_uid);
            async move {
                self.producer
                    .send(TopicKind::PushTasks, &key, t, None)
                    .await
            }
        });
        for r in join_all(sends).await {
            r.map_err(|e| (produce_failure(&e), e.to_string()))?;
        }
        let _: () = redis::cmd("SET")
            .arg(&claim)
            .arg("done")
            .arg("EX")
            .arg(CLAIM_TTL_SECS)
            .query_async(&mut redis)
            .await
            .map_err(rd)?;
        metrics::counter!(m::PUSH_TASKS_TOTAL, "status" => "produced")
            .increment(tasks.len() as u64);
        Ok(Pushed::Tasks(tasks.len()))
    }
}

/// (tenant, topic) → the newest seq sent in a batch: the only message of
/// that topic the batch pushes.
fn newest_per_topic(events: &[(usize, GroupEvent)]) -> HashMap<(&str, &str), i64> {
    let mut newest: HashMap<(&str, &str), i64> = HashMap::new();
    for (_, e) in events {
        if let GroupEventBody::MessageSent(m) = &e.body {
            let seq = newest
                .entry((e.tenant_id.as_str(), e.topic.as_str()))
                .or_insert(m.seq);
            *seq = (*seq).max(m.seq);
        }
    }
    newest
}

/// What one message's push did.
enum Pushed {
    Tasks(usize),
    PastHorizon,
}

/// Why a message's push tasks were not all produced.
type Failed = (FailureKind, String);

fn rd(e: redis::RedisError) -> Failed {
    (redis_failure(&e), format!("redis: {e}"))
}

impl Handler for PushHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        // A topic's pushes go out in log order: after a failed one, wait.
        let mut gate = KeyGate::new(records, failures);
        let newest = newest_per_topic(&events);
        let (mut messages, mut tasks, mut stale) = (0usize, 0usize, 0usize);
        let mut coalesced = 0usize;
        for (i, e) in &events {
            let (i, e) = (*i, e);
            let GroupEventBody::MessageSent(m) = &e.body else {
                continue;
            };
            if !gate.admit(i) {
                continue;
            }
            messages += 1;
            let newest = newest.get(&(e.tenant_id.as_str(), e.topic.as_str())) == Some(&m.seq);
            if !newest && (m.mentioned_user_ids.is_empty() || tinode::is_p2p_topic(&e.topic)) {
                metrics::counter!(m::PUSH_TASKS_TOTAL, "status" => "coalesced").increment(1);
                coalesced += 1;
                continue;
            }
            match self.push(e, m, !newest).await {
                Ok(Pushed::Tasks(n)) => tasks += n,
                Ok(Pushed::PastHorizon) => stale += 1,
                Err((kind, why)) => gate.fail(RecordFailure::new(i, kind, why)),
            }
        }
        if tasks > 0 || stale > 0 || coalesced > 0 {
            tracing::info!(
                messages,
                tasks,
                coalesced,
                past_horizon = stale,
                "push: tasks produced for a batch"
            );
        }
        gate.outcome()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(topic: &str, seq: i64) -> GroupEvent {
        GroupEvent::new(
            "t",
            topic,
            1,
            GroupEventBody::MessageSent(MessageSent {
                message_id: seq,
                group_id: 1,
                seq,
                shard_month: "202612".into(),
                client_msg_id: None,
                from_user: 1,
                msg_type: "text".into(),
                head: None,
                content: Some("\"x\"".into()),
                mentioned_user_ids: Vec::new(),
                mention_all: false,
                reply_seq: None,
                root_seq: None,
                file_count: 0,
                content_size: 1,
                has_risk: false,
                audit_status: "pass".into(),
                created_at: 0,
                expires_at: None,
            }),
        )
    }

    #[test]
    fn a_batch_pushes_each_topics_newest_message_only() {
        let events: Vec<(usize, GroupEvent)> = [("grpA", 1), ("grpB", 7), ("grpA", 3), ("grpA", 2)]
            .iter()
            .enumerate()
            .map(|(i, (t, s))| (i, sent(t, *s)))
            .collect();
        let newest = newest_per_topic(&events);
        assert_eq!(newest.len(), 2);
        assert_eq!(newest[&("t", "grpA")], 3);
        assert_eq!(newest[&("t", "grpB")], 7);
    }
}
