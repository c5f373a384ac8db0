//! Events decoded once per process. Nine pipelines read the group-events
//! topic; in one process (`imstream dev`, or several pipelines deployed
//! together) each decoded every record again. The first decode of a
//! record's bytes is kept here, bounded, and the others clone it.
//!
//! Keyed by the record's bytes (compared in full on a hit, not only
//! hashed), so a hit is the same decode by construction: the bytes name
//! the writer schema's id, which a registry never reuses, and the event
//! type fixes the reader. Kafka positions are not part of the key: a topic
//! deleted and created again reuses offsets, never meaning.
//!
//! Off unless more than one pipeline of the process share a source
//! ([`share`]): a process with one consumer would only pay for it.

use std::any::{Any, TypeId};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

/// Records kept: at 1,000 events/s, the last four seconds, which covers
/// pipelines that keep up with each other; one further behind decodes
/// again.
const CAPACITY: usize = 4096;

/// Consumers in this process, by source topic.
static SHARERS: LazyLock<Mutex<HashMap<String, usize>>> = LazyLock::new(Mutex::default);
/// Consumers of the busiest source: the cache is on from two.
static MOST_SHARED: AtomicUsize = AtomicUsize::new(0);

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(Mutex::default);

/// A pipeline of this process consumes `source` for its life: with a
/// second consumer of the same source, decodes are shared.
pub fn share(source: &str) {
    let mut sharers = SHARERS.lock().expect("decoded lock");
    let n = sharers.entry(source.to_string()).or_default();
    *n += 1;
    MOST_SHARED.fetch_max(*n, Ordering::Relaxed);
}

fn enabled() -> bool {
    MOST_SHARED.load(Ordering::Relaxed) >= 2
}

type Key = (TypeId, u64);

struct Entry {
    bytes: Box<[u8]>,
    value: Arc<dyn Any + Send + Sync>,
}

#[derive(Default)]
struct Cache {
    entries: HashMap<Key, Entry>,
    /// Insertion order, for eviction.
    order: VecDeque<Key>,
}

fn key<E: 'static>(bytes: &[u8]) -> Key {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    (TypeId::of::<E>(), h.finish())
}

/// The event already decoded from exactly these bytes, if kept.
pub fn get<E: Clone + Send + Sync + 'static>(bytes: &[u8]) -> Option<E> {
    if !enabled() {
        return None;
    }
    let cache = CACHE.lock().expect("decoded lock");
    let entry = cache.entries.get(&key::<E>(bytes))?;
    if *entry.bytes != *bytes {
        return None;
    }
    entry.value.downcast_ref::<E>().cloned()
}

/// Keeps `event`, decoded from `bytes`, for the other pipelines.
pub fn put<E: Clone + Send + Sync + 'static>(bytes: &[u8], event: &E) {
    if !enabled() {
        return;
    }
    let k = key::<E>(bytes);
    let mut cache = CACHE.lock().expect("decoded lock");
    if cache.entries.contains_key(&k) {
        return;
    }
    while cache.order.len() >= CAPACITY {
        if let Some(old) = cache.order.pop_front() {
            cache.entries.remove(&old);
        }
    }
    cache.entries.insert(
        k,
        Entry {
            bytes: bytes.into(),
            value: Arc::new(event.clone()),
        },
    );
    cache.order.push_back(k);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    struct A(String);
    #[derive(Clone, Debug, PartialEq)]
    struct B(String);

    #[test]
    fn kept_only_when_shared_and_only_for_the_same_bytes_and_type() {
        // One consumer: nothing is kept.
        put(b"one-consumer", &A("x".into()));
        share("test-source");
        assert_eq!(get::<A>(b"one-consumer"), None);
        share("test-source");
        put(b"\x00\x00\x00\x00\x07abc", &A("abc".into()));
        assert_eq!(get::<A>(b"\x00\x00\x00\x00\x07abc"), Some(A("abc".into())));
        // Another type decoded from the same bytes is its own entry.
        assert_eq!(get::<B>(b"\x00\x00\x00\x00\x07abc"), None);
        // Other bytes: a miss.
        assert_eq!(get::<A>(b"\x00\x00\x00\x00\x07abd"), None);
        // Bounded: the oldest go first.
        for i in 0..CAPACITY {
            put(format!("filler-{i}").as_bytes(), &A(i.to_string()));
        }
        assert_eq!(get::<A>(b"\x00\x00\x00\x00\x07abc"), None);
        assert_eq!(
            get::<A>(format!("filler-{}", CAPACITY - 1).as_bytes()),
            Some(A((CAPACITY - 1).to_string()))
        );
        assert!(CACHE.lock().unwrap().entries.len() <= CAPACITY);
    }
}
