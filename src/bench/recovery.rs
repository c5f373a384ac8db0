//! `imstream bench recovery`: how long until every conversation sends again
//! after Redis forgets (issue 38). N conversations — half groups created
//! through the gateway, half one-to-one chats started by their first
//! message — each get a message (HTTP, with a client id); then Redis is
//! restarted (or emptied) and each conversation's sender sends one more,
//! retrying every 0.5 s on "retry" answers, as the operator's measurement
//! in the issue did. Prints the time until 25 / 50 / 90 / 99 / 100 % of
//! the conversations accepted a send, the retryable answers meanwhile, and
//! whether any seq was handed out twice.
//!
//! The fault suite runs the same rounds against its own gateways
//! (`tests/faults/recovery.rs`) and asserts on [`Round`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use crate::auth::Tokens;
use crate::config::Config;

use super::Setup;

#[derive(Debug, Clone, clap::Args)]
pub struct RecoveryArgs {
    /// Gateway base URL (http://host:port).
    #[arg(long, default_value = "http://127.0.0.1:6060")]
    pub url: String,
    /// Conversations (half groups, half one-to-one).
    #[arg(long, default_value_t = 2000)]
    pub conversations: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 128)]
    pub concurrency: usize,
    /// What happens to Redis: `restart` (the command below) or `flush`
    /// (FLUSHALL: every key gone).
    #[arg(long, default_value = "restart")]
    pub how: String,
    /// The command that restarts Redis (`--how restart`).
    #[arg(
        long,
        default_value = "bash docker/local/stack kill redis && bash docker/local/stack start redis"
    )]
    pub restart_command: String,
    /// Tenant (default: the first configured).
    #[arg(long)]
    pub tenant: Option<String>,
}

/// One conversation of the run.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub topic: String,
    /// Who sends in it.
    pub sender: i64,
    /// A one-to-one chat's other user (sends go to `/v1/users/{peer}`).
    pub peer: Option<i64>,
}

/// What one round of sends measured.
#[derive(Debug, Clone, Default)]
pub struct Round {
    /// When each conversation's send was accepted, from the round's start,
    /// sorted.
    pub accepted_after: Vec<Duration>,
    /// How long each accepted conversation waited, from its first attempt
    /// to its acceptance (what the fault cost it; the round's pace, with
    /// `concurrency` requests in flight, is not in it), sorted.
    pub waited: Vec<Duration>,
    /// Conversations that got no acceptance before the deadline.
    pub not_accepted: Vec<String>,
    /// Refusals (4xx) a good send got: each one a failure.
    pub refused: Vec<String>,
    /// Retryable answers (5xx, timeouts) while waiting.
    pub retries: u64,
    /// `(topic, client id, seq)` of every accepted send.
    pub acked: Vec<(String, String, i64)>,
}

