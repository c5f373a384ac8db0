//! The writing side of one tenant's index: the only writer of that index
//! (Tantivy takes a lock file; a second writer fails to open). A batch of
//! changes is applied as read → merge → delete-then-add → one commit:
//! the entries it touches are read from the last commit, the changes are
//! merged into them ([`super::entry`]), each is replaced under its
//! `(topic, seq)` key, and the commit makes the whole batch visible at
//! once. A failed commit is rolled back, so a retry starts from the last
//! commit again.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::time::Instant;

use tantivy::collector::DocSetCollector;
use tantivy::query::{BooleanQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::IndexRecordOption;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

use super::entry::{Change, Entry, Fields};
use super::{open_index, SearchError};
use crate::metrics as m;

/// Widest delete range turned into one tombstone per seq (a message of the
/// range that reaches the index later is then still kept out). Wider
/// ranges only remove what is indexed already; the query-time status check
/// hides a late one.
pub const MAX_TOMBSTONE_RANGE: i64 = 10_000;

/// Keys read from the index per query when a batch loads its entries.
const KEYS_PER_READ: usize = 512;

/// A batch of changes for one tenant.
#[derive(Debug, Default)]
pub struct Batch {
    /// (topic, seq, change)
    pub changes: Vec<(String, i64, Change)>,
    /// (topic, low, hi): every seq in `[low, hi)` removed.
    pub removed_ranges: Vec<(String, i64, i64)>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.removed_ranges.is_empty()
    }
}

/// One tenant's index, opened for writing.
pub struct TenantWriter {
    fields: Fields,
    writer: IndexWriter,
    reader: IndexReader,
}

impl TenantWriter {
    /// Opens (or creates) the index in `dir` and takes its writer lock.
    pub fn open(dir: &Path, memory_mb: usize) -> Result<TenantWriter, SearchError> {
        let (index, fields): (Index, Fields) = open_index(dir, true)?;
        let writer = index.writer_with_num_threads(1, memory_mb * 1024 * 1024)?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(TenantWriter {
            fields,
            writer,
            reader,
        })
    }

    /// Applies `batch` and commits; the number of documents written.
    pub fn apply(&mut self, batch: &Batch) -> Result<usize, SearchError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let started = Instant::now();
        let result = self.write(batch).and_then(|n| {
            self.writer.commit()?;
            self.reader.reload()?;
            Ok(n)
        });
        match result {
            Ok(n) => {
                metrics::counter!(m::SEARCH_INDEXED_TOTAL).increment(n as u64);
                metrics::histogram!(m::SEARCH_COMMIT_LATENCY)
                    .record(started.elapsed().as_secs_f64());
                Ok(n)
            }
            Err(e) => {
                // What was added since the last commit goes; a retry
                // starts from the committed index.
                if let Err(r) = self.writer.rollback() {
                    tracing::warn!(error = %r, "search index rollback failed");
                }
                Err(e)
            }
        }
    }

    fn write(&mut self, batch: &Batch) -> Result<usize, SearchError> {
        let f = self.fields;
        let searcher = self.reader.searcher();
        let mut keys: Vec<(String, i64)> = batch
            .changes
            .iter()
            .map(|(t, s, _)| (t.clone(), *s))
            .collect();
        // What the removed ranges cover: every indexed seq in them, and one
        // tombstone per seq of a narrow range.
        for (topic, low, hi) in &batch.removed_ranges {
            if hi - low <= MAX_TOMBSTONE_RANGE {
                keys.extend((*low..*hi).map(|s| (topic.clone(), s)));
            } else {
                let q = BooleanQuery::new(vec![
                    (
                        Occur::Must,
                        Box::new(TermQuery::new(
                            Term::from_field_text(f.topic, topic),
                            IndexRecordOption::Basic,
                        )) as Box<dyn Query>,
                    ),
                    (
                        Occur::Must,
                        Box::new(RangeQuery::new(
                            Bound::Included(Term::from_field_i64(f.seq, *low)),
                            Bound::Excluded(Term::from_field_i64(f.seq, *hi)),
                        )),
                    ),
                ]);
                for addr in searcher.search(&q, &DocSetCollector)? {
                    let doc: TantivyDocument = searcher.doc(addr)?;
                    if let Some(e) = Entry::from_doc(&f, &doc) {
                        keys.push((e.topic, e.seq));
                    }
                }
            }
        }
        keys.sort();
        keys.dedup();
        let mut entries: BTreeMap<(String, i64), Entry> = BTreeMap::new();
        for chunk in keys.chunks(KEYS_PER_READ) {
            let q = BooleanQuery::new(
                chunk
                    .iter()
                    .map(|(t, s)| {
                        (
                            Occur::Should,
                            Box::new(TermQuery::new(f.key_term(t, *s), IndexRecordOption::Basic))
                                as Box<dyn Query>,
                        )
                    })
                    .collect(),
            );
            for addr in searcher.search(&q, &DocSetCollector)? {
                let doc: TantivyDocument = searcher.doc(addr)?;
                if let Some(e) = Entry::from_doc(&f, &doc) {
                    entries.insert((e.topic.clone(), e.seq), e);
                }
            }
        }
        for (topic, seq, change) in &batch.changes {
            entries
                .entry((topic.clone(), *seq))
                .or_insert_with(|| Entry::new(topic, *seq))
                .apply(change);
        }
        for (topic, low, hi) in &batch.removed_ranges {
            for ((t, seq), e) in entries.range_mut((topic.clone(), *low)..(topic.clone(), *hi)) {
                debug_assert!(t == topic && (*low..*hi).contains(seq));
                e.apply(&Change::Removed);
            }
            if hi - low <= MAX_TOMBSTONE_RANGE {
                for seq in *low..*hi {
                    entries
                        .entry((topic.clone(), seq))
                        .or_insert_with(|| Entry::new(topic, seq))
                        .apply(&Change::Removed);
                }
            }
        }
        for e in entries.values() {
            self.writer.delete_term(f.key_term(&e.topic, e.seq));
            self.writer.add_document(e.to_doc(&f))?;
        }
        Ok(entries.len())
    }
}
