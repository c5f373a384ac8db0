//! A Redis Cluster connection that starts over when it stays broken.
//!
//! The cluster client keeps the slot map and one connection per node in a
//! background task, and refreshes the map on `MOVED` and on connection
//! errors. Under load through a failover (hundreds of commands in flight
//! while a primary dies and its replica is promoted) that task can stay
//! stuck on the dead node: every command times out for minutes although
//! the cluster answers again. So: when every command has failed for
//! [`STUCK_AFTER`] with no success between, a fresh connection is built
//! from the seed nodes (one at a time, at most every [`STUCK_AFTER`]) and
//! replaces the old one for every clone. Commands in flight on the old one
//! end with their error; callers retry, as they do for any Redis failure.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

/// How long every command must have failed before the connection is
/// rebuilt.
pub const STUCK_AFTER: Duration = Duration::from_secs(3);

/// A cluster connection, cheap to clone; clones share the connection and
/// its replacement.
#[derive(Clone)]
pub struct Cluster {
    shared: Arc<Shared>,
}

struct Shared {
    client: ClusterClient,
    conn: RwLock<ClusterConnection>,
    health: Mutex<Health>,
}

#[derive(Default)]
struct Health {
    /// When the first failure after the last success happened.
    failing_since: Option<Instant>,
    /// When a rebuild last began.
    rebuilt_at: Option<Instant>,
}

impl Cluster {
    pub async fn connect(client: ClusterClient) -> redis::RedisResult<Cluster> {
        let conn = client.get_async_connection().await?;
        Ok(Cluster {
            shared: Arc::new(Shared {
                client,
                conn: RwLock::new(conn),
                health: Mutex::new(Health::default()),
            }),
        })
    }

    /// The connection in use now.
    pub fn current(&self) -> ClusterConnection {
        self.shared.conn.read().expect("lock").clone()
    }

    /// Notes a command's outcome; rebuilds the connection when it has
    /// failed for [`STUCK_AFTER`].
    pub fn observe<T>(&self, outcome: &redis::RedisResult<T>) {
        let failing = match outcome {
            Ok(_) => false,
            Err(e) => broken(e),
        };
        let mut health = self.shared.health.lock().expect("lock");
        if !failing {
            // An answer, even an error reply: the connection works.
            health.failing_since = None;
            return;
        }
        let now = Instant::now();
        let since = *health.failing_since.get_or_insert(now);
        let due = now.duration_since(since) >= STUCK_AFTER
            && health
                .rebuilt_at
                .is_none_or(|at| now.duration_since(at) >= STUCK_AFTER);
        if !due {
            return;
        }
        health.rebuilt_at = Some(now);
        drop(health);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(STUCK_AFTER, shared.client.get_async_connection()).await {
                Ok(Ok(conn)) => {
                    *shared.conn.write().expect("lock") = conn;
                    metrics::counter!(crate::metrics::REDIS_RECONNECTS_TOTAL).increment(1);
                    tracing::warn!(
                        "Redis Cluster: every command failed for {STUCK_AFTER:?}; connected again from the seed nodes"
                    );
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "Redis Cluster: reconnecting failed"),
                Err(_) => tracing::warn!("Redis Cluster: reconnecting timed out"),
            }
        });
    }

    pub fn get_db(&self) -> i64 {
        self.current().get_db()
    }
}

/// Whether an error says the connection (not the command) is failing.
fn broken(e: &redis::RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::ClusterDown
        || e.kind() == redis::ErrorKind::MasterDown
        || e.kind() == redis::ErrorKind::Moved
}
