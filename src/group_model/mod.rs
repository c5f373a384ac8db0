//! The group write model (issue 30): one consistent state per group that
//! every command is checked against and changed in, atomically, before its
//! events are produced. The projections (MySQL members, chat lists, the
//! fan-out) follow the events; no command reads them to decide.
//!
//! # Layout in Redis
//! Under the group's hash tag `im:{tenant:topic}` (one slot, one script):
//! `meta` (`status` active | dissolved | none, `group_id`, `owner`,
//! `prev_owner`, `mute_all`, `version`, `inc`), `members` (a set with a
//! placeholder), `roles`, `mutes`, `invites` and `left` (see
//! [`crate::keys::TopicKeys`]). The send path's `lua/allocate_seq.lua`
//! reads the same keys, so a removal that was acknowledged stops the next
//! `{pub}` on every gateway, whatever the pipelines have applied.
//!
//! # A command
//! 1. [`GroupModel::read`] (`lua/group_read.lua`): the command's claim if
//!    it ran before, else the facts it needs (status, owner, the actor's and
//!    the targets' standings) and the model's version.
//! 2. The rules (`crate::governance`) decide on those facts.
//! 3. [`GroupModel::apply`] (`lua/group_apply.lua`): the change, only if the
//!    facts still hold, with the version bumped and the command's claim
//!    (its answer and its events) recorded in the same step. A command
//!    whose facts moved is decided again on the new state.
//! 4. [`GroupModel::make_durable`]: the change and the claim are written to
//!    MySQL ([`durable`]).
//! 5. The events are produced (acks=all), the claim marked done, and the
//!    caller answered. A retry with the same command id gets the claim: the
//!    same answer, and while it is pending the same events produced again.
//!
//! # Durability (issue 38)
//! A change is written to MySQL ([`durable`]) after it is applied in Redis
//! and before its events are produced or its command answered: the model
//! is `unsynced` at that version meanwhile, and no other change is applied
//! on top of it. So MySQL holds every fact a command was acknowledged on,
//! and a restore ([`restore`]) is one transaction per group.
//!
//! # Incarnations
//! `meta.inc` is the run_id of the Redis server that wrote the model. A
//! model that is missing, partial (a part lost on its own: every part holds
//! a placeholder, so all exist while the model does) or written by another
//! incarnation (a restart from an older AOF, a promoted replica) is
//! restored from MySQL before any use, raising the model's epoch there so
//! that a change applied to what it replaces is never written. A name with
//! no stored model is no group: answered from a short-lived marker in
//! Redis that every gateway sees, each lookup of one counted against the
//! asker (`limits.unknown_names`). A tenant upgraded with data derives a
//! group from before durable models once from the members projection and
//! the log ([`rebuild`]) and stores it.

pub mod durable;
pub mod rebuild;
mod restore;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use redis::Script;

use crate::coalesce::Coalescer;
use crate::config::Config;
use crate::events::EventCodec;
use crate::groups::{Role, Standing};
use crate::keys::TopicKeys;
use crate::redis_util::Redis;
use crate::tenant::TenantPools;

static READ: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/group_read.lua")));
static APPLY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/group_apply.lua")));
static SYNCED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/group_synced.lua")));
static DUMP: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/group_dump.lua")));

/// Why the model could not answer; every one is retryable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("redis: {0}")]
    Redis(String),
    #[error("restoring the group's state: {0}")]
    Rebuild(String),
    /// The asker looked up too many names Redis holds no model of
    /// (`limits.unknown_names`): retry after this many milliseconds.
    #[error("too many lookups of unknown groups; retry in {0} ms")]
    Throttled(u64),
}

impl ModelError {
    fn mysql(e: sqlx::Error) -> Self {
        ModelError::Rebuild(format!("mysql: {e}"))
    }
}

impl From<redis::RedisError> for ModelError {
    fn from(e: redis::RedisError) -> Self {
        ModelError::Redis(e.to_string())
    }
}

/// A group's status in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Active,
    Dissolved,
    /// No such group (a short-lived marker, so unknown names cost no
    /// rebuild each time).
    None,
}

impl Status {
    fn parse(s: &str) -> Status {
        match s {
            "active" => Status::Active,
            "dissolved" => Status::Dissolved,
            _ => Status::None,
        }
    }
}

