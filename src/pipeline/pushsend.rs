//! The push sender's handler: delivers push tasks through a pluggable
//! sender — the log (default) or an HTTP webhook (`push.webhook_url`) —
//! once per task id. A failed delivery is retried with backoff and then
//! goes to the DLQ; it never touches messages.

use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::config::PushConfig;
use crate::events::{EventCodec, PushTask};
use crate::keys::TenantKeys;
use crate::metrics as m;

use super::runner::{decode_all, outcome, Handler, Record, RecordFailure};

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

    async fn send(&self, task: &PushTask) -> Result<(), String> {
        match self {
            PushSender::Log => {
                tracing::info!(tenant = %task.tenant_id, topic = %task.topic, seq = task.seq, to = task.recipient_uid, "push");
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
                    .map_err(|e| format!("webhook: {e}"))?;
                if resp.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("webhook answered {}", resp.status()))
                }
            }
        }
    }
}

pub struct PushSendHandler {
    codec: EventCodec,
    redis: ConnectionManager,
    sender: PushSender,
}

impl PushSendHandler {
    pub fn new(codec: EventCodec, redis: ConnectionManager, sender: PushSender) -> Self {
        Self {
            codec,
            redis,
            sender,
        }
    }

    async fn deliver(&self, task: &PushTask) -> Result<(), String> {
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
            .map_err(|e| e.to_string())?;
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

impl Handler for PushSendHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        for (i, task) in decode_all::<PushTask>(&self.codec, records, &mut failures).await {
            if let Err(why) = self.deliver(&task).await {
                failures.push(RecordFailure::new(i, true, why));
            }
        }
        outcome(failures)
    }
}
