//! Shard months and month tables. A table name exists only as a
//! [`MonthTable`], built from a validated [`ShardMonth`]; every SQL text
//! that names a month table is built here.

use std::fmt;

use chrono::{DateTime, Datelike, TimeZone, Utc};

use crate::names::{P2P_TABLE_PREFIX, TABLE_PREFIX};

/// A validated UTC month `YYYYMM` (years 2000–2999).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardMonth {
    year: u16,
    month: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MonthError {
    #[error("illegal month {0:?}: expected YYYYMM with a year 2000-2999 and a month 01-12")]
    IllegalMonth(String),
    #[error("illegal month table name {0:?}: expected im_group_messages_YYYYMM")]
    IllegalTableName(String),
}

impl ShardMonth {
    pub fn new(year: u16, month: u8) -> Result<Self, MonthError> {
        if !(2000..=2999).contains(&year) || !(1..=12).contains(&month) {
            return Err(MonthError::IllegalMonth(format!("{year:04}{month:02}")));
        }
        Ok(Self { year, month })
    }

    /// Parses exactly six ASCII digits `YYYYMM`.
    pub fn parse(text: &str) -> Result<Self, MonthError> {
        let illegal = || MonthError::IllegalMonth(text.to_string());
        if text.len() != 6 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(illegal());
        }
        let year: u16 = text[..4].parse().map_err(|_| illegal())?;
        let month: u8 = text[4..].parse().map_err(|_| illegal())?;
        Self::new(year, month).map_err(|_| illegal())
    }

    /// The month containing `t` (UTC).
    pub fn of(t: DateTime<Utc>) -> Self {
        Self {
            year: t.year() as u16,
            month: t.month() as u8,
        }
    }

    /// The month containing the epoch-millisecond instant `ms`.
    pub fn of_millis(ms: i64) -> Self {
        Self::of(
            Utc.timestamp_millis_opt(ms)
                .single()
                .unwrap_or_else(Utc::now),
        )
    }

    pub fn next(self) -> Self {
        if self.month == 12 {
            Self {
                year: self.year + 1,
                month: 1,
            }
        } else {
            Self {
                year: self.year,
                month: self.month + 1,
            }
        }
    }

    pub fn prev(self) -> Self {
        if self.month == 1 {
            Self {
                year: self.year - 1,
                month: 12,
            }
        } else {
            Self {
                year: self.year,
                month: self.month - 1,
            }
        }
    }

    /// First instant of the month (UTC).
    pub fn start(self) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(self.year as i32, self.month as u32, 1, 0, 0, 0)
            .single()
            .expect("validated month")
    }

    /// First instant of the next month (exclusive end).
    pub fn end(self) -> DateTime<Utc> {
        self.next().start()
    }
}

impl fmt::Display for ShardMonth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}{:02}", self.year, self.month)
    }
}

/// Which conversations a table family holds. Group and one-to-one messages
/// never share a table (nor an index); both families are created from the
/// same template for every month the catalog knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Group,
    P2p,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Group, Family::P2p];

    /// The family of a topic's messages (`p2p…` topics are one-to-one).
    pub fn of_topic(topic: &str) -> Family {
        if topic.starts_with("p2p") {
            Family::P2p
        } else {
            Family::Group
        }
    }

    pub const fn prefix(self) -> &'static str {
        match self {
            Family::Group => TABLE_PREFIX,
            Family::P2p => P2P_TABLE_PREFIX,
        }
    }
}

/// The name of one month table; `^im_(group|p2p)_messages_[0-9]{6}$` by
/// construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MonthTable {
    month: ShardMonth,
    family: Family,
}

impl MonthTable {
    /// Only the catalog and the shard manager build table names.
    pub(crate) fn new(month: ShardMonth) -> Self {
        Self {
            month,
            family: Family::Group,
        }
    }

    /// The same month's table of another family.
    pub fn of_family(self, family: Family) -> Self {
        Self { family, ..self }
    }

    /// The same month's table holding `topic`'s messages.
    pub fn for_topic(self, topic: &str) -> Self {
        self.of_family(Family::of_topic(topic))
    }

    pub fn family(&self) -> Family {
        self.family
    }

    /// Parses and validates a table name (for tools that list tables).
    pub fn parse_name(name: &str) -> Result<ShardMonth, MonthError> {
        let illegal = || MonthError::IllegalTableName(name.to_string());
        let digits = name.strip_prefix(TABLE_PREFIX).ok_or_else(illegal)?;
        ShardMonth::parse(digits).map_err(|_| illegal())
    }

