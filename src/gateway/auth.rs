//! Session tokens: HS256 JWTs carrying tenant, uid, device and
//! auth_version (a token older than the user's current auth_version is
//! refused once session control bumps it). `basic` login checks the
//! development users of the config, then the logins table of the tenants in
//! `auth.basic.tenants` ([`crate::users`]).

use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use jsonwebtoken::{decode, encode, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::config::AuthConfig;

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

/// Issues and checks tokens with one secret.
#[derive(Clone)]
pub struct Tokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    ttl_secs: i64,
}

/// A freshly issued token.
#[derive(Debug, Clone)]
pub struct Issued {
    pub token: String,
    pub expires: DateTime<Utc>,
}

impl Tokens {
    pub fn new(config: &AuthConfig) -> Self {
        Self {
            encoding: EncodingKey::from_secret(config.jwt_secret.as_bytes()),
            decoding: DecodingKey::from_secret(config.jwt_secret.as_bytes()),
            ttl_secs: config.token_ttl_secs as i64,
        }
    }

    pub fn issue(&self, tenant: &str, uid: i64, device: &str, auth_version: i64) -> Issued {
        let now = Utc::now().timestamp();
        self.sign(Claims {
            ten: tenant.to_string(),
            uid,
            dev: device.to_string(),
            av: auth_version,
            iat: now,
            exp: now + self.ttl_secs,
        })
    }

    /// A token for a session that logged in with `claims`: the same user,
    /// device, issue time and absolute expiry, so logging in with a token
    /// never extends it.
    pub fn reissue(&self, claims: &Claims) -> Issued {
        self.sign(claims.clone())
    }

    fn sign(&self, claims: Claims) -> Issued {
        let token = encode(&Header::default(), &claims, &self.encoding)
            .expect("HS256 encoding cannot fail");
        Issued {
            token,
            expires: Utc
                .timestamp_opt(claims.exp, 0)
                .single()
                .unwrap_or_else(Utc::now),
        }
    }

    /// Verifies signature and expiry. Accepts the token as is or base64
    /// encoded (Tinode clients send `secret` as base64 bytes).
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let mut validation = Validation::default();
        validation.leeway = 5;
        let claims = match decode::<Claims>(token, &self.decoding, &validation) {
            Ok(data) => data.claims,
            Err(_) => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(token)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or(AuthError::Failed)?;
                decode::<Claims>(&decoded, &self.decoding, &validation)
                    .map(|d| d.claims)
                    .map_err(|_| AuthError::Failed)?
            }
        };
        // Users are positive ids; nothing else is anyone.
        if claims.uid <= 0 || claims.ten.is_empty() {
            return Err(AuthError::Failed);
        }
        Ok(claims)
    }
}

/// The (login, password) of a `basic` secret: base64 of `login:password`.
fn split_basic(secret_b64: &str) -> Result<(String, String), AuthError> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(secret_b64)
        .map_err(|_| AuthError::Failed)?;
    let text = String::from_utf8(raw).map_err(|_| AuthError::Failed)?;
    let (login, password) = text.split_once(':').ok_or(AuthError::Failed)?;
    Ok((login.to_string(), password.to_string()))
}

/// Checks `basic` credentials (base64 of `login:password`) against the
/// development users; returns (tenant, uid).
pub fn check_basic(config: &AuthConfig, secret_b64: &str) -> Result<(String, i64), AuthError> {
    let (login, password) = split_basic(secret_b64)?;
    config
        .dev_users
        .iter()
        .find(|u| u.login == login && u.password == password)
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
    if config.dev_users.iter().any(|u| u.login == login) {
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

    fn config() -> AuthConfig {
        AuthConfig {
            jwt_secret: "0123456789abcdef0123".into(),
            token_ttl_secs: 60,
            dev_users: vec![crate::config::DevUser {
                tenant: "demo".into(),
                uid: 7,
                login: "alice".into(),
                password: "alice123".into(),
            }],
            admin_token: "admin-token-for-tests".into(),
            basic: Default::default(),
        }
    }

    #[test]
    fn tokens_round_trip_and_reject_tampering() {
        let t = Tokens::new(&config());
        let issued = t.issue("demo", 7, "web-1", 3);
        let claims = t.verify(&issued.token).unwrap();
        assert_eq!(
            (
                claims.ten.as_str(),
                claims.uid,
                claims.dev.as_str(),
                claims.av
            ),
            ("demo", 7, "web-1", 3)
        );
        let b64 = base64::engine::general_purpose::STANDARD.encode(&issued.token);
        assert_eq!(t.verify(&b64).unwrap().uid, 7);
        let mut forged = issued.token.clone();
        forged.pop();
        forged.push('x');
        assert_eq!(t.verify(&forged), Err(AuthError::Failed));
        let other = Tokens::new(&AuthConfig {
            jwt_secret: "another-secret-xxxxxxxx".into(),
            ..config()
        });
        assert_eq!(other.verify(&issued.token), Err(AuthError::Failed));
    }

    #[test]
    fn basic_login_checks_dev_users() {
        let ok = base64::engine::general_purpose::STANDARD.encode("alice:alice123");
        assert_eq!(check_basic(&config(), &ok).unwrap(), ("demo".into(), 7));
        let bad = base64::engine::general_purpose::STANDARD.encode("alice:nope");
        assert_eq!(check_basic(&config(), &bad), Err(AuthError::Failed));
        assert_eq!(check_basic(&config(), "%%%"), Err(AuthError::Failed));
    }
}
