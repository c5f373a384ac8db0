//! The insiders' generators (issue 39): ordinary accounts and operators
//! acting within their rights, beside the table's attackers.
//!
//! - **A Redis restart in the middle of the run** ([`Run::restart_redis`]):
//!   the stack's Redis killed and started again, and the tenants' keys
//!   deleted (what a restart without its append-only file loses); the
//!   attacks after it must be refused as before and the victims' data
//!   read the same.
//! - **Oracles** ([`Run::oracles_and_cost`]): for every entry naming a
//!   conversation or a message, a stranger's answer for the victims' pair
//!   must equal its answer for a pair that never spoke, and for a message
//!   that exists its answer for one that does not (code and body, with the
//!   names and seqs written alike). Groups' own existence is not secret
//!   (docs/security.md): a group's message routes are compared within it.
//! - **Cost**: each refused request of that stranger, repeated, does
//!   bounded work: Redis commands (`INFO` `total_commands_processed`),
//!   MySQL statements (`Questions` of every server) and Kafka clients made
//!   (`imstream::kafka::clients_configured`), each less the background
//!   rate measured idle.
//! - **Shared keys** ([`Run::shared_keys`]): two users, each in their own
//!   group, and an operator use one `Idempotency-Key` / `command_id` for
//!   every keyed command: each acts, with its own event ids; the same
//!   user repeating it is a replay.
//! - **Field edges** ([`Run::field_edges`]): every table entry, done by a
//!   member on their own conversations (an operator on its own tenant),
//!   with one field of its body at a time replaced by an edge value
//!   (lengths at common column limits and one past, up to past the body
//!   limit; multi-byte and combining characters, invisible and
//!   direction-changing ones; i64 and u64 edges, floats; other types).
//!   Each answer must be a 4xx or a 2xx, never a server error or silence;
//!   every acknowledged message must be stored, and (checked at the end of
//!   the run) nothing may reach a dead-letter topic.
//! - **Time** ([`Run::same_millisecond`]): with every projection stopped,
//!   a removal, a block and an operator's disable, each followed in the
//!   same millisecond by the revoked user's requests (on a session
//!   already attached, and new ones): all refused, and nothing of them
//!   stored once the projections run again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::{self, WsSession};
use super::names::{self, Variant};
use super::rng::Rng;
use super::scene;
use super::table::{Ask, Names, Step};
use super::{Kind, Run, Violation};
use crate::common;

/// Times each refused request is repeated for its cost.
const COST_REPEATS: u64 = 5;
/// Most Redis commands one refused request may cost.
pub const REFUSED_REDIS_MAX: f64 = 16.0;
/// Most MySQL statements one refused request may cost.
pub const REFUSED_MYSQL_MAX: f64 = 4.0;
/// How long a WebSocket reply may take here (a gateway answers in
/// milliseconds; silence is the finding, not a slow machine).
const WS_REPLY: Duration = Duration::from_secs(5);
/// Edge values tried per field of a request.
const EDGES_PER_FIELD: usize = 4;

/// A count of the work the servers did.
#[derive(Clone, Copy, Default, Debug)]
struct Work {
    redis: f64,
    mysql: f64,
    kafka_clients: u64,
}

struct Meter {
    redis: imstream::redis_util::Redis,
    mysql: Vec<sqlx::MySqlPool>,
    /// Background commands per second (pipelines, heartbeats).
    idle: Work,
}

impl Meter {
    async fn new(config: &imstream::config::Config) -> Meter {
        let redis = imstream::redis_util::connect(&config.redis.url)
            .await
            .expect("redis");
        let mut urls: Vec<String> = vec![config.mysql.url.clone()];
        for t in &config.tenants {
            urls.push(t.mysql(&config.mysql).url);
        }
        urls.sort();
        urls.dedup();
        let mut mysql = Vec::new();
        for url in urls {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .expect("mysql");
            mysql.push(pool);
        }
        let mut meter = Meter {
            redis,
            mysql,
            idle: Work::default(),
        };
        let t0 = Instant::now();
        let a = meter.read().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let b = meter.read().await;
        let secs = t0.elapsed().as_secs_f64();
        meter.idle = Work {
            redis: (b.redis - a.redis - 1.0).max(0.0) / secs,
            mysql: (b.mysql - a.mysql - meter.mysql.len() as f64).max(0.0) / secs,
            kafka_clients: 0,
        };
        meter
    }

    async fn read(&mut self) -> Work {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut self.redis)
            .await
            .expect("INFO stats");
        let redis = info
            .lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .expect("total_commands_processed");
        let mut mysql = 0.0;
        for pool in &self.mysql {
            let (_, v): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                .fetch_one(pool)
                .await
                .expect("Questions");
            mysql += v.parse::<f64>().unwrap_or(0.0);
        }
        Work {
            redis,
            mysql,
            kafka_clients: imstream::kafka::clients_configured(),
        }
    }

    /// The work between `a` and `b` (`secs` apart) beyond the background
    /// and the meter's own reads.
    fn spent(&self, a: Work, b: Work, secs: f64) -> Work {
        Work {
            redis: (b.redis - a.redis - 1.0 - self.idle.redis * secs).max(0.0),
            mysql: (b.mysql - a.mysql - self.mysql.len() as f64 - self.idle.mysql * secs).max(0.0),
            kafka_clients: b.kafka_clients - a.kafka_clients,
        }
    }
}

/// One answer, written so that two targets' answers compare: no
/// timestamps or request ids, the names and seqs replaced.
fn comparable(code: i64, text: &str, names: &[&str], seqs: &[i64]) -> (i64, String) {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for k in ["ts", "id", "request_id"] {
                    m.remove(k);
                }
                for (_, x) in m.iter_mut() {
                    strip(x);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut v: Value = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
    strip(&mut v);
    let mut s = v.to_string();
    let mut names: Vec<&str> = names.to_vec();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        s = s.replace(n, "{name}");
    }
    for q in seqs {
        s = replace_number(&s, *q, "{seq}");
    }
    (code, s)
}

/// `s` with every decimal `n` that is a whole number (not part of a longer
/// one) replaced by `with`.
fn replace_number(s: &str, n: i64, with: &str) -> String {
    let needle = n.to_string();
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i..].starts_with(&needle) {
            let before = i == 0 || !bytes[i - 1].is_ascii_digit();
            let end = i + needle.len();
            let after = end >= s.len() || !bytes[end].is_ascii_digit();
            if before && after {
                out.push_str(with);
                i = end;
                continue;
            }
        }
        let c = s[i..].chars().next().expect("in bounds");
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// A step's answer: (code, text, trouble).
struct Answered {
    code: i64,
    text: String,
    trouble: Option<String>,
    judged: bool,
}

