//! Pinning messages from Tinode's web app (issue 40, `{set aux={pins}}`):
//! a chat's owner or admin (either user of a one-to-one chat) sets the
//! whole list; a `PinsChanged` event, then written through before the
//! answer ([`crate::pins`]), one change per chat at a time so the writes
//! land in log order.

use crate::events::{GroupEvent, GroupEventBody, Pins};
use crate::groups::{Role, Standing};
use crate::kafka::topics::TopicKind;
use crate::tinode;

use super::edits::Caller;
use super::refusal::Refusal;
use super::Gateway;

/// How long one change may hold the chat's lock.
const PINS_LOCK_MS: u64 = 30_000;

/// Sets the pins of `topic` (stored name) from Tinode's `aux` object.
pub async fn set(
    gw: &Gateway,
    caller: &Caller<'_>,
    topic: &str,
    aux: &serde_json::Value,
) -> Result<(), Refusal> {
    let Some(aux) = aux.as_object() else {
        return Err(Refusal(400, "malformed: aux is an object".into()));
    };
    if aux.keys().any(|k| k != "pins") {
        return Err(Refusal(400, "malformed: only aux.pins is kept".into()));
    }
    let Some(value) = aux.get("pins") else {
        return Ok(());
    };
    may_pin(gw, caller, topic).await?;
    let last = super::reads::last_seq(gw, caller.tenant, topic).await?;
    let pins =
        crate::pins::parse(value, last).map_err(|why| Refusal(400, format!("malformed: {why}")))?;
    let pool = gw.pools.get(caller.tenant).map_err(Refusal::internal)?;
    let mut redis = gw.redis.clone();
    let key = crate::keys::TopicKeys::new(caller.tenant, topic).pins_lock();
    let lock = crate::redis_util::RedisLock::acquire_waiting(
        &mut redis,
        &key,
        PINS_LOCK_MS,
        std::time::Duration::from_secs(2),
    )
    .await
    .map_err(Refusal::unavailable)?
    .ok_or_else(|| Refusal(503, "the pins are being changed; try again".into()))?;
    let done = async {
        let event = GroupEvent {
            actor_device: caller.origin.device.clone(),
            source_sid: caller.origin.sid.clone(),
            source_node: gw.node_id.clone(),
            ..GroupEvent::new(
                caller.tenant,
                topic,
                caller.uid,
                GroupEventBody::PinsChanged(Pins { pins: pins.clone() }),
            )
        };
        gw.sender
            .producer()
            .send(
                TopicKind::GroupEvents,
                &format!("{}:{topic}", caller.tenant),
                &event,
                None,
            )
            .await
            .map_err(Refusal::unavailable)?;
        crate::pins::write(pool, topic, &pins)
            .await
            .map_err(Refusal::unavailable)
    }
    .await;
    let _ = lock.release(&mut redis).await;
    done
}

/// Either user of a one-to-one chat; a group's owner or admin.
async fn may_pin(gw: &Gateway, caller: &Caller<'_>, topic: &str) -> Result<(), Refusal> {
    if tinode::is_p2p_topic(topic) {
        return match tinode::p2p_peer(topic, caller.uid) {
            Some(_) => Ok(()),
            None => Err(Refusal(404, "topic not found".into())),
        };
    }
    let standing = gw
        .governance
        .standing(caller.tenant, topic, caller.uid)
        .await
        .map_err(|crate::governance::Refused(code, text)| Refusal(code, text))?;
    match standing {
        Standing::Member {
            role: Role::Owner | Role::Admin,
            ..
        } => Ok(()),
        Standing::Member { .. } => Err(Refusal(
            403,
            "only the group's owner or an admin pins messages".into(),
        )),
        _ => Err(Refusal(404, "topic not found".into())),
    }
}
