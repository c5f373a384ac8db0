//! `{hi}` (version check, session id) and `{login}` (token or basic).

use std::sync::Arc;

use serde_json::json;

use crate::auth::{self, AuthError};
use crate::events::now_ms;
use crate::gateway::control;
use crate::gateway::limits::LoginSubjects;
use crate::realtime::hub::SessionHandle;
use crate::realtime::presence;
use crate::tinode::{self, ctrl, MsgLogin};

use super::{Identity, Session};

impl Session {
    pub(super) async fn hello(&mut self, hi: tinode::MsgHi) {
        let id = hi.id.as_deref();
        let Some(version) = hi.ver.as_deref().and_then(tinode::parse_version) else {
            self.reply(ctrl(id, None, 400, "malformed", None)).await;
            return;
        };
        if version < tinode::MIN_VERSION {
            self.reply(ctrl(id, None, 505, "version not supported", None))
                .await;
            return;
        }
        self.greeted = true;
        let params = json!({
            "ver": tinode::VERSION,
            "build": concat!("imstream:", env!("CARGO_PKG_VERSION")),
            "sid": self.sid,
            "maxMessageSize": self.gateway.config.gateway.max_message_size,
            "maxFileUploadSize": self.gateway.config.files.max_upload_bytes,
            "msgDelAge": 600,
        });
        self.reply(ctrl(id, None, 201, "created", Some(params)))
            .await;
    }