impl Run {
    fn stranger(&self) -> usize {
        self.attackers
            .iter()
            .position(|a| a.kind == Kind::Stranger)
            .expect("a stranger attacker")
    }

    fn note(&mut self, entry: &str, attacker: &str, target: &str, what: String) {
        self.tally.violations.push(Violation {
            entry: entry.into(),
            attacker: attacker.into(),
            target: target.into(),
            what,
        });
    }

    /// Runs `steps` as `bearer` (and `ws` for WebSocket steps) through
    /// entry `i`'s listener, with extra headers.
    async fn run_steps(
        &mut self,
        i: usize,
        bearer: &str,
        mut ws: Option<&mut WsSession>,
        steps: Vec<Step>,
    ) -> Vec<Answered> {
        let mut out = Vec::new();
        for step in steps {
            self.tally.requests += 1;
            match step {
                Step::Http {
                    method,
                    path,
                    body,
                    judged,
                } => {
                    let a = client::http(
                        &self.scene.http,
                        self.entry_addr[i],
                        method,
                        &path,
                        bearer,
                        body.as_ref(),
                    )
                    .await;
                    let trouble = (a.status == 0).then(|| a.body.clone());
                    out.push(Answered {
                        code: a.status as i64,
                        text: a.body,
                        trouble,
                        judged,
                    });
                }
                Step::Ws { msg, judged } => {
                    let ws = ws.as_deref_mut().expect("a WebSocket session");
                    let a = ws.request_within(msg, WS_REPLY).await;
                    out.push(Answered {
                        code: a.code().unwrap_or(0),
                        text: a.reply.clone().unwrap_or(Value::Null).to_string(),
                        trouble: a.trouble.clone(),
                        judged,
                    });
                }
                Step::WsNote(msg) => {
                    let ws = ws.as_deref_mut().expect("a WebSocket session");
                    let sent = ws.send_only(msg).await;
                    out.push(Answered {
                        code: 0,
                        text: String::new(),
                        trouble: sent.err(),
                        judged: false,
                    });
                }
            }
        }
        out
    }

    // ------------------------------------------------------ Redis restart --

