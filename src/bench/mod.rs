//! `imstream bench …`: load generators that print latency percentiles and
//! throughput against a running deployment (e.g. `docker/local/run`).
//! Benchmarks live here, never in tests.

pub mod centrifugo;
pub mod client;
pub mod conversations;
pub mod cost;
pub mod deliveries;
pub mod fanout;
pub mod files;
pub mod history;
pub mod legacy;
pub mod recovery;
pub mod search;
pub mod send;
pub mod traffic;

use hdrhistogram::Histogram;

pub use cost::{BoxCpu, Costs};

use crate::auth::Tokens;
use crate::config::Config;

/// What every benchmark starts from: its tenant, that tenant's database,
/// a token minter, and a short run id that keeps its names unique.
pub struct Setup {
    pub tenant: String,
    pub pool: sqlx::MySqlPool,
    pub tokens: Tokens,
    pub run: String,
}

impl Setup {
    /// `tenant`, or the first configured one.
    pub fn new(config: &Config, tenant: Option<&str>) -> anyhow::Result<Setup> {
        let tenant = match tenant {
            Some(t) => t.to_string(),
            None => config
                .tenants
                .first()
                .map(|t| t.id.clone())
                .ok_or_else(|| anyhow::anyhow!("no tenant configured"))?,
        };
        let t = config
            .tenant(&tenant)
            .ok_or_else(|| anyhow::anyhow!("unknown tenant {tenant}"))?;
        Ok(Setup {
            pool: crate::tenant::pool_of(config, t)?,
            tokens: Tokens::new(&config),
            run: uuid::Uuid::new_v4().simple().to_string()[..8].to_string(),
            tenant,
        })
    }
}

/// A latency histogram in microseconds, 1 µs to 60 s.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds")
}

/// `p50 1.23 ms  p90 …` for a histogram in microseconds.
pub fn summary(h: &Histogram<u64>) -> String {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    format!(
        "n={}  p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
        h.len(),
        ms(0.5),
        ms(0.9),
        ms(0.99),
        ms(0.999),
        h.max() as f64 / 1000.0
    )
}
