//! Putting one group's write model back into Redis from its durable copy
//! ([`super::durable`]) when Redis does not hold a live one: missing (a new
//! name, a Redis that lost its data), partial (a part evicted or deleted
//! on its own) or written by another incarnation of Redis (a restart from
//! an older AOF or RDB, a replica promoted while it lagged).
//!
//! One transaction reads the model and raises its epoch; when Redis still
//! holds that very version, whole and synced (a restart that lost nothing
//! of it), the model is only stamped with the new incarnation and epoch,
//! else it is installed whole. No waiting, no log: every change a command
//! answered for is in MySQL, and one applied but not stored is fenced off
//! by the epoch (its command answers "retry").
//!
//! A one-to-one topic's model comes from its name. A tenant upgraded with
//! data may hold groups from before durable models: those are derived once
//! from the members projection and the log ([`super::rebuild`]) and stored.

use crate::groups::Role;
use crate::keys::TopicKeys;
use crate::store::marks;

use super::durable::{self, Model};
use super::{Existence, Inner, ModelError};

/// How long a "no such group" answer is kept in Redis for every gateway:
/// a name nobody created costs one MySQL lookup per this long.
pub const ABSENT_TTL_MS: i64 = 30_000;
/// How long a create's `none` marker lives if the create never comes.
const NONE_TTL_MS: i64 = 30_000;

static RESTORE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../lua/group_restore.lua")));

/// What a restore is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Restore unless Redis holds a live model.
    IfNotLive,
    /// The same, and a name with no group gets a `none` marker for a create
    /// to decide on.
    ForCreate,
    /// Restore whatever Redis holds (a change was applied to a model that
    /// was replaced since): the raised epoch wins over a live model.
    Force,
}

pub(super) async fn restore(
    inner: &Inner,
    tenant: &str,
    topic: &str,
    mode: Mode,
) -> Result<Existence, ModelError> {
    let keys = TopicKeys::new(tenant, topic);
    let mut redis = inner.redis.clone();
    if mode != Mode::Force {
        let probe = super::probe_keys(&mut redis, &keys).await?;
        match probe.as_deref() {
            Some("OK") => return Ok(Existence::Live),
            Some("ABSENT") if mode == Mode::IfNotLive => return Ok(Existence::Absent),
            _ => {}
        }
    }
    metrics::counter!(crate::metrics::WRITE_RESTORES_TOTAL, "what" => "group", "how" => "lazy")
        .increment(1);
    if let Some((a, b)) = crate::tinode::parse_p2p_topic(topic) {
        install(&mut redis, &keys, &one_to_one(a, b)).await?;
        return Ok(Existence::Live);
    }
    let pool = inner
        .pools
        .get(tenant)
        .map_err(|e| ModelError::Rebuild(e.to_string()))?;
    let mut model = durable::load_for_restore(pool, topic)
        .await
        .map_err(ModelError::mysql)?;
    if model.is_none() && !marks::complete(pool).await.map_err(ModelError::mysql)? {
        // A group from before durable models: derived once, then stored.
        if let Some(derived) = super::rebuild::legacy(inner, tenant, topic)
            .await
            .map_err(ModelError::Rebuild)?
        {
            durable::sync_whole(pool, topic, &derived, None)
                .await
                .map_err(ModelError::mysql)?;
            model = durable::load_for_restore(pool, topic)
                .await
                .map_err(ModelError::mysql)?;
        }
    }
    let Some(mut model) = model else {
        return absent(&mut redis, &keys, mode).await;
    };
    // The same version, whole and synced: only the stamp changes.
    let restamped: i64 = restamp(&keys, &model).invoke_async(&mut redis).await?;
    if restamped >= 0 {
        return Ok(Existence::Live);
    }
    model.rows = durable::rows_of(pool, &[topic.to_string()])
        .await
        .map_err(ModelError::mysql)?
        .remove(topic)
        .unwrap_or_default();
    install(&mut redis, &keys, &model).await?;
    tracing::info!(
        tenant,
        topic,
        version = model.version,
        epoch = model.epoch,
        users = model.rows.len(),
        "group write model restored from MySQL"
    );
    Ok(Existence::Live)
}

