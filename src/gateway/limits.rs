//! What one user or one client address may make the gateway do (issue 13):
//! per-user token buckets in Redis (`lua/rate_limit.lua`), failed-login
//! lockouts with exponential backoff (`lua/login_attempt.lua`) and the
//! per-address connection count of this gateway. Over a limit a request is
//! refused with a retry-after (HTTP `429` + `Retry-After`, WebSocket
//! `{ctrl 429 params.retry_after_ms}`); nothing else about the connection
//! or the user's data changes. Security checks fail closed (seed 001 §10):
//! with Redis unreachable a limited request is refused with `503`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::redis_util::Redis;
use crate::tinode;
use serde_json::json;

use crate::config::{BucketConfig, LimitsConfig};

/// The rate-limited actions, one bucket each per (tenant, uid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Send,
    Receipt,
    Clear,
    Search,
    /// `{get topic="fnd" what="sub"}`: one directory search.
    Find,
    GroupCreate,
    /// Users added or invited to groups (one token each).
    MemberAdd,
    FriendRequest,
    Report,
    /// `PUT /v1/me/password`.
    PasswordChange,
    /// `POST /v0/file/u/`.
    Upload,
    /// Every other change a user makes that becomes an event: blocks,
    /// friends removed, push settings and mutes, profiles, favorites,
    /// invitation answers, governance commands, deletes for everyone
    /// (issue 39: each is kept in a log forever, and some notify others).
    Change,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Send => "send",
            Action::Receipt => "receipt",
            Action::Clear => "clear",
            Action::Search => "search",
            Action::Find => "find",
            Action::GroupCreate => "group_create",
            Action::MemberAdd => "member_add",
            Action::FriendRequest => "friend_request",
            Action::Report => "report",
            Action::PasswordChange => "password_change",
            Action::Upload => "upload",
            Action::Change => "change",
        }
    }

    fn bucket(self, limits: &LimitsConfig) -> BucketConfig {
        match self {
            Action::Send => limits.sends,
            Action::Receipt => limits.receipts,
            Action::Clear => limits.clears,
            Action::Search => limits.searches,
            Action::Find => limits.finds,
            Action::GroupCreate => limits.group_creates,
            Action::MemberAdd => limits.member_adds,
            Action::FriendRequest => limits.friend_requests,
            Action::Report => limits.reports,
            Action::PasswordChange => limits.password_changes,
            Action::Upload => limits.uploads,
            Action::Change => limits.changes,
        }
    }
}

/// Why a limited request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limited {
    /// Over the limit: retry after this many milliseconds.
    Over(u64),
    /// The limiter could not be asked (Redis down): refused, fail closed.
    Unavailable,
}

impl Limited {
    /// Tinode ctrl code, text and params.
    pub fn ctrl_parts(&self) -> (u16, &'static str, serde_json::Value) {
        match self {
            Limited::Over(ms) => (429, "too many requests", json!({"retry_after_ms": ms})),
            Limited::Unavailable => (503, tinode::UNAVAILABLE, json!({"retry": true})),
        }
    }
}

/// The user's bucket of `action` (`crate::redis_util::bucket::key`).
pub fn bucket_key(tenant: &str, uid: i64, action: Action) -> String {
    crate::redis_util::bucket::key(tenant, uid, action.name())
}

/// Takes one token of `action` from the user's bucket.
pub async fn take(
    redis: &mut Redis,
    limits: &LimitsConfig,
    tenant: &str,
    uid: i64,
    action: Action,
) -> Result<(), Limited> {
    take_n(redis, limits, tenant, uid, action, 1).await
}

/// Takes `cost` tokens of `action` from the user's bucket at once.
pub async fn take_n(
    redis: &mut Redis,
    limits: &LimitsConfig,
    tenant: &str,
    uid: i64,
    action: Action,
    cost: u32,
) -> Result<(), Limited> {
    let bucket = action.bucket(limits);
    let wait =
        crate::redis_util::bucket::take(redis, &bucket_key(tenant, uid, action), bucket, cost)
            .await;
    match wait {
        Ok(0) => Ok(()),
        Ok(ms) => {
            metrics::counter!(crate::metrics::RATE_LIMITED_TOTAL, "what" => action.name())
                .increment(1);
            Err(Limited::Over(ms))
        }
        Err(e) => {
            tracing::warn!(request_id = %crate::request_id::current(), error = %e, what = action.name(), "rate limiter unavailable; refusing");
            Err(Limited::Unavailable)
        }
    }
}

