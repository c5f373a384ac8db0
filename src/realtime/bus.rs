//! The realtime bus over Redis Pub/Sub: each gateway subscribes to its node
//! channel and the broadcast channel, drops loops and duplicates (event id
//! LRU), checks the tenant, and hands envelopes to its local sessions.
//! Pub/Sub only delays or loses realtime copies; every message has a
//! durable source of truth the client catches up from by seq. A gateway
//! whose subscription was lost (Redis restarted, failed over, the
//! connection dropped) fills the gap itself once it is subscribed again:
//! the recent messages of every topic its sessions are attached to are
//! read back ([`Refill`]) and handed over like the fan-out's envelopes,
//! under the same identities, so each reaches a session once whichever way
//! it came ([`refill`]).
//!
//! On a Redis Cluster the bus is classic Pub/Sub: a `PUBLISH` on any node
//! reaches the subscribers of every node (the cluster bus forwards it), so
//! a gateway subscribes on one node of the cluster, the next one after an
//! error. Sharded Pub/Sub (`SSUBSCRIBE` per node channel) would spare the
//! cluster bus that fan-out, at the price of following slot moves; at a
//! gateway's envelope rate (one per node per message batch, never one per
//! member) classic Pub/Sub costs little, and a separate Redis for the bus
//! is not needed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::redis_util::Redis;
use futures::StreamExt;

use crate::metrics as m;
use crate::shutdown::Shutdown;

use super::envelope::{node_channel, Envelope, Kind, TargetType, BROADCAST_CHANNEL};
use crate::store::message::StoredMessage;

/// Reads a topic's newest stored messages (tenant, topic), newest first,
/// with the group's departures (uid → the seqs between which its messages
/// must not reach that user, see [`crate::group_model::excluded`]): what a
/// gateway hands its sessions again after a lost subscription.
pub type Refill =
    Arc<dyn Fn(String, String) -> futures::future::BoxFuture<'static, RefillPage> + Send + Sync>;

/// A topic's newest stored messages and who left it when.
pub type RefillPage = (Vec<StoredMessage>, HashMap<i64, (i64, Option<i64>)>);

/// After a lost subscription, the gap is filled now and again after these
/// delays (a message published while nobody listened may reach the hot copy
/// or the month table only a moment later).
const REFILL_AFTER: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_secs(3),
    Duration::from_secs(10),
];
/// Messages this long before the subscription was lost are filled too (the
/// loss is noticed late: the connection dies before the stream ends).
const REFILL_MARGIN_MS: i64 = 5_000;
use super::hub::{Frame, Hub, Outbound};

/// Recently seen event ids; the oldest are forgotten first.
pub struct SeenIds {
    order: VecDeque<String>,
    set: HashSet<String>,
    capacity: usize,
}

impl SeenIds {
    pub fn new(capacity: usize) -> Self {
        Self {
            order: VecDeque::with_capacity(capacity),
            set: HashSet::with_capacity(capacity),
            capacity,
        }
    }

    /// `true` the first time an id is seen.
    pub fn first_time(&mut self, id: &str) -> bool {
        if self.set.contains(id) {
            return false;
        }
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        self.order.push_back(id.to_string());
        self.set.insert(id.to_string());
        true
    }
}

/// Publishes an envelope to each node (or the broadcast channel when the
/// online-node index is missing). One round trip for all channels.
pub async fn publish(
    redis: &mut Redis,
    nodes: Option<&[String]>,
    envelope: &Envelope,
) -> redis::RedisResult<()> {
    let text = serde_json::to_string(envelope).unwrap_or_default();
    let mut pipe = redis::pipe();
    match nodes {
        Some(nodes) => {
            for n in nodes {
                pipe.publish(node_channel(n), &text).ignore();
            }
        }
        None => {
            pipe.publish(BROADCAST_CHANNEL, &text).ignore();
        }
    }
    pipe.query_async(redis).await
}

/// Detaches `uid`'s local sessions (every session when `None`) from
/// `topic` and tells each (`{ctrl 205 evicted}`, `{pres me gone}`); returns
/// how many there were.
pub fn evict(hub: &Hub, tenant: &str, topic: &str, uid: Option<i64>) -> usize {
    let evicted = hub.evict(tenant, topic, uid);
    let ctrl = Frame::from(super::frames::evicted_frame(topic));
    let gone = Frame::from(super::frames::pres_me_frame(topic, "gone"));
    for s in &evicted {
        s.offer(Outbound::Frame(ctrl.clone()));
        s.offer(Outbound::Frame(gone.clone()));
    }
    metrics::counter!(m::DELIVERIES_TOTAL).increment(evicted.len() as u64);
    evicted.len()
}

