//! Configuration: one TOML file (see `docker/local/imstream.toml` for the
//! documented example) with environment overrides.
//!
//! Every section denies unknown keys, so a typo is refused with a message
//! naming the key instead of being silently ignored. Overrides use the form
//! `IMSTREAM__<SECTION>__<KEY>=<value>` (double underscores separate path
//! segments; the value is parsed as a TOML scalar, falling back to a string),
//! for example `IMSTREAM__KAFKA__BROKERS=10.0.0.5:9092`.

mod auth;
mod engines;
mod limits;
mod processes;
mod tenants;

pub use auth::*;
pub use engines::*;
pub use limits::*;
pub use processes::*;
pub use tenants::*;

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Prefix of the environment variables that override configuration keys.
pub const ENV_PREFIX: &str = "IMSTREAM__";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {source}")]
    Syntax {
        path: String,
        source: toml::de::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub node: NodeConfig,
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub redis: RedisConfig,
    #[serde(default)]
    pub mysql: MysqlConfig,
    #[serde(default)]
    pub registry: RegistryConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    #[serde(default)]
    pub gateway: GatewayConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub shards: ShardsConfig,
    #[serde(default)]
    pub pipelines: PipelinesConfig,
    #[serde(default)]
    pub push: PushConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    #[serde(default)]
    pub search: SearchConfig,
    #[serde(default)]
    pub files: FilesConfig,
    /// Tenants served by this deployment; each has its own database.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
}