    pub(super) async fn login(&mut self, login: MsgLogin) {
        let id = login.id.as_deref();
        if self.identity.is_some() {
            self.reply(ctrl(id, None, 409, "already authenticated", None))
                .await;
            return;
        }
        let gw = self.gateway.clone();
        if login.scheme == "reset" {
            // Tinode's "forgot password" asks for an emailed code.
            self.reply(ctrl(id, None, 403, super::account::NO_RESET, None))
                .await;
            return;
        }
        if !matches!(login.scheme.as_str(), "token" | "basic") {
            self.reply(ctrl(id, None, 401, "unknown authentication scheme", None))
                .await;
            return;
        }
        // Failed logins lock out the (normalized) login name and the
        // address for a while (doubling). Each attempt is reserved before
        // it is verified, so parallel ones cannot all slip past the count;
        // a locked-out attempt is not even verified.
        let basic_name = (login.scheme == "basic")
            .then(|| auth::basic_login_name(&login.secret))
            .flatten();
        let subjects = LoginSubjects::new(basic_name.as_deref(), self.peer, &gw.config.limits);
        let mut redis = gw.redis.clone();
        if let Err(l) = subjects.reserve(&mut redis, &gw.config.limits).await {
            let (code, text, params) = l.ctrl_parts();
            self.reply(ctrl(id, None, code, text, Some(params))).await;
            return;
        }
        // (identity, token auth_version, token generation); the claims of
        // a token login, whose expiry the reply keeps.
        let mut presented: Option<auth::Claims> = None;
        let identity = match login.scheme.as_str() {
            "token" => gw.tokens.verify(&login.secret).map(|c| {
                presented = Some(c.clone());
                (
                    Identity {
                        tenant: c.ten,
                        uid: c.uid,
                        device: c.dev,
                    },
                    Some(c.av),
                    Some(c.gen),
                )
            }),
            "basic" => auth::check_basic_login(&gw.config.auth, &gw.pools, &login.secret)
                .await
                .map(|(tenant, uid)| {
                    // A device of its own for every password login, so
                    // revoking one never closes another.
                    let device = format!("basic-{}", uuid::Uuid::new_v4().simple());
                    (
                        Identity {
                            tenant,
                            uid,
                            device,
                        },
                        None,
                        None,
                    )
                }),
            _ => Err(AuthError::UnknownScheme),
        };
        let (identity, token_av, token_gen) = match identity {
            Ok(i) if gw.config.tenant(&i.0.tenant).is_some() => {
                subjects.succeeded(&mut redis).await;
                i
            }
            // The reserved attempt stays counted as a failure.
            Ok(_) | Err(AuthError::Failed) => {
                self.reply(ctrl(id, None, 401, "authentication failed", None))
                    .await;
                return;
            }
            Err(AuthError::UnknownScheme) => {
                subjects.give_back(&mut redis).await;
                self.reply(ctrl(id, None, 401, "unknown authentication scheme", None))
                    .await;
                return;
            }
            Err(AuthError::Unavailable) => {
                subjects.give_back(&mut redis).await;
                self.reply(ctrl(id, None, 503, tinode::UNAVAILABLE, None))
                    .await;
                return;
            }
        };
        // Fails closed: when neither Redis nor MySQL answers, nobody is let in.
        let state = match control::state(
            &mut redis,
            &gw.pools,
            &identity.tenant,
            identity.uid,
            &identity.device,
        )
        .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(request_id = %crate::request_id::current(), error = %e, "session control unavailable at login");
                self.reply(ctrl(id, None, 503, tinode::UNAVAILABLE, None))
                    .await;
                return;
            }
        };
        // A password login is as new as the current auth_version and the
        // device's current revocation generation.
        let auth_version = token_av.unwrap_or(state.auth_version);
        let generation = token_gen.unwrap_or(state.generation);
        if let Some(why) = control::refusal(&state, auth_version, generation) {
            self.reply(ctrl(
                id,
                None,
                401,
                "authentication failed",
                Some(json!({"reason": why})),
            ))
            .await;
            return;
        }
        // At most `sessions_per_user` on this gateway: the new one is
        // refused and closed, the user's existing sessions stay.
        let max = gw.config.limits.sessions_per_user.max(1);
        if gw
            .hub
            .user_sessions(&identity.tenant, identity.uid, None, "")
            .len()
            >= max
        {
            metrics::counter!(crate::metrics::RATE_LIMITED_TOTAL, "what" => "sessions")
                .increment(1);
            self.reply(ctrl(
                id,
                None,
                429,
                "too many sessions",
                Some(json!({"max_sessions": max})),
            ))
            .await;
            self.close("too many sessions");
            return;
        }
        let issued = match &presented {
            // No sliding expiry: a token login keeps its token's lifetime.
            Some(claims) => gw.tokens.reissue(claims),
            None => gw.tokens.issue(
                &identity.tenant,
                identity.uid,
                &identity.device,
                auth_version,
                generation,
            ),
        };
        let handle = SessionHandle {
            sid: Arc::from(self.sid.as_str()),
            tenant: Arc::from(identity.tenant.as_str()),
            uid: identity.uid,
            device: Arc::from(identity.device.as_str()),
            auth_version,
            generation,
            tx: self.out.clone(),
            closing: self.closing.clone(),
        };
        gw.hub.add_session(&handle);
        // Written hidden, then as committed (incognito, read once, below):
        // unreadable, it stays hidden, since being shown online against
        // one's wish is worse than a missing hint.
        let sessions = presence::user_online(
            &mut redis,
            &identity.tenant,
            identity.uid,
            &self.sid,
            &gw.node_id,
            now_ms(),
        )
        .await;
        // What is committed, read after the presence was written (a change
        // of it writes the same after its commit, so one of the two writes
        // last with the committed state).
        if let Ok(pool) = gw.pools.get(&identity.tenant) {
            if let Err(e) =
                crate::relations::sync_hidden(pool, &mut redis, &identity.tenant, identity.uid)
                    .await
            {
                tracing::warn!(error = %e, "incognito not checked again at login");
            }
        }
        if sessions.is_ok_and(|n| n == 1) {
            let (gw, tenant, uid) = (gw.clone(), identity.tenant.clone(), identity.uid);
            tokio::spawn(async move {
                crate::gateway::chats::announce_to_peers(&gw, &tenant, uid, "on").await
            });
        }
        self.handle = Some(handle);
        let params = json!({
            "user": tinode::user_id(identity.uid),
            "authlvl": "auth",
            "token": issued.token,
            "expires": tinode::timestamp(issued.expires),
        });
        self.identity = Some(identity);
        if login.scheme == "basic" {
            self.password_login_at = Some(crate::events::now_ms());
        }
        self.reply(ctrl(id, None, 200, "ok", Some(params))).await;
    }
}
