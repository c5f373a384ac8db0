//! Snowflake message ids: 41 bits of milliseconds since 2024-01-01 UTC,
//! 10 bits of worker id, 12 bits of sequence. The worker id is leased in
//! Redis, so two live processes never share one (a shared id could make two
//! messages collide on the month table's primary key).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::redis_util::Redis;

use crate::shutdown::Shutdown;

const EPOCH_MS: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z
const WORKER_BITS: u32 = 10;
const SEQ_BITS: u32 = 12;
const MAX_WORKER: u16 = (1 << WORKER_BITS) - 1;
const LEASE_MS: u64 = 30_000;

#[derive(Debug, thiserror::Error)]
pub enum SnowflakeError {
    #[error("no free snowflake worker id (all {} leased)", MAX_WORKER as u32 + 1)]
    Exhausted,
    #[error("snowflake worker lease lost; ids paused until it is renewed")]
    LeaseLost,
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

struct State {
    last_ms: i64,
    seq: u16,
}

/// A generator holding one leased worker id.
#[derive(Clone)]
pub struct Snowflake {
    worker: u16,
    state: Arc<Mutex<State>>,
    valid: Arc<AtomicBool>,
}

impl Snowflake {
    /// Generator with a fixed worker id (unit tests only).
    pub fn with_worker(worker: u16) -> Self {
        Self {
            worker: worker & MAX_WORKER,
            state: Arc::new(Mutex::new(State { last_ms: 0, seq: 0 })),
            valid: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Leases a free worker id in Redis and keeps renewing it until shutdown.
    pub async fn lease(redis: &mut Redis, shutdown: Shutdown) -> Result<Self, SnowflakeError> {
        let token = uuid::Uuid::new_v4().to_string();
        let start = rand::random::<u16>() & MAX_WORKER;
        for i in 0..=MAX_WORKER {
            let worker = (start + i) & MAX_WORKER;
            let got: Option<String> = redis::cmd("SET")
                .arg(crate::keys::snowflake_worker(worker))
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(LEASE_MS)
                .query_async(redis)
                .await?;
            if got.is_some() {
                let gen = Self::with_worker(worker);
                gen.spawn_renewal(redis.clone(), token, shutdown);
                return Ok(gen);
            }
        }
        Err(SnowflakeError::Exhausted)
    }

    fn spawn_renewal(&self, mut redis: Redis, token: String, shutdown: Shutdown) {
        let key = crate::keys::snowflake_worker(self.worker);
        let valid = self.valid.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        let _: redis::RedisResult<i64> = redis::Script::new(include_str!("../lua/release_lock.lua"))
                            .key(&key).arg(&token).invoke_async(&mut redis).await;
                        return;
                    }
                    _ = tokio::time::sleep(Duration::from_millis(LEASE_MS / 3)) => {}
                }
                // Renew only if still ours; otherwise stop issuing ids.
                let renewed: redis::RedisResult<Option<String>> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&token)
                    .arg("XX")
                    .arg("PX")
                    .arg(LEASE_MS)
                    .arg("GET")
                    .query_async(&mut redis)
                    .await;
                match renewed {
                    Ok(Some(prev)) if prev == token => valid.store(true, Ordering::Release),
                    Ok(None) => {
                        // Expired (Redis restarted or flushed): take it back if free.
                        let again: redis::RedisResult<Option<String>> = redis::cmd("SET")
                            .arg(&key)
                            .arg(&token)
                            .arg("NX")
                            .arg("PX")
                            .arg(LEASE_MS)
                            .query_async(&mut redis)
                            .await;
                        valid.store(matches!(again, Ok(Some(_))), Ordering::Release);
                    }
                    Ok(Some(_)) => {
                        tracing::error!(%key, "snowflake worker lease taken by another process");
                        valid.store(false, Ordering::Release);
                    }
                    Err(e) => tracing::warn!(error = %e, "snowflake lease renewal failed"),
                }
            }
        });
    }

    pub fn worker(&self) -> u16 {
        self.worker
    }

    /// The next id, unique across every process holding a lease.
    pub fn next_id(&self) -> Result<i64, SnowflakeError> {
        if !self.valid.load(Ordering::Acquire) {
            return Err(SnowflakeError::LeaseLost);
        }
        let mut s = self.state.lock().expect("snowflake lock");
        let mut now = chrono::Utc::now().timestamp_millis() - EPOCH_MS;
        if now < s.last_ms {
            // The clock went back: keep counting from the last instant.
            now = s.last_ms;
        }
        if now == s.last_ms {
            s.seq = (s.seq + 1) & ((1 << SEQ_BITS) - 1);
            if s.seq == 0 {
                now = s.last_ms + 1; // borrow the next millisecond
            }
        } else {
            s.seq = 0;
        }
        s.last_ms = now;
        Ok((now << (WORKER_BITS + SEQ_BITS)) | ((self.worker as i64) << SEQ_BITS) | s.seq as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_increasing() {
        let g = Snowflake::with_worker(7);
        let mut last = 0;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50_000 {
            let id = g.next_id().unwrap();
            assert!(id > last);
            assert!(seen.insert(id));
            assert_eq!((id >> SEQ_BITS) & MAX_WORKER as i64, 7);
            last = id;
        }
    }

    #[test]
    fn workers_never_collide() {
        let a = Snowflake::with_worker(1);
        let b = Snowflake::with_worker(2);
        let ids: std::collections::HashSet<i64> = (0..1000)
            .flat_map(|_| [a.next_id().unwrap(), b.next_id().unwrap()])
            .collect();
        assert_eq!(ids.len(), 2000);
    }
}
