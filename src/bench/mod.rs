//! `imstream bench …`: load generators that print latency percentiles and
//! throughput against a running deployment (e.g. `docker/local/run`).
//! Benchmarks live here, never in tests.

pub mod client;
pub mod fanout;
pub mod history;
pub mod send;

use hdrhistogram::Histogram;

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
