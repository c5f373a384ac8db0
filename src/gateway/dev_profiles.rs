//! The development users' profiles (`auth.dev_users[].name` and `photo`):
//! a gateway started with them gives each such user that has no profile
//! yet the configured name and picture, as a `ProfileChanged` user event
//! (projected by the relations pipeline like any profile change, so the
//! name is also found by `fnd`), and the web app shows people by name from
//! the first start of `docker/local/run`. A profile that exists (set in the
//! app, or given at an earlier start) is kept.

use std::sync::Arc;
use std::time::Duration;

use crate::events::{ProfileChanged, UserEvent, UserEventBody};
use crate::kafka::topics::TopicKind;

use super::Gateway;

/// Attempts per user before giving up (the broker or database may still
/// be starting).
const ATTEMPTS: u32 = 10;

/// Whether any dev user has a profile in the config.
pub fn any(config: &crate::config::Config) -> bool {
    config
        .auth
        .dev_users
        .iter()
        .any(|u| u.name.is_some() || u.photo.is_some())
}

/// Gives every configured dev user without a profile its configured one.
pub async fn seed(gw: Arc<Gateway>) {
    for user in &gw.config.auth.dev_users {
        if user.name.is_none() && user.photo.is_none() {
            continue;
        }
        if gw.config.tenant(&user.tenant).is_none() {
            tracing::warn!(login = %user.login, tenant = %user.tenant, "dev user of an unknown tenant: no profile given");
            continue;
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            match seed_one(&gw, user).await {
                Ok(given) => {
                    if given {
                        tracing::info!(login = %user.login, uid = user.uid, "dev user profile given from the config");
                    }
                    break;
                }
                Err(e) if attempt < ATTEMPTS => {
                    tracing::debug!(login = %user.login, error = %e, "dev user profile not given yet; retrying");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                Err(e) => {
                    tracing::warn!(login = %user.login, error = %e, "dev user profile not given");
                    break;
                }
            }
        }
    }
}

/// Produces the user's profile unless one is stored; whether it did.
async fn seed_one(gw: &Gateway, user: &crate::config::DevUser) -> anyhow::Result<bool> {
    let pool = gw.pools.get(&user.tenant)?;
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_user_profiles WHERE uid = ?")
        .bind(user.uid)
        .fetch_one(pool)
        .await?;
    if stored > 0 {
        return Ok(false);
    }
    let event = UserEvent::new(
        &user.tenant,
        user.uid,
        user.uid,
        UserEventBody::ProfileChanged(ProfileChanged {
            full_name: user.name.clone(),
            photo: user.photo.clone(),
            note: None,
        }),
    );
    gw.sender
        .producer()
        .send(TopicKind::UserEvents, &event.key(), &event, None)
        .await?;
    Ok(true)
}
