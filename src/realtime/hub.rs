//! The gateway's local sessions, indexed by attached topic and by user, so
//! an envelope reaches its sessions without scanning. Delivery never
//! blocks: a full session queue drops the frame (counted), and the client
//! catches up by seq.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::metrics as m;
use crate::shutdown::Shutdown;

/// An encoded text frame: built once per event and shared by every session
/// that receives it (cloning is a reference count; the socket writes the
/// same bytes for each, never a copy).
pub type Frame = axum::extract::ws::Utf8Bytes;

/// What a session's writer task receives.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A text frame; shared by every session that gets the same message.
    Frame(Frame),
    /// Close the connection with this reason.
    Close(Arc<str>),
}

/// A local session as the hub sees it.
#[derive(Clone)]
pub struct SessionHandle {
    pub sid: Arc<str>,
    pub tenant: Arc<str>,
    pub uid: i64,
    pub device: Arc<str>,
    /// auth_version of the token the session logged in with.
    pub auth_version: i64,
    /// Revocation generation of its device the session's token was issued
    /// under; a device revocation raising it closes the session.
    pub generation: i64,
    pub tx: mpsc::Sender<Outbound>,
    /// Triggered when the session must close. The session then gives its
    /// writer a short grace to deliver what is queued and the final ctrl,
    /// and drops the connection regardless (a client that stopped reading
    /// has a full queue and a blocked writer).
    pub closing: Shutdown,
}

