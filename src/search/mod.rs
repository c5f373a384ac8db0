//! Message search from its own index (seed 000 §6.6: "build an independent
//! search index from Kafka; results return only topic + seq; the server
//! fetches the month tables and re-checks ACL").
//!
//! - [`tokenizer`] — jieba for Chinese, whole Latin words and numbers.
//! - [`entry`] — one message's state in the index and how events merge
//!   into it (order-free, idempotent).
//! - [`writer`] — a tenant's index opened for writing: read, merge,
//!   delete-then-add, one commit per batch. The search pipeline
//!   (`crate::pipeline::search`) is its only user.
//! - [`query`] — the reading side: a query becomes `(topic, seq)` hits,
//!   newest first, with an opaque cursor; the gateway resolves each hit
//!   through the normal read path.
//!
//! Layout on disk: `<search.index_dir>/<tenant>/`, one Tantivy index per
//! tenant.

pub mod entry;
pub mod query;
pub mod tokenizer;
pub mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tantivy::collector::DocSetCollector;
use tantivy::directory::MmapDirectory;
use tantivy::query::AllQuery;
use tantivy::{Index, TantivyDocument};

use crate::config::Config;

use entry::{Entry, Fields};

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The index could not be read or written (disk, lock, corruption):
    /// the pipeline retries it as an outage; a query answers 503.
    #[error("search index: {0}")]
    Index(#[from] tantivy::TantivyError),
    #[error("search index directory: {0}")]
    Directory(#[from] tantivy::directory::error::OpenDirectoryError),
    #[error("search index directory: {0}")]
    Io(#[from] std::io::Error),
    /// The client's query is unusable.
    #[error("{0}")]
    BadRequest(String),
}

impl SearchError {
    /// Whether trying again later may succeed (everything but bad input).
    pub fn retryable(&self) -> bool {
        !matches!(self, SearchError::BadRequest(_))
    }
}

/// `<search.index_dir>/<tenant>/`.
pub fn tenant_dir(config: &Config, tenant: &str) -> PathBuf {
    Path::new(&config.search.index_dir).join(tenant)
}

/// Opens the index in `dir` with this build's schema and tokenizer;
/// `create` makes the folder and an empty index when there is none.
pub fn open_index(dir: &Path, create: bool) -> Result<(Index, Fields), SearchError> {
    let (schema, fields) = Fields::schema();
    if create {
        std::fs::create_dir_all(dir)?;
    }
    let index = Index::open_or_create(MmapDirectory::open(dir)?, schema)?;
    index
        .tokenizers()
        .register(tokenizer::NAME, tokenizer::ChatTokenizer::default());
    Ok((index, fields))
}

/// Every entry of a tenant's index (searchable or not), in (topic, seq)
/// order; an index that does not exist is empty. For replay verification
/// and tests.
pub fn entries(dir: &Path) -> Result<Vec<Entry>, SearchError> {
    if !dir.join("meta.json").exists() {
        return Ok(Vec::new());
    }
    let (index, fields) = open_index(dir, false)?;
    let searcher = index.reader()?.searcher();
    let mut out = Vec::new();
    for addr in searcher.search(&AllQuery, &DocSetCollector)? {
        let doc: TantivyDocument = searcher.doc(addr)?;
        if let Some(e) = Entry::from_doc(&fields, &doc) {
            out.push(e);
        }
    }
    out.sort_by(|a, b| (&a.topic, a.seq).cmp(&(&b.topic, b.seq)));
    Ok(out)
}

/// The searchable messages of a tenant's index per topic: `(seq, text)`,
/// summarised as the replay's verification compares them.
pub fn summaries(dir: &Path) -> Result<BTreeMap<String, crate::digest::Summary>, SearchError> {
    let mut digests = crate::digest::Digests::default();
    for e in entries(dir)? {
        if let Some(text) = e.text() {
            let from = e.sent.as_ref().map_or(0, |s| s.from);
            digests.add_row(&e.topic, e.seq, from, Some(text), "normal", 0);
        }
    }
    Ok(digests.finish())
}