/// Where one user stands in a group's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Member(Role),
    /// Invited, not a member yet.
    Invited,
    Out,
}

impl Place {
    fn parse(s: &str) -> Place {
        match s {
            "owner" => Place::Member(Role::Owner),
            "admin" => Place::Member(Role::Admin),
            "member" => Place::Member(Role::Member),
            "invited" => Place::Invited,
            _ => Place::Out,
        }
    }

    /// The name the scripts use.
    pub fn as_str(self) -> &'static str {
        match self {
            Place::Member(r) => r.as_str(),
            Place::Invited => "invited",
            Place::Out => "-",
        }
    }
}

/// The facts of one group a command was decided on.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub status: Status,
    pub version: i64,
    pub group_id: i64,
    pub owner: Option<i64>,
    /// The owner before the last transfer (a transfer by them conflicts).
    pub prev_owner: Option<i64>,
    pub mute_all: bool,
    places: HashMap<i64, (Place, Option<i64>)>,
}

impl Snapshot {
    /// No such group.
    fn absent() -> Snapshot {
        Snapshot {
            status: Status::None,
            version: 0,
            group_id: 0,
            owner: None,
            prev_owner: None,
            mute_all: false,
            places: HashMap::new(),
        }
    }

    /// The place of a uid that was read (`Out` for one that was not).
    pub fn place(&self, uid: i64) -> Place {
        self.places.get(&uid).map_or(Place::Out, |p| p.0)
    }

    /// Who invited `uid`, when `uid` holds an invitation.
    pub fn inviter(&self, uid: i64) -> Option<i64> {
        match self.places.get(&uid) {
            Some((Place::Invited, by)) => *by,
            _ => None,
        }
    }

    /// `uid`'s standing as the governance rules name it.
    pub fn standing(&self, uid: i64) -> Standing {
        if self.status != Status::Active {
            return Standing::NoGroup;
        }
        match self.places.get(&uid) {
            Some((Place::Member(role), muted_until)) => Standing::Member {
                role: *role,
                muted_until: *muted_until,
            },
            _ => Standing::NotMember,
        }
    }
}

/// What a read found.
#[derive(Debug, Clone)]
pub enum Read {
    /// The command ran before: its recorded claim.
    Claim(String),
    State(Snapshot),
}

/// One command's change: the facts it was decided on and what it does.
#[derive(Debug, Clone, Default)]
pub struct Change {
    /// `active`, or `none` for a create.
    pub status: &'static str,
    checks: Vec<(i64, Place)>,
    ops: Vec<[String; 3]>,
}

impl Change {
    pub fn on_active() -> Self {
        Change {
            status: "active",
            ..Default::default()
        }
    }

    pub fn on_none() -> Self {
        Change {
            status: "none",
            ..Default::default()
        }
    }

    /// The change holds only while `uid` is still at `place`.
    pub fn expect(&mut self, uid: i64, place: Place) -> &mut Self {
        if !self.checks.iter().any(|(u, _)| *u == uid) {
            self.checks.push((uid, place));
        }
        self
    }

    pub fn op(&mut self, op: &str, a: impl ToString, b: impl ToString) -> &mut Self {
        self.ops
            .push([op.to_string(), a.to_string(), b.to_string()]);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// What [`GroupModel::apply`] did.
#[derive(Debug, Clone)]
pub enum Applied {
    /// Changed in Redis (not durable yet: see [`GroupModel::make_durable`]).
    Done(durable::Applied),
    /// The command ran before: its claim.
    Claim(String),
    /// The facts moved (or the model was restored): decide again.
    Conflict,
    /// An earlier change (of the command whose claim key this is) is not
    /// durable yet: finish it ([`GroupModel::finish_unsynced`]), then
    /// decide again.
    Unsynced(String),
}

/// Whether a change applied in Redis is durable now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Written to MySQL (by this call or already): the command may answer.
    Durable,
    /// Not written, and never will be: the model was restored since the
    /// change was applied (or another group holds the name), so the change
    /// is not in it. Drop the command's claim and decide again.
    Lost,
}

/// Membership as the gateway's reads see it.
pub use crate::groups::Membership;

/// The group write model of every tenant; cheap to clone.
#[derive(Clone)]
pub struct GroupModel {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    config: Config,
    pools: TenantPools,
    redis: Redis,
    codec: EventCodec,
    restores: Coalescer<(String, String), Result<Existence, ModelError>>,
}

/// What a restore found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existence {
    /// A live model is in Redis (the group, or a `none` marker for a
    /// create to decide on).
    Live,
    /// No such group (the name's marker says so for a while).
    Absent,
}

