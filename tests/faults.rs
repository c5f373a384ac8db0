//! The promise under faults, against the real services: a `202 {seq}` (or
//! `{ctrl 202 seq}`) means the message is stored exactly once at that seq in
//! its month table, appears once in history (hot and MySQL paths) and
//! reaches each online member once — while the broker, MariaDB, Redis, the
//! store pipeline or a gateway fail, and while bad content arrives among the
//! good.
//!
//! Each fault is one test on a fresh world (tenant, topics, groups). The
//! gateways and the group-events pipelines are real `imstream` child
//! processes so they can be killed: gateway A takes the senders' HTTP and
//! WebSocket sends, gateway B holds one online member recording every
//! `{data}` it receives, and `imstream project store|hot|fanout|members`
//! project the log (the other pipelines run in this process; nothing kills
//! them). Senders retry each `client_msg_id` on any 5xx, timeout or
//! connection error until it is accepted, as a real client does. After the
//! fault the suite waits (with a deadline, issuing no command) until the
//! projections have caught up, then checks the promise and prints
//!
//! ```text
//! fault=<name> acked=N stored=N duplicates=N mismatches=N missing_live=N dup_live=N dlq=N
//! ```
//!
//! One fault runs on three brokers of their own (`docker/local/stack
//! kafka-cluster`, replication factor 3, `min.insync.replicas` 2) and kills
//! the leader of the partition taking the sends. Three bring engines back
//! with less than they acknowledged (`faults/rollback.rs`): Redis restored
//! from an older AOF, a Redis Cluster replica promoted while it lagged (on a
//! cluster of its own, `docker/local/stack redis-ha`), and the tenant's
//! MariaDB replaced by its lagging replica (`docker/local/stack
//! mysql-failover`, reached through a forwarder that moves like a VIP).
//!
//! The faults kill and stop the services of `docker/local/stack` (`kill`,
//! `stop`, `start`), so they run one after another (a global lock), every
//! fault restores its service before it returns (also when it fails), and
//! the suite refuses to run unless the stack script and the test addresses
//! (IMSTREAM_REDIS_URL, IMSTREAM_MYSQL_URL, IMSTREAM_KAFKA_BROKERS) name the
//! same instance. Run it alone with `cargo test --test faults -- --nocapture`.

mod common;
mod realtime_support;
#[path = "faults/recovery.rs"]
mod recovery;
#[path = "faults/rollback.rs"]
mod rollback;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use imstream::kafka::topics::{TopicNames, PIPELINES_WITH_DLQ};
use imstream::keys::TopicKeys;
use imstream::store::month::ShardMonth;

use common::process::{free_addr, Proc};
use common::services::{assert_same_instance, stack, stack_cmd, stack_script};
use common::{wait_for, write_config_file, Stack};
use realtime_support::Client;

/// One fault at a time: they stop services every test here shares.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Messages per second over all senders.
const RATE: f64 = 200.0;
const HTTP_SENDERS: i64 = 6;
const WS_SENDERS: i64 = 2;
/// The online member on gateway B.
const MEMBER: i64 = 100;
/// A send still unanswered this long after the load stopped is given up.
const RETRY_GRACE: Duration = Duration::from_secs(60);
/// One request's bound (HTTP or a WebSocket round trip).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the projections get to catch up after the load stopped.
const CATCH_UP: Duration = Duration::from_secs(120);
/// A restarted gateway must serve within this.
const GATEWAY_RESTART: Duration = Duration::from_secs(10);
/// Pipelines run as child processes (so they can be killed).
const CHILD_PIPELINES: [&str; 4] = ["store", "hot", "fanout", "members"];

fn month() -> String {
    ShardMonth::of(chrono::Utc::now()).to_string()
}

// ------------------------------------------------------------- services --

/// A service this fault took down; started again on drop if the fault did
/// not (a failed assertion), because later tests share it.
struct ServiceDown {
    service: &'static str,
    down: bool,
}

impl ServiceDown {
    async fn take_down(action: &'static str, service: &'static str) -> ServiceDown {
        assert_same_instance();
        let guard = ServiceDown {
            service,
            down: true,
        };
        let ok = tokio::task::spawn_blocking(move || stack(action, service))
            .await
            .unwrap();
        assert!(ok, "docker/local/stack {action} {service}");
        guard
    }

    /// `kill -9`.
    async fn kill(service: &'static str) -> ServiceDown {
        ServiceDown::take_down("kill", service).await
    }

    /// A clean stop.
    async fn stop(service: &'static str) -> ServiceDown {
        ServiceDown::take_down("stop", service).await
    }

    /// Starts it again and waits until it answers.
    async fn start(&mut self) {
        let service = self.service;
        let ok = tokio::task::spawn_blocking(move || stack("start", service))
            .await
            .unwrap();
        assert!(ok, "docker/local/stack start {service}");
        self.down = false;
    }
}

impl Drop for ServiceDown {
    fn drop(&mut self) {
        if self.down {
            stack("start", self.service);
        }
    }
}

// --------------------------------------------------------------- system --

/// A world with its gateways and pipelines running as child processes.
struct System {
    name: String,
    stack: Stack,
    topic: String,
    gateway_a: Proc,
    addr_a: SocketAddr,
    addr_b: SocketAddr,
    /// Never killed: holds the member's session.
    _gateway_b: Proc,
    pipelines: HashMap<&'static str, Proc>,
    member: Client,
}

impl System {
    async fn start(name: &str) -> System {
        System::start_with(name, |_| ()).await
    }

    /// [`System::start`] with `tweak` applied to the configuration first.
    async fn start_with(name: &str, tweak: impl FnOnce(&mut imstream::config::Config)) -> System {
        assert_same_instance();
        let mut stack = Stack::prepared_with(None, tweak).await;
        stack.world.config.gateway.heartbeat_secs = 1;
        // Every acked message is checked in the hot set: no per-topic cap
        // (its own test: tests/security_limits.rs).
        stack.world.config.limits.hot_per_topic = 1_000_000;
        let id = stack.world.id.clone();
        let pipeline_config = stack.config_file(&format!("faults-{name}"));
        let mut pipelines = HashMap::new();
        for p in CHILD_PIPELINES {
            let proc_name = format!("faults-{name}-{id}-{p}");
            let args = ["project", p];
            let proc = Proc::spawn_logging(&proc_name, &pipeline_config, &args, "warn");
            pipelines.insert(p, proc);
        }
        for p in imstream::pipeline::PIPELINES {
            if !CHILD_PIPELINES.contains(p) {
                stack.start_pipeline(p).await;
            }
        }
        let gateway = |label: &str| {
            let mut config = stack.config().clone();
            config.node.id = format!("{label}-{id}");
            let file = write_config_file(&config, &format!("faults-{name}-{id}-{label}"));
            let addr = free_addr();
            let args = ["gateway", "--listen", &addr.to_string()];
            let proc_name = format!("faults-{name}-{id}-{label}");
            (Proc::spawn_logging(&proc_name, &file, &args, "warn"), addr)
        };
        let (mut gateway_a, addr_a) = gateway("gwA");
        let (mut gateway_b, addr_b) = gateway("gwB");
        for (gw, addr) in [(&mut gateway_a, addr_a), (&mut gateway_b, addr_b)] {
            let (_, exits) = gw.supervise_until_serving(addr).await;
            assert!(exits.is_empty(), "a fresh gateway exited: {exits:?}");
        }
        let topic = format!("grpFault{}", id);
        let mut members: Vec<i64> = (2..2 + HTTP_SENDERS + WS_SENDERS).collect();
        members.push(MEMBER);
        stack.create_group(&topic, 1, &members).await;
        let member = Client::open_sub(
            addr_b,
            &stack.token(MEMBER, "live"),
            &topic,
            &format!("member-{name}"),
        )
        .await;
        System {
            name: name.to_string(),
            stack,
            topic,
            gateway_a,
            addr_a,
            addr_b,
            _gateway_b: gateway_b,
            pipelines,
            member,
        }
    }

