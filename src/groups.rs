//! Group facts the gateway checks on every send and subscribe — status,
//! members, roles, mutes — kept in MySQL (projected by the members
//! pipeline) and cached in Redis (cache-aside, seed 001 §5.2): a missing
//! cache is loaded from MySQL whole; projections update only what is cached.

use std::sync::LazyLock;

use crate::redis_util::Redis;
use redis::Script;
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::keys::TopicKeys;

/// Cached group entries expire so a rare load/update race heals itself.
pub const CACHE_TTL_SECS: i64 = 3600;

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

/// One group as stored in MySQL.
#[derive(Debug, Clone)]
pub struct GroupRecord {
    pub group_id: i64,
    pub status: String,
    pub mute_all: bool,
    /// (uid, role, muted_until_ms)
    pub members: Vec<(i64, Role, Option<i64>)>,
}

pub async fn read_group(pool: &MySqlPool, topic: &str) -> Result<GroupRecord, GroupError> {
    // A one-to-one topic is a group of its two users, always active.
    if let Some((a, b)) = crate::tinode::parse_p2p_topic(topic) {
        return Ok(GroupRecord {
            group_id: 0,
            status: "active".into(),
            mute_all: false,
            members: vec![(a, Role::Member, None), (b, Role::Member, None)],
        });
    }
    let row = sqlx::query("SELECT group_id, status, mute_all FROM im_groups WHERE topic = ?")
        .bind(topic)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| GroupError::NotFound(topic.to_string()))?;
    let members = sqlx::query(
        "SELECT uid, role, CAST(UNIX_TIMESTAMP(muted_until) * 1000 AS SIGNED) FROM im_group_members WHERE topic = ?",
    )
    .bind(topic)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| {
        Ok((
            r.try_get::<i64, _>(0)?,
            Role::parse(&r.try_get::<String, _>(1)?),
            r.try_get::<Option<i64>, _>(2)?,
        ))
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(GroupRecord {
        group_id: row.try_get(0)?,
        status: row.try_get(1)?,
        mute_all: row.try_get::<i8, _>(2)? != 0,
        members,
    })
}

/// The member of every cached member set that is not a user.
pub const MEMBERS_PLACEHOLDER: &str = "-";

static CACHE_GROUP: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../lua/cache_group.lua")));

/// The group's membership version (see [`bump_version`]); `""` when none.
pub async fn members_version(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
) -> redis::RedisResult<String> {
    let v: Option<String> = redis::cmd("GET")
        .arg(TopicKeys::new(tenant, topic).members_version())
        .query_async(redis)
        .await?;
    Ok(v.unwrap_or_default())
}

/// Bumps the membership version: the members pipeline calls it before it
/// applies a change to the cache, so a load that read MySQL earlier does
/// not overwrite the change.
pub async fn bump_version(redis: &mut Redis, tenant: &str, topic: &str) -> redis::RedisResult<()> {
    let key = TopicKeys::new(tenant, topic).members_version();
    redis::pipe()
        .incr(&key, 1)
        .ignore()
        .expire(&key, 7 * 86_400)
        .ignore()
        .query_async(redis)
        .await
}

/// Replaces the Redis cache of one group with `group`, atomically, if the
/// membership version is still `version` (the one read before MySQL was).
/// `false`: a change was projected meanwhile; load again.
pub async fn cache_group(
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    group: &GroupRecord,
    version: &str,
) -> Result<bool, GroupError> {
    let keys = TopicKeys::new(tenant, topic);
    let mut call = CACHE_GROUP.prepare_invoke();
    call.key(keys.members())
        .key(keys.roles())
        .key(keys.mutes())
        .key(keys.meta())
        .key(keys.members_version())
        .arg(version)
        .arg(CACHE_TTL_SECS)
        .arg(group.group_id)
        .arg(&group.status)
        .arg(if group.mute_all { "1" } else { "0" })
        // It is no uid, so no caller can ever match it.
        .arg(MEMBERS_PLACEHOLDER);
    for (uid, role, muted) in &group.members {
        call.arg(uid)
            .arg(if *role == Role::Member {
                ""
            } else {
                role.as_str()
            })
            .arg(muted.map(|m| m.to_string()).unwrap_or_default());
    }
    let cached: i64 = call.invoke_async(redis).await?;
    Ok(cached == 1)
}

