//! `imstream bench send`: N WebSocket clients publish at a fixed total rate
//! for a duration; prints send-ack latency (open loop: measured from each
//! message's scheduled send time, so a stall is not hidden) and the rate at
//! which messages reach MySQL (route mirror counts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::config::Config;

use super::{client, Setup};

#[derive(Debug, Clone, clap::Args)]
pub struct SendArgs {
    /// Gateway base URL (ws://host:port).
    #[arg(long, default_value = "ws://127.0.0.1:6060")]
    pub url: String,
    /// Concurrent WebSocket clients.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// Total messages per second across all clients.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Seconds of sending.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Groups the clients are spread over.
    #[arg(long, default_value_t = 10)]
    pub groups: usize,
    /// Seconds at the start whose latencies are not recorded.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// Tenant (default: the first configured).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Several rates, one run each (e.g. 200,500,2000,5000), then the
    /// curve of CPU-seconds per 1,000 acked messages: whether a message
    /// costs the same at every rate. Overrides --rate.
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<u64>,
}

/// What one run measured.
struct Figures {
    rate: u64,
    acked: u64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_per_1000: f64,
    traffic: super::traffic::PerUnit,
}

pub async fn run(config: &Config, args: SendArgs) -> anyhow::Result<()> {
    if args.rates.is_empty() {
        run_at(config, &args).await?;
        return Ok(());
    }
    let mut curve = Vec::new();
    for &rate in &args.rates {
        let figures = run_at(
            config,
            &SendArgs {
                rate,
                ..args.clone()
            },
        )
        .await?;
        curve.push(figures);
        println!();
    }
    println!("CPU per 1,000 acked messages by rate (box CPU-seconds, send until stored in MySQL):");
    println!("  offered msg/s   acked   ack p50 / p99 ms   CPU-s per 1,000   Redis cmds / trips per msg   MySQL stmts per msg");
    for f in &curve {
        println!(
            "  {:>13}   {:>5}   {:>7.1} / {:<7.1}   {:<15.3}   {:>10.1} / {:<13.1}   {:.2}",
            f.rate,
            f.acked,
            f.p50_ms,
            f.p99_ms,
            f.cpu_per_1000,
            f.traffic.commands,
            f.traffic.round_trips,
            f.traffic.statements
        );
    }
    let costs: Vec<f64> = curve.iter().map(|f| f.cpu_per_1000).collect();
    let (lo, hi) = costs
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), c| (lo.min(*c), hi.max(*c)));
    if lo > 0.0 {
        println!("  dearest / cheapest: {:.2}×", hi / lo);
    }
    Ok(())
}

async fn run_at(config: &Config, args: &SendArgs) -> anyhow::Result<Figures> {
    anyhow::ensure!(
        args.clients > 0 && args.rate > 0 && args.groups > 0,
        "clients, rate and groups must be positive"
    );
    let Setup {
        tenant,
        pool,
        tokens,
        run,
    } = Setup::new(config, args.tenant.as_deref())?;
    let args = args.clone();
    let run = run.as_str();
    let http = args
        .url
        .replacen("ws://", "http://", 1)
        .replacen("wss://", "https://", 1);

    // Groups, created through the gateway like a user would.
    let owner = 1i64;
    let owner_token = tokens.issue(&tenant, owner, "bench", 0, 0).token;
    let uid_of = |i: usize| 1_000_000 + i as i64;
    let topics: Vec<String> = (0..args.groups).map(|g| format!("grpB{run}{g}")).collect();
    let web = reqwest::Client::new();
    for (g, topic) in topics.iter().enumerate() {
        let members: Vec<i64> = (0..args.clients)
            .filter(|i| i % args.groups == g)
            .map(uid_of)
            .collect();
        let resp = web
            .post(format!("{http}/v1/groups"))
            .bearer_auth(&owner_token)
            .json(&json!({"topic": topic, "name": "bench", "members": members}))
            .send()
            .await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "creating {topic}: {}",
            resp.text().await?
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_groups WHERE topic LIKE ?")
            .bind(format!("grpB{run}%"))
            .fetch_one(&pool)
            .await?;
        if n as usize == args.groups {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "groups not projected after 60 s (is the members pipeline running?)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    println!(
        "bench send: {} clients, {} msg/s for {} s over {} groups ({})",
        args.clients, args.rate, args.duration, args.groups, args.url
    );
    let mut sockets = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let token = tokens
            .issue(&tenant, uid_of(i), &format!("bench-{i}"), 0, 0)
            .token;
        sockets.push(client::connect(&args.url, &token, &topics[i % args.groups]).await?);
    }
    // A new topic's first send seeds its seq allocator (a log-tail scan);
    // measure the steady state after one message per group.
    for g in 0..args.groups.min(args.clients) {
        client::warm_up(&mut sockets[g], &topics[g]).await?;
    }

    let interval = Duration::from_secs_f64(args.clients as f64 / args.rate as f64);
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_secs(args.duration);
    let warm = start + Duration::from_secs(args.warmup);
    let mut tasks = Vec::new();
    for (i, ws) in sockets.into_iter().enumerate() {
        let topic = topics[i % args.groups].clone();
        let offset = interval.mul_f64(i as f64 / args.clients as f64);
        let run = run.to_string();
        tasks.push(tokio::spawn(client_loop(
            ws,
            topic,
            start + offset,
            end,
            warm,
            interval,
            run,
            i,
        )));
    }
    let stored_at_start = stored(&pool, run).await?;
    let traffic = super::traffic::Traffic::start(config, &pool).await;
    let costs = super::Costs::start();
    let mut hist = super::histogram();
    let (mut sent, mut acked, mut errors) = (0u64, 0u64, HashMap::<String, u64>::new());
    for t in tasks {
        let r = t.await??;
        hist.add(&r.hist)?;
        sent += r.sent;
        acked += r.acked;
        for (code, n) in r.errors {
            *errors.entry(code).or_default() += n;
        }
    }
    let send_phase = start.elapsed();
    let stored_after_send = stored(&pool, run).await? - stored_at_start;
    // Wait for the store pipeline to catch up.
    let drain_deadline = Instant::now() + Duration::from_secs(120);
    let mut total = stored_after_send;
    while total < acked as i64 && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        total = stored(&pool, run).await? - stored_at_start;
    }
    let to_mysql = start.elapsed();

    println!("sent {sent}, acked {acked}, errors {errors:?}");
    println!(
        "send-ack latency (after {} s warm-up): {}",
        args.warmup,
        super::summary(&hist)
    );
    println!(
        "offered {:.0} msg/s; acked {:.0} msg/s",
        sent as f64 / args.duration as f64,
        acked as f64 / args.duration as f64
    );
    println!(
        "MySQL: {stored_after_send} of {acked} stored when sending stopped ({:.1} s); all {total} stored after {:.1} s → {:.0} msg/s send-to-MySQL",
        send_phase.as_secs_f64(),
        to_mysql.as_secs_f64(),
        total as f64 / to_mysql.as_secs_f64()
    );
    println!(
        "{} (from the first send until the last is in MySQL)",
        costs.report(acked, "messages")
    );
    let traffic = traffic.per(acked).await;
    match &traffic {
        Some(t) => println!("{}", t.line("message")),
        None => println!("redis / mysql traffic: not known (a server did not answer)"),
    }
    let traffic = traffic.unwrap_or_default();
    if total < acked as i64 {
        println!(
            "WARNING: {} acked messages not stored after 120 s",
            acked as i64 - total
        );
    }
    Ok(Figures {
        rate: args.rate,
        acked,
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
        cpu_per_1000: costs.per_thousand(acked),
        traffic,
    })
}

