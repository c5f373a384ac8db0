//! Exact identities in MySQL (issue 28): every column that holds an identity
//! (a topic name, a client message id, an event, command or report id, a
//! device id, a login) is `VARBINARY`, compared byte for byte with no padding
//! in MariaDB and MySQL 8 alike. The tables' default collation
//! (`utf8mb4_unicode_ci`) folds case and accents, and one-to-one topic names
//! are base64, so under it two pairs' conversations could be one key.
//!
//! This module holds the list of those columns, the check every process
//! makes before it uses a tenant database ([`verify`]: a database whose
//! identity columns are not exact is refused, naming the column), the
//! conversion `imstream migrate` runs after the SQL migrations ([`convert`]:
//! month tables, whose names a migration cannot know, and any column that
//! drifted), and [`Exact`], the type a binary identity column is read as
//! (sqlx reads `VARBINARY` only as bytes).

use sqlx::mysql::{MySql, MySqlPool, MySqlTypeInfo, MySqlValueRef};
use sqlx::Row;

use crate::names::{P2P_TABLE_PREFIX, TABLE_PREFIX};

/// An identity read from a binary column: its bytes, which imstream only
/// ever writes from Rust strings, as UTF-8 text (anything else is a decode
/// error, never a lossy conversion).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Exact(pub String);

impl Exact {
    pub fn into_string(self) -> String {
        self.0
    }
}

impl From<Exact> for String {
    fn from(e: Exact) -> String {
        e.0
    }
}

impl std::ops::Deref for Exact {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl sqlx::Type<MySql> for Exact {
    fn type_info() -> MySqlTypeInfo {
        <[u8] as sqlx::Type<MySql>>::type_info()
    }

