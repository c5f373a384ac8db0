//! The send path (ARCHITECTURE.md §3), shared by the WebSocket and HTTP
//! front ends: ACL and mute checks, seq and shard month from one Lua call,
//! a Snowflake id, `MessageSent` produced with acks=all, then the claim is
//! marked done and the seq returned.

mod reseed;

pub use reseed::{
    establish_generation, establish_generations, IN_FLIGHT_WINDOW_MS, MARGIN_AFTER_LOSS,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::Script;

use crate::config::Config;
use crate::events::{now_ms, GroupEvent, GroupEventBody, MessageEdited, MessageSent};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::keys::{TenantKeys, TopicKeys};
use crate::metrics as m;
use crate::snowflake::Snowflake;
use crate::store::catalog::{self, ShardStatus};
use crate::store::month::ShardMonth;
use crate::tenant::TenantPools;

static ALLOCATE: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/allocate_seq.lua")));

/// A claim stays `pending` this long before a retry may take over.
const PENDING_TTL_MS: u64 = 60_000;
/// A `done` claim answers retries with the same seq for a day.
const DONE_TTL_MS: u64 = 24 * 3600 * 1000;
/// A `failed` claim is kept briefly; a retry then gets a new seq.
const FAILED_TTL_MS: u64 = 5 * 60 * 1000;
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

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
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
    #[error("{0}")]
    BadRequest(String),
    /// Nothing was sent; the client may retry (with the same client_mid).
    #[error("temporarily unavailable: {0}")]
    Retryable(String),
}

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
}

#[derive(Debug)]
enum Allocated {
    /// A new seq: the message still has to be produced.
    Fresh {
        seq: i64,
        month: String,
        group_id: i64,
        message_id: i64,
    },
    /// A retry of a send that already succeeded.
    Answered(Sent),
}

/// Everything the send path needs; cheap to clone.
#[derive(Clone)]
pub struct Sender {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    redis: ConnectionManager,
    pools: TenantPools,
    producer: EventProducer,
    snowflake: Snowflake,
    node: String,
    active_months: Mutex<HashMap<String, (ShardMonth, Instant)>>,
    reseeds: reseed::Reseeds,
}

