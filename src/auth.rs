//! Session tokens: HS256 JWTs carrying tenant, uid, device, auth_version
//! and the device's revocation generation (a token older than the user's
//! current auth_version, or than its device's generation, is refused once
//! session control bumps it). Each tenant signs with its own keys (`kid`
//! header; `iss`/`aud` checked), falling back to `auth.jwt_secret`.
//! `basic` login checks the development users of the config, then the
//! logins table of the tenants in `auth.basic.tenants` ([`crate::users`]).

use std::collections::HashMap;

use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use jsonwebtoken::{
    decode, decode_header, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation,
};
use serde::{Deserialize, Serialize};

use crate::config::{AuthConfig, Config};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Tenant id.
    pub ten: String,
    /// User id.
    pub uid: i64,
    /// Device id.
    pub dev: String,
    /// Auth version the token was issued under.
    pub av: i64,
    /// The device's revocation generation the token was issued under: a
    /// device revocation raises it, refusing every token issued before
    /// (re-issued ones keep theirs).
    #[serde(default)]
    pub gen: i64,
    /// Token id, kept when a token login re-issues it.
    #[serde(default)]
    pub jti: String,
    /// Issuer (`auth.issuer`).
    #[serde(default)]
    pub iss: String,
    /// Audience: the tenant the token is for.
    #[serde(default)]
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("authentication failed")]
    Failed,
    #[error("unknown authentication scheme")]
    UnknownScheme,
    /// The logins table could not be read: the client may retry.
    #[error("authentication unavailable")]
    Unavailable,
}

/// The keys of one tenant (or the global fallback): one signs, all verify.
#[derive(Clone)]
struct Keyring {
    signing_kid: String,
    signing: EncodingKey,
    verifying: HashMap<String, DecodingKey>,
}

/// `kid` of tokens signed with `auth.jwt_secret`.
pub const GLOBAL_KID: &str = "global";

impl Keyring {
    fn new<'a>(keys: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Self> {
        let mut keys = keys.into_iter().peekable();
        let (kid, secret) = *keys.peek()?;
        let signing = EncodingKey::from_secret(secret.as_bytes());
        Some(Self {
            signing_kid: kid.to_string(),
            signing,
            verifying: keys
                .map(|(k, s)| (k.to_string(), DecodingKey::from_secret(s.as_bytes())))
                .collect(),
        })
    }
}

/// Issues and checks session tokens: per tenant with its signing keys
/// (`tenants[].signing_keys`), else with `auth.jwt_secret`.
#[derive(Clone)]
pub struct Tokens {
    global: Keyring,
    tenants: HashMap<String, Keyring>,
    issuer: String,
    ttl_secs: i64,
    /// Tokens already verified (compared byte for byte) → their claims,
    /// served until the token's `exp`: a reconnect or an HTTP request
    /// with the same token skips the signature check. The keyrings never
    /// change under it (they are fixed for this `Tokens`); revocation is
    /// checked after `verify`, on every use, as before.
    verified: std::sync::Arc<std::sync::Mutex<HashMap<String, Claims>>>,
}

/// Verified tokens kept; the cache is emptied when it grows past this.
const VERIFIED_MAX: usize = 16_384;

/// A freshly issued token.
#[derive(Debug, Clone)]
pub struct Issued {
    pub token: String,
    pub expires: DateTime<Utc>,
}

impl Tokens {
    pub fn new(config: &Config) -> Self {
        let auth: &AuthConfig = &config.auth;
        Self {
            global: Keyring::new([(GLOBAL_KID, auth.jwt_secret.as_str())]).expect("one key"),
            tenants: config
                .tenants
                .iter()
                .filter_map(|t| {
                    Keyring::new(
                        t.signing_keys
                            .iter()
                            .map(|k| (k.kid.as_str(), k.secret.as_str())),
                    )
                    .map(|ring| (t.id.clone(), ring))
                })
                .collect(),
            issuer: auth.issuer.clone(),
            ttl_secs: auth.token_ttl_secs as i64,
            verified: Default::default(),
        }
    }

    fn keyring(&self, tenant: &str) -> &Keyring {
        self.tenants.get(tenant).unwrap_or(&self.global)
    }

