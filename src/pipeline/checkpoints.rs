//! Where a MySQL projection stands, kept in each tenant database itself
//! (issue 29): a database that comes back older (a lagging replica promoted
//! after its primary died, a restore) has lost rows whose Kafka offsets were
//! committed long ago, and only the database itself can say so.
//!
//! After every batch, the pipeline writes, in each tenant database it wrote
//! to, the next offset of each source partition it has handled
//! (`im_pipeline_checkpoints`), in a transaction after the batch's own
//! writes: whatever prefix of its commits a database keeps, a checkpoint it
//! holds covers every row before it. Every [`ALL_TENANTS_EVERY`] (and at the
//! first batch and at shutdown) every tenant's checkpoint is written, so an
//! idle tenant does not hold its partitions back.
//!
//! Before a checkpoint moves, the stored one is compared with what this
//! process last wrote there (or, the first time, with where this process
//! started on that partition). A database that holds less went back: the
//! partition is rewound to its checkpoint ([`Rewind`]) and every record from
//! there is handled again (every handler is idempotent), so the lost rows come
//! back. A database without any checkpoint says nothing (a new tenant before
//! its first batch): `imstream migrate` writes the first ones ([`birth`]).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use sqlx::MySqlPool;

use crate::config::Config;
use crate::tenant::TenantPools;

use super::records::Record;

/// How often every tenant's checkpoints are written, records or not.
pub const ALL_TENANTS_EVERY: Duration = Duration::from_secs(10);

/// How often a tenant's checkpoints are written while its records flow. A
/// write per batch was a transaction per batch per MySQL pipeline — most
/// of MariaDB's work at low rates, where batches hold one record. A
/// checkpoint further behind only means handling more records again after
/// a database comes back older, never losing one: it is still written
/// after the rows it covers.
pub const TENANT_EVERY: Duration = Duration::from_secs(1);

/// A partition to handle again from `offset`: a tenant database holds only
/// the rows before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rewind {
    pub partition: i32,
    pub offset: i64,
}

/// One pipeline's checkpoints in the tenant databases.
pub struct Checkpoints {
    pools: TenantPools,
    group: String,
    source: String,
    /// partition → the first offset this process handled there.
    started: HashMap<i32, i64>,
    /// partition → the next offset after everything handled so far.
    position: BTreeMap<i32, i64>,
    /// (tenant, partition) → the checkpoint this process last wrote.
    written: HashMap<(String, i32), i64>,
    last_all: Option<Instant>,
    /// tenant → when its checkpoints were last written.
    last_tenant: HashMap<String, Instant>,
}

impl Checkpoints {
    pub fn new(pools: TenantPools, group: &str, source: &str) -> Self {
        Self {
            pools,
            group: group.to_string(),
            source: source.to_string(),
            started: HashMap::new(),
            position: BTreeMap::new(),
            written: HashMap::new(),
            last_all: None,
            last_tenant: HashMap::new(),
        }
    }

    /// After `batch` was handled: writes the checkpoints of the tenants it
    /// touched (all tenants every [`ALL_TENANTS_EVERY`]); returns the
    /// partitions to rewind. A database that cannot be written now is
    /// skipped: its checkpoint stays behind, which only means handling
    /// records again later, never losing any.
    pub async fn after_batch(&mut self, batch: &[Record]) -> Vec<Rewind> {
        let mut touched: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for r in batch.iter().filter(|r| r.topic == self.source) {
            self.started.entry(r.partition).or_insert(r.offset);
            let next = self.position.entry(r.partition).or_insert(0);
            *next = (*next).max(r.offset + 1);
            if let Some(tenant) = tenant_of(r).filter(|t| self.pools.get(t).is_ok()) {
                let parts = touched.entry(tenant.to_string()).or_default();
                if !parts.contains(&r.partition) {
                    parts.push(r.partition);
                }
            }
        }
        if self
            .last_all
            .is_none_or(|at| at.elapsed() >= ALL_TENANTS_EVERY)
        {
            self.last_all = Some(Instant::now());
            let every: Vec<i32> = self.position.keys().copied().collect();
            touched = self
                .pools
                .tenants()
                .map(|t| (t.to_string(), every.clone()))
                .collect();
        } else {
            touched.retain(|tenant, _| {
                self.last_tenant
                    .get(tenant)
                    .is_none_or(|at| at.elapsed() >= TENANT_EVERY)
            });
        }
        self.write(touched).await
    }

