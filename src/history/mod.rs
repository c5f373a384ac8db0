//! The read path (ARCHITECTURE.md §5, seed 000 §6): history pages, exact
//! messages, context and search across month tables. Order of sources:
//! hot messages when they cover the whole page, else the Redis route
//! (rebuilt from the MySQL mirror on a miss) and month tables one at a time
//! with `LIMIT` — or, for a month whose table was archived and dropped, its
//! archive (`crate::store::archive::reader`); user-view deletes
//! (`crate::store::dellog`) are filtered per reader.
//! Clients never see months.

pub mod hot;
pub mod legacy;
pub mod query;
pub mod route;

pub use query::{Page, PageQuery, DEFAULT_LIMIT, MAX_LIMIT};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::redis_util::Redis;
use sqlx::mysql::MySqlPool;

use crate::coalesce;
use crate::metrics as m;
use crate::store::archive::reader as archived;
use crate::store::catalog::{self, ShardStatus};
use crate::store::dellog;
use crate::store::message::StoredMessage;
use crate::store::month::{MonthTable, ShardMonth};
use crate::tenant::TenantPools;

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// An archived month whose archive could not be read (missing,
    /// damaged, or the object store unreachable).
    #[error("{0}")]
    Archive(#[from] archived::ArchiveReadError),
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("{0}")]
    Store(#[from] crate::store::writer::StoreError),
    #[error("unknown tenant")]
    Tenant,
    /// A failure of a fetch shared by coalesced readers (MySQL or Redis
    /// down): retryable, never the reader's fault.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// What coalesced readers get when the shared fetch failed (the original
/// error is not `Clone`); keeps client errors apart from server errors.
#[derive(Debug, Clone)]
enum SharedFailure {
    BadRequest(String),
    Archive(archived::ArchiveReadError),
    Tenant,
    Unavailable(String),
}

impl From<HistoryError> for SharedFailure {
    fn from(e: HistoryError) -> Self {
        match e {
            HistoryError::BadRequest(why) => SharedFailure::BadRequest(why),
            HistoryError::Archive(e) => SharedFailure::Archive(e),
            HistoryError::Tenant => SharedFailure::Tenant,
            other => SharedFailure::Unavailable(other.to_string()),
        }
    }
}

impl From<SharedFailure> for HistoryError {
    fn from(e: SharedFailure) -> Self {
        match e {
            SharedFailure::BadRequest(why) => HistoryError::BadRequest(why),
            SharedFailure::Archive(e) => HistoryError::Archive(e),
            SharedFailure::Tenant => HistoryError::Tenant,
            SharedFailure::Unavailable(why) => HistoryError::Unavailable(why),
        }
    }
}

/// A page as fetched, with the topic's dellog token when the fetch read
/// it in the same round trip (newest-first pages, `hot::read`).
#[derive(Clone)]
struct Fetched {
    page: Page,
    dellog_token: Option<Option<String>>,
}

/// The read side of one process.
#[derive(Clone)]
pub struct History {
    pools: TenantPools,
    redis: Redis,
    coalescer: coalesce::Coalescer<(String, String, PageQuery), Result<Fetched, SharedFailure>>,
    /// Pages actually fetched (hot or MySQL), after coalescing.
    fetches: Arc<AtomicU64>,
    /// Per-tenant switch: also read the legacy table (migration in progress).
    dual_read: legacy::DualRead,
    /// Readers' deleted ranges between their pages.
    dellog: Arc<dellog::Cache>,
    /// Archived months: their manifests, indexes and decoded blocks.
    archives: Arc<archived::Archives>,
}

/// Refetches one read may do to fill a page the reader's deletes thinned.
const MAX_REFILLS: usize = 16;

impl History {
    pub fn new(pools: TenantPools, redis: Redis) -> Self {
        Self {
            pools,
            redis,
            coalescer: coalesce::Coalescer::default(),
            fetches: Arc::new(AtomicU64::new(0)),
            dual_read: legacy::DualRead::default(),
            dellog: Arc::default(),
            archives: Arc::new(archived::Archives::unconfigured()),
        }
    }

    /// Reads archived months through `archives` (a process builds one from
    /// `shards` in its config: [`archived::Archives::from_config`]).
    pub fn with_archives(mut self, archives: archived::Archives) -> Self {
        self.archives = Arc::new(archives);
        self
    }

    /// How many pages this instance (and its clones) really fetched; reads
    /// served by a coalesced in-flight fetch do not count.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    fn pool(&self, tenant: &str) -> Result<&MySqlPool, HistoryError> {
        self.pools.get(tenant).map_err(|_| HistoryError::Tenant)
    }

    /// The process's cache of readers' deleted ranges (also behind the
    /// chat list's unread counts).
    pub fn dellog_cache(&self) -> &dellog::Cache {
        &self.dellog
    }

    /// The ranges hidden from `reader` in `topic` (their deletes and
    /// everyone's), from the process's cache while it is current.
    pub async fn hidden(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
    ) -> Result<dellog::Hidden, HistoryError> {
        let mut redis = self.redis.clone();
        Ok(self
            .dellog
            .ranges_for(self.pool(tenant)?, &mut redis, tenant, topic, reader)
            .await?)
    }

    /// One page for `reader`, with the reader's deleted ranges filtered.
    /// Identical concurrent reads share one fetch. When the reader's deletes
    /// thin a full page, the page is filled from further back (skipping
    /// whole deleted ranges), as Tinode's `LEFT JOIN dellog … LIMIT n` does:
    /// a short page means there is nothing more.
    pub async fn page(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        query: PageQuery,
    ) -> Result<Page, HistoryError> {
        let (first, deleted) = if query.ascending {
            // The page and the reader's deleted ranges are independent
            // reads: one round trip's wait instead of two in a row.
            let (first, deleted) = tokio::join!(
                self.shared_page(tenant, topic, query),
                self.hidden(tenant, topic, reader)
            );
            (first?.page, deleted?)
        } else {
            // A newest-first fetch reads the dellog token with the route
            // and the hot messages (one round trip): the reader's ranges
            // then come from the process's cache while it is current.
            let fetched = self.shared_page(tenant, topic, query).await?;
            let deleted = match fetched.dellog_token {
                Some(token) => self.hidden_under(tenant, topic, reader, token).await?,
                None => self.hidden(tenant, topic, reader).await?,
            };
            (fetched.page, deleted)
        };
        // Recalled and deleted rows stay as stubs; their dellog rows hide
        // them, and so does their status while the dellog catches up. An
        // edit (a replacement message) goes with the message it edits: a
        // recall or delete of the original takes its later texts too.
        if deleted.is_empty() && first.messages.iter().all(StoredMessage::visible) {
            return Ok(first);
        }
        let mut out = Page {
            messages: Vec::with_capacity(query.limit as usize),
            next: None,
            source: first.source,
        };
        let mut fetched = first;
        let mut cursor = query;
        for _ in 0..MAX_REFILLS {
            let full = fetched.messages.len() as i64 >= cursor.limit;
            out.next = fetched.next.or(out.next);
            out.source = fetched.source;
            let gone: Vec<i64> = fetched
                .messages
                .iter()
                .filter(|m| !m.visible())
                .map(|m| m.seq)
                .collect();
            out.messages
                .extend(fetched.messages.into_iter().filter(|m| {
                    m.visible()
                        && !dellog::covers(&deleted, m.seq)
                        && !m
                            .replaces()
                            .is_some_and(|t| dellog::covers(&deleted, t) || gone.contains(&t))
                }));
            let missing = query.limit - out.messages.len() as i64;
            let Some(edge) = out.next else { break };
            if !full || missing <= 0 {
                break;
            }
            if cursor.ascending {
                cursor.since = Some(edge + 1);
            } else {
                cursor.before = Some(edge);
            }
            cursor.limit = missing;
            skip_deleted(&mut cursor, &deleted);
            if cursor.low() >= cursor.high() {
                break;
            }
            fetched = self.shared_page(tenant, topic, cursor).await?.page;
        }
        Ok(out)
    }

    /// The ranges hidden from `reader`, given the topic's dellog token as
    /// just read (cache, else MySQL, read after the token).
    async fn hidden_under(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        token: Option<String>,
    ) -> Result<dellog::Hidden, HistoryError> {
        if let Some(hidden) = self.dellog.cached(tenant, topic, reader, token.as_deref()) {
            return Ok(hidden);
        }
        let hidden = dellog::ranges_for(self.pool(tenant)?, topic, reader).await?;
        self.dellog
            .insert(tenant, topic, reader, token, hidden.clone());
        Ok(hidden)
    }

    /// A page without per-reader filtering, shared by identical concurrent reads.
    async fn shared_page(
        &self,
        tenant: &str,
        topic: &str,
        query: PageQuery,
    ) -> Result<Fetched, HistoryError> {
        let key = (tenant.to_string(), topic.to_string(), query);
        let this = self.clone();
        let (t, tp) = (tenant.to_string(), topic.to_string());
        let shared = self
            .coalescer
            .run(key, async move {
                this.fetch(&t, &tp, query)
                    .await
                    .map_err(SharedFailure::from)
            })
            .await;
        shared.map_err(HistoryError::from)
    }

    /// A page without per-reader filtering (shared by coalesced readers).
    pub async fn fetch_page(
        &self,
        tenant: &str,
        topic: &str,
        query: PageQuery,
    ) -> Result<Page, HistoryError> {
        Ok(self.fetch(tenant, topic, query).await?.page)
    }

    /// [`Self::fetch_page`], with the dellog token when it was read along.
    async fn fetch(
        &self,
        tenant: &str,
        topic: &str,
        query: PageQuery,
    ) -> Result<Fetched, HistoryError> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::HISTORY_FETCHES_TOTAL).increment(1);
        let started = Instant::now();
        let mut redis = self.redis.clone();
        // Routes (rebuilt into Redis from the mirror on a miss) come from
        // the primary: a replica's lag must never be cached. Month tables
        // may come from a read replica within its lag bound.
        let pool = self.pool(tenant)?;
        let rows_from = if query.primary {
            pool
        } else {
            self.pools.read(tenant).map_err(|_| HistoryError::Tenant)?
        };
        // A newest-first page reads the route, the dellog token and the hot
        // messages in one round trip (`lua/hot_page.lua`); a route not yet
        // marked complete is completed from the mirror first.
        let hot = if query.ascending {
            None
        } else {
            Some(hot::read(&mut redis, tenant, topic, &query).await?)
        };
        let segments = match hot
            .as_ref()
            .and_then(|h| route::complete_segments(&h.route_meta))
        {
            Some(segments) => segments,
            None => route::segments(pool, &mut redis, tenant, topic).await?,
        };
        let dellog_token = hot.as_ref().map(|h| h.dellog_token.clone());
        if let Some(hot) = &hot {
            // The newest stored seq, so a latest page from the hot set is
            // known to start at the top (a lost newest entry is a hole too).
            let newest = segments.iter().map(|s| s.max_seq).max();
            if let Some(messages) = hot.page(&query, newest) {
                metrics::histogram!(m::QUERY_LATENCY, "source" => "hot")
                    .record(started.elapsed().as_secs_f64());
                let next = messages.last().map(|m| m.seq);
                return Ok(Fetched {
                    page: Page {
                        messages,
                        next,
                        source: "hot",
                    },
                    dellog_token,
                });
            }
        }
        let (low, high) = (query.low(), query.high());
        let mut wanted: Vec<&route::Segment> = segments
            .iter()
            .filter(|s| s.min_seq < high && s.max_seq >= low)
            .collect();
        if !query.ascending {
            wanted.reverse();
        }
        let mut messages: Vec<StoredMessage> = Vec::with_capacity(query.limit as usize);
        let (mut tables, mut archived) = (0u32, 0u32);
        for seg in wanted {
            let missing = query.limit - messages.len() as i64;
            if missing <= 0 {
                break;
            }
            let Some(source) = month_source(rows_from, seg.month, topic).await? else {
                continue;
            };
            tables += 1;
            let (from, below) = if query.ascending {
                (messages.last().map_or(low, |m| m.seq + 1), high)
            } else {
                (low, messages.last().map_or(high, |m| m.seq))
            };
            let rows = match source {
                MonthSource::Table(table) if query.ascending => {
                    read_rows(
                        rows_from,
                        &table.page_asc_sql(),
                        topic,
                        from,
                        below,
                        missing,
                    )
                    .await?
                }
                MonthSource::Table(table) => {
                    read_rows_desc(
                        rows_from,
                        &table.page_desc_sql(),
                        topic,
                        below,
                        from,
                        missing,
                    )
                    .await?
                }
                MonthSource::Archive(month) => {
                    archived += 1;
                    self.archives
                        .page(tenant, month, topic, from, below, missing, query.ascending)
                        .await?
                }
            };
            messages.extend(rows);
        }
        metrics::histogram!(m::QUERY_TABLES).record(tables as f64);
        let mut source = if archived > 0 {
            "archive"
        } else if tables > 1 {
            "cross_month"
        } else {
            "single_month"
        };
        if self.dual_read.enabled(pool, tenant).await? {
            let old = legacy::page(pool, topic, &query).await?;
            if !old.is_empty() {
                messages = legacy::merge(messages, old, &query);
                source = "dual_read";
            }
        }
        metrics::histogram!(m::QUERY_LATENCY, "source" => source)
            .record(started.elapsed().as_secs_f64());
        let next = messages.last().map(|m| m.seq);
        Ok(Fetched {
            page: Page {
                messages,
                next,
                source,
            },
            dellog_token,
        })
    }

    /// One message by seq, if stored (and not deleted for this reader).
    pub async fn exact(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        seq: i64,
    ) -> Result<Option<StoredMessage>, HistoryError> {
        match PageQuery::just(seq)? {
            Some(q) => self.exact_as(tenant, topic, reader, q).await,
            None => Ok(None),
        }
    }

    /// [`History::exact`] from the tenant's primary, never a replica: for
    /// checks that must see a message sent a moment ago.
    pub async fn exact_on_primary(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        seq: i64,
    ) -> Result<Option<StoredMessage>, HistoryError> {
        match PageQuery::just(seq)? {
            Some(q) => self.exact_as(tenant, topic, reader, q.on_primary()).await,
            None => Ok(None),
        }
    }

    async fn exact_as(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        q: PageQuery,
    ) -> Result<Option<StoredMessage>, HistoryError> {
        Ok(self
            .page(tenant, topic, reader, q)
            .await?
            .messages
            .into_iter()
            .next())
    }

    /// One message by `(topic, seq)` as stored, whatever month holds it —
    /// a live month's table or an archived month's archive — without any
    /// reader's deletes applied (a recalled or deleted message comes back
    /// with its status). For references that store only `(topic, seq)`
    /// (search hits, favorites, reports): check the caller's access and
    /// [`History::hidden`] ranges yourself, or use [`History::exact`].
    pub async fn message(
        &self,
        tenant: &str,
        topic: &str,
        seq: i64,
    ) -> Result<Option<StoredMessage>, HistoryError> {
        let Some(q) = PageQuery::just(seq)? else {
            return Ok(None);
        };
        Ok(self
            .shared_page(tenant, topic, q)
            .await?
            .page
            .messages
            .into_iter()
            .find(|m| m.seq == seq))
    }

    /// Message `seq` as stored, one taken back included (its stub, without
    /// content), unless `reader` cleared it from their own view: what a
    /// reference to a message (a favorite, a report, a file) resolves to.
    /// `reader` 0 reads as no user.
    pub async fn stored(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        seq: i64,
    ) -> Result<Option<StoredMessage>, HistoryError> {
        let Some(m) = self.message(tenant, topic, seq).await? else {
            return Ok(None);
        };
        // A recall or delete for everyone sits in the dellog too: its stub
        // is shown as what it is; a readable message the reader cleared is
        // gone for them.
        if m.visible() && dellog::covers(&self.hidden(tenant, topic, reader).await?, seq) {
            return Ok(None);
        }
        Ok(Some(m))
    }

    /// Up to `n` messages before and after `seq` (and `seq` itself), oldest first.
    pub async fn context(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        seq: i64,
        n: i64,
    ) -> Result<Vec<StoredMessage>, HistoryError> {
        let before = self
            .page(
                tenant,
                topic,
                reader,
                PageQuery::new(None, Some(seq), Some(n), false)?,
            )
            .await?;
        let after = self
            .page(
                tenant,
                topic,
                reader,
                PageQuery::new(Some(seq), None, Some((n + 1).min(MAX_LIMIT)), true)?,
            )
            .await?;
        let mut after = after.messages;
        if after.first().map(|m| m.seq) != Some(seq) {
            // The target itself is hidden from this reader (or missing):
            // still at most `n` after it.
            after.truncate(n as usize);
        }
        let mut all: Vec<StoredMessage> = before.messages.into_iter().rev().chain(after).collect();
        all.dedup_by_key(|m| m.seq);
        Ok(all)
    }

    /// Messages containing `text` between `from` and `to` (epoch ms; at most
    /// about three months), newest first, month by month.
    pub async fn search(
        &self,
        tenant: &str,
        topic: &str,
        reader: i64,
        text: &str,
        from: i64,
        to: i64,
        limit: i64,
    ) -> Result<Vec<StoredMessage>, HistoryError> {
        if to <= from {
            return Err(HistoryError::BadRequest("to must be after from".into()));
        }
        let first = ShardMonth::of_millis(from);
        let last = ShardMonth::of_millis(to - 1);
        let mut months = vec![last];
        while *months.last().expect("one") > first {
            let prev = months.last().expect("one").prev();
            months.push(prev);
            if months.len() > 3 {
                return Err(HistoryError::BadRequest(
                    "search covers at most 3 months".into(),
                ));
            }
        }
        if !(1..=MAX_LIMIT).contains(&limit) || text.is_empty() || text.len() > 200 {
            return Err(HistoryError::BadRequest(
                "q must be 1-200 characters and limit 1-100".into(),
            ));
        }
        let pool = self.pool(tenant)?;
        let pattern = format!(
            "%{}%",
            text.replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_")
        );
        let deleted = dellog::ranges_for(pool, topic, reader).await?;
        // The scan itself may run on a read replica that keeps up.
        let rows_from = self.pools.read(tenant).map_err(|_| HistoryError::Tenant)?;
        let mut out = Vec::new();
        for month in months {
            let Some(source) = month_source(rows_from, month, topic).await? else {
                continue;
            };
            let table = match source {
                MonthSource::Table(table) => table,
                MonthSource::Archive(month) => {
                    // As the table's query: up to the missing count of
                    // matches, newest first, then the reader's deletes. The
                    // match is a case-insensitive substring (the table's
                    // LIKE under a `_ci` collation also ignores accents).
                    let needle = text.to_lowercase();
                    let missing = (limit - out.len() as i64) as usize;
                    let hits: Vec<StoredMessage> = self
                        .archives
                        .topic_messages(tenant, month, topic)
                        .await?
                        .into_iter()
                        .filter(|msg| {
                            msg.visible()
                                && msg.ts >= from
                                && msg.ts < to
                                && msg
                                    .content
                                    .as_deref()
                                    .is_some_and(|c| c.to_lowercase().contains(&needle))
                        })
                        .take(missing)
                        .collect();
                    out.extend(
                        hits.into_iter()
                            .filter(|msg| !dellog::covers(&deleted, msg.seq)),
                    );
                    if out.len() as i64 >= limit {
                        break;
                    }
                    continue;
                }
            };
            let rows = sqlx::query(&table.search_sql())
                .bind(topic)
                .bind(crate::store::writer::naive(from))
                .bind(crate::store::writer::naive(to))
                .bind(&pattern)
                .bind(limit - out.len() as i64)
                .fetch_all(rows_from)
                .await?;
            for r in rows {
                let msg = StoredMessage::from_row(&r)?;
                if !dellog::covers(&deleted, msg.seq) {
                    out.push(msg);
                }
            }
            if out.len() as i64 >= limit {
                break;
            }
        }
        Ok(out)
    }
}

