//! Replaying a pipeline's DLQ (`imstream dlq replay <pipeline>`): once the
//! cause is fixed (a month table created, a bug deployed away), the records
//! the pipeline gave up on are run through the same handler again.
//!
//! The replay is an ordinary run of the pipeline (same handler, same
//! retries) whose source is the DLQ topic `<topic>.<pipeline>.dlq`, read as
//! consumer group `<group_prefix>.<pipeline>.dlq-replay`. An outage during
//! the replay is waited out like in the live pipeline; a record refused
//! again goes back to the end of the same DLQ, with the new reason:
//! nothing is dropped, and the next replay sees it again. Handlers are
//! idempotent, so replaying a record that was already handled is harmless.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::Config;
use crate::kafka::lag;
use crate::shutdown::Shutdown;

use super::{load_topology, run_route, Route, Topology};

/// The consumer group that replays `pipeline`'s DLQ.
pub fn replay_group(config: &Config, pipeline: &str) -> String {
    format!("{}.{pipeline}.dlq-replay", config.pipelines.group_prefix)
}

/// The replay route of a topology: its DLQ in, the same DLQ for records
/// that fail again.
pub fn replay_route(config: &Config, topology: &Topology) -> anyhow::Result<Route> {
    let main = Route::main(config, topology)?;
    Ok(Route {
        source: main.dlq.clone(),
        group: replay_group(config, &topology.name),
        dlq: main.dlq,
    })
}

/// Replays `pipeline`'s DLQ (topology from `topologies/<pipeline>.toml`,
/// else the built-in copy) until `shutdown`, following new DLQ records.
pub async fn replay_dlq(config: &Config, pipeline: &str, shutdown: Shutdown) -> anyhow::Result<()> {
    let topology = load_topology(config, pipeline)?;
    replay_dlq_topology(config, &topology, shutdown).await
}

/// [`replay_dlq`] with an explicit topology (tests use short backoffs).
pub async fn replay_dlq_topology(
    config: &Config,
    topology: &Topology,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let route = replay_route(config, topology)?;
    tracing::info!(pipeline = %topology.name, dlq = %route.source, group = %route.group, "replaying DLQ");
    run_route(config, topology, &route, shutdown).await
}

/// What [`replay_until_drained`] went through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drained {
    /// DLQ records that were waiting when the replay started.
    pub records: i64,
}

/// Replays every record that is in the DLQ now, then stops (records that
/// fail again land after that point and wait for the next replay). Ends
/// early on `shutdown`.
pub async fn replay_until_drained(
    config: &Config,
    pipeline: &str,
    shutdown: Shutdown,
) -> anyhow::Result<Drained> {
    let topology = load_topology(config, pipeline)?;
    let route = replay_route(config, &topology)?;
    let (cfg, r) = (config.clone(), route.clone());
    let targets =
        tokio::task::spawn_blocking(move || lag::watermarks(&cfg.kafka, &r.group, &r.source))
            .await??;
    let waiting = pending(&targets, &BTreeMap::new());
    if waiting == 0 {
        tracing::info!(pipeline, dlq = %route.source, "DLQ is empty; nothing to replay");
        return Ok(Drained::default());
    }
    let replay = shutdown.child();
    let task = {
        let (config, topology, replay) = (config.clone(), topology.clone(), replay.clone());
        tokio::spawn(async move { replay_dlq_topology(&config, &topology, replay).await })
    };
    let mut task = std::pin::pin!(task);
    loop {
        tokio::select! {
            result = &mut task => {
                // The replay stopped on its own (shutdown or an error).
                result??;
                return Ok(Drained { records: waiting });
            }
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let (cfg, r) = (config.clone(), route.clone());
        let committed = match tokio::task::spawn_blocking(move || {
            lag::committed(&cfg.kafka, &r.group, &r.source)
        })
        .await?
        {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "reading the replay's committed offsets failed; retrying");
                continue;
            }
        };
        let left = pending(&targets, &committed);
        tracing::debug!(pipeline, left, "DLQ replay progress");
        if left == 0 {
            replay.trigger();
            task.await??;
            tracing::info!(pipeline, records = waiting, "DLQ replayed");
            return Ok(Drained { records: waiting });
        }
    }
}

/// Records between `committed` (or the log start) and `targets`.
fn pending(targets: &BTreeMap<i32, (i64, i64)>, committed: &BTreeMap<i32, i64>) -> i64 {
    targets
        .iter()
        .map(|(p, (low, high))| {
            let from = committed.get(p).copied().unwrap_or(*low).max(*low);
            (high - from).max(0)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_reads_the_dlq_and_sends_failures_back_to_it() {
        let mut config = Config::default();
        config.kafka.topic_prefix = "t1.".into();
        config.pipelines.group_prefix = "g".into();
        let topology = Topology::builtin("store").unwrap();
        let route = replay_route(&config, &topology).unwrap();
        assert_eq!(route.source, "t1.im.group.events.v1.store.dlq");
        assert_eq!(route.dlq, route.source);
        assert_eq!(route.group, "g.store.dlq-replay");
    }

    #[test]
    fn pending_counts_from_the_committed_offset_or_the_log_start() {
        let targets = BTreeMap::from([(0, (0, 5)), (1, (3, 4))]);
        assert_eq!(pending(&targets, &BTreeMap::new()), 6);
        assert_eq!(pending(&targets, &BTreeMap::from([(0, 5)])), 1);
        assert_eq!(pending(&targets, &BTreeMap::from([(0, 5), (1, 4)])), 0);
    }
}
