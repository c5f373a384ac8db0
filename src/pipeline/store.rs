//! The store pipeline's handler: MessageSent events into the monthly MySQL
//! tables, one transaction per (tenant, shard month), then Redis routes;
//! user-view deletes into the dellog; edits, recalls and deletes for
//! everyone applied to the stored rows (see `store::revisions`). A failed
//! transaction fails all of its records together; a key's records after a
//! failed one wait for it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::redis_util::Redis;

use crate::events::{EventCodec, GroupEvent, GroupEventBody};
use crate::metrics as m;
use crate::store::message::NewMessage;
use crate::store::month::ShardMonth;
use crate::store::writer::{self, StoreError};
use crate::store::{revisions, routes};
use crate::tenant::{db_failure, TenantPools};

use super::failure::FailureKind;
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct StoreHandler {
    codec: EventCodec,
    pools: TenantPools,
    redis: Redis,
    /// Topics whose Redis route write failed, retried after the next batch
    /// (reads fall back to the mirror meanwhile).
    repair: Mutex<BTreeSet<(String, String)>>,
}

impl StoreHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, redis: Redis) -> Self {
        Self {
            codec,
            pools,
            redis,
            repair: Mutex::new(BTreeSet::new()),
        }
    }

    /// Tells readers' caches that the topic's dellog changed; until Redis
    /// takes it the record is retried (its writes are idempotent), so no
    /// reader keeps serving what was just deleted.
    async fn dellog_changed(&self, gate: &mut KeyGate<'_>, i: usize, event: &GroupEvent) {
        let mut redis = self.redis.clone();
        if let Err(e) =
            crate::store::dellog::changed(&mut redis, &event.tenant_id, &event.topic).await
        {
            tracing::warn!(tenant = %event.tenant_id, topic = %event.topic, error = %e, "dellog change not announced");
            gate.fail(RecordFailure::new(
                i,
                crate::failure::redis_failure(&e),
                format!("redis: {e}"),
            ));
        }
    }

    async fn repair_routes(&self) {
        let pending: Vec<(String, String)> =
            self.repair.lock().expect("lock").iter().cloned().collect();
        for (tenant, topic) in pending {
            let Ok(pool) = self.pools.get(&tenant) else {
                continue;
            };
            let mut redis = self.redis.clone();
            if routes::rebuild_topic(pool, &mut redis, &tenant, &topic)
                .await
                .is_ok()
            {
                self.repair.lock().expect("lock").remove(&(tenant, topic));
                metrics::counter!(m::ROUTE_REBUILD_TOTAL, "status" => "ok").increment(1);
            }
        }
        metrics::gauge!(m::ROUTE_REPAIR_BACKLOG)
            .set(self.repair.lock().expect("lock").len() as f64);
    }
}

/// Writes a user-view delete's ranges. A range already written (the same
/// event, redelivered) is a no-op; any other refusal is an error.
async fn write_dellog(
    pool: &sqlx::MySqlPool,
    event: &GroupEvent,
    h: &crate::events::HistoryCleared,
) -> Result<(), sqlx::Error> {
    for r in &h.ranges {
        sqlx::query(
            "INSERT INTO im_dellog (topic, deletedfor, delid, low, hi, event_id) VALUES (?, ?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE event_id = event_id",
        )
        .bind(&event.topic)
        .bind(h.uid)
        .bind(h.del_id)
        .bind(r.low)
        .bind(r.hi)
        .bind(&event.event_id)
        .execute(pool)
        .await?;
    }
    Ok(())
}