/// Delivers one envelope to local sessions; returns how many got it.
pub fn dispatch(
    hub: &Hub,
    tenants: &HashSet<String>,
    seen: &mut SeenIds,
    envelope: Envelope,
) -> usize {
    if !tenants.contains(&envelope.tenant_id) {
        metrics::counter!(m::ENVELOPES_TOTAL, "outcome" => "foreign_tenant").increment(1);
        return 0;
    }
    // A thing is delivered to a target once per identity (a message: its
    // tenant, topic and seq; else its event), even when its event reached
    // the log twice or the fan-out ran it again. Always per tenant and
    // target: one event goes to many targets, and an event id is only
    // unique within what its command names (issue 39).
    let identity = if envelope.dedup_key.is_empty() {
        format!(
            "{}:{:?}:{}:event:{}",
            envelope.tenant_id, envelope.target_type, envelope.target, envelope.event_id
        )
    } else {
        format!(
            "{}:{:?}:{}:{}",
            envelope.tenant_id, envelope.target_type, envelope.target, envelope.dedup_key
        )
    };
    if !seen.first_time(&identity) {
        metrics::counter!(m::ENVELOPES_TOTAL, "outcome" => "duplicate").increment(1);
        return 0;
    }
    metrics::counter!(m::ENVELOPES_TOTAL, "outcome" => "accepted").increment(1);
    let tenant = envelope.tenant_id.as_str();
    let out = match envelope.kind {
        Kind::Deliver => Outbound::Frame(Frame::from(envelope.payload)),
        Kind::Close => Outbound::Close(Arc::from(envelope.payload)),
        Kind::Evict => {
            let uid = envelope.payload.parse::<i64>().ok();
            return evict(hub, tenant, &envelope.target, uid);
        }
    };
    let delivered = match envelope.target_type {
        TargetType::Topic => match &out {
            Outbound::Frame(frame) => {
                // Removed members still attached here (their eviction is
                // on its way): skipped, and evicted now.
                for uid in &envelope.exclude {
                    evict(hub, tenant, &envelope.target, Some(*uid));
                }
                hub.to_topic(
                    tenant,
                    &envelope.target,
                    &envelope.skip_sid,
                    &envelope.exclude,
                    frame,
                )
            }
            Outbound::Close(_) => 0,
        },
        TargetType::User | TargetType::Device => {
            let (uid, device) = match envelope.target.split_once('/') {
                Some((u, d)) => (u, Some(d)),
                None => (envelope.target.as_str(), None),
            };
            let Ok(uid) = uid.parse::<i64>() else {
                return 0;
            };
            hub.user_sessions(tenant, uid, device, &envelope.skip_sid)
                .iter()
                .filter(|s| s.offer(out.clone()))
                .count()
        }
        TargetType::Watchers => match &out {
            Outbound::Frame(frame) => {
                hub.to_watchers_except(tenant, &envelope.target, frame, &envelope.exclude)
            }
            Outbound::Close(_) => 0,
        },
        TargetType::UserOutside => {
            let Some((uid, topic)) = envelope
                .target
                .split_once(':')
                .and_then(|(u, t)| Some((u.parse::<i64>().ok()?, t)))
            else {
                return 0;
            };
            hub.user_sessions_outside(tenant, uid, topic)
                .iter()
                .filter(|s| s.offer(out.clone()))
                .count()
        }
        TargetType::Session => hub
            .all_sessions()
            .iter()
            .filter(|s| &*s.tenant == tenant && *s.sid == *envelope.target)
            .filter(|s| s.offer(out.clone()))
            .count(),
    };
    if envelope.occurred_at > 0 && delivered > 0 {
        let ms = (crate::events::now_ms() - envelope.occurred_at).max(0);
        metrics::histogram!(m::DELIVERY_LATENCY).record(ms as f64 / 1000.0);
    }
    metrics::counter!(m::DELIVERIES_TOTAL).increment(delivered as u64);
    delivered
}

