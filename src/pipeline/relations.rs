//! The relations pipeline's handler: user events into MySQL (friends,
//! blocks, friend requests, push settings, profiles, favorites, the user's
//! notifications and their read state) and the cached Redis sets the
//! send path checks. Every write is an upsert or a delete, so redelivery
//! and replay converge to the same state.

use crate::redis_util::Redis;

use crate::conversations::hot::{self, HotError};
use crate::events::{EventCodec, UserEvent, UserEventBody};
use crate::keys::TenantKeys;
use crate::notifications;
use crate::references::favorites;
use crate::relations::{self, Set, Versioned};
use crate::tenant::{db_failure, TenantPools};

use super::failure::{redis_failure, relation_failure, FailureKind};
use super::records::{apply_in_order, Handler, Record, RecordFailure};

pub struct RelationsHandler {
    codec: EventCodec,
    pools: TenantPools,
    redis: Redis,
    /// How long a picture no profile shows any more is kept
    /// (`files.deleted_retention_secs`).
    retention_secs: u64,
}

impl RelationsHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, redis: Redis, retention_secs: u64) -> Self {
        Self {
            codec,
            pools,
            redis,
            retention_secs,
        }
    }

    /// The event's tenant database (an unknown tenant is poison).
    fn pool(&self, e: &UserEvent) -> Result<&sqlx::MySqlPool, (FailureKind, String)> {
        self.pools
            .get(&e.tenant_id)
            .map_err(|err| (FailureKind::Poison, err.to_string()))
    }

    /// A friend edge of the event's user.
    async fn edge(
        &self,
        e: &UserEvent,
        set: Set,
        other: i64,
        present: bool,
    ) -> Result<(), (FailureKind, String)> {
        let pool = self.pool(e)?;
        let mut redis = self.redis.clone();
        relations::set_member(pool, &mut redis, &e.tenant_id, set, e.uid, other, present)
            .await
            .map_err(|err| (relation_failure(&err), err.to_string()))
    }

    /// A block or a mute of the event's user, unless a newer one is stored
    /// (the gateway's write-through of a later change).
    async fn versioned(
        &self,
        e: &UserEvent,
        setting: &Versioned,
        on: bool,
        version: i64,
    ) -> Result<(), (FailureKind, String)> {
        let pool = self.pool(e)?;
        let mut redis = self.redis.clone();
        relations::set_versioned(pool, &mut redis, &e.tenant_id, e.uid, setting, on, version)
            .await
            .map(|_| ())
            .map_err(|err| (relation_failure(&err), err.to_string()))
    }

    async fn apply(&self, e: &UserEvent) -> Result<(), (FailureKind, String)> {
        let pool = self.pool(e)?;
        let mut redis = self.redis.clone();
        let db = |e: sqlx::Error| (db_failure(&e), format!("mysql: {e}"));
        let rd = |e: redis::RedisError| (redis_failure(&e), format!("redis: {e}"));
        // What the user is told about (friend requests, operator notices).
        let notices = notifications::of_user_event(e);
        if !notices.is_empty() {
            notifications::record(pool, &notices).await.map_err(db)?;
        }
        match &e.body {
            UserEventBody::FriendRequestCreated(r) => {
                sqlx::query(
                    "INSERT INTO im_friend_requests (from_uid, to_uid, status, message) VALUES (?, ?, 'pending', ?) \
                     ON DUPLICATE KEY UPDATE status = IF(status = 'accepted', status, 'pending'), message = VALUES(message)",
                )
                .bind(r.from_uid)
                .bind(e.uid)
                .bind(&r.message)
                .execute(pool)
                .await
                .map_err(db)?;
            }
            UserEventBody::FriendRequestAccepted(a) => {
                sqlx::query(
                    "UPDATE im_friend_requests SET status = 'accepted' WHERE from_uid = ? AND to_uid = ?",
                )
                .bind(e.uid)
                .bind(a.by_uid)
                .execute(pool)
                .await
                .map_err(db)?;
            }
            UserEventBody::FriendAdded(f) => self.edge(e, Set::Friends, f.friend_uid, true).await?,
            UserEventBody::FriendRemoved(f) => {
                self.edge(e, Set::Friends, f.friend_uid, false).await?
            }
            UserEventBody::UserBlocked(b) => {
                let block = Versioned::Block {
                    other: b.blocked_uid,
                };
                self.versioned(e, &block, true, b.version).await?
            }
            UserEventBody::UserUnblocked(b) => {
                let block = Versioned::Block {
                    other: b.blocked_uid,
                };
                self.versioned(e, &block, false, b.version).await?
            }
            UserEventBody::PushSettingsChanged(p) => {
                let keys = TenantKeys::new(&e.tenant_id);
                if let Some(dnd) = p.dnd {
                    sqlx::query(
                        "INSERT INTO im_push_settings (uid, dnd) VALUES (?, ?) ON DUPLICATE KEY UPDATE dnd = VALUES(dnd)",
                    )
                    .bind(e.uid)
                    .bind(dnd)
                    .execute(pool)
                    .await
                    .map_err(db)?;
                    let cmd = if dnd {
                        redis::cmd("SET").arg(keys.dnd(e.uid)).arg(1).clone()
                    } else {
                        redis::cmd("DEL").arg(keys.dnd(e.uid)).clone()
                    };
                    let _: () = cmd.query_async(&mut redis).await.map_err(rd)?;
                }
                if let Some(topic) = &p.topic {
                    let mute = Versioned::Mute {
                        topic: topic.clone(),
                    };
                    self.versioned(e, &mute, p.topic_muted, p.version).await?
                }
            }
            UserEventBody::ProfileChanged(p) => {
                sqlx::query(
                    "INSERT INTO im_user_profiles (uid, full_name, photo, note) VALUES (?, ?, ?, ?) \
                     ON DUPLICATE KEY UPDATE full_name = COALESCE(VALUES(full_name), full_name), \
                     photo = COALESCE(VALUES(photo), photo), note = COALESCE(VALUES(note), note)",
                )
                .bind(e.uid)
                .bind(&p.full_name)
                .bind(&p.photo)
                .bind(&p.note)
                .execute(pool)
                .await
                .map_err(db)?;
                // The user's picture: the new one recorded, the old released.
                if let Some(photo) = &p.photo {
                    let owner = crate::tinode::names::user_id(e.uid);
                    crate::files::set_picture(pool, &owner, photo, self.retention_secs)
                        .await
                        .map_err(db)?;
                }
                hot::refresh_user_profile(pool, &mut redis, &e.tenant_id, e.uid)
                    .await
                    .map_err(|err| match err {
                        HotError::Db(err) => db(err),
                        HotError::Redis(err) => rd(err),
                    })?;
            }
            UserEventBody::FavoriteAdded(f) => {
                favorites::add(pool, e.uid, &f.topic, f.seq, e.occurred_at)
                    .await
                    .map_err(db)?;
            }
            UserEventBody::FavoriteRemoved(f) => {
                favorites::remove(pool, e.uid, &f.topic, f.seq)
                    .await
                    .map_err(db)?;
            }
            UserEventBody::ChatSettingsChanged(c) => {
                relations::set_chat_settings(pool, e.uid, c)
                    .await
                    .map_err(|err| (relation_failure(&err), err.to_string()))?;
            }
            UserEventBody::NotificationsRead(r) => {
                notifications::mark_read(pool, e.uid, &r.ids, r.up_to, e.occurred_at)
                    .await
                    .map_err(db)?;
            }
            UserEventBody::IncognitoChanged(i) => {
                self.versioned(e, &Versioned::Incognito, i.incognito, i.version)
                    .await?
            }
            UserEventBody::SystemNotification(_)
            | UserEventBody::BadgeRefresh(_)
            | UserEventBody::FileUploaded(_)
            // Its producer wrote the file's state before producing it.
            | UserEventBody::FileAvailabilityChanged(_) => {}
        }
        Ok(())
    }
}

impl Handler for RelationsHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        // A user's events apply in log order (an unblock after its block):
        // after a failed one, the user's later ones wait.
        apply_in_order(&self.codec, records, |event: UserEvent| async move {
            self.apply(&event).await
        })
        .await
    }
}