    pub fn month(&self) -> ShardMonth {
        self.month
    }

    pub fn name(&self) -> String {
        format!("{}{}", self.family.prefix(), self.month)
    }

    /// The one template every month table is created from (seed 000 §3.1).
    pub fn create_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS `{}` (\
  message_id BIGINT NOT NULL COMMENT 'Snowflake id',\
  topic VARBINARY(64) NOT NULL,\
  group_id BIGINT NOT NULL,\
  seqid BIGINT NOT NULL COMMENT 'per-topic, never reset across months',\
  from_user BIGINT NOT NULL,\
  client_msg_id VARBINARY(256) NULL,\
  msg_type VARCHAR(32) NOT NULL DEFAULT 'text',\
  status VARCHAR(32) NOT NULL DEFAULT 'normal',\
  content JSON NULL,\
  head JSON NULL,\
  mentioned_user_ids JSON NULL,\
  mention_all TINYINT(1) NOT NULL DEFAULT 0,\
  reply_seqid BIGINT NULL,\
  root_seqid BIGINT NULL,\
  file_count INT NOT NULL DEFAULT 0,\
  content_size INT NOT NULL DEFAULT 0,\
  has_risk TINYINT(1) NOT NULL DEFAULT 0,\
  audit_status VARCHAR(32) NOT NULL DEFAULT 'pass',\
  version INT NOT NULL DEFAULT 1,\
  recalled_at DATETIME(3) NULL,\
  recalled_by BIGINT NULL,\
  deleted_at DATETIME(3) NULL,\
  expires_at DATETIME(3) NULL,\
  created_at DATETIME(3) NOT NULL,\
  updated_at DATETIME(3) NOT NULL,\
  PRIMARY KEY (message_id),{}\
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci",
            self.name(),
            SECONDARY_INDEXES
                .iter()
                .map(|i| format!(" {},", i.definition()))
                .collect::<String>()
                .trim_end_matches(',')
        )
    }

    /// Drops the named secondary indexes (a month being bulk-loaded by the
    /// legacy copy; metadata only, the table stays readable).
    pub fn drop_indexes_sql(&self, indexes: &[&SecondaryIndex]) -> String {
        let drops: Vec<String> = indexes
            .iter()
            .map(|i| format!("DROP INDEX {}", i.name))
            .collect();
        format!("ALTER TABLE `{}` {}", self.name(), drops.join(", "))
    }

    /// Builds the named secondary indexes in one pass over the table
    /// (online: reads and writes go on meanwhile).
    pub fn add_indexes_sql(&self, indexes: &[&SecondaryIndex]) -> String {
        let adds: Vec<String> = indexes
            .iter()
            .map(|i| format!("ADD {}", i.definition()))
            .collect();
        format!(
            "ALTER TABLE `{}` {}, ALGORITHM=INPLACE, LOCK=NONE",
            self.name(),
            adds.join(", ")
        )
    }

    /// The names of the table's indexes (`PRIMARY` included).
    pub fn index_names_sql(&self) -> String {
        format!(
            "SELECT DISTINCT index_name FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = '{}'",
            self.name()
        )
    }

    /// 1 if the table holds a row with a `message_id` below `?`, else 0
    /// (a primary-key probe).
    pub fn any_id_below_sql(&self) -> String {
        format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM `{}` WHERE message_id < ? LIMIT 1) x",
            self.name()
        )
    }

    /// Multi-row insert of `rows` messages. A duplicate key (redelivery)
    /// leaves the stored row as it is; any other refusal (a CHECK, a value
    /// out of range) is an error, never a warning.
    pub fn insert_sql(&self, rows: usize) -> String {
        let one = "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
        let values = vec![one; rows].join(",");
        format!(
            "INSERT INTO `{}` (message_id, topic, group_id, seqid, from_user, client_msg_id, \
             msg_type, status, content, head, mentioned_user_ids, mention_all, reply_seqid, root_seqid, \
             file_count, content_size, has_risk, audit_status, version, expires_at, created_at, updated_at) \
             VALUES {values} ON DUPLICATE KEY UPDATE seqid = seqid",
            self.name()
        )
    }

    /// How many of `count` message ids have a row.
    pub fn count_message_ids_sql(&self, count: usize) -> String {
        let marks = vec!["?"; count].join(",");
        format!(
            "SELECT COUNT(*) FROM `{}` WHERE message_id IN ({marks})",
            self.name()
        )
    }

    /// `(seqid, message_id)` of the rows holding some of a topic's seqs.
    pub fn rows_by_seq_sql(&self, count: usize) -> String {
        let marks = vec!["?"; count].join(",");
        format!(
            "SELECT seqid, message_id FROM `{}` WHERE topic = ? AND seqid IN ({marks})",
            self.name()
        )
    }
}