/// No group has the name: a `none` marker for a create, else the name's
/// "no such group" marker (and a model Redis held of it is dropped).
async fn absent(
    redis: &mut crate::redis_util::Redis,
    keys: &TopicKeys,
    mode: Mode,
) -> Result<Existence, ModelError> {
    if mode == Mode::ForCreate {
        let _: i64 = restore_call(keys, "none")
            .arg(NONE_TTL_MS)
            .invoke_async(redis)
            .await?;
        return Ok(Existence::Live);
    }
    if mode == Mode::Force {
        let _: () = redis::cmd("DEL")
            .arg(keys.meta())
            .arg(keys.members())
            .arg(keys.roles())
            .arg(keys.mutes())
            .arg(keys.invites())
            .arg(keys.left())
            .query_async(redis)
            .await?;
    }
    let _: () = redis::cmd("SET")
        .arg(keys.absent())
        .arg("1")
        .arg("PX")
        .arg(ABSENT_TTL_MS)
        .query_async(redis)
        .await?;
    Ok(Existence::Absent)
}

/// A one-to-one topic's model: its two users, always active.
fn one_to_one(a: i64, b: i64) -> Model {
    let member = |uid| durable::Row::from_parts(uid, "member", "", "", "");
    Model {
        meta: durable::Meta {
            group_id: 0,
            status: "active".into(),
            owner: 0,
            prev_owner: 0,
            mute_all: false,
        },
        version: 0,
        epoch: 0,
        rows: vec![member(a), member(b)],
    }
}

/// Installs `model` whole (`lua/group_restore.lua`); 1 when installed.
pub async fn install(
    redis: &mut crate::redis_util::Redis,
    keys: &TopicKeys,
    model: &Model,
) -> Result<i64, ModelError> {
    Ok(invocation(keys, model).invoke_async(redis).await?)
}

/// A `lua/group_restore.lua` call on a group's keys doing `op`.
fn restore_call(keys: &TopicKeys, op: &str) -> redis::ScriptInvocation<'static> {
    let mut call = RESTORE.prepare_invoke();
    call.key(keys.meta())
        .key(keys.members())
        .key(keys.roles())
        .key(keys.mutes())
        .key(keys.invites())
        .key(keys.left())
        .key(keys.absent())
        .arg(op);
    call
}

/// The call that restamps the model Redis holds when it is `model`'s very
/// version, whole and synced (only the stamp changes); -1 when it is not
/// (the caller installs the whole model).
fn restamp(keys: &TopicKeys, model: &Model) -> redis::ScriptInvocation<'static> {
    let mut call = restore_call(keys, "restamp");
    call.arg(0)
        .arg(&model.meta.status)
        .arg(model.meta.group_id)
        .arg(model.meta.owner)
        .arg(model.meta.prev_owner)
        .arg(if model.meta.mute_all { "1" } else { "0" })
        .arg(model.version)
        .arg(model.epoch);
    call
}

