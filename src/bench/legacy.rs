//! `imstream bench legacy-copy`: copy throughput of the legacy migration on
//! a scratch tenant database (created, filled with synthetic legacy rows,
//! planned, copied, verified, dropped). Prints rows/s and per-batch
//! latency percentiles. [`fill_synthetic`] is also the legacy data of the
//! migration test.

use std::time::Instant;

use chrono::{NaiveDateTime, TimeZone, Utc};
use sqlx::mysql::MySqlPool;
use sqlx::{MySql, QueryBuilder};

use crate::config::{Config, TenantConfig};
use crate::shutdown::Shutdown;
use crate::store::month::ShardMonth;

#[derive(Debug, Clone, clap::Args)]
pub struct LegacyCopyArgs {
    /// Legacy rows to copy.
    #[arg(long, default_value_t = 200_000)]
    pub rows: i64,
    /// Topics the rows are spread over.
    #[arg(long, default_value_t = 50)]
    pub topics: i64,
    /// Months the rows are spread over (ending before the current month).
    #[arg(long, default_value_t = 4)]
    pub months: u32,
    /// Rows per batch transaction (1000-5000).
    #[arg(long, default_value_t = crate::legacy::copy::BATCH_MAX)]
    pub batch_size: usize,
    /// Months copied at once (1-8).
    #[arg(long, default_value_t = crate::legacy::copy::JOBS_DEFAULT)]
    pub jobs: usize,
    /// Keep past months' secondary indexes during their copy (no bulk load).
    #[arg(long)]
    pub keep_indexes: bool,
    /// Keep the scratch database (default: dropped).
    #[arg(long)]
    pub keep: bool,
}

/// The shape of synthetic legacy data: `topics` topics `legacy<i>` with
/// seqs `1..=rows/topics` each, created evenly over `months` months from
/// `first`, in time order (so legacy ids follow time).
#[derive(Debug, Clone, Copy)]
pub struct Synthetic {
    pub rows: i64,
    pub topics: i64,
    pub first: ShardMonth,
    pub months: u32,
}

impl Synthetic {
    pub fn per_topic(&self) -> i64 {
        self.rows / self.topics
    }

    pub fn topic(i: i64) -> String {
        format!("legacy{i}")
    }

    /// The text of one message.
    pub fn content(topic: i64, seq: i64) -> String {
        format!("{{\"txt\":\"legacy {topic} #{seq} \u{4f60}\u{597d}\"}}")
    }

    fn created_at(&self, topic: i64, seq: i64) -> NaiveDateTime {
        let mut end = self.first;
        for _ in 0..self.months {
            end = end.next();
        }
        let (start, end) = (
            self.first.start().timestamp_millis(),
            end.start().timestamp_millis(),
        );
        let step = (end - start) / (self.per_topic() + 1);
        let ms = start + (seq - 1) * step + topic;
        Utc.timestamp_millis_opt(ms)
            .single()
            .expect("in range")
            .naive_utc()
    }
}

/// Inserts the synthetic legacy rows (1,000-row statements).
pub async fn fill_synthetic(pool: &MySqlPool, s: &Synthetic) -> sqlx::Result<()> {
    let rows: Vec<(i64, i64)> = (1..=s.per_topic())
        .flat_map(|seq| (0..s.topics).map(move |t| (t, seq)))
        .collect();
    for chunk in rows.chunks(1000) {
        let mut q: QueryBuilder<MySql> = QueryBuilder::new(
            "INSERT INTO im_group_messages (topic, group_id, seqid, from_user, client_msg_id, content, \
             content_size, created_at, updated_at) ",
        );
        q.push_values(chunk, |mut b, (t, seq)| {
            let at = s.created_at(*t, *seq);
            b.push_bind(Synthetic::topic(*t))
                .push_bind(t + 1)
                .push_bind(*seq)
                .push_bind(1000 + seq % 7)
                .push_bind(format!("c{seq}"))
                .push_bind(Synthetic::content(*t, *seq))
                .push_bind(20)
                .push_bind(at)
                .push_bind(at);
        });
        q.build().execute(pool).await?;
    }
    Ok(())
}

pub async fn run(config: &Config, args: LegacyCopyArgs) -> anyhow::Result<()> {
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let tenant = TenantConfig {
        id: format!("bench_{run}"),
        database: format!("imbench_legacy_{run}"),
        signing_keys: Vec::new(),
        ..Default::default()
    };
    let mut scratch = config.clone();
    scratch.tenants = vec![tenant.clone()];
    crate::tenant::migrate(&scratch, None).await?;
    let pool = crate::tenant::pool_of(config, &tenant)?;
    let mut redis = crate::redis_util::connect(&config.redis.url).await?;
    let mut first = ShardMonth::of(Utc::now());
    for _ in 0..args.months {
        first = first.prev();
    }
    let shape = Synthetic {
        rows: args.rows,
        topics: args.topics.max(1),
        first,
        months: args.months.max(1),
    };
    println!(
        "legacy-copy: filling {} rows over {} topics and {} months into {} …",
        shape.per_topic() * shape.topics,
        shape.topics,
        shape.months,
        tenant.database
    );
    fill_synthetic(&pool, &shape).await?;
    let planned = Instant::now();
    let plan = crate::legacy::plan::plan(&pool, &mut redis, &tenant.id).await?;
    let plan_time = planned.elapsed();
    let options = crate::legacy::copy::CopyOptions {
        batch_size: args.batch_size,
        progress: true,
        jobs: args.jobs,
        keep_indexes: args.keep_indexes,
        ..Default::default()
    };
    let costs = crate::bench::Costs::start();
    let out = crate::legacy::copy::copy(&pool, &mut redis, &tenant.id, &options, &Shutdown::new())
        .await?;
    let cost = costs.report(out.rows_read.max(0) as u64, "rows");
    let verified = Instant::now();
    let report = crate::legacy::verify::verify(&pool, &mut redis, &tenant.id).await?;
    let verify_time = verified.elapsed();
    let mut h = crate::bench::histogram();
    for t in &out.batch_times {
        h.record(t.as_micros().max(1) as u64).ok();
    }
    println!(
        "plan: {} months, {:.2}s",
        plan.months.len(),
        plan_time.as_secs_f64()
    );
    println!(
        "copy: {} rows in {} batches of {} in {:.2}s = {:.0} rows/s ({} job(s), {}; {} month(s) indexed after their load in {:.2}s)",
        out.rows_read,
        out.batches,
        args.batch_size,
        out.elapsed.as_secs_f64(),
        out.rows_per_sec(),
        options.jobs.clamp(1, crate::legacy::copy::JOBS_MAX),
        if args.keep_indexes { "indexes kept" } else { "past months bulk-loaded" },
        out.months_indexed,
        out.index_time.as_secs_f64()
    );
    println!("batch latency: {}", crate::bench::summary(&h));
    println!("copy {cost}");
    println!(
        "verify: {} in {:.2}s",
        if report.ok() { "VERIFIED" } else { "FAILED" },
        verify_time.as_secs_f64()
    );
    if !args.keep {
        pool.close().await;
        let options: sqlx::mysql::MySqlConnectOptions = tenant.mysql(&config.mysql).url.parse()?;
        let mut server =
            <sqlx::MySqlConnection as sqlx::Connection>::connect_with(&options).await?;
        sqlx::query(&format!("DROP DATABASE `{}`", tenant.database))
            .execute(&mut server)
            .await?;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("im:{{{}:*", tenant.id))
            .query_async(&mut redis)
            .await?;
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL").arg(keys).query_async(&mut redis).await?;
        }
    }
    Ok(())
}
