//! The reading side of the index: a query becomes hits — only
//! `(topic, seq)` and the hit's place in the order — newest first, plus a
//! snippet maker for the caller's own rendering. What a hit *is* (its
//! current text, whether the caller may still see it) is decided by the
//! read path at query time, never by the index (seed 000 §6.6).
//!
//! Order: `(ts, seq, topic_hash)` descending, a total order over a
//! tenant's messages; the cursor is the key of the last hit examined, so a
//! page never repeats or skips a hit however many are added meanwhile.

use std::collections::HashMap;
use std::ops::Bound;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use base64::Engine;
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::{IndexRecordOption, Value};
use tantivy::snippet::SnippetGenerator;
use tantivy::{IndexReader, ReloadPolicy, SegmentReader, TantivyDocument, Term};

use super::entry::Fields;
use super::{open_index, tokenizer, SearchError};

/// Most terms of a query that are used (the rest are ignored).
pub const MAX_TERMS: usize = 16;
/// Most group topics one query filters on (a user in more groups searches
/// them with `topic=`).
pub const MAX_TOPICS: usize = 2_000;
/// Characters of a snippet.
pub const SNIPPET_CHARS: usize = 160;

/// A hit's place in the newest-first order: (send time ms, seq, topic hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub ts: i64,
    pub seq: i64,
    pub topic_hash: u64,
}

impl Cursor {
    /// Opaque text for clients.
    pub fn encode(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!(
            "s1.{}.{}.{:016x}",
            self.ts, self.seq, self.topic_hash
        ))
    }

    pub fn parse(text: &str) -> Option<Cursor> {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .ok()?;
        let raw = String::from_utf8(raw).ok()?;
        let mut parts = raw.strip_prefix("s1.")?.split('.');
        let c = Cursor {
            ts: parts.next()?.parse().ok()?,
            seq: parts.next()?.parse().ok()?,
            topic_hash: u64::from_str_radix(parts.next()?, 16).ok()?,
        };
        parts.next().is_none().then_some(c)
    }
}

/// Which conversations a query covers.
#[derive(Debug, Clone)]
pub enum Scope {
    /// One conversation (the caller's membership is checked by the caller).
    Topic(String),
    /// The groups the caller belongs to, and their one-to-one topics.
    Member { uid: i64, groups: Vec<String> },
}

/// One query.
#[derive(Debug, Clone)]
pub struct Request {
    pub text: String,
    pub scope: Scope,
    /// Epoch ms, inclusive.
    pub from: Option<i64>,
    /// Epoch ms, exclusive.
    pub to: Option<i64>,
    /// Hits strictly after this place in the order.
    pub after: Option<Cursor>,
    pub limit: usize,
}

/// One hit: only where the message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub topic: String,
    pub seq: i64,
    pub cursor: Cursor,
}

/// What a query found.
pub struct Found {
    pub hits: Vec<Hit>,
    /// Whether the index may hold more after the last hit.
    pub more: bool,
    snippets: Option<SnippetGenerator>,
}

impl Found {
    /// `text` with the query's terms highlighted (`<b>…</b>`, HTML-escaped),
    /// cut around the best fragment.
    pub fn snippet(&self, text: &str) -> String {
        match &self.snippets {
            Some(g) => {
                let s = g.snippet(text);
                if s.fragment().is_empty() {
                    plain_snippet(text)
                } else {
                    s.to_html()
                }
            }
            None => plain_snippet(text),
        }
    }
}

/// The start of `text`, HTML-escaped, nothing highlighted.
pub fn plain_snippet(text: &str) -> String {
    html_escape(&text.chars().take(SNIPPET_CHARS).collect::<String>())
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
}

/// One tenant's index, opened for reading; it follows the writer's commits
/// by itself (Tantivy watches the index's meta file).
struct TenantReader {
    reader: IndexReader,
    fields: Fields,
}

/// The indexes this process reads, opened on first use.
#[derive(Clone)]
pub struct Indexes {
    root: PathBuf,
    open: Arc<Mutex<HashMap<String, Arc<TenantReader>>>>,
}

impl Indexes {
    pub fn new(config: &crate::config::Config) -> Indexes {
        Indexes {
            root: PathBuf::from(&config.search.index_dir),
            open: Arc::default(),
        }
    }