/// The `lua/group_restore.lua` call that installs `model` whole (a bulk
/// restore pipelines many).
pub fn invocation(keys: &TopicKeys, model: &Model) -> redis::ScriptInvocation<'static> {
    let mut call = restore_call(keys, "model");
    call.arg(0)
        .arg(&model.meta.status)
        .arg(model.meta.group_id)
        .arg(if model.meta.owner > 0 {
            model.meta.owner.to_string()
        } else {
            String::new()
        })
        .arg(if model.meta.prev_owner > 0 {
            model.meta.prev_owner.to_string()
        } else {
            String::new()
        })
        .arg(if model.meta.mute_all { "1" } else { "0" })
        .arg(model.version)
        .arg(model.epoch);
    let members: Vec<&durable::Row> = model
        .rows
        .iter()
        .filter(|r| matches!(r.place.as_str(), "owner" | "admin" | "member"))
        .collect();
    call.arg(members.len());
    for r in members {
        call.arg(r.uid)
            .arg(if r.place == Role::Member.as_str() {
                ""
            } else {
                r.place.as_str()
            })
            .arg(r.muted_until.map(|m| m.to_string()).unwrap_or_default());
    }
    let invited: Vec<&durable::Row> = model.rows.iter().filter(|r| r.place == "invited").collect();
    call.arg(invited.len());
    for r in invited {
        call.arg(r.uid).arg(r.inviter.unwrap_or(0));
    }
    let left: Vec<(i64, String)> = model
        .rows
        .iter()
        .filter_map(|r| r.left_text().map(|t| (r.uid, t)))
        .collect();
    call.arg(left.len());
    for (uid, text) in left {
        call.arg(uid).arg(text);
    }
    call
}

/// Restores the models of `topics` (a bulk restore's page) that Redis does
/// not hold live: one transaction reads them all and raises their epochs;
/// each is stamped when Redis holds its very version, installed else.
/// `(stamped, installed)`.
pub(super) async fn restore_many(
    inner: &Inner,
    tenant: &str,
    topics: &[String],
) -> Result<(usize, usize), ModelError> {
    use futures::StreamExt;
    const IN_FLIGHT: usize = 64;
    let probes = topics
        .iter()
        .map(|topic| {
            let keys = TopicKeys::new(tenant, topic);
            let mut redis = inner.redis.clone();
            async move {
                super::probe_keys(&mut redis, &keys)
                    .await
                    .map(|r| r.as_deref() == Some("OK"))
            }
        })
        .collect::<Vec<_>>();
    let live: Vec<bool> = futures::stream::iter(probes)
        .buffered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let due: Vec<String> = topics
        .iter()
        .zip(live)
        .filter(|(_, live)| !live)
        .map(|(t, _)| t.clone())
        .collect();
    if due.is_empty() {
        return Ok((0, 0));
    }
    let pool = inner
        .pools
        .get(tenant)
        .map_err(|e| ModelError::Rebuild(e.to_string()))?;
    let models = durable::load_many_for_restore(pool, &due)
        .await
        .map_err(ModelError::mysql)?;
    let stamps = models
        .iter()
        .map(|(topic, model)| {
            let keys = TopicKeys::new(tenant, topic);
            let mut redis = inner.redis.clone();
            let call = restamp(&keys, model);
            async move { call.invoke_async::<i64>(&mut redis).await }
        })
        .collect::<Vec<_>>();
    let stamped: Vec<i64> = futures::stream::iter(stamps)
        .buffered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let whole: Vec<(String, Model)> = models
        .into_iter()
        .zip(stamped.iter())
        .filter(|(_, s)| **s < 0)
        .map(|(m, _)| m)
        .collect();
    let names: Vec<String> = whole.iter().map(|(t, _)| t.clone()).collect();
    let mut rows = durable::rows_of(pool, &names)
        .await
        .map_err(ModelError::mysql)?;
    let installs = whole
        .into_iter()
        .map(|(topic, mut model)| {
            model.rows = rows.remove(&topic).unwrap_or_default();
            let keys = TopicKeys::new(tenant, &topic);
            let mut redis = inner.redis.clone();
            async move { install(&mut redis, &keys, &model).await }
        })
        .collect::<Vec<_>>();
    let installed: Vec<i64> = futures::stream::iter(installs)
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let stamped = stamped.iter().filter(|s| **s == 1).count();
    let installed = installed.iter().filter(|s| **s == 1).count();
    metrics::counter!(crate::metrics::WRITE_RESTORES_TOTAL, "what" => "group", "how" => "bulk")
        .increment((stamped + installed) as u64);
    Ok((stamped, installed))
}
