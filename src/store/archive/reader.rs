//! Reads of archived months (seed 000 §10: "archived: moved to object
//! storage; online queries go through the archive service"). A month whose
//! table was dropped after `imstream shards archive` is read from its
//! archive (`crate::store::archive`): the manifest, the per-topic seq index
//! and the data object's header are loaded once per month and kept; a page
//! fetches only the blocks holding its seqs, by range GET, each checked
//! against its SHA-256 in the index before it is decoded; decoded blocks
//! stay in a cache bounded by `shards.archive_cache_mb`.
//!
//! A missing or damaged object is an error naming the month, never a
//! partial or wrong answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::metrics as m;
use crate::store::archive::{
    self, format, ArchiveIndex, ArchiveLocation, DATA_OBJECT, INDEX_OBJECT,
};
use crate::store::month::ShardMonth;

use crate::store::message::StoredMessage;

/// Why an archived month could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ArchiveReadError {
    /// An object of the archive is not there (or no archive location is
    /// configured): not retryable, an operator must restore it.
    #[error("archive of month {month} is missing: {detail}")]
    Missing { month: ShardMonth, detail: String },
    /// An object is there but fails its length or SHA-256 check, or does
    /// not decode: not retryable.
    #[error("archive of month {month} is damaged: {detail}")]
    Damaged { month: ShardMonth, detail: String },
    /// The object store did not answer: retryable.
    #[error("archive of month {month} is unreachable: {detail}")]
    Unreachable { month: ShardMonth, detail: String },
}

impl ArchiveReadError {
    pub fn month(&self) -> ShardMonth {
        match self {
            ArchiveReadError::Missing { month, .. }
            | ArchiveReadError::Damaged { month, .. }
            | ArchiveReadError::Unreachable { month, .. } => *month,
        }
    }

    /// Whether trying again later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, ArchiveReadError::Unreachable { .. })
    }
}

/// What a reader keeps of one archived month.
struct MonthArchive {
    index: ArchiveIndex,
    /// The data object's Avro header, put in front of each block to decode it.
    header: Bytes,
}

/// One decoded block: `(topic, message)` in `(topic, seq)` order.
type Block = Arc<Vec<(String, StoredMessage)>>;

type BlockKey = (String, ShardMonth, u32);

/// Decoded blocks, least recently used evicted first, bounded in bytes.
#[derive(Default)]
struct BlockCache {
    entries: HashMap<BlockKey, (Block, usize, u64)>,
    bytes: usize,
    tick: u64,
}

impl BlockCache {
    fn get(&mut self, key: &BlockKey) -> Option<Block> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|(block, _, used)| {
            *used = tick;
            block.clone()
        })
    }

    fn insert(&mut self, key: BlockKey, block: Block, cost: usize, budget: usize) {
        self.tick += 1;
        if let Some((_, old, _)) = self.entries.insert(key, (block, cost, self.tick)) {
            self.bytes -= old;
        }
        self.bytes += cost;
        while self.bytes > budget && self.entries.len() > 1 {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, _, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((_, c, _)) = self.entries.remove(&oldest) {
                self.bytes -= c;
            }
        }
    }
}

/// The archive reader of one process (shared by its `History` clones).
pub struct Archives {
    location: Result<ArchiveLocation, String>,
    months: Mutex<HashMap<(String, ShardMonth), Arc<MonthArchive>>>,
    blocks: Mutex<BlockCache>,
    cache_bytes: usize,
}

impl Archives {
    pub fn new(location: Result<ArchiveLocation, String>, cache_bytes: usize) -> Archives {
        Archives {
            location,
            months: Mutex::default(),
            blocks: Mutex::default(),
            cache_bytes,
        }
    }

    /// The location and cache size of `shards` in the config. A location
    /// that does not parse is reported on the first read of an archived
    /// month (reads of live months do not need it).
    pub fn from_config(shards: &crate::config::ShardsConfig) -> Archives {
        let location = ArchiveLocation::from_config(shards).map_err(|e| e.to_string());
        if let Err(e) = &location {
            tracing::warn!(error = %e, "archived months cannot be read");
        }
        Archives::new(location, (shards.archive_cache_mb as usize) << 20)
    }

    /// A reader with no archive location: archived months are missing.
    pub fn unconfigured() -> Archives {
        Archives::new(Err("no archive location is configured".into()), 0)
    }