    /// Where this process stands on a partition it was assigned but has had
    /// no record of yet (its group's committed offset): from there on its
    /// checkpoints are checked and written too.
    pub fn assigned(&mut self, partition: i32, next: i64) {
        self.started.entry(partition).or_insert(next);
        self.position.entry(partition).or_insert(next);
    }

    /// Every tenant's checkpoints: at a pipeline's start, every
    /// [`ALL_TENANTS_EVERY`] when no record comes, and when it stops.
    pub async fn flush(&mut self) -> Vec<Rewind> {
        let every: Vec<i32> = self.position.keys().copied().collect();
        let all = self
            .pools
            .tenants()
            .map(|t| (t.to_string(), every.clone()))
            .collect();
        self.write(all).await
    }

    async fn write(&mut self, touched: BTreeMap<String, Vec<i32>>) -> Vec<Rewind> {
        let mut rewinds: BTreeMap<i32, i64> = BTreeMap::new();
        for (tenant, partitions) in touched {
            self.last_tenant.insert(tenant.clone(), Instant::now());
            let Ok(pool) = self.pools.get(&tenant) else {
                continue;
            };
            let moves: Vec<(i32, i64, i64)> = partitions
                .iter()
                .filter_map(|p| {
                    let next = *self.position.get(p)?;
                    let expected = self
                        .written
                        .get(&(tenant.clone(), *p))
                        .copied()
                        .or_else(|| self.started.get(p).copied())?;
                    Some((*p, expected, next))
                })
                .collect();
            match advance(pool, &self.group, &self.source, &moves).await {
                Ok(outcome) => {
                    for (p, stored) in outcome.behind {
                        tracing::error!(
                            %tenant,
                            group = %self.group,
                            partition = p,
                            checkpoint = stored,
                            "tenant database holds less than was written to it (restored or failed over to a replica that lagged); handling the partition again from its checkpoint"
                        );
                        metrics::counter!(crate::metrics::PIPELINE_REWINDS_TOTAL).increment(1);
                        let at = rewinds.entry(p).or_insert(stored);
                        *at = (*at).min(stored);
                        self.written.insert((tenant.clone(), p), stored);
                    }
                    for (p, next) in outcome.advanced {
                        self.written.insert((tenant.clone(), p), next);
                    }
                }
                Err(e) => {
                    tracing::warn!(%tenant, group = %self.group, error = %e, "checkpoint not written; it stays behind");
                }
            }
        }
        for (p, offset) in &rewinds {
            // Everything from there is handled again: the positions of this
            // process go back with it.
            self.position.insert(*p, *offset);
            self.started.insert(*p, *offset);
        }
        rewinds
            .into_iter()
            .map(|(partition, offset)| Rewind { partition, offset })
            .collect()
    }
}

/// What one tenant database said to a checkpoint write.
#[derive(Debug, Default)]
struct Advanced {
    /// Partitions moved to their new checkpoint.
    advanced: Vec<(i32, i64)>,
    /// Partitions whose stored checkpoint is below what was expected: the
    /// database went back; left as they are.
    behind: Vec<(i32, i64)>,
}

