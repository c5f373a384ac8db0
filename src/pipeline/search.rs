//! The search pipeline's handler: group events → each tenant's full-text
//! index ([`crate::search`]). A message is indexed under `(topic, seq)`;
//! an edit (the replacement message, and the `MessageEdited` that goes
//! with it) replaces the original's text and is not a document of its
//! own; a recall or a delete for everyone removes. A batch becomes one
//! commit per tenant, and the runner stores the batch's offsets only after
//! it returns, so a crash between the two re-applies the batch — which
//! changes nothing ([`crate::search::entry`] merges order-free).
//!
//! One writer per index: this handler holds each tenant's writer lock for
//! as long as it runs, so one copy of the pipeline serves a tenant (see
//! docs/api.md "Search" for how that scales).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::events::{EventCodec, GroupEvent, GroupEventBody};
use crate::search::entry::{plain_text, Change};
use crate::search::writer::{Batch, TenantWriter};
use crate::search::SearchError;
use crate::tinode;

use super::records::{decode_all, outcome, Handler, Record, RecordFailure};

pub struct SearchHandler {
    codec: EventCodec,
    /// The tenants this deployment serves (an event of another is poison:
    /// its id would name a folder nobody reads).
    tenants: Vec<String>,
    /// The tenants whose indexes this handler writes (`search.tenants`,
    /// else all); the others' events are passed over.
    mine: Vec<String>,
    root: PathBuf,
    memory_mb: usize,
    /// Writers opened so far, one per tenant, kept until the handler goes
    /// (dropping one releases its index's lock).
    writers: Arc<Mutex<HashMap<String, TenantWriter>>>,
}

impl SearchHandler {
    pub fn new(codec: EventCodec, config: &Config) -> Self {
        Self {
            codec,
            tenants: config.tenants.iter().map(|t| t.id.clone()).collect(),
            mine: if config.search.tenants.is_empty() {
                config.tenants.iter().map(|t| t.id.clone()).collect()
            } else {
                config.search.tenants.clone()
            },
            root: PathBuf::from(&config.search.index_dir),
            memory_mb: config.search.writer_memory_mb,
            writers: Arc::default(),
        }
    }
}

/// What one event changes in the index.
pub fn changes_of(event: &GroupEvent, batch: &mut Batch) {
    let topic = &event.topic;
    match &event.body {
        GroupEventBody::MessageSent(m) => {
            let text = plain_text(m.content.as_deref());
            match tinode::replaced_seq(m.head.as_deref()) {
                // An edit: the new text of the message it replaces.
                Ok(Some(target)) => batch.changes.push((
                    topic.clone(),
                    target,
                    Change::Edited {
                        edit_seq: m.seq,
                        text,
                    },
                )),
                _ => batch.changes.push((
                    topic.clone(),
                    m.seq,
                    Change::Sent {
                        ts: m.created_at,
                        from: m.from_user,
                        text,
                    },
                )),
            }
        }
        GroupEventBody::MessageEdited(e) => batch.changes.push((
            topic.clone(),
            e.seq,
            Change::Edited {
                // An edit event without its replacement's seq (older
                // producers) wins over any other, as in the hot copy.
                edit_seq: e.edit_seq.unwrap_or(i64::MAX),
                text: plain_text(e.content.as_deref()),
            },
        )),
        GroupEventBody::MessageRecalled(r) => {
            batch.changes.push((topic.clone(), r.seq, Change::Removed))
        }
        GroupEventBody::MessageDeleted(d) => {
            for r in &d.ranges {
                if r.hi > r.low {
                    batch.removed_ranges.push((topic.clone(), r.low, r.hi));
                }
            }
        }
        _ => {}
    }
}

impl Handler for SearchHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let events = decode_all::<GroupEvent>(&self.codec, records, &mut failures).await;
        let mut batches: BTreeMap<String, (Batch, Vec<usize>)> = BTreeMap::new();
        for (i, e) in events {
            if !self.tenants.contains(&e.tenant_id) {
                failures.push(RecordFailure::poison(
                    i,
                    format!("unknown tenant {:?}", e.tenant_id),
                ));
                continue;
            }
            if !self.mine.contains(&e.tenant_id) {
                continue;
            }
            let (batch, indexes) = batches.entry(e.tenant_id.clone()).or_default();
            indexes.push(i);
            changes_of(&e, batch);
        }
        for (tenant, (batch, indexes)) in batches {
            let writers = self.writers.clone();
            let dir = self.root.join(&tenant);
            let memory_mb = self.memory_mb;
            let result = tokio::task::spawn_blocking(move || -> Result<usize, SearchError> {
                let mut writers = writers.lock().unwrap_or_else(|p| p.into_inner());
                let writer = match writers.entry(tenant) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(TenantWriter::open(&dir, memory_mb)?)
                    }
                };
                writer.apply(&batch)
            })
            .await;
            let reason = match result {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(e) => format!("search indexing task: {e}"),
            };
            // The disk, the lock, a full volume: retried until it works.
            failures.extend(
                indexes
                    .into_iter()
                    .map(|i| RecordFailure::outage(i, reason.clone())),
            );
        }
        outcome(failures)
    }
}