/// The subjects a login attempt is counted against: the normalized login
/// name of a `basic` login (any tenant, [`crate::auth::basic_login_name`])
/// and the client address. Each attempt is reserved before its
/// credentials are checked (`lua/login_attempt.lua`), so attempts racing
/// each other are counted one by one: at most the free ones are checked
/// before a lockout, however many arrive at once.
pub struct LoginSubjects {
    /// (attempt counter, lock, free attempts) per subject.
    keys: Vec<(String, String, u32)>,
    /// Whether the first subject is a login name.
    named: bool,
}

/// Gives one reserved attempt back (never below zero).
const GIVE_BACK: &str = "local n = redis.call('DECR', KEYS[1]) \
    if n <= 0 then redis.call('DEL', KEYS[1]) end return n";

impl LoginSubjects {
    pub fn new(login_name: Option<&str>, ip: Option<IpAddr>, limits: &LimitsConfig) -> Self {
        let mut keys = Vec::new();
        let name = login_name.filter(|n| !n.is_empty());
        if let Some(name) = name {
            // Hex, so a name cannot break out of the hash tag.
            let tag = format!("login:n:{}", hex::encode(name.as_bytes()));
            keys.push((
                format!("im:{{{tag}}}:fail"),
                format!("im:{{{tag}}}:lock"),
                limits.login_failures,
            ));
        }
        let ip = ip.filter(|ip| !(limits.exempt_loopback && ip.is_loopback()));
        if let (Some(ip), true) = (ip, limits.login_address_failures > 0) {
            let tag = format!("login:ip:{ip}");
            keys.push((
                format!("im:{{{tag}}}:fail"),
                format!("im:{{{tag}}}:lock"),
                limits.login_address_failures,
            ));
        }
        Self {
            keys,
            named: name.is_some(),
        }
    }

    /// Reserves this attempt against every subject, or refuses it while
    /// any subject is locked out (nothing stays reserved then). A reserved
    /// attempt counts as a failure until [`Self::succeeded`] or
    /// [`Self::give_back`]: a failed one needs nothing more.
    pub async fn reserve(&self, redis: &mut Redis, limits: &LimitsConfig) -> Result<(), Limited> {
        for (i, (fail, lock, free)) in self.keys.iter().enumerate() {
            let r: redis::RedisResult<u64> =
                redis::Script::new(include_str!("../../lua/login_attempt.lua"))
                    .key(fail)
                    .key(lock)
                    .arg(*free)
                    .arg(limits.login_lockout_ms.max(1))
                    .arg(limits.login_lockout_max_ms.max(1))
                    .invoke_async(redis)
                    .await;
            let refused = match r {
                Ok(0) => continue,
                Ok(ms) => {
                    metrics::counter!(crate::metrics::RATE_LIMITED_TOTAL, "what" => "login")
                        .increment(1);
                    Limited::Over(ms)
                }
                Err(e) => {
                    tracing::warn!(request_id = %crate::request_id::current(), error = %e, "login lockout check unavailable; refusing");
                    Limited::Unavailable
                }
            };
            for (fail, _, _) in &self.keys[..i] {
                give_back(redis, fail).await;
            }
            return Err(refused);
        }
        Ok(())
    }

    /// The credentials were right: the login name's count and lockout are
    /// forgotten, the address gets its attempt back (one valid account
    /// must not unlock guessing others from that address).
    pub async fn succeeded(&self, redis: &mut Redis) {
        for (i, (fail, lock, _)) in self.keys.iter().enumerate() {
            if i == 0 && self.named {
                let _: redis::RedisResult<i64> = redis::cmd("DEL")
                    .arg(fail)
                    .arg(lock)
                    .query_async(redis)
                    .await;
            } else {
                give_back(redis, fail).await;
            }
        }
    }

    /// The attempt was not decided (the logins table could not be read):
    /// it does not count.
    pub async fn give_back(&self, redis: &mut Redis) {
        for (fail, _, _) in &self.keys {
            give_back(redis, fail).await;
        }
    }
}

async fn give_back(redis: &mut Redis, counter: &str) {
    let r: redis::RedisResult<i64> = redis::Script::new(GIVE_BACK)
        .key(counter)
        .invoke_async(redis)
        .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "a login attempt was not given back");
    }
}

/// Failed admin tokens per client address on this gateway's operator
/// port (in process: the port is loopback, and a shared Redis count would
/// let one host's mistakes lock out another's). Beyond
/// `limits.admin_failures` the address is refused every admin call, the
/// right token included, for a lockout that doubles with each further
/// failure; the count is forgotten a while after the longest lockout.
#[derive(Clone, Default)]
pub struct AdminFailures(Arc<Mutex<HashMap<IpAddr, AdminRecord>>>);

#[derive(Debug, Clone, Copy)]
struct AdminRecord {
    failures: u32,
    last: std::time::Instant,
    locked_until: Option<std::time::Instant>,
}