impl SessionHandle {
    /// Queues without waiting; `false` when the queue is full or closed.
    /// A close never depends on room in the queue: it also triggers
    /// `closing`, so it takes effect even when the frame cannot be queued.
    pub fn offer(&self, out: Outbound) -> bool {
        if matches!(out, Outbound::Close(_)) {
            let _ = self.tx.try_send(out);
            self.closing.trigger();
            return true;
        }
        match self.tx.try_send(out) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Never a silent gap: a session that cannot take what its
                // topics deliver is closed; its client reconnects and
                // catches up by seq.
                metrics::counter!(m::DELIVERY_DROPPED_TOTAL).increment(1);
                if !self.closing.is_triggered() {
                    tracing::warn!(sid = %self.sid, uid = self.uid, "session too slow for its deliveries; closing it");
                    self.closing.trigger();
                }
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

type TopicKey = (Arc<str>, Arc<str>);
type UserKey = (Arc<str>, i64);

#[derive(Default)]
struct Index {
    by_topic: HashMap<TopicKey, HashMap<Arc<str>, SessionHandle>>,
    by_user: HashMap<UserKey, HashMap<Arc<str>, SessionHandle>>,
    /// Sessions subscribed to `me`, by the topics of their chat list.
    watchers: HashMap<TopicKey, HashMap<Arc<str>, SessionHandle>>,
    /// The watched topics of each such session (to forget them).
    watched: HashMap<Arc<str>, Vec<TopicKey>>,
}

impl Index {
    fn unwatch(&mut self, sid: &str) {
        for key in self.watched.remove(sid).unwrap_or_default() {
            if let Some(sessions) = self.watchers.get_mut(&key) {
                sessions.remove(sid);
                if sessions.is_empty() {
                    self.watchers.remove(&key);
                }
            }
        }
    }
}

/// Local sessions of one gateway.
#[derive(Clone, Default)]
pub struct Hub {
    index: Arc<Mutex<Index>>,
}

impl Hub {
    pub fn add_session(&self, s: &SessionHandle) {
        let mut idx = self.index.lock().expect("hub lock");
        idx.by_user
            .entry((s.tenant.clone(), s.uid))
            .or_default()
            .insert(s.sid.clone(), s.clone());
    }

    pub fn remove_session(&self, s: &SessionHandle) {
        let mut idx = self.index.lock().expect("hub lock");
        idx.unwatch(&s.sid);
        let key = (s.tenant.clone(), s.uid);
        if let Some(map) = idx.by_user.get_mut(&key) {
            map.remove(&s.sid);
            if map.is_empty() {
                idx.by_user.remove(&key);
            }
        }
    }

    pub fn attach(&self, s: &SessionHandle, topic: &str) {
        let mut idx = self.index.lock().expect("hub lock");
        idx.by_topic
            .entry((s.tenant.clone(), Arc::from(topic)))
            .or_default()
            .insert(s.sid.clone(), s.clone());
    }

    /// Detaches; returns whether another session of the same user on this
    /// node is still attached to the topic.
    pub fn detach(&self, s: &SessionHandle, topic: &str) -> bool {
        let mut idx = self.index.lock().expect("hub lock");
        let key: TopicKey = (s.tenant.clone(), Arc::from(topic));
        let mut still = false;
        if let Some(map) = idx.by_topic.get_mut(&key) {
            map.remove(&s.sid);
            still = map.values().any(|o| o.uid == s.uid);
            if map.is_empty() {
                idx.by_topic.remove(&key);
            }
        }
        still
    }

    /// Detaches `uid`'s sessions (every session when `None`) from the
    /// topic, so nothing more of it reaches them; returns them.
    pub fn evict(&self, tenant: &str, topic: &str, uid: Option<i64>) -> Vec<SessionHandle> {
        let mut idx = self.index.lock().expect("hub lock");
        let key: TopicKey = (Arc::from(tenant), Arc::from(topic));
        // Their chat lists no longer hear of the topic either.
        if let Some(watchers) = idx.watchers.get_mut(&key) {
            watchers.retain(|_, s| uid.is_some_and(|u| s.uid != u));
            if watchers.is_empty() {
                idx.watchers.remove(&key);
            }
        }
        let Some(map) = idx.by_topic.get_mut(&key) else {
            return Vec::new();
        };
        let gone: Vec<Arc<str>> = map
            .values()
            .filter(|s| uid.is_none_or(|u| s.uid == u))
            .map(|s| s.sid.clone())
            .collect();
        let out = gone.iter().filter_map(|sid| map.remove(sid)).collect();
        if map.is_empty() {
            idx.by_topic.remove(&key);
        }
        out
    }

    /// Session `s` (subscribed to `me`) watches these topics of its chat
    /// list: `{pres topic="me"}` of each reaches it while it is not
    /// attached to the topic.
    pub fn watch(&self, s: &SessionHandle, topics: &[String]) {
        let mut idx = self.index.lock().expect("hub lock");
        for topic in topics {
            let key: TopicKey = (s.tenant.clone(), Arc::from(topic.as_str()));
            let sessions = idx.watchers.entry(key.clone()).or_default();
            if sessions.insert(s.sid.clone(), s.clone()).is_none() {
                idx.watched.entry(s.sid.clone()).or_default().push(key);
            }
        }
    }

    /// Session `sid` no longer watches anything (it left `me`).
    pub fn unwatch_all(&self, sid: &str) {
        self.index.lock().expect("hub lock").unwatch(sid);
    }

    /// Queues `frame` for the watchers of `topic` that are not attached to
    /// it; returns how many got it.
    pub fn to_watchers(&self, tenant: &str, topic: &str, frame: &Frame) -> usize {
        self.to_watchers_except(tenant, topic, frame, &[])
    }

    /// [`to_watchers`](Self::to_watchers) but not to users in `exclude`.
    pub fn to_watchers_except(
        &self,
        tenant: &str,
        topic: &str,
        frame: &Frame,
        exclude: &[i64],
    ) -> usize {
        let targets: Vec<SessionHandle> = {
            let idx = self.index.lock().expect("hub lock");
            let key: TopicKey = (Arc::from(tenant), Arc::from(topic));
            let Some(watchers) = idx.watchers.get(&key) else {
                return 0;
            };
            let attached = idx.by_topic.get(&key);
            watchers
                .values()
                .filter(|s| attached.is_none_or(|a| !a.contains_key(&s.sid)))
                .filter(|s| !exclude.contains(&s.uid))
                .cloned()
                .collect()
        };
        targets
            .iter()
            .filter(|s| s.offer(Outbound::Frame(frame.clone())))
            .count()
    }

    /// Sessions of `uid` that are not attached to `topic`.
    pub fn user_sessions_outside(&self, tenant: &str, uid: i64, topic: &str) -> Vec<SessionHandle> {
        let idx = self.index.lock().expect("hub lock");
        let attached = idx.by_topic.get(&(Arc::from(tenant), Arc::from(topic)));
        idx.by_user
            .get(&(Arc::from(tenant), uid))
            .map(|map| {
                map.values()
                    .filter(|s| attached.is_none_or(|a| !a.contains_key(&s.sid)))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether session `sid` is attached to the topic here (an evicted
    /// session is not, whatever it thinks).
    pub fn is_attached(&self, tenant: &str, topic: &str, sid: &str) -> bool {
        let idx = self.index.lock().expect("hub lock");
        idx.by_topic
            .get(&(Arc::from(tenant), Arc::from(topic)))
            .is_some_and(|m| m.contains_key(sid))
    }

    /// Queues `frame` for every session attached to the topic except
    /// `skip_sid`; returns how many got it.
    /// Sessions attached to `topic`, except `skip_sid` and the sessions of
    /// users in `exclude` (removed before the frame's message was sent).
    pub fn to_topic(
        &self,
        tenant: &str,
        topic: &str,
        skip_sid: &str,
        exclude: &[i64],
        frame: &Frame,
    ) -> usize {
        let targets: Vec<SessionHandle> = {
            let idx = self.index.lock().expect("hub lock");
            match idx.by_topic.get(&(Arc::from(tenant), Arc::from(topic))) {
                Some(map) => map
                    .values()
                    .filter(|s| &*s.sid != skip_sid && !exclude.contains(&s.uid))
                    .cloned()
                    .collect(),
                None => return 0,
            }
        };
        targets
            .iter()
            .filter(|s| s.offer(Outbound::Frame(frame.clone())))
            .count()
    }

    /// Sessions of a user (optionally one device), except `skip_sid`.
    pub fn user_sessions(
        &self,
        tenant: &str,
        uid: i64,
        device: Option<&str>,
        skip_sid: &str,
    ) -> Vec<SessionHandle> {
        let idx = self.index.lock().expect("hub lock");
        idx.by_user
            .get(&(Arc::from(tenant), uid))
            .map(|map| {
                map.values()
                    .filter(|s| &*s.sid != skip_sid && device.is_none_or(|d| &*s.device == d))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// (tenant, uid) of every local session, and (tenant, topic) of every
    /// attachment, for the presence heartbeat.
    pub fn snapshot(&self) -> (Vec<(String, i64)>, Vec<(String, String)>) {
        let idx = self.index.lock().expect("hub lock");
        (
            idx.by_user
                .keys()
                .map(|(t, u)| (t.to_string(), *u))
                .collect(),
            idx.by_topic
                .keys()
                .map(|(t, x)| (t.to_string(), x.to_string()))
                .collect(),
        )
    }

    /// (tenant, topic, uid) of every attachment of a local session, once
    /// each (for the heartbeat's membership re-check).
    pub fn attached_members(&self) -> Vec<(Arc<str>, Arc<str>, i64)> {
        let idx = self.index.lock().expect("hub lock");
        let mut out: Vec<(Arc<str>, Arc<str>, i64)> = idx
            .by_topic
            .iter()
            .flat_map(|((tenant, topic), m)| {
                m.values()
                    .map(move |s| (tenant.clone(), topic.clone(), s.uid))
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every local session (for control re-checks).
    pub fn all_sessions(&self) -> Vec<SessionHandle> {
        let idx = self.index.lock().expect("hub lock");
        idx.by_user
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    pub fn session_count(&self) -> usize {
        self.index
            .lock()
            .expect("hub lock")
            .by_user
            .values()
            .map(HashMap::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(tx: mpsc::Sender<Outbound>) -> SessionHandle {
        SessionHandle {
            sid: "s".into(),
            tenant: "t".into(),
            uid: 1,
            device: "d".into(),
            auth_version: 0,
            generation: 0,
            tx,
            closing: Shutdown::new(),
        }
    }

    #[test]
    fn a_close_takes_effect_even_when_the_queue_is_full() {
        let (tx, _rx) = mpsc::channel(1);
        let s = session(tx);
        assert!(s.offer(Outbound::Frame("a".into())));
        assert!(!s.closing.is_triggered());
        assert!(s.offer(Outbound::Close("device revoked".into())));
        assert!(
            s.closing.is_triggered(),
            "a close that cannot be queued still closes"
        );
    }

    #[test]
    fn a_session_that_cannot_take_a_frame_is_closed_not_left_with_a_gap() {
        let (tx, _rx) = mpsc::channel(1);
        let s = session(tx);
        assert!(s.offer(Outbound::Frame("a".into())));
        assert!(!s.closing.is_triggered());
        assert!(!s.offer(Outbound::Frame("b".into())), "full");
        assert!(s.closing.is_triggered(), "the session closes");
    }

    #[test]
    fn chat_list_updates_reach_watchers_outside_the_topic_until_they_are_removed() {
        let hub = Hub::default();
        let (tx_a, mut rx_a) = mpsc::channel(8);
        let (tx_b, mut rx_b) = mpsc::channel(8);
        let a = SessionHandle {
            sid: "a".into(),
            ..session(tx_a)
        };
        let b = SessionHandle {
            sid: "b".into(),
            uid: 2,
            ..session(tx_b)
        };
        for s in [&a, &b] {
            hub.add_session(s);
            hub.watch(s, &["grpX".to_string()]);
        }
        hub.attach(&b, "grpX");
        let frame = Frame::from("pres");
        assert_eq!(
            hub.to_watchers("t", "grpX", &frame),
            1,
            "b is attached: it gets the data, not the pres"
        );
        assert!(rx_a.try_recv().is_ok());
        assert!(rx_b.try_recv().is_err());
        assert_eq!(hub.to_watchers("t", "grpY", &frame), 0, "nobody lists grpY");
        assert_eq!(
            hub.to_watchers("u", "grpX", &frame),
            0,
            "another tenant's grpX"
        );
        // A removed member's list hears no more of the topic.
        hub.evict("t", "grpX", Some(1));
        assert_eq!(hub.to_watchers("t", "grpX", &frame), 0);
        // A closed session is forgotten.
        hub.detach(&b, "grpX");
        hub.watch(&b, &["grpX".to_string()]);
        hub.remove_session(&b);
        assert_eq!(hub.to_watchers("t", "grpX", &frame), 0);
    }
}
