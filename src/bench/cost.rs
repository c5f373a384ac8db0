//! What a figure cost: CPU-seconds of the whole box and of each process
//! that serves it (imstream processes, Kafka, MariaDB, Redis, and
//! Centrifugo when `bench fanout` compares against it), with the
//! load generator's own CPU apart. On a shared, noisy 2-core box the
//! CPU-seconds per 1,000 messages is the figure that stays comparable from
//! run to run, not the latency.

use std::collections::BTreeMap;

/// USER_HZ on Linux: `/proc` counts CPU time in hundredths of a second.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time the whole machine spent (user + system + irq + softirq, every
/// process) since `start`.
pub struct BoxCpu(u64);

impl BoxCpu {
    pub fn start() -> BoxCpu {
        BoxCpu(busy_ticks())
    }

    pub fn seconds(&self) -> f64 {
        busy_ticks().saturating_sub(self.0) as f64 / TICKS_PER_SECOND
    }
}

fn busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    // user nice system idle iowait irq softirq steal …
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    at(0) + at(1) + at(2) + at(5) + at(6)
}

/// A measured window: the box's CPU and each serving process's, from
/// `start` to `report`.
pub struct Costs {
    machine: BoxCpu,
    processes: BTreeMap<i32, (String, u64)>,
    own: u64,
}

impl Costs {
    pub fn start() -> Costs {
        Costs {
            machine: BoxCpu::start(),
            processes: serving_processes(),
            own: process_ticks(std::process::id() as i32).unwrap_or(0),
        }
    }

    /// The box's CPU-seconds since `start`.
    pub fn box_seconds(&self) -> f64 {
        self.machine.seconds()
    }

    /// CPU-seconds of this process since `start` (for a benchmark that does
    /// the measured work in-process, its cost without the box's noise).
    pub fn own_seconds(&self) -> f64 {
        process_ticks(std::process::id() as i32)
            .unwrap_or(0)
            .saturating_sub(self.own) as f64
            / TICKS_PER_SECOND
    }

    /// Box CPU-seconds per 1,000 `units` (messages, deliveries, requests).
    pub fn per_thousand(&self, units: u64) -> f64 {
        self.box_seconds() * 1000.0 / units.max(1) as f64
    }

    /// Lines like `cpu  box 12.3 s = 4.10 s per 1,000 messages; imstream
    /// dev 6.1 s (2.03), kafka 2.0 s (0.67) …; load generator 1.2 s`.
    /// Processes that started during the window are not counted.
    pub fn report(&self, units: u64, unit: &str) -> String {
        let per = |s: f64| Sig(s * 1000.0 / units.max(1) as f64);
        let total = self.box_seconds();
        let mut parts = Vec::new();
        let mut counted = 0.0;
        for (label, s) in &self.by_label() {
            counted += s;
            parts.push(format!("{label} {s:.2} s ({})", per(*s)));
        }
        let own = self.own_seconds();
        let kernel_and_rest = (total - counted - own).max(0.0);
        format!(
            "cpu: box {total:.2} s = {} s per 1,000 {unit}; serving: {}; \
             load generator {own:.2} s ({}); kernel and the rest {kernel_and_rest:.2} s",
            per(total),
            if parts.is_empty() {
                "none found".to_string()
            } else {
                parts.join(", ")
            },
            per(own),
        )
    }

    /// The window so far in three figures: the box, the serving processes
    /// whose label `serves` accepts (those of the system measured, not the
    /// idle others on the box), and the load generator.
    pub fn figures(&self, serves: impl Fn(&str) -> bool) -> CostFigures {
        CostFigures {
            box_seconds: self.box_seconds(),
            serving_seconds: self
                .by_label()
                .iter()
                .filter(|(label, _)| serves(label))
                .map(|(_, s)| s)
                .sum(),
            load_generator_seconds: self.own_seconds(),
        }
    }

    /// CPU-seconds since `start` per serving process label. Same-named
    /// processes (two gateways) are summed under one label only when their
    /// labels are equal; labels carry the listen port.
    fn by_label(&self) -> BTreeMap<String, f64> {
        let mut by_label: BTreeMap<String, f64> = BTreeMap::new();
        for (pid, (label, before)) in &self.processes {
            if let Some(now) = process_ticks(*pid) {
                *by_label.entry(label.clone()).or_default() +=
                    now.saturating_sub(*before) as f64 / TICKS_PER_SECOND;
            }
        }
        by_label
    }
}

/// CPU-seconds of a measured window (see [`Costs::figures`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CostFigures {
    pub box_seconds: f64,
    pub serving_seconds: f64,
    pub load_generator_seconds: f64,
}