impl Sender {
    pub fn new(
        config: Config,
        redis: ConnectionManager,
        pools: TenantPools,
        producer: EventProducer,
        snowflake: Snowflake,
    ) -> Self {
        let node = config.node.resolved_id();
        Self {
            inner: Arc::new(Inner {
                config,
                redis,
                pools,
                producer,
                snowflake,
                node,
                active_months: Mutex::new(HashMap::new()),
                reseeds: reseed::Reseeds::default(),
            }),
        }
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn redis(&self) -> ConnectionManager {
        self.inner.redis.clone()
    }

    pub fn pools(&self) -> &TenantPools {
        &self.inner.pools
    }

    pub fn producer(&self) -> &EventProducer {
        &self.inner.producer
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
    pub async fn allocate(&self, req: &SendRequest) -> Allocation {
        let started = Instant::now();
        let result = self.send_inner(req).await;
        Allocation { started, result }
    }

    /// The second half: produce the allocated message and wait for the ack.
    pub async fn commit(
        &self,
        req: &SendRequest,
        allocation: Allocation,
    ) -> Result<Sent, SendError> {
        let Allocation { started, result } = allocation;
        let result = match result {
            Ok(Allocated::Fresh {
                seq,
                month,
                group_id,
                message_id,
            }) => {
                let keys = TopicKeys::new(&req.tenant, &req.topic);
                self.produce(req, &keys, seq, month, group_id, message_id)
                    .await
            }
            Ok(Allocated::Answered(sent)) => Ok(sent),
            Err(e) => Err(e),
        };
        let outcome = match &result {
            Ok(s) if s.duplicate => "duplicate",
            Ok(_) => "ok",
            Err(SendError::Retryable(_)) => "retryable",
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
        if let Some(c) = &req.client_msg_id {
            if c.is_empty() || c.len() > 64 || c.contains('|') {
                return Err(SendError::BadRequest(
                    "client_mid must be 1-64 characters without '|'".into(),
                ));
            }
        }
        let pool = self
            .inner
            .pools
            .get(&req.tenant)
            .map_err(|_| SendError::BadRequest(format!("unknown tenant {}", req.tenant)))?;
        let keys = TopicKeys::new(&req.tenant, &req.topic);
        let mut redis = self.inner.redis.clone();
        if let Some(peer) = crate::gateway::proto::p2p_peer(&req.topic, req.uid) {
            self.check_relations(pool, &mut redis, &req.tenant, req.uid, peer)
                .await?;
        }

        for _ in 0..4 {
            let active = self.active_month(&req.tenant, pool).await?;
            let message_id = self.inner.snowflake.next_id().map_err(SendError::retry)?;
            let reply: Vec<String> = ALLOCATE
                .key(keys.seq())
                .key(keys.meta())
                .key(keys.members())
                .key(keys.roles())
                .key(keys.mutes())
                .key(keys.uniq(req.uid, req.client_msg_id.as_deref().unwrap_or("-")))
                .arg(req.uid)
                .arg(active.to_string())
                .arg(now_ms())
                .arg(PENDING_TTL_MS)
                .arg(req.client_msg_id.as_deref().unwrap_or(""))
                .arg(message_id)
                .invoke_async(&mut redis)
                .await
                .map_err(|e| SendError::retry(format!("redis: {e}")))?;
            match reply.first().map(String::as_str) {
                Some("OK") => {
                    let seq = parse_i64(reply.get(1))?;
                    let month = reply.get(2).cloned().unwrap_or_default();
                    let group_id = parse_i64(reply.get(3))?;
                    return Ok(Allocated::Fresh {
                        seq,
                        month,
                        group_id,
                        message_id,
                    });
                }
                Some("DUP") => {
                    return self
                        .duplicate(req, &keys, &reply)
                        .await
                        .map(Allocated::Answered)
                }
                Some("RESEED") => {
                    self.inner
                        .reseeds
                        .reseed(self, &req.tenant, &req.topic)
                        .await?;
                }
                Some("NOGROUP") | Some("NOMEMBERS") => {
                    match crate::groups::load(pool, &mut redis, &req.tenant, &req.topic).await {
                        Ok(_) => {}
                        Err(crate::groups::GroupError::NotFound(_)) => {
                            return Err(SendError::NotMember)
                        }
                        Err(e) => return Err(SendError::retry(e)),
                    }
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

    async fn produce(
        &self,
        req: &SendRequest,
        keys: &TopicKeys,
        seq: i64,
        month: String,
        group_id: i64,
        message_id: i64,
    ) -> Result<Sent, SendError> {
        let created_at = now_ms();
        let event = GroupEvent {
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
                    shard_month: month.clone(),
                    client_msg_id: req.client_msg_id.clone(),
                    from_user: req.uid,
                    msg_type: "text".into(),
                    head: req.head.clone(),
                    content: Some(req.content.clone()),
                    mentioned_user_ids: Vec::new(),
                    mention_all: false,
                    reply_seq: None,
                    root_seq: None,
                    file_count: 0,
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
        let result = match req.edit_of {
            None => {
                producer
                    .send(TopicKind::GroupEvents, &key, &event, tp)
                    .await
            }
            Some(target) => {
                // Same partition, produced in order: the replacement is in
                // the log before the edit that points at it.
                let edit = GroupEvent {
                    body: GroupEventBody::MessageEdited(MessageEdited {
                        seq: target,
                        edit_seq: Some(seq),
                        head: edited_head(req.head.as_deref()),
                        content: Some(req.content.clone()),
                        edited_at: created_at,
                    }),
                    event_id: crate::events::new_event_id(),
                    ..event.clone()
                };
                match producer
                    .send(TopicKind::GroupEvents, &key, &event, tp)
                    .await
                {
                    Ok(_) => producer.send(TopicKind::GroupEvents, &key, &edit, tp).await,
                    Err(e) => Err(e),
                }
            }
        };
        let mut redis = self.inner.redis.clone();
        let claim = req.client_msg_id.as_deref().map(|c| keys.uniq(req.uid, c));
        match result {
            Ok(_) => {
                if let Some(claim) = claim {
                    let value = format!("done|{seq}|{month}|{message_id}");
                    // Best effort: a lost "done" leaves "pending", whose
                    // retries wait and then get the same seq from MySQL dedup.
                    let _: redis::RedisResult<()> = redis::cmd("SET")
                        .arg(claim)
                        .arg(value)
                        .arg("PX")
                        .arg(DONE_TTL_MS)
                        .query_async(&mut redis)
                        .await;
                }
                Ok(Sent {
                    seq,
                    shard_month: month,
                    message_id,
                    duplicate: false,
                })
            }
            Err(e) => {
                if let Some(claim) = claim {
                    let value = format!("failed|{seq}|{month}|{message_id}");
                    let _: redis::RedisResult<()> = redis::cmd("SET")
                        .arg(claim)
                        .arg(value)
                        .arg("PX")
                        .arg(FAILED_TTL_MS)
                        .query_async(&mut redis)
                        .await;
                }
                tracing::warn!(tenant = %req.tenant, topic = %req.topic, seq, error = %e, "produce failed; seq left as a hole");
                Err(SendError::retry("message log unavailable"))
            }
        }
    }

    /// One-to-one sends: refused when the peer blocked the sender, and
    /// (with `gateway.p2p_friends_only`) unless they are friends.
    async fn check_relations(
        &self,
        pool: &sqlx::MySqlPool,
        redis: &mut ConnectionManager,
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

    /// A retry of a claimed client message id: the same seq once done; a
    /// short wait while the first attempt is still pending.
    async fn duplicate(
        &self,
        req: &SendRequest,
        keys: &TopicKeys,
        reply: &[String],
    ) -> Result<Sent, SendError> {
        let mut reply = reply.to_vec();
        let claim = keys.uniq(req.uid, req.client_msg_id.as_deref().unwrap_or("-"));
        let mut redis = self.inner.redis.clone();
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            if reply.get(1).map(String::as_str) == Some("done") {
                metrics::counter!(m::DEDUP_HIT_TOTAL).increment(1);
                return Ok(Sent {
                    seq: parse_i64(reply.get(2))?,
                    shard_month: reply.get(3).cloned().unwrap_or_default(),
                    message_id: parse_i64(reply.get(4))?,
                    duplicate: true,
                });
            }
            if Instant::now() > deadline {
                return Err(SendError::retry(
                    "an earlier send with this client_mid is still in progress",
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            let value: Option<String> = redis::cmd("GET")
                .arg(&claim)
                .query_async(&mut redis)
                .await
                .map_err(|e| SendError::retry(format!("redis: {e}")))?;
            let Some(value) = value else {
                return Err(SendError::retry("earlier send expired; retry"));
            };
            let mut parts: Vec<String> = vec!["DUP".into()];
            parts.extend(value.split('|').map(String::from));
            if parts.get(1).map(String::as_str) == Some("failed") {
                return Err(SendError::retry("earlier send failed; retry"));
            }
            reply = parts;
        }
    }

    /// The tenant's active month (cached ≤ 1 s). When Redis lost it, the
    /// latest writable month of the catalog is put back (never backwards).
    async fn active_month(
        &self,
        tenant: &str,
        pool: &sqlx::MySqlPool,
    ) -> Result<ShardMonth, SendError> {
        if let Some((month, at)) = self.inner.active_months.lock().expect("lock").get(tenant) {
            if at.elapsed() < ACTIVE_MONTH_CACHE {
                return Ok(*month);
            }
        }
        let mut redis = self.inner.redis.clone();
        let key = TenantKeys::new(tenant).active_month();
        let month = match crate::redis_util::active_month(&mut redis, &key)
            .await
            .map_err(|e| SendError::retry(format!("redis: {e}")))?
        {
            Some(m) => m,
            None => {
                let writable = catalog::list(pool)
                    .await
                    .map_err(SendError::retry)?
                    .into_iter()
                    .filter(|e| e.status == ShardStatus::Writable)
                    .map(|e| e.month)
                    .max()
                    .ok_or_else(|| {
                        SendError::retry("no writable month yet (is `imstream shards` running?)")
                    })?;
                crate::redis_util::advance_month(&mut redis, &key, writable)
                    .await
                    .map_err(|e| SendError::retry(format!("redis: {e}")))?
            }
        };
        self.inner
            .active_months
            .lock()
            .expect("lock")
            .insert(tenant.to_string(), (month, Instant::now()));
        Ok(month)
    }
}

/// The head an edit leaves on the edited message: the replacement's head
/// without `replace` (`None` when nothing else is left).
fn edited_head(head: Option<&str>) -> Option<String> {
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(head?).ok()?;
    map.remove("replace");
    (!map.is_empty()).then(|| serde_json::Value::Object(map).to_string())
}

fn parse_i64(v: Option<&String>) -> Result<i64, SendError> {
    v.and_then(|s| s.parse().ok())
        .ok_or_else(|| SendError::retry("malformed allocator reply"))
}