    /// Kills the stack's Redis, starts it again and deletes both tenants'
    /// keys: every write model, seq, claim, bucket and hot copy is gone.
    pub(crate) async fn restart_redis(&mut self) {
        let started = Instant::now();
        let url = common::redis_url();
        assert!(
            !url.starts_with("redis+cluster"),
            "the adversarial suite restarts the stack's own Redis ({url})"
        );
        // Not while the binary's other tests use it.
        let _alone = crate::REDIS_IN_USE.write().await;
        // A conversation with history before the restart, to time after it.
        let (x, y) = (
            self.scene.fresh_uid(&mut self.rng, 9000, 9500),
            self.scene.fresh_uid(&mut self.rng, 9000, 9500),
        );
        let before = self
            .scene
            .call(
                x,
                "POST",
                &format!("/v1/users/{y}/messages"),
                Some(json!({"content": {"txt": "before the restart"}, "client_msg_id": "before"})),
            )
            .await;
        assert_eq!(before.status, 202, "{}", before.body);
        // What a restart without its append-only file loses, deleted first
        // (the file records the deletes; whatever is written from here on
        // comes back as a restart would bring it back).
        let mut redis = self.scene.stack.redis().await;
        let mut forgotten = 0;
        for tenant in [self.scene.tenant.clone(), self.scene.tenant_b.clone()] {
            for pattern in [format!("im:{{{tenant}:*"), format!("im:{{{tenant}}}*")] {
                let keys = imstream::redis_util::scan_keys(&mut redis, &pattern)
                    .await
                    .expect("scan");
                for chunk in keys.chunks(500) {
                    let n: usize = redis::cmd("DEL")
                        .arg(chunk)
                        .query_async(&mut redis)
                        .await
                        .expect("DEL");
                    forgotten += n;
                }
            }
        }
        drop(redis);
        let (killed, restarted) = tokio::task::spawn_blocking(|| {
            common::services::assert_same_instance();
            let killed = common::services::stack("kill", "redis");
            // Started again whatever the kill did, for the tests after.
            let restarted = common::services::stack("start", "redis");
            (killed, restarted)
        })
        .await
        .expect("restart task");
        assert!(
            killed && restarted,
            "stack kill redis: {killed}, stack start redis: {restarted}"
        );
        eprintln!(
            "adversary: {forgotten} keys of the two tenants deleted, Redis killed and started again, in {:.1?}",
            started.elapsed()
        );
        // Every session of the victims and attackers lost nothing it may
        // keep; the victims' data must read the same (the next entry's
        // check) and the attacks after this must be refused as before.
        self.settle_or_note("after the Redis restart").await;
        // The attacks go on once a conversation with history sends again
        // (503 with `retry` until the write side is restored;
        // docs/guarantees.md): measured, at most 30 s.
        let probe = Instant::now();
        loop {
            let a = self
                .scene
                .call(
                    x,
                    "POST",
                    &format!("/v1/users/{y}/messages"),
                    Some(
                        json!({"content": {"txt": "after the restart"}, "client_msg_id": "after"}),
                    ),
                )
                .await;
            if a.status == 202 {
                break;
            }
            assert!(
                a.status == 503 && probe.elapsed() < Duration::from_secs(30),
                "a conversation after the Redis restart: {} {} after {:.1?}",
                a.status,
                a.body,
                probe.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "adversary: a conversation with history sends again {:.1?} after the restart",
            probe.elapsed()
        );
        self.tally.redis_restart = Some(started.elapsed());
    }

    // ------------------------------------------------- oracles and cost --

    /// For every entry naming a conversation or a message, the stranger's
    /// answers for what exists and for what does not; and the cost of each
    /// refused request.
    pub(crate) async fn oracles_and_cost(&mut self) {
        let started = Instant::now();
        let s = self.stranger();
        let stranger_label = self.attackers[s].label.clone();
        let bearer = self.attackers[s].bearer.clone();
        let x = self.scene.fresh_uid(&mut self.rng, 5000, 6000);
        let y = self.scene.fresh_uid(&mut self.rng, 5000, 6000);
        let never = names::p2p_topic(x, y);
        let pq = self.scene.pq.clone();
        let group = self.scene.group.clone();
        let pq_seq = *self.rng.pick(&self.scene.pq_seqs);
        let g_seq = *self.rng.pick(&self.scene.group_seqs);
        let g_missing = self.scene.group_seqs.iter().max().copied().unwrap_or(0) + 1000;
        let mut meter = Meter::new(self.scene.stack.config()).await;
        eprintln!(
            "adversary: oracles: {pq} against {never} (a pair that never spoke), {group}/{g_seq} against {group}/{g_missing}; idle background: {:.1} Redis commands/s, {:.1} MySQL statements/s",
            meter.idle.redis, meter.idle.mysql
        );
        let mut costs: Vec<(String, Work)> = Vec::new();
        let mut compared = 0;
        for i in 0..self.table.len() {
            let entry = self.table[i];
            if entry.admin || !matches!(entry.names, Names::Topic | Names::Message) {
                continue;
            }
            let pairs: Vec<((String, i64), (String, i64))> = match entry.names {
                Names::Topic => vec![((pq.clone(), pq_seq), (never.clone(), pq_seq))],
                _ => vec![
                    ((pq.clone(), pq_seq), (never.clone(), pq_seq)),
                    ((group.clone(), g_seq), (group.clone(), g_missing)),
                ],
            };
            for (real, missing) in pairs {
                self.n += 1;
                let n = self.n;
                let pick = self.rng.next_u64();
                let other = self.scene.member;
                let make = |run: &Run, (name, seq): &(String, i64)| -> Vec<Step> {
                    let variant = Variant::raw("exact", name.clone());
                    let ask = Ask {
                        name: &variant,
                        seq: *seq,
                        me: run.attackers[s].uid,
                        tenant_param: run.scene.tenant.clone(),
                        other_uid: other,
                        victim_cmid: format!("oracle-{n}"),
                        n,
                        pick,
                        run: &run.scene.run,
                    };
                    (entry.build)(&ask)
                };
                let real_steps = make(self, &real);
                let missing_steps = make(self, &missing);
                let mut ws = self.attackers[s].ws.take();
                let a = self
                    .run_steps(i, &bearer, ws.as_mut(), real_steps.clone())
                    .await;
                let b = self.run_steps(i, &bearer, ws.as_mut(), missing_steps).await;
                let label = entry.label();
                let target = format!("{}/{} against {}/{}", real.0, real.1, missing.0, missing.1);
                let names = [real.0.as_str(), missing.0.as_str()];
                let seqs = [real.1, missing.1];
                for (ra, mb) in a.iter().zip(&b).filter(|(r, _)| r.judged) {
                    compared += 1;
                    let ca = comparable(ra.code, &ra.text, &names, &seqs);
                    let cb = comparable(mb.code, &mb.text, &names, &seqs);
                    if ca != cb {
                        self.note(
                            &label,
                            &stranger_label,
                            &target,
                            format!(
                                "tells what exists: {} {} for the real one, {} {} for the missing one",
                                ra.code,
                                clip(&ra.text),
                                mb.code,
                                clip(&mb.text)
                            ),
                        );
                    }
                    if (500..600).contains(&ra.code) || ra.trouble.is_some() {
                        self.note(
                            &label,
                            &stranger_label,
                            &target,
                            format!("server error or no answer: {} {:?}", ra.code, ra.trouble),
                        );
                    }
                }
                // The cost of the refused request, repeated.
                let refused = a
                    .iter()
                    .filter(|r| r.judged)
                    .all(|r| (400..500).contains(&r.code));
                let has_note = real_steps.iter().any(|st| matches!(st, Step::WsNote(_)));
                if refused && !a.is_empty() && !has_note {
                    // The least of three windows: background work only
                    // ever adds to a window.
                    let judged = real_steps
                        .iter()
                        .filter(|st| {
                            matches!(
                                st,
                                Step::Http { judged: true, .. } | Step::Ws { judged: true, .. }
                            )
                        })
                        .count()
                        .max(1);
                    let requests = (judged as u64 * COST_REPEATS) as f64;
                    let mut per: Option<Work> = None;
                    for _ in 0..3 {
                        let w0 = meter.read().await;
                        let t0 = Instant::now();
                        for _ in 0..COST_REPEATS {
                            self.run_steps(i, &bearer, ws.as_mut(), real_steps.clone())
                                .await;
                        }
                        let secs = t0.elapsed().as_secs_f64();
                        let w1 = meter.read().await;
                        let spent = meter.spent(w0, w1, secs);
                        let this = Work {
                            redis: spent.redis / requests,
                            mysql: spent.mysql / requests,
                            kafka_clients: spent.kafka_clients,
                        };
                        per = Some(match per {
                            None => this,
                            Some(p) => Work {
                                redis: p.redis.min(this.redis),
                                mysql: p.mysql.min(this.mysql),
                                kafka_clients: p.kafka_clients.min(this.kafka_clients),
                            },
                        });
                    }
                    let per = per.expect("three windows");
                    let what = format!("{label} on {}", real.0);
                    if per.redis > REFUSED_REDIS_MAX
                        || per.mysql > REFUSED_MYSQL_MAX
                        || per.kafka_clients > 0
                    {
                        self.note(
                            &label,
                            &stranger_label,
                            &real.0,
                            format!(
                                "a refused request costs {:.1} Redis commands, {:.1} MySQL statements and {} new Kafka clients (at most {REFUSED_REDIS_MAX}, {REFUSED_MYSQL_MAX}, 0)",
                                per.redis, per.mysql, per.kafka_clients
                            ),
                        );
                    }
                    costs.push((what, per));
                }
                self.attackers[s].ws = ws;
            }
        }
        costs.sort_by(|a, b| b.1.redis.total_cmp(&a.1.redis));
        let n = costs.len().max(1) as f64;
        eprintln!(
            "adversary: oracles: {compared} answers compared; cost of {} refused requests (the least of 3 windows of {COST_REPEATS}): mean {:.2} Redis commands, {:.2} MySQL statements, {} Kafka clients made; in {:.1?}",
            costs.len(),
            costs.iter().map(|c| c.1.redis).sum::<f64>() / n,
            costs.iter().map(|c| c.1.mysql).sum::<f64>() / n,
            costs.iter().map(|c| c.1.kafka_clients).sum::<u64>(),
            started.elapsed()
        );
        for (what, w) in costs.iter().take(8) {
            eprintln!(
                "adversary:   {:>5.1} Redis, {:>4.1} MySQL, {} Kafka  {what}",
                w.redis, w.mysql, w.kafka_clients
            );
        }
        self.tally.refused_costs = costs.len();
    }

    // --------------------------------------------------------- shared keys --

    /// Two users, each in their own group, and an operator, all with one
    /// key per command kind.
    pub(crate) async fn shared_keys(&mut self) {
        let started = Instant::now();
        let run = self.scene.run.clone();
        let mut users = Vec::new();
        for _ in 0..2 {
            let owner = self.scene.fresh_uid(&mut self.rng, 6000, 7000);
            let member = self.scene.fresh_uid(&mut self.rng, 6000, 7000);
            let extra = self.scene.fresh_uid(&mut self.rng, 6000, 7000);
            let group = format!("grpKey{}", self.rng.alnum(8));
            self.scene
                .ok(
                    owner,
                    "POST",
                    "/v1/groups",
                    Some(json!({"topic": group, "name": "keys", "members": [member]})),
                )
                .await;
            let mut seqs = Vec::new();
            for k in 0..3 {
                let sent = self
                    .scene
                    .ok(
                        owner,
                        "POST",
                        &format!("/v1/groups/{group}/messages"),
                        Some(json!({"content": {"txt": format!("key {k}")}, "client_msg_id": format!("key-{k}")})),
                    )
                    .await;
                seqs.push(sent["seq"].as_i64().expect("seq"));
            }
            users.push((owner, member, extra, group, seqs));
        }
        self.settle_or_note("shared keys: setup").await;
        type Build = fn(&str, i64, i64, &[i64], &str) -> (&'static str, String, Option<Value>);
        // (kind, build (group, member, extra, seqs, fresh name)).
        let kinds: Vec<(&str, Build)> = vec![
            ("create", |_, _, _, _, fresh| {
                (
                    "POST",
                    "/v1/groups".into(),
                    Some(json!({"topic": fresh, "name": "k", "members": []})),
                )
            }),
            ("add", |g, _, x, _, _| {
                (
                    "POST",
                    format!("/v1/groups/{g}/members"),
                    Some(json!({"uid": x})),
                )
            }),
            ("mute member", |g, m, _, _, _| {
                (
                    "PUT",
                    format!("/v1/groups/{g}/members/{m}/mute"),
                    Some(json!({"until": "2099-01-01T00:00:00Z"})),
                )
            }),
            ("role", |g, m, _, _, _| {
                (
                    "PUT",
                    format!("/v1/groups/{g}/members/{m}/role"),
                    Some(json!({"role": "admin"})),
                )
            }),
            ("mute all", |g, _, _, _, _| {
                (
                    "PUT",
                    format!("/v1/groups/{g}/mute"),
                    Some(json!({"mute_all": true})),
                )
            }),
            ("profile", |g, _, _, _, _| {
                (
                    "PUT",
                    format!("/v1/groups/{g}/profile"),
                    Some(json!({"fn": "renamed"})),
                )
            }),
            ("edit", |g, _, _, s, _| {
                (
                    "PATCH",
                    format!("/v1/groups/{g}/messages/{}", s[0]),
                    Some(json!({"content": {"txt": "edited"}})),
                )
            }),
            ("recall", |g, _, _, s, _| {
                ("DELETE", format!("/v1/groups/{g}/messages/{}", s[1]), None)
            }),
            ("kick", |g, _, x, _, _| {
                ("DELETE", format!("/v1/groups/{g}/members/{x}"), None)
            }),
            ("owner", |g, m, _, _, _| {
                (
                    "PUT",
                    format!("/v1/groups/{g}/owner"),
                    Some(json!({"uid": m})),
                )
            }),
        ];
        let mut acted = 0;
        for (kind, build) in kinds {
            let key = format!("shared-{run}-{}", kind.replace(' ', "-"));
            let mut events: Vec<Vec<String>> = Vec::new();
            let mut first: Option<(i64, String, Option<Value>)> = None;
            for (owner, member, extra, group, seqs) in users.clone() {
                let fresh = format!("grpKeyNew{}", self.rng.alnum(8));
                let (method, path, body) = build(&group, member, extra, &seqs, &fresh);
                let a = client::http_with(
                    &self.scene.http,
                    self.scene.addr,
                    method,
                    &path,
                    &self.scene.token(owner),
                    body.as_ref(),
                    &[("Idempotency-Key", &key)],
                )
                .await;
                self.tally.requests += 1;
                let v: Value = serde_json::from_str(&a.body).unwrap_or(Value::Null);
                let label = format!("{method} {path} with Idempotency-Key {key}");
                if !(200..300).contains(&a.status) || v["replayed"] == json!(true) {
                    self.note(
                        "shared keys",
                        &format!("usr{owner}"),
                        &label,
                        format!("did not act: {} {}", a.status, clip(&a.body)),
                    );
                    continue;
                }
                acted += 1;
                let ids: Vec<String> = v["events"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|e| e.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                // Edits are messages (their seq) and recalls answer their
                // delete id; every other command names its events.
                if ids.is_empty() && !matches!(kind, "edit" | "recall") {
                    self.note(
                        "shared keys",
                        &format!("usr{owner}"),
                        &label,
                        format!("no event ids: {}", clip(&a.body)),
                    );
                }
                events.push(ids);
                if first.is_none() {
                    first = Some((owner, path.clone(), body.clone()));
                    // The same user, the same request, the same key: a replay
                    // of the first answer (the key is honoured at all).
                    let again = client::http_with(
                        &self.scene.http,
                        self.scene.addr,
                        method,
                        &path,
                        &self.scene.token(owner),
                        body.as_ref(),
                        &[("Idempotency-Key", &key)],
                    )
                    .await;
                    self.tally.requests += 1;
                    let w: Value = serde_json::from_str(&again.body).unwrap_or(Value::Null);
                    let same = match kind {
                        // The same message (its seq), told as a duplicate.
                        "edit" => w["seq"] == v["seq"] && w["duplicate"] == json!(true),
                        // The same event id again, which the projections
                        // apply once (a recall keeps no claim).
                        "recall" => w["action"] == v["action"],
                        _ => w["events"] == v["events"] && w["topic"] == v["topic"],
                    };
                    if !(200..300).contains(&again.status) || !same {
                        self.note(
                            "shared keys",
                            &format!("usr{owner}"),
                            &label,
                            format!(
                                "a retry with the same key is not the same command: {} {}",
                                again.status,
                                clip(&again.body)
                            ),
                        );
                    }
                }
            }
            if events.len() == 2 && events[0].iter().any(|e| events[1].contains(e)) {
                self.note(
                    "shared keys",
                    "two users",
                    kind,
                    format!("one key gave two users' commands the same event ids: {events:?}"),
                );
            }
        }
        // An operator's command with a user's key: acts on its own (the
        // commands pipeline carries it out).
        self.scene.stack.start_pipeline("commands").await;
        let (_, _, _, group, seqs) = users[1].clone();
        let key = format!("shared-{run}-recall");
        let admin = self
            .scene
            .addr_of("POST", "/v1/admin/commands")
            .unwrap_or(self.scene.addr);
        let a = client::http(
            &self.scene.http,
            admin,
            "POST",
            "/v1/admin/commands",
            &self.scene.stack.config().auth.admin_token,
            Some(&json!({"command_id": key, "tenant": self.scene.tenant, "kind": "message.moderate", "topic": group, "seq": seqs[2]})),
        )
        .await;
        self.tally.requests += 1;
        let v: Value = serde_json::from_str(&a.body).unwrap_or(Value::Null);
        if a.status != 202 || v["replayed"] == json!(true) {
            self.note(
                "shared keys",
                "operator",
                &format!("message.moderate {group}/{} with command_id {key}", seqs[2]),
                format!("did not act: {} {}", a.status, clip(&a.body)),
            );
        }
        self.settle_or_note("shared keys").await;
        // The moderation goes through the commands pipeline and then the
        // store: waited for on its own.
        let (owner1, _, _, group1, seqs1) = users[1].clone();
        let path = format!("/v1/groups/{group1}/messages/{}", seqs1[2]);
        let deadline = Instant::now() + scene::APPLIED;
        while Instant::now() < deadline {
            let m = self.scene.call(owner1, "GET", &path, None).await;
            let v: Value = serde_json::from_str(&m.body).unwrap_or(Value::Null);
            if v["status"] == json!("deleted") || m.status == 404 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.scene.stack.stop_pipeline("commands").await;
        // Each took effect where it acted (read as its owner).
        for (k, (owner, _, _, group, seqs)) in users.iter().enumerate() {
            let mut checks = vec![(seqs[0], "edited"), (seqs[1], "recalled")];
            if k == 1 {
                checks.push((seqs[2], "deleted"));
            }
            for (seq, want) in checks {
                let m = self
                    .scene
                    .call(
                        *owner,
                        "GET",
                        &format!("/v1/groups/{group}/messages/{seq}"),
                        None,
                    )
                    .await;
                let v: Value = serde_json::from_str(&m.body).unwrap_or(Value::Null);
                let ok = match want {
                    "edited" => {
                        v["content"]["txt"] == json!("edited") || m.body.contains("\"edited\"")
                    }
                    _ => v["status"] == json!(want) || m.status == 404,
                };
                if !ok {
                    self.note(
                        "shared keys",
                        &format!("usr{owner}"),
                        &format!("{group}/{seq}"),
                        format!(
                            "the {want} command with a shared key did not take effect: {} {}",
                            m.status,
                            clip(&m.body)
                        ),
                    );
                }
            }
        }
        eprintln!(
            "adversary: shared keys: {acted} commands of two users and one operator's with one key per kind, in {:.1?}",
            started.elapsed()
        );
        self.tally.shared_keys = acted;
    }

    // --------------------------------------------------------- field edges --

    /// Every entry as a member on their own conversations, one field at a
    /// time at its edges.
    pub(crate) async fn field_edges(&mut self) {
        let started = Instant::now();
        let a = self.scene.tenant.clone();
        let b = self.scene.tenant_b.clone();
        let e = self.scene.fresh_uid(&mut self.rng, 7000, 8000);
        let f = self.scene.fresh_uid(&mut self.rng, 7000, 8000);
        let group = format!("grpEdge{}", self.rng.alnum(8));
        self.scene
            .ok(
                e,
                "POST",
                "/v1/groups",
                Some(json!({"topic": group, "name": "edges", "members": [f]})),
            )
            .await;
        let mut g_seqs = Vec::new();
        for k in 0..3 {
            let sent = self
                .scene
                .ok(
                    e,
                    "POST",
                    &format!("/v1/groups/{group}/messages"),
                    Some(json!({"content": {"txt": format!("edge {k}")}, "client_msg_id": format!("edge-g{k}")})),
                )
                .await;
            g_seqs.push(sent["seq"].as_i64().expect("seq"));
        }
        let pair = names::p2p_topic(e, f);
        let mut p_seqs = Vec::new();
        for (k, (from, to)) in [(e, f), (f, e), (e, f)].into_iter().enumerate() {
            let sent = self
                .scene
                .ok(
                    from,
                    "POST",
                    &format!("/v1/users/{to}/messages"),
                    Some(json!({"content": {"txt": format!("edge p{k}")}, "client_msg_id": format!("edge-p{k}")})),
                )
                .await;
            p_seqs.push(sent["seq"].as_i64().expect("seq"));
        }
        self.settle_or_note("field edges: setup").await;
        let max_body = self.scene.stack.config().limits.max_body_bytes;
        let max_message = self.scene.stack.config().gateway.max_message_size;
        let e_bearer = self.scene.token_in(&a, e, "edges");
        let mut e_ws = WsSession::new(self.scene.addr, &e_bearer, &format!("edge{e}"));
        let op_bearer = self.scene.admin_b.clone();
        let b_user = self.scene.fresh_uid(&mut self.rng, 7000, 8000);
        let mut acked: Vec<(String, i64, String)> = Vec::new();
        let mut codes: BTreeMap<i64, u64> = BTreeMap::new();
        let mut tried = 0u64;
        let order: Vec<usize> = (0..self.table.len())
            .filter(|i| !self.table[*i].late)
            .chain((0..self.table.len()).filter(|i| self.table[*i].late))
            .collect();
        for i in order {
            let entry = self.table[i];
            if matches!(entry.names, Names::Login | Names::File | Names::StoredFile) {
                continue; // logins: the lockout; files: the path checks and the attackers
            }
            if let Some((m, p)) = entry.http {
                if self.scene.addr_of(m, p).is_none() {
                    continue; // not served by this gateway
                }
            }
            // What the member (or the operator) names: its own things.
            let targets: Vec<(String, i64)> = match entry.names {
                _ if entry.admin => match entry.names {
                    Names::User => vec![(b_user.to_string(), 0)],
                    Names::Report => vec![(self.scene.report_id.clone(), 0)],
                    _ => vec![(b.clone(), 0)],
                },
                Names::Topic if entry.ws.is_some() => {
                    vec![(group.clone(), g_seqs[0]), (format!("usr{f}"), p_seqs[0])]
                }
                Names::Topic => vec![(group.clone(), g_seqs[0]), (pair.clone(), p_seqs[0])],
                Names::Message => vec![(group.clone(), g_seqs[0]), (pair.clone(), p_seqs[0])],
                Names::User => vec![(f.to_string(), 0)],
                Names::Fnd => vec![(format!("usr{f}"), 0)],
                _ => vec![(String::new(), 0)],
            };
            let bearer = if entry.admin {
                op_bearer.clone()
            } else {
                e_bearer.clone()
            };
            let tenant_param = if entry.admin { b.clone() } else { a.clone() };
            let label = entry.label();
            let (entry_started, entry_tried) = (Instant::now(), tried);
            for (name, seq) in targets {
                self.n += 1;
                let variant = Variant::raw("exact", name.clone());
                let ask = Ask {
                    name: &variant,
                    seq,
                    me: e,
                    tenant_param: tenant_param.clone(),
                    other_uid: f,
                    victim_cmid: format!("edge-{}", self.n),
                    n: self.n,
                    pick: self.rng.next_u64(),
                    run: &self.scene.run,
                };
                let steps = (entry.build)(&ask);
                for (k, step) in steps.iter().enumerate() {
                    for (what, mutated) in mutations(&mut self.rng, step) {
                        // The steps before it as built, this one mutated.
                        let mutated_copy = mutated.clone();
                        let mut run: Vec<Step> = steps[..k].to_vec();
                        run.push(mutated);
                        let ws = if entry.ws.is_some()
                            || run.iter().any(|s| !matches!(s, Step::Http { .. }))
                        {
                            Some(&mut e_ws)
                        } else {
                            None
                        };
                        let t0 = Instant::now();
                        let answers = self.run_steps(i, &bearer, ws, run).await;
                        tried += 1;
                        let last = answers.last().expect("one step at least");
                        if std::env::var("ADVERSARY_TRACE").is_ok_and(|t| label.contains(&t)) {
                            eprintln!(
                                "trace: field edges: {label} | {name}: {what} | {} {} {:?} in {:.1?}",
                                last.code,
                                clip(&last.text),
                                last.trouble,
                                t0.elapsed()
                            );
                        }
                        *codes.entry(last.code).or_default() += 1;
                        let target = format!("{name}: {what}");
                        // A message past the gateway's limits may be
                        // refused by closing the connection (a WebSocket
                        // frame past max_message_size, a body past
                        // max_body_bytes); nothing smaller may.
                        let limit = match &mutated_copy {
                            Step::Http { .. } => max_body,
                            _ => max_message,
                        };
                        let big = step_size(&mutated_copy) > limit;
                        let closed = last.trouble.as_deref().is_some_and(|t| {
                            t.contains("closed")
                                || t.starts_with("request failed")
                                || t.starts_with("send: ")
                        });
                        // 501 says what is not done here: an answer.
                        if (500..600).contains(&last.code) && last.code != 501 {
                            self.note(
                                &label,
                                &format!("member usr{e}"),
                                &target,
                                format!("server error {} {}", last.code, clip(&last.text)),
                            );
                        } else if last.trouble.is_some()
                            && !(closed && big)
                            && matches!(step, Step::Http { .. } | Step::Ws { .. })
                        {
                            self.note(
                                &label,
                                &format!("member usr{e}"),
                                &target,
                                format!("no answer: {:?}", last.trouble),
                            );
                        }
                        // Acknowledged messages, to find stored below.
                        if (200..300).contains(&last.code) {
                            let v: Value = serde_json::from_str(&last.text).unwrap_or(Value::Null);
                            let seq = v["seq"].as_i64().or(v["ctrl"]["params"]["seq"].as_i64());
                            let topic = v["topic"].as_str().or(v["ctrl"]["topic"].as_str());
                            if let (Some(seq), Some(topic)) = (seq, topic) {
                                let topic = match topic.strip_prefix("usr") {
                                    Some(_) => pair.clone(),
                                    None => topic.to_string(),
                                };
                                acked.push((topic, seq, format!("{label}: {what}")));
                            }
                        }
                    }
                }
            }
            eprintln!(
                "adversary: field edges: {label}: {} requests in {:.1?}",
                tried - entry_tried,
                entry_started.elapsed()
            );
        }
        self.settle_or_note("field edges").await;
        // Every acknowledged message is stored (the store's own table).
        let pool = self.scene.stack.pool();
        let month = imstream::store::month::ShardMonth::of(chrono::Utc::now());
        let mut missing = 0;
        for (topic, seq, what) in &acked {
            let family = if topic.starts_with("p2p") {
                "p2p"
            } else {
                "group"
            };
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM im_{family}_messages_{month} WHERE topic = ? AND seqid = ?"
            ))
            .bind(topic)
            .bind(seq)
            .fetch_one(&pool)
            .await
            .expect("count stored messages");
            if n != 1 {
                missing += 1;
                self.note(
                    "field edges",
                    &format!("member usr{e}"),
                    &format!("{topic}/{seq}"),
                    format!("acknowledged ({what}) but stored {n} times"),
                );
            }
        }
        eprintln!(
            "adversary: field edges: {tried} requests as usr{e} on {group}, {pair} (and tenant-b's operator), codes {codes:?}, {} acknowledged messages ({missing} not stored once), in {:.1?}",
            acked.len(),
            started.elapsed()
        );
        self.tally.edges = tried;
    }

    // ------------------------------------------------------------- time --

    /// A removal, a block and a disable, each followed in the same
    /// millisecond by the revoked user's requests, with every projection
    /// stopped.
    pub(crate) async fn same_millisecond(&mut self) {
        let started = Instant::now();
        let run = self.scene.run.clone();
        let o = self.scene.fresh_uid(&mut self.rng, 8000, 9000);
        let m = self.scene.fresh_uid(&mut self.rng, 8000, 9000);
        let p = self.scene.fresh_uid(&mut self.rng, 8000, 9000);
        let q = self.scene.fresh_uid(&mut self.rng, 8000, 9000);
        let d = self.scene.fresh_uid(&mut self.rng, 8000, 9000);
        let group = format!("grpTime{}", self.rng.alnum(8));
        self.scene
            .ok(
                o,
                "POST",
                "/v1/groups",
                Some(json!({"topic": group, "name": "time", "members": [m]})),
            )
            .await;
        let mut m_seq = 0;
        for (uid, path, txt) in [
            (m, format!("/v1/groups/{group}/messages"), "m before"),
            (p, format!("/v1/users/{q}/messages"), "p before"),
            (q, format!("/v1/users/{p}/messages"), "q before"),
            (d, format!("/v1/users/{o}/messages"), "d before"),
        ] {
            let sent = self
                .scene
                .ok(
                    uid,
                    "POST",
                    &path,
                    Some(json!({"content": {"txt": txt}, "client_msg_id": format!("t-{txt}")})),
                )
                .await;
            if uid == m {
                m_seq = sent["seq"].as_i64().expect("seq");
            }
        }
        self.settle_or_note("same millisecond: setup").await;
        // The revoked users' sessions, attached before anything happens.
        let mut m_ws = WsSession::new(self.scene.addr, &self.scene.token(m), &format!("time{m}"));
        let mut p_ws = WsSession::new(self.scene.addr, &self.scene.token(p), &format!("time{p}"));
        let mut d_ws = WsSession::new(self.scene.addr, &self.scene.token(d), &format!("time{d}"));
        for (ws, topic) in [
            (&mut m_ws, group.clone()),
            (&mut p_ws, format!("usr{q}")),
            (&mut d_ws, format!("usr{o}")),
        ] {
            let a = ws
                .request(json!({"sub": {"topic": topic, "get": {"what": "desc"}}}))
                .await;
            assert_eq!(a.code(), Some(200), "attach to {topic}: {a:?}");
        }
        let stopped: Vec<String> = scene::PIPELINES.iter().map(|s| s.to_string()).collect();
        for name in &stopped {
            self.scene.stack.stop_pipeline(name).await;
        }
        let admin = self
            .scene
            .addr_of("POST", "/v1/admin/users/{uid}/disable")
            .unwrap_or(self.scene.addr);
        let admin_token = self.scene.stack.config().auth.admin_token.clone();
        let mut refused_texts: Vec<String> = Vec::new();
        let cases = ["removal", "block", "disable"];
        for case in self.rng.sample(&cases, cases.len()) {
            let (revoked, topic_http, topic_ws, ws) = match case {
                "removal" => (
                    m,
                    format!("/v1/groups/{group}/messages"),
                    group.clone(),
                    &mut m_ws,
                ),
                "block" => (
                    p,
                    format!("/v1/users/{q}/messages"),
                    format!("usr{q}"),
                    &mut p_ws,
                ),
                _ => (
                    d,
                    format!("/v1/users/{o}/messages"),
                    format!("usr{o}"),
                    &mut d_ws,
                ),
            };
            let revoke = match case {
                "removal" => {
                    client::http(
                        &self.scene.http,
                        self.scene.addr,
                        "DELETE",
                        &format!("/v1/groups/{group}/members/{m}"),
                        &self.scene.token(o),
                        None,
                    )
                    .await
                }
                "block" => {
                    client::http(
                        &self.scene.http,
                        self.scene.addr,
                        "POST",
                        "/v1/blocks",
                        &self.scene.token(q),
                        Some(&json!({"uid": p})),
                    )
                    .await
                }
                _ => {
                    client::http(
                        &self.scene.http,
                        admin,
                        "POST",
                        &format!("/v1/admin/users/{d}/disable?tenant={}", self.scene.tenant),
                        &admin_token,
                        None,
                    )
                    .await
                }
            };
            let acked_at = Instant::now();
            if !(200..300).contains(&revoke.status) {
                self.note(
                    "same millisecond",
                    &case.to_string(),
                    "-",
                    format!(
                        "the {case} itself answered {} {}",
                        revoke.status, revoke.body
                    ),
                );
                continue;
            }
            // The revoked user's requests, all in flight at once, the
            // instant the revocation is acknowledged.
            let t_ws = format!("after-{case}-ws-{run}");
            let t_http = format!("after-{case}-http-{run}");
            refused_texts.push(t_ws.clone());
            refused_texts.push(t_http.clone());
            let token = self.scene.token(revoked);
            let http = self.scene.http.clone();
            let addr = self.scene.addr;
            let send_body =
                json!({"content": {"txt": t_http}, "client_msg_id": format!("after-{case}")});
            let read_path = format!("{topic_http}?limit=10");
            let send_http =
                client::http(&http, addr, "POST", &topic_http, &token, Some(&send_body));
            let read_http = client::http(&http, addr, "GET", &read_path, &token, None);
            let pub_ws =
                ws.request(json!({"pub": {"topic": topic_ws, "noecho": true, "content": t_ws}}));
            let (s, r, w) = tokio::join!(send_http, read_http, pub_ws);
            let spread = acked_at.elapsed();
            // Refused: a 4xx, the session closed, or its login refused;
            // never accepted and never silence.
            let silent_http = s.status == 0;
            let silent_ws = w
                .trouble
                .as_deref()
                .is_some_and(|t| t.starts_with("no reply"));
            for (what, code, text, silent) in [
                ("HTTP send", s.status as i64, s.body.clone(), silent_http),
                (
                    "WebSocket {pub} on the attached session",
                    w.code().unwrap_or(0),
                    format!("{} {:?}", w.text(), w.trouble),
                    silent_ws,
                ),
            ] {
                if (200..300).contains(&code) || silent {
                    self.note(
                        "same millisecond",
                        &format!("usr{revoked}"),
                        &format!("{case}: {what}"),
                        format!(
                            "accepted right after the {case} ({spread:?}): {code} {}",
                            clip(&text)
                        ),
                    );
                }
            }
            let history_leaks = case != "block" && (200..300).contains(&r.status);
            if history_leaks {
                self.note(
                    "same millisecond",
                    &format!("usr{revoked}"),
                    &format!("{case}: history read"),
                    format!(
                        "served right after the {case}: {} {}",
                        r.status,
                        clip(&r.body)
                    ),
                );
            }
            if case == "removal" {
                let edit = client::http(
                    &http,
                    addr,
                    "PATCH",
                    &format!("/v1/groups/{group}/messages/{m_seq}"),
                    &token,
                    Some(&json!({"content": {"txt": format!("edited-after-{run}")}})),
                )
                .await;
                refused_texts.push(format!("edited-after-{run}"));
                if (200..300).contains(&edit.status) {
                    self.note(
                        "same millisecond",
                        &format!("usr{m}"),
                        "removal: edit",
                        format!(
                            "accepted right after the removal: {} {}",
                            edit.status,
                            clip(&edit.body)
                        ),
                    );
                }
            }
            self.tally.requests += 5;
        }
        for name in &stopped {
            self.scene.stack.start_pipeline(name).await;
        }
        self.settle_or_note("same millisecond: projections again")
            .await;
        // Nothing of the refused requests was stored anywhere.
        let pool = self.scene.stack.pool();
        let month = imstream::store::month::ShardMonth::of(chrono::Utc::now());
        for text in &refused_texts {
            let mut n = 0i64;
            for family in ["group", "p2p"] {
                n += sqlx::query_scalar::<_, i64>(&format!(
                    "SELECT COUNT(*) FROM im_{family}_messages_{month} WHERE content LIKE ?"
                ))
                .bind(format!("%{text}%"))
                .fetch_one(&pool)
                .await
                .expect("count refused texts");
            }
            if n != 0 {
                self.note(
                    "same millisecond",
                    "-",
                    text,
                    format!("a refused request's text was stored ({n} rows)"),
                );
            }
        }
        eprintln!(
            "adversary: same millisecond: removal, block and disable with every projection stopped, in {:.1?}",
            started.elapsed()
        );
    }
}

/// The edge variants of one step: one field at a time (and the whole body
/// past its limit), each with what was changed.
fn mutations(rng: &mut Rng, step: &Step) -> Vec<(String, Step)> {
    let mut out = Vec::new();
    let (root, skip): (Option<&Value>, &[&str]) = match step {
        Step::Http { body, .. } => (body.as_ref(), &[]),
        Step::Ws { msg, .. } | Step::WsNote(msg) => (Some(msg), &["id"]),
    };
    let Some(root) = root else {
        // No body: the query's numbers at their edges.
        if let Step::Http {
            method,
            path,
            judged,
            body: None,
        } = step
        {
            if let Some((base, query)) = path.split_once('?') {
                for pair in query.split('&') {
                    let Some((k, _)) = pair.split_once('=') else {
                        continue;
                    };
                    for v in [
                        "-1",
                        "0",
                        "9223372036854775807",
                        "9223372036854775808",
                        "-9223372036854775808",
                        "1e3",
                        "%00",
                        "",
                    ] {
                        let q = query.replace(pair, &format!("{k}={v}"));
                        out.push((
                            format!("query {k}={v}"),
                            Step::Http {
                                method,
                                path: format!("{base}?{q}"),
                                body: None,
                                judged: *judged,
                            },
                        ));
                    }
                }
            }
        }
        return out;
    };
    let mut leaves = Vec::new();
    collect_leaves(root, String::new(), skip, &mut leaves);
    for pointer in leaves {
        let current = root.pointer(&pointer).cloned().unwrap_or(Value::Null);
        for (what, value) in edge_values(rng, &current, EDGES_PER_FIELD) {
            let mut body = root.clone();
            if let Some(slot) = body.pointer_mut(&pointer) {
                *slot = value;
            }
            out.push((format!("{pointer} = {what}"), with_body(step, body)));
        }
    }
    if let Step::Http { .. } = step {
        // The whole body one past the limit, and of the wrong type.
        let mut big = root.clone();
        if let Some(o) = big.as_object_mut() {
            o.insert("pad".into(), json!("x".repeat(1024 * 1024 + 1)));
        }
        out.push((
            "the body one past the body limit".into(),
            with_body(step, big),
        ));
        out.push(("the body an array".into(), with_body(step, json!([root]))));
    }
    out
}

/// The bytes a step sends (its body or WebSocket message).
fn step_size(step: &Step) -> usize {
    match step {
        Step::Http { body, .. } => body.as_ref().map_or(0, |b| b.to_string().len()),
        Step::Ws { msg, .. } | Step::WsNote(msg) => msg.to_string().len(),
    }
}

fn with_body(step: &Step, body: Value) -> Step {
    match step {
        Step::Http {
            method,
            path,
            judged,
            ..
        } => Step::Http {
            method,
            path: path.clone(),
            body: Some(body),
            judged: *judged,
        },
        Step::Ws { judged, .. } => Step::Ws {
            msg: body,
            judged: *judged,
        },
        Step::WsNote(_) => Step::WsNote(body),
    }
}

/// JSON pointers of every leaf (and empty object or array) under `v`;
/// for a WebSocket message, the fields of its one verb.
fn collect_leaves(v: &Value, at: String, skip: &[&str], out: &mut Vec<String>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                if skip.contains(&k.as_str()) {
                    continue;
                }
                let key = k.replace('~', "~0").replace('/', "~1");
                collect_leaves(x, format!("{at}/{key}"), skip, out);
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (n, x) in a.iter().enumerate().take(2) {
                collect_leaves(x, format!("{at}/{n}"), skip, out);
            }
        }
        _ if at.is_empty() => {}
        _ => out.push(at),
    }
}

