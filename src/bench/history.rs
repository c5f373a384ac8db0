//! `imstream bench history`: 50-message history pages over HTTP at a fixed
//! rate, from the hot path (Redis: pages within a topic's newest
//! `limits.hot_per_topic` messages), from MySQL across two months and from
//! an archived month (object storage at `shards.archive_url`), plus the
//! request-coalescing check: N members asking for the same latest page at
//! once cost one fetch.
//!
//! Setup writes two topics with the same messages, half in the previous
//! month and half in the current one (MessageSent events straight into the
//! log, as a replay would), and removes one topic's hot copies so its pages
//! come from the month tables. For the archive path it writes a third topic
//! into an old month the catalog does not know yet (registered for the
//! bench), seals, archives and drops that month: the gateway under test
//! must read the same archive location (same config).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::config::Config;
use crate::events::{now_ms, EventCodec, GroupEvent, GroupEventBody, MessageSent};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::keys::TopicKeys;
use crate::store::month::ShardMonth;

use super::Setup;

#[derive(Debug, Clone, clap::Args)]
pub struct HistoryArgs {
    /// Gateway base URL (http://host:port).
    #[arg(long, default_value = "http://127.0.0.1:6060")]
    pub url: String,
    /// Pages per second.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds per path.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    /// Messages per month in each topic.
    #[arg(long, default_value_t = 300)]
    pub per_month: i64,
    /// Concurrent identical reads for the coalescing check.
    #[arg(long, default_value_t = 1000)]
    pub herd: usize,
    #[arg(long)]
    pub tenant: Option<String>,
}

