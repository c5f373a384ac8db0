//! Relations between users (seed 001 §5.2): friends and blocks, kept in
//! MySQL (projected from `im.user.events.v1` by the relations pipeline)
//! and cached in Redis sets, cache-aside: a missing set is loaded whole
//! (with a `0` placeholder so an empty set is known to be cached); the
//! projection only updates sets that are cached. The send path checks them
//! before a one-to-one message gets a seq.

use crate::redis_util::Redis;
use sqlx::mysql::MySqlPool;

use crate::keys::TenantKeys;

/// Cached relation sets expire so a rare load/update race heals itself.
pub const CACHE_TTL_SECS: i64 = 3600;

#[derive(Debug, thiserror::Error)]
pub enum RelationError {
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Which relation set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    Friends,
    Blocks,
}

impl Set {
    fn key(self, keys: &TenantKeys, uid: i64) -> String {
        match self {
            Set::Friends => keys.friends(uid),
            Set::Blocks => keys.blocks(uid),
        }
    }

    fn sql(self) -> &'static str {
        match self {
            Set::Friends => "SELECT friend_uid FROM im_friends WHERE uid = ?",
            Set::Blocks => "SELECT blocked_uid FROM im_blocks WHERE uid = ?",
        }
    }

    fn write_sql(self, present: bool) -> &'static str {
        match (self, present) {
            (Set::Friends, true) => "INSERT INTO im_friends (uid, friend_uid) VALUES (?, ?) ON DUPLICATE KEY UPDATE uid = uid",
            (Set::Friends, false) => "DELETE FROM im_friends WHERE uid = ? AND friend_uid = ?",
            (Set::Blocks, true) => "INSERT INTO im_blocks (uid, blocked_uid) VALUES (?, ?) ON DUPLICATE KEY UPDATE uid = uid",
            (Set::Blocks, false) => "DELETE FROM im_blocks WHERE uid = ? AND blocked_uid = ?",
        }
    }
}

/// Puts `other` into (or takes it out of) `uid`'s `set`: MySQL first, then
/// the Redis set if it is cached. Idempotent, so redelivery converges.
pub async fn set_member(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    set: Set,
    uid: i64,
    other: i64,
    present: bool,
) -> Result<(), RelationError> {
    sqlx::query(set.write_sql(present))
        .bind(uid)
        .bind(other)
        .execute(pool)
        .await?;
    update_cached(redis, tenant, set, uid, other, present).await?;
    Ok(())
}

/// One of a user's settings whose changes carry a version (issue 40): a
/// block of another user, a mute of a chat. The gateway writes each change
/// through before it answers and the relations projection applies the same
/// event later; the version keeps the projection from putting back an
/// older change (a block replayed after the unblock's write-through).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Versioned {
    Block {
        other: i64,
    },
    Mute {
        topic: String,
    },
    /// Hidden when online (Tinode's incognito).
    Incognito,
}

impl Versioned {
    /// Its row in `im_setting_versions`.
    fn name(&self) -> String {
        match self {
            Versioned::Block { other } => format!("block:{other}"),
            Versioned::Mute { topic } => format!("mute:{topic}"),
            Versioned::Incognito => "incognito".into(),
        }
    }
}

/// Hands out the next version of `uid`'s `setting`: past every version
/// handed out or applied before and past `now_ms`, and kept as handed out
/// before its event is produced, so a later change always outranks an
/// earlier one whose write-through failed, whatever the clocks of the
/// gateways say. Callers hold the user's settings lock.
pub async fn reserve_version(
    pool: &MySqlPool,
    uid: i64,
    setting: &Versioned,
    now_ms: i64,
) -> sqlx::Result<i64> {
    let name = setting.name();
    sqlx::query(
        "INSERT INTO im_setting_versions (uid, setting, version, reserved) VALUES (?, ?, 0, ?) \
         ON DUPLICATE KEY UPDATE reserved = GREATEST(reserved + 1, version + 1, VALUES(reserved))",
    )
    .bind(uid)
    .bind(&name)
    .bind(now_ms)
    .execute(pool)
    .await?;
    sqlx::query_scalar("SELECT reserved FROM im_setting_versions WHERE uid = ? AND setting = ?")
        .bind(uid)
        .bind(&name)
        .fetch_one(pool)
        .await
}

