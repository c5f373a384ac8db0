//! `imstream bench search`: the search index on its own — how fast the
//! search pipeline's indexing code takes messages (documents/s), then
//! query latency p50/p99 at a fixed rate over that index, and the box's
//! CPU-seconds per 1,000 queries.
//!
//! Messages are synthetic (Chinese words, English words and numbers mixed,
//! 6–20 words, spread over `--topics` groups, one per 50 ms) and go through
//! [`crate::search::writer::TenantWriter`] in pipeline-sized batches, one
//! commit each — the pipeline's indexing without Kafka. A query has one or
//! two words and the scope of a member of `--member-of` groups (a caller
//! without `topic=`), as `GET /v1/search` asks the index; resolving hits
//! through the read path (one exact read per hit) is not measured here
//! (`bench history` measures exact reads).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::Config;
use crate::search::entry::Change;
use crate::search::query::{Indexes, Request, Scope};
use crate::search::writer::{Batch, TenantWriter};

use super::{histogram, summary, Costs};

#[derive(Debug, Clone, clap::Args)]
pub struct SearchArgs {
    /// Messages to index.
    #[arg(long, default_value_t = 1_000_000)]
    pub docs: u64,
    /// Groups the messages are spread over.
    #[arg(long, default_value_t = 2_000)]
    pub topics: u64,
    /// Messages per commit (the pipeline's batch_max).
    #[arg(long, default_value_t = 2_000)]
    pub batch: u64,
    /// Queries per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Seconds of queries.
    #[arg(long, default_value_t = 30)]
    pub duration: u64,
    /// Groups the querying user belongs to.
    #[arg(long, default_value_t = 50)]
    pub member_of: usize,
    /// Hits per query (a page).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Index folder (default: a fresh one under the system temp folder,
    /// removed afterwards). An existing index there is queried as it is
    /// when --docs is 0.
    #[arg(long)]
    pub dir: Option<String>,
}

const CHINESE: &[&str] = &[
    "明天",
    "下午",
    "开会",
    "讨论",
    "项目",
    "进度",
    "今天",
    "晚上",
    "吃饭",
    "我们",
    "你们",
    "他们",
    "客户",
    "需求",
    "产品",
    "设计",
    "上线",
    "测试",
    "服务器",
    "数据库",
    "问题",
    "解决",
    "方案",
    "周末",
    "出差",
    "北京",
    "上海",
    "深圳",
    "报告",
    "合同",
    "预算",
    "发票",
    "电话",
    "邮件",
    "文档",
    "会议室",
    "老板",
    "同事",
    "团队",
    "目标",
    "季度",
    "销售",
    "市场",
    "活动",
    "用户",
    "反馈",
    "版本",
    "发布",
    "修复",
    "性能",
    "优化",
    "手机",
    "电脑",
    "网络",
    "消息",
    "群聊",
    "通知",
    "搜索",
    "历史",
    "中华人民共和国",
    "人工智能",
    "机器学习",
    "云计算",
    "微服务",
    "红包",
    "生日",
    "快乐",
    "谢谢",
];
const ENGLISH: &[&str] = &[
    "release",
    "deploy",
    "meeting",
    "review",
    "kafka",
    "redis",
    "mysql",
    "tantivy",
    "rust",
    "bug",
    "fix",
    "feature",
    "sprint",
    "deadline",
    "invoice",
    "budget",
    "customer",
    "roadmap",
    "latency",
    "throughput",
    "search",
    "index",
    "shard",
    "month",
    "archive",
    "ok",
    "thanks",
    "hello",
    "lunch",
    "coffee",
    "weekend",
    "ticket",
    "issue",
    "merge",
    "branch",
    "build",
    "test",
    "prod",
    "staging",
];

fn word(rng: &mut StdRng) -> String {
    match rng.gen_range(0..10) {
        0..=5 => CHINESE[rng.gen_range(0..CHINESE.len())].to_string(),
        6..=8 => ENGLISH[rng.gen_range(0..ENGLISH.len())].to_string(),
        _ => rng.gen_range(1..100_000).to_string(),
    }
}

fn text(rng: &mut StdRng) -> String {
    let n = rng.gen_range(6..=20);
    let mut s = String::new();
    for i in 0..n {
        let w = word(rng);
        // Chinese runs without spaces, as people type them.
        if i > 0 && !(w.chars().all(|c| c > '\u{2e80}') && s.ends_with(|c: char| c > '\u{2e80}')) {
            s.push(' ');
        }
        s.push_str(&w);
    }
    s
}