/// A secondary index of the month template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecondaryIndex {
    pub name: &'static str,
    pub unique: bool,
    pub columns: &'static str,
}

impl SecondaryIndex {
    /// `[UNIQUE ]KEY name (columns)`, as in `CREATE TABLE` and `ALTER TABLE … ADD`.
    pub fn definition(&self) -> String {
        format!(
            "{}KEY {} ({})",
            if self.unique { "UNIQUE " } else { "" },
            self.name,
            self.columns
        )
    }
}

/// Every secondary index of a month table (seed 000 §3.1), in template order.
pub const SECONDARY_INDEXES: &[SecondaryIndex] = &[
    SecondaryIndex {
        name: "uk_topic_seq",
        unique: true,
        columns: "topic, seqid",
    },
    SecondaryIndex {
        name: "uk_topic_sender_client_mid",
        unique: true,
        columns: "topic, from_user, client_msg_id",
    },
    SecondaryIndex {
        name: "idx_group_seq",
        unique: false,
        columns: "group_id, seqid",
    },
    SecondaryIndex {
        name: "idx_topic_created",
        unique: false,
        columns: "topic, created_at",
    },
    SecondaryIndex {
        name: "idx_topic_from_seq",
        unique: false,
        columns: "topic, from_user, seqid",
    },
    SecondaryIndex {
        name: "idx_audit_created",
        unique: false,
        columns: "audit_status, created_at",
    },
    SecondaryIndex {
        name: "idx_expires",
        unique: false,
        columns: "expires_at",
    },
];

/// Columns a read returns, in this order (text columns cast so MySQL 8 and
/// MariaDB both hand back plain text).
const READ_COLUMNS: &str = "seqid, from_user, CAST(head AS CHAR CHARACTER SET utf8mb4), \
     CAST(content AS CHAR CHARACTER SET utf8mb4), status, version, \
     CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED), reply_seqid, root_seqid";

impl MonthTable {
    /// Newest first: `since <= seqid < before`, at most `LIMIT ?` rows.
    pub fn page_desc_sql(&self) -> String {
        format!(
            "SELECT {READ_COLUMNS} FROM `{}` WHERE topic = ? AND seqid < ? AND seqid >= ? \
             ORDER BY seqid DESC LIMIT ?",
            self.name()
        )
    }

    /// Oldest first: `since <= seqid < before`, at most `LIMIT ?` rows.
    pub fn page_asc_sql(&self) -> String {
        format!(
            "SELECT {READ_COLUMNS} FROM `{}` WHERE topic = ? AND seqid >= ? AND seqid < ? \
             ORDER BY seqid ASC LIMIT ?",
            self.name()
        )
    }

    /// Messages whose content contains a text, in a time range, newest first.
    pub fn search_sql(&self) -> String {
        format!(
            "SELECT {READ_COLUMNS} FROM `{}` WHERE topic = ? AND created_at >= ? AND created_at < ? \
             AND status = 'normal' AND CAST(content AS CHAR CHARACTER SET utf8mb4) LIKE ? \
             ORDER BY seqid DESC LIMIT ?",
            self.name()
        )
    }
}

/// Every column of a month table as an archive exports it, in this order:
/// JSON and time columns cast to text so both MySQL 8 and MariaDB hand back
/// exactly what is stored.
pub const ARCHIVE_COLUMNS: &[&str] = &[
    "message_id",
    "topic",
    "group_id",
    "seqid",
    "from_user",
    "client_msg_id",
    "msg_type",
    "status",
    "content",
    "head",
    "mentioned_user_ids",
    "mention_all",
    "reply_seqid",
    "root_seqid",
    "file_count",
    "content_size",
    "has_risk",
    "audit_status",
    "version",
    "recalled_at",
    "recalled_by",
    "deleted_at",
    "expires_at",
    "created_at",
    "updated_at",
];

/// Columns of [`ARCHIVE_COLUMNS`] that are cast to text on export.
const ARCHIVE_TEXT_CASTS: &[&str] = &[
    "content",
    "head",
    "mentioned_user_ids",
    "recalled_at",
    "deleted_at",
    "expires_at",
    "created_at",
    "updated_at",
];