/// Loads a group from MySQL into the Redis cache.
///
/// Concurrent loads of the same group in this process share one (the herd
/// of a big group's members subscribing at once loads it once).
pub async fn load(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
) -> Result<GroupRecord, GroupError> {
    let (pool, mut redis) = (pool.clone(), redis.clone());
    let (t, tp) = (tenant.to_string(), topic.to_string());
    LOADS
        .run((t.clone(), tp.clone()), async move {
            // A change projected between the MySQL read and the cache
            // write bumps the version: read again rather than cache a
            // membership that is already gone.
            for _ in 0..5 {
                let version = members_version(&mut redis, &t, &tp)
                    .await
                    .map_err(|e| e.to_string())?;
                let group = read_group(&pool, &tp).await.map_err(|e| e.to_string())?;
                if cache_group(&mut redis, &t, &tp, &group, &version)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    return Ok(group);
                }
            }
            Err(format!(
                "group {tp}: membership kept changing while loading"
            ))
        })
        .await
        .map_err(|e| {
            if e.starts_with("group ") && e.ends_with(" not found") {
                GroupError::NotFound(topic.to_string())
            } else {
                GroupError::Load(e)
            }
        })
}

type LoadResult = Result<GroupRecord, String>;

static LOADS: LazyLock<crate::history::coalesce::Coalescer<(String, String), LoadResult>> =
    LazyLock::new(Default::default);

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

/// Whether `uid` may attach to `topic`; loads the cache on a miss.
pub async fn membership(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    uid: i64,
) -> Result<Membership, GroupError> {
    // A one-to-one topic's members are in its name: nothing to load (and
    // nothing cached for a caller who is not one of them).
    if let Some((a, b)) = crate::tinode::parse_p2p_topic(topic) {
        return Ok(if uid == a || uid == b {
            Membership::Member
        } else {
            Membership::NotMember
        });
    }
    let keys = TopicKeys::new(tenant, topic);
    for _ in 0..2 {
        let (is_member, members_cached, status): (bool, bool, Option<String>) = redis::pipe()
            .sismember(keys.members(), uid)
            .exists(keys.members())
            .hget(keys.meta(), "status")
            .query_async(redis)
            .await?;
        if members_cached && status.is_some() {
            return Ok(match (status.as_deref(), is_member) {
                (Some("dissolved"), _) => Membership::Dissolved,
                (_, true) => Membership::Member,
                _ => Membership::NotMember,
            });
        }
        match load(pool, redis, tenant, topic).await {
            Ok(_) => continue,
            Err(GroupError::NotFound(_)) => return Ok(Membership::NotMember),
            Err(e) => return Err(e),
        }
    }
    Ok(Membership::NotMember)
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

/// `uid`'s standing in `topic` from the cache (loaded on a miss).
pub async fn standing(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    topic: &str,
    uid: i64,
) -> Result<Standing, GroupError> {
    let keys = TopicKeys::new(tenant, topic);
    for _ in 0..2 {
        type Reply = (bool, bool, Option<String>, Option<String>, Option<i64>);
        let (is_member, members_cached, status, role, muted): Reply = redis::pipe()
            .sismember(keys.members(), uid)
            .exists(keys.members())
            .hget(keys.meta(), "status")
            .hget(keys.roles(), uid)
            .hget(keys.mutes(), uid)
            .query_async(redis)
            .await?;
        if members_cached && status.is_some() {
            return Ok(match (status.as_deref(), is_member) {
                (Some("dissolved"), _) => Standing::NoGroup,
                (_, true) => Standing::Member {
                    role: role.as_deref().map_or(Role::Member, Role::parse),
                    muted_until: muted,
                },
                _ => Standing::NotMember,
            });
        }
        match load(pool, redis, tenant, topic).await {
            Ok(_) => continue,
            Err(GroupError::NotFound(_)) => return Ok(Standing::NoGroup),
            Err(e) => return Err(e),
        }
    }
    Ok(Standing::NotMember)
}

/// The owner of a group, from MySQL (governance of ownership is rare).
pub async fn owner(pool: &MySqlPool, topic: &str) -> Result<Option<i64>, GroupError> {
    Ok(
        sqlx::query_scalar("SELECT owner_uid FROM im_groups WHERE topic = ? AND status = 'active'")
            .bind(topic)
            .fetch_optional(pool)
            .await?,
    )
}
