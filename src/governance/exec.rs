//! Executes governance against the group write model
//! ([`crate::group_model`]): reads the facts an action needs (the actor's
//! and the targets' standings, the owner) in one step, asks the rules,
//! applies the change there atomically if those facts still hold (else
//! decides again), then produces the events (key `{tenant}:{topic}`,
//! acks=all) and answers. A command's claim keeps its answer and events,
//! so a retry with the same command id gets the same ones; the members,
//! store, hot and fan-out pipelines make the events visible in the
//! projections.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::events::{
    now_ms, GroupCreated, GroupEvent, GroupEventBody, MemberInviteDeclined, MemberInvited,
    MemberJoined, MessageDeleted, SeqRange,
};
use crate::group_model::{
    durable, Applied, Change, Durability, GroupModel, ModelError, Place, Read, Snapshot, Status,
};
use crate::groups::{Role, Standing};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::keys::{TenantKeys, TopicKeys};
use crate::tinode;

use super::consent::{self, Admission};
use super::{authorize, events, Action, Actor, Refused};

/// Most ranges one delete may name.
pub const MAX_RANGES: usize = 100;

/// Where an action came from, stamped on its events.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub device: String,
    pub sid: String,
    pub traceparent: String,
    /// The command's id (an admin command's, an HTTP `Idempotency-Key`):
    /// event ids derive from it, and a governance command's claim is kept
    /// under it, so executing the same command again gives the same answer
    /// and the same events (projections dedup).
    pub command_id: Option<String>,
}

impl Origin {
    /// The `n`th id of an event produced without a claim (a recall, a
    /// moderation, a profile change) for the request `what`: derived from
    /// the command when it has an id, so a retry produces the same events.
    fn event_id(&self, tenant: &str, topic: &str, actor_uid: i64, what: &str, n: usize) -> String {
        match &self.command_id {
            Some(c) => derived_event_id(
                &CommandScope {
                    tenant,
                    topic,
                    actor: actor_uid,
                    command_id: c,
                },
                what,
                n,
            ),
            None => crate::events::new_event_id(),
        }
    }
}

/// Whose command an event id derives from: a command id is the client's
/// (an `Idempotency-Key`, an operator's `command_id`), unique only among
/// its own commands, so every id derived from it is scoped by tenant,
/// topic and actor (uid; 0 is the operator), as its claim is (issue 39:
/// before, two users' commands with one key shared event ids, and the
/// projections dropped the second as a duplicate).
pub struct CommandScope<'a> {
    pub tenant: &'a str,
    pub topic: &'a str,
    pub actor: i64,
    pub command_id: &'a str,
}

/// What a request without a claim asks for, as its event ids name it: the
/// ranges as the client named them (before clamping or adding edits, so a
/// retry after new messages arrived derives the same ids), the profile
/// fields. The same key reused by its actor for another request makes
/// other events, never a "duplicate" of the first.
pub fn request_target(kind: &str, ranges: &[SeqRange]) -> String {
    let ranges: Vec<String> = ranges
        .iter()
        .map(|r| format!("{}-{}", r.low, r.hi))
        .collect();
    format!("{kind}:{}", ranges.join(","))
}

/// The `n`th event id of a command of `scope` acting on `what` (empty for
/// a claimed command: its claim holds the events): stable across
/// re-executions, distinct for every scope. Each part is length-prefixed,
/// so no two different tuples hash the same text.
pub fn derived_event_id(scope: &CommandScope<'_>, what: &str, n: usize) -> String {
    let mut hasher = Sha256::new();
    let actor = scope.actor.to_string();
    let n = n.to_string();
    for part in [
        scope.tenant,
        scope.topic,
        &actor,
        scope.command_id,
        what,
        &n,
    ] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
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
    /// Users who got an invitation instead of being added (their policy).
    pub invited: Vec<i64>,
    /// A retry answered from the command's claim.
    pub replayed: bool,
    /// The group a create made (a retry's too).
    pub group_id: Option<i64>,
}

/// A field beyond what the projections can store: 400.
fn malformed(e: crate::fields::FieldError) -> Refused {
    Refused(400, format!("malformed: {e}"))
}

/// A model that could not answer: 429 for an asker over their lookups of
/// unknown names, else 503.
fn model_refusal(e: ModelError) -> Refused {
    match e {
        ModelError::Throttled(ms) => Refused(
            429,
            format!("too many lookups of unknown groups; retry in {ms} ms"),
        ),
        e => unavailable(e),
    }
}

fn unavailable(e: impl std::fmt::Display) -> Refused {
    let request_id = crate::request_id::current();
    tracing::warn!(%request_id, error = %e, "governance: dependency failed");
    metrics::counter!(crate::metrics::GOVERNANCE_COMMANDS_TOTAL, "outcome" => "unavailable")
        .increment(1);
    Refused(503, tinode::UNAVAILABLE.into())
}

/// How often a command is decided again after its facts moved under it.
const MAX_DECISIONS: usize = 32;
/// How long a command keeps producing its events again after a failed
/// attempt (like the send path).
const PRODUCE_RETRY_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);
/// A pending command older than this is swept (its gateway may be gone).
const SWEEP_AFTER_MS: i64 = 30_000;

