//! Per-user caps checked and taken atomically (issue 30): how many
//! favorites a user keeps (`limits.favorites_per_user`) and how many
//! history-clear ranges they hold in one topic (`limits.dellog_per_user`).
//! A count read from a projection lags the requests it should bound, so
//! concurrent requests all passed it; here the check and the take are one
//! script (`lua/cap_take.lua`) on state in Redis under the user's (or the
//! topic's) hash tag. That state is derived from MySQL when missing,
//! expired (a day after the user's last use) or written by another
//! incarnation of Redis; a take whose event never reached the log only
//! makes the count conservative until then.

use std::sync::LazyLock;

use sqlx::MySqlPool;

use crate::keys::{TopicKeys, UserKeys};
use crate::redis_util::Redis;

static CAP: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../lua/cap_take.lua")));

/// A cap's state lives this long after its last use.
const TTL_MS: i64 = 24 * 3600 * 1000;

#[derive(Debug, thiserror::Error)]
pub enum CapError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("mysql: {0}")]
    Db(#[from] sqlx::Error),
    #[error("cap state kept changing")]
    Unsettled,
}

/// What a take found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Taken; the new count.
    Ok(i64),
    /// The item is held already (nothing taken).
    Held,
    /// Over the cap: the count held.
    Full(i64),
}

/// Which cap.
#[derive(Debug, Clone)]
pub enum Cap<'a> {
    /// A user's favorites (`topic|seq` items).
    Favorites { uid: i64 },
    /// A user's history-clear ranges in one topic.
    Dellog { topic: &'a str, uid: i64 },
}

impl Cap<'_> {
    fn key(&self, tenant: &str) -> String {
        match self {
            Cap::Favorites { uid } => UserKeys::new(tenant, *uid).favorites(),
            Cap::Dellog { topic, uid } => TopicKeys::new(tenant, topic).dellog_count(*uid),
        }
    }

    /// The count and items MySQL holds.
    async fn derive(&self, pool: &MySqlPool) -> Result<(i64, Vec<String>), sqlx::Error> {
        match self {
            Cap::Favorites { uid } => {
                let rows: Vec<(crate::exact::Exact, i64)> =
                    sqlx::query_as("SELECT topic, seq FROM im_favorites WHERE uid = ?")
                        .bind(uid)
                        .fetch_all(pool)
                        .await?;
                let items: Vec<String> = rows
                    .into_iter()
                    .map(|(topic, seq)| favorite_item(&topic, seq))
                    .collect();
                Ok((items.len() as i64, items))
            }
            Cap::Dellog { topic, uid } => Ok((
                crate::store::dellog::own_rows(pool, topic, *uid).await?,
                Vec::new(),
            )),
        }
    }
}

/// The item a favorite is counted as.
pub fn favorite_item(topic: &str, seq: i64) -> String {
    format!("{topic}|{seq}")
}

/// Takes `amount` of `cap` (at most `limit` in all) for `item` (a
/// favorite) or none (a count).
pub async fn take(
    redis: &mut Redis,
    pool: &MySqlPool,
    tenant: &str,
    cap: Cap<'_>,
    limit: usize,
    amount: i64,
    item: Option<&str>,
) -> Result<Taken, CapError> {
    let key = cap.key(tenant);
    for _ in 0..3 {
        let reply: Vec<String> = CAP
            .key(&key)
            .arg("take")
            .arg(limit)
            .arg(amount)
            .arg(item.unwrap_or(""))
            .arg(TTL_MS)
            .invoke_async(redis)
            .await?;
        let n = reply.get(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        match reply.first().map(String::as_str) {
            Some("OK") => return Ok(Taken::Ok(n)),
            Some("HELD") => return Ok(Taken::Held),
            Some("FULL") => return Ok(Taken::Full(n)),
            _ => {
                // Missing or written by another incarnation: from MySQL.
                let (count, items) = cap.derive(pool).await?;
                let mut seed = CAP.key(&key);
                seed.arg("seed").arg(TTL_MS).arg(count);
                for i in &items {
                    seed.arg(i);
                }
                let _: i64 = seed.invoke_async(redis).await?;
            }
        }
    }
    Err(CapError::Unsettled)
}

/// Gives `item` back (a favorite removed); nothing when the state is not
/// live (it is derived from MySQL again when next needed).
pub async fn give(
    redis: &mut Redis,
    tenant: &str,
    cap: Cap<'_>,
    item: &str,
) -> Result<(), CapError> {
    let _: i64 = CAP
        .key(cap.key(tenant))
        .arg("give")
        .arg(item)
        .invoke_async(redis)
        .await?;
    Ok(())
}
