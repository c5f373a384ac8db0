//! What a client asks for and gets: a page query (since / before / limit,
//! order) checked once, and the page it is answered with.

use super::HistoryError;
use crate::store::message::StoredMessage;

/// Largest page a client may ask for.
pub const MAX_LIMIT: i64 = 100;
/// Page size when the client gives none.
pub const DEFAULT_LIMIT: i64 = 32;

/// Direction and bounds of a page. `since` inclusive, `before` exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageQuery {
    pub since: Option<i64>,
    pub before: Option<i64>,
    pub limit: i64,
    /// Oldest first (forward catch-up) instead of newest first.
    pub ascending: bool,
    /// Read the tenant's primary even when a read replica is in use: for
    /// reads that must see writes just made (edit and recall checks).
    pub primary: bool,
}

impl PageQuery {
    /// Validates client-supplied bounds.
    pub fn new(
        since: Option<i64>,
        before: Option<i64>,
        limit: Option<i64>,
        ascending: bool,
    ) -> Result<Self, HistoryError> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(HistoryError::BadRequest(format!(
                "limit must be 1 to {MAX_LIMIT}, got {limit}"
            )));
        }
        if since.is_some_and(|s| s < 0) || before.is_some_and(|b| b < 1) {
            return Err(HistoryError::BadRequest(
                "since must be >= 0 and before >= 1".into(),
            ));
        }
        if let (Some(s), Some(b)) = (since, before) {
            if s >= b {
                return Err(HistoryError::BadRequest(format!(
                    "since ({s}) must be below before ({b})"
                )));
            }
        }
        Ok(Self {
            since,
            before,
            limit,
            ascending,
            primary: false,
        })
    }

    /// The query of message `seq` alone (`None` past the last seq there
    /// can be).
    pub fn just(seq: i64) -> Result<Option<Self>, HistoryError> {
        let Some(after) = seq.checked_add(1) else {
            return Ok(None);
        };
        Self::new(Some(seq), Some(after), Some(1), true).map(Some)
    }

    /// The same query, read from the primary.
    pub fn on_primary(self) -> Self {
        Self {
            primary: true,
            ..self
        }
    }

    pub(super) fn low(&self) -> i64 {
        self.since.unwrap_or(1).max(1)
    }

    pub(super) fn high(&self) -> i64 {
        self.before.unwrap_or(i64::MAX)
    }
}

/// A page and where it came from.
#[derive(Debug, Clone)]
pub struct Page {
    /// Newest first, or oldest first for ascending queries.
    pub messages: Vec<StoredMessage>,
    /// Cursor for the next page: the edge seq of what was fetched.
    pub next: Option<i64>,
    pub source: &'static str,
}
