//! The push sender's handler: delivers push tasks through a pluggable
//! sender — the log (default) or an HTTP webhook (`push.webhook_url`) —
//! once per task id. A provider that is unreachable or failing (5xx) is an
//! outage, retried until it answers; a task it refuses (4xx) is tried
//! again alone and then goes to the DLQ. It never touches messages.

use std::time::Duration;

use crate::redis_util::Redis;

use crate::config::PushConfig;
use crate::events::{EventCodec, PushTask};
use crate::keys::TenantKeys;
use crate::metrics as m;

use super::failure::{redis_failure, FailureKind};
use super::records::{apply_in_order, Handler, Record, RecordFailure};

/// A delivered task id is remembered this long.
const SENT_TTL_SECS: u64 = 7 * 24 * 3600;

/// Where push tasks go.
pub enum PushSender {
    /// Logs each task (development, tests).
    Log,
    /// POSTs each task as JSON.
    Webhook {
        client: reqwest::Client,
        url: String,
    },
}

impl PushSender {
    pub fn from_config(config: &PushConfig) -> anyhow::Result<Self> {
        if config.webhook_url.is_empty() {
            return Ok(PushSender::Log);
        }
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.timeout_ms))
            .build()?;
        Ok(PushSender::Webhook {
            client,
            url: config.webhook_url.clone(),
        })
    }

    async fn send(&self, task: &PushTask) -> Result<(), (FailureKind, String)> {
        match self {
            PushSender::Log => {
                // Per task at debug: a storm of tasks must not become a
                // storm of log lines (the batch is logged once below).
                tracing::debug!(tenant = %task.tenant_id, topic = %task.topic, seq = task.seq, to = task.recipient_uid, "push");
                Ok(())
            }
            PushSender::Webhook { client, url } => {
                let resp = client
                    .post(url)
                    .json(&serde_json::json!({
                        "task_id": task.task_id,
                        "tenant": task.tenant_id,
                        "topic": task.topic,
                        "seq": task.seq,
                        "sender": task.sender_uid,
                        "recipient": task.recipient_uid,
                    }))
                    .send()
                    .await
                    // Not reached, or no answer in time: the provider is out.
                    .map_err(|e| (FailureKind::Outage, format!("webhook: {e}")))?;
                let status = resp.status();
                if status.is_success() {
                    Ok(())
                } else {
                    Err((
                        webhook_failure(status),
                        format!("webhook answered {status}"),
                    ))
                }
            }
        }
    }
}

pub struct PushSendHandler {
    codec: EventCodec,
    redis: Redis,
    sender: PushSender,
}

impl PushSendHandler {
    pub fn new(codec: EventCodec, redis: Redis, sender: PushSender) -> Self {
        Self {
            codec,
            redis,
            sender,
        }
    }

    async fn deliver(&self, task: &PushTask) -> Result<(), (FailureKind, String)> {
        let mut redis = self.redis.clone();
        let key = TenantKeys::new(&task.tenant_id).push_sent(&task.task_id);
        let first: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .arg("NX")
            .arg("EX")
            .arg(SENT_TTL_SECS)
            .query_async(&mut redis)
            .await
            .map_err(|e| (redis_failure(&e), format!("redis: {e}")))?;
        if first.is_none() {
            metrics::counter!(m::PUSH_SENT_TOTAL, "status" => "duplicate").increment(1);
            return Ok(());
        }
        match self.sender.send(task).await {
            Ok(()) => {
                metrics::counter!(m::PUSH_SENT_TOTAL, "status" => "ok").increment(1);
                Ok(())
            }
            Err(why) => {
                // Not delivered: let the retry deliver it.
                let _: redis::RedisResult<()> =
                    redis::cmd("DEL").arg(&key).query_async(&mut redis).await;
                metrics::counter!(m::PUSH_SENT_TOTAL, "status" => "failed").increment(1);
                Err(why)
            }
        }
    }
}

/// A provider's refusal: overloaded or failing (5xx, 429, 408) is an
/// outage, waited out; any other answer refuses this task for good (an
/// expired device token, a malformed task) and sends it to the DLQ.
fn webhook_failure(status: reqwest::StatusCode) -> FailureKind {
    FailureKind::from_transient(
        status.is_server_error()
            || status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT,
    )
}

impl Handler for PushSendHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        // A recipient's tasks are delivered in log order.
        let outcome = apply_in_order(&self.codec, records, |task: PushTask| async move {
            self.deliver(&task).await
        })
        .await;
        let failed = outcome.as_ref().map_or_else(Vec::len, |_| 0);
        tracing::info!(
            tasks = records.len() - failed.min(records.len()),
            failed,
            "pushsend: batch delivered"
        );
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_provider_is_an_outage_and_a_refused_task_is_poison() {
        use reqwest::StatusCode as S;
        for s in [S::SERVICE_UNAVAILABLE, S::BAD_GATEWAY, S::TOO_MANY_REQUESTS] {
            assert_eq!(webhook_failure(s), FailureKind::Outage, "{s}");
        }
        for s in [S::GONE, S::BAD_REQUEST, S::NOT_FOUND] {
            assert_eq!(webhook_failure(s), FailureKind::Poison, "{s}");
        }
    }
}
