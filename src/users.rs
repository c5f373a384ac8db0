//! People who log in with a password: the `im_basic_logins` table of a
//! tenant (login → uid, Argon2id hash), written by `imstream users add` and
//! read by the gateway's `basic` login. Passwords exist only in memory while
//! they are hashed or checked.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use sqlx::MySqlPool;

/// Shortest accepted password.
pub const MIN_PASSWORD_CHARS: usize = 8;
/// Longest accepted login (the column's width).
pub const MAX_LOGIN_CHARS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    #[error("invalid login {0:?}: 1 to 64 characters, no ':' (it separates login and password in a basic secret), no whitespace or control characters")]
    BadLogin(String),
    #[error("the password is shorter than {MIN_PASSWORD_CHARS} characters")]
    ShortPassword,
    #[error("login {login:?} already exists in tenant {tenant}")]
    LoginTaken { tenant: String, login: String },
    #[error("uid {uid} already has a login in tenant {tenant}")]
    UidTaken { tenant: String, uid: i64 },
    #[error("uid must be positive, got {0}")]
    BadUid(i64),
    #[error("hashing the password failed: {0}")]
    Hash(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Why a login is not acceptable, if it is not.
pub fn check_login(login: &str) -> Result<(), UsersError> {
    let n = login.chars().count();
    if n == 0
        || n > MAX_LOGIN_CHARS
        || login.contains(':')
        || login.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(UsersError::BadLogin(login.to_string()));
    }
    Ok(())
}

/// The Argon2id PHC string of `password` with a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, UsersError> {
    let salt = SaltString::encode_b64(uuid::Uuid::new_v4().as_bytes())
        .map_err(|e| UsersError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| UsersError::Hash(e.to_string()))
}

/// Whether `password` matches the PHC string `hash` (false for a malformed
/// hash: a broken row must not let anyone in).
pub fn verify_password(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(parsed) => Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

/// Adds `login` for `uid` to a tenant's logins table. Refused when the
/// login or the uid already has a row (a password change is a new row
/// after removing the old one, never a silent overwrite).
pub async fn add(
    pool: &MySqlPool,
    tenant: &str,
    uid: i64,
    login: &str,
    password: &str,
) -> Result<(), UsersError> {
    if uid <= 0 {
        return Err(UsersError::BadUid(uid));
    }
    check_login(login)?;
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(UsersError::ShortPassword);
    }
    let hash = {
        let password = password.to_string();
        tokio::task::spawn_blocking(move || hash_password(&password))
            .await
            .map_err(|e| UsersError::Hash(e.to_string()))??
    };
    let inserted = sqlx::query(
        "INSERT INTO im_basic_logins (login, uid, password_hash, created_at, updated_at) \
         VALUES (?, ?, ?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
    )
    .bind(login)
    .bind(uid)
    .bind(&hash)
    .execute(pool)
    .await;
    match inserted {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            if e.message().contains("uk_basic_logins_uid") {
                Err(UsersError::UidTaken {
                    tenant: tenant.to_string(),
                    uid,
                })
            } else {
                Err(UsersError::LoginTaken {
                    tenant: tenant.to_string(),
                    login: login.to_string(),
                })
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// The (uid, PHC hash) of `login` in one tenant, if it has a row.
pub async fn lookup(pool: &MySqlPool, login: &str) -> Result<Option<(i64, String)>, sqlx::Error> {
    sqlx::query_as("SELECT uid, password_hash FROM im_basic_logins WHERE login = ?")
        .bind(login)
        .fetch_optional(pool)
        .await
}

/// A hash no password matches, checked when a login is unknown so an
/// unknown login costs as much as a wrong password (no login probing by
/// response time).
pub fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| {
        hash_password(&uuid::Uuid::new_v4().to_string()).expect("hashing a random password")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_argon2id_salted_and_verify() {
        let a = hash_password("correct horse").unwrap();
        let b = hash_password("correct horse").unwrap();
        assert!(a.starts_with("$argon2id$"), "{a}");
        assert_ne!(a, b, "each hash has its own salt");
        assert!(!a.contains("correct horse"));
        assert!(verify_password("correct horse", &a));
        assert!(!verify_password("correct horsf", &a));
        assert!(!verify_password("correct horse", "not a hash"));
    }

    #[test]
    fn logins_are_checked() {
        assert!(check_login("alice").is_ok());
        assert!(check_login("a.b@example.com").is_ok());
        for bad in ["", "a:b", "a b", "a\tb", &"x".repeat(65)] {
            assert!(check_login(bad).is_err(), "{bad:?}");
        }
    }
}