impl Config {
    /// Loads `path` (or the built-in defaults when `None`) and applies the
    /// `IMSTREAM__…` environment overrides.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.display().to_string(),
                source,
            })?,
            None => String::new(),
        };
        let shown = path.map_or_else(|| "<defaults>".to_string(), |p| p.display().to_string());
        Self::from_toml_with_env(&text, &shown, std::env::vars())
    }

    /// Parses TOML text, applies overrides from `env`, and validates.
    pub fn from_toml_with_env(
        text: &str,
        shown_path: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let file: toml::Table = text.parse().map_err(|source| ConfigError::Syntax {
            path: shown_path.to_string(),
            source,
        })?;
        // Defaults first, the file over them, the environment over both, so
        // one key can be set without restating its whole section.
        let mut doc = match toml::Value::try_from(Config::default()) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        };
        merge(&mut doc, file);
        for (name, value) in env {
            if let Some(path) = name.strip_prefix(ENV_PREFIX) {
                apply_override(&mut doc, &name, path, &value)?;
            }
        }
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(doc))
            .map_err(|e| ConfigError::Invalid(format!("{}: {}", e.path(), e.inner().message())))?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.search.writer_memory_mb < 15 {
            return Err(ConfigError::Invalid(
                "search.writer_memory_mb must be at least 15".into(),
            ));
        }
        if self.search.index_dir.is_empty() {
            return Err(ConfigError::Invalid("search.index_dir is empty".into()));
        }
        if let Some(t) = self
            .search
            .tenants
            .iter()
            .find(|t| !self.tenants.iter().any(|c| &c.id == *t))
        {
            return Err(ConfigError::Invalid(format!(
                "search.tenants: {t:?} is not a configured tenant"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &self.tenants {
            crate::names::validate_tenant_id(&t.id)
                .map_err(|e| ConfigError::Invalid(format!("tenants.id {:?}: {e}", t.id)))?;
            crate::names::validate_database_name(&t.database).map_err(|e| {
                ConfigError::Invalid(format!("tenants.database {:?}: {e}", t.database))
            })?;
            for (what, url) in [
                ("mysql_url", &t.mysql_url),
                ("mysql_read_url", &t.mysql_read_url),
            ] {
                if url.as_deref().is_some_and(|u| !u.starts_with("mysql://")) {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: {what} must be a mysql:// URL without a database",
                        t.id
                    )));
                }
            }
            if !seen.insert(t.id.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "tenant {:?} is listed twice",
                    t.id
                )));
            }
            let mut kids = std::collections::HashSet::new();
            for k in &t.signing_keys {
                if k.kid.is_empty() || k.kid.len() > 64 {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: signing_keys kid must be 1-64 characters",
                        t.id
                    )));
                }
                if !kids.insert(k.kid.as_str()) {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: signing key {:?} is listed twice",
                        t.id, k.kid
                    )));
                }
                if k.secret.len() < 16 {
                    return Err(ConfigError::Invalid(format!(
                        "tenants {:?}: signing key {:?} must be at least 16 bytes",
                        t.id, k.kid
                    )));
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for a in &self.auth.admin_tokens {
            if a.name.is_empty() || !names.insert(a.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "auth.admin_tokens: name {:?} is empty or listed twice",
                    a.name
                )));
            }
            if let Some(t) = a.tenant.as_deref().filter(|t| !seen.contains(t)) {
                return Err(ConfigError::Invalid(format!(
                    "auth.admin_tokens {:?}: tenant {t:?} is not configured",
                    a.name
                )));
            }
        }
        if self.auth.issuer.is_empty() {
            return Err(ConfigError::Invalid("auth.issuer is empty".into()));
        }
        crate::names::validate_database_name(&self.registry.database).map_err(|e| {
            ConfigError::Invalid(format!(
                "registry.database {:?}: {e}",
                self.registry.database
            ))
        })?;
        if self.kafka.brokers.trim().is_empty() {
            return Err(ConfigError::Invalid("kafka.brokers is empty".into()));
        }
        let topics = &self.kafka.topics;
        for (name, spec) in [
            ("group_events", &topics.group_events),
            ("receipts", &topics.receipts),
            ("session_control", &topics.session_control),
            ("admin_commands", &topics.admin_commands),
            ("admin_results", &topics.admin_results),
            ("dlq", &topics.dlq),
        ] {
            if spec.partitions < 1 {
                return Err(ConfigError::Invalid(format!(
                    "kafka.topics.{name}.partitions must be at least 1, got {}",
                    spec.partitions
                )));
            }
            if spec.retention_ms < -1 || spec.retention_ms == 0 {
                return Err(ConfigError::Invalid(format!(
                    "kafka.topics.{name}.retention_ms must be -1 (forever) or positive, got {}",
                    spec.retention_ms
                )));
            }
        }
        if self.auth.jwt_secret.len() < 16 {
            return Err(ConfigError::Invalid(
                "auth.jwt_secret must be at least 16 bytes".into(),
            ));
        }
        let control = self.kafka.topics.session_control.retention_ms;
        if control != -1 && control < self.auth.token_ttl_secs as i64 * 1000 {
            return Err(ConfigError::Invalid(format!(
                "kafka.topics.session_control.retention_ms ({control}) must be -1 or at least auth.token_ttl_secs ({} s): a revocation must outlive the tokens it revokes",
                self.auth.token_ttl_secs
            )));
        }
        if let Some(u) = self.auth.dev_users.iter().find(|u| u.uid <= 0) {
            return Err(ConfigError::Invalid(format!(
                "auth.dev_users: {:?} has uid {}; uids are positive",
                u.login, u.uid
            )));
        }
        for u in &self.auth.dev_users {
            let name = u.name.as_deref().unwrap_or("x");
            if name.trim().is_empty() || name.chars().count() > MAX_DEV_NAME_CHARS {
                return Err(ConfigError::Invalid(format!(
                    "auth.dev_users: {:?} has a name that is empty or longer than {MAX_DEV_NAME_CHARS} characters",
                    u.login
                )));
            }
            let photo = u.photo.as_deref().unwrap_or("/");
            let data_uri = photo
                .strip_prefix("data:image/")
                .and_then(|rest| rest.split_once(";base64,"))
                .is_some_and(|(kind, _)| {
                    !kind.is_empty()
                        && kind
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
                });
            if photo.chars().count() > MAX_DEV_PHOTO_CHARS
                || !(photo.starts_with('/')
                    || photo.starts_with("https://")
                    || photo.starts_with("http://")
                    || data_uri)
            {
                return Err(ConfigError::Invalid(format!(
                    "auth.dev_users: {:?} has a photo that is not a URL, a path or a data:image/…;base64, URI of at most {MAX_DEV_PHOTO_CHARS} characters",
                    u.login
                )));
            }
        }
        if let Some(t) = self
            .auth
            .basic
            .tenants
            .iter()
            .find(|t| self.tenant(t).is_none())
        {
            return Err(ConfigError::Invalid(format!(
                "auth.basic.tenants: {t:?} is not a configured tenant"
            )));
        }
        if let Some(o) = self
            .gateway
            .allowed_origins
            .iter()
            .find(|o| *o != "*" && !o.contains("://"))
        {
            return Err(ConfigError::Invalid(format!(
                "gateway.allowed_origins: {o:?} is not an origin (scheme://host[:port]) or \"*\""
            )));
        }
        if !self.shards.clock_override.is_empty() {
            chrono::DateTime::parse_from_rfc3339(&self.shards.clock_override).map_err(|e| {
                ConfigError::Invalid(format!(
                    "shards.clock_override {:?} is not RFC 3339: {e}",
                    self.shards.clock_override
                ))
            })?;
        }
        Ok(())
    }

    /// Why this deployment's secrets (`auth`'s and every tenant's signing
    /// keys) must not guard a real deployment (empty: fine).
    pub fn secret_problems(&self) -> Vec<String> {
        let mut out = self.auth.secret_problems();
        let mut named = Vec::new();
        for t in &self.tenants {
            for k in &t.signing_keys {
                named.push((
                    format!("tenants {:?} signing key {:?}", t.id, k.kid),
                    k.secret.as_str(),
                ));
            }
        }
        out.extend(weak_secrets(&named));
        for (name, value) in &named {
            if value == &self.auth.jwt_secret || value == &self.auth.admin_token {
                out.push(format!("{name} is also an auth secret"));
            }
        }
        out
    }

    /// The tenant with this id, if configured.
    pub fn tenant(&self, id: &str) -> Option<&TenantConfig> {
        self.tenants.iter().find(|t| t.id == id)
    }
}

