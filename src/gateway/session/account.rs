//! `{acc}`: what Tinode's web app asks of accounts (issue 40). A signed-in
//! user changes their own password (`scheme="basic"`, `secret` = base64 of
//! `login:new password`, the login left empty or their own): proven by the
//! current password in `tmpscheme="basic"`/`tmpsecret`, or by this
//! session's password login within [`password::FRESH_LOGIN_MS`] (the app
//! sends only the new one). Every session of the user is signed out, this
//! one after its answer. Sign-up and reset by emailed code are not offered
//! here (accounts are created and reset by the operator): refused with a
//! text the app shows and a person understands.

use base64::Engine;

use crate::gateway::password::{self, Proof, Who};
use crate::tinode::{self, ctrl, MsgAcc};

use super::Session;

/// The text a refused sign-up shows.
pub const NO_SIGN_UP: &str = "sign-up is not open here: ask your administrator for an account";
/// The text a refused reset shows.
pub const NO_RESET: &str =
    "password reset by email is not offered here: ask your administrator to reset your password";

impl Session {
    pub(super) async fn account(&mut self, acc: MsgAcc) {
        let id = acc.id.as_deref();
        let reply = match self.change_own_password(&acc).await {
            Ok(()) => {
                self.reply(ctrl(id, None, 200, "ok", None)).await;
                // Signed out like every other session of the user, once
                // answered: the app signs in again with the new password.
                self.close("password changed: sign in again with the new password");
                return;
            }
            Err((code, text, params)) => ctrl(id, None, code, &text, params),
        };
        self.reply(reply).await;
    }

    /// `Err` is the refusal's code, text and params (a limit's retry, a
    /// wrong password's code), as the HTTP route answers them.
    async fn change_own_password(
        &mut self,
        acc: &MsgAcc,
    ) -> Result<(), (u16, String, Option<serde_json::Value>)> {
        let refuse = |code: u16, text: &str| Err((code, text.to_string(), None));
        if acc.user.as_deref() == Some("new") {
            return refuse(403, NO_SIGN_UP);
        }
        if matches!(acc.tmpscheme.as_deref(), Some("code" | "token" | "reset")) {
            return refuse(403, NO_RESET);
        }
        let Some(who) = self.identity.clone() else {
            return refuse(401, "authentication required");
        };
        let own = tinode::user_id(who.uid);
        if acc.user.as_deref().is_some_and(|u| u != "me" && u != own) {
            return refuse(403, "only your own account can be changed");
        }
        if acc.scheme.as_deref() != Some("basic") {
            return refuse(
                501,
                "only the password can be changed here (scheme \"basic\")",
            );
        }
        let Some((login, new_password)) = acc.secret.as_deref().and_then(decode_basic) else {
            return refuse(
                400,
                "malformed: secret is base64 of login:password (the login may be left empty)",
            );
        };
        let pool = self
            .gateway
            .pools
            .get(&who.tenant)
            .map_err(|_| (503, tinode::UNAVAILABLE.to_string(), None))?;
        let stored = crate::users::login_of(pool, who.uid).await.map_err(|e| {
            tracing::warn!(error = %e, "login lookup for {{acc}} failed");
            (503, tinode::UNAVAILABLE.to_string(), None)
        })?;
        if !login.is_empty() {
            let same = crate::users::normalize_login(&login)
                .ok()
                .zip(stored.as_ref())
                .is_some_and(|(given, (stored, _))| &given == stored);
            if !same {
                return refuse(
                    403,
                    "the login cannot be changed here: leave it out to keep yours",
                );
            }
        }
        let current = match (acc.tmpscheme.as_deref(), acc.tmpsecret.as_deref()) {
            (Some("basic"), Some(secret)) => match decode_basic(secret) {
                Some((_, old)) => Some(old),
                None => return refuse(400, "malformed: tmpsecret is base64 of login:password"),
            },
            (Some(_), _) => return refuse(400, "malformed: tmpscheme is \"basic\""),
            (None, _) => None,
        };
        let fresh = self
            .password_login_at
            .is_some_and(|at| crate::events::now_ms() - at <= password::FRESH_LOGIN_MS);
        let proof = match &current {
            Some(old) => Proof::OldPassword { old, ip: self.peer },
            None if fresh => Proof::FreshLogin,
            None => {
                return refuse(
                    403,
                    "to change your password, sign in again with the current one first",
                )
            }
        };
        let who = Who {
            tenant: &who.tenant,
            uid: who.uid,
            device: &who.device,
            sid: &self.sid,
        };
        password::change(&self.gateway, who, proof, &new_password)
            .await
            .map(|_| ())
            .map_err(|e| (e.0.as_u16(), e.1, e.2))
    }
}

/// `login:password` from a `basic` secret (base64), the login as given
/// (possibly empty).
fn decode_basic(secret: &str) -> Option<(String, String)> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(secret)
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (login, password) = text.split_once(':')?;
    Some((login.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn a_secret_may_leave_the_login_empty() {
        assert_eq!(
            decode_basic(&b64(":new pass")),
            Some((String::new(), "new pass".into()))
        );
        assert_eq!(
            decode_basic(&b64("alice:a:b")),
            Some(("alice".into(), "a:b".into()))
        );
        assert_eq!(decode_basic(&b64("no colon")), None);
        assert_eq!(decode_basic("%%%"), None);
    }
}