    /// Starts the senders (HTTP and WebSocket through gateway A) at `rate`
    /// messages per second, until [`Load::finish_after`].
    fn load(&self, rate: f64) -> Load {
        let shared = Arc::new(LoadState::default());
        let per_sender = rate / (HTTP_SENDERS + WS_SENDERS) as f64;
        let interval = Duration::from_secs_f64(1.0 / per_sender);
        let mut tasks = Vec::new();
        for k in 0..HTTP_SENDERS + WS_SENDERS {
            let uid = 2 + k;
            let ws = k >= HTTP_SENDERS;
            let token = self.stack.token(uid, if ws { "ws" } else { "http" });
            let (topic, addr, shared) = (self.topic.clone(), self.addr_a, shared.clone());
            let prefix = format!("{}-{}{uid}", self.name, if ws { "w" } else { "h" });
            tasks.push(tokio::spawn(async move {
                let mut sender = Sender::new(addr, token, topic, ws);
                let mut next = Instant::now();
                let mut i = 0u64;
                while !shared.stopped() {
                    tokio::time::sleep_until(next.into()).await;
                    // Behind schedule (a stall): carry on from now, no burst.
                    next = (next + interval).max(Instant::now());
                    let cmid = format!("{prefix}-{i}");
                    i += 1;
                    let content = json!({ "txt": cmid });
                    let answer = sender.send_until_answered(&cmid, &content, &shared).await;
                    shared.record(&cmid, answer);
                }
            }));
        }
        Load {
            shared,
            tasks,
            started: Instant::now(),
        }
    }

    async fn redis(&self) -> imstream::redis_util::Redis {
        self.stack.redis().await
    }

    /// Waits (no command issued) until the projections caught up, then
    /// checks the promise for everything acked.
    async fn verify(&self, outcome: &Outcome, expect: Expect) -> Report {
        let acked = &outcome.acked;
        let pool = self.stack.pool();
        let caught_up = self.wait_caught_up(acked, expect.hot_complete).await;
        let mut r = Report {
            fault: self.name.clone(),
            acked: acked.len(),
            ..Report::default()
        };
        if !caught_up.is_empty() {
            r.notes.push(format!("not caught up: {caught_up}"));
        }
        // Seqs acked to two client ids.
        let mut by_seq: HashMap<i64, Vec<&str>> = HashMap::new();
        for (cmid, seq) in acked {
            by_seq.entry(*seq).or_default().push(cmid);
        }
        let reused: Vec<_> = by_seq.iter().filter(|(_, c)| c.len() > 1).collect();
        r.add_dup("seq acked twice", reused.len(), &reused);

        // The month table.
        let rows = stored_rows(&pool, &self.topic).await;
        let mut stored: HashMap<&str, Vec<i64>> = HashMap::new();
        for (seq, cmid) in &rows {
            stored
                .entry(cmid.as_deref().unwrap_or(""))
                .or_default()
                .push(*seq);
        }
        let twice: Vec<_> = stored
            .iter()
            .filter(|(c, s)| !c.is_empty() && s.len() > 1)
            .collect();
        r.add_dup("client_msg_id stored twice", twice.len(), &twice);
        let seqs: BTreeSet<i64> = rows.iter().map(|(s, _)| *s).collect();
        r.add_dup("seq stored twice", rows.len() - seqs.len(), &"");
        let mut wrong = Vec::new();
        for (cmid, seq) in acked {
            match stored.get(cmid.as_str()).map(Vec::as_slice) {
                Some([s]) if s == seq => r.stored += 1,
                other => wrong.push(format!("{cmid}@{seq}: stored {other:?}")),
            }
        }
        r.add_mismatch("acked but not stored at its seq", &wrong);

        // History pages, newest first (hot where it covers the page), oldest
        // first (MySQL), and newest first again without the hot set (MySQL).
        let reader = self.stack.token(MEMBER, "reader");
        let pages = self.walk(&reader, false).await;
        r.check_pages("history newest-first", &pages, acked);
        let pages = self.walk(&reader, true).await;
        r.check_pages("history oldest-first (MySQL)", &pages, acked);
        r.check_hot(self.hot_set().await, acked, expect.hot_complete);
        let keys = TopicKeys::new(self.stack.tenant(), &self.topic);
        let mut redis = self.redis().await;
        let _: () = redis::cmd("DEL")
            .arg(keys.hot_seqs())
            .query_async(&mut redis)
            .await
            .expect("DEL hot set");
        let pages = self.walk(&reader, false).await;
        r.check_pages("history newest-first without hot (MySQL)", &pages, acked);

        // The member's live stream: each acked seq once, nothing twice.
        let live = live_messages(&self.member, &self.topic);
        if self.member.is_closed() {
            r.notes.push("the member's connection was closed".into());
        }
        let mut seen: HashMap<i64, usize> = HashMap::new();
        let mut at: HashMap<&str, BTreeSet<i64>> = HashMap::new();
        for (seq, cmid) in &live {
            *seen.entry(*seq).or_default() += 1;
            at.entry(cmid.as_str()).or_default().insert(*seq);
        }
        let dup_seq: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        let dup_cmid: Vec<_> = at.iter().filter(|(_, s)| s.len() > 1).collect();
        r.dup_live = dup_seq.len() + dup_cmid.len();
        if r.dup_live > 0 {
            r.notes.push(format!(
                "live: seqs delivered twice {:?}; one message under two seqs {:?}",
                sample(&dup_seq),
                sample(&dup_cmid)
            ));
        }
        let missing: Vec<_> = acked
            .iter()
            .filter(|(_, seq)| !seen.contains_key(seq))
            .collect();
        r.missing_live = missing.len();
        if !missing.is_empty() {
            r.notes.push(format!(
                "live: acked, never delivered {:?}",
                sample(&missing)
            ));
        }
        let live_wrong: Vec<_> = live
            .iter()
            .filter(|(seq, cmid)| acked.get(cmid).is_some_and(|a| a != seq))
            .collect();
        r.add_mismatch(
            "live: a message under another seq than its ack",
            &live_wrong,
        );

        // Dead letters of every pipeline.
        let dlq = self.dlq_counts().await;
        r.dlq = dlq.values().sum();
        if r.dlq > 0 {
            r.notes.push(format!("dead letters: {dlq:?}"));
        }
        r.notes.extend(outcome.notes());
        r
    }

