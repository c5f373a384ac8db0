//! After Redis forgets (issue 38, ARCHITECTURE.md §3b): a Redis that
//! restarted, failed over to a replica, came back from an older copy or lost
//! every key is another incarnation (another `run_id`), and the write-side
//! state it holds — seq allocators, group models, client message id claims —
//! is older than what was acknowledged, or gone. Each request that meets
//! such state restores it for its own conversation at once (`send::marks`,
//! `group_model::restore`: one MySQL statement or transaction, no waiting,
//! no log). This module restores every conversation of a tenant in one
//! pass, so the next send of each finds it live:
//!
//! 1. the client message id claims of the messages in the log the store
//!    pipeline has not committed, in one pass over every partition (stored
//!    messages keep theirs in the store's dedup rows, looked up per send);
//! 2. the tenant's restore marker names the incarnation and when the pass
//!    began, written only while the pass still holds its lock (a FLUSHALL
//!    or restart during the pass takes the lock, and the next pass runs):
//!    sends that need the claims of step 1 wait for it, a few seconds;
//! 3. every seq allocator from its durable mark, a page of topics per two
//!    MySQL statements (`store::marks::reserve_many`);
//! 4. every group model from its durable copy, a page per transaction
//!    (stamped when Redis still holds the very version, installed else).
//!
//! Steps 3 and 4 only spare the first send of each conversation its own
//! restore; then `restore_done` names the incarnation. A topic restored
//! (its state missing or written by another incarnation) before that lost
//! it with the whole tenant (a restart, a failover, a flush): this pass's
//! marker covers its claims. One restored after it lost its state alone
//! (the pass stamped every topic it knew), and asks for a pass begun after
//! it was restored.
//!
//! Every gateway watches the incarnation each second ([`Recovery::watch`]);
//! one process restores a tenant (a lock, renewed while it runs), the
//! others see the marker. Restoring twice changes nothing.

use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::config::Config;
use crate::events::EventCodec;
use crate::group_model::GroupModel;
use crate::keys::{TenantKeys, TopicKeys, CLAIM_TTL_MS};
use crate::metrics as m;
use crate::redis_util::{incarnation, Redis, RedisLock};
use crate::shutdown::Shutdown;
use crate::store::marks;
use crate::tenant::TenantPools;

/// Topics per page of a bulk restore.
const PAGE: usize = 500;
/// Redis calls in flight at once during a bulk restore.
const IN_FLIGHT: usize = 64;
/// The restore lock's lease (renewed while a restore runs).
const LOCK_MS: u64 = 30_000;

/// What one tenant's restore did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub tenant: String,
    /// Seq allocators restored (not live before).
    pub seqs: usize,
    /// Group models stamped (Redis held their version) or installed.
    pub groups_stamped: usize,
    pub groups_installed: usize,
    /// One-to-one models made.
    pub one_to_one: usize,
    /// Claims put back from the log's unstored tail.
    pub claims: usize,
    /// Records of the tail read.
    pub scanned: u64,
    /// Until the claims were back and the marker written (sends with a
    /// client message id on restored topics wait this long).
    pub claims_seconds: f64,
    /// Until the whole pass ended.
    pub seconds: f64,
}

/// The tenants' write-side restore; cheap to clone.
#[derive(Clone)]
pub struct Recovery {
    config: Config,
    pools: TenantPools,
    redis: Redis,
    codec: EventCodec,
    groups: GroupModel,
}

impl Recovery {
    pub fn new(
        config: Config,
        pools: TenantPools,
        redis: Redis,
        codec: EventCodec,
        groups: GroupModel,
    ) -> Self {
        Self {
            config,
            pools,
            redis,
            codec,
            groups,
        }
    }