impl MonthTable {
    /// One page of an export in `(topic, seqid)` order, after the row
    /// `(topic = ?, seqid > ?)` or any later topic (`topic > ?`), `LIMIT ?`:
    /// [`ARCHIVE_COLUMNS`], then `created_ms`.
    pub fn export_page_sql(&self) -> String {
        let columns: Vec<String> = ARCHIVE_COLUMNS
            .iter()
            .map(|c| {
                if ARCHIVE_TEXT_CASTS.contains(c) {
                    format!("CAST({c} AS CHAR CHARACTER SET utf8mb4)")
                } else {
                    (*c).to_string()
                }
            })
            .collect();
        // Last, `created_ms`: the read path's timestamp, computed as a
        // history read computes it.
        format!(
            "SELECT {}, CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED) FROM `{}` \
             WHERE topic > ? OR (topic = ? AND seqid > ?) ORDER BY topic, seqid LIMIT ?",
            columns.join(", "),
            self.name()
        )
    }

    /// Per topic: `(topic, COUNT(*), MIN(seqid), MAX(seqid))`.
    pub fn topic_summary_sql(&self) -> String {
        format!(
            "SELECT topic, COUNT(*), MIN(seqid), MAX(seqid) FROM `{}` GROUP BY topic ORDER BY topic",
            self.name()
        )
    }

    /// The consistency check: per topic of `count` given, `(topic,
    /// MIN(seqid), MAX(seqid), COUNT(*))`.
    pub fn topic_ranges_in_sql(&self, count: usize) -> String {
        format!(
            "SELECT topic, MIN(seqid), MAX(seqid), COUNT(*) FROM `{}` \
             WHERE topic IN ({}) GROUP BY topic",
            self.name(),
            vec!["?"; count.max(1)].join(", ")
        )
    }

    /// The same for one topic, as a locking read (the latest committed
    /// rows, held until the repair that follows commits).
    pub fn topic_range_locked_sql(&self) -> String {
        format!(
            "SELECT MIN(seqid), MAX(seqid), COUNT(*), MIN(created_at), MAX(created_at) FROM `{}` \
             WHERE topic = ? LOCK IN SHARE MODE",
            self.name()
        )
    }

    /// Up to `LIMIT ?` topics after `?`, in order (the checker's next topics).
    pub fn topics_after_sql(&self) -> String {
        format!(
            "SELECT DISTINCT topic FROM `{}` WHERE topic > ? ORDER BY topic LIMIT ?",
            self.name()
        )
    }

    pub fn count_sql(&self) -> String {
        format!("SELECT COUNT(*) FROM `{}`", self.name())
    }

    /// Drops the month's table: only after a verified archive.
    pub fn drop_sql(&self) -> String {
        format!("DROP TABLE IF EXISTS `{}`", self.name())
    }
}

/// Verification reads (replay, legacy migration): every row's digest
/// columns `topic, seqid, from_user, content, status, version`.
impl MonthTable {
    /// Every row of the month.
    pub fn digest_rows_sql(&self) -> String {
        format!(
            "SELECT topic, seqid, from_user, CAST(content AS CHAR CHARACTER SET utf8mb4), status, version \
             FROM `{}`",
            self.name()
        )
    }

    /// The rows copied from the legacy table `legacy` (joined on
    /// `message_id = legacy.id`, the migration's id mapping).
    pub fn digest_copied_rows_sql(&self, legacy: &str) -> String {
        format!(
            "SELECT m.topic, m.seqid, m.from_user, CAST(m.content AS CHAR CHARACTER SET utf8mb4), m.status, m.version \
             FROM `{}` m JOIN `{legacy}` l ON l.id = m.message_id",
            self.name()
        )
    }

    /// Per topic: first and last seq, row count, first and last time.
    pub fn topic_ranges_sql(&self) -> String {
        format!(
            "SELECT topic, MIN(seqid), MAX(seqid), COUNT(*), MIN(created_at), MAX(created_at) \
             FROM `{}` GROUP BY topic",
            self.name()
        )
    }
}

/// The legacy migration's writes and checks (`crate::legacy`).
impl MonthTable {
    /// Plain multi-row insert of `rows` legacy rows (`message_id` then
    /// `columns`, one `?` each): no `IGNORE`, no `ON DUPLICATE KEY`, so a
    /// row already there or a seq held by another message is an error.
    pub fn insert_copied_sql(&self, columns: &str, rows: usize) -> String {
        let width = columns.split(',').count() + 1;
        let one = format!("({})", vec!["?"; width].join(","));
        format!(
            "INSERT INTO `{}` (message_id, {columns}) VALUES {}",
            self.name(),
            vec![one.as_str(); rows].join(",")
        )
    }

