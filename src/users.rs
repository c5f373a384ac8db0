//! People who log in with a password: the `im_basic_logins` table of a
//! tenant (login → uid, Argon2id hash), written by `imstream users add` and
//! read by the gateway's `basic` login. Passwords exist only in memory while
//! they are hashed or checked.
//!
//! A login is stored and compared in one form, [`normalize_login`]: Unicode
//! NFKC plus full case folding, so `Carol`, `CAROL` and `carol` (and a
//! fullwidth `Ｃａｒｏｌ`) are one login, while `cárol` stays another (accents
//! are not folded). The table compares the normalized bytes exactly.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use sqlx::MySqlPool;

/// Shortest accepted password.
pub const MIN_PASSWORD_CHARS: usize = 8;
/// Longest accepted password, in bytes (bounds what one request makes
/// Argon2 hash).
pub const MAX_PASSWORD_BYTES: usize = 1024;
/// The stored hash of a login whose password an operator reset without
/// setting a new one: no password matches it (it is no PHC string).
pub const LOCKED_HASH: &str = "!reset";
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
    #[error("stored logins {first:?} (uid {first_uid}) and {second:?} (uid {second_uid}) are both {normalized:?} once normalized (NFKC + case folding); remove or rename one of them (nothing was changed)")]
    Collision {
        first: String,
        first_uid: i64,
        second: String,
        second_uid: i64,
        normalized: String,
    },
    #[error("stored login {login:?} (uid {uid}) is not a valid login once normalized (NFKC + case folding); remove or rename it (nothing was changed)")]
    StoredMalformed { login: String, uid: i64 },
    #[error("the password is longer than {MAX_PASSWORD_BYTES} bytes")]
    LongPassword,
    #[error("no login {login:?} in tenant {tenant}")]
    NoLogin { tenant: String, login: String },
    #[error("hashing the password failed: {0}")]
    Hash(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Why a login is not acceptable, if it is not.
pub fn check_login(login: &str) -> Result<(), UsersError> {
    normalize_login(login).map(|_| ())
}

fn malformed(login: &str) -> bool {
    let n = login.chars().count();
    n == 0
        || n > MAX_LOGIN_CHARS
        || login.contains(':')
        || login.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The one form of `login` that is stored, looked up and locked out:
/// NFKC, full case folding, NFKC again (Unicode's compatibility caseless
/// match), so every spelling that differs only in letter case or in
/// compatibility forms is one login. Accents are kept (`cárol` is not
/// `carol`; a decomposed `cárol` is the composed one). Refused when the
/// login as given or its normalized form is empty, longer than
/// [`MAX_LOGIN_CHARS`], or holds `:`, whitespace or a control character
/// (`carol ` is malformed, not `carol`).
pub fn normalize_login(login: &str) -> Result<String, UsersError> {
    use unicode_normalization::UnicodeNormalization;
    if malformed(login) {
        return Err(UsersError::BadLogin(login.to_string()));
    }
    let nfkc: String = login.nfkc().collect();
    let folded: String = caseless::default_case_fold_str(&nfkc).nfkc().collect();
    if malformed(&folded) {
        return Err(UsersError::BadLogin(login.to_string()));
    }
    Ok(folded)
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

/// Why `password` is not acceptable as a new password, if it is not.
pub fn check_password(password: &str) -> Result<(), UsersError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(UsersError::ShortPassword);
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(UsersError::LongPassword);
    }
    Ok(())
}

/// [`hash_password`] off the async threads.
pub async fn hash_password_async(password: &str) -> Result<String, UsersError> {
    let password = password.to_string();
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| UsersError::Hash(e.to_string()))?
}

/// Whether `hash` is an Argon2id PHC string (what a reset command may
/// store).
pub fn is_argon2id_hash(hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| h.algorithm.as_str() == "argon2id")
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
    let login = normalize_login(login)?;
    let login = login.as_str();
    check_password(password)?;
    let hash = hash_password_async(password).await?;
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

/// The (uid, PHC hash) of `login` in one tenant, if it has a row;
/// `login` is in its normalized form ([`normalize_login`]). Compared byte
/// for byte whatever the column's collation (`dána` never finds `dana`).
pub async fn lookup(pool: &MySqlPool, login: &str) -> Result<Option<(i64, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT uid, password_hash FROM im_basic_logins \
         WHERE login = ? AND CAST(login AS BINARY) = ?",
    )
    .bind(login)
    .bind(login.as_bytes())
    .fetch_optional(pool)
    .await
}

