//! `limits`: every per-user, per-topic and per-process bound the gateway
//! and the pipelines enforce (rates as token buckets).

use serde::{Deserialize, Serialize};

/// A token bucket: `burst` requests at once, refilled at `per_minute`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    pub burst: u32,
    pub per_minute: u32,
}

impl BucketConfig {
    pub const fn new(burst: u32, per_minute: u32) -> Self {
        Self { burst, per_minute }
    }
}

/// What one user, one address or one message may cost (issue 13). The
/// rate buckets live in Redis under the user's own hash tag
/// (`im:{<tenant>:u:<uid>}:rl:<what>`); with Redis down a limited request
/// is refused (503), never let through (seed 001 §10).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Messages and edits (WebSocket `{pub}`, HTTP sends) per user.
    pub sends: BucketConfig,
    /// `{note what="recv"|"read"}` per user.
    pub receipts: BucketConfig,
    /// History clears (`{del}` without `hard`, `POST …/history/clear`).
    pub clears: BucketConfig,
    /// `GET …/search` per user.
    pub searches: BucketConfig,
    /// Directory searches (`{get topic="fnd" what="sub"}`) per user.
    pub finds: BucketConfig,
    /// `POST /v1/groups` per user.
    pub group_creates: BucketConfig,
    /// Users one user may add or invite to groups (creates and adds), per
    /// minute; a request costs one token per named user. Operators' admin
    /// commands are not counted.
    pub member_adds: BucketConfig,
    /// Most users one create or add may name (`400` beyond); operators add
    /// more through the `group.member.add` admin command.
    pub members_per_request: usize,
    /// `POST /v1/friends/requests` per user.
    pub friend_requests: BucketConfig,
    /// `POST …/messages/{seq}/report` per user.
    pub reports: BucketConfig,
    /// `PUT /v1/me/password` per user (each costs two Argon2 hashes; wrong
    /// old passwords also count as failed logins of the user's login).
    pub password_changes: BucketConfig,
    /// File uploads per user (`POST /v0/file/u/`; each may be
    /// `files.max_upload_bytes`).
    pub uploads: BucketConfig,
    /// Every other change a user makes that becomes an event (blocks and
    /// unblocks, friends removed, push settings and topic mutes, profiles,
    /// favorites, invitation answers, governance commands, deletes for
    /// everyone), per user: each is kept in a log, and some notify others.
    pub changes: BucketConfig,
    /// Favorites one user may keep (`PUT /v1/me/favorites/…` beyond it is
    /// refused with 409).
    pub favorites_per_user: usize,
    /// Passwords checked per login name (`basic`, normalized) before a
    /// lockout, however many attempts arrive at once: the attempt that
    /// takes the last one starts the lockout (a success lifts it); each
    /// attempt after a lockout ends doubles it.
    pub login_failures: u32,
    /// Failed logins per client address (any scheme) before its lockout,
    /// counted the same way; 0 turns the per-address lockout off (behind a
    /// proxy every client has the proxy's address).
    pub login_address_failures: u32,
    /// Loopback clients (a local proxy, `imstream bench`, tests) are not
    /// counted per address (connections, failed logins).
    pub exempt_loopback: bool,
    /// Failed admin tokens per client address, on one gateway's operator
    /// port, before it answers `429` to every admin call from that
    /// address for a while (the lockouts below, doubling).
    pub admin_failures: u32,
    /// First lockout, in milliseconds.
    pub login_lockout_ms: u64,
    /// Longest lockout, in milliseconds.
    pub login_lockout_max_ms: u64,
    /// Open WebSocket and HTTP connections per client address, per gateway.
    pub connections_per_ip: usize,
    /// Logged-in sessions per user on one gateway; a login beyond it is
    /// refused (`{ctrl 429 "too many sessions"}`, then closed), existing
    /// sessions are kept.
    pub sessions_per_user: usize,
    /// A socket that has not logged in (`{hi}` + `{login}`) this long
    /// after connecting is closed.
    pub login_deadline_secs: u64,
    /// A socket with no frame from the client (a message, Tinode's `1`
    /// probe, a pong to the gateway's pings) this long is closed. The
    /// gateway pings every third of it.
    pub idle_timeout_secs: u64,
    /// HTTP: time to read a request's headers, in seconds.
    pub header_timeout_secs: u64,
    /// HTTP: time to handle a request, body included, in seconds.
    pub request_timeout_secs: u64,
    /// HTTP: largest request body, in bytes.
    pub max_body_bytes: usize,
    /// `{get what="data"}`: most ranges in one request.
    pub get_ranges: usize,
    /// `{get what="data"}`: most seqs all ranges of one request may span.
    pub get_range_seqs: i64,
    /// Groups up to this many members get a push task per offline member;
    /// in bigger groups only mentioned users are pushed, and an owner's or
    /// admin's `@all` pushes at most this many offline members.
    pub push_group_members: usize,
    /// Hot messages kept per topic (the newest).
    pub hot_per_topic: i64,
    /// History-clear rows kept per user and topic; beyond it the oldest
    /// ranges are merged into one.
    pub dellog_per_user: usize,
    /// Widest moderation or recall delete (seqs) in one request.
    pub delete_width: i64,
    /// Concurrent log scans of first sends to topics without a seq mark
    /// (only on a tenant upgraded with data, for topics from before marks).
    pub reseed_scans: usize,
    /// Lookups of group names Redis holds no model of (a made-up name, or
    /// a group not restored yet after Redis forgot), per user: each asks
    /// MySQL once; a name found to be no group is then answered from Redis
    /// for every gateway for a while without counting.
    pub unknown_names: BucketConfig,
    /// Sends one gateway process holds at once (admitted, not yet acked or
    /// refused). Beyond it a send is refused at once, before any seq is
    /// allocated: `{ctrl 503}` / HTTP 503 with `retry_after_ms` and
    /// `Retry-After`, so a saturated system answers fast instead of
    /// queueing acks for seconds. 0: no bound.
    pub sends_in_flight: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            sends: BucketConfig::new(30, 600),
            receipts: BucketConfig::new(60, 1200),
            clears: BucketConfig::new(10, 60),
            searches: BucketConfig::new(10, 60),
            finds: BucketConfig::new(20, 120),
            group_creates: BucketConfig::new(5, 30),
            member_adds: BucketConfig::new(1_000, 1_000),
            members_per_request: 500,
            friend_requests: BucketConfig::new(10, 60),
            reports: BucketConfig::new(10, 60),
            password_changes: BucketConfig::new(5, 5),
            uploads: BucketConfig::new(20, 120),
            changes: BucketConfig::new(60, 300),
            favorites_per_user: 5_000,
            login_failures: 5,
            login_address_failures: 20,
            exempt_loopback: true,
            admin_failures: 5,
            login_lockout_ms: 1_000,
            login_lockout_max_ms: 300_000,
            connections_per_ip: 256,
            sessions_per_user: 16,
            login_deadline_secs: 10,
            idle_timeout_secs: 90,
            header_timeout_secs: 10,
            request_timeout_secs: 30,
            max_body_bytes: 1024 * 1024,
            get_ranges: 20,
            get_range_seqs: 2_000,
            push_group_members: 500,
            hot_per_topic: 200,
            dellog_per_user: 256,
            delete_width: 1_000,
            reseed_scans: 4,
            unknown_names: BucketConfig::new(60, 600),
            sends_in_flight: 4_096,
        }
    }
}