/// Deep-merges `over` into `base`: tables merge key by key, anything else
/// (scalars, arrays) replaces.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(key, v);
            }
        }
    }
}

/// Applies one `IMSTREAM__A__B=value` override to the parsed document.
fn apply_override(
    doc: &mut toml::Table,
    var: &str,
    path: &str,
    value: &str,
) -> Result<(), ConfigError> {
    let segments: Vec<String> = path.split("__").map(|s| s.to_ascii_lowercase()).collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(ConfigError::Invalid(format!(
            "environment variable {var}: empty key segment"
        )));
    }
    let (last, parents) = segments.split_last().expect("split yields one segment");
    let mut table = doc;
    for seg in parents {
        let entry = table
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| {
            ConfigError::Invalid(format!(
                "environment variable {var}: `{seg}` is not a section"
            ))
        })?;
    }
    table.insert(last.clone(), parse_scalar(value));
    Ok(())
}

/// A TOML scalar if the text parses as one (number, bool, array), else a string.
fn parse_scalar(value: &str) -> toml::Value {
    let wrapped = format!("v = {value}");
    match wrapped.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(value.into())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(
            text,
            "test.toml",
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn the_local_config_gives_the_dev_users_names_and_pictures() {
        let c = load(include_str!("../../docker/local/imstream.toml"), &[]).unwrap();
        let users: Vec<(&str, Option<&str>, bool)> = c
            .auth
            .dev_users
            .iter()
            .map(|u| {
                let photo = u.photo.as_deref().unwrap_or("");
                (
                    u.login.as_str(),
                    u.name.as_deref(),
                    photo.starts_with("data:image/svg+xml;base64,"),
                )
            })
            .collect();
        assert_eq!(
            users,
            vec![
                ("alice", Some("Alice Liddell"), true),
                ("bob", Some("Bob Builder"), true)
            ]
        );
        // A login made with `imstream users add` logs in on a fresh
        // `docker/local/run`: every local tenant answers `basic` logins.
        let tenants: Vec<&str> = c.tenants.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(c.auth.basic.tenants, tenants);
    }

    #[test]
    fn dev_user_names_and_pictures_are_checked() {
        let user = |extra: &str| {
            format!("[[auth.dev_users]]\ntenant = \"t\"\nuid = 1\nlogin = \"a\"\npassword = \"p\"\n{extra}\n")
        };
        assert!(load(&user(""), &[]).is_ok());
        assert!(load(&user("name = \"Ann\"\nphoto = \"/img/a.png\""), &[]).is_ok());
        assert!(load(&user("photo = \"data:image/png;base64,iVBORw0=\""), &[]).is_ok());
        for bad in [
            "name = \"  \"".to_string(),
            format!("name = \"{}\"", "n".repeat(MAX_DEV_NAME_CHARS + 1)),
            "photo = \"javascript:alert(1)\"".to_string(),
            "photo = \"data:image/svg+xml,%3Csvg/%3E\"".to_string(),
            "photo = \"data:text/html;base64,PGI+\"".to_string(),
            format!(
                "photo = \"data:image/png;base64,{}\"",
                "A".repeat(MAX_DEV_PHOTO_CHARS)
            ),
        ] {
            let err = load(&user(&bad), &[]).unwrap_err().to_string();
            assert!(err.contains("auth.dev_users"), "{bad}: {err}");
        }
    }

    #[test]
    fn defaults_are_valid() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.kafka.topics.group_events.retention_ms, -1);
        assert!(c.tenants.is_empty());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = load("[kafka]\nbrokerz = \"x\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("brokerz"), "{err}");
    }

    #[test]
    fn env_overrides_nested_keys() {
        let c = load(
            "[kafka]\nbrokers = \"a:1\"\n",
            &[
                ("IMSTREAM__KAFKA__BROKERS", "b:2"),
                ("IMSTREAM__KAFKA__TOPICS__GROUP_EVENTS__PARTITIONS", "16"),
                ("IMSTREAM__GATEWAY__MAX_MESSAGE_SIZE", "1024"),
                ("OTHER", "ignored"),
            ],
        )
        .unwrap();
        assert_eq!(c.kafka.brokers, "b:2");
        assert_eq!(c.kafka.topics.group_events.partitions, 16);
        assert_eq!(c.gateway.max_message_size, 1024);
    }

    #[test]
    fn unknown_env_key_is_refused() {
        let err = load("", &[("IMSTREAM__REDIS__URLL", "x")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("urll"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let err = load(
            "[kafka.topics.receipts]\npartitions = 0\nretention_ms = 5\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("kafka.topics.receipts.partitions"), "{err}");
        let err = load("[[tenants]]\nid = \"Bad Tenant\"\ndatabase = \"db\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("Bad Tenant"), "{err}");
        let err = load("[gateway]\nmax_message_size = \"big\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_message_size") || err.contains("invalid type"),
            "{err}"
        );
    }

    #[test]
    fn plaintext_dev_users_are_a_secret_problem() {
        let strong = AuthConfig {
            jwt_secret: "j".repeat(40),
            admin_token: "a".repeat(40),
            ..AuthConfig::default()
        };
        assert!(strong.secret_problems().is_empty());
        let with_dev = AuthConfig {
            dev_users: vec![DevUser {
                tenant: "demo".into(),
                uid: 1,
                login: "alice".into(),
                password: "alice123".into(),
                name: None,
                photo: None,
            }],
            ..strong
        };
        let problems = with_dev.secret_problems();
        assert!(
            problems.iter().any(|p| p.contains("auth.dev_users")),
            "{problems:?}"
        );
    }

    #[test]
    fn basic_tenants_and_origins_are_checked() {
        let err = load("[auth.basic]\ntenants = [\"nope\"]\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope"), "{err}");
        let err = load("[gateway]\nallowed_origins = [\"example.com\"]\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("example.com"), "{err}");
        let c = load(
            "[gateway]\nallowed_origins = [\"https://chat.example.com\", \"*\"]\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.gateway.allowed_origins.len(), 2);
    }

    #[test]
    fn database_url_keeps_query() {
        let m = MysqlConfig {
            url: "mysql://u:p@h:1?ssl-mode=disabled".into(),
            max_connections: 1,
            ..MysqlConfig::default()
        };
        assert_eq!(m.database_url("t1"), "mysql://u:p@h:1/t1?ssl-mode=disabled");
    }

    #[test]
    fn a_tenant_may_live_on_its_own_server_with_a_read_replica() {
        let config = Config::from_toml_with_env(
            r#"
            [mysql]
            url = "mysql://u:p@main:3306"
            [[tenants]]
            id = "a"
            database = "ima"
            [[tenants]]
            id = "b"
            database = "imb"
            mysql_url = "mysql://u:p@server-b:3306"
            mysql_read_url = "mysql://r:p@replica-b:3306"
            "#,
            "<test>",
            Vec::new(),
        )
        .unwrap();
        let (a, b) = (&config.tenants[0], &config.tenants[1]);
        assert_eq!(
            a.mysql(&config.mysql).database_url(&a.database),
            "mysql://u:p@main:3306/ima"
        );
        assert!(a.mysql_read(&config.mysql).is_none());
        assert_eq!(
            b.mysql(&config.mysql).database_url(&b.database),
            "mysql://u:p@server-b:3306/imb"
        );
        assert_eq!(
            b.mysql_read(&config.mysql)
                .unwrap()
                .database_url(&b.database),
            "mysql://r:p@replica-b:3306/imb"
        );
        let bad = Config::from_toml_with_env(
            "[[tenants]]\nid = \"c\"\ndatabase = \"imc\"\nmysql_url = \"server-c:3306\"\n",
            "<test>",
            Vec::new(),
        );
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("mysql_url must be a mysql:// URL"));
    }
}