/// Moves a page cursor out of the reader's deleted ranges: a descending
/// cursor below a range ending at it, an ascending one past it (the ranges
/// are merged, so one step is enough).
fn skip_deleted(q: &mut PageQuery, deleted: &dellog::Hidden) {
    if q.ascending {
        if let Some((_, hi)) = deleted.range_of(q.low()) {
            q.since = Some(hi);
        }
    } else {
        let top = q.high();
        if top != i64::MAX {
            if let Some((lo, _)) = deleted.range_of(top - 1) {
                q.before = Some(lo);
            }
        }
    }
}

/// Where a month's rows are read from.
enum MonthSource {
    /// The month's table (of the topic's family).
    Table(MonthTable),
    /// The month was archived and its table dropped: its archive.
    Archive(ShardMonth),
}

/// The month's table if the catalog knows it, or its archive once it is
/// archived; `None` for a month the catalog does not know, or one the
/// legacy copy is bulk-loading (`loading`: incomplete and without its
/// indexes; dual read serves its rows from the legacy table).
async fn month_source(
    pool: &MySqlPool,
    month: ShardMonth,
    topic: &str,
) -> Result<Option<MonthSource>, HistoryError> {
    match catalog::table(pool, month).await? {
        Some((_, ShardStatus::Archived)) => Ok(Some(MonthSource::Archive(month))),
        Some((_, ShardStatus::Loading)) => Ok(None),
        Some((table, _)) => Ok(Some(MonthSource::Table(table.for_topic(topic)))),
        None => Ok(None),
    }
}

