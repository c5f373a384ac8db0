//! Read replicas of tenant servers (seed 003 §11.1: history reads may go to
//! a replica). A tenant with `mysql_read_url` gets a replica pool beside
//! its primary; a gateway measures each replica's lag with a heartbeat
//! (the time written on the primary, read back from the replica) every
//! `mysql.replica_heartbeat_ms`, and history pages read from the replica
//! only while that lag is within `mysql.replica_max_lag_ms`. A replica that
//! stops, falls behind or cannot be reached is skipped until it catches up:
//! its reads go to the primary. A process that measures nothing (a
//! pipeline, a command) never reads from a replica.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::MySqlPool;

use crate::events::now_ms;
use crate::metrics as m;
use crate::shutdown::Shutdown;

/// One tenant's read replica and whether it may be read now.
#[derive(Clone)]
pub struct Replica {
    pub pool: MySqlPool,
    /// Set by the lag probe; false until the first measurement says the
    /// replica is close enough.
    fresh: Arc<AtomicBool>,
}

impl Replica {
    pub fn new(pool: MySqlPool) -> Self {
        Self {
            pool,
            fresh: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether the last measurement found the replica within the bound.
    pub fn fresh(&self) -> bool {
        self.fresh.load(Ordering::Relaxed)
    }
}

/// One lag measurement: writes the time on the primary, reads the newest
/// time the replica holds; the lag in ms (`None`: the replica did not
/// answer or holds no beat yet).
pub async fn measure(primary: &MySqlPool, replica: &MySqlPool) -> Option<i64> {
    let beat = now_ms();
    if let Err(e) = sqlx::query(
        "INSERT INTO im_replica_heartbeat (id, beat_ms) VALUES (1, ?) \
         ON DUPLICATE KEY UPDATE beat_ms = GREATEST(beat_ms, VALUES(beat_ms))",
    )
    .bind(beat)
    .execute(primary)
    .await
    {
        // The primary's outage says nothing about the replica; the beat it
        // already holds still measures it.
        tracing::debug!(error = %e, "replica heartbeat not written");
    }
    let seen: Option<i64> =
        match sqlx::query_scalar("SELECT beat_ms FROM im_replica_heartbeat WHERE id = 1")
            .fetch_optional(replica)
            .await
        {
            Ok(seen) => seen,
            Err(e) => {
                tracing::debug!(error = %e, "replica heartbeat not read");
                return None;
            }
        };
    seen.map(|s| (now_ms() - s).max(0))
}

/// Measures `replica` against `primary` until `shutdown`, keeping its
/// freshness and the lag gauge current.
pub async fn watch(
    tenant: String,
    primary: MySqlPool,
    replica: Replica,
    every: Duration,
    max_lag_ms: u64,
    shutdown: Shutdown,
) {
    let mut was_fresh = false;
    metrics::gauge!(m::MYSQL_REPLICA_MAX_LAG, "tenant" => tenant.clone())
        .set(max_lag_ms as f64 / 1000.0);
    loop {
        let lag = measure(&primary, &replica.pool).await;
        let fresh = lag.is_some_and(|l| l <= max_lag_ms as i64);
        replica.fresh.store(fresh, Ordering::Relaxed);
        metrics::gauge!(m::MYSQL_REPLICA_LAG, "tenant" => tenant.clone())
            .set(lag.map_or(f64::INFINITY, |l| l as f64 / 1000.0));
        if fresh != was_fresh {
            match lag {
                Some(l) if fresh => tracing::info!(%tenant, lag_ms = l, "read replica in use"),
                Some(l) => {
                    tracing::warn!(%tenant, lag_ms = l, max_lag_ms, "read replica behind; reading the primary")
                }
                None => tracing::warn!(%tenant, "read replica unreachable; reading the primary"),
            }
            was_fresh = fresh;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