pub async fn run(config: &Config, args: HistoryArgs) -> anyhow::Result<()> {
    let Setup {
        tenant,
        pool,
        tokens,
        run,
    } = Setup::new(config, args.tenant.as_deref())?;
    let run = run.as_str();
    let reader = 3_000_000i64;
    let token = tokens.issue(&tenant, reader, "bench", 0, 0).token;
    let web = reqwest::Client::new();

    let hot_topic = format!("grpHh{run}");
    let cold_topic = format!("grpHc{run}");
    let archive_topic = format!("grpHa{run}");
    for topic in [&hot_topic, &cold_topic, &archive_topic] {
        let resp = web
            .post(format!("{}/v1/groups", args.url))
            .bearer_auth(&token)
            .json(&json!({"topic": topic, "name": "history bench"}))
            .send()
            .await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "creating {topic}: {}",
            resp.text().await?
        );
    }

    // Two months of messages per topic, straight into the log; the archive
    // topic's all in one old month of its own.
    let now = ShardMonth::of(chrono::Utc::now());
    let months = [now.prev(), now];
    let old = archive_month(&pool, now).await?;
    let codec = EventCodec::new(&config.registry.url)?;
    let producer = EventProducer::new(&config.kafka, codec)?;
    let per_month = args.per_month;
    for topic in [&hot_topic, &cold_topic, &archive_topic] {
        let mut sends = Vec::new();
        for seq in 1..=2 * per_month {
            let month = if topic == &archive_topic {
                old
            } else {
                months[((seq - 1) / per_month) as usize]
            };
            let event = GroupEvent {
                actor_device: "bench".into(),
                ..GroupEvent::new(
                    &tenant,
                    &topic,
                    reader,
                    GroupEventBody::MessageSent(MessageSent {
                        message_id: (rand::random::<i64>() & 0x3fff_ffff_ffff_ffff) | 1,
                        group_id: 1,
                        seq,
                        shard_month: month.to_string(),
                        client_msg_id: None,
                        from_user: reader,
                        msg_type: "text".into(),
                        head: None,
                        content: Some(
                            json!(format!("history bench message {seq} with some text in it"))
                                .to_string(),
                        ),
                        mentioned_user_ids: Vec::new(),
                        mention_all: false,
                        reply_seq: None,
                        root_seq: None,
                        file_count: 0,
                        content_size: 48,
                        has_risk: false,
                        audit_status: "pass".into(),
                        created_at: now_ms(),
                        expires_at: None,
                    }),
                )
            };
            let producer = producer.clone();
            let key = format!("{tenant}:{topic}");
            sends.push(tokio::spawn(async move {
                producer
                    .send(TopicKind::GroupEvents, &key, &event, None)
                    .await
            }));
        }
        for s in sends {
            s.await??;
        }
    }
    let want = 2 * per_month;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(message_count), 0) AS SIGNED) FROM im_group_message_topic_shards WHERE topic IN (?, ?, ?)",
        )
        .bind(&hot_topic)
        .bind(&cold_topic)
        .bind(&archive_topic)
        .fetch_one(&pool)
        .await?;
        if n >= 3 * want {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "messages not stored after 120 s ({n} of {}); is the store pipeline running?",
            3 * want
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the hot pipeline catch up, then drop the cold topic's hot copies.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    for topic in [&cold_topic, &archive_topic] {
        let keys = TopicKeys::new(&tenant, topic);
        let _: () = redis::cmd("DEL")
            .arg(keys.hot_seqs())
            .query_async(&mut redis)
            .await?;
    }
    // The old month: sealed, archived, verified, dropped.
    use crate::store::{archive, catalog};
    let location = archive::ArchiveLocation::from_config(&config.shards)?;
    catalog::set_status(&pool, old, catalog::ShardStatus::Sealed).await?;
    let exported = Instant::now();
    let manifest = archive::export(&pool, &tenant, old, &location).await?;
    archive::drop_month(&pool, &tenant, old, &location, true).await?;
    let data = manifest.object(archive::DATA_OBJECT).map_or(0, |d| d.bytes);
    println!(
        "archive: month {old} ({} rows, {data} bytes of Avro) archived to {} and dropped in {:.0} ms",
        manifest.row_count,
        location.month_shown(&tenant, old),
        exported.elapsed().as_secs_f64() * 1000.0
    );

    // Hot: pages inside the hot copy (the newest `limits.hot_per_topic`
    // messages of a topic). MySQL: pages crossing the month boundary of the
    // topic whose hot copy is gone.
    let newest = 2 * per_month;
    let cap = config.limits.hot_per_topic;
    anyhow::ensure!(
        cap > 60,
        "limits.hot_per_topic ({cap}) holds no 50-message page to bench"
    );
    let hot_cursors: Vec<i64> = (0..10).map(|i| newest + 1 - i * (cap - 51) / 10).collect();
    let edge = per_month;
    let cold_cursors: Vec<i64> = (0..10).map(|i| edge + 10 + i * 3).collect();
    let archive_cursors: Vec<i64> = (0..10)
        .map(|i| 51 + i * (2 * per_month - 51) / 10)
        .collect();
    // The archive's first page: manifest, index, header and blocks fetched.
    let first = Instant::now();
    let resp = web
        .get(format!(
            "{}/v1/groups/{archive_topic}/messages?before={}&limit=50",
            args.url, archive_cursors[0]
        ))
        .bearer_auth(&token)
        .send()
        .await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "archive page: {} (does the gateway read shards.archive_url {}?)",
        resp.text().await?,
        location
    );
    println!(
        "archive: first page (manifest, index and blocks fetched) in {:.1} ms",
        first.elapsed().as_secs_f64() * 1000.0
    );
    println!(
        "bench history: {} pages/s for {} s per path, 50-message pages: hot within the newest {cap}, MySQL crossing {}→{}",
        args.rate, args.duration, months[0], months[1]
    );
    for (label, topic, cursors) in [
        ("hot (Redis)", &hot_topic, &hot_cursors),
        ("MySQL, two months", &cold_topic, &cold_cursors),
        ("archive", &archive_topic, &archive_cursors),
    ] {
        let costs = super::Costs::start();
        let hist = paced_reads(&web, &args, topic, &token, cursors).await?;
        println!("{label:>18}: {}", super::summary(&hist));
        println!("{:>18}  {}", "", costs.report(hist.len(), "pages"));
    }

    // Coalescing: a herd asking for the same latest page of the cold topic.
    let metrics_url = format!("{}/metrics", args.url);
    let before = scrape_counter(&web, &metrics_url, crate::metrics::HISTORY_FETCHES_TOTAL).await;
    let started = Instant::now();
    let mut herd = Vec::with_capacity(args.herd);
    for _ in 0..args.herd {
        let (web, url, token) = (
            web.clone(),
            format!("{}/v1/groups/{cold_topic}/messages?limit=50", args.url),
            token.clone(),
        );
        herd.push(tokio::spawn(async move {
            web.get(url)
                .bearer_auth(token)
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    let mut ok = 0;
    for h in herd {
        if matches!(h.await, Ok(Ok(200))) {
            ok += 1;
        }
    }
    let after = scrape_counter(&web, &metrics_url, crate::metrics::HISTORY_FETCHES_TOTAL).await;
    println!(
        "herd: {} identical latest-page reads ({ok} ok) in {:.0} ms cost {} history fetch(es)",
        args.herd,
        started.elapsed().as_secs_f64() * 1000.0,
        after - before
    );
    Ok(())
}

/// An old month the catalog does not know, registered (with its tables)
/// for the archive path: two years back, or further back until free.
async fn archive_month(pool: &sqlx::MySqlPool, now: ShardMonth) -> anyhow::Result<ShardMonth> {
    let mut month = now;
    for _ in 0..24 {
        month = month.prev();
    }
    while crate::store::catalog::entry(pool, month).await?.is_some() {
        month = month.prev();
    }
    crate::store::catalog::create_month(pool, month).await?;
    Ok(month)
}

async fn paced_reads(
    web: &reqwest::Client,
    args: &HistoryArgs,
    topic: &str,
    token: &str,
    cursors: &[i64],
) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let end = tokio::time::Instant::now() + Duration::from_secs(args.duration);
    let mut at = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    let mut i = 0usize;
    while at < end {
        tokio::time::sleep_until(at).await;
        let url = format!(
            "{}/v1/groups/{topic}/messages?before={}&limit=50",
            args.url,
            cursors[i % cursors.len()]
        );
        let (web, token, scheduled) = (web.clone(), token.to_string(), at);
        tasks.push(tokio::spawn(async move {
            let resp = web.get(url).bearer_auth(token).send().await?;
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await?;
            anyhow::ensure!(status == 200, "status {status}: {body}");
            anyhow::ensure!(
                body["messages"].as_array().map_or(0, Vec::len) == 50,
                "short page: {body}"
            );
            Ok::<_, anyhow::Error>(scheduled.elapsed().as_micros() as u64)
        }));
        i += 1;
        at += interval;
    }
    let mut hist = super::histogram();
    for t in tasks {
        hist.record(t.await??.max(1))?;
    }
    Ok(hist)
}

async fn scrape_counter(web: &reqwest::Client, url: &str, name: &str) -> i64 {
    let text = match web.get(url).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return 0,
    };
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum::<f64>() as i64
}