    /// A new token (a new `jti`) for `device`, under the user's current
    /// `auth_version` and the device's current revocation `generation`.
    pub fn issue(
        &self,
        tenant: &str,
        uid: i64,
        device: &str,
        auth_version: i64,
        generation: i64,
    ) -> Issued {
        let now = Utc::now().timestamp();
        self.sign(Claims {
            ten: tenant.to_string(),
            uid,
            dev: device.to_string(),
            av: auth_version,
            gen: generation,
            jti: uuid::Uuid::new_v4().simple().to_string(),
            iss: self.issuer.clone(),
            aud: tenant.to_string(),
            iat: now,
            exp: now + self.ttl_secs,
        })
    }

    /// A token for a session that logged in with `claims`: the same user,
    /// device, token id, generation, issue time and absolute expiry, so
    /// logging in with a token never extends it nor escapes a revocation
    /// (signed with the tenant's current key).
    pub fn reissue(&self, claims: &Claims) -> Issued {
        self.sign(claims.clone())
    }

    fn sign(&self, claims: Claims) -> Issued {
        let ring = self.keyring(&claims.ten);
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(ring.signing_kid.clone());
        let token = encode(&header, &claims, &ring.signing).expect("HS256 encoding cannot fail");
        Issued {
            token,
            expires: Utc
                .timestamp_opt(claims.exp, 0)
                .single()
                .unwrap_or_else(Utc::now),
        }
    }

    /// Verifies a token with the key its tenant claim and `kid` name (a
    /// token signed with another tenant's key fails its signature), then
    /// expiry, `iss` and `aud` (= the tenant). Accepts the token as is or
    /// base64 encoded (Tinode clients send `secret` as base64 bytes).
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let now = Utc::now().timestamp();
        if let Some(claims) = self
            .verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .filter(|c| c.exp > now)
        {
            return Ok(claims.clone());
        }
        let claims = self.verify_uncached(token)?;
        let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
        if verified.len() >= VERIFIED_MAX {
            verified.clear();
        }
        verified.insert(token.to_string(), claims.clone());
        Ok(claims)
    }

    fn verify_uncached(&self, token: &str) -> Result<Claims, AuthError> {
        match self.verify_jwt(token) {
            Ok(c) => Ok(c),
            Err(_) => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(token)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or(AuthError::Failed)?;
                self.verify_jwt(&decoded)
            }
        }
    }

    fn verify_jwt(&self, token: &str) -> Result<Claims, AuthError> {
        let kid = decode_header(token)
            .map_err(|_| AuthError::Failed)?
            .kid
            .ok_or(AuthError::Failed)?;
        // The tenant the token claims picks the keys; the signature then
        // proves the claim.
        let claimed = unverified_tenant(token).ok_or(AuthError::Failed)?;
        let key = self
            .keyring(&claimed)
            .verifying
            .get(&kid)
            .ok_or(AuthError::Failed)?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 5;
        validation.set_issuer(&[self.issuer.as_str()]);
        validation.set_audience(&[claimed.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let claims = decode::<Claims>(token, key, &validation)
            .map_err(|_| AuthError::Failed)?
            .claims;
        // Users are positive ids; nothing else is anyone.
        if claims.uid <= 0 || claims.ten.is_empty() || claims.ten != claimed {
            return Err(AuthError::Failed);
        }
        Ok(claims)
    }
}

/// The `ten` claim of a JWT, before its signature is checked.
fn unverified_tenant(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    value.get("ten")?.as_str().map(str::to_string)
}

/// The (normalized login, password) of a `basic` secret: base64 of
/// `login:password`; the login in the one form it is stored, looked up
/// and locked out in ([`crate::users::normalize_login`]). A malformed
/// login fails.
fn split_basic(secret_b64: &str) -> Result<(String, String), AuthError> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(secret_b64)
        .map_err(|_| AuthError::Failed)?;
    let text = String::from_utf8(raw).map_err(|_| AuthError::Failed)?;
    let (login, password) = text.split_once(':').ok_or(AuthError::Failed)?;
    let login = crate::users::normalize_login(login).map_err(|_| AuthError::Failed)?;
    Ok((login, password.to_string()))
}

/// The normalized login of a `basic` secret, if it names a well-formed
/// one: what failed logins are counted against.
pub fn basic_login_name(secret_b64: &str) -> Option<String> {
    split_basic(secret_b64).ok().map(|(login, _)| login)
}

/// Whether the development user `u` has the normalized login `login`.
fn dev_user_is(u: &crate::config::DevUser, login: &str) -> bool {
    crate::users::normalize_login(&u.login).is_ok_and(|n| n == login)
}