/// What a command's claim records: its answer and, for a change, its
/// events, so a retry with the same command id gets the same answer and
/// the same events (produced again while the claim is pending).
///
/// A done claim keeps only the answer (issue 39: a claim holding a whole
/// create, its name and member list, for 24 h in `noeviction` Redis): the
/// events' ids and the created group's id, not the events.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct CommandClaim {
    done: bool,
    code: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    error: String,
    /// While pending: the events to produce (again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    events: Vec<GroupEvent>,
    #[serde(default)]
    invited: Vec<i64>,
    /// Once done: the produced events' ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    event_ids: Vec<String>,
    /// Once done: the group a create made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group_id: Option<i64>,
}

impl CommandClaim {
    /// The answer only: the events are in the log now.
    fn into_answer(mut self) -> Self {
        if !self.events.is_empty() {
            self.event_ids = self.events.iter().map(|e| e.event_id.clone()).collect();
            self.group_id = self.events.iter().find_map(|e| match &e.body {
                GroupEventBody::GroupCreated(g) => Some(g.group_id),
                _ => None,
            });
            self.events = Vec::new();
        }
        self
    }
}

/// A decision on one snapshot: the change and the events it becomes.
pub(crate) struct Decision {
    change: Change,
    bodies: Vec<GroupEventBody>,
    invited: Vec<i64>,
}

impl Decision {
    fn new(change: Change, bodies: Vec<GroupEventBody>) -> Self {
        Self {
            change,
            bodies,
            invited: Vec::new(),
        }
    }
}

/// Everything governance needs; cheap to clone.
#[derive(Clone)]
pub struct Executor {
    model: GroupModel,
    producer: EventProducer,
    node: String,
}

impl Executor {
    pub fn new(model: GroupModel, producer: EventProducer, node: String) -> Self {
        Self {
            model,
            producer,
            node,
        }
    }

    pub fn model(&self) -> &GroupModel {
        &self.model
    }

    fn pool(&self, tenant: &str) -> Result<&sqlx::MySqlPool, Refused> {
        self.model
            .pools()
            .get(tenant)
            .map_err(|_| Refused(404, format!("unknown tenant {tenant}")))
    }

    /// `uid`'s standing in `topic`, from the group's write model.
    pub async fn standing(&self, tenant: &str, topic: &str, uid: i64) -> Result<Standing, Refused> {
        if !tinode::is_conversation_topic(topic) {
            return Ok(Standing::NoGroup);
        }
        self.pool(tenant)?;
        self.model
            .standing(tenant, topic, uid)
            .await
            .map_err(model_refusal)
    }

