//! Dual read during the legacy migration (seed 000 §9 steps 3 and 9): while
//! a tenant's switch is on (`im_legacy_migration.dual_read`, flipped by
//! `imstream legacy plan|dual-read|cutover`), a page read from the month
//! tables is merged with the same page read from the legacy table, deduped
//! by seq (the month-table row wins), so seqs not yet copied are there and
//! copied ones appear once. The switch is cached per tenant for a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::mysql::MySqlPool;

use crate::store::legacy::{state, table};

use super::{HistoryError, PageQuery};
use crate::store::message::StoredMessage;

/// How long a tenant's switch is cached.
const SWITCH_TTL: Duration = Duration::from_secs(1);

/// The per-tenant dual-read switch, cached.
#[derive(Clone, Default)]
pub struct DualRead {
    cache: Arc<Mutex<HashMap<String, (Instant, bool)>>>,
}

impl DualRead {
    pub async fn enabled(&self, pool: &MySqlPool, tenant: &str) -> Result<bool, HistoryError> {
        if let Some((at, on)) = self.cache.lock().expect("lock").get(tenant) {
            if at.elapsed() < SWITCH_TTL {
                return Ok(*on);
            }
        }
        let on = state::load(pool).await?.is_some_and(|s| s.dual_read);
        self.cache
            .lock()
            .expect("lock")
            .insert(tenant.to_string(), (Instant::now(), on));
        Ok(on)
    }
}

/// The page's rows from the legacy table (none once it is renamed).
pub async fn page(
    pool: &MySqlPool,
    topic: &str,
    query: &PageQuery,
) -> Result<Vec<StoredMessage>, HistoryError> {
    let (sql, a, b) = if query.ascending {
        (table::page_asc_sql(), query.low(), query.high())
    } else {
        (table::page_desc_sql(), query.high(), query.low())
    };
    match sqlx::query(&sql)
        .bind(topic)
        .bind(a)
        .bind(b)
        .bind(query.limit)
        .fetch_all(pool)
        .await
    {
        Ok(rows) => rows
            .iter()
            .map(|r| StoredMessage::from_row(r).map_err(HistoryError::from))
            .collect(),
        Err(e) if table::is_missing_table(&e) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Merges a month-table page with a legacy page: one message per seq (the
/// month table's), in the page's order, at most `limit`.
pub fn merge(
    monthly: Vec<StoredMessage>,
    legacy: Vec<StoredMessage>,
    query: &PageQuery,
) -> Vec<StoredMessage> {
    let mut all: Vec<StoredMessage> = monthly;
    let known: std::collections::HashSet<i64> = all.iter().map(|m| m.seq).collect();
    all.extend(legacy.into_iter().filter(|m| !known.contains(&m.seq)));
    if query.ascending {
        all.sort_by_key(|m| m.seq);
    } else {
        all.sort_by_key(|m| std::cmp::Reverse(m.seq));
    }
    all.truncate(query.limit as usize);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: i64, text: &str) -> StoredMessage {
        StoredMessage {
            seq,
            from: 1,
            ts: seq,
            head: None,
            content: Some(text.into()),
            status: "normal".into(),
            version: 1,
            edit_seq: None,
            reply_seq: None,
            root_seq: None,
        }
    }

    #[test]
    fn merged_pages_have_each_seq_once_in_order() {
        let q = PageQuery::new(None, None, Some(4), false).unwrap();
        let monthly = vec![msg(9, "m"), msg(7, "m")];
        let legacy = vec![msg(9, "l"), msg(8, "l"), msg(7, "l"), msg(6, "l")];
        let page = merge(monthly, legacy, &q);
        let got: Vec<(i64, &str)> = page
            .iter()
            .map(|m| (m.seq, m.content.as_deref().unwrap()))
            .collect();
        assert_eq!(got, vec![(9, "m"), (8, "l"), (7, "m"), (6, "l")]);
        let q = PageQuery::new(Some(1), None, Some(2), true).unwrap();
        let page = merge(vec![msg(3, "m")], vec![msg(1, "l"), msg(2, "l")], &q);
        assert_eq!(page.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![1, 2]);
    }
}