    /// Binary and text string columns alike (a computed text column, or a
    /// database that has not been migrated yet and is about to be refused).
    fn compatible(ty: &MySqlTypeInfo) -> bool {
        <[u8] as sqlx::Type<MySql>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, MySql> for Exact {
    fn decode(value: MySqlValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let bytes = <&[u8] as sqlx::Decode<MySql>>::decode(value)?;
        Ok(Exact(std::str::from_utf8(bytes)?.to_owned()))
    }
}

/// Every identity column of a tenant database outside the month tables:
/// `(table, column, exact definition)`, as migration
/// `0023_exact_identities.sql` makes them, then the tables made after it
/// (a unit test keeps the list and the migrations the same). [`verify`] checks them all; [`convert`] puts back any that has
/// drifted since.
pub const IDENTITY_COLUMNS: &[(&str, &str, &str)] = &[
    (
        "im_group_message_topic_shards",
        "topic",
        "VARBINARY(64) NOT NULL",
    ),
    ("im_group_message_dedup", "topic", "VARBINARY(64) NOT NULL"),
    (
        "im_group_message_dedup",
        "client_msg_id",
        "VARBINARY(256) NOT NULL",
    ),
    ("im_dellog", "topic", "VARBINARY(64) NOT NULL"),
    (
        "im_dellog",
        "event_id",
        "VARBINARY(64) NULL COMMENT 'event that produced the range; replays are idempotent'",
    ),
    ("im_message_revisions", "topic", "VARBINARY(64) NOT NULL"),
    ("im_message_revisions", "event_id", "VARBINARY(64) NOT NULL"),
    ("im_groups", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_members", "topic", "VARBINARY(64) NOT NULL"),
    ("im_subscriptions", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_messages", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_messages", "client_msg_id", "VARBINARY(256) NULL"),
    ("im_admin_commands", "command_id", "VARBINARY(256) NOT NULL"),
    ("im_admin_commands", "operator", "VARBINARY(256) NOT NULL"),
    ("im_push_muted_topics", "topic", "VARBINARY(64) NOT NULL"),
    ("im_conversations", "topic", "VARBINARY(64) NOT NULL"),
    ("im_conversation_topics", "topic", "VARBINARY(64) NOT NULL"),
    (
        "im_session_control_devices",
        "device",
        "VARBINARY(764) NOT NULL",
    ),
    ("im_basic_logins", "login", "VARBINARY(256) NOT NULL"),
    ("im_stats_daily", "topic", "VARBINARY(64) NOT NULL"),
    ("im_stats_senders", "topic", "VARBINARY(64) NOT NULL"),
    ("im_message_reports", "report_id", "VARBINARY(120) NOT NULL"),
    ("im_message_reports", "topic", "VARBINARY(64) NOT NULL"),
    ("im_favorites", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_files", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_invites", "topic", "VARBINARY(64) NOT NULL"),
    ("im_seq_collisions", "topic", "VARBINARY(64) NOT NULL"),
    ("im_seq_collisions", "event_id", "VARBINARY(64) NOT NULL"),
    ("im_seq_collisions", "client_msg_id", "VARBINARY(256) NULL"),
    (
        "im_pipeline_checkpoints",
        "consumer_group",
        "VARBINARY(255) NOT NULL",
    ),
    (
        "im_pipeline_checkpoints",
        "source_topic",
        "VARBINARY(255) NOT NULL",
    ),
    ("im_consistency_repairs", "topic", "VARBINARY(64) NOT NULL"),
    (
        "im_user_notifications",
        "notification_id",
        "VARBINARY(64) NOT NULL",
    ),
    ("im_user_notifications", "topic", "VARBINARY(64) NULL"),
    ("im_seq_marks", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_models", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_model_members", "topic", "VARBINARY(64) NOT NULL"),
    ("im_group_commands", "claim_key", "VARBINARY(300) NOT NULL"),
    ("im_group_commands", "topic", "VARBINARY(64) NOT NULL"),
    ("im_files", "file_id", "VARBINARY(32) NOT NULL"),
    ("im_files", "object_key", "VARBINARY(512) NOT NULL"),
    ("im_file_refs", "file_id", "VARBINARY(32) NOT NULL"),
    ("im_file_refs", "topic", "VARBINARY(80) NOT NULL"),
];

/// The identity columns of every month table, with the exact type each
/// takes (the month-table template in `store/month.rs` creates them so).
pub const MONTH_IDENTITY_COLUMNS: &[(&str, &str)] = &[
    ("topic", "VARBINARY(64) NOT NULL"),
    ("client_msg_id", "VARBINARY(256) NULL"),
];

/// The identity columns of the schema registry's database (migration
/// `registry/0002_exact_subjects.sql`).
pub const REGISTRY_IDENTITY_COLUMNS: &[(&str, &str, &str)] = &[
    ("sr_subject_versions", "subject", "VARBINARY(1020) NOT NULL"),
    (
        "sr_config",
        "subject",
        "VARBINARY(1020) NOT NULL COMMENT 'empty string = global'",
    ),
];

/// A database refused because an identity column compares inexactly.
#[derive(Debug, thiserror::Error)]
pub enum ExactError {
    #[error(
        "database {database}: identity column {table}.{column} is {column_type} (collation {collation}), \
         which does not compare bytes exactly; run `imstream migrate` to convert it to VARBINARY"
    )]
    Inexact {
        database: String,
        table: String,
        column: String,
        column_type: String,
        collation: String,
    },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl ExactError {
    /// As a database error (a refused connection: the pool gives up on it).
    pub fn into_sqlx(self) -> sqlx::Error {
        match self {
            ExactError::Db(e) => e,
            inexact => sqlx::Error::Configuration(Box::new(inexact)),
        }
    }
}

/// Whether a column of this information-schema `DATA_TYPE` compares bytes
/// exactly: only the binary string types do (every collation of a text type,
/// `_bin` ones included, pads trailing spaces in MariaDB or MySQL 8).
fn is_exact_type(data_type: &str) -> bool {
    data_type.eq_ignore_ascii_case("varbinary") || data_type.eq_ignore_ascii_case("binary")
}

/// One string column of information_schema: its table, name, `DATA_TYPE`,
/// `COLUMN_TYPE` and collation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ColumnInfo {
    table: String,
    column: String,
    data_type: String,
    column_type: String,
    collation: Option<String>,
}

async fn columns<'e, E>(db: E) -> Result<Vec<ColumnInfo>, sqlx::Error>
where
    E: sqlx::Executor<'e, Database = MySql>,
{
    let rows = sqlx::query(
        "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, COLLATION_NAME \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
         ORDER BY TABLE_NAME, ORDINAL_POSITION",
    )
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ColumnInfo {
                table: r.try_get::<Exact, _>(0)?.0,
                column: r.try_get::<Exact, _>(1)?.0,
                data_type: r.try_get::<Exact, _>(2)?.0,
                column_type: r.try_get::<Exact, _>(3)?.0,
                collation: r.try_get::<Option<Exact>, _>(4)?.map(String::from),
            })
        })
        .collect()
}

