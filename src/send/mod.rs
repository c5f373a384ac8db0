//! The send path (ARCHITECTURE.md §3), shared by the WebSocket and HTTP
//! front ends: content checks, ACL and mute checks, seq and shard month from
//! one Lua call, a Snowflake id, `MessageSent` produced with acks=all, then
//! the claim is marked done and the seq returned.
//!
//! Idempotent by construction: a client message id's claim fixes the
//! message's seq, shard month, message id, event id and time for good. A
//! retry after any failure (a produce timeout, a broker error, a gateway
//! crash between allocation and ack) produces that same event again, never
//! a new seq; every projection treats `(tenant, topic, seq)` and the event id
//! as the identity, so a second copy in the log changes nothing. A seq is a
//! hole only when no event for it ever reaches the log.

mod claim;
mod content;
pub mod marks;
pub(crate) mod reseed;

pub use content::{
    derive, replied_seq, split_head, ContentError, Derived, MAX_JSON_DEPTH, MAX_MENTIONS,
};

pub use crate::kafka::producer::IN_FLIGHT_WINDOW_MS;
pub use crate::redis_util::generation::establish_generation;
pub use crate::store::setup::establish_generations;
pub use reseed::MARGIN_AFTER_LOSS;

static CLAIM_DONE: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/claim_done.lua")));

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::redis_util::Redis;
use redis::Script;

use crate::config::Config;
use crate::events::{now_ms, GroupEvent, GroupEventBody, MessageEdited, MessageSent};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::keys::{TenantKeys, TopicKeys, CLAIM_TTL_MS};
use crate::metrics as m;
use crate::snowflake::Snowflake;
use crate::store::clock;
use crate::tenant::TenantPools;

use claim::{digest, edit_event_id, Claim, Identity};

static ALLOCATE: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/allocate_seq.lua")));

/// How long a send keeps producing its event again after a failed attempt
/// (each attempt waits up to the producer's `message.timeout.ms`).
const PRODUCE_RETRY_BUDGET: Duration = Duration::from_secs(5);
/// How long the gateway trusts its copy of a tenant's active month.
const ACTIVE_MONTH_CACHE: Duration = Duration::from_secs(1);

/// One message to send.
#[derive(Debug, Clone)]
pub struct SendRequest {
    pub tenant: String,
    pub topic: String,
    pub uid: i64,
    pub device: String,
    pub sid: String,
    pub client_msg_id: Option<String>,
    /// Tinode head (JSON object text), already without `client_mid`.
    pub head: Option<String>,
    /// Tinode content (JSON text).
    pub content: String,
    pub traceparent: Option<String>,
    /// This message replaces (edits) the sender's message with this seq
    /// (Tinode's `head.replace`): a `MessageEdited` follows the `MessageSent`.
    pub edit_of: Option<i64>,
    /// The first message of the thread `head.reply` answers, as the front
    /// end found it (the replied message's own root); `None` makes the
    /// replied message the root.
    pub reply_root: Option<i64>,
}

/// The outcome of an accepted send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    pub seq: i64,
    pub shard_month: String,
    pub message_id: i64,
    /// A retry answered from the earlier claim; nothing new was produced.
    pub duplicate: bool,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    #[error("not a member of this group")]
    NotMember,
    #[error("group is dissolved")]
    Dissolved,
    #[error("muted until {0}")]
    Muted(i64),
    #[error("group is muted")]
    MutedAll,
    #[error("the recipient blocked the sender")]
    Blocked,
    #[error("only friends may send one-to-one messages")]
    NotFriends,
    #[error("message too large ({0} bytes)")]
    TooLarge(usize),
    /// The client message id was used before for a different message.
    #[error("client_mid was already used for a different message")]
    ClientIdReused,
    #[error("{0}")]
    BadRequest(String),
    /// Nothing was sent; the client may retry (with the same client_mid).
    #[error("temporarily unavailable: {0}")]
    Retryable(String),
    /// The sender looked up too many groups Redis holds no model of
    /// (`limits.unknown_names`): retry after this many milliseconds.
    #[error("too many lookups of unknown groups; retry in {0} ms")]
    Throttled(u64),
    /// This process already holds `limits.sends_in_flight` sends: refused
    /// before anything was allocated; retry after a moment.
    #[error("overloaded: too many sends in flight")]
    Overloaded,
}