async fn read_rows(
    pool: &MySqlPool,
    sql: &str,
    topic: &str,
    a: i64,
    b: i64,
    limit: i64,
) -> Result<Vec<StoredMessage>, HistoryError> {
    let rows = sqlx::query(sql)
        .bind(topic)
        .bind(a)
        .bind(b)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| StoredMessage::from_row(r).map_err(HistoryError::from))
        .collect()
}

async fn read_rows_desc(
    pool: &MySqlPool,
    sql: &str,
    topic: &str,
    below: i64,
    low: i64,
    limit: i64,
) -> Result<Vec<StoredMessage>, HistoryError> {
    read_rows(pool, sql, topic, below, low, limit).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_skip_whole_deleted_ranges() {
        let deleted = dellog::Hidden::new(vec![(50, 71), (40, 50), (80, 81)]);
        let mut q = PageQuery::new(None, Some(71), Some(10), false).unwrap();
        skip_deleted(&mut q, &deleted);
        assert_eq!(q.before, Some(40), "chained ranges below the cursor");
        let mut q = PageQuery::new(None, Some(80), Some(10), false).unwrap();
        skip_deleted(&mut q, &deleted);
        assert_eq!(q.before, Some(80), "seq 79 is visible");
        let mut q = PageQuery::new(Some(45), None, Some(10), true).unwrap();
        skip_deleted(&mut q, &deleted);
        assert_eq!(q.since, Some(71));
        let mut q = PageQuery::new(None, None, Some(10), false).unwrap();
        skip_deleted(&mut q, &deleted);
        assert_eq!(q.before, None, "no cursor, nothing to skip");
    }
}
