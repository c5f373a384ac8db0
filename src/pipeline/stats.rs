//! The stats pipeline's handler: group events → the daily summaries of
//! [`crate::stats`] (messages, edits, recalls, deletes per topic and UTC
//! day; who sent). A batch becomes, per tenant, one locking read of the
//! rows it touches, their seq sets merged with the batch's, and one
//! upsert, in one transaction: redelivery, replay and a rebalance's overlap
//! leave the counts as they were.

use std::collections::{BTreeMap, BTreeSet};

use chrono::NaiveDate;
use sqlx::Row;

use crate::events::{EventCodec, GroupEvent, GroupEventBody};
use crate::failure::FailureKind;
use crate::stats::{day_of, SeqSet};
use crate::tenant::{db_failure, TenantPools};
use crate::tinode;

use super::records::{decode_all, Handler, Record, RecordFailure};

pub struct StatsHandler {
    codec: EventCodec,
    pools: TenantPools,
}

impl StatsHandler {
    pub fn new(codec: EventCodec, pools: TenantPools) -> Self {
        Self { codec, pools }
    }
}

/// What a batch adds to one (day, topic) row.
#[derive(Default)]
struct Delta {
    messages: SeqSet,
    edits: SeqSet,
    recalls: SeqSet,
    deletes: SeqSet,
}

/// (tenant) → (day, topic) → delta, and the senders and records behind it.
#[derive(Default)]
struct TenantBatch {
    rows: BTreeMap<(NaiveDate, String), Delta>,
    senders: BTreeSet<(NaiveDate, String, i64)>,
    records: Vec<usize>,
}

impl Handler for StatsHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        let mut batches: BTreeMap<String, TenantBatch> = BTreeMap::new();
        for (i, e) in events {
            let b = batches.entry(e.tenant_id.clone()).or_default();
            b.records.push(i);
            add(b, &e);
        }
        for (tenant, batch) in batches {
            let result = match self.pools.get(&tenant) {
                Ok(pool) => write(pool, &batch)
                    .await
                    .map_err(|e| (db_failure(&e), format!("mysql: {e}"))),
                Err(e) => Err((FailureKind::Poison, e.to_string())),
            };
            if let Err((kind, reason)) = result {
                failures.extend(
                    batch
                        .records
                        .iter()
                        .map(|i| RecordFailure::new(*i, kind, reason.clone())),
                );
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }
}

/// One event's part: a message by its send day, a recall or delete by the
/// day it happened.
fn add(b: &mut TenantBatch, e: &GroupEvent) {
    let key = |day: NaiveDate| (day, e.topic.clone());
    match &e.body {
        GroupEventBody::MessageSent(m) => {
            let day = day_of(m.created_at);
            let delta = b.rows.entry(key(day)).or_default();
            delta.messages.insert(m.seq, m.seq + 1);
            if matches!(tinode::replaced_seq(m.head.as_deref()), Ok(Some(_))) {
                delta.edits.insert(m.seq, m.seq + 1);
            }
            b.senders.insert((day, e.topic.clone(), m.from_user));
        }
        GroupEventBody::MessageRecalled(r) => {
            let delta = b.rows.entry(key(day_of(r.recalled_at))).or_default();
            delta.recalls.insert(r.seq, r.seq + 1);
        }
        GroupEventBody::MessageDeleted(d) => {
            let delta = b.rows.entry(key(day_of(d.deleted_at))).or_default();
            for r in &d.ranges {
                delta.deletes.insert(r.low, r.hi);
            }
        }
        _ => {}
    }
}

/// Merges the batch into its rows in one transaction.
async fn write(pool: &sqlx::MySqlPool, batch: &TenantBatch) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    let keys: Vec<&(NaiveDate, String)> = batch.rows.keys().collect();
    let mut stored: BTreeMap<(NaiveDate, String), [SeqSet; 4]> = BTreeMap::new();
    for chunk in keys.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT day, topic, message_seqs, edit_seqs, recall_seqs, delete_seqs \
             FROM im_stats_daily WHERE (day, topic) IN (",
        );
        let mut sep = q.separated(", ");
        for (day, topic) in chunk {
            sep.push("(")
                .push_bind_unseparated(*day)
                .push_unseparated(", ")
                .push_bind_unseparated(topic.as_str())
                .push_unseparated(")");
        }
        q.push(") FOR UPDATE");
        for r in q.build().fetch_all(&mut *tx).await? {
            // An unreadable set (hand-edited) starts again from the batch.
            let set = |i: usize| -> sqlx::Result<SeqSet> {
                Ok(SeqSet::parse(&r.try_get::<String, _>(i)?).unwrap_or_default())
            };
            stored.insert(
                (
                    r.try_get(0)?,
                    r.try_get::<crate::exact::Exact, _>(1)?.into(),
                ),
                [set(2)?, set(3)?, set(4)?, set(5)?],
            );
        }
    }
    let mut merged = Vec::with_capacity(batch.rows.len());
    for (key, delta) in &batch.rows {
        let [mut messages, mut edits, mut recalls, mut deletes] =
            stored.remove(key).unwrap_or_default();
        for (into, from) in [
            (&mut messages, &delta.messages),
            (&mut edits, &delta.edits),
            (&mut recalls, &delta.recalls),
            (&mut deletes, &delta.deletes),
        ] {
            for (low, hi) in from.ranges() {
                into.insert(*low, *hi);
            }
        }
        merged.push((key, [messages, edits, recalls, deletes]));
    }
    for chunk in merged.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO im_stats_daily (day, topic, messages, edits, recalls, deletes, \
             message_seqs, edit_seqs, recall_seqs, delete_seqs) ",
        );
        q.push_values(chunk, |mut r, ((day, topic), sets)| {
            r.push_bind(*day).push_bind(topic.as_str());
            for s in sets {
                r.push_bind(s.len());
            }
            for s in sets {
                r.push_bind(s.text());
            }
        });
        q.push(
            " ON DUPLICATE KEY UPDATE messages = VALUES(messages), edits = VALUES(edits), \
             recalls = VALUES(recalls), deletes = VALUES(deletes), \
             message_seqs = VALUES(message_seqs), edit_seqs = VALUES(edit_seqs), \
             recall_seqs = VALUES(recall_seqs), delete_seqs = VALUES(delete_seqs)",
        );
        q.build().execute(&mut *tx).await?;
    }
    let senders: Vec<_> = batch.senders.iter().collect();
    for chunk in senders.chunks(1000) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO im_stats_senders (day, topic, uid) ",
        );
        q.push_values(chunk, |mut r, (day, topic, uid)| {
            r.push_bind(*day).push_bind(topic.as_str()).push_bind(*uid);
        });
        // A sender already counted stays counted; any other failure (a
        // value that does not fit) fails the batch instead of a warning.
        q.push(" ON DUPLICATE KEY UPDATE uid = uid");
        q.build().execute(&mut *tx).await?;
    }
    tx.commit().await
}