/// Turns `uid`'s `setting` on or off as of `version`, unless a newer
/// version was applied. MySQL and Redis are written while the version's
/// row is locked, so two writers of one setting write both stores in
/// version order (incognito's presence flag after the commit, as
/// committed: see [`sync_hidden`]). An event of the stored version is written again (a write-through
/// whose Redis step failed is finished by the projection); an event from
/// before versions (0) applies only while none is stored. Returns whether
/// it was applied.
pub async fn set_versioned(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    uid: i64,
    setting: &Versioned,
    on: bool,
    version: i64,
) -> Result<bool, RelationError> {
    let name = setting.name();
    let mut tx = pool.begin().await?;
    // The row is made first and then locked (a locking read of a missing
    // row takes a gap lock, and two writers of a new setting deadlock).
    sqlx::query(
        "INSERT INTO im_setting_versions (uid, setting, version) VALUES (?, ?, 0) \
         ON DUPLICATE KEY UPDATE version = version",
    )
    .bind(uid)
    .bind(&name)
    .execute(&mut *tx)
    .await?;
    let stored: i64 = sqlx::query_scalar(
        "SELECT version FROM im_setting_versions WHERE uid = ? AND setting = ? FOR UPDATE",
    )
    .bind(uid)
    .bind(&name)
    .fetch_one(&mut *tx)
    .await?;
    if version < stored || (version == 0 && stored > 0) {
        tx.rollback().await?;
        return Ok(false);
    }
    if version > stored {
        sqlx::query("UPDATE im_setting_versions SET version = ? WHERE uid = ? AND setting = ?")
            .bind(version)
            .bind(uid)
            .bind(&name)
            .execute(&mut *tx)
            .await?;
    }
    match setting {
        Versioned::Block { other } => {
            sqlx::query(Set::Blocks.write_sql(on))
                .bind(uid)
                .bind(*other)
                .execute(&mut *tx)
                .await?;
            update_cached(redis, tenant, Set::Blocks, uid, *other, on).await?;
        }
        Versioned::Mute { topic } => {
            sqlx::query(muted_sql(on))
                .bind(uid)
                .bind(topic)
                .execute(&mut *tx)
                .await?;
            let cmd = if on { "SADD" } else { "SREM" };
            let _: () = redis::cmd(cmd)
                .arg(TenantKeys::new(tenant).push_muted(uid))
                .arg(topic)
                .query_async(redis)
                .await?;
        }
        Versioned::Incognito => {
            let sql = if on {
                "INSERT INTO im_incognito (uid) VALUES (?) ON DUPLICATE KEY UPDATE uid = uid"
            } else {
                "DELETE FROM im_incognito WHERE uid = ?"
            };
            sqlx::query(sql).bind(uid).execute(&mut *tx).await?;
        }
    }
    tx.commit().await?;
    if *setting == Versioned::Incognito {
        // After the commit, what is committed: a login that read the row
        // before it does the same after writing its presence, so the last
        // write is always of the committed state.
        sync_hidden(pool, redis, tenant, uid).await?;
    }
    Ok(true)
}

fn muted_sql(muted: bool) -> &'static str {
    if muted {
        "INSERT INTO im_push_muted_topics (uid, topic) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE uid = uid"
    } else {
        "DELETE FROM im_push_muted_topics WHERE uid = ? AND topic = ?"
    }
}

/// Puts whether `uid` hides when online, as committed now, into their
/// presence (if they have any: a user not online has none).
pub async fn sync_hidden(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    uid: i64,
) -> Result<(), RelationError> {
    let flag = if incognito(pool, uid).await? {
        "1"
    } else {
        "0"
    };
    let presence = TenantKeys::new(tenant).presence_user(uid);
    crate::groups::if_cached(redis, &presence, "HSET", &["hidden".into(), flag.into()]).await?;
    Ok(())
}

/// Whether `uid` hides when online (Tinode's incognito).
pub async fn incognito(pool: &MySqlPool, uid: i64) -> sqlx::Result<bool> {
    let hidden: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_incognito WHERE uid = ?")
        .bind(uid)
        .fetch_one(pool)
        .await?;
    Ok(hidden > 0)
}

/// Writes `uid`'s settings of one chat as a whole, unless the stored row
/// is of a newer version (a replayed event after the gateway's own write).
/// Idempotent: the highest version stands.
pub async fn set_chat_settings(
    pool: &MySqlPool,
    uid: i64,
    s: &crate::events::ChatSettings,
) -> Result<(), RelationError> {
    sqlx::query(
        "INSERT INTO im_chat_settings (uid, topic, hidden_until_seq, private, version) \
         VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
         hidden_until_seq = IF(VALUES(version) >= version, VALUES(hidden_until_seq), hidden_until_seq), \
         private = IF(VALUES(version) >= version, VALUES(private), private), \
         version = GREATEST(version, VALUES(version))",
    )
    .bind(uid)
    .bind(&s.topic)
    .bind(s.hidden_until_seq)
    .bind(&s.private)
    .bind(s.version)
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether `other` is in `uid`'s `set` (friends of, blocked by `uid`).
pub async fn contains(
    pool: &MySqlPool,
    redis: &mut Redis,
    tenant: &str,
    set: Set,
    uid: i64,
    other: i64,
) -> Result<bool, RelationError> {
    let key = set.key(&TenantKeys::new(tenant), uid);
    let (cached, member): (bool, bool) = redis::pipe()
        .exists(&key)
        .sismember(&key, other)
        .query_async(redis)
        .await?;
    if cached {
        return Ok(member);
    }
    let members: Vec<i64> = sqlx::query_scalar(set.sql())
        .bind(uid)
        .fetch_all(pool)
        .await?;
    let mut pipe = redis::pipe();
    pipe.atomic().del(&key).ignore().sadd(&key, 0i64).ignore();
    for chunk in members.chunks(1000) {
        pipe.sadd(&key, chunk).ignore();
    }
    pipe.expire(&key, CACHE_TTL_SECS).ignore();
    pipe.query_async::<()>(redis).await?;
    Ok(members.contains(&other))
}

/// Adds or removes `other` in `uid`'s cached `set`, if it is cached.
async fn update_cached(
    redis: &mut Redis,
    tenant: &str,
    set: Set,
    uid: i64,
    other: i64,
    present: bool,
) -> redis::RedisResult<()> {
    let key = set.key(&TenantKeys::new(tenant), uid);
    let command = if present { "SADD" } else { "SREM" };
    crate::groups::if_cached(redis, &key, command, &[other.to_string()]).await
}