impl GroupModel {
    pub fn new(config: Config, pools: TenantPools, redis: Redis, codec: EventCodec) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                pools,
                redis,
                codec,
                restores: Coalescer::default(),
            }),
        }
    }

    pub fn redis(&self) -> Redis {
        self.inner.redis.clone()
    }

    pub fn pools(&self) -> &TenantPools {
        &self.inner.pools
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The facts of `uids` in `topic` (restoring the model first when it
    /// is missing, partial or stale); with `claim`, the command's claim
    /// instead when it ran before.
    pub async fn read(
        &self,
        tenant: &str,
        topic: &str,
        uids: &[i64],
        claim: Option<&str>,
    ) -> Result<Read, ModelError> {
        self.read_as(tenant, topic, uids, claim, None).await
    }

    /// [`read`](Self::read) on behalf of `asker`, whose lookups of names
    /// Redis holds no model of are counted (`limits.unknown_names`).
    pub async fn read_as(
        &self,
        tenant: &str,
        topic: &str,
        uids: &[i64],
        claim: Option<&str>,
        asker: Option<i64>,
    ) -> Result<Read, ModelError> {
        let keys = TopicKeys::new(tenant, topic);
        let mut redis = self.redis();
        for _ in 0..3 {
            let mut call = READ.prepare_invoke();
            call.key(keys.meta())
                .key(keys.members())
                .key(keys.roles())
                .key(keys.mutes())
                .key(keys.invites())
                .key(claim.map_or_else(|| keys.command(0, "-"), str::to_string))
                .key(keys.left())
                .key(keys.absent())
                .arg(if claim.is_some() { "1" } else { "0" });
            for uid in uids {
                call.arg(uid);
            }
            let reply: Vec<String> = call.invoke_async(&mut redis).await?;
            match reply.first().map(String::as_str) {
                Some("CLAIM") => return Ok(Read::Claim(reply.get(1).cloned().unwrap_or_default())),
                Some("OK") => return Ok(Read::State(snapshot(&reply, uids))),
                Some("ABSENT") => return Ok(Read::State(Snapshot::absent())),
                Some("MISSING") | Some("FENCED") => {
                    if self.ensure_as(tenant, topic, asker).await? == Existence::Absent {
                        return Ok(Read::State(Snapshot::absent()));
                    }
                }
                other => {
                    return Err(ModelError::Redis(format!(
                        "unexpected group_read reply {other:?}"
                    )))
                }
            }
        }
        Err(ModelError::Rebuild(
            "the group's state kept changing".into(),
        ))
    }

    /// Applies `change` in Redis if its facts still hold, recording `claim`
    /// (key and value) with it. Not durable until
    /// [`make_durable`](Self::make_durable).
    pub async fn apply(
        &self,
        tenant: &str,
        topic: &str,
        change: &Change,
        claim: Option<(&str, &str)>,
    ) -> Result<Applied, ModelError> {
        let keys = TopicKeys::new(tenant, topic);
        let mut redis = self.redis();
        let mut call = APPLY.prepare_invoke();
        call.key(keys.meta())
            .key(keys.members())
            .key(keys.roles())
            .key(keys.mutes())
            .key(keys.invites())
            .key(keys.left())
            .key(keys.seq())
            .key(claim.map_or_else(|| keys.command(0, "-"), |c| c.0.to_string()))
            .arg(claim.map_or("", |c| c.1))
            .arg(crate::keys::CLAIM_TTL_MS)
            .arg(change.status)
            .arg(change.checks.len());
        for (uid, place) in &change.checks {
            call.arg(uid).arg(place.as_str());
        }
        call.arg(change.ops.len());
        for [op, a, b] in &change.ops {
            call.arg(op).arg(a).arg(b);
        }
        let reply: Vec<String> = call.invoke_async(&mut redis).await?;
        match reply.first().map(String::as_str) {
            Some("OK") => applied(&reply)
                .map(Applied::Done)
                .ok_or_else(|| ModelError::Redis(format!("malformed group_apply reply {reply:?}"))),
            Some("CLAIM") => Ok(Applied::Claim(reply.get(1).cloned().unwrap_or_default())),
            Some("CONFLICT") => Ok(Applied::Conflict),
            Some("UNSYNCED") => Ok(Applied::Unsynced(reply.get(2).cloned().unwrap_or_default())),
            Some("MISSING") | Some("FENCED") => {
                if change.status == "none" {
                    self.prepare_create(tenant, topic).await?;
                } else {
                    self.ensure(tenant, topic).await?;
                }
                Ok(Applied::Conflict)
            }
            other => Err(ModelError::Redis(format!(
                "unexpected group_apply reply {other:?}"
            ))),
        }
    }

    /// Writes a change applied in Redis to MySQL with its command's claim
    /// (see [`durable`]). A database behind the model (a lost write, a
    /// command that never finished) gets the whole model instead.
    pub async fn make_durable(
        &self,
        tenant: &str,
        topic: &str,
        change: &durable::Applied,
        create: bool,
        claim: durable::CommandClaim<'_>,
    ) -> Result<Durability, ModelError> {
        let pool = self.pool(tenant)?;
        let written = durable::write_change(pool, topic, change, create, claim)
            .await
            .map_err(ModelError::mysql)?;
        let written = match written {
            durable::Written::Behind => self.sync_whole(tenant, topic, claim).await?,
            w => w,
        };
        match written {
            durable::Written::Done | durable::Written::AlreadyDurable => {
                self.synced(tenant, topic, change.version, change.epoch)
                    .await?;
                Ok(Durability::Durable)
            }
            durable::Written::Fenced | durable::Written::Exists | durable::Written::Behind => {
                metrics::counter!(crate::metrics::GROUP_CHANGES_LOST_TOTAL).increment(1);
                tracing::warn!(
                    tenant,
                    topic,
                    version = change.version,
                    epoch = change.epoch,
                    outcome = ?written,
                    "a group change applied to a model that was replaced since is not stored; the command is decided again"
                );
                // The model in Redis may still hold it: put back what
                // MySQL holds before anything decides on it.
                self.restore_now(tenant, topic).await?;
                Ok(Durability::Lost)
            }
        }
    }

    /// Finishes the change a command applied and did not make durable (its
    /// gateway died, its client hung up, or it is slow): when the model is
    /// unsynced at that command's change, the whole model goes to MySQL
    /// with the command's claim. `false` when the change was lost instead
    /// (a restore replaced the model before it was stored).
    pub async fn finish_unsynced(
        &self,
        tenant: &str,
        topic: &str,
        claim_key: &str,
    ) -> Result<bool, ModelError> {
        let mut redis = self.redis();
        let (unsynced, claim): (Option<String>, Option<String>) = redis::pipe()
            .hget(TopicKeys::new(tenant, topic).meta(), "unsynced_claim")
            .get(claim_key)
            .query_async(&mut redis)
            .await?;
        if unsynced.as_deref() != Some(claim_key) {
            // Stored already (or replaced by a restore, which installed
            // what MySQL holds): nothing to finish.
            return Ok(true);
        }
        let command = claim.as_deref().map(|c| (claim_key, c));
        match self.sync_whole(tenant, topic, command).await? {
            durable::Written::Done | durable::Written::AlreadyDurable => Ok(true),
            _ => {
                self.restore_now(tenant, topic).await?;
                Ok(false)
            }
        }
    }

    /// The whole model as Redis holds it, written to MySQL, and the model
    /// marked synced at its version.
    async fn sync_whole(
        &self,
        tenant: &str,
        topic: &str,
        claim: durable::CommandClaim<'_>,
    ) -> Result<durable::Written, ModelError> {
        let keys = TopicKeys::new(tenant, topic);
        let mut redis = self.redis();
        let reply: redis::Value = DUMP
            .key(keys.meta())
            .key(keys.members())
            .key(keys.roles())
            .key(keys.mutes())
            .key(keys.invites())
            .key(keys.left())
            .invoke_async(&mut redis)
            .await?;
        let Some(model) = dumped(&reply) else {
            // Not this incarnation's, or partial: a restore decides.
            return Ok(durable::Written::Fenced);
        };
        let pool = self.pool(tenant)?;
        let written = durable::sync_whole(pool, topic, &model, claim)
            .await
            .map_err(ModelError::mysql)?;
        if matches!(
            written,
            durable::Written::Done | durable::Written::AlreadyDurable
        ) {
            self.synced(tenant, topic, model.version, model.epoch)
                .await?;
        }
        Ok(written)
    }

    /// The model is no longer unsynced at `version`; the name's "no such
    /// group" marker goes.
    async fn synced(
        &self,
        tenant: &str,
        topic: &str,
        version: i64,
        epoch: i64,
    ) -> Result<(), ModelError> {
        let keys = TopicKeys::new(tenant, topic);
        let mut redis = self.redis();
        let _: i64 = SYNCED
            .key(keys.meta())
            .key(keys.absent())
            .arg(version)
            .arg(epoch)
            .invoke_async(&mut redis)
            .await?;
        Ok(())
    }

    fn pool(&self, tenant: &str) -> Result<&sqlx::MySqlPool, ModelError> {
        self.inner
            .pools
            .get(tenant)
            .map_err(|e| ModelError::Rebuild(e.to_string()))
    }

    /// Makes sure `topic` has a live model: restores it when it is
    /// missing, partial, or was written by another incarnation of Redis. A
    /// name that is no group is answered [`Existence::Absent`].
    /// Concurrent calls in this process share one restore; it runs to its
    /// end even if every caller gives up.
    pub async fn ensure(&self, tenant: &str, topic: &str) -> Result<Existence, ModelError> {
        self.ensure_as(tenant, topic, None).await
    }

    /// [`ensure`](Self::ensure) on behalf of `asker`: a lookup in MySQL of
    /// a name Redis holds no model of counts against their
    /// `limits.unknown_names` (refused with [`ModelError::Throttled`]
    /// beyond it, before MySQL is asked).
    pub async fn ensure_as(
        &self,
        tenant: &str,
        topic: &str,
        asker: Option<i64>,
    ) -> Result<Existence, ModelError> {
        if let Some(uid) = asker {
            if crate::tinode::parse_p2p_topic(topic).is_none() {
                // Only a lookup MySQL answers counts: a live model, or a
                // name already known to be no group, costs nothing more.
                match self.probe(tenant, topic).await?.as_deref() {
                    Some("OK") => return Ok(Existence::Live),
                    Some("ABSENT") => return Ok(Existence::Absent),
                    // A model of another incarnation: a group that was.
                    Some("FENCED") => {}
                    _ => self.count_lookup(tenant, uid).await?,
                }
            }
        }
        self.restore(tenant, topic, false).await
    }

    /// What `lua/group_read.lua` says of the model, asking for no user.
    async fn probe(&self, tenant: &str, topic: &str) -> Result<Option<String>, ModelError> {
        let keys = TopicKeys::new(tenant, topic);
        Ok(probe_keys(&mut self.redis(), &keys).await?)
    }

    /// One token of `uid`'s bucket of lookups of unknown names.
    async fn count_lookup(&self, tenant: &str, uid: i64) -> Result<(), ModelError> {
        let mut redis = self.redis();
        let key = crate::redis_util::bucket::key(tenant, uid, "unknown_name");
        let wait = crate::redis_util::bucket::take(
            &mut redis,
            &key,
            self.inner.config.limits.unknown_names,
            1,
        )
        .await?;
        if wait > 0 {
            metrics::counter!(crate::metrics::RATE_LIMITED_TOTAL, "what" => "unknown_name")
                .increment(1);
            return Err(ModelError::Throttled(wait));
        }
        Ok(())
    }

    /// Before a create: the model of `topic` is live, a `none` marker when
    /// no group has the name (what the create decides on and replaces).
    pub async fn prepare_create(&self, tenant: &str, topic: &str) -> Result<(), ModelError> {
        self.restore(tenant, topic, true).await.map(|_| ())
    }

    /// Restores the model from MySQL whatever Redis holds (after a change
    /// was found applied to a model that was replaced): the restore raises
    /// the epoch, so its model replaces any live one.
    pub async fn restore_now(&self, tenant: &str, topic: &str) -> Result<(), ModelError> {
        restore::restore(&self.inner, tenant, topic, restore::Mode::Force).await?;
        Ok(())
    }

    /// Restores the models of `topics` that Redis does not hold live (a
    /// bulk restore's page, `crate::recovery`): `(stamped, installed)`.
    pub async fn restore_many(
        &self,
        tenant: &str,
        topics: &[String],
    ) -> Result<(usize, usize), ModelError> {
        restore::restore_many(&self.inner, tenant, topics).await
    }

    async fn restore(
        &self,
        tenant: &str,
        topic: &str,
        mark_none: bool,
    ) -> Result<Existence, ModelError> {
        let inner = self.inner.clone();
        let (t, tp) = (tenant.to_string(), topic.to_string());
        let mode = if mark_none {
            restore::Mode::ForCreate
        } else {
            restore::Mode::IfNotLive
        };
        self.inner
            .restores
            .run((t.clone(), format!("{tp}\n{mark_none}")), async move {
                tokio::spawn(async move { restore::restore(&inner, &t, &tp, mode).await })
                    .await
                    .unwrap_or_else(|e| Err(ModelError::Rebuild(format!("restore task: {e}"))))
            })
            .await
    }

    /// Whether `uid` may read and attach to `topic`, from the model.
    pub async fn membership(
        &self,
        tenant: &str,
        topic: &str,
        uid: i64,
    ) -> Result<Membership, ModelError> {
        // A one-to-one topic's members are in its name.
        if let Some((a, b)) = crate::tinode::parse_p2p_topic(topic) {
            return Ok(if uid == a || uid == b {
                Membership::Member
            } else {
                Membership::NotMember
            });
        }
        let Read::State(s) = self.read_as(tenant, topic, &[uid], None, Some(uid)).await? else {
            return Ok(Membership::NotMember);
        };
        Ok(match (s.status, s.place(uid)) {
            (Status::Dissolved, _) => Membership::Dissolved,
            (Status::Active, Place::Member(_)) => Membership::Member,
            _ => Membership::NotMember,
        })
    }

    /// `uid`'s standing in `topic`, from the model.
    pub async fn standing(
        &self,
        tenant: &str,
        topic: &str,
        uid: i64,
    ) -> Result<Standing, ModelError> {
        let Read::State(s) = self.read_as(tenant, topic, &[uid], None, Some(uid)).await? else {
            return Ok(Standing::NotMember);
        };
        Ok(s.standing(uid))
    }

    /// The group's members now (none for a group that is not active), and
    /// who left when (`uid → (left_seq, back_seq)`): what the fan-out and
    /// push use so a removed member gets nothing of a later seq.
    pub async fn audience(&self, tenant: &str, topic: &str) -> Result<Audience, ModelError> {
        let keys = TopicKeys::new(tenant, topic);
        let mut redis = self.redis();
        for _ in 0..3 {
            // Checks the model is live first (restoring it if not).
            let Read::State(s) = self.read(tenant, topic, &[], None).await? else {
                unreachable!("no claim asked for");
            };
            if s.status == Status::None {
                return Ok(Audience::default());
            }
            let (members, left, version): (Vec<String>, HashMap<String, String>, Option<i64>) =
                redis::pipe()
                    .smembers(keys.members())
                    .hgetall(keys.left())
                    .hget(keys.meta(), "version")
                    .query_async(&mut redis)
                    .await?;
            if version != Some(s.version) {
                continue; // changed in between: read again
            }
            let members = if s.status == Status::Active {
                members.iter().filter_map(|m| m.parse().ok()).collect()
            } else {
                Vec::new()
            };
            return Ok(Audience {
                members,
                left: parse_left(&left),
            });
        }
        Err(ModelError::Rebuild(
            "the group's state kept changing".into(),
        ))
    }

    /// Who left `topic` when (`uid → (left_seq, back_seq)`), without
    /// checking the model is live (the fan-out asks per batch; a stale
    /// model only ever holds fewer departures, and the send path refuses
    /// to allocate on it).
    pub async fn departures(
        &self,
        tenant: &str,
        topic: &str,
    ) -> Result<HashMap<i64, (i64, Option<i64>)>, ModelError> {
        let mut redis = self.redis();
        let left: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(TopicKeys::new(tenant, topic).left())
            .query_async(&mut redis)
            .await?;
        Ok(parse_left(&left))
    }
}

/// The change `lua/group_apply.lua` answered `OK` with.
fn applied(reply: &[String]) -> Option<durable::Applied> {
    let get = |i: usize| reply.get(i).map(String::as_str).unwrap_or("");
    let n: usize = get(8).parse().ok()?;
    let mut rows = Vec::with_capacity(n);
    for k in 0..n {
        let at = 9 + 5 * k;
        rows.push(durable::Row::from_parts(
            get(at).parse().ok()?,
            get(at + 1),
            get(at + 2),
            get(at + 3),
            get(at + 4),
        ));
    }
    Some(durable::Applied {
        version: get(1).parse().ok()?,
        epoch: get(2).parse().unwrap_or(0),
        meta: durable::Meta {
            status: get(3).to_string(),
            group_id: get(4).parse().unwrap_or(0),
            owner: get(5).parse().unwrap_or(0),
            prev_owner: get(6).parse().unwrap_or(0),
            mute_all: get(7) == "1",
        },
        rows,
    })
}

/// The whole model `lua/group_dump.lua` answered `OK` with.
fn dumped(reply: &redis::Value) -> Option<durable::Model> {
    let redis::Value::Array(items) = reply else {
        return None;
    };
    let text =
        |v: &redis::Value| -> String { redis::from_redis_value::<String>(v).unwrap_or_default() };
    let list = |v: &redis::Value| -> Vec<String> {
        redis::from_redis_value::<Vec<String>>(v).unwrap_or_default()
    };
    if items.first().map(text).as_deref() != Some("OK") || items.len() < 15 {
        return None;
    }
    let pairs = |v: &redis::Value| -> HashMap<String, String> {
        list(v)
            .chunks(2)
            .filter_map(|p| match p {
                [k, v] if k != crate::groups::MEMBERS_PLACEHOLDER => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect()
    };
    let members = list(&items[10]);
    let (roles, mutes, invites, left) = (
        pairs(&items[11]),
        pairs(&items[12]),
        pairs(&items[13]),
        pairs(&items[14]),
    );
    let mut uids: std::collections::BTreeSet<i64> =
        members.iter().filter_map(|m| m.parse().ok()).collect();
    uids.extend(invites.keys().filter_map(|u| u.parse::<i64>().ok()));
    uids.extend(left.keys().filter_map(|u| u.parse::<i64>().ok()));
    let member_set: std::collections::HashSet<&str> = members.iter().map(String::as_str).collect();
    let rows = uids
        .into_iter()
        .map(|uid| {
            let u = uid.to_string();
            let place = if member_set.contains(u.as_str()) {
                roles.get(&u).map_or("member", String::as_str)
            } else if invites.contains_key(&u) {
                "invited"
            } else {
                "out"
            };
            let empty = String::new();
            durable::Row::from_parts(
                uid,
                place,
                if place == "invited" || place == "out" {
                    ""
                } else {
                    mutes.get(&u).unwrap_or(&empty)
                },
                if place == "invited" {
                    invites.get(&u).unwrap_or(&empty)
                } else {
                    ""
                },
                left.get(&u).unwrap_or(&empty),
            )
        })
        .collect();
    Some(durable::Model {
        meta: durable::Meta {
            status: text(&items[1]),
            group_id: text(&items[2]).parse().unwrap_or(0),
            owner: text(&items[3]).parse().unwrap_or(0),
            prev_owner: text(&items[4]).parse().unwrap_or(0),
            mute_all: text(&items[5]) == "1",
        },
        version: text(&items[6]).parse().unwrap_or(0),
        epoch: text(&items[7]).parse().unwrap_or(0),
        rows,
    })
}

/// Who a group's messages may reach.
#[derive(Debug, Clone, Default)]
pub struct Audience {
    pub members: Vec<i64>,
    pub left: HashMap<i64, (i64, Option<i64>)>,
}

/// Whether a message of `seq` must not reach a user who left at
/// `(left_seq, back_seq)`: it was allocated after they were removed (and
/// not after they came back).
pub fn excluded(seq: i64, departure: (i64, Option<i64>)) -> bool {
    seq > departure.0 && departure.1.is_none_or(|back| seq <= back)
}

/// The users of `departures` a message of `seq` must not reach, sorted.
pub fn excluded_users(seq: i64, departures: &HashMap<i64, (i64, Option<i64>)>) -> Vec<i64> {
    let mut users: Vec<i64> = departures
        .iter()
        .filter(|(_, d)| excluded(seq, **d))
        .map(|(uid, _)| *uid)
        .collect();
    users.sort_unstable();
    users
}

fn parse_left(raw: &HashMap<String, String>) -> HashMap<i64, (i64, Option<i64>)> {
    raw.iter()
        .filter_map(|(uid, v)| {
            let (from, back) = v.split_once('|')?;
            Some((
                uid.parse().ok()?,
                (
                    from.parse().ok()?,
                    back.parse().ok().filter(|_| !back.is_empty()),
                ),
            ))
        })
        .collect()
}

fn snapshot(reply: &[String], uids: &[i64]) -> Snapshot {
    let get = |i: usize| reply.get(i).map(String::as_str).unwrap_or("");
    let uid = |s: &str| s.parse::<i64>().ok().filter(|u| *u > 0);
    let mut places = HashMap::new();
    for (n, u) in uids.iter().enumerate() {
        let place = Place::parse(get(7 + 2 * n));
        let muted = get(8 + 2 * n).parse::<i64>().ok();
        places.insert(*u, (place, muted));
    }
    Snapshot {
        status: Status::parse(get(1)),
        version: get(2).parse().unwrap_or(0),
        group_id: get(3).parse().unwrap_or(0),
        owner: uid(get(4)),
        prev_owner: uid(get(5)),
        mute_all: get(6) == "1",
        places,
    }
}

/// What `lua/group_read.lua` says of the model at `keys`, asking for no
/// user: `OK` (whole and synced), `ABSENT`, or what is missing.
pub(crate) async fn probe_keys(
    redis: &mut crate::redis_util::Redis,
    keys: &TopicKeys,
) -> redis::RedisResult<Option<String>> {
    let reply: Vec<String> = READ
        .key(keys.meta())
        .key(keys.members())
        .key(keys.roles())
        .key(keys.mutes())
        .key(keys.invites())
        .key(keys.command(0, "-"))
        .key(keys.left())
        .key(keys.absent())
        .arg("0")
        .invoke_async(redis)
        .await?;
    Ok(reply.into_iter().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_reads_the_script_reply() {
        let reply: Vec<String> = [
            "OK", "active", "7", "42", "1001", "", "0", "owner", "", "-", "", "member", "99",
            "invited", "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = snapshot(&reply, &[1001, 5, 6, 7]);
        assert_eq!(s.status, Status::Active);
        assert_eq!(
            (s.version, s.group_id, s.owner, s.prev_owner),
            (7, 42, Some(1001), None)
        );
        assert_eq!(s.place(1001), Place::Member(Role::Owner));
        assert_eq!(s.place(5), Place::Out);
        assert_eq!(
            s.standing(6),
            Standing::Member {
                role: Role::Member,
                muted_until: Some(99)
            }
        );
        assert_eq!(s.place(7), Place::Invited);
        assert_eq!(s.standing(7), Standing::NotMember);
    }

    #[test]
    fn a_departure_excludes_only_what_came_after_it() {
        assert!(!excluded(10, (10, None)));
        assert!(excluded(11, (10, None)));
        assert!(excluded(12, (10, Some(12))));
        assert!(!excluded(13, (10, Some(12))));
        let raw: HashMap<String, String> = [
            ("5".to_string(), "10|".to_string()),
            ("6".to_string(), "3|8".to_string()),
        ]
        .into_iter()
        .collect();
        let left = parse_left(&raw);
        assert_eq!(left[&5], (10, None));
        assert_eq!(left[&6], (3, Some(8)));
    }
}
