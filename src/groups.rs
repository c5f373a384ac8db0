//! The words of group membership — roles, membership, standing — as the
//! gateway and governance use them. The facts themselves live in the group
//! write model ([`crate::group_model`]): every command is checked and
//! applied there, and every membership check reads it; MySQL holds the
//! members projection the model is rebuilt from.

use std::sync::LazyLock;

use crate::redis_util::Redis;
use redis::Script;

static IF_CACHED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/if_cached.lua")));

#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("group {0} not found")]
    NotFound(String),
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("loading the group: {0}")]
    Load(String),
}

/// Roles of group members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Owner,
    Admin,
    Member,
}

impl Role {
    pub fn parse(s: &str) -> Role {
        match s {
            "owner" => Role::Owner,
            "admin" => Role::Admin,
            _ => Role::Member,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }
}

/// The member of every member set that is not a user (an empty group's
/// set still exists, so "no members" and "not in Redis" differ).
pub const MEMBERS_PLACEHOLDER: &str = "-";

/// Applies one write to a cached key only (see `lua/if_cached.lua`).
pub async fn if_cached(
    redis: &mut Redis,
    key: &str,
    command: &str,
    args: &[String],
) -> redis::RedisResult<()> {
    let mut invocation = IF_CACHED.key(key);
    invocation.arg(command);
    for a in args {
        invocation.arg(a);
    }
    let _: redis::Value = invocation.invoke_async(redis).await?;
    Ok(())
}

/// Membership as the gateway sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    Member,
    NotMember,
    Dissolved,
}

/// A user's place in a group, as governance checks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The group does not exist or is dissolved.
    NoGroup,
    NotMember,
    Member {
        role: Role,
        /// Epoch ms; `None` when not muted.
        muted_until: Option<i64>,
    },
}