/// Addresses remembered at most (expired ones are dropped first).
const ADMIN_FAILURES_MAX_ADDRESSES: usize = 10_000;

impl AdminFailures {
    /// Judges one admin call from `ip` whose token is `valid` or not, under
    /// one lock. A valid token always passes: the lockout is against
    /// guessing, and a locked-out address (on loopback, every local caller)
    /// must not lock the operator out (issue 39). A wrong one is refused
    /// with `Err(retry_after_ms)` while the address is locked out; else it
    /// is counted, the one that uses up the free failures starting the
    /// lockout. What a guesser learns from the answer is what a 401 tells:
    /// tokens have at least 32 bytes (`auth::MIN_SECRET_BYTES`) outside
    /// dev, so the count bounds the noise, not the odds.
    pub fn attempt(&self, ip: IpAddr, valid: bool, limits: &LimitsConfig) -> Result<(), u64> {
        if valid {
            return Ok(());
        }
        let now = std::time::Instant::now();
        let first = limits.login_lockout_ms.max(1);
        let longest = limits.login_lockout_max_ms.max(first);
        let forget = std::time::Duration::from_millis(longest.saturating_mul(2));
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = t.get(&ip) {
            if let Some(until) = r.locked_until.filter(|u| *u > now) {
                let ms = until.duration_since(now).as_millis() as u64;
                return Err(ms.max(1));
            }
            if now.duration_since(r.last) > forget {
                t.remove(&ip);
            }
        }
        if t.len() >= ADMIN_FAILURES_MAX_ADDRESSES && !t.contains_key(&ip) {
            t.retain(|_, r| now.duration_since(r.last) <= forget);
        }
        let r = t.entry(ip).or_insert(AdminRecord {
            failures: 0,
            last: now,
            locked_until: None,
        });
        r.failures += 1;
        r.last = now;
        let free = limits.admin_failures.max(1);
        if r.failures >= free {
            let ms = first
                .saturating_mul(1u64 << (r.failures - free).min(30))
                .min(longest);
            r.locked_until = Some(now + std::time::Duration::from_millis(ms));
        }
        Ok(())
    }
}

/// Open connections per client address on this gateway.
#[derive(Clone, Default)]
pub struct Connections(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One counted connection; uncounted when dropped.
pub struct ConnectionGuard {
    table: Connections,
    ip: IpAddr,
}

impl Connections {
    /// Counts a connection from `ip` (loopback is not counted when
    /// `limits.exempt_loopback`), or `None` when it already has the most
    /// allowed.
    pub fn admit(&self, ip: IpAddr, limits: &LimitsConfig) -> Result<Option<ConnectionGuard>, ()> {
        if limits.exempt_loopback && ip.is_loopback() {
            return Ok(None);
        }
        self.open(ip, limits.connections_per_ip).map(Some).ok_or(())
    }

    /// Counts a connection from `ip`, or `None` when it already has `max`.
    pub fn open(&self, ip: IpAddr, max: usize) -> Option<ConnectionGuard> {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = t.entry(ip).or_insert(0);
        if *n >= max.max(1) {
            return None;
        }
        *n += 1;
        Some(ConnectionGuard {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut t = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_keys_use_the_users_hash_tag() {
        assert_eq!(bucket_key("acme", 7, Action::Send), "im:{acme:u:7}:rl:send");
    }

    #[test]
    fn failed_admin_tokens_lock_the_address_out() {
        let limits = LimitsConfig {
            admin_failures: 3,
            login_lockout_ms: 60_000,
            ..LimitsConfig::default()
        };
        let f = AdminFailures::default();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        // A valid token costs nothing.
        for _ in 0..10 {
            assert_eq!(f.attempt(ip, true, &limits), Ok(()));
        }
        for _ in 0..3 {
            assert_eq!(f.attempt(ip, false, &limits), Ok(()));
        }
        // Locked: every wrong token from that address; the right one
        // still passes (an operator on the same address is not locked out).
        let wait = f.attempt(ip, false, &limits).unwrap_err();
        assert!(wait > 59_000 && wait <= 60_000, "{wait}");
        assert_eq!(f.attempt(ip, true, &limits), Ok(()));
        assert!(f.attempt(ip, false, &limits).is_err());
        // Another address is not concerned.
        assert_eq!(
            f.attempt("127.0.0.2".parse().unwrap(), true, &limits),
            Ok(())
        );
    }

    #[test]
    fn connections_are_counted_per_address() {
        let c = Connections::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let a = c.open(ip, 2).unwrap();
        let _b = c.open(ip, 2).unwrap();
        assert!(c.open(ip, 2).is_none());
        assert!(c.open("10.0.0.2".parse().unwrap(), 2).is_some());
        drop(a);
        assert!(c.open(ip, 2).is_some());
    }
}
