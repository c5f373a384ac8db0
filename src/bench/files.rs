//! `imstream bench files`: uploads and downloads through a running
//! gateway, as Tinode's clients make them (`POST /v0/file/u/` multipart,
//! `GET /v0/file/s/…`), against the store the deployment is configured
//! with (issue 41):
//! - one large upload (`--big-mb`, 100 MB, sent at `--big-mb-per-s`)
//!   while the gateway's resident memory is sampled (the upload streams:
//!   it must grow by less than 10 MB; a 100 KB upload first takes the
//!   gateway's one-time set-up out of the figure), skipped with a note
//!   when `files.max_upload_bytes` is smaller;
//! - `--concurrent` (50) uploads of `--each-mb` (5 MB) at once, by as many
//!   users (each user's upload limit is their own): latency p50/p99 and
//!   MB/s;
//! - downloads of one small file (`--download-kb`, 64 KB) for `--duration`
//!   seconds from 16 clients: downloads per second from a warm store.
//!
//! Each figure with the box's CPU-seconds (`cost`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;

use crate::config::Config;

use super::cost::Costs;
use super::{histogram, summary, Setup};

#[derive(Debug, Clone, clap::Args)]
pub struct FilesArgs {
    /// Gateway base URL (http://host:port).
    #[arg(long, default_value = "http://127.0.0.1:6060")]
    pub url: String,
    /// The gateway's telemetry endpoint (its `/metrics`: resident memory).
    #[arg(long, default_value = "http://127.0.0.1:9464")]
    pub metrics_url: String,
    /// Size of the large upload, MB.
    #[arg(long, default_value_t = 100)]
    pub big_mb: u64,
    /// Pace of the large upload, MB/s: a phone's upload, slow enough for
    /// the gateway's memory gauge (refreshed every second) to be sampled
    /// several times while it streams.
    #[arg(long, default_value_t = 20)]
    pub big_mb_per_s: u64,
    /// Uploads at once.
    #[arg(long, default_value_t = 50)]
    pub concurrent: usize,
    /// Size of each of those, MB.
    #[arg(long, default_value_t = 5)]
    pub each_mb: u64,
    /// Size of the downloaded file, KB.
    #[arg(long, default_value_t = 64)]
    pub download_kb: u64,
    /// Seconds of downloads.
    #[arg(long, default_value_t = 10)]
    pub duration: u64,
    #[arg(long)]
    pub tenant: Option<String>,
}

const MB: u64 = 1_000_000;

/// `len` bytes of a picture: PNG's signature, then bytes that do not
/// compress.
pub fn picture(len: u64, seed: u64) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut x = seed | 1;
    bytes.extend((8..len).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    bytes
}

/// One upload: the file's address.
async fn upload(
    web: &reqwest::Client,
    url: &str,
    token: &str,
    bytes: Vec<u8>,
) -> anyhow::Result<String> {
    upload_paced(web, url, token, bytes, None).await
}