    /// Decides and carries out one governance action (not moderation: see
    /// [`moderate`](Self::moderate)) against the group's write model. The
    /// actor's standing is the model's, read with the target's in one step
    /// (whatever standing the caller passes).
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
        if let Action::Mute(_, Some(until)) = action {
            crate::fields::instant_ms("until", until).map_err(malformed)?;
        }
        if let Action::AddMember(uid) = action {
            return self.add_members(tenant, topic, actor, &[uid], origin).await;
        }
        self.pool(tenant)?;
        let actor_uid = actor_uid(actor);
        let mut uids: Vec<i64> = action.target().into_iter().collect();
        if actor_uid > 0 {
            uids.push(actor_uid);
        }
        let reason = reason.to_string();
        self.run(tenant, topic, actor_uid, &uids, origin, move |s| {
            decide(s, actor, action, &reason)
        })
        .await
    }

    /// Adds `uids` to a group as `actor`: each is added, or invited when
    /// their add policy asks for it (operators add directly); refused
    /// (403) when any of them blocked the adder, and (409) when any is a
    /// member or invited already.
    pub async fn add_members(
        &self,
        tenant: &str,
        topic: &str,
        actor: Actor,
        uids: &[i64],
        origin: &Origin,
    ) -> Result<Outcome, Refused> {
        if !tinode::is_group_topic(topic) {
            return Err(Refused(404, "group not found".into()));
        }
        if uids.is_empty() || uids.iter().any(|u| *u <= 0) {
            return Err(Refused(400, "malformed: uids must be positive".into()));
        }
        let pool = self.pool(tenant)?;
        let mut targets = uids.to_vec();
        targets.sort_unstable();
        targets.dedup();
        let actor_uid = actor_uid(actor);
        let admissions = match actor {
            Actor::Operator => targets.iter().map(|u| (*u, Admission::Direct)).collect(),
            Actor::User(uid, _) => {
                let admissions = consent::admissions(pool, uid, &targets).await?;
                let ttl = self.model.config().gateway.invitation_ttl_secs;
                consent::check_pending_invitations(pool, uid, &admissions, ttl).await?;
                admissions
            }
        };
        let mut read = targets.clone();
        if actor_uid > 0 {
            read.push(actor_uid);
        }
        // An expired invitation is none: the user may be invited (or,
        // by their settings now, added) again.
        let expired = consent::expired_invitations(
            pool,
            topic,
            &targets,
            self.model.config().gateway.invitation_ttl_secs,
        )
        .await?;
        self.run(tenant, topic, actor_uid, &read, origin, move |s| {
            let actor = with_standing(actor, s);
            for uid in &targets {
                let invited = s.place(*uid) == Place::Invited;
                if invited && !expired.contains(uid) {
                    return Err(Refused(409, format!("usr{uid} is invited already")));
                }
                authorize(actor, Action::AddMember(*uid), s.standing(*uid))?;
            }
            let mut change = Change::on_active();
            expect_actor(&mut change, s, actor);
            let mut bodies = Vec::new();
            let mut invited = Vec::new();
            for uid in &targets {
                change.expect(*uid, s.place(*uid));
                match admissions.get(uid).copied().unwrap_or(Admission::Direct) {
                    Admission::Direct => {
                        change.op("join", uid, "member");
                        bodies.extend(events(Action::AddMember(*uid), actor_uid, None, ""));
                    }
                    Admission::Invite => {
                        change.op("invite", uid, actor_uid);
                        invited.push(*uid);
                        bodies.push(GroupEventBody::MemberInvited(MemberInvited {
                            uid: *uid,
                            invited_by: actor_uid,
                        }));
                    }
                }
            }
            Ok(Decision {
                change,
                bodies,
                invited,
            })
        })
        .await
    }

    /// Creates group `topic` owned by `owner`: the members are added, or
    /// invited when their add policy asks for it; refused (403) when any of
    /// them blocked the owner, and (409) when the name is taken.
    pub async fn create(
        &self,
        tenant: &str,
        topic: &str,
        owner: i64,
        created: GroupCreated,
        origin: &Origin,
    ) -> Result<Outcome, Refused> {
        if !tinode::is_group_topic(topic) {
            return Err(Refused(400, "malformed: not a group topic".into()));
        }
        // Checked against what the projections store before anything is
        // decided: an acknowledged create the members projection refused
        // would be a group without a name in every read model.
        crate::fields::chars("name", &created.name, crate::fields::GROUP_NAME_CHARS)
            .map_err(malformed)?;
        let pool = self.pool(tenant)?;
        let mut members: Vec<i64> = created
            .members
            .iter()
            .copied()
            .filter(|m| *m != owner)
            .collect();
        members.sort_unstable();
        members.dedup();
        let admissions = consent::admissions(pool, owner, &members).await?;
        let ttl = self.model.config().gateway.invitation_ttl_secs;
        consent::check_pending_invitations(pool, owner, &admissions, ttl).await?;
        // The name's model is live (a `none` marker when no group has it).
        self.model
            .prepare_create(tenant, topic)
            .await
            .map_err(model_refusal)?;
        self.run(tenant, topic, owner, &[owner], origin, move |s| {
            if s.status != Status::None {
                return Err(Refused(409, "topic already exists".into()));
            }
            let mut change = Change::on_none();
            change.op("create", created.group_id, owner);
            let (direct, invited): (Vec<i64>, Vec<i64>) = members
                .iter()
                .partition(|m| admissions.get(m) != Some(&Admission::Invite));
            for uid in &direct {
                change.op("join", uid, "member");
            }
            for uid in &invited {
                change.op("invite", uid, owner);
            }
            let mut bodies = vec![GroupEventBody::GroupCreated(GroupCreated {
                members: direct,
                ..created.clone()
            })];
            bodies.extend(invited.iter().map(|uid| {
                GroupEventBody::MemberInvited(MemberInvited {
                    uid: *uid,
                    invited_by: owner,
                })
            }));
            Ok(Decision {
                change,
                bodies,
                invited,
            })
        })
        .await
    }

    /// `uid` accepts (joins) or declines their invitation to `topic`.
    pub async fn answer_invitation(
        &self,
        tenant: &str,
        topic: &str,
        uid: i64,
        accept: bool,
        origin: &Origin,
    ) -> Result<Outcome, Refused> {
        if !tinode::is_group_topic(topic) {
            return Err(Refused(404, "group not found".into()));
        }
        self.pool(tenant)?;
        // An invitation is only as good as its inviter's right to add
        // members, now (issue 39: an admin's invitation accepted after the
        // admin was removed admitted the invitee): the inviter's place is
        // read, and fenced, with the invitee's.
        let inviter = match self
            .model
            .read_as(tenant, topic, &[uid], None, Some(uid))
            .await
            .map_err(model_refusal)?
        {
            Read::State(s) => s.inviter(uid),
            Read::Claim(_) => None,
        };
        let read: Vec<i64> = std::iter::once(uid).chain(inviter).collect();
        let expired = accept
            && consent::expired_invitations(
                self.pool(tenant)?,
                topic,
                &[uid],
                self.model.config().gateway.invitation_ttl_secs,
            )
            .await?
            .contains(&uid);
        self.run(tenant, topic, uid, &read, origin, move |s| {
            if s.status != Status::Active {
                return Err(Refused(404, "group not found".into()));
            }
            let Some(inviter) = s.inviter(uid) else {
                return Err(match s.place(uid) {
                    Place::Member(_) => Refused(409, "already a member".into()),
                    _ => Refused(404, "no invitation to this group".into()),
                });
            };
            let mut change = Change::on_active();
            change.expect(uid, Place::Invited);
            if accept && expired {
                return Err(Refused(
                    410,
                    "this invitation has expired; ask to be invited again".into(),
                ));
            }
            if accept {
                let place = s.place(inviter);
                if !matches!(place, Place::Member(Role::Owner | Role::Admin)) {
                    return Err(Refused(
                        410,
                        "this invitation is no longer valid: whoever sent it may no longer add members"
                            .into(),
                    ));
                }
                change.expect(inviter, place);
            }
            let body = if accept {
                change.op("join", uid, "member");
                GroupEventBody::MemberJoined(MemberJoined {
                    uid,
                    role: Role::Member.as_str().into(),
                    invited_by: inviter,
                })
            } else {
                change.op("uninvite", uid, "");
                GroupEventBody::MemberInviteDeclined(MemberInviteDeclined { uid })
            };
            Ok(Decision::new(change, vec![body]))
        })
        .await
    }

    /// One command against the write model: read (or the claim of an
    /// earlier attempt), decide, apply if the facts still hold (else decide
    /// again), store the change with its claim, produce the events, answer.
    async fn run<F>(
        &self,
        tenant: &str,
        topic: &str,
        actor_uid: i64,
        uids: &[i64],
        origin: &Origin,
        decide: F,
    ) -> Result<Outcome, Refused>
    where
        F: Fn(&Snapshot) -> Result<Decision, Refused>,
    {
        let command_id = origin
            .command_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let keys = TopicKeys::new(tenant, topic);
        let claim_key = keys.command(actor_uid, &command_id);
        let mut redis = self.model.redis();
        let asker = (actor_uid > 0).then_some(actor_uid);
        for attempt in 0..MAX_DECISIONS {
            let read = self
                .model
                .read_as(tenant, topic, uids, Some(&claim_key), asker)
                .await
                .map_err(model_refusal)?;
            let snapshot = match read {
                Read::Claim(c) => return self.replay(tenant, topic, &claim_key, &c).await,
                Read::State(s) => s,
            };
            // Redis may have forgotten the claim of a command that ran (it
            // was stored with its change): the stored one answers.
            if origin.command_id.is_some() {
                let pool = self.pool(tenant)?;
                if let Some((text, _)) = durable::command(pool, &claim_key)
                    .await
                    .map_err(unavailable)?
                {
                    return self.replay(tenant, topic, &claim_key, &text).await;
                }
            }
            let decision = match decide(&snapshot) {
                Ok(d) => d,
                Err(refused) => {
                    // Only a command the client named can be retried: a
                    // refusal of an unnamed one leaves nothing behind.
                    if origin.command_id.is_some() {
                        remember_refusal(&mut redis, &claim_key, &refused).await;
                    }
                    metrics::counter!(crate::metrics::GOVERNANCE_COMMANDS_TOTAL, "outcome" => "refused")
                        .increment(1);
                    return Err(refused);
                }
            };
            let occurred_at = now_ms();
            let events: Vec<GroupEvent> = decision
                .bodies
                .into_iter()
                .enumerate()
                .map(|(n, body)| GroupEvent {
                    event_id: derived_event_id(
                        &CommandScope {
                            tenant,
                            topic,
                            actor: actor_uid,
                            command_id: &command_id,
                        },
                        "",
                        n,
                    ),
                    occurred_at,
                    actor_device: origin.device.clone(),
                    source_sid: origin.sid.clone(),
                    source_node: self.node.clone(),
                    traceparent: origin.traceparent.clone(),
                    ..GroupEvent::new(tenant, topic, actor_uid, body)
                })
                .collect();
            let mut claim = CommandClaim {
                done: false,
                code: 202,
                error: String::new(),
                events,
                invited: decision.invited,
                event_ids: Vec::new(),
                group_id: None,
            };
            let text = serde_json::to_string(&claim).map_err(unavailable)?;
            // Known to be pending before the change exists: a gateway that
            // dies after the change leaves it for the sweeper to finish.
            let pending = pending_entry(topic, &claim_key);
            let pending_key = TenantKeys::new(tenant).governance_pending();
            let _: () = redis::cmd("ZADD")
                .arg(&pending_key)
                .arg(occurred_at)
                .arg(&pending)
                .query_async(&mut redis)
                .await
                .map_err(unavailable)?;
            let create = decision.change.status == "none";
            let applied = self
                .model
                .apply(tenant, topic, &decision.change, Some((&claim_key, &text)))
                .await
                // The change may have been made: the sweeper looks.
                .map_err(model_refusal)?;
            let unpend = |mut redis: crate::redis_util::Redis| {
                let (key, entry) = (pending_key.clone(), pending.clone());
                async move {
                    let _: redis::RedisResult<()> = redis::cmd("ZREM")
                        .arg(key)
                        .arg(entry)
                        .query_async(&mut redis)
                        .await;
                }
            };
            match applied {
                Applied::Done(change) => {
                    // Stored before anything is produced or answered: an
                    // acknowledged change survives whatever Redis forgets.
                    let durability = self
                        .model
                        .make_durable(tenant, topic, &change, create, Some((&claim_key, &text)))
                        .await
                        .map_err(model_refusal)?;
                    if durability == Durability::Lost {
                        // Replaced by a restore before it was stored: it is
                        // not in the model, so neither is its claim.
                        let _: redis::RedisResult<()> = redis::cmd("DEL")
                            .arg(&claim_key)
                            .query_async(&mut redis)
                            .await;
                        unpend(redis.clone()).await;
                        continue;
                    }
                    tracing::debug!(
                        tenant,
                        topic,
                        version = change.version,
                        attempt,
                        "governance change applied and stored"
                    );
                    self.produce_claim(&mut redis, &claim_key, &mut claim, tenant)
                        .await?;
                    unpend(redis.clone()).await;
                    metrics::counter!(crate::metrics::GOVERNANCE_COMMANDS_TOTAL, "outcome" => "ok")
                        .increment(1);
                    return Ok(outcome_of(&claim, false));
                }
                Applied::Claim(c) => {
                    unpend(redis.clone()).await;
                    return self.replay(tenant, topic, &claim_key, &c).await;
                }
                Applied::Conflict => {
                    unpend(redis.clone()).await;
                    metrics::counter!(crate::metrics::GOVERNANCE_COMMANDS_TOTAL, "outcome" => "conflict_retried")
                        .increment(1);
                }
                Applied::Unsynced(other) => {
                    unpend(redis.clone()).await;
                    // An earlier command's change is not stored yet: give
                    // it a moment, then finish it, then decide again.
                    if attempt > 0 {
                        self.finish(tenant, topic, &other).await?;
                    } else {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        }
        Err(Refused(503, "the group kept changing; retry".into()))
    }

    /// Finishes a command whose change was applied but not stored (its
    /// gateway died or is slow): stores the model with its claim, then
    /// produces its events.
    async fn finish(&self, tenant: &str, topic: &str, claim_key: &str) -> Result<(), Refused> {
        let mut redis = self.model.redis();
        let text: Option<String> = redis::cmd("GET")
            .arg(claim_key)
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        match text {
            Some(text) => {
                tracing::warn!(
                    tenant,
                    topic,
                    claim = claim_key,
                    "finishing a governance command whose change was not stored"
                );
                self.replay(tenant, topic, claim_key, &text)
                    .await
                    .map(|_| ())
            }
            // Its claim is gone (expired): store the model as it is.
            None => self
                .model
                .finish_unsynced(tenant, topic, claim_key)
                .await
                .map(|_| ())
                .map_err(model_refusal),
        }
    }

    /// Answers a command that ran before from its claim; a pending one's
    /// events are produced again (the same events).
    async fn replay(
        &self,
        tenant: &str,
        topic: &str,
        claim_key: &str,
        text: &str,
    ) -> Result<Outcome, Refused> {
        let mut claim: CommandClaim = serde_json::from_str(text)
            .map_err(|e| unavailable(format!("unreadable command claim {claim_key}: {e}")))?;
        metrics::counter!(crate::metrics::GOVERNANCE_COMMANDS_TOTAL, "outcome" => "replayed")
            .increment(1);
        if claim.code >= 300 {
            return Err(Refused(claim.code, claim.error));
        }
        if !claim.done {
            // Its change first, if it is not stored yet (the command that
            // applied it was cut short: its client hung up, its gateway
            // died): a claim is answered only once its change is stored.
            let stored = self
                .model
                .finish_unsynced(tenant, topic, claim_key)
                .await
                .map_err(model_refusal)?;
            let mut redis = self.model.redis();
            if !stored {
                // A restore replaced the model before the change was
                // stored: it never happened. The retry decides anew.
                let _: redis::RedisResult<()> = redis::cmd("DEL")
                    .arg(claim_key)
                    .query_async(&mut redis)
                    .await;
                return Err(Refused(503, "the group changed meanwhile; retry".into()));
            }
            self.produce_claim(&mut redis, claim_key, &mut claim, tenant)
                .await?;
            let _: redis::RedisResult<()> = redis::cmd("ZREM")
                .arg(TenantKeys::new(tenant).governance_pending())
                .arg(pending_entry(topic, claim_key))
                .query_async(&mut redis)
                .await;
        }
        Ok(outcome_of(&claim, true))
    }

    /// Produces a claim's events (in order, retried within the budget) and
    /// marks it done (in Redis and in MySQL).
    async fn produce_claim(
        &self,
        redis: &mut crate::redis_util::Redis,
        claim_key: &str,
        claim: &mut CommandClaim,
        tenant: &str,
    ) -> Result<(), Refused> {
        for event in &claim.events {
            let tp = (!event.traceparent.is_empty()).then_some(event.traceparent.as_str());
            let deadline = std::time::Instant::now() + PRODUCE_RETRY_BUDGET;
            loop {
                match self
                    .producer
                    .send(TopicKind::GroupEvents, &event.key(), event, tp)
                    .await
                {
                    Ok(_) => break,
                    Err(e) if e.is_retryable() && std::time::Instant::now() < deadline => {
                        tracing::warn!(topic = %event.topic, error = %e, "governance produce failed; producing the same event again");
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                    // The claim stays pending: a retry or the sweeper
                    // produces the same events.
                    Err(e) => return Err(unavailable(e)),
                }
            }
        }
        evict_removed(redis, &claim.events).await;
        claim.done = true;
        let had_events = !claim.events.is_empty();
        *claim = std::mem::take(claim).into_answer();
        if let Ok(text) = serde_json::to_string(claim) {
            // Best effort: a claim left pending only produces the same
            // events once more.
            let _: redis::RedisResult<()> = redis::cmd("SET")
                .arg(claim_key)
                .arg(text)
                .arg("XX")
                .arg("KEEPTTL")
                .query_async(redis)
                .await;
        }
        if had_events {
            if let Ok(pool) = self.pool(tenant) {
                if let Err(e) = durable::mark_done(pool, claim_key).await {
                    tracing::warn!(claim = claim_key, error = %e, "could not mark a stored command done; the sweep produces its events once more");
                }
            }
        }
        Ok(())
    }

    /// Finishes the commands whose gateway died between their change and
    /// their produce (pending for a while): those Redis lists (their
    /// change stored first, if it was not), then those MySQL holds as not
    /// produced (also when Redis forgot them). Run periodically by every
    /// gateway; producing an event twice changes nothing. An entry that
    /// fails is skipped, counted and retried next time: one bad entry never
    /// holds up the others.
    pub async fn sweep(&self, tenant: &str) -> Result<usize, Refused> {
        let mut redis = self.model.redis();
        let key = TenantKeys::new(tenant).governance_pending();
        let stale: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(now_ms() - SWEEP_AFTER_MS)
            .arg("LIMIT")
            .arg(0)
            .arg(100)
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        let mut produced = 0;
        let mut failed = 0;
        for entry in stale {
            let Some((topic, claim_key)) = entry.split_once('\n') else {
                continue;
            };
            match self.sweep_one(tenant, topic, claim_key).await {
                Ok(true) => produced += 1,
                Ok(false) => {}
                Err(e) => {
                    failed += 1;
                    tracing::warn!(tenant, topic, claim = claim_key, error = ?e, "sweeping a pending governance command failed; trying the next");
                    // To the back of the list, tried again a sweep period
                    // later: failing entries never starve the ones behind.
                    let _: redis::RedisResult<()> = redis::cmd("ZADD")
                        .arg(&key)
                        .arg("XX")
                        .arg(now_ms())
                        .arg(&entry)
                        .query_async(&mut redis)
                        .await;
                    continue;
                }
            }
            let _: redis::RedisResult<()> = redis::cmd("ZREM")
                .arg(&key)
                .arg(&entry)
                .query_async(&mut redis)
                .await;
        }
        let pool = self.pool(tenant)?;
        let stored = durable::pending(pool, SWEEP_AFTER_MS, 100)
            .await
            .map_err(unavailable)?;
        for (claim_key, topic, text) in stored {
            match self.replay(tenant, &topic, &claim_key, &text).await {
                Ok(_) => produced += 1,
                Err(Refused(code, _)) if code < 500 => {
                    // A refusal has no events: nothing to produce.
                    let _ = durable::mark_done(pool, &claim_key).await;
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(tenant, %topic, claim = %claim_key, error = ?e, "producing a stored pending governance command failed; trying the next");
                }
            }
        }
        if failed > 0 {
            metrics::counter!(crate::metrics::GOVERNANCE_COMMANDS_TOTAL, "outcome" => "sweep_failed")
                .increment(failed as u64);
        }
        Ok(produced)
    }

    /// One pending command of Redis's list: finished when it is still
    /// pending; whether anything was produced.
    async fn sweep_one(&self, tenant: &str, topic: &str, claim_key: &str) -> Result<bool, Refused> {
        let mut redis = self.model.redis();
        let text: Option<String> = redis::cmd("GET")
            .arg(claim_key)
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        let Some(text) = text else {
            return Ok(false);
        };
        let pending = serde_json::from_str::<CommandClaim>(&text)
            .map(|c| !c.done && c.code < 300)
            .unwrap_or(false);
        if !pending {
            return Ok(false);
        }
        // Its change is stored first, if it was not (`replay`).
        self.replay(tenant, topic, claim_key, &text).await?;
        tracing::warn!(
            tenant,
            topic,
            claim = claim_key,
            "swept a governance command whose events were not produced"
        );
        Ok(true)
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
        self.moderate_request(tenant, topic, actor, ranges, ranges, origin, reason)
            .await
    }

    /// [`moderate`](Self::moderate) of `ranges` (what the caller worked
    /// out: with edits added) for a request that named `requested`: the
    /// event ids derive from the request, so its retry derives the same.
    #[allow(clippy::too_many_arguments)]
    pub async fn moderate_request(
        &self,
        tenant: &str,
        topic: &str,
        actor: Actor,
        ranges: &[SeqRange],
        requested: &[SeqRange],
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
        let what = request_target("delete", requested);
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
            .produce(tenant, topic, actor_uid, &what, vec![body], origin)
            .await?;
        Ok(Outcome {
            event_ids: ids,
            del_id: Some(del_id),
            ..Default::default()
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
        use crate::fields::{chars, DESCRIPTION_CHARS, GROUP_NAME_CHARS, PHOTO_CHARS};
        for (field, value, max) in [
            ("name", &profile.name, GROUP_NAME_CHARS),
            ("photo", &profile.photo, PHOTO_CHARS),
            ("description", &profile.description, DESCRIPTION_CHARS),
        ] {
            if let Some(v) = value {
                chars(field, v, max).map_err(malformed)?;
            }
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
        let what = format!(
            "profile:{:?}:{:?}:{:?}",
            profile.name, profile.photo, profile.description
        );
        let body = GroupEventBody::GroupProfileChanged(profile);
        let ids = self
            .produce(tenant, topic, actor_uid, &what, vec![body], origin)
            .await?;
        Ok(Outcome {
            event_ids: ids,
            ..Default::default()
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

    /// The topic's last allocated seq (0 when none): the allocator's, or
    /// while Redis holds none (it forgot, and no send restored it yet) the
    /// durable mark, which is at least that.
    pub async fn last_seq(&self, tenant: &str, topic: &str) -> Result<i64, Refused> {
        let mut redis = self.model.redis();
        let last: Option<i64> = redis::cmd("HGET")
            .arg(TopicKeys::new(tenant, topic).seq())
            .arg("last_seq")
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        if let Some(last) = last {
            return Ok(last);
        }
        let mark = crate::store::marks::get(self.pool(tenant)?, topic)
            .await
            .map_err(unavailable)?;
        Ok(mark.map_or(0, |m| m.mark))
    }

    /// A new delete transaction id of the topic (Tinode's `clear`): from
    /// the durable mark, so never one handed out before, also after Redis
    /// forgot (a topic from before marks goes on from its Redis counter).
    pub async fn next_del_id(&self, tenant: &str, topic: &str) -> Result<i32, Refused> {
        let mut redis = self.model.redis();
        let before: Option<i64> = redis::cmd("GET")
            .arg(TopicKeys::new(tenant, topic).del_id())
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        crate::store::marks::next_del_id(self.pool(tenant)?, topic, before.unwrap_or(0))
            .await
            .map_err(unavailable)
    }

    /// Produces `bodies` in order as events of one topic, for the request
    /// `what` ([`request_target`]); their ids.
    pub async fn produce(
        &self,
        tenant: &str,
        topic: &str,
        actor_uid: i64,
        what: &str,
        bodies: Vec<GroupEventBody>,
        origin: &Origin,
    ) -> Result<Vec<String>, Refused> {
        let mut ids = Vec::with_capacity(bodies.len());
        for (n, body) in bodies.into_iter().enumerate() {
            let event = GroupEvent {
                event_id: origin.event_id(tenant, topic, actor_uid, what, n),
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

fn actor_uid(actor: Actor) -> i64 {
    match actor {
        Actor::User(uid, _) => uid,
        Actor::Operator => 0,
    }
}

/// The actor as the snapshot knows them.
fn with_standing(actor: Actor, s: &Snapshot) -> Actor {
    match actor {
        Actor::User(uid, _) => Actor::User(uid, s.standing(uid)),
        Actor::Operator => Actor::Operator,
    }
}

/// The change holds only while a user actor keeps the place it was decided on.
fn expect_actor(change: &mut Change, s: &Snapshot, actor: Actor) {
    if let Actor::User(uid, _) = actor {
        change.expect(uid, s.place(uid));
    }
}

/// The rules on one snapshot: the change an action makes and its events.
fn decide(s: &Snapshot, actor: Actor, action: Action, reason: &str) -> Result<Decision, Refused> {
    let actor = with_standing(actor, s);
    if s.status != Status::Active {
        return Err(Refused(404, "group not found".into()));
    }
    if let (Action::TransferOwner(_), Actor::User(uid, Standing::Member { role, .. })) =
        (action, actor)
    {
        // The owner this request was made as has handed the group on (two
        // transfers raced, or one followed another): the request conflicts
        // with the group's history, it is not a question of rights.
        if role != Role::Owner && s.prev_owner == Some(uid) {
            let to = s.owner.map(tinode::user_id).unwrap_or_default();
            return Err(Refused(
                409,
                format!("ownership was transferred to {to} meanwhile"),
            ));
        }
    }
    // Removing someone who holds an invitation withdraws it: whoever may
    // add members may (issue 39: before, a kick answered 404 and a new add
    // 409, so an invitation could not be taken back).
    if let Action::Kick(uid) = action {
        if s.place(uid) == Place::Invited {
            authorize(actor, Action::AddMember(uid), Standing::NotMember)?;
            let mut change = Change::on_active();
            expect_actor(&mut change, s, actor);
            change.expect(uid, Place::Invited);
            change.op("uninvite", uid, "");
            return Ok(Decision::new(
                change,
                vec![GroupEventBody::MemberInviteDeclined(MemberInviteDeclined {
                    uid,
                })],
            ));
        }
    }
    let target = action.target();
    let target_standing = target.map_or(Standing::NotMember, |t| s.standing(t));
    authorize(actor, action, target_standing)?;
    let actor_uid = actor_uid(actor);
    let mut change = Change::on_active();
    expect_actor(&mut change, s, actor);
    if let Some(t) = target {
        change.expect(t, s.place(t));
    }
    let owner = s.owner;
    match action {
        Action::Leave => {
            change.op("leave", actor_uid, "");
        }
        Action::Kick(uid) => {
            change.op("leave", uid, "");
        }
        Action::SetAdmin(uid) => {
            change.op("role", uid, "admin");
        }
        Action::RemoveAdmin(uid) => {
            change.op("role", uid, "member");
        }
        Action::TransferOwner(uid) => {
            change.op("role", uid, "owner").op("owner", uid, "");
            if let Some(old) = owner.filter(|o| *o != uid) {
                change.expect(old, Place::Member(Role::Owner));
                change.op("role", old, "admin");
            }
        }
        Action::Mute(uid, until) => {
            change.op(
                "mute",
                uid,
                until.map(|u| u.to_string()).unwrap_or_default(),
            );
        }
        Action::MuteAll(on) => {
            change.op("muteall", if on { "1" } else { "0" }, "");
        }
        Action::Dissolve => {
            change.op("dissolve", "", "");
        }
        Action::AddMember(_) | Action::Moderate | Action::EditProfile => {
            return Err(Refused(
                400,
                format!("{} is not decided here", action.name()),
            ));
        }
    }
    Ok(Decision::new(
        change,
        events(action, actor_uid, owner, reason),
    ))
}

/// Keeps a refusal as the command's answer (a retry gets it again).
async fn remember_refusal(
    redis: &mut crate::redis_util::Redis,
    claim_key: &str,
    refused: &Refused,
) {
    if refused.0 == 503 {
        return;
    }
    let claim = CommandClaim {
        done: true,
        code: refused.0,
        error: refused.1.clone(),
        events: Vec::new(),
        invited: Vec::new(),
        event_ids: Vec::new(),
        group_id: None,
    };
    if let Ok(text) = serde_json::to_string(&claim) {
        let _: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(claim_key)
            .arg(text)
            .arg("NX")
            .arg("PX")
            .arg(crate::keys::CLAIM_TTL_MS)
            .query_async(redis)
            .await;
    }
}

/// Evicts the sessions of removed members (of every member, for a dissolved
/// group) on every gateway as soon as the removal is in the log, with the
/// envelope id the members pipeline uses later (a gateway acts once).
/// Best effort: the pipeline's copy, the fan-out's exclusions and every
/// gateway's heartbeat re-check cover a lost one; no membership check
/// depends on it.
async fn evict_removed(redis: &mut crate::redis_util::Redis, events: &[GroupEvent]) {
    use crate::realtime::{Envelope, Kind, TargetType};
    for event in events {
        let payload = match &event.body {
            GroupEventBody::MemberLeft(l) => l.uid.to_string(),
            GroupEventBody::GroupDissolved(_) => String::new(),
            _ => continue,
        };
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
        if let Err(e) = crate::realtime::bus::publish(redis, None, &envelope).await {
            tracing::warn!(topic = %event.topic, error = %e, "eviction not published; the members pipeline publishes it");
        }
    }
}

fn pending_entry(topic: &str, claim_key: &str) -> String {
    format!("{topic}\n{claim_key}")
}

fn outcome_of(claim: &CommandClaim, replayed: bool) -> Outcome {
    let answer = claim.clone().into_answer();
    Outcome {
        event_ids: answer.event_ids,
        del_id: None,
        invited: answer.invited,
        replayed,
        group_id: answer.group_id,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn derived_ids_are_stable_and_distinct() {
        use super::{derived_event_id, CommandScope};
        let scope = |tenant, topic, actor, command_id| CommandScope {
            tenant,
            topic,
            actor,
            command_id,
        };
        let a = derived_event_id(&scope("t", "grpA", 7, "cmd-1"), "", 0);
        assert_eq!(a, derived_event_id(&scope("t", "grpA", 7, "cmd-1"), "", 0));
        assert_eq!(a.len(), 36);
        // Any part differing gives another id: the same key of another
        // actor, topic or tenant, another target, another event.
        for other in [
            derived_event_id(&scope("t", "grpA", 7, "cmd-1"), "", 1),
            derived_event_id(&scope("t", "grpA", 7, "cmd-2"), "", 0),
            derived_event_id(&scope("t", "grpA", 8, "cmd-1"), "", 0),
            derived_event_id(&scope("t", "grpA", 0, "cmd-1"), "", 0),
            derived_event_id(&scope("t", "grpB", 7, "cmd-1"), "", 0),
            derived_event_id(&scope("u", "grpA", 7, "cmd-1"), "", 0),
            derived_event_id(&scope("t", "grpA", 7, "cmd-1"), "recall:5", 0),
            // No shifting of text between parts.
            derived_event_id(&scope("t", "grpA7", 7, "cmd-1"), "", 0),
        ] {
            assert_ne!(a, other);
        }
        assert_ne!(
            derived_event_id(&scope("t", "grp", 7, "Acmd"), "", 0),
            derived_event_id(&scope("t", "grpA", 7, "cmd"), "", 0)
        );
    }
}
