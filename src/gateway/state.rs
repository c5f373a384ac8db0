//! The shared state of one gateway process: its services as fields, so a
//! handler names what it uses (`gw.pools`, `gw.redis`, `gw.groups`, …)
//! instead of reaching through the send path for them.

use crate::config::Config;
use crate::group_model::GroupModel;
use crate::redis_util::Redis;
use crate::send::Sender;
use crate::shutdown::Shutdown;
use crate::snowflake::Snowflake;
use crate::tenant::TenantPools;

use super::limits;

/// Shared state of one gateway process.
pub struct Gateway {
    pub config: Config,
    pub node_id: String,
    /// The send path: ACL, seq allocation, produce, ack.
    pub sender: Sender,
    /// Tenant databases (and their read replicas), the send path's own.
    pub pools: TenantPools,
    /// Redis (one server or a Cluster), cheap to clone.
    pub redis: Redis,
    /// The group write model every command is checked against.
    pub groups: GroupModel,
    pub history: crate::history::History,
    pub governance: crate::governance::Executor,
    pub tokens: crate::auth::Tokens,
    pub snowflake: Snowflake,
    /// This node's local sessions.
    pub hub: crate::realtime::hub::Hub,
    pub shutdown: Shutdown,
    /// Open connections per client address (`limits.connections_per_ip`).
    pub connections: limits::Connections,
    /// The search indexes this gateway reads (`GET /v1/search`).
    pub search: crate::search::query::Indexes,
    /// Where uploaded files' bytes live (`files.store_url`).
    pub files: crate::files::store::FileStore,
}