/// One upload whose body is sent at `mb_per_s` (as fast as it goes when
/// `None`): the file's address.
async fn upload_paced(
    web: &reqwest::Client,
    url: &str,
    token: &str,
    bytes: Vec<u8>,
    mb_per_s: Option<u64>,
) -> anyhow::Result<String> {
    let boundary = format!("imstream-bench-{}", rand::random::<u64>());
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"bench.png\"\r\n\
         Content-Type: image/png\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(&bytes);
    drop(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let body = match mb_per_s {
        None => reqwest::Body::from(body),
        Some(rate) => {
            // 100 ms of the pace at a time.
            let step = (rate.max(1) * MB / 10) as usize;
            let pieces: Vec<bytes::Bytes> = bytes::Bytes::from(body)
                .chunks(step)
                .map(bytes::Bytes::copy_from_slice)
                .collect();
            let start = tokio::time::Instant::now();
            let paced = futures::stream::iter(pieces.into_iter().enumerate()).then(
                move |(i, piece)| async move {
                    tokio::time::sleep_until(start + Duration::from_millis(100) * i as u32).await;
                    Ok::<_, std::io::Error>(piece)
                },
            );
            reqwest::Body::wrap_stream(paced)
        }
    };
    let resp = web
        .post(format!("{url}/v0/file/u/"))
        .header("X-Tinode-Auth", format!("Token {token}"))
        .header(
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await?;
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap_or(Value::Null);
    anyhow::ensure!(status.is_success(), "upload answered {status}: {answer}");
    answer["ctrl"]["params"]["url"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no url in {answer}"))
}

/// The gateway's resident memory, bytes (0 when it cannot be read).
async fn resident(metrics_url: &str) -> f64 {
    let text = match reqwest::get(format!("{}/metrics", metrics_url.trim_end_matches('/'))).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => return 0.0,
    };
    text.lines()
        .find(|l| l.starts_with(crate::metrics::PROCESS_RESIDENT_BYTES))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub async fn run(config: &Config, args: FilesArgs) -> anyhow::Result<()> {
    let Setup { tenant, tokens, .. } = Setup::new(config, args.tenant.as_deref())?;
    let token = |uid: i64| tokens.issue(&tenant, uid, "bench", 0, 0).token;
    let web = reqwest::Client::builder()
        .timeout(Duration::from_secs(
            config.files.upload_timeout_secs.max(60),
        ))
        .build()?;
    let url = args.url.trim_end_matches('/').to_string();
    let base_uid = 4_100_000i64;

    // One large upload, memory sampled while it streams.
    let big = args.big_mb * MB;
    if big > config.files.max_upload_bytes {
        println!(
            "large upload: skipped, files.max_upload_bytes is {} (run the gateway with [files] max_upload_bytes >= {big})",
            config.files.max_upload_bytes
        );
    } else {
        // A small upload first (smaller than one part): what a gateway's
        // first upload sets up once (the database pool's connections, the
        // producer's topic) is not the large upload's cost.
        upload(&web, &url, &token(base_uid), picture(100_000, 1)).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let before = resident(&args.metrics_url).await;
        let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let sampler = {
            let (sampling, metrics) = (sampling.clone(), args.metrics_url.clone());
            tokio::spawn(async move {
                let mut peak = 0.0f64;
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    peak = peak.max(resident(&metrics).await);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                peak
            })
        };
        let costs = Costs::start();
        let started = Instant::now();
        upload_paced(
            &web,
            &url,
            &token(base_uid),
            picture(big, 1),
            Some(args.big_mb_per_s),
        )
        .await?;
        let took = started.elapsed();
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        let peak = sampler.await?;
        println!(
            "large upload: {} MB in {:.2} s ({:.1} MB/s); gateway resident {:.1} MiB before, peak {:.1} MiB: grew {:.1} MiB (target < 10 MB)",
            args.big_mb,
            took.as_secs_f64(),
            big as f64 / MB as f64 / took.as_secs_f64(),
            before / 1048576.0,
            peak / 1048576.0,
            (peak - before).max(0.0) / 1048576.0,
        );
        println!("  {}", costs.report(args.big_mb, "MB"));
    }

    // Concurrent uploads, one per user.
    let each = args.each_mb * MB;
    // Every file made first: the uploads then start together.
    let files: Vec<Vec<u8>> = (0..args.concurrent)
        .map(|i| picture(each, i as u64 + 2))
        .collect();
    let costs = Costs::start();
    let started = Instant::now();
    let mut running = Vec::new();
    for (i, bytes) in files.into_iter().enumerate() {
        let (web, url, token) = (web.clone(), url.clone(), token(base_uid + 1 + i as i64));
        running.push(tokio::spawn(async move {
            let asked = Instant::now();
            upload(&web, &url, &token, bytes)
                .await
                .map(|u| (u, asked.elapsed()))
        }));
    }
    let mut latency = histogram();
    let mut urls = Vec::new();
    let mut failed = 0;
    for r in running {
        match r.await? {
            Ok((u, took)) => {
                latency.record(took.as_micros() as u64).ok();
                urls.push(u);
            }
            Err(e) => {
                failed += 1;
                eprintln!("upload failed: {e}");
            }
        }
    }
    let took = started.elapsed();
    println!(
        "{} concurrent uploads of {} MB: {} failed; {}; {:.1} MB/s",
        args.concurrent,
        args.each_mb,
        failed,
        summary(&latency),
        (urls.len() as u64 * each) as f64 / MB as f64 / took.as_secs_f64()
    );
    println!("  {}", costs.report(urls.len() as u64, "uploads"));

    // Downloads of a small file from a warm store.
    let owner = token(base_uid);
    let small = upload(&web, &url, &owner, picture(args.download_kb * 1000, 99)).await?;
    let end = Instant::now() + Duration::from_secs(args.duration);
    let costs = Costs::start();
    let mut clients = Vec::new();
    for _ in 0..16 {
        let (web, address, owner) = (web.clone(), format!("{url}{small}"), owner.clone());
        clients.push(tokio::spawn(async move {
            let mut h = histogram();
            let mut errors = 0u64;
            while Instant::now() < end {
                let asked = Instant::now();
                let ok = match web
                    .get(&address)
                    .header("X-Tinode-Auth", format!("Token {owner}"))
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                    _ => false,
                };
                if ok {
                    h.record(asked.elapsed().as_micros() as u64).ok();
                } else {
                    errors += 1;
                }
            }
            (h, errors)
        }));
    }
    let mut downloads = histogram();
    let mut errors = 0;
    for c in clients {
        let (h, e) = c.await?;
        downloads.add(h).ok();
        errors += e;
    }
    println!(
        "downloads of a {} KB file, 16 clients, {} s: {:.0} per second, {} errors; {}",
        args.download_kb,
        args.duration,
        downloads.len() as f64 / args.duration as f64,
        errors,
        summary(&downloads)
    );
    println!("  {}", costs.report(downloads.len(), "downloads"));
    Ok(())
}
