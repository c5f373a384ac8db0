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
//! 4. The events are produced (acks=all), the claim marked done, and the
//!    caller answered. A retry with the same command id gets the claim: the
//!    same answer, and while it is pending the same events produced again.
//!
//! # Incarnations
//! `meta.inc` is the run_id of the Redis server that wrote the model. A
//! model that is missing (a new topic, or lost) or written by another
//! incarnation (a restart from an older AOF, a promoted replica) is rebuilt
//! before any use from what the members projection stored in MySQL plus
//! the membership events in the log tail that projection has not committed
//! ([`rebuild`]), after the in-flight window when it may be older than what
//! was acknowledged.

pub mod rebuild;

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

/// Why the model could not answer; every one is retryable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    #[error("redis: {0}")]
    Redis(String),
    #[error("rebuilding the group's state: {0}")]
    Rebuild(String),
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Changed; the model's new version.
    Done(i64),
    /// The command ran before: its claim.
    Claim(String),
    /// The facts moved (or the model was rebuilt): decide again.
    Conflict,
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
    rebuilds: Coalescer<(String, String), Result<Existence, String>>,
    /// Names found to be no group, in this process only (a refused request
    /// leaves no state in Redis), for [`ABSENT_FOR`].
    absent: std::sync::Mutex<HashMap<(String, String), std::time::Instant>>,
}

/// What a rebuild found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existence {
    /// A live model is in Redis (the group, or a `none` marker for a
    /// create to decide on).
    Live,
    /// No such group, and nothing was written.
    Absent,
}

/// How long a name found to be no group is answered from memory: a made-up
/// name costs one rebuild (a MySQL lookup and a log-tail read) per this
/// long per gateway, bounded further by the caller's rate limits.
const ABSENT_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// Most names remembered as absent per process.
const ABSENT_MAX: usize = 100_000;

impl GroupModel {
    pub fn new(config: Config, pools: TenantPools, redis: Redis, codec: EventCodec) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                pools,
                redis,
                codec,
                rebuilds: Coalescer::default(),
                absent: std::sync::Mutex::new(HashMap::new()),
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

    /// The facts of `uids` in `topic` (rebuilding the model first when it
    /// is missing or stale); with `claim`, the command's claim instead when
    /// it ran before.
    pub async fn read(
        &self,
        tenant: &str,
        topic: &str,
        uids: &[i64],
        claim: Option<&str>,
    ) -> Result<Read, ModelError> {
        let keys = TopicKeys::new(tenant, topic);
        let mut redis = self.redis();
        for _ in 0..3 {
            if self.known_absent(tenant, topic) {
                return Ok(Read::State(Snapshot::absent()));
            }
            let mut call = READ.prepare_invoke();
            call.key(keys.meta())
                .key(keys.members())
                .key(keys.roles())
                .key(keys.mutes())
                .key(keys.invites())
                .key(claim.map_or_else(|| keys.command(0, "-"), str::to_string))
                .arg(if claim.is_some() { "1" } else { "0" });
            for uid in uids {
                call.arg(uid);
            }
            let reply: Vec<String> = call.invoke_async(&mut redis).await?;
            match reply.first().map(String::as_str) {
                Some("CLAIM") => return Ok(Read::Claim(reply.get(1).cloned().unwrap_or_default())),
                Some("OK") => return Ok(Read::State(snapshot(&reply, uids))),
                Some("MISSING") | Some("FENCED") => {
                    if self.ensure(tenant, topic).await? == Existence::Absent {
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

    /// Applies `change` if its facts still hold, recording `claim` (key and
    /// value) with it.
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
            Some("OK") => Ok(Applied::Done(
                reply.get(1).and_then(|v| v.parse().ok()).unwrap_or(0),
            )),
            Some("CLAIM") => Ok(Applied::Claim(reply.get(1).cloned().unwrap_or_default())),
            Some("CONFLICT") => Ok(Applied::Conflict),
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

    /// Makes sure `topic` has a live model: rebuilds it when it is missing
    /// or was written by another incarnation of Redis. A name that is no
    /// group is answered [`Existence::Absent`] and leaves nothing in Redis.
    /// Concurrent calls in this process share one rebuild; it runs to its
    /// end even if every caller gives up.
    pub async fn ensure(&self, tenant: &str, topic: &str) -> Result<Existence, ModelError> {
        if self.known_absent(tenant, topic) {
            return Ok(Existence::Absent);
        }
        let found = self.rebuild(tenant, topic, false).await?;
        if found == Existence::Absent {
            let mut absent = self.inner.absent.lock().expect("absent lock");
            if absent.len() >= ABSENT_MAX {
                absent.retain(|_, at| at.elapsed() < ABSENT_FOR);
                if absent.len() >= ABSENT_MAX {
                    absent.clear();
                }
            }
            absent.insert(
                (tenant.to_string(), topic.to_string()),
                std::time::Instant::now(),
            );
        }
        Ok(found)
    }

    /// Before a create: the model of `topic` is live, a `none` marker when
    /// no group has the name (what the create decides on and replaces).
    pub async fn prepare_create(&self, tenant: &str, topic: &str) -> Result<(), ModelError> {
        self.inner
            .absent
            .lock()
            .expect("absent lock")
            .remove(&(tenant.to_string(), topic.to_string()));
        self.rebuild(tenant, topic, true).await.map(|_| ())
    }

    async fn rebuild(
        &self,
        tenant: &str,
        topic: &str,
        mark_none: bool,
    ) -> Result<Existence, ModelError> {
        let inner = self.inner.clone();
        let (t, tp) = (tenant.to_string(), topic.to_string());
        self.inner
            .rebuilds
            .run((t.clone(), format!("{tp}\n{mark_none}")), async move {
                tokio::spawn(async move { rebuild::rebuild(&inner, &t, &tp, mark_none).await })
                    .await
                    .unwrap_or_else(|e| Err(format!("rebuild task: {e}")))
            })
            .await
            .map_err(ModelError::Rebuild)
    }

    fn known_absent(&self, tenant: &str, topic: &str) -> bool {
        let mut absent = self.inner.absent.lock().expect("absent lock");
        let key = (tenant.to_string(), topic.to_string());
        match absent.get(&key) {
            Some(at) if at.elapsed() < ABSENT_FOR => true,
            Some(_) => {
                absent.remove(&key);
                false
            }
            None => false,
        }
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
        let Read::State(s) = self.read(tenant, topic, &[uid], None).await? else {
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
        let Read::State(s) = self.read(tenant, topic, &[uid], None).await? else {
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
            // Checks the model is live first (rebuilding it if not).
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
