//! What the fan-out benchmarks share, whichever server delivers: the
//! open-loop publishing schedule (every message carries its *scheduled*
//! send time as `fb:<micros>`), the per-session delivery latencies
//! gathered into one histogram, and the printed outcome: the summary lines
//! of one run and the side-by-side table of several (`bench fanout
//! --compare-centrifugo`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::cost::CostFigures;

/// Histograms the receivers record into, so that ten thousand sessions do
/// not queue on one lock.
const SHARDS: usize = 64;

/// What a published message's content starts with; the digits after it are
/// the message's scheduled send time in microseconds since the epoch.
const MARK: &str = "fb:";

/// The mark as it opens a JSON string, searched for in every frame.
const QUOTED_MARK: &str = "\"fb:";

/// The content of the message scheduled at `scheduled_micros`.
pub fn content(scheduled_micros: i64) -> String {
    format!("{MARK}{scheduled_micros}")
}

/// The scheduled send time carried in a frame (`…"fb:<micros>"…`): the
/// first one, so a frame holding several messages is split first.
pub fn sent_micros(frame: &str) -> Option<i64> {
    let at = frame.find(QUOTED_MARK)? + QUOTED_MARK.len();
    let digits = &frame[at..];
    let end = digits.find(|c: char| !c.is_ascii_digit())?;
    digits[..end].parse().ok()
}

/// Microseconds since the epoch: the clock both the schedule and the
/// receivers read.
pub fn now_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// Delivery latencies of every session, and how many deliveries there were.
pub struct Deliveries {
    shards: Vec<Mutex<Histogram<u64>>>,
    delivered: AtomicU64,
}

impl Default for Deliveries {
    fn default() -> Self {
        Deliveries {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(super::histogram()))
                .collect(),
            delivered: AtomicU64::new(0),
        }
    }
}

impl Deliveries {
    /// Session `session` received the message scheduled at `sent_micros` now.
    pub fn record(&self, session: usize, sent_micros: i64) {
        self.record_at(session, sent_micros, now_micros());
    }

    /// … received it at `received_micros`. A latency is at least 1 µs (the
    /// clocks are the same, but a message may arrive within its own
    /// microsecond) and at most the histogram's 60 s.
    pub fn record_at(&self, session: usize, sent_micros: i64, received_micros: i64) {
        let latency = (received_micros - sent_micros).clamp(1, 60_000_000) as u64;
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shards[session % SHARDS]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Within the bounds by the clamp above.
        let _ = shard.record(latency);
    }

    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Every session's latencies in one histogram (µs).
    pub fn latencies(&self) -> Histogram<u64> {
        let mut total = super::histogram();
        for shard in &self.shards {
            let shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            total.add(&*shard).expect("same bounds");
        }
        total
    }
}

/// What an open-loop publishing run did.
pub struct Published {
    pub sent: u64,
    /// From the first scheduled send to the last send's return.
    pub seconds: f64,
}

/// An open-loop publishing schedule: message `n` is due at
/// `first + n / rate` and carries that time, so a stalled sender or server
/// shows in the latencies instead of hiding.
pub struct OpenLoop {
    interval: Duration,
    first_micros: i64,
    at: tokio::time::Instant,
    end: tokio::time::Instant,
    sent: u64,
    started: Instant,
}

impl OpenLoop {
    /// `rate` messages per second, the first now, none due at or after `end`.
    pub fn new(rate: u64, end: tokio::time::Instant) -> anyhow::Result<OpenLoop> {
        anyhow::ensure!(rate > 0, "--rate must be at least 1");
        Ok(OpenLoop {
            interval: Duration::from_secs_f64(1.0 / rate as f64),
            first_micros: now_micros(),
            at: tokio::time::Instant::now(),
            end,
            sent: 0,
            started: Instant::now(),
        })
    }

    /// Waits until the next message is due: its number and its content;
    /// `None` once the schedule is over.
    pub async fn next(&mut self) -> Option<(u64, String)> {
        if self.at >= self.end {
            return None;
        }
        tokio::time::sleep_until(self.at).await;
        let n = self.sent;
        let scheduled = self.first_micros + n as i64 * self.interval.as_micros() as i64;
        self.sent += 1;
        self.at += self.interval;
        Some((n, content(scheduled)))
    }

