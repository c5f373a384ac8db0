//! The consumer-lag gauge of a running pipeline: every few seconds, the
//! records of each source partition its group has not committed
//! (`imstream_pipeline_consumer_lag{pipeline, source, partition}`).

use std::time::Duration;

use crate::config::KafkaConfig;
use crate::kafka::lag;
use crate::metrics as m;
use crate::shutdown::Shutdown;

/// How often the lag is read.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// Reports `group`'s lag on `source` until `shutdown`.
pub fn spawn(
    kafka: KafkaConfig,
    pipeline: String,
    source: String,
    group: String,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    spawn_reader(kafka, pipeline, source, group, None, shutdown)
}

/// Reports the dead letters of `dlq` that the replay group `replay_group`
/// has not handled (`imstream_pipeline_dlq_pending{pipeline, source}`, one
/// sum over the DLQ's partitions) until `shutdown`.
pub fn spawn_dlq(
    kafka: KafkaConfig,
    pipeline: String,
    source: String,
    dlq: String,
    replay_group: String,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    spawn_reader(kafka, pipeline, dlq, replay_group, Some(source), shutdown)
}

/// A live pipeline's gauges: its group's lag on `source` and, unless it
/// reads its own DLQ (a DLQ replay), the dead letters no replay has
/// handled yet (alert `DeadLettersWaiting`). Aborted together on drop.
pub struct Gauges(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Gauges {
    fn drop(&mut self) {
        for g in &self.0 {
            g.abort();
        }
    }
}

pub fn spawn_gauges(
    config: &crate::config::Config,
    pipeline: &str,
    source: &str,
    group: &str,
    dlq: &str,
    shutdown: &Shutdown,
) -> Gauges {
    let mut all = vec![spawn(
        config.kafka.clone(),
        pipeline.to_string(),
        source.to_string(),
        group.to_string(),
        shutdown.clone(),
    )];
    if source != dlq {
        all.push(spawn_dlq(
            config.kafka.clone(),
            pipeline.to_string(),
            source.to_string(),
            dlq.to_string(),
            super::dlq::replay_group(config, pipeline),
            shutdown.clone(),
        ));
    }
    Gauges(all)
}

/// The loop of [`spawn`] (`dlq_of`: `None`) and [`spawn_dlq`] (`dlq_of`:
/// the pipeline's source, `topic` its DLQ).
fn spawn_reader(
    kafka: KafkaConfig,
    pipeline: String,
    source: String,
    group: String,
    dlq_of: Option<String>,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // One probe for the pipeline's life (opened again after a failure):
        // a new client every interval was most of an idle pipeline's CPU,
        // and the broker's.
        let mut probe: Option<std::sync::Arc<rdkafka::consumer::BaseConsumer>> = None;
        loop {
            let (k, s, g, p) = (kafka.clone(), source.clone(), group.clone(), probe.take());
            let read = tokio::task::spawn_blocking(move || {
                let p = match p {
                    Some(p) => p,
                    None => std::sync::Arc::new(lag::group_probe(&k, &g)?),
                };
                lag::backlog_with(&p, &s).map(|backlog| (backlog, p))
            })
            .await;
            match read {
                Ok(Ok((backlog, p))) => {
                    probe = Some(p);
                    if let Some(main) = &dlq_of {
                        metrics::gauge!(m::PIPELINE_DLQ_PENDING,
                            "pipeline" => pipeline.clone(),
                            "source" => main.clone())
                        .set(lag::total_lag(&backlog) as f64);
                    }
                    for b in backlog.iter().filter(|_| dlq_of.is_none()) {
                        metrics::gauge!(m::PIPELINE_LAG,
                            "pipeline" => pipeline.clone(),
                            "source" => source.clone(),
                            "partition" => b.partition.to_string())
                        .set(b.lag() as f64);
                    }
                }
                Ok(Err(e)) => tracing::debug!(%pipeline, error = %e, "reading consumer lag failed"),
                Err(e) => tracing::debug!(%pipeline, error = %e, "consumer lag task failed"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(INTERVAL) => {}
            }
        }
    })
}