    /// Until every acked message is in the month table, the member's stream
    /// and (when `hot`) the hot set; or until every pipeline of the group
    /// events has no lag and nothing changed for 10 s (nothing more will
    /// come), or the deadline. What was still missing, if anything.
    async fn wait_caught_up(&self, acked: &BTreeMap<String, i64>, hot: bool) -> String {
        let pool = self.stack.pool();
        let started = Instant::now();
        let mut last_change = Instant::now();
        let mut last = String::new();
        loop {
            let rows: BTreeSet<String> = stored_rows(&pool, &self.topic)
                .await
                .into_iter()
                .filter_map(|r| r.1)
                .collect();
            let live: BTreeSet<i64> = live_messages(&self.member, &self.topic)
                .into_iter()
                .map(|m| m.0)
                .collect();
            let hot_seqs: BTreeSet<i64> = if hot {
                self.hot_set().await.into_iter().map(|h| h.0).collect()
            } else {
                BTreeSet::new()
            };
            let not_stored = acked.keys().filter(|c| !rows.contains(*c)).count();
            let not_live = acked.values().filter(|s| !live.contains(s)).count();
            let not_hot = if hot {
                acked.values().filter(|s| !hot_seqs.contains(s)).count()
            } else {
                0
            };
            let lag = self.lag().await;
            let now = format!(
                "{not_stored} acked not stored, {not_live} not delivered live, \
                 {not_hot} not in the hot set; pipeline lag {lag:?}"
            );
            if not_stored + not_live + not_hot == 0 {
                return String::new();
            }
            if now != last {
                last = now.clone();
                last_change = Instant::now();
            }
            let idle = lag.values().all(|l| *l == 0);
            if idle && last_change.elapsed() > Duration::from_secs(10) {
                return format!(
                    "{now}; no lag and no change for 10 s ({:.0} s after the load)",
                    started.elapsed().as_secs_f64()
                );
            }
            if started.elapsed() > CATCH_UP {
                return format!("{now}; after {CATCH_UP:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Lag of each child pipeline's consumer group on the group events.
    async fn lag(&self) -> BTreeMap<&'static str, i64> {
        let config = self.stack.config().clone();
        tokio::task::spawn_blocking(move || {
            let topic = TopicNames::new(&config.kafka)
                .name(imstream::kafka::topics::TopicKind::GroupEvents);
            CHILD_PIPELINES
                .iter()
                .map(|p| {
                    let group = format!("{}.{p}", config.pipelines.group_prefix);
                    let lag = imstream::kafka::lag::backlog(&config.kafka, &topic, &group)
                        .map(|b| imstream::kafka::lag::total_lag(&b))
                        .unwrap_or(-1);
                    (*p, lag)
                })
                .collect()
        })
        .await
        .unwrap()
    }

    /// Records in each pipeline's DLQ (`<topic>.<pipeline>.dlq`; this
    /// world's topics are new, so every record is new).
    async fn dlq_counts(&self) -> BTreeMap<String, usize> {
        let config = self.stack.config().clone();
        tokio::task::spawn_blocking(move || {
            let names = TopicNames::new(&config.kafka);
            let mut out = BTreeMap::new();
            for (pipeline, kind) in PIPELINES_WITH_DLQ {
                let topic = names.dlq(*kind, pipeline);
                let marks = imstream::kafka::lag::watermarks(&config.kafka, "faults-dlq", &topic)
                    .unwrap_or_else(|e| panic!("watermarks of {topic}: {e}"));
                let n: i64 = marks.values().map(|(low, high)| high - low).sum();
                if n > 0 {
                    out.insert(topic, n as usize);
                }
            }
            out
        })
        .await
        .unwrap()
    }

    /// The hot set: (seq, client id from the snapshot's text) per entry.
    async fn hot_set(&self) -> Vec<(i64, Option<String>)> {
        let keys = TopicKeys::new(self.stack.tenant(), &self.topic);
        let mut redis = self.redis().await;
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.hot_seqs())
            .arg(0)
            .arg(-1)
            .query_async(&mut redis)
            .await
            .unwrap_or_default();
        let seqs: Vec<i64> = members
            .iter()
            .filter_map(|m| m.split_once(':').and_then(|(s, _)| s.parse().ok()))
            .collect();
        let mut out = Vec::with_capacity(seqs.len());
        for chunk in seqs.chunks(500) {
            let snapshots: Vec<Option<String>> = redis::cmd("MGET")
                .arg(chunk.iter().map(|s| keys.hot_msg(*s)).collect::<Vec<_>>())
                .query_async(&mut redis)
                .await
                .unwrap_or_default();
            for (seq, snap) in chunk.iter().zip(snapshots) {
                let cmid = snap
                    .and_then(|s| serde_json::from_str::<Value>(&s).ok())
                    .and_then(|v| v["content"].as_str().map(String::from))
                    .and_then(|c| serde_json::from_str::<Value>(&c).ok())
                    .and_then(|c| c["txt"].as_str().map(String::from));
                out.push((*seq, cmid));
            }
        }
        out
    }

    /// Every history page through gateway B: (seq, text) in page order.
    async fn walk(&self, token: &str, oldest_first: bool) -> Vec<(i64, Option<String>)> {
        let http = reqwest::Client::new();
        let mut out = Vec::new();
        let mut cursor: Option<i64> = if oldest_first { Some(0) } else { None };
        for _ in 0..10_000 {
            let mut url = format!(
                "http://{}/v1/groups/{}/messages?limit=100",
                self.addr_b, self.topic
            );
            match (oldest_first, cursor) {
                (true, Some(c)) => url.push_str(&format!("&since={c}")),
                (false, Some(c)) => url.push_str(&format!("&before={c}")),
                _ => {}
            }
            let resp = http
                .get(&url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap_or_else(|e| panic!("GET {url}: {e}"));
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            assert_eq!(status, 200, "GET {url}: {body}");
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            if messages.is_empty() {
                break;
            }
            for m in &messages {
                let seq = m["seq"].as_i64().expect("seq");
                out.push((seq, m["content"]["txt"].as_str().map(String::from)));
            }
            let next = body[if oldest_first {
                "next_since"
            } else {
                "next_before"
            }]
            .as_i64();
            if next.is_none() || next == cursor {
                break;
            }
            cursor = next;
        }
        out
    }
}

/// (seq, text) of every `{data}` of `topic` the member received, in order.
fn live_messages(member: &Client, topic: &str) -> Vec<(i64, String)> {
    member
        .frames()
        .iter()
        .filter(|f| f["data"]["topic"] == json!(topic))
        .filter_map(|f| {
            let seq = f["data"]["seq"].as_i64()?;
            let txt = f["data"]["content"]["txt"]
                .as_str()
                .unwrap_or("")
                .to_string();
            Some((seq, txt))
        })
        .collect()
}

async fn stored_rows(pool: &sqlx::MySqlPool, topic: &str) -> Vec<(i64, Option<String>)> {
    let sql = format!(
        "SELECT seqid, CAST(client_msg_id AS CHAR) FROM im_group_messages_{} WHERE topic = ? ORDER BY seqid",
        month()
    );
    // MariaDB may just have come back: retry briefly.
    for _ in 0..60 {
        match sqlx::query_as(&sql).bind(topic).fetch_all(pool).await {
            Ok(rows) => return rows,
            Err(e) => {
                eprintln!("[faults] reading the month table: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    panic!("the month table of {topic} could not be read for 60 s");
}

fn sample<T: std::fmt::Debug>(items: &[T]) -> String {
    let shown: Vec<String> = items.iter().take(5).map(|i| format!("{i:?}")).collect();
    if items.len() > 5 {
        format!("[{}, … {} in all]", shown.join(", "), items.len())
    } else {
        format!("[{}]", shown.join(", "))
    }
}

// --------------------------------------------------------------- report --

/// What must hold besides the common checks.
#[derive(Clone, Copy)]
struct Expect {
    /// Every acked message must be in the hot set (not after the tenant's
    /// Redis keys were flushed: the hot set went with them).
    hot_complete: bool,
}

impl Default for Expect {
    fn default() -> Self {
        Expect { hot_complete: true }
    }
}

#[derive(Default)]
struct Report {
    fault: String,
    acked: usize,
    stored: usize,
    duplicates: usize,
    mismatches: usize,
    missing_live: usize,
    dup_live: usize,
    dlq: usize,
    /// Extra `key=value` fields for the line (fault-specific counts).
    extra: Vec<(String, usize)>,
    /// Failures of fault-specific promises.
    failures: Vec<String>,
    notes: Vec<String>,
}

impl Report {
    fn add_dup<T: std::fmt::Debug>(&mut self, what: &str, n: usize, items: &T) {
        if n > 0 {
            self.duplicates += n;
            self.notes.push(format!("{what}: {n} {items:?}"));
        }
    }

    fn add_mismatch<T: std::fmt::Debug>(&mut self, what: &str, items: &[T]) {
        if !items.is_empty() {
            self.mismatches += items.len();
            self.notes.push(format!("{what}: {}", sample(items)));
        }
    }

    /// A history walk: no seq twice, no message under two seqs, each acked
    /// message present at its acked seq.
    fn check_pages(
        &mut self,
        what: &str,
        pages: &[(i64, Option<String>)],
        acked: &BTreeMap<String, i64>,
    ) {
        let mut seqs: HashMap<i64, usize> = HashMap::new();
        let mut at: HashMap<&str, BTreeSet<i64>> = HashMap::new();
        for (seq, txt) in pages {
            *seqs.entry(*seq).or_default() += 1;
            if let Some(t) = txt {
                at.entry(t.as_str()).or_default().insert(*seq);
            }
        }
        let dup_seq: Vec<_> = seqs.iter().filter(|(_, n)| **n > 1).collect();
        self.add_dup(
            &format!("{what}: seq on two pages"),
            dup_seq.len(),
            &sample(&dup_seq),
        );
        let dup_msg: Vec<_> = at.iter().filter(|(_, s)| s.len() > 1).collect();
        self.add_dup(
            &format!("{what}: one message under two seqs"),
            dup_msg.len(),
            &sample(&dup_msg),
        );
        let wrong: Vec<_> = acked
            .iter()
            .filter(|(cmid, seq)| at.get(cmid.as_str()).is_none_or(|s| !s.contains(seq)))
            .collect();
        self.add_mismatch(&format!("{what}: acked, not at its seq"), &wrong);
    }

    /// The hot set: one entry per seq, one seq per message, each at its
    /// acked seq; with `complete`, every acked message present.
    fn check_hot(
        &mut self,
        hot: Vec<(i64, Option<String>)>,
        acked: &BTreeMap<String, i64>,
        complete: bool,
    ) {
        self.check_pages("hot set", &hot, &BTreeMap::new());
        let wrong: Vec<_> = hot
            .iter()
            .filter(|(seq, cmid)| {
                cmid.as_ref()
                    .and_then(|c| acked.get(c))
                    .is_some_and(|a| a != seq)
            })
            .collect();
        self.add_mismatch("hot set: a message under another seq than its ack", &wrong);
        if complete {
            let seqs: BTreeSet<i64> = hot.iter().map(|h| h.0).collect();
            let missing: Vec<_> = acked.iter().filter(|(_, s)| !seqs.contains(s)).collect();
            self.add_mismatch("hot set: acked, missing", &missing);
        }
    }

    /// Prints the line and the notes, then fails the test if the promise
    /// broke.
    fn assert(self) {
        let extra: String = self
            .extra
            .iter()
            .map(|(k, v)| format!(" {k}={v}"))
            .collect();
        println!(
            "fault={} acked={} stored={} duplicates={} mismatches={} missing_live={} dup_live={} dlq={}{extra}",
            self.fault,
            self.acked,
            self.stored,
            self.duplicates,
            self.mismatches,
            self.missing_live,
            self.dup_live,
            self.dlq
        );
        for n in &self.notes {
            println!("  {n}");
        }
        for f in &self.failures {
            println!("  FAILED: {f}");
        }
        let broken = self.acked == 0
            || self.stored != self.acked
            || self.duplicates + self.mismatches + self.missing_live + self.dup_live + self.dlq > 0
            || !self.failures.is_empty();
        assert!(
            !broken,
            "fault={}: the promise broke (see above)",
            self.fault
        );
    }
}

// ----------------------------------------------------------------- load --

/// The answer a send finally got.
#[derive(Debug, Clone)]
enum Answer {
    Accepted(i64),
    /// A 4xx (or WebSocket ctrl 4xx): the status and body.
    Refused(u16, String),
    /// Still no answer when the run ended.
    GaveUp(String),
}

#[derive(Default)]
struct LoadState {
    acked: Mutex<BTreeMap<String, i64>>,
    refused: Mutex<Vec<(String, u16, String)>>,
    gave_up: Mutex<Vec<(String, String)>>,
    /// Attempts that failed and were retried.
    retries: AtomicUsize,
    stop: AtomicBool,
    /// When the load was told to stop: pending sends retry until
    /// [`RETRY_GRACE`] after it.
    stopped_at: Mutex<Option<Instant>>,
    /// When each ack arrived, to show how sending went through the fault.
    ack_times: Mutex<Vec<Instant>>,
}

impl LoadState {
    fn record(&self, cmid: &str, answer: (Answer, usize)) {
        self.retries.fetch_add(answer.1, Ordering::Relaxed);
        match answer.0 {
            Answer::Accepted(seq) => {
                self.acked.lock().unwrap().insert(cmid.to_string(), seq);
                self.ack_times.lock().unwrap().push(Instant::now());
            }
            Answer::Refused(code, body) => {
                self.refused
                    .lock()
                    .unwrap()
                    .push((cmid.to_string(), code, body))
            }
            Answer::GaveUp(why) => self.gave_up.lock().unwrap().push((cmid.to_string(), why)),
        }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Whether a pending send should stop retrying.
    fn give_up(&self) -> bool {
        self.stopped_at
            .lock()
            .unwrap()
            .is_some_and(|t| t.elapsed() > RETRY_GRACE)
    }
}

struct Load {
    shared: Arc<LoadState>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

impl Load {
    /// Messages acked so far.
    fn acked_now(&self) -> usize {
        self.shared.acked()
    }

    /// Waits until at least `n` more messages than now were acked.
    async fn wait_acked(&self, n: usize) {
        let target = self.shared.acked() + n;
        let shared = self.shared.clone();
        wait_for(&format!("{target} acks"), Duration::from_secs(60), || {
            let have = shared.acked();
            async move {
                if have >= target {
                    Ok(())
                } else {
                    Err(format!("{have} acked"))
                }
            }
        })
        .await;
    }

    /// Keeps sending for `more`, then stops the senders and waits for them
    /// (each one's pending send retries up to [`RETRY_GRACE`]).
    async fn finish_after(self, more: Duration) -> Outcome {
        tokio::time::sleep(more).await;
        *self.shared.stopped_at.lock().unwrap() = Some(Instant::now());
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("sender");
        }
        let mut per_5s = Vec::new();
        for t in self.shared.ack_times.lock().unwrap().iter() {
            let bucket = (t.duration_since(self.started).as_secs() / 5) as usize;
            if per_5s.len() <= bucket {
                per_5s.resize(bucket + 1, 0);
            }
            per_5s[bucket] += 1;
        }
        Outcome {
            per_5s,
            acked: self.shared.acked.lock().unwrap().clone(),
            refused: self.shared.refused.lock().unwrap().clone(),
            gave_up: self.shared.gave_up.lock().unwrap().clone(),
            retries: self.shared.retries.load(Ordering::Relaxed),
        }
    }
}

struct Outcome {
    /// Acks in each 5 s of the load.
    per_5s: Vec<usize>,
    acked: BTreeMap<String, i64>,
    refused: Vec<(String, u16, String)>,
    gave_up: Vec<(String, String)>,
    retries: usize,
}

impl Outcome {
    fn notes(&self) -> Vec<String> {
        let mut out = vec![format!(
            "retried attempts: {}; acks per 5 s: {:?}",
            self.retries, self.per_5s
        )];
        if !self.refused.is_empty() {
            out.push(format!("good sends refused: {}", sample(&self.refused)));
        }
        if !self.gave_up.is_empty() {
            out.push(format!("sends never answered: {}", sample(&self.gave_up)));
        }
        out
    }

    /// Good messages must be accepted eventually: a refusal or a send that
    /// never got an answer is a failure too.
    fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.refused.is_empty() {
            out.push(format!("{} good sends refused", self.refused.len()));
        }
        if !self.gave_up.is_empty() {
            out.push(format!("{} good sends never accepted", self.gave_up.len()));
        }
        out
    }
}

/// One client: HTTP, or one WebSocket connection (reconnected after any
/// failure), sending one message at a time.
struct Sender {
    addr: SocketAddr,
    token: String,
    topic: String,
    http: Option<reqwest::Client>,
    ws: Option<WsConn>,
}

impl Sender {
    fn new(addr: SocketAddr, token: String, topic: String, ws: bool) -> Sender {
        let http = (!ws).then(|| {
            reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .build()
                .unwrap()
        });
        Sender {
            addr,
            token,
            topic,
            http,
            ws: None,
        }
    }

    /// Sends `content` as `cmid` until an answer that is not "retry" (2xx
    /// or 4xx), or the load gives up; the answer and the number of retries.
    async fn send_until_answered(
        &mut self,
        cmid: &str,
        content: &Value,
        load: &LoadState,
    ) -> (Answer, usize) {
        let mut retries = 0;
        loop {
            let attempt = self.attempt(cmid, content).await;
            match attempt {
                Ok(answer) => return (answer, retries),
                Err(why) => {
                    if load.give_up() {
                        return (Answer::GaveUp(why), retries);
                    }
                    retries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// One attempt: an answer, or why to retry.
    async fn attempt(&mut self, cmid: &str, content: &Value) -> Result<Answer, String> {
        let (code, body) = match &self.http {
            Some(http) => {
                let body = json!({"content": content, "client_msg_id": cmid});
                http_post(
                    http,
                    self.addr,
                    &self.token,
                    &self.topic,
                    body.to_string().into_bytes(),
                )
                .await?
            }
            None => self.ws_publish(cmid, content).await?,
        };
        classify(code, body)
    }

    async fn ws_publish(&mut self, cmid: &str, content: &Value) -> Result<(u16, Value), String> {
        if self.ws.is_none() {
            self.ws = Some(WsConn::open(self.addr, &self.token, &self.topic).await?);
        }
        let conn = self.ws.as_mut().unwrap();
        let msg =
            json!({"pub": {"topic": self.topic, "content": content, "head": {"client_mid": cmid}}});
        match conn.request(msg).await {
            Ok(ctrl) => {
                let code = ctrl["code"].as_u64().unwrap_or(0) as u16;
                let seq = ctrl["params"]["seq"].clone();
                if code >= 500 || code == 0 {
                    Err(format!("ws ctrl {ctrl}"))
                } else {
                    Ok((code, json!({"seq": seq, "ctrl": ctrl})))
                }
            }
            Err(e) => {
                self.ws = None;
                Err(e)
            }
        }
    }
}

/// 202 → accepted; 4xx → refused; anything else → retry.
fn classify(code: u16, body: Value) -> Result<Answer, String> {
    match code {
        200..=299 => body["seq"]
            .as_i64()
            .map(Answer::Accepted)
            .ok_or_else(|| format!("{code} without a seq: {body}")),
        400..=499 => Ok(Answer::Refused(code, body.to_string())),
        _ => Err(format!("{code} {body}")),
    }
}

/// `POST /v1/groups/{topic}/messages` with a raw body; (status, JSON body)
/// or the transport error.
async fn http_post(
    http: &reqwest::Client,
    addr: SocketAddr,
    token: &str,
    topic: &str,
    body: Vec<u8>,
) -> Result<(u16, Value), String> {
    let resp = http
        .post(format!("http://{addr}/v1/groups/{topic}/messages"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                format!("http: no answer within {REQUEST_TIMEOUT:?}")
            } else if e.is_connect() {
                format!("http: cannot connect ({e})")
            } else {
                format!("http: {e}")
            }
        })?;
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    Ok((status, body))
}

type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A sender's WebSocket: hi, login and sub done; one request at a time.
struct WsConn {
    ws: WsStream,
    next_id: u64,
}

impl WsConn {
    async fn open(addr: SocketAddr, token: &str, topic: &str) -> Result<WsConn, String> {
        let url = format!("ws://{addr}/v0/channels?apikey=test");
        let (ws, _) = tokio::time::timeout(REQUEST_TIMEOUT, tokio_tungstenite::connect_async(&url))
            .await
            .map_err(|_| "ws connect timed out".to_string())?
            .map_err(|e| format!("ws connect: {e}"))?;
        let mut conn = WsConn { ws, next_id: 0 };
        for msg in [
            json!({"hi": {"ver": "0.25.3", "ua": "imstream-faults/1.0"}}),
            json!({"login": {"scheme": "token", "secret": token}}),
            json!({"sub": {"topic": topic}}),
        ] {
            let ctrl = conn.request(msg.clone()).await?;
            let code = ctrl["code"].as_u64().unwrap_or(0);
            if !(200..300).contains(&code) {
                return Err(format!("ws {msg}: {ctrl}"));
            }
        }
        Ok(conn)
    }

    /// Sends `msg` with a fresh id; its ctrl, or why not.
    async fn request(&mut self, mut msg: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = format!("f{}", self.next_id);
        if let Some(body) = msg
            .as_object_mut()
            .and_then(|o| o.values_mut().next())
            .and_then(Value::as_object_mut)
        {
            body.insert("id".into(), json!(id));
        }
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        tokio::time::timeout_at(
            deadline,
            self.ws.send(Message::Text(msg.to_string().into())),
        )
        .await
        .map_err(|_| "ws send timed out".to_string())?
        .map_err(|e| format!("ws send: {e}"))?;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .map_err(|_| "ws reply timed out".to_string())?;
            let text = match frame {
                Some(Ok(Message::Text(t))) => t.to_string(),
                Some(Ok(Message::Close(_))) | None => return Err("ws closed".into()),
                Some(Err(e)) => return Err(format!("ws: {e}")),
                Some(Ok(_)) => continue,
            };
            let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if v["ctrl"]["id"] == json!(id) {
                return Ok(v["ctrl"].clone());
            }
        }
    }
}

// ------------------------------------------------------------------ poison --

/// Bad content among the good: each must be refused (4xx) and never acked.
#[derive(Debug, Clone, Copy)]
enum Poison {
    /// `{"txt": …, "x": [[[…]]]}`, 40 levels in all.
    DeepJson,
    /// Deep JSON over the WebSocket.
    DeepJsonWs,
    /// Content over `gateway.max_message_size`.
    Oversize,
    /// A lone UTF-16 surrogate escape (`"\ud800"`).
    LoneSurrogate,
    /// A number no database takes (`1e400`).
    NumberOutOfRange,
    /// Bytes that are not UTF-8.
    InvalidUtf8,
}

const POISONS: [Poison; 6] = [
    Poison::DeepJson,
    Poison::DeepJsonWs,
    Poison::Oversize,
    Poison::LoneSurrogate,
    Poison::NumberOutOfRange,
    Poison::InvalidUtf8,
];

fn deep_json(cmid: &str, depth: usize) -> Value {
    // The content object is level 1, "x" adds depth - 1 arrays.
    let mut v = json!([]);
    for _ in 0..depth.saturating_sub(2) {
        v = json!([v]);
    }
    json!({"txt": cmid, "x": v})
}

impl Poison {
    /// The raw HTTP body for `cmid` (`None`: sent over the WebSocket).
    fn http_body(self, cmid: &str, max_size: usize) -> Option<Vec<u8>> {
        let body = match self {
            Poison::DeepJson => {
                json!({"content": deep_json(cmid, 40), "client_msg_id": cmid}).to_string()
            }
            Poison::DeepJsonWs => return None,
            Poison::Oversize => json!({
                "content": {"txt": cmid, "pad": "a".repeat(max_size + 1)},
                "client_msg_id": cmid
            })
            .to_string(),
            Poison::LoneSurrogate => {
                format!(
                    r#"{{"content":{{"txt":"{cmid}","bad":"\ud800"}},"client_msg_id":"{cmid}"}}"#
                )
            }
            Poison::NumberOutOfRange => {
                format!(r#"{{"content":{{"txt":"{cmid}","n":1e400}},"client_msg_id":"{cmid}"}}"#)
            }
            Poison::InvalidUtf8 => {
                let mut b = format!(r#"{{"content":{{"txt":"{cmid}","bad":""#).into_bytes();
                b.extend_from_slice(&[0xff, 0xfe, 0xc3]);
                b.extend_from_slice(format!(r#""}},"client_msg_id":"{cmid}"}}"#).as_bytes());
                return Some(b);
            }
        };
        Some(body.into_bytes())
    }

    /// Statuses that count as refused at the door.
    fn refusals(self) -> &'static [u16] {
        match self {
            Poison::Oversize => &[400, 413],
            _ => &[400],
        }
    }
}

// ----------------------------------------------------------- redis flush --

// ------------------------------------------------------------------ faults --

/// How long the load goes on after a fault's service is back.
const AFTER: Duration = Duration::from_secs(10);
/// Acks before a fault starts (a few seconds of steady sending).
const BEFORE: usize = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_kill_9_restarted_after_10s() {
    let _serial = SERIAL.lock().await;
    let sys = System::start("kafka-kill").await;
    let load = sys.load(RATE);
    load.wait_acked(BEFORE).await;
    {
        let mut kafka = ServiceDown::kill("kafka").await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        kafka.start().await;
    }
    // Long enough to see sending recover once the broker is back.
    let outcome = load.finish_after(2 * AFTER).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report.failures.extend(outcome.failures());
    report.assert();
}

/// A node of the three-broker cluster (`docker/local/stack kafka-cluster`)
/// this fault killed; started again on drop if the fault did not.
struct ClusterNodeDown {
    node: String,
    down: bool,
}

impl Drop for ClusterNodeDown {
    fn drop(&mut self) {
        if self.down {
            stack_cmd(&["kafka-cluster", "start", &self.node]);
        }
    }
}

/// The broker leading the partition of `topic` that holds the most records.
fn busiest_partition_leader(brokers: &str, topic: &str) -> (i32, i32) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "faults-metadata")
        .create()
        .expect("metadata client");
    let timeout = Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .expect("metadata");
    let partitions = metadata.topics()[0].partitions();
    let (partition, leader) = partitions
        .iter()
        .map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(topic, p.id(), timeout)
                .expect("watermarks");
            (high, p.id(), p.leader())
        })
        .max()
        .map(|(_, id, leader)| (id, leader))
        .expect("partitions");
    (partition, leader)
}

/// Three brokers, replication factor 3, `min.insync.replicas` 2: the
/// leader of the partition taking the sends is killed mid-load and comes
/// back 10 s later; another replica leads meanwhile and nothing
/// acknowledged is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_brokers_partition_leader_kill_9() {
    let _serial = SERIAL.lock().await;
    assert!(
        tokio::task::spawn_blocking(|| stack_cmd(&["kafka-cluster", "up"]))
            .await
            .unwrap(),
        "docker/local/stack kafka-cluster up"
    );
    let brokers = std::process::Command::new("bash")
        .arg(stack_script())
        .args(["kafka-cluster", "brokers"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .expect("cluster brokers");
    assert_eq!(brokers.split(',').count(), 3, "{brokers}");
    let cluster = brokers.clone();
    let sys = System::start_with("kafka-leader", move |c| {
        c.kafka.brokers = cluster;
        (c.kafka.replication_factor, c.kafka.min_insync_replicas) = (3, 2);
        c.kafka.single_broker = false;
    })
    .await;
    let load = sys.load(RATE);
    load.wait_acked(BEFORE).await;
    let events = TopicNames::new(&sys.stack.config().kafka)
        .name(imstream::kafka::topics::TopicKind::GroupEvents);
    let (partition, leader) = {
        let (b, t) = (brokers.clone(), events.clone());
        tokio::task::spawn_blocking(move || busiest_partition_leader(&b, &t))
            .await
            .unwrap()
    };
    eprintln!("[faults] killing broker {leader}, leader of {events}[{partition}]");
    {
        let node = leader.to_string();
        let mut down = ClusterNodeDown {
            node: node.clone(),
            down: true,
        };
        let n = node.clone();
        let killed = tokio::task::spawn_blocking(move || stack_cmd(&["kafka-cluster", "kill", &n]))
            .await
            .unwrap();
        assert!(killed, "kill broker {node}");
        tokio::time::sleep(Duration::from_secs(10)).await;
        let started =
            tokio::task::spawn_blocking(move || stack_cmd(&["kafka-cluster", "start", &node]))
                .await
                .unwrap();
        assert!(started, "start broker {}", down.node);
        down.down = false;
    }
    let outcome = load.finish_after(2 * AFTER).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report.failures.extend(outcome.failures());
    drop(sys);
    // A throwaway cluster: killed, not shut down broker by broker (a
    // controlled shutdown of the last two waits on each other).
    tokio::task::spawn_blocking(|| {
        for n in ["1", "2", "3"] {
            stack_cmd(&["kafka-cluster", "kill", n]);
        }
    })
    .await
    .unwrap();
    report.assert();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_stopped_60s_then_restarted() {
    let _serial = SERIAL.lock().await;
    let sys = System::start("mariadb-stop").await;
    let load = sys.load(RATE / 2.0);
    load.wait_acked(BEFORE / 2).await;
    {
        let mut mariadb = ServiceDown::stop("mariadb").await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        mariadb.start().await;
    }
    let outcome = load.finish_after(AFTER).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report.failures.extend(outcome.failures());
    report.assert();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_kill_9_restarted_with_aof() {
    let _serial = SERIAL.lock().await;
    let mut sys = System::start("redis-kill").await;
    // The chat list, whose hot copy lives in Redis.
    sys.stack.start_pipeline("conversations").await;
    let mut redis = sys.redis().await;
    for (key, want) in [("appendonly", "yes"), ("appendfsync", "everysec")] {
        let (_, got): (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg(key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(got, want, "Redis runs with {key} {want}");
    }
    let load = sys.load(RATE);
    load.wait_acked(BEFORE).await;
    wait_for("the member's chat list", Duration::from_secs(60), || {
        member_lists_topic(&sys)
    })
    .await;
    {
        let mut redis = ServiceDown::kill("redis").await;
        // Without Redis the list comes from MySQL.
        member_lists_topic(&sys)
            .await
            .expect("the chat list while Redis is down");
        tokio::time::sleep(Duration::from_secs(3)).await;
        redis.start().await;
    }
    let outcome = load.finish_after(AFTER).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report.failures.extend(outcome.failures());
    report.assert();
}

/// Ok when the member's `GET /v1/me/conversations` lists the test's topic.
async fn member_lists_topic(sys: &System) -> Result<(), String> {
    let resp = reqwest::Client::new()
        .get(format!("http://{}/v1/me/conversations", sys.addr_a))
        .bearer_auth(sys.stack.token(MEMBER, "list"))
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.map_err(|e| e.to_string())?;
    let listed = body["conversations"]
        .as_array()
        .is_some_and(|l| l.iter().any(|c| c["topic"] == serde_json::json!(sys.topic)));
    if status == 200 && listed {
        Ok(())
    } else {
        Err(format!("{status} {body}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenant_redis_keys_flushed() {
    let _serial = SERIAL.lock().await;
    let sys = System::start("redis-flush").await;
    let load = sys.load(RATE);
    load.wait_acked(BEFORE).await;
    let mut redis = sys.redis().await;
    let keys = common::tenant_keys(&mut redis, sys.stack.tenant(), &sys.topic).await;
    // At one instant, as a failover to an empty replica would.
    let deleted: usize = redis::cmd("DEL")
        .arg(keys.iter().collect::<Vec<_>>())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(deleted > 0, "the tenant had keys");
    // Sends wait for the re-seed (the in-flight window), then go on.
    let outcome = load
        .finish_after(AFTER + Duration::from_millis(imstream::send::IN_FLIGHT_WINDOW_MS as u64))
        .await;
    let mut report = sys
        .verify(
            &outcome,
            Expect {
                hot_complete: false,
            },
        )
        .await;
    report.extra.push(("keys_flushed".into(), deleted));
    report.failures.extend(outcome.failures());
    report.assert();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_pipeline_kill_9_restarted() {
    let _serial = SERIAL.lock().await;
    let mut sys = System::start("store-kill").await;
    let load = sys.load(RATE);
    for _ in 0..2 {
        load.wait_acked(1000).await;
        let store = sys.pipelines.get_mut("store").unwrap();
        store.kill_9().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        store.respawn();
    }
    let outcome = load.finish_after(AFTER).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report.failures.extend(outcome.failures());
    report.assert();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_kill_9_restarted_with_its_node_id() {
    let _serial = SERIAL.lock().await;
    let mut sys = System::start("gateway-kill").await;
    let load = sys.load(RATE);
    load.wait_acked(BEFORE).await;
    sys.gateway_a.kill_9().await;
    sys.gateway_a.respawn();
    let addr = sys.addr_a;
    let (took, exits) = sys.gateway_a.supervise_until_serving(addr).await;
    let outcome = load.finish_after(AFTER).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report
        .extra
        .push(("restart_ms".into(), took.as_millis() as usize));
    report.extra.push(("restart_exits".into(), exits.len()));
    if let (Some(first), Some(last)) = (exits.first(), exits.last()) {
        report.notes.push(format!(
            "{} exits of the restarted gateway; first: {first}",
            exits.len()
        ));
        report.notes.push(format!("last: {last}"));
    }
    if !exits.is_empty() || took > GATEWAY_RESTART {
        report.failures.push(format!(
            "gateway A restarted with its node id served after {took:?} ({} exits), \
             not within {GATEWAY_RESTART:?}",
            exits.len()
        ));
    }
    report.failures.extend(outcome.failures());
    report.assert();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_content_refused_at_the_door() {
    let _serial = SERIAL.lock().await;
    let sys = System::start("poison").await;
    let load = sys.load(RATE);
    let max_size = sys.stack.config().gateway.max_message_size;
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .unwrap();
    let token = sys.stack.token(2, "poison");
    let mut ws = Sender::new(
        sys.addr_a,
        sys.stack.token(3, "poison-ws"),
        sys.topic.clone(),
        true,
    );
    let until = Instant::now() + Duration::from_secs(15);
    let mut sent = 0usize;
    let mut poison_acked = Vec::new();
    let mut not_refused = Vec::new();
    let mut round = 0;
    while Instant::now() < until {
        for p in POISONS {
            let cmid = format!("poison-{p:?}-{round}");
            let give_up = Instant::now() + RETRY_GRACE;
            let answer = loop {
                let attempt = match p.http_body(&cmid, max_size) {
                    Some(body) => {
                        match http_post(&http, sys.addr_a, &token, &sys.topic, body).await {
                            Ok((code, body)) => classify(code, body).map(|a| (a, code)),
                            Err(e) => Err(e),
                        }
                    }
                    None => match ws.ws_publish(&cmid, &deep_json(&cmid, 40)).await {
                        Ok((code, body)) => classify(code, body).map(|a| (a, code)),
                        Err(e) => Err(e),
                    },
                };
                match attempt {
                    Ok(a) => break Some(a),
                    Err(_) if Instant::now() < give_up => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    Err(e) => {
                        not_refused.push(format!("{cmid}: no answer ({e})"));
                        break None;
                    }
                }
            };
            sent += 1;
            match answer {
                Some((Answer::Accepted(seq), _)) => {
                    poison_acked.push((cmid.clone(), seq));
                    // An ack is an ack: it must hold like any other.
                    load.shared.acked.lock().unwrap().insert(cmid, seq);
                }
                Some((_, code)) if p.refusals().contains(&code) => {}
                Some((a, code)) => not_refused.push(format!("{cmid}: {code} {a:?}")),
                None => {}
            }
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let outcome = load.finish_after(Duration::ZERO).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report.extra.push(("poison_sent".into(), sent));
    report
        .extra
        .push(("poison_acked".into(), poison_acked.len()));
    if !poison_acked.is_empty() {
        report.failures.push(format!(
            "{} bad messages acked (must be refused 400 at the door): {}",
            poison_acked.len(),
            sample(&poison_acked)
        ));
    }
    if !not_refused.is_empty() {
        report.failures.push(format!(
            "{} bad messages not refused with 400 (413 for oversize): {}",
            not_refused.len(),
            sample(&not_refused)
        ));
    }
    report.failures.extend(outcome.failures());
    report.assert();
}

/// The files' object store stopped for 30 s while a user uploads, one
/// upload after another: every upload is answered within the store's
/// bound (`files.store_timeout_secs` — a clear `503`, never a hang), a
/// refused one leaves no record, and once the store is back uploads work
/// again at once. (moto keeps nothing across a restart: the bucket is made
/// again, as an operator's store would still have it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_store_down_30_s_during_uploads() {
    let _serial = SERIAL.lock().await;
    let bucket = format!("imstream-faults-files-{}", rand::random::<u32>());
    let mut stack = Stack::prepared(None).await;
    stack.world.config.files.store_options = common::s3_bucket(&bucket).await;
    stack.world.config.files.store_url = format!("s3://{bucket}/files");
    stack.world.config.files.store_timeout_secs = 3;
    let gw = stack.start_gateway("gw").await;
    let token = stack.token(7001, "web");
    let picture = |i: u32| {
        let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
        bytes.extend((0..20_000u32).map(|j| (j.wrapping_mul(31).wrapping_add(i)) as u8));
        bytes
    };
    let (status, ctrl) = common::upload(gw, &token, "before.png", "image/png", &picture(0)).await;
    assert_eq!(status, 200, "the store is up: {ctrl}");

    let mut down = ServiceDown::stop("s3").await;
    let stopped = Instant::now();
    let mut refused = 0;
    let mut i = 1;
    while stopped.elapsed() < Duration::from_secs(30) {
        let asked = Instant::now();
        let (status, ctrl) =
            common::upload(gw, &token, "during.png", "image/png", &picture(i)).await;
        let took = asked.elapsed();
        assert_eq!(status, 503, "the store is down: {ctrl}");
        assert_eq!(ctrl["ctrl"]["params"]["retry"], json!(true), "{ctrl}");
        assert!(took < Duration::from_secs(10), "answered after {took:?}");
        refused += 1;
        i += 1;
    }
    down.start().await;
    common::s3_bucket(&bucket).await;
    // Back: the next uploads are kept and served.
    let back = Instant::now();
    let mut kept = Vec::new();
    while kept.len() < 3 {
        let (status, ctrl) =
            common::upload(gw, &token, "after.png", "image/png", &picture(i)).await;
        if status == 200 {
            kept.push((
                ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string(),
                i,
            ));
        } else {
            assert!(
                back.elapsed() < Duration::from_secs(10),
                "still {status} {ctrl}"
            );
        }
        i += 1;
    }
    println!(
        "fault=file-store-down refused={refused} back_after={:?}",
        back.elapsed()
    );
    for (url, n) in &kept {
        let got = reqwest::Client::new()
            .get(format!("http://{gw}{url}"))
            .header("X-Tinode-Auth", format!("Token {token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(got.status().as_u16(), 200);
        assert_eq!(got.bytes().await.unwrap().to_vec(), picture(*n));
    }
    // Nothing half registered: the first upload and the three after, each
    // stored; no refused one left a record.
    let states: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, COUNT(*) FROM im_files GROUP BY state ORDER BY state")
            .fetch_all(&stack.pool())
            .await
            .unwrap();
    assert_eq!(states, vec![("stored".to_string(), 4)], "refused={refused}");
}

/// A gateway `kill -9`'d half way through an upload: the file was never
/// answered, so nothing may ever serve or keep it. Its record stays
/// `uploading` (never served: a download is `404`), and once the upload
/// could no longer be going on (`files.upload_timeout_secs` plus a minute,
/// here made to have passed) the shard manager's sweep removes the record
/// and whatever the store holds of it. Another gateway serves uploads the
/// whole time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateway_kill_9_mid_upload_leaves_nothing_registered() {
    use tokio::io::AsyncWriteExt;
    let _serial = SERIAL.lock().await;
    let stack = Stack::prepared(None).await;
    let dir = PathBuf::from(&stack.world.config.files.store_url);
    let mut config = stack.config().clone();
    config.node.id = format!("gwK-{}", stack.world.id);
    let file = write_config_file(&config, &format!("faults-upload-kill-{}", stack.world.id));
    let addr = free_addr();
    let args = ["gateway", "--listen", &addr.to_string()];
    let mut gateway = Proc::spawn_logging(
        &format!("faults-upload-kill-{}", stack.world.id),
        &file,
        &args,
        "warn",
    );
    let (_, exits) = gateway.supervise_until_serving(addr).await;
    assert!(exits.is_empty(), "{exits:?}");
    let token = stack.token(7002, "web");

    // 6 MB announced, 3 MB sent (a whole 5 MiB part has not filled yet),
    // then the gateway dies.
    let (content_type, form_body) =
        common::upload_form("big.png", "image/png", &vec![7u8; 6_000_000]);
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v0/file/u/ HTTP/1.1\r\nHost: {addr}\r\nX-Tinode-Auth: Token {token}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        form_body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&form_body[..3_000_000]).await.unwrap();
    conn.flush().await.unwrap();
    let pool = stack.pool();
    common::wait_for("the upload's record", Duration::from_secs(10), || {
        let pool = pool.clone();
        async move {
            let n: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM im_files WHERE state = 'uploading'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} uploading"))
            }
        }
    })
    .await;
    gateway.kill_9().await;
    drop(conn);

    // Never served, whoever asks, on a gateway that lives.
    let id: String = sqlx::query_scalar("SELECT CAST(file_id AS CHAR) FROM im_files")
        .fetch_one(&pool)
        .await
        .unwrap();
    gateway.respawn();
    let (_, exits) = gateway.supervise_until_serving(addr).await;
    assert!(exits.is_empty(), "{exits:?}");
    let got = reqwest::Client::new()
        .get(format!("http://{addr}/v0/file/s/{id}"))
        .header("X-Tinode-Auth", format!("Token {token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status().as_u16(), 404, "a half upload is never served");
    let (status, ctrl) = common::upload(
        addr,
        &token,
        "next.png",
        "image/png",
        b"\x89PNG\r\n\x1a\nnext",
    )
    .await;
    assert_eq!(status, 200, "{ctrl}");

    // The upload's time is up (as if its timeout and the minute after had
    // passed): the sweep leaves only the completed upload.
    sqlx::query("UPDATE im_files SET created_at = created_at - INTERVAL 1 DAY WHERE file_id = ?")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    stack.shard_pass(None).await;
    let left: Vec<(String, String)> =
        sqlx::query_as("SELECT CAST(file_id AS CHAR), state FROM im_files")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1, "stored", "{left:?}");
    assert_ne!(left[0].0, id);
    let objects = common::files_below(&dir);
    assert_eq!(
        objects.len(),
        1,
        "only the completed upload's object: {objects:?}"
    );
}
