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
                    for b in backlog {
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