    /// `topic`'s messages of the archived `month` with `low <= seq < high`,
    /// oldest first (or newest first), at most `limit`: what the month's
    /// table answered before it was dropped.
    #[allow(clippy::too_many_arguments)]
    pub async fn page(
        &self,
        tenant: &str,
        month: ShardMonth,
        topic: &str,
        low: i64,
        high: i64,
        limit: i64,
        ascending: bool,
    ) -> Result<Vec<StoredMessage>, ArchiveReadError> {
        let archive = self.month(tenant, month).await?;
        let Some(blocks) = archive.index.topics.get(topic) else {
            return Ok(Vec::new());
        };
        let mut wanted: Vec<u32> = blocks
            .iter()
            .filter(|b| b.last_seq >= low && b.first_seq < high)
            .map(|b| b.block)
            .collect();
        if !ascending {
            wanted.reverse();
        }
        let mut out = Vec::new();
        for b in wanted {
            let rows = self.block(tenant, month, &archive, b).await?;
            let hits = rows
                .iter()
                .filter(|(t, msg)| t == topic && msg.seq >= low && msg.seq < high)
                .map(|(_, msg)| msg);
            let missing = (limit - out.len() as i64).max(0) as usize;
            if ascending {
                out.extend(hits.take(missing).cloned());
            } else {
                out.extend(hits.rev().take(missing).cloned());
            }
            if out.len() as i64 >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Every message of `topic` in the archived `month`, newest first.
    pub async fn topic_messages(
        &self,
        tenant: &str,
        month: ShardMonth,
        topic: &str,
    ) -> Result<Vec<StoredMessage>, ArchiveReadError> {
        self.page(tenant, month, topic, i64::MIN, i64::MAX, i64::MAX, false)
            .await
    }

    /// The month's manifest, index and header, loaded once.
    async fn month(
        &self,
        tenant: &str,
        month: ShardMonth,
    ) -> Result<Arc<MonthArchive>, ArchiveReadError> {
        let key = (tenant.to_string(), month);
        if let Some(found) = self.months.lock().expect("months lock").get(&key) {
            return Ok(found.clone());
        }
        let loaded = Arc::new(self.load(tenant, month).await?);
        self.months
            .lock()
            .expect("months lock")
            .insert(key, loaded.clone());
        Ok(loaded)
    }

    async fn load(
        &self,
        tenant: &str,
        month: ShardMonth,
    ) -> Result<MonthArchive, ArchiveReadError> {
        let location = self
            .location
            .as_ref()
            .map_err(|why| ArchiveReadError::Missing {
                month,
                detail: why.clone(),
            })?;
        let damaged = |detail: String| ArchiveReadError::Damaged { month, detail };
        let manifest = match archive::read_manifest(location, tenant, month).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                return Err(ArchiveReadError::Missing {
                    month,
                    detail: format!(
                        "no {} at {}",
                        format::MANIFEST_OBJECT,
                        location.month_shown(tenant, month)
                    ),
                })
            }
            Err(archive::ArchiveError::Store { source, .. }) => {
                return Err(store_error(
                    month,
                    location,
                    tenant,
                    format::MANIFEST_OBJECT,
                    source,
                ))
            }
            Err(other) => return Err(damaged(other.to_string())),
        };
        let listed = |name: &str| {
            manifest
                .object(name)
                .cloned()
                .ok_or_else(|| damaged(format!("the manifest lists no {name}")))
        };
        let (data_ref, index_ref) = (listed(DATA_OBJECT)?, listed(INDEX_OBJECT)?);
        let index_bytes = location
            .store()
            .get(&location.object(tenant, month, INDEX_OBJECT))
            .await;
        let index_bytes = match index_bytes {
            Ok(got) => got.bytes().await,
            Err(e) => Err(e),
        }
        .map_err(|e| store_error(month, location, tenant, INDEX_OBJECT, e))?;
        archive::check_object(&index_ref, &index_bytes).map_err(damaged)?;
        let index: ArchiveIndex = serde_json::from_slice(&index_bytes)
            .map_err(|e| damaged(format!("{INDEX_OBJECT}: {e}")))?;
        if index.header_len > data_ref.bytes {
            return Err(damaged(format!(
                "{INDEX_OBJECT} puts the header past the end of {DATA_OBJECT}"
            )));
        }
        let header = self
            .range(location, tenant, month, 0, index.header_len)
            .await?;
        if format::sha256_hex(&header) != index.header_sha256 {
            return Err(damaged(format!(
                "the header of {DATA_OBJECT} fails its SHA-256 check"
            )));
        }
        Ok(MonthArchive { index, header })
    }