fn topic(i: u64) -> String {
    format!("grpBenchSearch{i}")
}

pub async fn run(_config: &Config, args: SearchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.topics > 0 && args.rate > 0 && args.limit > 0,
        "topics, rate and limit must be positive"
    );
    let (root, temporary) = match &args.dir {
        Some(d) => (std::path::PathBuf::from(d), false),
        None => (
            std::env::temp_dir().join(format!("imstream-bench-search-{}", std::process::id())),
            true,
        ),
    };
    let tenant = "bench";
    let dir = root.join(tenant);

    if args.docs > 0 {
        let (docs, topics, batch) = (args.docs, args.topics, args.batch.max(1));
        let index_dir = dir.clone();
        let (elapsed, costs) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let mut writer = TenantWriter::open(&index_dir, 256)?;
            let mut rng = StdRng::seed_from_u64(17);
            let start_ts = crate::events::now_ms() - docs as i64 * 50;
            let costs = Costs::start();
            let started = Instant::now();
            let mut done = 0u64;
            while done < docs {
                let mut b = Batch::default();
                for i in done..(done + batch).min(docs) {
                    let t = i % topics;
                    b.changes.push((
                        topic(t),
                        (i / topics + 1) as i64,
                        Change::Sent {
                            ts: start_ts + i as i64 * 50,
                            from: 1_000 + (i % 97) as i64,
                            text: text(&mut rng),
                        },
                    ));
                }
                done += b.changes.len() as u64;
                writer.apply(&b)?;
                if done % 100_000 < batch {
                    eprintln!(
                        "indexed {done} / {docs} ({:.0} docs/s)",
                        done as f64 / started.elapsed().as_secs_f64()
                    );
                }
            }
            Ok((started.elapsed(), costs))
        })
        .await??;
        println!(
            "indexing: {} messages in {:.1} s = {:.0} docs/s (commit every {} messages, one writer thread)",
            args.docs,
            elapsed.as_secs_f64(),
            args.docs as f64 / elapsed.as_secs_f64(),
            args.batch
        );
        println!(
            "indexing cpu (this process): {:.1} s = {:.3} s per 1,000 messages",
            costs.own_seconds(),
            costs.own_seconds() * 1000.0 / args.docs as f64
        );
        println!("{}", costs.report(args.docs, "messages indexed"));
        let size: u64 = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        println!("index size: {:.1} MB", size as f64 / 1e6);
    }

    // Queries at a fixed rate; latency from each query's scheduled time.
    let mut config = Config::default();
    config.search.index_dir = root.display().to_string();
    let indexes = Indexes::new(&config);
    let total = args.rate * args.duration;
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let hist = Arc::new(std::sync::Mutex::new(histogram()));
    let hits = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut rng = StdRng::seed_from_u64(42);
    let costs = Costs::start();
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = started + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let words = rng.gen_range(1..=2);
        let q: Vec<String> = (0..words).map(|_| word(&mut rng)).collect();
        let groups: Vec<String> = (0..args.member_of)
            .map(|_| topic(rng.gen_range(0..args.topics)))
            .collect();
        let request = Request {
            text: q.join(" "),
            scope: Scope::Member { uid: 1, groups },
            from: None,
            to: None,
            after: None,
            limit: args.limit,
        };
        let (indexes, hist, hits) = (indexes.clone(), hist.clone(), hits.clone());
        tasks.push(tokio::task::spawn_blocking(move || {
            let found = indexes.search(tenant, &request);
            let us = due.elapsed().as_micros() as u64;
            if let Ok(f) = found {
                hits.fetch_add(f.hits.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            let _ = hist.lock().map(|mut h| h.record(us.max(1)));
        }));
    }
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed();
    let h = hist.lock().map_err(|_| anyhow::anyhow!("histogram"))?;
    println!(
        "queries: {total} at {} /s target, {:.0} /s achieved, {:.1} hits per query (limit {}), member of {} of {} groups",
        args.rate,
        total as f64 / elapsed.as_secs_f64(),
        hits.load(std::sync::atomic::Ordering::Relaxed) as f64 / total.max(1) as f64,
        args.limit,
        args.member_of,
        args.topics
    );
    println!("latency (index only): {}", summary(&h));
    println!(
        "query cpu (this process, where the queries run): {:.2} s = {:.3} s per 1,000 queries",
        costs.own_seconds(),
        costs.own_seconds() * 1000.0 / total.max(1) as f64
    );
    println!("{}", costs.report(total, "queries"));
    if temporary {
        std::fs::remove_dir_all(&root)?;
    }
    Ok(())
}