/// Whether `table` is a month table (`im_(group|p2p)_messages_YYYYMM`).
fn is_month_table(table: &str) -> bool {
    [TABLE_PREFIX, P2P_TABLE_PREFIX].iter().any(|prefix| {
        table
            .strip_prefix(prefix)
            .is_some_and(|m| m.len() == 6 && m.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The exact definition `c` must have, if it is an identity column of
/// `listed` or (with `months`) of a month table.
fn exact_definition(
    c: &ColumnInfo,
    listed: &[(&str, &str, &'static str)],
    months: bool,
) -> Option<&'static str> {
    listed
        .iter()
        .find(|(t, col, _)| *t == c.table && *col == c.column)
        .map(|(_, _, d)| *d)
        .or_else(|| {
            (months && is_month_table(&c.table))
                .then(|| {
                    MONTH_IDENTITY_COLUMNS
                        .iter()
                        .find(|(col, _)| *col == c.column)
                        .map(|(_, d)| *d)
                })
                .flatten()
        })
}

/// Identity columns of `columns` that do not compare bytes exactly, each
/// with the definition that makes it exact.
fn inexact_columns<'c>(
    columns: &'c [ColumnInfo],
    listed: &[(&str, &str, &'static str)],
    months: bool,
) -> Vec<(&'c ColumnInfo, &'static str)> {
    columns
        .iter()
        .filter(|c| !is_exact_type(&c.data_type))
        .filter_map(|c| exact_definition(c, listed, months).map(|d| (c, d)))
        .collect()
}

fn inexact(database: &str, c: &ColumnInfo) -> ExactError {
    ExactError::Inexact {
        database: database.to_string(),
        table: c.table.clone(),
        column: c.column.clone(),
        column_type: c.column_type.clone(),
        collation: c.collation.clone().unwrap_or_else(|| "none".into()),
    }
}

/// Refuses a tenant database (named `database` in the error) any of whose
/// identity columns, month tables included, does not compare bytes exactly.
pub async fn verify<'e, E>(db: E, database: &str) -> Result<(), ExactError>
where
    E: sqlx::Executor<'e, Database = MySql>,
{
    let columns = columns(db).await?;
    match inexact_columns(&columns, IDENTITY_COLUMNS, true).first() {
        Some((c, _)) => Err(inexact(database, c)),
        None => Ok(()),
    }
}

/// The same check for the schema registry's database.
pub async fn verify_registry(pool: &MySqlPool, database: &str) -> Result<(), ExactError> {
    let columns = columns(pool).await?;
    match inexact_columns(&columns, REGISTRY_IDENTITY_COLUMNS, false).first() {
        Some((c, _)) => Err(inexact(database, c)),
        None => Ok(()),
    }
}

/// Converts every identity column of a tenant database that compares
/// inexactly to its exact type: the month tables' (created before migration
/// 0023, whose names a migration cannot know) and any listed column that
/// has drifted since (a restored or hand-made table). Unique keys become
/// exact with their columns; no stored byte changes. Returns `(table,
/// column, old type and collation)` of each conversion, for the operator.
pub async fn convert(pool: &MySqlPool) -> Result<Vec<(String, String, String)>, ExactError> {
    let columns = columns(pool).await?;
    let mut by_table: std::collections::BTreeMap<&str, Vec<(&ColumnInfo, &str)>> =
        Default::default();
    for (c, definition) in inexact_columns(&columns, IDENTITY_COLUMNS, true) {
        by_table.entry(&c.table).or_default().push((c, definition));
    }
    let mut converted = Vec::new();
    for (table, changes) in by_table {
        // `table` is a listed name or matched `im_(group|p2p)_messages_[0-9]{6}`.
        let modify: Vec<String> = changes
            .iter()
            .map(|(c, definition)| format!("MODIFY COLUMN {} {definition}", c.column))
            .collect();
        sqlx::query(&format!("ALTER TABLE `{table}` {}", modify.join(", ")))
            .execute(pool)
            .await?;
        for (c, _) in changes {
            converted.push((
                c.table.clone(),
                c.column.clone(),
                format!(
                    "{} {}",
                    c.column_type,
                    c.collation.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
    Ok(converted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(table: &str, column: &str, data_type: &str) -> ColumnInfo {
        ColumnInfo {
            table: table.into(),
            column: column.into(),
            data_type: data_type.into(),
            column_type: format!("{data_type}(64)"),
            collation: (data_type == "varchar").then(|| "utf8mb4_unicode_ci".to_string()),
        }
    }

    fn names<'a>(found: &[(&'a ColumnInfo, &str)]) -> Vec<(&'a str, &'a str)> {
        found
            .iter()
            .map(|(c, _)| (c.table.as_str(), c.column.as_str()))
            .collect()
    }

    #[test]
    fn only_binary_string_types_are_exact() {
        assert!(is_exact_type("varbinary"));
        assert!(is_exact_type("VARBINARY"));
        assert!(is_exact_type("binary"));
        for t in ["varchar", "char", "text", "blob", "enum"] {
            assert!(!is_exact_type(t), "{t}");
        }
    }

    #[test]
    fn month_tables_are_recognised_by_name() {
        assert!(is_month_table("im_group_messages_202609"));
        assert!(is_month_table("im_p2p_messages_202612"));
        assert!(!is_month_table("im_group_messages"));
        assert!(!is_month_table("im_group_messages_2026"));
        assert!(!is_month_table("im_group_messages_20260a"));
    }

    #[test]
    fn inexact_identity_columns_are_named_with_their_exact_definition() {
        let mut columns = vec![
            col("im_groups", "topic", "varbinary"),
            col("im_groups", "name", "varchar"),
            col("im_group_messages_202609", "topic", "varbinary"),
            col("im_group_messages_202609", "status", "varchar"),
        ];
        assert!(inexact_columns(&columns, IDENTITY_COLUMNS, true).is_empty());
        columns.push(col("im_p2p_messages_202609", "client_msg_id", "varchar"));
        columns.push(col("im_favorites", "topic", "varchar"));
        let found = inexact_columns(&columns, IDENTITY_COLUMNS, true);
        assert_eq!(
            names(&found),
            vec![
                ("im_p2p_messages_202609", "client_msg_id"),
                ("im_favorites", "topic")
            ]
        );
        assert_eq!(found[0].1, "VARBINARY(256) NULL");
        assert_eq!(found[1].1, "VARBINARY(64) NOT NULL");
        // Month tables are not the registry's business.
        assert!(inexact_columns(&columns, REGISTRY_IDENTITY_COLUMNS, false).is_empty());
        let err = inexact("im_t", found[1].0).to_string();
        assert!(
            err.contains("im_favorites.topic") && err.contains("utf8mb4_unicode_ci"),
            "{err}"
        );
    }

    /// The list is the migrations: each `MODIFY COLUMN` of 0023 is listed
    /// with the same definition, and every other listed column is created
    /// so by a later migration.
    #[test]
    fn the_list_is_what_the_migrations_do() {
        let sql = include_str!("../migrations/tenant/0023_exact_identities.sql");
        let mut from_sql = Vec::new();
        let mut table = "";
        for line in sql.lines().filter(|l| !l.starts_with("--")) {
            if let Some(t) = line.strip_prefix("ALTER TABLE ") {
                table = t.trim();
            } else if let Some(rest) = line.trim().strip_prefix("MODIFY COLUMN ") {
                let (column, definition) = rest.split_once(' ').unwrap();
                let definition = definition.trim_end_matches([',', ';']);
                from_sql.push((
                    table.to_string(),
                    column.to_string(),
                    definition.to_string(),
                ));
            }
        }
        let listed: Vec<(String, String, String)> = IDENTITY_COLUMNS
            .iter()
            .map(|(t, c, d)| (t.to_string(), c.to_string(), d.to_string()))
            .collect();
        assert_eq!(listed[..from_sql.len()], from_sql[..]);
        let later = [
            include_str!("../migrations/tenant/0024_seq_collisions.sql"),
            include_str!("../migrations/tenant/0025_pipeline_checkpoints.sql"),
            include_str!("../migrations/tenant/0031_group_invites_and_add_policy.sql"),
            include_str!("../migrations/tenant/0051_consistency_repairs.sql"),
            include_str!("../migrations/tenant/0052_user_notifications.sql"),
            include_str!("../migrations/tenant/0060_durable_write_side.sql"),
            include_str!("../migrations/tenant/0068_files.sql"),
            include_str!("../migrations/tenant/0071_profile_pictures.sql"),
        ];
        for (table, column, definition) in &listed[from_sql.len()..] {
            assert!(
                later.iter().any(|m| {
                    (m.contains(&format!("CREATE TABLE IF NOT EXISTS {table} ("))
                        && m.contains(&format!("\n  {column} {definition},")))
                        || (m.contains(&format!("ALTER TABLE {table}\n"))
                            && m.contains(&format!("MODIFY COLUMN {column} {definition};")))
                }),
                "{table}.{column} {definition}"
            );
        }
    }
}