/// How long a client refused as overloaded is asked to wait.
pub const OVERLOADED_RETRY_MS: u64 = 1_000;

impl SendError {
    fn retry(why: impl std::fmt::Display) -> Self {
        SendError::Retryable(why.to_string())
    }
}

/// The outcome of [`Sender::allocate`], to hand to [`Sender::commit`].
#[derive(Debug)]
pub struct Allocation {
    started: Instant,
    result: Result<Allocated, SendError>,
    /// Held from admission to the answer (or until dropped).
    _admitted: Option<Admitted>,
}

impl Allocation {
    /// The message's seq, once one is taken (or the earlier send's, for a
    /// retry answered from its claim).
    pub fn seq(&self) -> Option<i64> {
        match &self.result {
            Ok(Allocated::Produce { claim, .. }) => Some(claim.identity.seq),
            Ok(Allocated::Answered(sent)) => Some(sent.seq),
            Err(_) => None,
        }
    }
}

/// One admitted send, counted in the process's in-flight sends.
#[derive(Debug)]
struct Admitted(Arc<AtomicUsize>);

impl Admitted {
    /// A place among `limit` in-flight sends (0: no bound), if one is free.
    fn take(in_flight: &Arc<AtomicUsize>, limit: usize) -> Option<Admitted> {
        let now = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        let admitted = Admitted(in_flight.clone());
        if limit > 0 && now > limit {
            return None; // dropped: counted back out
        }
        metrics::gauge!(m::SEND_IN_FLIGHT).set(now as f64);
        Some(admitted)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let now = self.0.fetch_sub(1, Ordering::AcqRel) - 1;
        metrics::gauge!(m::SEND_IN_FLIGHT).set(now as f64);
    }
}

#[derive(Debug)]
enum Allocated {
    /// The message still has to be produced: a new seq, or a retry of a
    /// claim whose event may not have reached the log (`again`).
    Produce {
        claim: Claim,
        group_id: i64,
        again: bool,
        /// What the content says, `@all` granted or not.
        content: Content,
    },
    /// A retry of a send that already succeeded.
    Answered(Sent),
}

/// What the content and head say about a message, with `@all` decided by
/// the sender's role.
#[derive(Debug, Clone)]
struct Content {
    derived: Derived,
    mention_all: bool,
}

/// Everything the send path needs; cheap to clone.
#[derive(Clone)]
pub struct Sender {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    redis: Redis,
    pools: TenantPools,
    producer: EventProducer,
    snowflake: Snowflake,
    node: String,
    /// Per tenant: the active month and announced switch as read, and until
    /// when the copy may be used (Redis Cluster only: on one server the
    /// allocation script reads them itself).
    active_months: Mutex<HashMap<String, (MonthArgs, Instant)>>,
    reseeds: reseed::Reseeds,
    /// Seq allocators being restored from their durable marks, and blocks
    /// being reserved, per topic: concurrent sends share one.
    restores: crate::coalesce::Coalescer<(String, String), Result<marks::Restored, SendError>>,
    blocks: crate::coalesce::Coalescer<(String, String), Result<(), String>>,
    /// Per tenant: the restore marker last read, and when (see
    /// `Sender::check_claim`; a marker that covers a topic keeps covering
    /// it, so a second-old copy is enough).
    markers: Mutex<HashMap<String, (String, Instant)>>,
    /// The group write model the allocator checks the sender against.
    groups: crate::group_model::GroupModel,
    /// Sends admitted and not yet answered (see `limits.sends_in_flight`).
    in_flight: Arc<AtomicUsize>,
}

