//! The engines' sections: Kafka (brokers, topics with their partitions
//! and retention), Redis, MySQL (the server tenants default to) and the
//! schema registry.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma separated.
    pub brokers: String,
    /// Replication factor for topics created by `imstream topics ensure`.
    pub replication_factor: i32,
    /// `min.insync.replicas` of the topics `topics ensure` creates: with
    /// the producers' `acks=all`, a write is acknowledged only once this
    /// many replicas hold it.
    pub min_insync_replicas: i32,
    /// This deployment runs a single broker (a development stack): its
    /// acknowledged messages are lost with that broker's disk. Without it,
    /// `topics ensure` refuses a replication that can lose an acknowledged
    /// message when one broker fails (replication factor below 3,
    /// `min_insync_replicas` below 2, or not below the replication factor).
    pub single_broker: bool,
    /// Topic name prefix, so several deployments (or tests) can share a cluster.
    pub topic_prefix: String,
    pub topics: TopicsConfig,
    /// Extra librdkafka properties for every client (e.g. security settings).
    pub client_properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:19092".into(),
            replication_factor: 3,
            min_insync_replicas: 2,
            single_broker: false,
            topic_prefix: String::new(),
            topics: TopicsConfig::default(),
            client_properties: BTreeMap::new(),
        }
    }
}

/// Partition counts and retention of the event-log topics (ARCHITECTURE.md §2).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    pub group_events: TopicSpec,
    pub receipts: TopicSpec,
    pub session_control: TopicSpec,
    pub admin_commands: TopicSpec,
    pub admin_results: TopicSpec,
    /// Relations, user settings and user-targeted notifications: kept
    /// without a time limit (the relations projection is rebuilt from it).
    pub user_events: TopicSpec,
    /// Offline push tasks.
    pub push_tasks: TopicSpec,
    /// Partitions and retention of every `<topic>.<pipeline>.dlq` topic.
    pub dlq: TopicSpec,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        Self {
            // The event store: kept without a time limit so replays can rebuild.
            group_events: TopicSpec::new(8, -1),
            receipts: TopicSpec::new(8, 7 * DAY_MS),
            // Outlives every token (auth.token_ttl_secs, 14 days): a
            // revocation is still in the log while its token is valid.
            session_control: TopicSpec::new(4, 15 * DAY_MS),
            admin_commands: TopicSpec::new(4, 30 * DAY_MS),
            admin_results: TopicSpec::new(4, 30 * DAY_MS),
            user_events: TopicSpec::new(8, -1),
            push_tasks: TopicSpec::new(8, 7 * DAY_MS),
            dlq: TopicSpec::new(2, -1),
        }
    }
}

pub(super) const DAY_MS: i64 = 86_400_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicSpec {
    pub partitions: i32,
    /// `retention.ms`; -1 keeps records forever.
    pub retention_ms: i64,
}

impl TopicSpec {
    pub const fn new(partitions: i32, retention_ms: i64) -> Self {
        Self {
            partitions,
            retention_ms,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    pub url: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:16379".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MysqlConfig {
    /// Server URL without a database; tenant databases are appended. A
    /// tenant may name its own server (`tenants[].mysql_url`).
    pub url: String,
    /// Connections per tenant pool.
    pub max_connections: u32,
    /// A read replica further behind its primary than this is skipped:
    /// its reads go to the primary until it catches up.
    pub replica_max_lag_ms: u64,
    /// How often a gateway measures each replica's lag (a heartbeat row
    /// written on the primary, read back from the replica).
    pub replica_heartbeat_ms: u64,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        Self {
            url: "mysql://imstream:imstream@127.0.0.1:13306".into(),
            max_connections: 16,
            replica_max_lag_ms: 1_000,
            replica_heartbeat_ms: 500,
        }
    }
}

impl MysqlConfig {
    /// URL of one database on the configured server.
    pub fn database_url(&self, database: &str) -> String {
        let base = self.url.trim_end_matches('/');
        match base.split_once('?') {
            Some((server, query)) => format!("{server}/{database}?{query}"),
            None => format!("{base}/{database}"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryConfig {
    /// Where clients reach the schema registry (Confluent-compatible).
    pub url: String,
    /// Where `imstream registry` listens.
    pub listen: SocketAddr,
    /// Database on the MySQL server that holds the embedded registry's schemas.
    pub database: String,
    /// Bearer token the embedded registry requires for every change (a new
    /// schema version, deletes, compatibility settings); `imstream schemas
    /// register` sends it. Empty: no token (only `imstream dev` and
    /// `imstream registry --insecure-dev-secrets` accept that).
    pub write_token: String,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:18081".into(),
            listen: "127.0.0.1:18081".parse().expect("static address"),
            database: "imstream_registry".into(),
            write_token: String::new(),
        }
    }
}