/// Subscribes to `node`'s channel and the broadcast channel until shutdown,
/// reconnecting after errors; after a lost subscription, fills the gap from
/// `refill` (see the module docs).
pub async fn run_subscriber(
    redis_url: String,
    node: String,
    hub: Hub,
    tenants: HashSet<String>,
    refill: Option<Refill>,
    shutdown: Shutdown,
) {
    let mut seen = SeenIds::new(20_000);
    let channels = [node_channel(&node), BROADCAST_CHANNEL.to_string()];
    // A cluster's nodes, tried in turn; one server's URL as it is.
    let urls = crate::redis_util::cluster_nodes(&redis_url).unwrap_or_else(|| vec![redis_url]);
    // When the subscription was lost (epoch ms), until its gap is filled.
    let mut lost_at: Option<i64> = None;
    for attempt in 0.. {
        if shutdown.is_triggered() {
            return;
        }
        let url = &urls[attempt % urls.len()];
        let bus = Bus {
            channels: &channels,
            hub: &hub,
            tenants: &tenants,
            refill: refill.as_ref(),
            shutdown: &shutdown,
        };
        match bus.subscribe_once(url, &mut seen, &mut lost_at).await {
            Ok(()) => return,
            Err(e) => {
                lost_at.get_or_insert_with(crate::events::now_ms);
                tracing::warn!(%node, error = %e, "realtime subscription lost; resubscribing");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}

/// What one subscription works with.
struct Bus<'a> {
    channels: &'a [String],
    hub: &'a Hub,
    tenants: &'a HashSet<String>,
    refill: Option<&'a Refill>,
    shutdown: &'a Shutdown,
}

impl Bus<'_> {
    /// Subscribes and hands envelopes over until the stream ends; with
    /// `lost_at`, fills the gap of an earlier lost subscription meanwhile
    /// (and forgets it once the last fill is done).
    async fn subscribe_once(
        &self,
        url: &str,
        seen: &mut SeenIds,
        lost_at: &mut Option<i64>,
    ) -> redis::RedisResult<()> {
        let (hub, tenants, shutdown) = (self.hub, self.tenants, self.shutdown);
        let client = redis::Client::open(url)?;
        let mut pubsub = client.get_async_pubsub().await?;
        for c in self.channels {
            pubsub.subscribe(c).await?;
        }
        tracing::info!(channels = ?self.channels, "realtime bus subscribed");
        let mut refills = match (*lost_at, self.refill) {
            (Some(_), Some(_)) => REFILL_AFTER.to_vec(),
            _ => Vec::new(),
        };
        let subscribed = tokio::time::Instant::now();
        let mut stream = pubsub.on_message();
        loop {
            let next_refill = refills.first().map(|d| subscribed + *d);
            let msg = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep_until(next_refill.unwrap_or(subscribed)), if next_refill.is_some() => {
                    refills.remove(0);
                    if let (Some(since), Some(read)) = (*lost_at, self.refill) {
                        let n = refill(hub, tenants, seen, read, since - REFILL_MARGIN_MS).await;
                        tracing::info!(handed_over = n, "realtime gap after a lost subscription filled from stored messages");
                    }
                    if refills.is_empty() {
                        *lost_at = None;
                    }
                    continue;
                }
                m = stream.next() => m,
            };
            let Some(msg) = msg else {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::IoError,
                    "pubsub stream ended",
                )));
            };
            let Ok(payload) = msg.get_payload::<String>() else {
                continue;
            };
            match serde_json::from_str::<Envelope>(&payload) {
                Ok(envelope) => {
                    dispatch(hub, tenants, seen, envelope);
                }
                Err(e) => tracing::warn!(error = %e, "malformed realtime envelope"),
            }
        }
    }
}

/// Hands the local sessions every stored message since `since` (epoch ms)
/// of each topic they are attached to, as the fan-out does (the same
/// identities: what they already got is not given twice). Returns how many
/// deliveries it made.
pub async fn refill(
    hub: &Hub,
    tenants: &HashSet<String>,
    seen: &mut SeenIds,
    read: &Refill,
    since: i64,
) -> usize {
    let (_, topics) = hub.snapshot();
    let mut delivered = 0;
    for (tenant, topic) in topics {
        let (page, departures) = read(tenant.clone(), topic.clone()).await;
        let mut messages: Vec<StoredMessage> = page.into_iter().filter(|m| m.ts >= since).collect();
        messages.sort_by_key(|m| m.seq);
        for m in &messages {
            // As the fan-out: never to a member removed before the message.
            let exclude = crate::group_model::excluded_users(m.seq, &departures);
            for mut envelope in message_envelopes(&tenant, &topic, m) {
                if envelope.target_type == TargetType::Topic {
                    envelope.exclude = exclude.clone();
                }
                delivered += dispatch(hub, tenants, seen, envelope);
            }
        }
    }
    delivered
}

