//! `imstream bench fanout`: one group of M members with S sessions online
//! across the given gateways; one member publishes at rate R. Prints
//! end-to-end delivery latency (pub → `{data}` at every other session,
//! measured from the scheduled send time carried in the content),
//! deliveries per second, and each gateway's resident memory per idle
//! session. With `--compare-centrifugo` the same sessions and rate then go
//! through Centrifugo, once per engine ([`super::centrifugo`]), and a table
//! puts the figures side by side.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::config::Config;

use super::centrifugo::{CentrifugoBench, Engine};
use super::deliveries::{self, Deliveries, OpenLoop, Outcome};
use super::{client, Setup};

#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    /// Gateway base URLs, comma separated; sessions are spread over them.
    #[arg(long, default_value = "ws://127.0.0.1:6060,ws://127.0.0.1:6061")]
    pub urls: String,
    /// Members of the group.
    #[arg(long, default_value_t = 10_000)]
    pub members: usize,
    /// Sessions online (members with one session each).
    #[arg(long)]
    pub sessions: Option<usize>,
    /// Messages per second published by one member.
    #[arg(long, default_value_t = 20)]
    pub rate: u64,
    /// Seconds of publishing.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Concurrent connection attempts while logging sessions in.
    #[arg(long, default_value_t = 64)]
    pub connect_concurrency: usize,
    #[arg(long)]
    pub tenant: Option<String>,
    /// The gateways' telemetry endpoints (`/metrics` is not on the public
    /// port), comma separated, in `--urls` order.
    #[arg(long, default_value = "http://127.0.0.1:9464,http://127.0.0.1:9465")]
    pub metrics_urls: String,
    /// Then run the same sessions and rate through Centrifugo (this binary,
    /// e.g. `$(docker/local/centrifugo path)`), with its memory engine and
    /// then its Redis engine, and print the figures side by side.
    #[arg(long, value_name = "CENTRIFUGO_BINARY")]
    pub compare_centrifugo: Option<PathBuf>,
    /// The Redis of Centrifugo's Redis engine; by default the config's
    /// `redis.url`. Its keys and channels are prefixed
    /// `imstream_bench_centrifugo`.
    #[arg(long, requires = "compare_centrifugo")]
    pub centrifugo_redis_url: Option<String>,
    /// Measure Centrifugo only, not imstream (no gateway needed).
    #[arg(long, requires = "compare_centrifugo")]
    pub only_centrifugo: bool,
}

pub async fn run(config: &Config, args: FanoutArgs) -> anyhow::Result<()> {
    let mut outcomes = Vec::new();
    if !args.only_centrifugo {
        outcomes.push(run_imstream(config, &args).await?);
    }
    let Some(binary) = args.compare_centrifugo.clone() else {
        return Ok(());
    };
    let bench = CentrifugoBench {
        binary,
        redis_url: args
            .centrifugo_redis_url
            .clone()
            .unwrap_or_else(|| config.redis.url.clone()),
        sessions: sessions(&args),
        rate: args.rate,
        duration: Duration::from_secs(args.duration),
        connect_concurrency: args.connect_concurrency,
    };
    for engine in Engine::ALL {
        println!();
        // One engine failing leaves the other's figures standing.
        match bench.run(engine).await {
            Ok(outcome) => outcomes.push(outcome),
            Err(e) => println!("centrifugo {}: failed: {e:#}", engine.name()),
        }
    }
    println!("\n{}", deliveries::table(&outcomes));
    Ok(())
}

/// Sessions online: `--sessions`, at most one per member.
fn sessions(args: &FanoutArgs) -> usize {
    args.sessions.unwrap_or(args.members).min(args.members)
}