/// In one transaction: for each `(partition, expected, next)`, reads the
/// stored checkpoint; moves it to `next` unless it is below `expected`.
async fn advance(
    pool: &MySqlPool,
    group: &str,
    source: &str,
    moves: &[(i32, i64, i64)],
) -> Result<Advanced, sqlx::Error> {
    let mut out = Advanced::default();
    if moves.is_empty() {
        return Ok(out);
    }
    let mut tx = pool.begin().await?;
    let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "SELECT kafka_partition, next_offset FROM im_pipeline_checkpoints \
         WHERE consumer_group = ",
    );
    q.push_bind(group)
        .push(" AND source_topic = ")
        .push_bind(source)
        .push(" AND kafka_partition IN (");
    let mut sep = q.separated(", ");
    for (p, _, _) in moves {
        sep.push_bind(*p);
    }
    q.push(") FOR UPDATE");
    let stored: HashMap<i32, i64> = q
        .build_query_as::<(i32, i64)>()
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect();
    let mut upserts = Vec::new();
    for (p, expected, next) in moves {
        match stored.get(p) {
            Some(s) if s < expected => out.behind.push((*p, *s)),
            Some(s) if s >= next => {}
            _ => upserts.push((*p, *next)),
        }
    }
    if !upserts.is_empty() {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO im_pipeline_checkpoints \
             (consumer_group, source_topic, kafka_partition, next_offset, updated_at) ",
        );
        q.push_values(&upserts, |mut b, (p, next)| {
            b.push_bind(group)
                .push_bind(source)
                .push_bind(*p)
                .push_bind(*next)
                .push("UTC_TIMESTAMP(3)");
        });
        q.push(
            " ON DUPLICATE KEY UPDATE next_offset = GREATEST(next_offset, VALUES(next_offset)), \
             updated_at = VALUES(updated_at)",
        );
        q.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    out.advanced = upserts;
    Ok(out)
}

/// The tenant of a record: its key up to the first `:` (`{tenant}:{topic}`,
/// `{tenant}:{uid}`).
fn tenant_of(r: &Record) -> Option<&str> {
    let key = std::str::from_utf8(r.key.as_deref()?).ok()?;
    key.split_once(':').map(|(t, _)| t)
}

/// The first checkpoints of a tenant database (`imstream migrate`): for each
/// pipeline that keeps checkpoints, where its consumer group stands now on
/// each partition of its source — the database holds everything before
/// (a new one holds nothing of it). An existing checkpoint is kept.
pub async fn birth(config: &Config, pool: &MySqlPool) -> anyhow::Result<usize> {
    let names = crate::kafka::topics::TopicNames::new(&config.kafka);
    let mut written = 0;
    for name in super::PIPELINES {
        let topology = super::load_topology(config, name)?;
        if !topology.checkpoints {
            continue;
        }
        let Some(kind) = topology.source_kind() else {
            continue;
        };
        let source = names.name(kind);
        let group = super::runner::group_id(config, &topology);
        let kafka = config.kafka.clone();
        let (topic, g) = (source.clone(), group.clone());
        let backlog = match tokio::task::spawn_blocking(move || {
            crate::kafka::lag::backlog(&kafka, &topic, &g)
        })
        .await?
        {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(%source, %group, error = %e, "no first checkpoints (source not readable)");
                continue;
            }
        };
        for b in backlog {
            let done = sqlx::query(
                "INSERT INTO im_pipeline_checkpoints \
                 (consumer_group, source_topic, kafka_partition, next_offset, updated_at) \
                 VALUES (?, ?, ?, ?, UTC_TIMESTAMP(3)) \
                 ON DUPLICATE KEY UPDATE next_offset = next_offset",
            )
            .bind(&group)
            .bind(&source)
            .bind(b.partition)
            .bind(b.from)
            .execute(pool)
            .await?;
            written += done.rows_affected() as usize;
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_is_the_key_up_to_its_first_colon() {
        let record = |key: &[u8]| Record {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: Some(key.to_vec()),
            payload: None,
            traceparent: None,
            timestamp_ms: None,
        };
        assert_eq!(tenant_of(&record(b"acme:grpX:y")), Some("acme"));
        assert_eq!(tenant_of(&record(b"acme:7")), Some("acme"));
        assert_eq!(tenant_of(&record(b"no-colon")), None);
        assert_eq!(tenant_of(&record(&[0xff, b':'])), None);
    }
}