    /// What was published, once the last message is sent.
    pub fn published(&self) -> Published {
        Published {
            sent: self.sent,
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// One system's figures for the comparison table.
pub struct Outcome {
    /// `imstream`, `centrifugo memory`, `centrifugo redis`.
    pub system: String,
    pub published: Published,
    pub expected: u64,
    pub delivered: u64,
    /// Delivery latencies, µs.
    pub latency: Histogram<u64>,
    pub cost: CostFigures,
}

impl Outcome {
    /// The lines a single run prints (the `cpu:` line is the caller's:
    /// it names every serving process).
    pub fn summary(&self) -> String {
        format!(
            "published {} messages in {:.1} s; deliveries {} of {} expected\n\
             end-to-end delivery latency: {}\n\
             deliveries per second: {:.0}",
            self.published.sent,
            self.published.seconds,
            self.delivered,
            self.expected,
            super::summary(&self.latency),
            self.per_second(),
        )
    }

    fn per_second(&self) -> f64 {
        self.delivered as f64 / self.published.seconds.max(f64::EPSILON)
    }

    fn row(&self) -> [String; 8] {
        let ms = |q: f64| {
            format!(
                "{:.1} ms",
                self.latency.value_at_quantile(q) as f64 / 1000.0
            )
        };
        let per_thousand = |s: f64| s * 1000.0 / self.delivered.max(1) as f64;
        [
            self.system.clone(),
            format!("{}/{}", self.delivered, self.expected),
            ms(0.5),
            ms(0.99),
            format!("{:.0}", self.per_second()),
            format!("{:.4}", per_thousand(self.cost.box_seconds)),
            format!("{:.4}", per_thousand(self.cost.serving_seconds)),
            format!(
                "{:.2} ({:.4})",
                self.cost.load_generator_seconds,
                per_thousand(self.cost.load_generator_seconds)
            ),
        ]
    }
}

/// The outcomes side by side, as a Markdown table.
pub fn table(outcomes: &[Outcome]) -> String {
    const HEADER: [&str; 8] = [
        "engine",
        "delivered/expected",
        "p50",
        "p99",
        "deliveries/s",
        "box CPU-s per 1,000",
        "server CPU-s per 1,000",
        "load-gen CPU-s (per 1,000)",
    ];
    let rows: Vec<[String; 8]> = outcomes.iter().map(Outcome::row).collect();
    let line = |cells: &[&str]| format!("| {} |", cells.join(" | "));
    let mut out = vec![line(&HEADER), line(&["---"; 8])];
    for row in &rows {
        out.push(line(&row.iter().map(String::as_str).collect::<Vec<_>>()));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_scheduled_time_in_a_frame() {
        assert_eq!(
            sent_micros(r#"{"data":{"content":"fb:1234567","seq":1}}"#),
            Some(1234567)
        );
        assert_eq!(
            sent_micros(r#"{"push":{"channel":"b:f","pub":{"data":{"content":"fb:42"}}}}"#),
            Some(42)
        );
        assert_eq!(sent_micros(r#"{"data":{"content":"hello"}}"#), None);
        // The mark must open a JSON string: a topic named like it is no match.
        assert_eq!(sent_micros(r#"{"data":{"topic":"xfb:12"}}"#), None);
        assert_eq!(content(1234567), "fb:1234567");
        assert_eq!(sent_micros(&format!("\"{}\"", content(99))), Some(99));
    }

    #[test]
    fn latencies_are_receive_minus_scheduled_time() {
        let d = Deliveries::default();
        d.record_at(0, 1_000_000, 1_002_000);
        d.record_at(1, 1_000_000, 1_010_000);
        d.record_at(65, 1_000_000, 1_000_000); // same microsecond: 1 µs
        d.record_at(2, 0, 120_000_000); // beyond the bounds: 60 s
        let h = d.latencies();
        assert_eq!(d.delivered(), 4);
        assert_eq!(h.len(), 4);
        assert_eq!(h.min(), 1);
        assert!(h.equivalent(h.max(), 60_000_000));
        assert!(h.equivalent(h.value_at_quantile(0.5), 2_000));
    }

    #[tokio::test]
    async fn schedule_carries_each_message_due_time() {
        // 100 per second for 50 ms: due at 0, 10, 20, 30 and 40 ms.
        let end = tokio::time::Instant::now() + Duration::from_millis(50);
        let mut schedule = OpenLoop::new(100, end).unwrap();
        let mut due = Vec::new();
        while let Some((n, content)) = schedule.next().await {
            due.push((n, sent_micros(&format!("\"{content}\"")).unwrap()));
        }
        assert_eq!(due.len(), 5, "due times: {due:?}");
        let first = due[0].1;
        for (n, at) in &due {
            assert_eq!(
                at - first,
                *n as i64 * 10_000,
                "message {n} is due 10 ms after the last"
            );
        }
        assert_eq!(schedule.published().sent, 5);
        assert!(OpenLoop::new(0, end).is_err());
    }

    #[test]
    fn table_has_one_row_per_system() {
        let mut latency = crate::bench::histogram();
        latency.record(2_500).unwrap();
        let outcome = Outcome {
            system: "centrifugo memory".into(),
            published: Published {
                sent: 200,
                seconds: 10.0,
            },
            expected: 2_000_000,
            delivered: 2_000_000,
            latency,
            cost: CostFigures {
                box_seconds: 20.0,
                serving_seconds: 8.0,
                load_generator_seconds: 10.0,
            },
        };
        let t = table(&[outcome]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("| engine | delivered/expected | p50 | p99 |"));
        assert_eq!(
            lines[2],
            "| centrifugo memory | 2000000/2000000 | 2.5 ms | 2.5 ms | 200000 | 0.0100 | 0.0040 | 10.00 (0.0050) |"
        );
    }
}