    /// The digest columns of the rows with one of `count` message ids:
    /// `message_id, seqid, from_user, content (text), status, version`.
    pub fn digests_by_id_sql(&self, count: usize) -> String {
        format!(
            "SELECT message_id, seqid, from_user, CAST(content AS CHAR CHARACTER SET utf8mb4), status, version \
             FROM `{}` WHERE message_id IN ({})",
            self.name(),
            vec!["?"; count].join(",")
        )
    }

    /// Rows not copied from `legacy` whose seq lies within the legacy seqs
    /// of their topic (a seq used twice).
    pub fn foreign_rows_in_legacy_range_sql(&self, legacy: &str) -> String {
        format!(
            "SELECT COUNT(*) FROM `{}` m JOIN (SELECT topic, MAX(seqid) mx FROM `{legacy}` GROUP BY topic) x \
             ON x.topic = m.topic LEFT JOIN `{legacy}` l ON l.id = m.message_id \
             WHERE l.id IS NULL AND m.seqid <= x.mx",
            self.name()
        )
    }
}

impl fmt::Display for MonthTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legal_months() {
        let m = ShardMonth::parse("202610").unwrap();
        assert_eq!(m.to_string(), "202610");
        assert_eq!(m.next().to_string(), "202611");
        assert_eq!(
            ShardMonth::parse("202612").unwrap().next().to_string(),
            "202701"
        );
        assert_eq!(
            ShardMonth::parse("202601").unwrap().prev().to_string(),
            "202512"
        );
        assert_eq!(m.start().to_rfc3339(), "2026-10-01T00:00:00+00:00");
        assert_eq!(m.end().to_rfc3339(), "2026-11-01T00:00:00+00:00");
    }

    #[test]
    fn illegal_months_are_refused() {
        for bad in [
            "202613", "202600", "20261", "2026100", "abcdef", "1999 1", "199912", "+20261",
            "2026-1", "",
        ] {
            assert!(ShardMonth::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn illegal_table_names_are_refused() {
        assert_eq!(
            MonthTable::parse_name("im_group_messages_202609")
                .unwrap()
                .to_string(),
            "202609"
        );
        for bad in [
            "im_group_messages_2026091",
            "im_group_messages_202613",
            "im_group_messages_202609; DROP TABLE x",
            "im_group_messages",
            "other_202609",
            "im_group_messages_20260a",
        ] {
            assert!(MonthTable::parse_name(bad).is_err(), "{bad:?} accepted");
        }
        let t = MonthTable::new(ShardMonth::parse("202609").unwrap());
        assert_eq!(t.name(), "im_group_messages_202609");
        assert!(t.create_sql().contains(
            "PRIMARY KEY (message_id), UNIQUE KEY uk_topic_seq (topic, seqid), \
             UNIQUE KEY uk_topic_sender_client_mid (topic, from_user, client_msg_id), \
             KEY idx_group_seq (group_id, seqid), KEY idx_topic_created (topic, created_at), \
             KEY idx_topic_from_seq (topic, from_user, seqid), KEY idx_audit_created (audit_status, created_at), \
             KEY idx_expires (expires_at)) ENGINE=InnoDB"
        ));
        assert!(t
            .create_sql()
            .starts_with("CREATE TABLE IF NOT EXISTS `im_group_messages_202609`"));
        // Identities compare bytes exactly (crate::exact), as converted
        // tables do.
        for (column, exact_type) in crate::exact::MONTH_IDENTITY_COLUMNS {
            assert!(
                t.create_sql().contains(&format!(",{column} {exact_type},")),
                "{column}"
            );
        }
    }

    #[test]
    fn index_ddl_names_the_template_indexes() {
        let t = MonthTable::new(ShardMonth::parse("202609").unwrap());
        let picked: Vec<&SecondaryIndex> = SECONDARY_INDEXES.iter().take(2).collect();
        assert_eq!(
            t.drop_indexes_sql(&picked),
            "ALTER TABLE `im_group_messages_202609` DROP INDEX uk_topic_seq, DROP INDEX uk_topic_sender_client_mid"
        );
        assert_eq!(
            t.add_indexes_sql(&picked[..1]),
            "ALTER TABLE `im_group_messages_202609` ADD UNIQUE KEY uk_topic_seq (topic, seqid), ALGORITHM=INPLACE, LOCK=NONE"
        );
        assert_eq!(
            t.insert_copied_sql("topic, seqid", 2),
            "INSERT INTO `im_group_messages_202609` (message_id, topic, seqid) VALUES (?,?,?),(?,?,?)"
        );
    }
}