/// Checks `basic` credentials (base64 of `login:password`) against the
/// development users (logins compared normalized); returns (tenant, uid).
pub fn check_basic(config: &AuthConfig, secret_b64: &str) -> Result<(String, i64), AuthError> {
    let (login, password) = split_basic(secret_b64)?;
    config
        .dev_users
        .iter()
        .find(|u| dev_user_is(u, &login) && u.password == password)
        .map(|u| (u.tenant.clone(), u.uid))
        .ok_or(AuthError::Failed)
}

/// Checks `basic` credentials: a development user of that login decides;
/// otherwise the login's row in the logins table of `auth.basic.tenants`
/// (Argon2id, verified off the async threads). A login found in several of
/// those tenants is refused (it names nobody in particular). Returns
/// (tenant, uid).
pub async fn check_basic_login(
    config: &AuthConfig,
    pools: &crate::tenant::TenantPools,
    secret_b64: &str,
) -> Result<(String, i64), AuthError> {
    let (login, password) = split_basic(secret_b64)?;
    if config.dev_users.iter().any(|u| dev_user_is(u, &login)) {
        return check_basic(config, secret_b64);
    }
    let mut found = Vec::new();
    for tenant in &config.basic.tenants {
        let pool = pools.get(tenant).map_err(|_| AuthError::Unavailable)?;
        match crate::users::lookup(pool, &login).await {
            Ok(Some((uid, hash))) => found.push((tenant.clone(), uid, hash)),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(%tenant, error = %e, "basic login: logins table unreadable");
                return Err(AuthError::Unavailable);
            }
        }
    }
    if found.len() > 1 {
        let tenants: Vec<&str> = found.iter().map(|f| f.0.as_str()).collect();
        tracing::warn!(%login, ?tenants, "basic login refused: the login exists in several tenants of auth.basic.tenants");
    }
    let (tenant, uid, hash) = match found.len() {
        1 => found.pop().expect("one row"),
        _ => (String::new(), 0, crate::users::decoy_hash().to_string()),
    };
    let ok = tokio::task::spawn_blocking(move || crate::users::verify_password(&password, &hash))
        .await
        .map_err(|_| AuthError::Unavailable)?;
    if ok && uid > 0 {
        Ok((tenant, uid))
    } else {
        Err(AuthError::Failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SigningKey, TenantConfig};

    fn config() -> Config {
        let mut c = Config::default();
        c.auth = AuthConfig {
            jwt_secret: "0123456789abcdef0123".into(),
            token_ttl_secs: 60,
            dev_users: vec![crate::config::DevUser {
                tenant: "demo".into(),
                uid: 7,
                login: "alice".into(),
                password: "alice123".into(),
                name: None,
                photo: None,
            }],
            admin_token: "admin-token-for-tests".into(),
            ..AuthConfig::default()
        };
        c
    }

    fn keyed(kids: &[(&str, &str)]) -> Config {
        let mut c = config();
        c.tenants = vec![
            TenantConfig {
                id: "a".into(),
                database: "a".into(),
                signing_keys: kids
                    .iter()
                    .map(|(k, s)| SigningKey {
                        kid: k.to_string(),
                        secret: s.to_string(),
                    })
                    .collect(),
                ..Default::default()
            },
            TenantConfig {
                id: "b".into(),
                database: "b".into(),
                signing_keys: vec![SigningKey {
                    kid: "k1".into(),
                    secret: "b-secret-b-secret-b-secret".into(),
                }],
                ..Default::default()
            },
        ];
        c
    }

    #[test]
    fn a_verified_token_is_served_from_the_cache_only_byte_for_byte_and_until_it_expires() {
        let t = Tokens::new(&config());
        let issued = t.issue("demo", 7, "web-1", 3, 2);
        let first = t.verify(&issued.token).unwrap();
        assert!(t.verified.lock().unwrap().contains_key(&issued.token));
        assert_eq!(
            t.clone().verify(&issued.token).unwrap(),
            first,
            "clones share it"
        );
        // A token that differs in one byte is verified, and fails.
        let mut other = issued.token.clone().into_bytes();
        let last = other.len() - 1;
        other[last] = if other[last] == b'A' { b'B' } else { b'A' };
        let other = String::from_utf8(other).unwrap();
        assert_eq!(t.verify(&other), Err(AuthError::Failed));
        // An entry past its expiry is not served: the token is verified
        // again (and this one is not a token at all).
        let mut stale = first.clone();
        stale.exp = Utc::now().timestamp() - 1;
        t.verified
            .lock()
            .unwrap()
            .insert("not-a-token".into(), stale.clone());
        assert_eq!(t.verify("not-a-token"), Err(AuthError::Failed));
        let mut live = stale;
        live.exp = Utc::now().timestamp() + 60;
        t.verified
            .lock()
            .unwrap()
            .insert("not-a-token".into(), live.clone());
        assert_eq!(t.verify("not-a-token"), Ok(live), "served until exp");
    }

    #[test]
    fn tokens_round_trip_and_reject_tampering() {
        let t = Tokens::new(&config());
        let issued = t.issue("demo", 7, "web-1", 3, 2);
        let claims = t.verify(&issued.token).unwrap();
        assert_eq!(
            (
                claims.ten.as_str(),
                claims.uid,
                claims.dev.as_str(),
                claims.av,
                claims.gen,
                claims.aud.as_str(),
            ),
            ("demo", 7, "web-1", 3, 2, "demo")
        );
        let b64 = base64::engine::general_purpose::STANDARD.encode(&issued.token);
        assert_eq!(t.verify(&b64).unwrap().uid, 7);
        let mut forged = issued.token.clone();
        forged.pop();
        forged.push('x');
        assert_eq!(t.verify(&forged), Err(AuthError::Failed));
        let mut other = config();
        other.auth.jwt_secret = "another-secret-xxxxxxxx".into();
        assert_eq!(
            Tokens::new(&other).verify(&issued.token),
            Err(AuthError::Failed)
        );
        let mut issuer = config();
        issuer.auth.issuer = "elsewhere".into();
        assert_eq!(
            Tokens::new(&issuer).verify(&issued.token),
            Err(AuthError::Failed)
        );
    }

    #[test]
    fn tenant_keys_sign_their_tenant_only_and_roll_over() {
        let old = Tokens::new(&keyed(&[("k1", "a-old-secret-a-old-secret")]));
        let a = old.issue("a", 7, "d", 0, 0);
        assert_eq!(old.verify(&a.token).unwrap().ten, "a");
        // Signed with a's key but claiming b: b's keys do not verify it.
        let mut claims = old.verify(&a.token).unwrap();
        claims.ten = "b".into();
        claims.aud = "b".into();
        let ring = old.keyring("a");
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        let forged = encode(&header, &claims, &ring.signing).unwrap();
        assert_eq!(old.verify(&forged), Err(AuthError::Failed));
        // Rotation: the new key signs, the old one still verifies...
        let both = Tokens::new(&keyed(&[
            ("k2", "a-new-secret-a-new-secret"),
            ("k1", "a-old-secret-a-old-secret"),
        ]));
        assert!(both.verify(&a.token).is_ok());
        let fresh = both.issue("a", 7, "d", 0, 0);
        // ...until it is removed.
        let new = Tokens::new(&keyed(&[("k2", "a-new-secret-a-new-secret")]));
        assert_eq!(new.verify(&a.token), Err(AuthError::Failed));
        assert!(new.verify(&fresh.token).is_ok());
        // The global secret does not sign for a tenant with keys.
        let global = Tokens::new(&config());
        let g = global.issue("a", 7, "d", 0, 0);
        assert_eq!(new.verify(&g.token), Err(AuthError::Failed));
    }

    #[test]
    fn basic_login_checks_dev_users() {
        let c = config().auth;
        let ok = base64::engine::general_purpose::STANDARD.encode("alice:alice123");
        assert_eq!(check_basic(&c, &ok).unwrap(), ("demo".into(), 7));
        let bad = base64::engine::general_purpose::STANDARD.encode("alice:nope");
        assert_eq!(check_basic(&c, &bad), Err(AuthError::Failed));
        assert_eq!(check_basic(&c, "%%%"), Err(AuthError::Failed));
        // Logins compare normalized; a malformed one is nobody.
        for (login, ok) in [("ALICE", true), ("Ａlice", true), ("alice ", false)] {
            let secret =
                base64::engine::general_purpose::STANDARD.encode(format!("{login}:alice123"));
            assert_eq!(check_basic(&c, &secret).is_ok(), ok, "{login:?}");
        }
        assert_eq!(
            basic_login_name(&base64::engine::general_purpose::STANDARD.encode("CAROL:x")),
            Some("carol".into())
        );
    }
}
