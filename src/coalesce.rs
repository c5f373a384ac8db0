//! Request coalescing: identical concurrent reads (the herd after a big
//! group reconnects) share one in-flight fetch; later callers get a clone
//! of its result. The entry is removed when the leader finishes *or is
//! dropped* (a client that hung up), so a result is never served after its
//! fetch is over.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};

type InFlight<V> = Shared<BoxFuture<'static, V>>;

#[derive(Clone)]
pub struct Coalescer<K, V: Clone> {
    inflight: Arc<Mutex<HashMap<K, InFlight<V>>>>,
}

impl<K, V: Clone> Default for Coalescer<K, V> {
    fn default() -> Self {
        Self {
            inflight: Arc::new(Mutex::new(HashMap::new())),
        }
    }
}

impl<K, V> Coalescer<K, V>
where
    K: Eq + Hash + Clone + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// Runs `fetch` unless an identical call is in flight, then shares its result.
    pub async fn run(&self, key: K, fetch: impl Future<Output = V> + Send + 'static) -> V {
        let (shared, _leader) = {
            let mut map = self.inflight.lock().expect("coalescer lock");
            match map.get(&key) {
                Some(f) => (f.clone(), None),
                None => {
                    let f = fetch.boxed().shared();
                    map.insert(key.clone(), f.clone());
                    let guard = LeaderGuard {
                        inflight: self.inflight.clone(),
                        key: Some(key),
                    };
                    (f, Some(guard))
                }
            }
        };
        // Followers still holding `shared` can drive it to completion even
        // when the leader is dropped mid-flight.
        shared.await
    }
}

/// Removes the leader's entry when the leader completes or is cancelled;
/// otherwise a cancelled leader would leave its (eventually finished) fetch
/// in the map and every later identical read would get that old result.
struct LeaderGuard<K: Eq + Hash, V: Clone> {
    inflight: Arc<Mutex<HashMap<K, InFlight<V>>>>,
    key: Option<K>,
}

impl<K: Eq + Hash, V: Clone> Drop for LeaderGuard<K, V> {
    fn drop(&mut self) {
        if let (Some(key), Ok(mut map)) = (self.key.take(), self.inflight.lock()) {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_identical_calls_share_one_fetch() {
        let c: Coalescer<&'static str, usize> = Coalescer::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for _ in 0..100 {
            let (c, calls) = (c.clone(), calls.clone());
            handles.push(tokio::spawn(async move {
                c.run("k", async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    7
                })
                .await
            }));
        }
        for h in handles {
            assert_eq!(h.await.unwrap(), 7);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Once done, a new call fetches again.
        let calls2 = calls.clone();
        c.run("k", async move {
            calls2.fetch_add(1, Ordering::SeqCst);
            8
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_cancelled_leader_does_not_pin_its_result() {
        let c: Coalescer<&'static str, usize> = Coalescer::default();
        let leader = c.run("k", async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            1
        });
        // Poll the leader once (it registers), then drop it mid-flight.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(1), leader)
                .await
                .is_err()
        );
        assert_eq!(c.run("k", async { 2 }).await, 2);
        assert_eq!(c.run("k", async { 3 }).await, 3);
    }
}