impl Round {
    /// The time until `q` (0..=1) of the conversations were accepted.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.accepted_after.is_empty() {
            return None;
        }
        let i = ((self.accepted_after.len() as f64 * q).ceil() as usize)
            .clamp(1, self.accepted_after.len());
        self.accepted_after.get(i - 1).copied()
    }

    /// The time `q` (0..=1) of the conversations waited at most.
    pub fn wait_quantile(&self, q: f64) -> Option<Duration> {
        if self.waited.is_empty() {
            return None;
        }
        let i = ((self.waited.len() as f64 * q).ceil() as usize).clamp(1, self.waited.len());
        self.waited.get(i - 1).copied()
    }

    /// The round in one line.
    pub fn line(&self, label: &str, total: usize) -> String {
        let at = |q: f64| {
            self.quantile(q)
                .map(|d| format!("{:.2}s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        };
        let all = if self.accepted_after.len() == total {
            at(1.0)
        } else {
            format!("never ({} of {total})", self.accepted_after.len())
        };
        let wait = |q: f64| {
            self.wait_quantile(q)
                .map(|d| format!("{:.2}s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        };
        format!(
            "{label}: conversations={total} accepted_25%={} 50%={} 90%={} 99%={} 100%={all} wait_p50={} p99={} max={} retryable_answers={} refused={}",
            at(0.25),
            at(0.5),
            at(0.9),
            at(0.99),
            wait(0.5),
            wait(0.99),
            wait(1.0),
            self.retries,
            self.refused.len()
        )
    }
}

/// The run's conversations and how to reach the gateway.
pub struct Scenario {
    http: reqwest::Client,
    base: String,
    tenant: String,
    tokens: Tokens,
    run: String,
    concurrency: usize,
    pub conversations: Vec<Conversation>,
}

impl Scenario {
    /// Creates `n` conversations (half groups through `POST /v1/groups`,
    /// half one-to-one chats started by their first message in round 0).
    pub async fn prepare(
        config: &Config,
        base: &str,
        tenant: &str,
        n: usize,
        concurrency: usize,
    ) -> anyhow::Result<Scenario> {
        let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(concurrency)
            .build()?;
        let mut scenario = Scenario {
            http,
            base: base.trim_end_matches('/').to_string(),
            tenant: tenant.to_string(),
            tokens: Tokens::new(config),
            run,
            concurrency: concurrency.max(1),
            conversations: Vec::new(),
        };
        // Users of this run: a block of their own.
        let base_uid = 10_000_000 + (rand::random::<u32>() % 100_000) as i64 * 100_000;
        let groups = n / 2;
        let mut conversations = Vec::with_capacity(n);
        for i in 0..groups {
            let owner = base_uid + 2 * i as i64;
            conversations.push(Conversation {
                topic: format!("grpR{}{i}", scenario.run),
                sender: owner,
                peer: None,
            });
        }
        for i in groups..n {
            let a = base_uid + 2 * i as i64;
            conversations.push(Conversation {
                topic: crate::tinode::p2p_topic(a, a + 1),
                sender: a,
                peer: Some(a + 1),
            });
        }
        let created = futures::stream::iter(conversations.iter().filter(|c| c.peer.is_none()))
            .map(|c| scenario.create_group(c))
            .buffer_unordered(scenario.concurrency)
            .collect::<Vec<_>>()
            .await;
        for r in created {
            r?;
        }
        scenario.conversations = conversations;
        Ok(scenario)
    }

    async fn create_group(&self, c: &Conversation) -> anyhow::Result<()> {
        let token = self
            .tokens
            .issue(&self.tenant, c.sender, "bench", 0, 0)
            .token;
        let body = json!({"topic": c.topic, "name": c.topic, "members": [c.sender + 1]});
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let resp = self
                .http
                .post(format!("{}/v1/groups", self.base))
                .bearer_auth(&token)
                .header("Idempotency-Key", format!("create-{}", c.topic))
                .json(&body)
                .send()
                .await;
            match resp {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) if r.status().is_client_error() => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    anyhow::bail!("creating {}: {status} {text}", c.topic);
                }
                _ if Instant::now() > deadline => anyhow::bail!("creating {}: no answer", c.topic),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Every conversation's sender sends one message (client id
    /// `<label>-<n>`), retrying every 0.5 s on a retryable answer, until
    /// accepted or `deadline` after the round began.
    pub async fn round(&self, label: &str, deadline: Duration) -> Round {
        let started = Instant::now();
        let retries = Arc::new(AtomicU64::new(0));
        let outcomes = futures::stream::iter(self.conversations.iter().enumerate())
            .map(|(i, c)| {
                let retries = retries.clone();
                async move {
                    let cmid = format!("{}-{label}-{i}", self.run);
                    (
                        c,
                        cmid.clone(),
                        self.send_until(c, &cmid, started, deadline, &retries).await,
                    )
                }
            })
            .buffer_unordered(self.concurrency)
            .collect::<Vec<_>>()
            .await;
        let mut round = Round {
            retries: retries.load(Ordering::Relaxed),
            ..Round::default()
        };
        for (c, cmid, outcome) in outcomes {
            match outcome {
                Sent::Accepted(seq, after, waited) => {
                    round.accepted_after.push(after);
                    round.waited.push(waited);
                    round.acked.push((c.topic.clone(), cmid, seq));
                }
                Sent::Refused(why) => round.refused.push(format!("{}: {why}", c.topic)),
                Sent::GaveUp => round.not_accepted.push(c.topic.clone()),
            }
        }
        round.accepted_after.sort();
        round.waited.sort();
        round
    }

    async fn send_until(
        &self,
        c: &Conversation,
        cmid: &str,
        started: Instant,
        deadline: Duration,
        retries: &AtomicU64,
    ) -> Sent {
        let token = self
            .tokens
            .issue(&self.tenant, c.sender, "bench", 0, 0)
            .token;
        let url = match c.peer {
            Some(peer) => format!("{}/v1/users/{peer}/messages", self.base),
            None => format!("{}/v1/groups/{}/messages", self.base, c.topic),
        };
        let body = json!({"content": {"txt": cmid}, "client_msg_id": cmid});
        let first = Instant::now();
        loop {
            let resp = self
                .http
                .post(&url)
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await;
            match resp {
                Ok(r) if r.status().as_u16() == 202 || r.status().as_u16() == 200 => {
                    let v: Value = r.json().await.unwrap_or(Value::Null);
                    if let Some(seq) = v["seq"].as_i64() {
                        return Sent::Accepted(seq, started.elapsed(), first.elapsed());
                    }
                }
                Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                    let status = r.status();
                    return Sent::Refused(format!(
                        "{status} {}",
                        r.text().await.unwrap_or_default()
                    ));
                }
                _ => {}
            }
            retries.fetch_add(1, Ordering::Relaxed);
            if started.elapsed() > deadline {
                return Sent::GaveUp;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

enum Sent {
    /// The seq, when from the round's start, how long after the first
    /// attempt.
    Accepted(i64, Duration, Duration),
    Refused(String),
    GaveUp,
}

/// Seqs acknowledged to two messages of one conversation (none may be).
pub fn reused(rounds: &[&Round]) -> Vec<(String, i64)> {
    let mut seen: HashMap<(String, i64), String> = HashMap::new();
    let mut out = Vec::new();
    for round in rounds {
        for (topic, cmid, seq) in &round.acked {
            if let Some(other) = seen.insert((topic.clone(), *seq), cmid.clone()) {
                if other != *cmid {
                    out.push((topic.clone(), *seq));
                }
            }
        }
    }
    out
}

pub async fn run(config: &Config, args: RecoveryArgs) -> anyhow::Result<()> {
    let Setup { tenant, .. } = Setup::new(config, args.tenant.as_deref())?;
    let started = Instant::now();
    let scenario = Scenario::prepare(
        config,
        &args.url,
        &tenant,
        args.conversations,
        args.concurrency,
    )
    .await?;
    let first = scenario.round("before", Duration::from_secs(300)).await;
    println!(
        "{} ({:.1}s to create and fill)",
        first.line("before", args.conversations),
        started.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        first.refused.is_empty() && first.not_accepted.is_empty(),
        "the conversations could not be filled: {:?} {:?}",
        first.refused.first(),
        first.not_accepted.first()
    );
    match args.how.as_str() {
        "restart" => {
            let status = std::process::Command::new("bash")
                .arg("-c")
                .arg(&args.restart_command)
                .status()?;
            anyhow::ensure!(status.success(), "{} failed", args.restart_command);
        }
        "flush" => {
            let mut redis = crate::redis_util::connect(&config.redis.url).await?;
            let _: () = redis::cmd("FLUSHALL").query_async(&mut redis).await?;
        }
        other => anyhow::bail!("--how restart or flush, not {other}"),
    }
    let after = scenario.round("after", Duration::from_secs(900)).await;
    println!(
        "{}",
        after.line(&format!("after {}", args.how), args.conversations)
    );
    let twice = reused(&[&first, &after]);
    println!("seqs handed out twice: {}", twice.len());
    if let Some(seq) = twice.first() {
        println!("  e.g. {seq:?}");
    }
    Ok(())
}
