//! The realtime bus over Redis Pub/Sub: each gateway subscribes to its node
//! channel and the broadcast channel, drops loops and duplicates (event id
//! LRU), checks the tenant, and hands envelopes to its local sessions.
//! Pub/Sub only delays or loses realtime copies; every message has a
//! durable source of truth the client catches up from by seq.
//!
//! On a Redis Cluster the bus is classic Pub/Sub: a `PUBLISH` on any node
//! reaches the subscribers of every node (the cluster bus forwards it), so
//! a gateway subscribes on one node of the cluster, the next one after an
//! error. Sharded Pub/Sub (`SSUBSCRIBE` per node channel) would spare the
//! cluster bus that fan-out, at the price of following slot moves; at a
//! gateway's envelope rate (one per node per message batch, never one per
//! member) classic Pub/Sub costs little, and a separate Redis for the bus
//! is not needed.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::redis_util::Redis;
use futures::StreamExt;

use crate::metrics as m;
use crate::shutdown::Shutdown;

use super::envelope::{node_channel, Envelope, Kind, TargetType, BROADCAST_CHANNEL};
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
    // tenant, topic and seq), even when its event reached the log twice or
    // the fan-out ran it again.
    let identity = if envelope.dedup_key.is_empty() {
        envelope.event_id.clone()
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
/// reconnecting after errors.
pub async fn run_subscriber(
    redis_url: String,
    node: String,
    hub: Hub,
    tenants: HashSet<String>,
    shutdown: Shutdown,
) {
    let mut seen = SeenIds::new(20_000);
    let channels = [node_channel(&node), BROADCAST_CHANNEL.to_string()];
    // A cluster's nodes, tried in turn; one server's URL as it is.
    let urls = crate::redis_util::cluster_nodes(&redis_url).unwrap_or_else(|| vec![redis_url]);
    for attempt in 0.. {
        if shutdown.is_triggered() {
            return;
        }
        let url = &urls[attempt % urls.len()];
        match subscribe_once(url, &channels, &hub, &tenants, &mut seen, &shutdown).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(%node, error = %e, "realtime subscription lost; resubscribing");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}

async fn subscribe_once(
    url: &str,
    channels: &[String],
    hub: &Hub,
    tenants: &HashSet<String>,
    seen: &mut SeenIds,
    shutdown: &Shutdown,
) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let mut pubsub = client.get_async_pubsub().await?;
    for c in channels {
        pubsub.subscribe(c).await?;
    }
    tracing::info!(?channels, "realtime bus subscribed");
    let mut stream = pubsub.on_message();
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
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