    /// `len` bytes of the data object from `offset`, exactly.
    async fn range(
        &self,
        location: &ArchiveLocation,
        tenant: &str,
        month: ShardMonth,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, ArchiveReadError> {
        let path = location.object(tenant, month, DATA_OBJECT);
        let bytes = location
            .store()
            .get_range(&path, offset..offset + len)
            .await
            .map_err(|e| store_error(month, location, tenant, DATA_OBJECT, e))?;
        metrics::counter!(m::ARCHIVE_READ_BYTES_TOTAL).increment(bytes.len() as u64);
        if bytes.len() as u64 != len {
            return Err(ArchiveReadError::Damaged {
                month,
                detail: format!(
                    "{DATA_OBJECT} gave {} byte(s) at {offset}, the index says {len}",
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }

    /// One block, from the cache or fetched, checked and decoded.
    async fn block(
        &self,
        tenant: &str,
        month: ShardMonth,
        archive: &MonthArchive,
        block: u32,
    ) -> Result<Block, ArchiveReadError> {
        let key = (tenant.to_string(), month, block);
        if let Some(found) = self.blocks.lock().expect("block cache lock").get(&key) {
            metrics::counter!(m::ARCHIVE_BLOCKS_TOTAL, "source" => "cache").increment(1);
            return Ok(found);
        }
        metrics::counter!(m::ARCHIVE_BLOCKS_TOTAL, "source" => "store").increment(1);
        let damaged = |detail: String| ArchiveReadError::Damaged { month, detail };
        let location = self
            .location
            .as_ref()
            .map_err(|why| ArchiveReadError::Missing {
                month,
                detail: why.clone(),
            })?;
        let meta = archive.index.blocks.get(block as usize).ok_or_else(|| {
            damaged(format!(
                "{INDEX_OBJECT} names block {block}, which it does not list"
            ))
        })?;
        let bytes = self
            .range(location, tenant, month, meta.offset, meta.len)
            .await?;
        if format::sha256_hex(&bytes) != meta.sha256 {
            return Err(damaged(format!(
                "block {block} of {DATA_OBJECT} (bytes {}..{}) fails its SHA-256 check",
                meta.offset,
                meta.offset + meta.len
            )));
        }
        let rows = format::decode_block(&archive.header, &bytes)
            .map_err(|e| damaged(format!("block {block} of {DATA_OBJECT}: {e}")))?;
        if rows.len() != meta.rows as usize {
            return Err(damaged(format!(
                "block {block} of {DATA_OBJECT} holds {} row(s), the index says {}",
                rows.len(),
                meta.rows
            )));
        }
        let mut cost = 64;
        let decoded: Vec<(String, StoredMessage)> = rows
            .into_iter()
            .map(|r| {
                let msg = r.to_message();
                cost += 160
                    + r.topic.len()
                    + msg.head.as_ref().map_or(0, String::len)
                    + msg.content.as_ref().map_or(0, String::len);
                (r.topic, msg)
            })
            .collect();
        let decoded = Arc::new(decoded);
        self.blocks.lock().expect("block cache lock").insert(
            key,
            decoded.clone(),
            cost,
            self.cache_bytes,
        );
        Ok(decoded)
    }
}

/// An object store failure as a read error: not found is missing, the rest
/// unreachable.
fn store_error(
    month: ShardMonth,
    location: &ArchiveLocation,
    tenant: &str,
    name: &str,
    e: object_store::Error,
) -> ArchiveReadError {
    match e {
        object_store::Error::NotFound { .. } => ArchiveReadError::Missing {
            month,
            detail: format!("no {name} at {}", location.month_shown(tenant, month)),
        },
        other => ArchiveReadError::Unreachable {
            month,
            detail: format!("{name}: {other}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: usize) -> Block {
        Arc::new(vec![
            (
                "t".to_string(),
                StoredMessage {
                    seq: n as i64,
                    from: 1,
                    ts: 0,
                    head: None,
                    content: None,
                    status: "normal".into(),
                    version: 1,
                    edit_seq: None,
                    reply_seq: None,
                    root_seq: None,
                },
            );
            n
        ])
    }

    #[test]
    fn the_block_cache_stays_within_its_budget_and_keeps_recent_blocks() {
        let mut cache = BlockCache::default();
        let m = ShardMonth::parse("202609").unwrap();
        let key = |b: u32| ("t".to_string(), m, b);
        for b in 0..10 {
            cache.insert(key(b), block(1), 100, 350);
            cache.get(&key(0));
        }
        assert!(cache.bytes <= 350, "{}", cache.bytes);
        assert!(
            cache.get(&key(0)).is_some(),
            "the block read every time stays"
        );
        assert!(cache.get(&key(9)).is_some(), "the newest stays");
        assert!(cache.get(&key(1)).is_none(), "old unused blocks go");
    }
}