    fn tenant(&self, tenant: &str) -> Result<Option<Arc<TenantReader>>, SearchError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = open.get(tenant) {
            return Ok(Some(r.clone()));
        }
        let dir = self.root.join(tenant);
        if !dir.join("meta.json").exists() {
            // Nothing indexed for this tenant yet.
            return Ok(None);
        }
        let (index, fields) = open_index(&dir, false)?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::OnCommitWithDelay)
            .try_into()?;
        let r = Arc::new(TenantReader { reader, fields });
        open.insert(tenant.to_string(), r.clone());
        Ok(Some(r))
    }

    /// Runs `request` over `tenant`'s index (blocking: call it off the
    /// async threads).
    pub fn search(&self, tenant: &str, request: &Request) -> Result<Found, SearchError> {
        let terms = tokenizer::terms(&request.text);
        if terms.is_empty() {
            return Err(SearchError::BadRequest(
                "q has no word to search for".into(),
            ));
        }
        let Some(t) = self.tenant(tenant)? else {
            return Ok(Found {
                hits: Vec::new(),
                more: false,
                snippets: None,
            });
        };
        let f = t.fields;
        let searcher = t.reader.searcher();
        let query = build(&f, &terms, request);
        let after = request.after;
        let ranked = TopDocs::with_limit(request.limit.max(1))
            .tweak_score(move |segment: &SegmentReader| order_key(segment, after));
        let found = searcher.search(&query, &ranked)?;
        let mut hits = Vec::with_capacity(found.len());
        for (key, addr) in found {
            let Some(cursor) = key else { continue };
            let doc: TantivyDocument = searcher.doc(addr)?;
            let Some(topic) = doc.get_first(f.topic).and_then(|v| v.as_str()) else {
                continue;
            };
            hits.push(Hit {
                topic: topic.to_string(),
                seq: cursor.seq,
                cursor,
            });
        }
        let more = hits.len() >= request.limit.max(1);
        let mut snippets = SnippetGenerator::create(&searcher, &query, f.body)?;
        snippets.set_max_num_chars(SNIPPET_CHARS);
        Ok(Found {
            hits,
            more,
            snippets: Some(snippets),
        })
    }
}

/// Every term in the body, within the scope and the time range, before
/// the cursor.
fn build(f: &Fields, terms: &[String], r: &Request) -> BooleanQuery {
    let mut must: Vec<(Occur, Box<dyn Query>)> = terms
        .iter()
        .take(MAX_TERMS)
        .map(|t| {
            (
                Occur::Must,
                Box::new(TermQuery::new(
                    Term::from_field_text(f.body, t),
                    IndexRecordOption::WithFreqs,
                )) as Box<dyn Query>,
            )
        })
        .collect();
    let topic = |t: &str| -> Box<dyn Query> {
        Box::new(TermQuery::new(
            Term::from_field_text(f.topic, t),
            IndexRecordOption::Basic,
        ))
    };
    match &r.scope {
        Scope::Topic(t) => must.push((Occur::Must, topic(t))),
        Scope::Member { uid, groups } => {
            let mut any: Vec<(Occur, Box<dyn Query>)> = groups
                .iter()
                .take(MAX_TOPICS)
                .map(|g| (Occur::Should, topic(g)))
                .collect();
            any.push((
                Occur::Should,
                Box::new(TermQuery::new(
                    Term::from_field_i64(f.p2p_user, *uid),
                    IndexRecordOption::Basic,
                )),
            ));
            must.push((Occur::Must, Box::new(BooleanQuery::new(any))));
        }
    }
    let low = r.from.unwrap_or(1).max(1);
    let high = match (r.to, r.after) {
        (Some(to), Some(c)) => Bound::Excluded(to.min(c.ts + 1)),
        (Some(to), None) => Bound::Excluded(to),
        (None, Some(c)) => Bound::Excluded(c.ts.saturating_add(1)),
        (None, None) => Bound::Unbounded,
    };
    must.push((
        Occur::Must,
        Box::new(RangeQuery::new(
            Bound::Included(Term::from_field_i64(f.ts, low)),
            high.map(|h| Term::from_field_i64(f.ts, h)),
        )),
    ));
    BooleanQuery::new(must)
}

/// The per-segment order key: `None` (last, then dropped) at or above the
/// cursor, or when the segment lacks the columns.
fn order_key(
    segment: &SegmentReader,
    after: Option<Cursor>,
) -> impl Fn(tantivy::DocId, tantivy::Score) -> Option<Cursor> + 'static {
    let ff = segment.fast_fields();
    let columns = match (ff.i64("ts"), ff.i64("seq"), ff.u64("topic_hash")) {
        (Ok(ts), Ok(seq), Ok(hash)) => Some((
            ts.first_or_default_col(0),
            seq.first_or_default_col(0),
            hash.first_or_default_col(0),
        )),
        _ => None,
    };
    move |doc, _score| {
        let (ts, seq, hash) = columns.as_ref()?;
        let key = Cursor {
            ts: ts.get_val(doc),
            seq: seq.get_val(doc),
            topic_hash: hash.get_val(doc),
        };
        match after {
            Some(c) if key >= c => None,
            _ => Some(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_garbage() {
        let c = Cursor {
            ts: 1_764_000_000_000,
            seq: 42,
            topic_hash: u64::MAX - 3,
        };
        assert_eq!(Cursor::parse(&c.encode()), Some(c));
        assert_eq!(Cursor::parse("nope"), None);
        assert_eq!(Cursor::parse(""), None);
        let extra = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("s1.1.2.3.4");
        assert_eq!(Cursor::parse(&extra), None);
    }
}
