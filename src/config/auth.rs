//! `auth`: token signing (per-tenant keys), operator tokens, `basic`
//! logins, the dev users; secrets too weak or published are refused.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// HS256 secret for session tokens. Must be changed in production.
    pub jwt_secret: String,
    /// Lifetime of issued tokens, in seconds.
    pub token_ttl_secs: u64,
    /// Users accepted by the `basic` login scheme (development only).
    pub dev_users: Vec<DevUser>,
    /// Bearer token of the `/v1/admin` endpoints. Must be changed in production.
    /// An unnamed operator (audited as `admin`) of every tenant; empty
    /// disables it (allowed when `admin_tokens` lists others).
    pub admin_token: String,
    /// Named admin tokens: the audit records the name, and a token with a
    /// `tenant` may act on that tenant only.
    pub admin_tokens: Vec<AdminToken>,
    /// `iss` of issued tokens; tokens of another issuer are refused.
    pub issuer: String,
    /// Password logins of real deployments (`{login scheme="basic"}`).
    pub basic: BasicAuthConfig,
}

/// One operator's bearer token for the `/v1/admin` endpoints.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminToken {
    /// Who holds it: recorded as the operator of every call made with it.
    pub name: String,
    pub token: String,
    /// The one tenant it may act on; absent: every tenant.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// One HS256 key of a tenant's session tokens, named by the `kid` header.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningKey {
    pub kid: String,
    pub secret: String,
}

/// Where `basic` logins are looked up besides the development users: the
/// `im_basic_logins` table (Argon2id hashes, `imstream users add`) of
/// these tenants.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BasicAuthConfig {
    /// Tenants whose logins table answers `basic` logins. A login names one
    /// person across them (`imstream users add` refuses a login another of
    /// these tenants has). Empty: only `auth.dev_users` (development).
    pub tenants: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            jwt_secret: "dev-secret-change-me".into(),
            token_ttl_secs: 14 * 86_400,
            dev_users: Vec::new(),
            admin_token: "dev-admin-token-change-me".into(),
            admin_tokens: Vec::new(),
            issuer: "imstream".into(),
            basic: BasicAuthConfig::default(),
        }
    }
}

/// Shortest accepted `auth.jwt_secret` / `auth.admin_token` outside dev.
pub const MIN_SECRET_BYTES: usize = 32;

/// Secrets published with imstream (built-in defaults, the local config,
/// the compose file's old fallbacks): they protect nothing.
pub(super) const PUBLISHED_SECRETS: &[&str] = &[
    "dev-secret-change-me",
    "dev-admin-token-change-me",
    "local-dev-secret-change-me",
    "local-dev-admin-token-change-me",
    "compose-dev-secret-change-me",
    "compose-admin-token-change-me",
];

impl AuthConfig {
    /// Why these secrets must not guard a real deployment (empty: fine).
    pub fn secret_problems(&self) -> Vec<String> {
        let mut named = vec![("auth.jwt_secret".to_string(), self.jwt_secret.as_str())];
        // The unnamed token may be switched off once named ones exist.
        if !(self.admin_token.is_empty() && !self.admin_tokens.is_empty()) {
            named.push(("auth.admin_token".into(), self.admin_token.as_str()));
        }
        for t in &self.admin_tokens {
            named.push((format!("auth.admin_tokens {:?}", t.name), t.token.as_str()));
        }
        let mut out = weak_secrets(&named);
        if !self.dev_users.is_empty() {
            out.push(
                "auth.dev_users holds plaintext passwords (development only; use auth.basic and `imstream users add`)"
                    .into(),
            );
        }
        out
    }
}

/// Problems of named secrets: published defaults, short ones, and one
/// secret used for two purposes.
pub(super) fn weak_secrets(named: &[(String, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, value) in named {
        if PUBLISHED_SECRETS.contains(value) || value.contains("change-me") {
            out.push(format!("{name} is a published default"));
        } else if value.len() < MIN_SECRET_BYTES {
            out.push(format!("{name} is shorter than {MIN_SECRET_BYTES} bytes"));
        }
    }
    for (i, (a, x)) in named.iter().enumerate() {
        for (b, y) in &named[i + 1..] {
            if !x.is_empty() && x == y {
                out.push(format!("{a} and {b} are the same"));
            }
        }
    }
    out
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevUser {
    pub tenant: String,
    pub uid: i64,
    pub login: String,
    pub password: String,
    /// The name people see (`public.fn`): given to the user at gateway
    /// start when they have no profile yet (a name set later is kept).
    #[serde(default)]
    pub name: Option<String>,
    /// A picture reference (`public.photo.ref`): a URL or a path of the
    /// gateway, or a `data:image/…;base64,` URI (what the web app shows
    /// under its policy, which allows the page's origin and `data:`).
    #[serde(default)]
    pub photo: Option<String>,
}

/// Longest dev user name (`auth.dev_users[].name`), in characters: as
/// profile names set through the API.
pub const MAX_DEV_NAME_CHARS: usize = 128;

/// Longest dev user picture reference, in characters.
pub const MAX_DEV_PHOTO_CHARS: usize = 512;
