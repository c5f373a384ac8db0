//! Waiting until the pipelines applied everything produced so far: every
//! running pipeline's consumer group has committed up to the end of its
//! source topic, twice in a row (one pipeline's output may be another's
//! input). Pipelines commit what they handled within 200 ms.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::BaseConsumer;

pub struct Settle {
    probes: Vec<(String, String, Arc<BaseConsumer>)>,
}

impl Settle {
    pub fn new(config: &imstream::config::Config, pipelines: &[&str]) -> Settle {
        let probes = pipelines
            .iter()
            .map(|name| {
                let topology = imstream::pipeline::load_topology(config, name).expect("topology");
                let route =
                    imstream::pipeline::Route::main(config, &topology).expect("pipeline route");
                let probe = imstream::kafka::lag::group_probe(&config.kafka, &route.group)
                    .expect("lag probe");
                (name.to_string(), route.source, Arc::new(probe))
            })
            .collect();
        Settle { probes }
    }

    /// Records not yet applied, per pipeline.
    async fn lags(&self) -> Vec<(String, i64)> {
        let probes = self.probes.clone();
        tokio::task::spawn_blocking(move || {
            probes
                .iter()
                .map(|(name, topic, probe)| {
                    let lag = imstream::kafka::lag::backlog_with(probe, topic)
                        .map(|b| imstream::kafka::lag::total_lag(&b))
                        .unwrap_or(-1);
                    (name.clone(), lag)
                })
                .collect()
        })
        .await
        .expect("lag probe task")
    }

    /// Waits until nothing is left to apply; `Err` with the lags after
    /// `deadline`.
    pub async fn wait(&self, deadline: Duration) -> Result<(), String> {
        let start = Instant::now();
        let mut quiet = 0;
        loop {
            let lags = self.lags().await;
            if lags.iter().all(|(_, l)| *l == 0) {
                quiet += 1;
                if quiet == 2 {
                    return Ok(());
                }
            } else {
                quiet = 0;
            }
            if start.elapsed() > deadline {
                return Err(format!(
                    "pipelines still behind after {deadline:?}: {lags:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Records in each pipeline's dead-letter topic.
pub async fn dlq_depths(
    config: &imstream::config::Config,
    pipelines: &[&str],
) -> Vec<(String, i64)> {
    let config = config.clone();
    let pipelines: Vec<String> = pipelines.iter().map(|p| p.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        pipelines
            .iter()
            .map(|name| {
                let topology = imstream::pipeline::load_topology(&config, name).expect("topology");
                let route = imstream::pipeline::Route::main(&config, &topology).expect("route");
                let depth = imstream::kafka::lag::watermarks(
                    &config.kafka,
                    &format!("adversary-dlq-{}", uuid::Uuid::new_v4().simple()),
                    &route.dlq,
                )
                .map(|w| w.values().map(|(low, high)| high - low).sum())
                .unwrap_or(0);
                (name.clone(), depth)
            })
            .collect()
    })
    .await
    .expect("dlq probe task")
}