/// A stored message as the fan-out's envelopes of its `MessageSent`: one to
/// the topic, or one to each user of a one-to-one topic (each sees the
/// other's id as the topic name).
pub(crate) fn message_envelopes(tenant: &str, topic: &str, m: &StoredMessage) -> Vec<Envelope> {
    let envelope = |target_type, target: String, shown: &str, dedup_key: String| Envelope {
        event_id: format!("refill:{dedup_key}"),
        tenant_id: tenant.to_string(),
        kind: Kind::Deliver,
        target_type,
        target,
        skip_sid: String::new(),
        dedup_key,
        occurred_at: m.ts,
        payload: super::frames::data_frame(shown, m),
        exclude: Vec::new(),
    };
    match crate::tinode::parse_p2p_topic(topic) {
        Some((a, b)) => [(a, b), (b, a)]
            .into_iter()
            .map(|(me, peer)| {
                envelope(
                    TargetType::User,
                    me.to_string(),
                    &crate::tinode::user_id(peer),
                    format!("msg:{topic}:{}:{me}", m.seq),
                )
            })
            .collect(),
        None => vec![envelope(
            TargetType::Topic,
            topic.to_string(),
            topic,
            format!("msg:{topic}:{}", m.seq),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_ids_forget_the_oldest() {
        let mut s = SeenIds::new(2);
        assert!(s.first_time("a"));
        assert!(!s.first_time("a"));
        assert!(s.first_time("b"));
        assert!(s.first_time("c"));
        assert!(s.first_time("a"), "a was evicted");
    }

    #[tokio::test]
    async fn dispatch_checks_tenant_dedups_and_skips_sender() {
        let hub = Hub::default();
        let (tx1, mut rx1) = tokio::sync::mpsc::channel(8);
        let (tx2, mut rx2) = tokio::sync::mpsc::channel(8);
        let handle = |sid: &str, device: &str, tx| super::super::hub::SessionHandle {
            sid: sid.into(),
            tenant: "a".into(),
            uid: 1,
            device: device.into(),
            auth_version: 0,
            generation: 0,
            tx,
            closing: crate::shutdown::Shutdown::new(),
        };
        let s1 = handle("s1", "d1", tx1);
        let s2 = handle("s2", "d2", tx2);
        for s in [&s1, &s2] {
            hub.add_session(s);
            hub.attach(s, "grpX");
        }
        let tenants: HashSet<String> = ["a".to_string()].into();
        let mut seen = SeenIds::new(16);
        let env = |id: &str, tenant: &str| Envelope {
            event_id: id.into(),
            tenant_id: tenant.into(),
            kind: Kind::Deliver,
            target_type: TargetType::Topic,
            target: "grpX".into(),
            skip_sid: "s1".into(),
            dedup_key: String::new(),
            occurred_at: 0,
            payload: "{\"data\":{}}".into(),
            exclude: Vec::new(),
        };
        assert_eq!(
            dispatch(&hub, &tenants, &mut seen, env("e1", "b")),
            0,
            "other tenant"
        );
        assert_eq!(
            dispatch(&hub, &tenants, &mut seen, env("e1", "a")),
            1,
            "sender's session skipped"
        );
        assert_eq!(
            dispatch(&hub, &tenants, &mut seen, env("e1", "a")),
            0,
            "duplicate dropped"
        );
        assert!(rx1.try_recv().is_err());
        assert!(matches!(rx2.try_recv(), Ok(Outbound::Frame(_))));
        // The same event id at another target is another delivery (one
        // event reaches many targets; ids are unique per command only).
        hub.attach(&s2, "grpY");
        let elsewhere = Envelope {
            target: "grpY".into(),
            ..env("e1", "a")
        };
        assert_eq!(dispatch(&hub, &tenants, &mut seen, elsewhere), 1);
        assert!(matches!(rx2.try_recv(), Ok(Outbound::Frame(_))));

        // The same message under another event id (its event reached the
        // log twice) is delivered once; the same seq of another tenant is
        // another message.
        let message = |id: &str| Envelope {
            dedup_key: "msg:grpX:7".into(),
            skip_sid: String::new(),
            ..env(id, "a")
        };
        assert_eq!(dispatch(&hub, &tenants, &mut seen, message("e2")), 2);
        assert_eq!(dispatch(&hub, &tenants, &mut seen, message("e3")), 0);
    }
}