impl Sender {
    pub fn new(
        config: Config,
        redis: Redis,
        pools: TenantPools,
        producer: EventProducer,
        snowflake: Snowflake,
    ) -> Self {
        let node = config.node.resolved_id();
        let groups = crate::group_model::GroupModel::new(
            config.clone(),
            pools.clone(),
            redis.clone(),
            producer.codec().clone(),
        );
        Self {
            inner: Arc::new(Inner {
                config,
                redis,
                groups,
                pools,
                producer,
                snowflake,
                node,
                active_months: Mutex::new(HashMap::new()),
                reseeds: reseed::Reseeds::default(),
                restores: crate::coalesce::Coalescer::default(),
                blocks: crate::coalesce::Coalescer::default(),
                markers: Mutex::new(HashMap::new()),
                in_flight: Arc::new(AtomicUsize::new(0)),
            }),
        }
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn redis(&self) -> Redis {
        self.inner.redis.clone()
    }

    pub fn pools(&self) -> &TenantPools {
        &self.inner.pools
    }

    pub fn producer(&self) -> &EventProducer {
        &self.inner.producer
    }

    /// The group write model (membership checks, governance).
    pub fn groups(&self) -> &crate::group_model::GroupModel {
        &self.inner.groups
    }

    /// Sends one message; see the module docs for the steps.
    pub async fn send(&self, req: SendRequest) -> Result<Sent, SendError> {
        let allocation = self.allocate(&req).await;
        self.commit(&req, allocation).await
    }

    /// The first half of a send: checks, claim, seq and month (one Lua
    /// call, in arrival order). A session allocates its messages one after
    /// another and lets the produce-and-ack halves ([`commit`](Self::commit))
    /// overlap, so the broker's latency does not limit one connection's rate.
    ///
    /// Refused as [`SendError::Overloaded`] at once, before any check or
    /// allocation, while the process already holds
    /// `limits.sends_in_flight` sends.
    pub async fn allocate(&self, req: &SendRequest) -> Allocation {
        let started = Instant::now();
        let limit = self.inner.config.limits.sends_in_flight;
        let Some(admitted) = Admitted::take(&self.inner.in_flight, limit) else {
            return Allocation {
                started,
                result: Err(SendError::Overloaded),
                _admitted: None,
            };
        };
        let result = self.send_inner(req).await;
        Allocation {
            started,
            result,
            _admitted: Some(admitted),
        }
    }

    /// The second half: produce the allocated message and wait for the ack.
    pub async fn commit(
        &self,
        req: &SendRequest,
        allocation: Allocation,
    ) -> Result<Sent, SendError> {
        let Allocation {
            started,
            result,
            _admitted,
        } = allocation;
        let mut reproduced = false;
        let result = match result {
            Ok(Allocated::Produce {
                claim,
                group_id,
                again,
                content,
            }) => {
                reproduced = again;
                let keys = TopicKeys::new(&req.tenant, &req.topic);
                self.produce(req, &keys, claim, group_id, content).await
            }
            Ok(Allocated::Answered(sent)) => Ok(sent),
            Err(e) => Err(e),
        };
        let outcome = match &result {
            Ok(s) if s.duplicate => "duplicate",
            // A retry of a pending claim: its event produced once more.
            Ok(_) if reproduced => "reproduced",
            Ok(_) => "ok",
            Err(SendError::Retryable(_)) => "retryable",
            Err(SendError::Overloaded) => "overloaded",
            Err(_) => "refused",
        };
        metrics::counter!(m::SEND_TOTAL, "outcome" => outcome).increment(1);
        if result.is_ok() {
            metrics::histogram!(m::SEND_ACK_LATENCY).record(started.elapsed().as_secs_f64());
        }
        result
    }

    async fn send_inner(&self, req: &SendRequest) -> Result<Allocated, SendError> {
        let max = self.inner.config.gateway.max_message_size;
        let size = req.content.len() + req.head.as_ref().map_or(0, String::len);
        if size > max {
            return Err(SendError::TooLarge(size));
        }
        content::check(&req.content, req.head.as_deref())
            .map_err(|e| SendError::BadRequest(e.to_string()))?;
        let derived = content::derive(&req.content, req.head.as_deref(), req.uid)
            .map_err(|e| SendError::BadRequest(e.to_string()))?;
        if let Some(c) = &req.client_msg_id {
            if c.is_empty() || c.len() > crate::fields::CLIENT_MSG_ID_BYTES || c.contains('|') {
                return Err(SendError::BadRequest(format!(
                    "client_mid must be 1-{} bytes without '|'",
                    crate::fields::CLIENT_MSG_ID_BYTES
                )));
            }
        }
        let pool = self
            .inner
            .pools
            .get(&req.tenant)
            .map_err(|_| SendError::BadRequest(format!("unknown tenant {}", req.tenant)))?;
        let keys = TopicKeys::new(&req.tenant, &req.topic);
        let mut redis = self.inner.redis.clone();
        if crate::tinode::is_p2p_topic(&req.topic) {
            // Refused from the name alone, before Redis is touched: a
            // one-to-one topic of two other users leaves no state behind.
            let Some(peer) = crate::tinode::p2p_peer(&req.topic, req.uid) else {
                return Err(SendError::NotMember);
            };
            self.check_relations(pool, &mut redis, &req.tenant, req.uid, peer)
                .await?;
        }

        // Only a claimed send needs its digest.
        let digest = match req.client_msg_id {
            Some(_) => digest(req),
            None => String::new(),
        };
        let one_server = matches!(redis, Redis::Single(_));
        let tenant_keys = TenantKeys::new(&req.tenant);
        let mut claim_checked = false;
        for _ in 0..8 {
            // Before the allocation: a failure here leaves no seq taken.
            let content = self.content(req, &keys, derived.clone()).await?;
            // On one Redis server the script reads the tenant's month state
            // itself; on a cluster it lives in another slot, so the gateway
            // passes what it read (see lua/allocate_seq.lua).
            let month = if one_server {
                MonthArgs::default()
            } else {
                self.month_args(&req.tenant, pool).await?
            };
            let message_id = self.inner.snowflake.next_id().map_err(SendError::retry)?;
            let event_id = crate::events::new_event_id();
            let created_at = now_ms();
            let mut call = ALLOCATE.prepare_invoke();
            call.key(keys.seq())
                .key(keys.meta())
                .key(keys.members())
                .key(keys.roles())
                .key(keys.mutes())
                .key(keys.invites())
                .key(keys.left())
                .key(keys.uniq(req.uid, req.client_msg_id.as_deref().unwrap_or("-")));
            if one_server {
                call.key(tenant_keys.active_month())
                    .key(tenant_keys.month_switch());
            }
            call.arg(req.uid)
                .arg(&month.active)
                .arg(created_at)
                .arg(CLAIM_TTL_MS)
                .arg(req.client_msg_id.as_deref().unwrap_or(""))
                .arg(message_id)
                .arg(&event_id)
                .arg(created_at)
                .arg(&digest)
                .arg(&month.switch)
                .arg(if claim_checked { "1" } else { "" });
            let reply: Vec<String> = call
                .invoke_async(&mut redis)
                .await
                .map_err(|e| SendError::retry(format!("redis: {e}")))?;
            match reply.first().map(String::as_str) {
                Some("OK") => {
                    let identity = Identity {
                        seq: parse_i64(reply.get(1))?,
                        month: reply.get(2).cloned().unwrap_or_default(),
                        message_id,
                        event_id,
                        created_at,
                    };
                    if reply.get(4).map(String::as_str) == Some("1") {
                        self.prefetch_block(&req.tenant, &req.topic);
                    }
                    return Ok(Allocated::Produce {
                        claim: Claim {
                            done: false,
                            identity,
                            digest,
                        },
                        group_id: parse_i64(reply.get(3))?,
                        again: false,
                        content,
                    });
                }
                Some("DUP") => {
                    let group_id = parse_i64(reply.get(2))?;
                    return duplicate(reply.get(1), &digest, group_id, content);
                }
                // The block is used up (or the month moves on): the next
                // one is reserved in the durable mark first.
                Some("NEEDBLOCK") => {
                    self.next_block(&req.tenant, &req.topic, &reply).await?;
                }
                // Missing (a new topic, or lost) or written by another
                // incarnation of Redis (a restart, a failover): restored
                // from the durable mark before any seq is taken from it.
                Some("RESEED") | Some("FENCED") => {
                    let restored = self.restore_seq(&req.tenant, &req.topic).await?;
                    if restored == marks::Restored::Legacy {
                        self.inner
                            .reseeds
                            .reseed(self, &req.tenant, &req.topic)
                            .await?;
                    }
                }
                // A restored topic: this client id's claim may have been
                // lost with Redis; its durable claim first.
                Some("CLAIMCHECK") => {
                    let cmid = req.client_msg_id.as_deref().unwrap_or("");
                    let run_id = reply.get(1).map(String::as_str).unwrap_or("");
                    let rec = reply.get(2).and_then(|r| r.parse().ok()).unwrap_or(0);
                    // The whole tenant forgotten: any pass of this
                    // incarnation covers; this topic alone: one begun
                    // after it was restored.
                    let since = if reply.get(3).map(String::as_str) == Some("1") {
                        0
                    } else {
                        rec
                    };
                    self.check_claim(&req.tenant, &req.topic, req.uid, cmid, run_id, since)
                        .await?;
                    claim_checked = true;
                }
                // The group's write model is missing, partial or stale:
                // restored from MySQL before anything is decided on it.
                Some("NOGROUP") | Some("NOMEMBERS") | Some("GFENCED") => {
                    let found = self
                        .inner
                        .groups
                        .ensure_as(&req.tenant, &req.topic, Some(req.uid))
                        .await
                        .map_err(|e| match e {
                            crate::group_model::ModelError::Throttled(ms) => {
                                SendError::Throttled(ms)
                            }
                            e => SendError::retry(e),
                        })?;
                    if found == crate::group_model::Existence::Absent {
                        return Err(SendError::NotMember);
                    }
                }
                // The tenant's active month is missing (one server).
                Some("NOMONTH") => {
                    let mut redis = self.inner.redis.clone();
                    clock::restore_active_month(&mut redis, pool, &req.tenant)
                        .await
                        .map_err(SendError::retry)?;
                }
                Some("NOTMEMBER") => return Err(SendError::NotMember),
                Some("DISSOLVED") => return Err(SendError::Dissolved),
                Some("MUTED") => return Err(SendError::Muted(parse_i64(reply.get(1))?)),
                Some("MUTED_ALL") => return Err(SendError::MutedAll),
                other => {
                    return Err(SendError::retry(format!(
                        "unexpected allocator reply {other:?}"
                    )))
                }
            }
        }
        Err(SendError::retry("send state kept changing; retry"))
    }

    /// Restores the topic's seq allocator from its durable mark
    /// ([`marks::restore`]); concurrent sends of one topic share one.
    async fn restore_seq(&self, tenant: &str, topic: &str) -> Result<marks::Restored, SendError> {
        let sender = self.clone();
        let (t, tp) = (tenant.to_string(), topic.to_string());
        self.inner
            .restores
            .run((t.clone(), tp.clone()), async move {
                marks::restore(&sender, &t, &tp).await
            })
            .await
    }

    /// The content's columns with `@all` decided: granted to a group's
    /// owner and admins (the cached roles, read just before the allocation,
    /// which loads them when they are not cached and then asks again); a
    /// plain member's `@all` stays in the text and mentions nobody. A retry
    /// of a pending send decides again, so a role changed in between is the
    /// one that counts.
    async fn content(
        &self,
        req: &SendRequest,
        keys: &TopicKeys,
        derived: Derived,
    ) -> Result<Content, SendError> {
        let mention_all = if derived.mentions_all && crate::tinode::is_group_topic(&req.topic) {
            let mut redis = self.inner.redis.clone();
            let role: Option<String> = redis::cmd("HGET")
                .arg(keys.roles())
                .arg(req.uid)
                .query_async(&mut redis)
                .await
                .map_err(|e| SendError::retry(format!("redis: {e}")))?;
            matches!(role.as_deref(), Some("owner" | "admin"))
        } else {
            false
        };
        Ok(Content {
            derived,
            mention_all,
        })
    }

    /// Produces the message's event (the same event for every attempt of
    /// one claim) and marks the claim done once the log has it.
    async fn produce(
        &self,
        req: &SendRequest,
        keys: &TopicKeys,
        mut claim: Claim,
        group_id: i64,
        content: Content,
    ) -> Result<Sent, SendError> {
        let Content {
            derived,
            mention_all,
        } = content;
        let Identity {
            seq,
            ref month,
            message_id,
            ref event_id,
            created_at,
        } = claim.identity;
        let event = GroupEvent {
            event_id: event_id.clone(),
            occurred_at: created_at,
            actor_device: req.device.clone(),
            source_sid: req.sid.clone(),
            source_node: self.inner.node.clone(),
            traceparent: req.traceparent.clone().unwrap_or_default(),
            ..GroupEvent::new(
                &req.tenant,
                &req.topic,
                req.uid,
                GroupEventBody::MessageSent(MessageSent {
                    message_id,
                    group_id,
                    seq,
                    shard_month: month.to_string(),
                    client_msg_id: req.client_msg_id.clone(),
                    from_user: req.uid,
                    msg_type: derived.msg_type.into(),
                    head: req.head.clone(),
                    content: Some(req.content.clone()),
                    mentioned_user_ids: derived.mentioned,
                    mention_all,
                    reply_seq: derived.reply_seq,
                    root_seq: derived.reply_seq.map(|r| req.reply_root.unwrap_or(r)),
                    file_count: derived.file_count,
                    content_size: req.content.len() as i32,
                    has_risk: false,
                    audit_status: "pass".into(),
                    created_at,
                    expires_at: None,
                }),
            )
        };
        let key = format!("{}:{}", req.tenant, req.topic);
        let producer = &self.inner.producer;
        let tp = req.traceparent.as_deref();
        // The edit that follows a replacement (same partition, produced
        // after it, so the replacement is in the log first).
        let edit = req.edit_of.map(|target| GroupEvent {
            body: GroupEventBody::MessageEdited(MessageEdited {
                seq: target,
                edit_seq: Some(seq),
                head: edited_head(req.head.as_deref()),
                content: Some(req.content.clone()),
                edited_at: created_at,
            }),
            event_id: edit_event_id(event_id),
            ..event.clone()
        });
        // The gateway's own retries send the very same events, so they are
        // safe with or without a client message id; past the budget the
        // client gets a retryable error (and its retry, with the same
        // client_mid, produces them again).
        let deadline = Instant::now() + PRODUCE_RETRY_BUDGET;
        let result = loop {
            let mut attempt = producer
                .send(TopicKind::GroupEvents, &key, &event, tp)
                .await;
            if let (Ok(_), Some(edit)) = (&attempt, &edit) {
                attempt = producer.send(TopicKind::GroupEvents, &key, edit, tp).await;
            }
            match attempt {
                Err(e) if e.is_retryable() && Instant::now() < deadline => {
                    tracing::warn!(tenant = %req.tenant, topic = %req.topic, seq, error = %e, "produce failed; producing the same event again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => break other,
            }
        };
        match result {
            Ok(_) => {
                if let Some(cmid) = req.client_msg_id.as_deref() {
                    claim.done = true;
                    // Best effort: a claim left pending answers a retry by
                    // producing this same event again, which changes nothing.
                    // After a Redis loss the claim is put back (the new
                    // incarnation never had it), unless another message
                    // holds it (a retry that raced this one across the loss).
                    let mut redis = self.inner.redis.clone();
                    let written: redis::RedisResult<i64> = CLAIM_DONE
                        .key(keys.uniq(req.uid, cmid))
                        .arg(claim.text())
                        .arg(event_id)
                        .arg(CLAIM_TTL_MS)
                        .invoke_async(&mut redis)
                        .await;
                    if let Ok(0) = written {
                        metrics::counter!(m::CLAIM_RACES_TOTAL).increment(1);
                        tracing::warn!(tenant = %req.tenant, topic = %req.topic, seq, client_msg_id = cmid, "another message holds this client id's claim (a retry raced it across a Redis loss)");
                    }
                }
                Ok(Sent {
                    seq,
                    shard_month: claim.identity.month,
                    message_id,
                    duplicate: false,
                })
            }
            Err(e) => {
                // The claim stays pending: the event may still reach the log,
                // and a retry with the same client_mid produces it again.
                tracing::warn!(tenant = %req.tenant, topic = %req.topic, seq, error = %e, "produce failed; a retry with the same client_mid produces the same event");
                Err(SendError::retry("message log unavailable"))
            }
        }
    }

    /// One-to-one sends: refused when the peer blocked the sender, and
    /// (with `gateway.p2p_friends_only`) unless they are friends.
    async fn check_relations(
        &self,
        pool: &sqlx::MySqlPool,
        redis: &mut Redis,
        tenant: &str,
        uid: i64,
        peer: i64,
    ) -> Result<(), SendError> {
        use crate::relations::{contains, Set};
        if contains(pool, redis, tenant, Set::Blocks, peer, uid)
            .await
            .map_err(SendError::retry)?
        {
            return Err(SendError::Blocked);
        }
        if self.inner.config.gateway.p2p_friends_only
            && !contains(pool, redis, tenant, Set::Friends, uid, peer)
                .await
                .map_err(SendError::retry)?
        {
            return Err(SendError::NotFriends);
        }
        Ok(())
    }

    /// The tenant's active month and announced switch for the allocation
    /// script on a Redis Cluster, read together and used for at most
    /// [`ACTIVE_MONTH_CACHE`] from when the read was sent: an announcement
    /// is made [`crate::store::shards::SWITCH_LEAD_MS`] before its instant,
    /// so every copy in use holds it by then. When Redis lost the active
    /// month, the latest writable month of the catalog is put back.
    async fn month_args(
        &self,
        tenant: &str,
        pool: &sqlx::MySqlPool,
    ) -> Result<MonthArgs, SendError> {
        if let Some((args, until)) = self.inner.active_months.lock().expect("lock").get(tenant) {
            if Instant::now() < *until {
                return Ok(args.clone());
            }
        }
        let mut redis = self.inner.redis.clone();
        for _ in 0..3 {
            let asked = Instant::now();
            let (active, switch) = clock::month_state(&mut redis, tenant)
                .await
                .map_err(|e| SendError::retry(format!("redis: {e}")))?;
            let active = match active {
                Some(m) => m,
                None => {
                    clock::restore_active_month(&mut redis, pool, tenant)
                        .await
                        .map_err(SendError::retry)?;
                    continue;
                }
            };
            let until = asked + ACTIVE_MONTH_CACHE;
            if Instant::now() >= until {
                // Too slow an answer may predate an announcement: ask again.
                continue;
            }
            let args = MonthArgs {
                active: active.to_string(),
                switch: switch.map(|s| s.encode()).unwrap_or_default(),
            };
            self.inner
                .active_months
                .lock()
                .expect("lock")
                .insert(tenant.to_string(), (args.clone(), until));
            return Ok(args);
        }
        Err(SendError::retry(
            "the tenant's active month could not be read",
        ))
    }
}

/// The month arguments of `lua/allocate_seq.lua` (ARGV[2], ARGV[10]):
/// empty on one Redis server, where the script reads the keys itself.
#[derive(Debug, Clone, Default)]
struct MonthArgs {
    active: String,
    switch: String,
}

/// The head an edit leaves on the edited message: the replacement's head
/// without `replace` (`None` when nothing else is left).
fn edited_head(head: Option<&str>) -> Option<String> {
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(head?).ok()?;
    map.remove("replace");
    (!map.is_empty()).then(|| serde_json::Value::Object(map).to_string())
}

/// A retry of a claimed client message id: answered with the same seq once
/// done; while pending, the same event is produced again (the first attempt
/// may have failed, timed out, or died with its gateway).
fn duplicate(
    claim: Option<&String>,
    digest: &str,
    group_id: i64,
    content: Content,
) -> Result<Allocated, SendError> {
    let Some(claim) = claim.and_then(|c| Claim::parse(c)) else {
        // A claim written by an older gateway (`status|seq|month|id`): a
        // done one still answers; a pending one settles within a minute.
        let parts: Vec<&str> = claim.map(|c| c.split('|').collect()).unwrap_or_default();
        if let ["done", seq, month, id] = parts[..] {
            if let (Ok(seq), Ok(message_id)) = (seq.parse(), id.parse()) {
                return Ok(Allocated::Answered(Sent {
                    seq,
                    shard_month: month.to_string(),
                    message_id,
                    duplicate: true,
                }));
            }
        }
        return Err(SendError::retry(
            "an earlier send with this client_mid is still in progress",
        ));
    };
    if claim.digest != digest {
        return Err(SendError::ClientIdReused);
    }
    if claim.done {
        metrics::counter!(m::DEDUP_HIT_TOTAL).increment(1);
        let i = claim.identity;
        return Ok(Allocated::Answered(Sent {
            seq: i.seq,
            shard_month: i.month,
            message_id: i.message_id,
            duplicate: true,
        }));
    }
    Ok(Allocated::Produce {
        claim,
        group_id,
        again: true,
        content,
    })
}

fn parse_i64(v: Option<&String>) -> Result<i64, SendError> {
    v.and_then(|s| s.parse().ok())
        .ok_or_else(|| SendError::retry("malformed allocator reply"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_round_trips_and_refuses_what_it_cannot_read() {
        let claim = Claim {
            done: false,
            identity: Identity {
                seq: 42,
                month: "202612".into(),
                message_id: 7,
                event_id: "0190-ab".into(),
                created_at: 1_700_000_000_000,
            },
            digest: "00ff".into(),
        };
        assert_eq!(Claim::parse(&claim.text()), Some(claim.clone()));
        assert_eq!(
            claim.text(),
            "pending|42|202612|7|0190-ab|1700000000000|00ff"
        );
        assert_eq!(Claim::parse("done|42|202612|7"), None);
        assert_eq!(Claim::parse("failed|42|202612|7|e|1|d"), None);
    }

    #[test]
    fn a_retry_is_answered_or_produced_again_but_never_given_a_new_seq() {
        let req = |content: &str| SendRequest {
            tenant: "t".into(),
            topic: "grpX".into(),
            uid: 1,
            device: "d".into(),
            sid: String::new(),
            client_msg_id: Some("c".into()),
            head: None,
            content: content.into(),
            traceparent: None,
            edit_of: None,
            reply_root: None,
        };
        let content = || Content {
            derived: derive("\"hi\"", None, 1).unwrap(),
            mention_all: false,
        };
        let d = digest(&req("\"hi\""));
        let pending = format!("pending|5|202612|9|ev|1|{d}");
        match duplicate(Some(&pending), &d, 3, content()) {
            Ok(Allocated::Produce {
                claim,
                group_id,
                again,
                ..
            }) => {
                let identity = &claim.identity;
                assert_eq!(
                    (identity.seq, identity.event_id.as_str(), group_id, again),
                    (5, "ev", 3, true)
                );
            }
            other => panic!("{other:?}"),
        }
        let done = pending.replacen("pending", "done", 1);
        assert!(matches!(
            duplicate(Some(&done), &d, 3, content()),
            Ok(Allocated::Answered(Sent {
                seq: 5,
                duplicate: true,
                ..
            }))
        ));
        let other = digest(&req("\"something else\""));
        assert_eq!(
            duplicate(Some(&done), &other, 3, content()).err(),
            Some(SendError::ClientIdReused)
        );
        // Written by an older gateway.
        assert!(matches!(
            duplicate(Some(&"done|5|202612|9".to_string()), &d, 3, content()),
            Ok(Allocated::Answered(Sent { seq: 5, .. }))
        ));
    }

    #[test]
    fn an_edit_event_id_is_derived_from_its_message() {
        assert_eq!(edit_event_id("a"), edit_event_id("a"));
        assert_ne!(edit_event_id("a"), edit_event_id("b"));
        assert!(uuid::Uuid::parse_str(&edit_event_id("a")).is_ok());
    }
}
