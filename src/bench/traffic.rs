//! What a figure asked of Redis and MySQL (issue 42): Redis commands by
//! name (`INFO commandstats`) and the read events its server processed
//! (`total_reads_processed`: one per batch a client sends, so its round
//! trips), and MySQL statements and commits (`Questions`, `Com_commit`),
//! each per message. Counted on the servers, so every process that serves
//! the figure is in it (and whatever else uses them meanwhile: run the
//! bench on a quiet stack); the bench's own INFO calls are taken out, and
//! commands a script runs are counted one by one, as Redis counts them.
//! MySQL is the tenant database's server (a stack with the months on
//! other servers counts only this one's).

use std::collections::BTreeMap;

use crate::config::Config;

/// The servers' counters at one instant.
#[derive(Debug, Default, Clone)]
struct Counters {
    /// Calls by command name.
    commands: BTreeMap<String, u64>,
    reads: u64,
    statements: u64,
    commits: u64,
}

/// A measured window's Redis and MySQL traffic.
pub struct Traffic {
    /// One connection for both readings (a new one would add its own
    /// handshake to the window).
    redis: Option<redis::aio::MultiplexedConnection>,
    pool: sqlx::MySqlPool,
    /// `None` when a server did not answer at the start: the window's
    /// figures are then not known (never lifetime totals).
    start: Option<Counters>,
}

impl Traffic {
    pub async fn start(config: &Config, pool: &sqlx::MySqlPool) -> Traffic {
        let redis = match redis::Client::open(config.redis.url.as_str()) {
            Ok(client) => client.get_multiplexed_async_connection().await.ok(),
            Err(_) => None,
        };
        let mut t = Traffic {
            redis,
            pool: pool.clone(),
            start: None,
        };
        t.start = t.counters().await;
        t
    }

    async fn counters(&self) -> Option<Counters> {
        let mut c = Counters::default();
        let mut conn = self.redis.clone()?;
        let mut pipe = redis::pipe();
        pipe.cmd("INFO")
            .arg("commandstats")
            .cmd("INFO")
            .arg("stats");
        let (commands, stats) = pipe.query_async::<(String, String)>(&mut conn).await.ok()?;
        c.commands = command_calls(&commands);
        c.reads = field(&stats, "total_reads_processed");
        let status: Vec<(String, String)> =
            sqlx::query_as("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_commit')")
                .fetch_all(&self.pool)
                .await
                .ok()?;
        for (name, value) in status {
            let n = value.parse().unwrap_or(0);
            match name.as_str() {
                "Questions" => c.statements = n,
                "Com_commit" => c.commits = n,
                _ => {}
            }
        }
        Some(c)
    }

    /// Per `units` since `start` (`None`: a server did not answer).
    pub async fn per(&self, units: u64) -> Option<PerUnit> {
        let start = self.start.as_ref()?;
        let end = self.counters().await?;
        let per = |n: u64| n as f64 / units.max(1) as f64;
        let mut by_name: Vec<(String, u64)> = end
            .commands
            .iter()
            .map(|(name, n)| {
                let before = start.commands.get(name).copied().unwrap_or(0);
                // Redis counts a command once it has run: both INFOs of
                // the starting batch are in the window.
                let ours = 2 * u64::from(name == "info");
                (name.clone(), n.saturating_sub(before).saturating_sub(ours))
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        by_name.sort_by(|a, b| b.1.cmp(&a.1));
        let total: u64 = by_name.iter().map(|(_, n)| n).sum();
        // The closing INFO batch is one of the reads.
        let reads = end.reads.saturating_sub(start.reads).saturating_sub(1);
        Some(PerUnit {
            commands: per(total),
            round_trips: per(reads),
            top: by_name
                .iter()
                .take(8)
                .map(|(name, n)| (name.to_uppercase(), per(*n)))
                .collect(),
            statements: per(end.statements.saturating_sub(start.statements)),
            commits: per(end.commits.saturating_sub(start.commits)),
        })
    }
}

/// Traffic per message (or whatever unit the figure counts).
#[derive(Debug, Clone, Default)]
pub struct PerUnit {
    pub commands: f64,
    pub round_trips: f64,
    /// The commands most called, each per unit.
    pub top: Vec<(String, f64)>,
    pub statements: f64,
    pub commits: f64,
}

impl PerUnit {
    /// `redis 14.2 commands in 5.1 round trips per message (SET 3.00, …);
    /// mysql 2.10 statements, 0.20 commits per message`.
    pub fn line(&self, unit: &str) -> String {
        let top: Vec<String> = self
            .top
            .iter()
            .map(|(name, n)| format!("{name} {n:.2}"))
            .collect();
        format!(
            "redis {:.1} commands in {:.1} round trips per {unit} ({}); mysql {:.2} statements, {:.2} commits per {unit} (the bench's own progress queries included)",
            self.commands,
            self.round_trips,
            top.join(", "),
            self.statements,
            self.commits,
        )
    }
}

/// `cmdstat_<name>:calls=<n>,…` lines: calls by name (a subcommand as
/// `config|get`).
fn command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_string(), calls.parse().ok()?))
        })
        .collect()
}

/// The number after `name:` in an `INFO` section.
fn field(info: &str, name: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lines_are_read() {
        let info = "# Commandstats\r\ncmdstat_set:calls=7,usec=20,usec_per_call=2.86,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_config|get:calls=2,usec=5\r\ncmdstat_evalsha:calls=12,usec=100\r\n";
        let calls = command_calls(info);
        assert_eq!(calls.get("set"), Some(&7));
        assert_eq!(calls.get("config|get"), Some(&2));
        assert_eq!(calls.get("evalsha"), Some(&12));
        assert_eq!(calls.len(), 3);
        let stats = "# Stats\r\ntotal_reads_processed:38900\r\ntotal_reads_processed_x:1\r\n";
        assert_eq!(field(stats, "total_reads_processed"), 38900);
        assert_eq!(field(stats, "missing"), 0);
    }
}