/// A figure with three significant digits (0.0112, 1.85, 18.9).
struct Sig(f64);

impl std::fmt::Display for Sig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        let decimals = if v == 0.0 || !v.is_finite() {
            2
        } else {
            (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize
        };
        write!(f, "{v:.decimals$}")
    }
}

/// CPU ticks (user + system) a process spent so far.
fn process_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: fields after
    // the last ')' are state, ppid, …, utime (14th field), stime (15th).
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The processes a benchmark's figure depends on, by pid, with a label:
/// every other `imstream` process (by its subcommand and listen address),
/// Kafka, MariaDB/MySQL, Redis and Centrifugo.
fn serving_processes() -> BTreeMap<i32, (String, u64)> {
    let me = std::process::id() as i32;
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let Some(label) = label_of(&args) else {
            continue;
        };
        if let Some(ticks) = process_ticks(pid) {
            out.insert(pid, (label, ticks));
        }
    }
    out
}

/// What a command line is, for the report; `None` for what does not serve.
fn label_of(args: &[String]) -> Option<String> {
    let program = args.first()?;
    let name = program.rsplit('/').next().unwrap_or(program);
    match name {
        "imstream" => {
            const SUBCOMMANDS: &[&str] = &["dev", "gateway", "project", "shards", "registry"];
            let sub = args
                .iter()
                .skip(1)
                .find(|a| SUBCOMMANDS.contains(&a.as_str()))?;
            let listen = args
                .windows(2)
                .find(|w| w[0] == "--listen")
                .map(|w| format!(" {}", w[1]));
            // `project <pipeline>`: the pipeline's name.
            let pipeline = (sub == "project")
                .then(|| {
                    args.iter()
                        .skip_while(|a| *a != "project")
                        .nth(1)
                        .filter(|p| !p.starts_with('-'))
                        .map(|p| format!(" {p}"))
                })
                .flatten();
            Some(format!(
                "imstream {sub}{}{}",
                pipeline.unwrap_or_default(),
                listen.unwrap_or_default()
            ))
        }
        n if n.starts_with("redis-server") => Some("redis".into()),
        "mariadbd" | "mysqld" => Some("mariadb".into()),
        // The comparison's baseline, started by `bench fanout --compare-centrifugo`.
        "centrifugo" => Some("centrifugo".into()),
        "java" if args.iter().any(|a| a.contains("kafka")) => Some("kafka".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn labels_name_what_serves() {
        assert_eq!(
            label_of(&args("target/release/imstream --config c.toml dev")).as_deref(),
            Some("imstream dev")
        );
        assert_eq!(
            label_of(&args(
                "/x/imstream --config c.toml gateway --listen 127.0.0.1:6061 --insecure-dev-secrets"
            ))
            .as_deref(),
            Some("imstream gateway 127.0.0.1:6061")
        );
        assert_eq!(
            label_of(&args("imstream project store")).as_deref(),
            Some("imstream project store")
        );
        assert_eq!(
            label_of(&args("/usr/sbin/mariadbd --defaults-file=x")).as_deref(),
            Some("mariadb")
        );
        assert_eq!(
            label_of(&args("java -cp /k/kafka-server.jar kafka.Kafka")).as_deref(),
            Some("kafka")
        );
        // Redis rewrites its argv into one string.
        assert_eq!(
            label_of(&["redis-server 127.0.0.1:16379".to_string()]).as_deref(),
            Some("redis")
        );
        assert_eq!(
            label_of(&args(
                "/r/.stack/bin/centrifugo --config /tmp/c/config.json"
            ))
            .as_deref(),
            Some("centrifugo")
        );
        // The benchmark itself and unrelated programs are not serving.
        assert_eq!(label_of(&args("imstream --config c.toml bench send")), None);
        assert_eq!(label_of(&args("java -jar other.jar")), None);
        assert_eq!(label_of(&args("bash")), None);
    }

    #[test]
    fn figures_keep_three_significant_digits() {
        assert_eq!(Sig(0.011234).to_string(), "0.0112");
        assert_eq!(Sig(1.8512).to_string(), "1.85");
        assert_eq!(Sig(18.86).to_string(), "18.9");
        assert_eq!(Sig(0.0).to_string(), "0.00");
    }

    #[test]
    fn this_process_has_cpu_ticks() {
        let t = process_ticks(std::process::id() as i32);
        assert!(t.is_some(), "our own /proc stat is readable");
        assert_eq!(process_ticks(i32::MAX), None);
    }
}
