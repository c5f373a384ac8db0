//! `tenants`: each tenant's database (on its own server, if configured),
//! read replica and signing keys.

use serde::{Deserialize, Serialize};

use super::{MysqlConfig, SigningKey};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant id: `[a-z0-9_]{1,32}`; appears in Redis keys and Kafka keys.
    pub id: String,
    /// The tenant's own database on its MySQL server.
    pub database: String,
    /// Keys of this tenant's session tokens: the first signs, every one
    /// verifies (list the new key first and keep the old one during a
    /// roll-over). Empty: `auth.jwt_secret` signs and verifies.
    #[serde(default)]
    pub signing_keys: Vec<SigningKey>,
    /// The tenant's MySQL server (URL without a database), so tenants can
    /// be spread over servers; `None`: `mysql.url`. Migrations, the shard
    /// manager, pipelines, replay, legacy migration and archive follow it.
    #[serde(default)]
    pub mysql_url: Option<String>,
    /// A read replica of that server (seed 003 §11.1): history pages read
    /// from it while its replication lag is within
    /// `mysql.replica_max_lag_ms`; reads that must see their own writes
    /// (edit and recall checks) stay on the primary.
    #[serde(default)]
    pub mysql_read_url: Option<String>,
}

impl TenantConfig {
    /// The MySQL settings of this tenant's server (`mysql` with the
    /// tenant's URL, when it has one).
    pub fn mysql(&self, mysql: &MysqlConfig) -> MysqlConfig {
        match &self.mysql_url {
            Some(url) => MysqlConfig {
                url: url.clone(),
                ..mysql.clone()
            },
            None => mysql.clone(),
        }
    }

    /// The MySQL settings of this tenant's read replica, if it has one.
    pub fn mysql_read(&self, mysql: &MysqlConfig) -> Option<MysqlConfig> {
        self.mysql_read_url.as_ref().map(|url| MysqlConfig {
            url: url.clone(),
            ..mysql.clone()
        })
    }
}