async fn stored(pool: &sqlx::MySqlPool, run: &str) -> anyhow::Result<i64> {
    let total: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(message_count), 0) AS SIGNED) FROM im_group_message_topic_shards WHERE topic LIKE ?",
    )
    .bind(format!("grpB{run}%"))
    .fetch_one(pool)
    .await?;
    Ok(total)
}

struct ClientResult {
    hist: hdrhistogram::Histogram<u64>,
    sent: u64,
    acked: u64,
    /// `code reason` → count.
    errors: HashMap<String, u64>,
}

#[allow(clippy::too_many_arguments)]
async fn client_loop(
    ws: client::Ws,
    topic: String,
    first: tokio::time::Instant,
    end: tokio::time::Instant,
    warm: tokio::time::Instant,
    interval: Duration,
    run: String,
    client: usize,
) -> anyhow::Result<ClientResult> {
    let (mut sink, mut stream) = ws.split();
    let scheduled: Arc<Mutex<HashMap<u64, tokio::time::Instant>>> = Arc::default();
    let sched = scheduled.clone();
    let sender = tokio::spawn(async move {
        let mut k = 0u64;
        let mut at = first;
        while at < end {
            tokio::time::sleep_until(at).await;
            sched.lock().expect("lock").insert(k, at);
            let msg = json!({"pub": {
                "id": k.to_string(),
                "topic": topic,
                "head": {"client_mid": format!("{run}-{client}-{k}")},
                "content": format!("bench message {k} from client {client}"),
            }});
            if sink
                .send(Message::Text(msg.to_string().into()))
                .await
                .is_err()
            {
                break;
            }
            k += 1;
            at += interval;
        }
        (k, sink)
    });
    let mut hist = super::histogram();
    let (mut acked, mut errors) = (0u64, HashMap::new());
    let mut outstanding: Option<u64> = None;
    let mut received = 0u64;
    let mut sender = Some(sender);
    let mut sink_keep = None;
    loop {
        if let Some(s) = &sender {
            if s.is_finished() {
                let (n, sink) = sender.take().expect("present").await?;
                outstanding = Some(n);
                sink_keep = Some(sink);
            }
        }
        if outstanding.is_some_and(|n| received >= n) {
            break;
        }
        let frame = match tokio::time::timeout(Duration::from_millis(100), stream.next()).await {
            Ok(Some(Ok(f))) => f,
            Ok(_) => break,
            Err(_) => {
                if outstanding.is_some()
                    && tokio::time::Instant::now() > end + Duration::from_secs(15)
                {
                    break;
                }
                continue;
            }
        };
        let Message::Text(text) = frame else { continue };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        let Some(id) = v["ctrl"]["id"].as_str().and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        let Some(at) = scheduled.lock().expect("lock").remove(&id) else {
            continue;
        };
        received += 1;
        let code = v["ctrl"]["code"].as_u64().unwrap_or(0);
        if code == 202 {
            acked += 1;
            if at >= warm {
                let micros = at.elapsed().as_micros().max(1) as u64;
                hist.record(micros.min(60_000_000))?;
            }
        } else {
            let reason = v["ctrl"]["params"]["reason"]
                .as_str()
                .unwrap_or(v["ctrl"]["text"].as_str().unwrap_or(""));
            *errors.entry(format!("{code} {reason}")).or_default() += 1;
        }
    }
    drop(sink_keep);
    Ok(ClientResult {
        hist,
        sent: outstanding.unwrap_or(received),
        acked,
        errors,
    })
}