impl Handler for StoreHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut decode_failures = Vec::new();
        let events: Vec<(usize, GroupEvent)> =
            decode_all(&self.codec, records, &mut decode_failures).await;
        // A key's records after one that failed wait for it.
        let mut gate = KeyGate::new(records, decode_failures);

        // (tenant, month) → indexes into `events`.
        let mut groups: BTreeMap<(String, ShardMonth), Vec<usize>> = BTreeMap::new();
        for (n, (i, event)) in events.iter().enumerate() {
            if let GroupEventBody::MessageSent(msg) = &event.body {
                match ShardMonth::parse(&msg.shard_month) {
                    Ok(month) => groups
                        .entry((event.tenant_id.clone(), month))
                        .or_default()
                        .push(n),
                    Err(e) => gate.fail(RecordFailure::poison(*i, e.to_string())),
                }
            }
        }
        // One transaction per group, in the log order of their first
        // records, each holding only records whose key has not failed yet:
        // a failed group fails all of its records together.
        let mut groups: Vec<((String, ShardMonth), Vec<usize>)> = groups.into_iter().collect();
        groups.sort_by_key(|(_, members)| members.first().map(|n| events[*n].0));
        for ((tenant, month), members) in groups {
            let index_of = |n: &usize| events[*n].0;
            let members: Vec<usize> = members
                .into_iter()
                .filter(|n| gate.admit(index_of(n)))
                .collect();
            if members.is_empty() {
                continue;
            }
            let pool = match self.pools.get(&tenant) {
                Ok(p) => p,
                Err(e) => {
                    for n in &members {
                        gate.fail(RecordFailure::poison(index_of(n), e.to_string()));
                    }
                    continue;
                }
            };
            let batch: Vec<NewMessage<'_>> = members
                .iter()
                .filter_map(|n| match &events[*n].1.body {
                    GroupEventBody::MessageSent(msg) => Some(NewMessage {
                        topic: &events[*n].1.topic,
                        event_id: &events[*n].1.event_id,
                        msg,
                    }),
                    _ => None,
                })
                .collect();
            let month_label = month.to_string();
            match writer::write_month(pool, month, &batch).await {
                Ok(outcome) => {
                    let now = crate::events::now_ms();
                    for s in &batch {
                        metrics::histogram!(m::PERSIST_LATENCY)
                            .record((now - s.msg.created_at).max(0) as f64 / 1000.0);
                    }
                    metrics::counter!(m::PERSIST_TOTAL, "month" => month_label.clone(), "status" => "ok")
                        .increment(outcome.inserted as u64);
                    metrics::counter!(m::DEDUP_HIT_TOTAL).increment(outcome.dedup_hits as u64);
                    for c in &outcome.collisions {
                        // Data loss in the making: loud, once per message.
                        tracing::error!(
                            %tenant,
                            topic = %c.topic,
                            seq = c.seq,
                            message_id = c.message_id,
                            event_id = %c.event_id,
                            client_msg_id = ?c.client_msg_id,
                            held_by_message_id = c.held_by_message_id,
                            "seq collision: this seq is held by another message; kept in im_seq_collisions"
                        );
                    }
                    metrics::counter!(m::SEQ_COLLISIONS_TOTAL)
                        .increment(outcome.collisions.len() as u64);
                    let mut redis = self.redis.clone();
                    if let Err(e) = routes::apply(&mut redis, &tenant, &outcome.mirror).await {
                        tracing::warn!(%tenant, error = %e, "route update failed; queued for repair");
                        let mut repair = self.repair.lock().expect("lock");
                        for row in &outcome.mirror {
                            repair.insert((tenant.clone(), row.topic.clone()));
                        }
                    }
                }
                Err(e) => {
                    if matches!(e, StoreError::MissingTable(_)) {
                        metrics::counter!(m::SHARD_MISSING_TOTAL).increment(1);
                    }
                    metrics::counter!(m::PERSIST_TOTAL, "month" => month_label, "status" => "failed")
                        .increment(batch.len() as u64);
                    let kind = FailureKind::from_transient(e.is_retryable());
                    tracing::warn!(%tenant, %month, error = %e, ?kind, records = members.len(), "store write failed");
                    let reason = e.to_string();
                    for n in &members {
                        gate.fail(RecordFailure::new(index_of(n), kind, reason.clone()));
                    }
                }
            }
        }
        // User-view deletes (one dellog row per range, keyed by event id)
        // and edits, recalls and deletes, in log order, after this batch's
        // messages are stored (a message precedes its edits in the log).
        for (i, event) in &events {
            if let GroupEventBody::PinsChanged(p) = &event.body {
                // A chat's pins, whole, in log order.
                if !gate.admit(*i) {
                    continue;
                }
                let written = match self.pools.get(&event.tenant_id) {
                    Ok(pool) => crate::pins::write(pool, &event.topic, &p.pins)
                        .await
                        .map_err(|e| RecordFailure::new(*i, db_failure(&e), format!("mysql: {e}"))),
                    Err(e) => Err(RecordFailure::poison(*i, e.to_string())),
                };
                if let Err(f) = written {
                    gate.fail(f);
                }
                continue;
            }
            let clear = match &event.body {
                GroupEventBody::HistoryCleared(h) => Some(h),
                _ if revisions::is_revision(event) => None,
                _ => continue,
            };
            if !gate.admit(*i) {
                continue;
            }
            let pool = match self.pools.get(&event.tenant_id) {
                Ok(pool) => pool,
                Err(e) => {
                    gate.fail(RecordFailure::poison(*i, e.to_string()));
                    continue;
                }
            };
            if let Some(h) = clear {
                if let Err(e) = write_dellog(pool, event, h).await {
                    tracing::warn!(tenant = %event.tenant_id, topic = %event.topic, error = %e, "dellog not written");
                    gate.fail(RecordFailure::new(
                        *i,
                        db_failure(&e),
                        format!("mysql: {e}"),
                    ));
                } else {
                    self.dellog_changed(&mut gate, *i, event).await;
                }
                continue;
            }
            match revisions::apply(pool, event).await {
                Ok(applied) => {
                    if matches!(
                        event.body,
                        GroupEventBody::MessageRecalled(_) | GroupEventBody::MessageDeleted(_)
                    ) {
                        self.dellog_changed(&mut gate, *i, event).await;
                    }
                    metrics::counter!(m::REVISIONS_TOTAL, "kind" => event.body.name(), "status" => "applied")
                        .increment(applied.changed as u64);
                    metrics::counter!(m::REVISIONS_TOTAL, "kind" => event.body.name(), "status" => "skipped")
                        .increment(applied.skipped as u64);
                }
                Err(e) => {
                    tracing::warn!(tenant = %event.tenant_id, topic = %event.topic, kind = event.body.name(), error = %e, "revision not applied");
                    gate.fail(RecordFailure::new(
                        *i,
                        FailureKind::from_transient(e.is_retryable()),
                        e.to_string(),
                    ));
                }
            }
        }
        self.repair_routes().await;
        gate.outcome()
    }
}