/// The (login, PHC hash) of `uid`'s password login in one tenant, if it
/// has one (a uid has at most one: `uk_basic_logins_uid`).
pub async fn login_of(pool: &MySqlPool, uid: i64) -> Result<Option<(String, String)>, sqlx::Error> {
    let row: Option<(crate::exact::Exact, String)> =
        sqlx::query_as("SELECT login, password_hash FROM im_basic_logins WHERE uid = ?")
            .bind(uid)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(login, hash)| (login.0, hash)))
}

/// Stores `hash` as `uid`'s password; whether `uid` has a login. Applied
/// again with the same hash it changes nothing.
pub async fn set_password_hash(
    pool: &MySqlPool,
    uid: i64,
    hash: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE im_basic_logins SET password_hash = ?, updated_at = UTC_TIMESTAMP(3) WHERE uid = ?",
    )
    .bind(hash)
    .bind(uid)
    .execute(pool)
    .await?;
    if done.rows_affected() > 0 {
        return Ok(true);
    }
    Ok(login_of(pool, uid).await?.is_some())
}

/// Replaces `uid`'s password hash `old` by `new`, only if `old` is still
/// the stored one (a concurrent change wins once); whether it was.
pub async fn replace_password_hash(
    pool: &MySqlPool,
    uid: i64,
    old: &str,
    new: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE im_basic_logins SET password_hash = ?, updated_at = UTC_TIMESTAMP(3)          WHERE uid = ? AND password_hash = ?",
    )
    .bind(new)
    .bind(uid)
    .bind(old)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// One login as `imstream users list` shows it (never its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginRow {
    pub login: String,
    pub uid: i64,
    /// False when an operator reset the password without a new one.
    pub has_password: bool,
    pub created_at: chrono::NaiveDateTime,
    pub updated_at: chrono::NaiveDateTime,
}

/// Every login of a tenant, by login.
pub async fn list(pool: &MySqlPool) -> Result<Vec<LoginRow>, sqlx::Error> {
    let rows: Vec<(crate::exact::Exact, i64, String, chrono::NaiveDateTime, chrono::NaiveDateTime)> =
        sqlx::query_as(
            "SELECT login, uid, password_hash, created_at, updated_at FROM im_basic_logins ORDER BY CAST(login AS BINARY)",
        )
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(login, uid, hash, created_at, updated_at)| LoginRow {
            login: login.0,
            uid,
            has_password: hash != LOCKED_HASH,
            created_at,
            updated_at,
        })
        .collect())
}

/// Removes `login` (any spelling of it); the uid it belonged to.
pub async fn remove(pool: &MySqlPool, tenant: &str, login: &str) -> Result<i64, UsersError> {
    let login = normalize_login(login)?;
    let Some((uid, _)) = lookup(pool, &login).await? else {
        return Err(UsersError::NoLogin {
            tenant: tenant.to_string(),
            login,
        });
    };
    sqlx::query("DELETE FROM im_basic_logins WHERE login = ? AND CAST(login AS BINARY) = ?")
        .bind(&login)
        .bind(login.as_bytes())
        .execute(pool)
        .await?;
    Ok(uid)
}

/// Sets a new password for `login` (any spelling of it); its uid.
pub async fn reset(
    pool: &MySqlPool,
    tenant: &str,
    login: &str,
    password: &str,
) -> Result<i64, UsersError> {
    let login = normalize_login(login)?;
    check_password(password)?;
    let Some((uid, _)) = lookup(pool, &login).await? else {
        return Err(UsersError::NoLogin {
            tenant: tenant.to_string(),
            login,
        });
    };
    let hash = hash_password_async(password).await?;
    set_password_hash(pool, uid, &hash).await?;
    Ok(uid)
}