/// `n` edge values for a field now holding `current`, by a seeded choice
/// weighted to its type.
fn edge_values(rng: &mut Rng, current: &Value, n: usize) -> Vec<(String, Value)> {
    const LENGTHS: &[usize] = &[
        0, 1, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 512, 1024, 1025, 4096, 4097,
        16_384, 65_535, 65_536, 65_537, 262_145, 1_048_577,
    ];
    const UNITS: &[(&str, &str)] = &[
        ("a", "ASCII"),
        ("é", "2-byte é"),
        ("e\u{301}", "e + combining acute (NFD)"),
        ("𝕏", "4-byte 𝕏"),
        ("\u{200b}", "zero-width space"),
        ("\u{202e}", "right-to-left override"),
        ("ß", "ß (uppercases to SS)"),
        ("İ", "dotted İ (lowercases to 2 chars)"),
        ("Ｇ", "fullwidth Ｇ"),
        ("\u{0}", "NUL"),
    ];
    let numbers: Vec<(&str, Value)> = vec![
        ("i64::MIN", json!(i64::MIN)),
        ("i64::MIN+1", json!(i64::MIN + 1)),
        ("-1", json!(-1)),
        ("0", json!(0)),
        ("i32::MAX", json!(i32::MAX)),
        ("2^31", json!(2_147_483_648i64)),
        ("2^32", json!(4_294_967_296i64)),
        ("2^53+1", json!(9_007_199_254_740_993i64)),
        ("i64::MAX", json!(i64::MAX)),
        ("u64::MAX", json!(u64::MAX)),
        ("1.5", json!(1.5)),
        ("1e308", json!(1e308)),
        ("-0.0", json!(-0.0)),
    ];
    let types: Vec<(&str, Value)> = vec![
        ("null", Value::Null),
        ("true", json!(true)),
        ("[]", json!([])),
        ("{}", json!({})),
        ("\"1\"", json!("1")),
        ("[1]", json!([1])),
    ];
    let mut out = Vec::new();
    for _ in 0..n {
        let roll = rng.below(10);
        let string_first = current.is_string() || current.is_null();
        let kind = match (string_first, roll) {
            (true, 0..=6) | (false, 0..=2) => 0,
            (true, 7..=8) | (false, 3..=7) => 1,
            _ => 2,
        };
        match kind {
            0 => {
                let len = *rng.pick(LENGTHS);
                let (unit, about) = *rng.pick(UNITS);
                // `len` bytes where the unit allows, else `len` characters.
                let count = if len % unit.len() == 0 {
                    len / unit.len()
                } else {
                    len
                };
                let s = unit.repeat(count);
                out.push((format!("{} bytes of {about}", s.len()), json!(s)));
            }
            1 => {
                let (about, v) = rng.pick(&numbers).clone();
                out.push((about.to_string(), v));
            }
            _ => {
                let (about, v) = rng.pick(&types).clone();
                out.push((about.to_string(), v));
            }
        }
    }
    out
}

fn clip(s: &str) -> String {
    super::clip(s)
}
