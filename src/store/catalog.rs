//! The month catalog `im_group_message_shards` (seed 000 §3.2): which month
//! tables exist and their lifecycle status. A [`MonthTable`] for reads and
//! writes comes only from here.

use std::fmt;
use std::str::FromStr;

use sqlx::mysql::MySqlPool;
use sqlx::Row;

use super::month::{Family, MonthTable, ShardMonth};

/// prepared → writable → sealing → sealed → archived (seed 000 §10);
/// sealed → loading → sealed while `imstream legacy copy` bulk-loads a
/// past month (migration 0022).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ShardStatus {
    Prepared,
    Writable,
    Sealing,
    Sealed,
    Archived,
    /// A past month being bulk-loaded by the legacy copy: incomplete, its
    /// secondary indexes not built yet. Readers skip it (under dual read
    /// the legacy table serves its rows); nothing else writes, seals or
    /// archives it; the copy puts the status it had back once the
    /// indexes are built.
    Loading,
}

impl ShardStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            ShardStatus::Prepared => "prepared",
            ShardStatus::Writable => "writable",
            ShardStatus::Sealing => "sealing",
            ShardStatus::Sealed => "sealed",
            ShardStatus::Archived => "archived",
            ShardStatus::Loading => "loading",
        }
    }

    /// Whether the store pipeline may still write events of this month.
    pub fn accepts_writes(self) -> bool {
        matches!(
            self,
            ShardStatus::Prepared | ShardStatus::Writable | ShardStatus::Sealing
        )
    }
}

impl fmt::Display for ShardStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ShardStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "prepared" => ShardStatus::Prepared,
            "writable" => ShardStatus::Writable,
            "sealing" => ShardStatus::Sealing,
            "sealed" => ShardStatus::Sealed,
            "archived" => ShardStatus::Archived,
            "loading" => ShardStatus::Loading,
            other => return Err(format!("unknown shard status {other:?}")),
        })
    }
}

/// One catalog row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEntry {
    pub month: ShardMonth,
    pub status: ShardStatus,
}

/// Registers a month (status `prepared`) if it is not in the catalog yet.
pub async fn register(pool: &MySqlPool, month: ShardMonth) -> sqlx::Result<()> {
    let table = MonthTable::new(month);
    sqlx::query(
        "INSERT INTO im_group_message_shards (shard_month, table_name, shard_start, shard_end, status) \
         VALUES (?, ?, ?, ?, 'prepared') ON DUPLICATE KEY UPDATE shard_month = shard_month",
    )
    .bind(month.to_string())
    .bind(table.name())
    .bind(month.start().naive_utc())
    .bind(month.end().naive_utc())
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn set_status(
    pool: &MySqlPool,
    month: ShardMonth,
    status: ShardStatus,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE im_group_message_shards SET status = ? WHERE shard_month = ?")
        .bind(status.as_str())
        .bind(month.to_string())
        .execute(pool)
        .await?;
    Ok(())
}

/// Marks a month `archived` and records how many rows its archive holds.
pub async fn mark_archived(pool: &MySqlPool, month: ShardMonth, rows: i64) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE im_group_message_shards SET status = 'archived', row_count = ? WHERE shard_month = ?",
    )
    .bind(rows)
    .bind(month.to_string())
    .execute(pool)
    .await?;
    Ok(())
}

/// Every catalog entry, oldest first.
pub async fn list(pool: &MySqlPool) -> sqlx::Result<Vec<ShardEntry>> {
    let rows =
        sqlx::query("SELECT shard_month, status FROM im_group_message_shards ORDER BY shard_month")
            .fetch_all(pool)
            .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let month: String = r.try_get(0)?;
        let status: String = r.try_get(1)?;
        // A row that does not parse is not ours to use; skip it loudly.
        match (ShardMonth::parse(&month), status.parse()) {
            (Ok(month), Ok(status)) => out.push(ShardEntry { month, status }),
            _ => tracing::warn!(%month, %status, "ignoring malformed catalog row"),
        }
    }
    Ok(out)
}

/// The catalog entry of one month.
pub async fn entry(pool: &MySqlPool, month: ShardMonth) -> sqlx::Result<Option<ShardEntry>> {
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM im_group_message_shards WHERE shard_month = ?")
            .bind(month.to_string())
            .fetch_optional(pool)
            .await?;
    Ok(status
        .and_then(|s| s.parse().ok())
        .map(|status| ShardEntry { month, status }))
}

/// The table of a month the catalog knows; `None` when it does not.
pub async fn table(
    pool: &MySqlPool,
    month: ShardMonth,
) -> sqlx::Result<Option<(MonthTable, ShardStatus)>> {
    Ok(entry(pool, month)
        .await?
        .map(|e| (MonthTable::new(e.month), e.status)))
}

/// Whether the month's physical tables (every family) exist.
pub async fn table_exists(pool: &MySqlPool, month: ShardMonth) -> sqlx::Result<bool> {
    let group = MonthTable::new(month);
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name IN (?, ?)",
    )
    .bind(group.name())
    .bind(group.of_family(Family::P2p).name())
    .fetch_one(pool)
    .await?;
    Ok(n == Family::ALL.len() as i64)
}

/// Creates the month's tables (every family) from the template and
/// registers the month.
pub async fn create_month(pool: &MySqlPool, month: ShardMonth) -> sqlx::Result<MonthTable> {
    let table = MonthTable::new(month);
    for family in Family::ALL {
        sqlx::query(&table.of_family(family).create_sql())
            .execute(pool)
            .await?;
    }
    register(pool, month).await?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_loading_takes_no_writes() {
        for s in [
            ShardStatus::Prepared,
            ShardStatus::Writable,
            ShardStatus::Sealing,
            ShardStatus::Sealed,
            ShardStatus::Archived,
            ShardStatus::Loading,
        ] {
            assert_eq!(s.as_str().parse::<ShardStatus>(), Ok(s));
        }
        assert!(!ShardStatus::Loading.accepts_writes());
        assert!("load".parse::<ShardStatus>().is_err());
    }
}