/// Rewrites every stored login that is not in its normalized form
/// ([`normalize_login`]), in one transaction; returns how many changed.
/// When two rows would become one login, or a row would become malformed,
/// nothing changes and the error names them (`imstream migrate`, after the
/// SQL migrations). Compares and rewrites bytes, whatever the column's
/// collation.
pub async fn normalize_stored_logins(pool: &MySqlPool) -> Result<usize, UsersError> {
    let mut tx = pool.begin().await?;
    let rows: Vec<(Vec<u8>, i64)> = sqlx::query_as(
        "SELECT CAST(login AS BINARY), uid FROM im_basic_logins ORDER BY uid FOR UPDATE",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut seen: std::collections::HashMap<String, (String, i64)> =
        std::collections::HashMap::new();
    let mut changes = Vec::new();
    for (bytes, uid) in rows {
        let Ok(stored) = String::from_utf8(bytes) else {
            return Err(UsersError::StoredMalformed {
                login: "(not UTF-8)".into(),
                uid,
            });
        };
        let Ok(normalized) = normalize_login(&stored) else {
            return Err(UsersError::StoredMalformed { login: stored, uid });
        };
        if let Some((first, first_uid)) = seen.get(&normalized) {
            return Err(UsersError::Collision {
                first: first.clone(),
                first_uid: *first_uid,
                second: stored,
                second_uid: uid,
                normalized,
            });
        }
        if normalized != stored {
            changes.push((stored.clone(), normalized.clone()));
        }
        seen.insert(normalized, (stored, uid));
    }
    for (stored, normalized) in &changes {
        let updated = sqlx::query(
            "UPDATE im_basic_logins SET login = ?, updated_at = UTC_TIMESTAMP(3) \
             WHERE login = ? AND CAST(login AS BINARY) = ?",
        )
        .bind(normalized)
        .bind(stored)
        .bind(stored.as_bytes())
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Err(UsersError::Db(sqlx::Error::Protocol(format!(
                "normalizing login {stored:?} updated {} rows, not 1; rolled back",
                updated.rows_affected()
            ))));
        }
    }
    tx.commit().await?;
    Ok(changes.len())
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
    fn reset_hashes_must_be_argon2id_and_the_locked_hash_matches_nothing() {
        let h = hash_password("correct horse").unwrap();
        assert!(is_argon2id_hash(&h));
        assert!(!is_argon2id_hash(""));
        assert!(!is_argon2id_hash(LOCKED_HASH));
        assert!(!is_argon2id_hash("correct horse"));
        assert!(!is_argon2id_hash(
            "$argon2i$v=19$m=16,t=2,p=1$c2FsdHNhbHQ$3kWCrc2b3fTGMXQwT7BNPA"
        ));
        for guess in ["", "!reset", "reset", "correct horse"] {
            assert!(!verify_password(guess, LOCKED_HASH), "{guess:?}");
        }
        assert!(check_password("1234567").is_err());
        assert!(check_password("12345678").is_ok());
        assert!(check_password(&"x".repeat(MAX_PASSWORD_BYTES + 1)).is_err());
    }

    #[test]
    fn logins_are_checked() {
        assert!(check_login("alice").is_ok());
        assert!(check_login("a.b@example.com").is_ok());
        for bad in [
            "",
            "a:b",
            "a b",
            "a\tb",
            "carol ",
            " carol",
            "carol\u{a0}",
            "a\u{ff1a}b", // a fullwidth colon is ':' once normalized
            &"x".repeat(65),
        ] {
            assert!(check_login(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn logins_normalize_case_and_compatibility_forms_but_not_accents() {
        let n = |s: &str| normalize_login(s).unwrap();
        for same in ["Carol", "CAROL", "carol", "cArOl", "\u{ff23}\u{ff41}rol"] {
            assert_eq!(n(same), "carol", "{same:?}");
        }
        // Full case folding: ß is ss, the Kelvin sign is k, ﬁ is fi.
        assert_eq!(n("Straße"), n("STRASSE"));
        assert_eq!(n("\u{212a}evin"), "kevin");
        assert_eq!(n("\u{fb01}n"), "fin");
        // Accents are kept: cárol is another login than carol, however
        // the accent is encoded.
        assert_ne!(n("cárol"), n("carol"));
        assert_eq!(n("ca\u{301}rol"), n("c\u{e1}rol"));
        assert_eq!(n("CÁROL"), n("cárol"));
        // Normalizing a normalized login changes nothing.
        for s in ["Straße", "ΣΊΣΥΦΟΣ", "İstanbul", "\u{fb01}", "ǅemal", "Ǆ"] {
            let once = n(s);
            assert_eq!(n(&once), once, "{s:?}");
        }
    }
}