    /// Every second (and at once): restores the tenants whose marker does
    /// not name the incarnation answering now, until `shutdown`.
    pub async fn watch(self, shutdown: Shutdown) {
        loop {
            if let Err(e) = self.check_once().await {
                tracing::warn!(error = %e, "write-side restore check failed; retrying");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Restores every tenant whose marker does not name the incarnation
    /// answering now (those another process is restoring are left to it).
    pub async fn check_once(&self) -> Result<Vec<Report>, String> {
        let mut redis = self.redis.clone();
        let now = incarnation::current(&mut redis)
            .await
            .map_err(|e| e.to_string())?;
        if now.is_empty() {
            return Err("no run_id from Redis".into());
        }
        let mut due = Vec::new();
        for t in &self.config.tenants {
            let marker = incarnation::restored_marker(&mut redis, &t.id)
                .await
                .map_err(|e| e.to_string())?;
            if marker.as_deref().map(|m| incarnation::parse_marker(m).0) != Some(now.as_str()) {
                due.push(t.id.clone());
            }
        }
        if due.is_empty() {
            return Ok(Vec::new());
        }
        self.restore(&due, &now).await
    }

    /// Restores `tenants` for `incarnation` (see the module docs).
    pub async fn restore(
        &self,
        tenants: &[String],
        incarnation: &str,
    ) -> Result<Vec<Report>, String> {
        let mut redis = self.redis.clone();
        let mut locks = Vec::new();
        for tenant in tenants {
            let key = TenantKeys::new(tenant).restore_lock();
            if let Some(lock) = RedisLock::acquire(&mut redis, &key, LOCK_MS)
                .await
                .map_err(|e| e.to_string())?
            {
                locks.push((tenant.clone(), lock));
            }
        }
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        let held: Vec<String> = locks.iter().map(|(t, _)| t.clone()).collect();
        tracing::warn!(tenants = ?held, incarnation, "Redis is another incarnation: restoring the write side from durable state");
        // The leases are renewed while the restore runs.
        let renewing = {
            let mut redis = redis.clone();
            let leases: Vec<RedisLock> = locks.iter().map(|(_, l)| l.clone()).collect();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(LOCK_MS / 3)).await;
                    for lease in &leases {
                        let _ = lease.renew(&mut redis, LOCK_MS).await;
                    }
                }
            })
        };
        let result = self.restore_locked(&locks, incarnation).await;
        renewing.abort();
        for (_, lock) in locks {
            let _ = lock.release(&mut redis).await;
        }
        result
    }

    async fn restore_locked(
        &self,
        locks: &[(String, RedisLock)],
        incarnation: &str,
    ) -> Result<Vec<Report>, String> {
        let started = Instant::now();
        // What the pass restores counts as restored when it began: every
        // claim of the tail from before then is put back by it.
        let began_ms = crate::events::now_ms();
        let tenants: Vec<String> = locks.iter().map(|(t, _)| t.clone()).collect();
        // Claims first: until they are back, a send with a client message
        // id on a restored topic waits (`Sender::check_claim`). The seq
        // allocators and group models restore themselves lazily on their
        // first use meanwhile; the bulk pages below only save those sends
        // the MySQL round trip.
        let (claims, scanned) = self.restore_claims(&tenants).await?;
        let mut redis = self.redis.clone();
        let mut reports = Vec::new();
        for (tenant, lock) in locks {
            let marked =
                incarnation::mark_restored(&mut redis, tenant, incarnation, began_ms, lock)
                    .await
                    .map_err(|e| e.to_string())?;
            if !marked {
                return Err(format!(
                    "tenant {tenant}: the restore lock was lost during the pass (Redis forgot again?); the next pass restores it"
                ));
            }
            let claims_seconds = started.elapsed().as_secs_f64();
            let mut report = Report {
                tenant: tenant.clone(),
                claims: claims.get(tenant).copied().unwrap_or(0),
                scanned,
                claims_seconds,
                ..Report::default()
            };
            self.restore_seqs(tenant, began_ms, &mut report).await?;
            self.restore_groups(tenant, &mut report).await?;
            incarnation::mark_pass_done(&mut redis, tenant, incarnation, began_ms, lock)
                .await
                .map_err(|e| e.to_string())?;
            report.seconds = started.elapsed().as_secs_f64();
            metrics::histogram!(m::RECOVERY_SECONDS).record(report.seconds);
            tracing::warn!(
                tenant = %report.tenant,
                claims = report.claims,
                scanned = report.scanned,
                claims_seconds = report.claims_seconds,
                seqs = report.seqs,
                groups_stamped = report.groups_stamped,
                groups_installed = report.groups_installed,
                one_to_one = report.one_to_one,
                seconds = report.seconds,
                "write side restored after Redis forgot"
            );
            reports.push(report);
        }
        Ok(reports)
    }

    /// Every seq allocator of the tenant that is not live, from its mark;
    /// and the models of its one-to-one topics.
    async fn restore_seqs(
        &self,
        tenant: &str,
        began_ms: i64,
        report: &mut Report,
    ) -> Result<(), String> {
        let pool = self.pools.get(tenant).map_err(|e| e.to_string())?;
        let mut after = String::new();
        loop {
            let page = marks::topics_after(pool, &after, PAGE)
                .await
                .map_err(|e| e.to_string())?;
            let Some(last) = page.last() else { break };
            after = last.clone();
            let live = self.seq_live(tenant, &page).await?;
            let due: Vec<String> = page
                .iter()
                .zip(live)
                .filter(|(_, live)| !live)
                .map(|(t, _)| t.clone())
                .collect();
            let reserved = marks::reserve_many(pool, &due, crate::send::marks::RESTORE_BLOCK)
                .await
                .map_err(|e| e.to_string())?;
            metrics::counter!(m::SEQ_BLOCKS_TOTAL, "why" => "restore")
                .increment(reserved.len() as u64);
            let calls = reserved
                .into_iter()
                .map(|(topic, mark, floor)| {
                    let keys = TopicKeys::new(tenant, &topic);
                    let call = crate::send::marks::restore_invocation(
                        &keys,
                        mark,
                        mark + crate::send::marks::RESTORE_BLOCK,
                        &floor,
                        Some(began_ms),
                        true,
                    );
                    let mut redis = self.redis.clone();
                    async move { call.invoke_async::<i64>(&mut redis).await }
                })
                .collect::<Vec<_>>();
            let installed = run_all(calls).await?;
            let n = installed.iter().filter(|i| **i == 1).count();
            report.seqs += n;
            metrics::counter!(m::WRITE_RESTORES_TOTAL, "what" => "seq", "how" => "bulk")
                .increment(n as u64);
            // One-to-one models come from their names.
            let p2p = page
                .iter()
                .filter(|t| crate::tinode::parse_p2p_topic(t).is_some())
                .map(|topic| {
                    let groups = self.groups.clone();
                    let (tenant, topic) = (tenant.to_string(), topic.clone());
                    async move { groups.ensure(&tenant, &topic).await.map(|_| 1i64) }
                })
                .collect::<Vec<_>>();
            report.one_to_one += futures::stream::iter(p2p)
                .buffer_unordered(IN_FLIGHT)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .filter(|r| r.is_ok())
                .count();
        }
        Ok(())
    }

    /// Which of `topics`' allocators are live.
    async fn seq_live(&self, tenant: &str, topics: &[String]) -> Result<Vec<bool>, String> {
        let calls = topics
            .iter()
            .map(|topic| {
                let keys = TopicKeys::new(tenant, topic);
                let mut redis = self.redis.clone();
                async move {
                    crate::send::marks::SeqState::read(&mut redis, &keys)
                        .await
                        .map(|s| s.live())
                }
            })
            .collect::<Vec<_>>();
        // In order: `buffered` keeps it.
        futures::stream::iter(calls)
            .buffered(IN_FLIGHT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
    }

    /// Every group model of the tenant that is not live, from MySQL.
    async fn restore_groups(&self, tenant: &str, report: &mut Report) -> Result<(), String> {
        let pool = self.pools.get(tenant).map_err(|e| e.to_string())?;
        let mut after = String::new();
        loop {
            let page = crate::group_model::durable::topics_after(pool, &after, PAGE)
                .await
                .map_err(|e| e.to_string())?;
            let Some(last) = page.last() else { break };
            after = last.clone();
            let (stamped, installed) = self
                .groups
                .restore_many(tenant, &page)
                .await
                .map_err(|e| e.to_string())?;
            report.groups_stamped += stamped;
            report.groups_installed += installed;
        }
        Ok(())
    }

    /// The claims of `tenants`' messages in the log's unstored tail, put
    /// back (a claim Redis holds is kept): per tenant, how many were read.
    async fn restore_claims(
        &self,
        tenants: &[String],
    ) -> Result<(std::collections::HashMap<String, usize>, u64), String> {
        let group = format!("{}.store", self.config.pipelines.group_prefix);
        let (sent, scanned) = crate::kafka::log_tail::claims_in_tail(
            &self.config,
            &group,
            tenants,
            &self.codec,
            Duration::from_secs(120),
        )
        .await
        .map_err(|e| e.to_string())?;
        let mut per_tenant = std::collections::HashMap::new();
        let calls = sent.into_iter().filter_map(|(tenant, topic, m)| {
            let cmid = m.client_msg_id?;
            *per_tenant.entry(tenant.clone()).or_insert(0usize) += 1;
            let key = TopicKeys::new(&tenant, &topic).uniq(m.from_user, &cmid);
            let value = format!("done|{}|{}|{}", m.seq, m.month, m.message_id);
            let mut redis = self.redis.clone();
            Some(async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .arg("PX")
                    .arg(CLAIM_TTL_MS)
                    .query_async::<Option<String>>(&mut redis)
                    .await
                    .map(|_| 1i64)
            })
        });
        let calls: Vec<_> = calls.collect();
        run_all(calls).await?;
        Ok((per_tenant, scanned))
    }
}

/// Runs Redis calls [`IN_FLIGHT`] at a time; their answers, or the first
/// failure.
async fn run_all<F>(calls: impl IntoIterator<Item = F>) -> Result<Vec<i64>, String>
where
    F: std::future::Future<Output = redis::RedisResult<i64>>,
{
    futures::stream::iter(calls)
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|r| r.map_err(|e| e.to_string()))
        .collect()
}