async fn run_imstream(config: &Config, args: &FanoutArgs) -> anyhow::Result<Outcome> {
    let urls: Vec<String> = args
        .urls
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    anyhow::ensure!(!urls.is_empty(), "no gateway URLs");
    let sessions = sessions(args);
    let Setup {
        tenant,
        pool,
        tokens,
        run,
    } = Setup::new(config, args.tenant.as_deref())?;
    let run = run.as_str();
    let topic = format!("grpF{run}");
    let base = 2_000_000i64;
    let http = |u: &str| {
        u.replacen("ws://", "http://", 1)
            .replacen("wss://", "https://", 1)
    };

    let owner_token = tokens.issue(&tenant, base, "bench", 0, 0).token;
    let members: Vec<i64> = (1..args.members as i64).map(|i| base + i).collect();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/groups", http(&urls[0])))
        .bearer_auth(&owner_token)
        .json(&json!({"topic": topic, "name": "fanout bench", "members": members}))
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "creating the group: {}",
        resp.text().await?
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_group_members WHERE topic = ?")
            .bind(&topic)
            .fetch_one(&pool)
            .await?;
        if n as usize >= args.members {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "group not projected after 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let metrics_urls: Vec<String> = args
        .metrics_urls
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let before = scrape_all(&metrics_urls).await;
    println!(
        "bench fanout: {} members, {sessions} sessions over {} gateways, {} msg/s for {} s",
        args.members,
        urls.len(),
        args.rate,
        args.duration
    );
    // Session 0 is the sender (the owner); the rest listen.
    let started = Instant::now();
    let mut sockets: Vec<Option<client::Ws>> = (0..sessions).map(|_| None).collect();
    let sem = Arc::new(tokio::sync::Semaphore::new(args.connect_concurrency));
    let mut joins = Vec::new();
    for i in 0..sessions {
        let url = urls[i % urls.len()].clone();
        let token = tokens
            .issue(&tenant, base + i as i64, &format!("fb{i}"), 0, 0)
            .token;
        let topic = topic.clone();
        let sem = sem.clone();
        joins.push(tokio::spawn(async move {
            let _permit = sem.acquire().await;
            (i, client::connect(&url, &token, &topic).await)
        }));
    }
    for j in joins {
        let (i, ws) = j.await?;
        sockets[i] = Some(ws?);
    }
    println!(
        "{sessions} sessions logged in and attached in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = scrape_all(&metrics_urls).await;
    for (i, url) in urls.iter().enumerate() {
        let (rss0, n0) = before.get(i).copied().unwrap_or_default();
        let (rss1, n1) = after.get(i).copied().unwrap_or_default();
        if n1 > n0 {
            println!(
                "gateway {url}: {} sessions, resident {:.1} MiB → {:.1} MiB: {:.1} KiB per idle session",
                n1 - n0,
                rss0 / 1048576.0,
                rss1 / 1048576.0,
                (rss1 - rss0) / 1024.0 / (n1 - n0)
            );
        }
    }

    let deliveries = Arc::new(Deliveries::default());
    let end = tokio::time::Instant::now() + Duration::from_secs(args.duration);
    let mut receivers = Vec::new();
    let mut sender_ws = None;
    for (i, ws) in sockets.into_iter().enumerate() {
        let ws = ws.expect("connected");
        if i == 0 {
            sender_ws = Some(ws);
            continue;
        }
        let deliveries = deliveries.clone();
        receivers.push(tokio::spawn(async move {
            let (_sink, mut stream) = ws.split();
            let grace = end + Duration::from_secs(5);
            loop {
                let frame = match tokio::time::timeout_at(grace, stream.next()).await {
                    Ok(Some(Ok(f))) => f,
                    _ => break,
                };
                let Message::Text(text) = frame else { continue };
                if let Some(sent) = deliveries::sent_micros(&text) {
                    deliveries.record(i, sent);
                }
            }
        }));
    }
    let (mut sink, mut stream) = sender_ws.expect("sender").split();
    // Drain the sender's acks.
    tokio::spawn(async move { while let Some(Ok(_)) = stream.next().await {} });
    let costs = super::Costs::start();
    let mut schedule = OpenLoop::new(args.rate, end)?;
    while let Some((n, content)) = schedule.next().await {
        let msg = json!({"pub": {"id": n.to_string(), "topic": topic, "content": content}});
        sink.send(Message::Text(msg.to_string().into())).await?;
    }
    let published = schedule.published();
    for r in receivers {
        let _ = r.await;
    }
    let outcome = Outcome {
        system: "imstream".into(),
        expected: published.sent * (sessions as u64 - 1),
        delivered: deliveries.delivered(),
        latency: deliveries.latencies(),
        published,
        // Everything that serves imstream's figure: Centrifugo is not
        // running yet.
        cost: costs.figures(|label| label != "centrifugo"),
    };
    println!("{}", outcome.summary());
    println!("{}", costs.report(outcome.delivered, "deliveries"));
    Ok(outcome)
}

/// (resident bytes, sessions) per gateway from its /metrics.
async fn scrape_all(urls: &[String]) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for u in urls {
        let text = match reqwest::get(format!("{}/metrics", u.trim_end_matches('/'))).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        out.push((
            value(crate::metrics::PROCESS_RESIDENT_BYTES),
            value(crate::metrics::GATEWAY_SESSIONS),
        ));
    }
    out
}
