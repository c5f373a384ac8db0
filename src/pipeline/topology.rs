//! Pipeline topologies, declared in `topologies/<name>.toml` and validated
//! before anything starts.

use std::path::Path;

use serde::Deserialize;

use crate::kafka::topics::TopicKind;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub name: String,
    /// Topic kind the pipeline consumes: group_events, receipts, session_control, admin_commands.
    pub source: String,
    #[serde(default = "defaults::batch_max")]
    pub batch_max: usize,
    #[serde(default = "defaults::batch_linger_ms")]
    pub batch_linger_ms: u64,
    /// The broker answers a fetch once this many bytes are there, or after
    /// `fetch_wait_max_ms`. 1 (the default): as soon as one record arrives,
    /// for pipelines whose output someone waits for. A pipeline nobody
    /// waits for (search, stats) takes larger, rarer fetches: fewer broker
    /// requests, wake-ups and commits per record.
    #[serde(default = "defaults::fetch_min_bytes")]
    pub fetch_min_bytes: u32,
    /// Longest the broker holds a fetch (ms); with `fetch_min_bytes` 1 it
    /// only bounds idle round trips and costs no latency.
    #[serde(default = "defaults::fetch_wait_max_ms")]
    pub fetch_wait_max_ms: u32,
    /// Attempts of a poison record handled alone before it goes, alone, to
    /// the DLQ. Outages are retried without a limit (see `runner`).
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    #[serde(default = "defaults::backoff_initial_ms")]
    pub backoff_initial_ms: u64,
    #[serde(default = "defaults::backoff_max_ms")]
    pub backoff_max_ms: u64,
    /// Whether the pipeline keeps checkpoints in the tenant databases it
    /// writes (`pipeline::checkpoints`): a MySQL projection that must notice
    /// a database that came back older. Off for Redis, Kafka and index sinks.
    #[serde(default)]
    pub checkpoints: bool,
    /// Runs on its own consumer, never in a unit: its work may be slow or
    /// wait on an outside service (the scan), and in a unit it would hold
    /// the unit's other pipelines back.
    #[serde(default)]
    pub alone: bool,
}

mod defaults {
    pub fn batch_max() -> usize {
        500
    }
    pub fn batch_linger_ms() -> u64 {
        5
    }
    pub fn fetch_min_bytes() -> u32 {
        1
    }
    pub fn fetch_wait_max_ms() -> u32 {
        500
    }
    pub fn max_attempts() -> u32 {
        5
    }
    pub fn backoff_initial_ms() -> u64 {
        100
    }
    pub fn backoff_max_ms() -> u64 {
        5000
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read topology {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("topology {path}: {message}")]
    Invalid { path: String, message: String },
}

impl Topology {
    pub fn load(dir: &Path, name: &str) -> Result<Topology, TopologyError> {
        let path = dir.join(format!("{name}.toml"));
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| TopologyError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    pub fn parse(text: &str, shown: &str) -> Result<Topology, TopologyError> {
        let invalid = |message: String| TopologyError::Invalid {
            path: shown.to_string(),
            message,
        };
        let t: Topology = toml::from_str(text).map_err(|e| invalid(e.message().to_string()))?;
        t.source_kind()
            .ok_or_else(|| invalid(format!("unknown source {:?}", t.source)))?;
        if t.batch_max == 0 || t.max_attempts == 0 {
            return Err(invalid(
                "batch_max and max_attempts must be at least 1".into(),
            ));
        }
        // librdkafka's bounds; a wait beyond the session timeout would also
        // stall the consumer's own heartbeats' purpose.
        if !(1..=100_000_000).contains(&t.fetch_min_bytes) {
            return Err(invalid("fetch_min_bytes must be 1 to 100000000".into()));
        }
        if !(1..=5_000).contains(&t.fetch_wait_max_ms) {
            return Err(invalid("fetch_wait_max_ms must be 1 to 5000".into()));
        }
        Ok(t)
    }

    pub fn source_kind(&self) -> Option<TopicKind> {
        Some(match self.source.as_str() {
            "group_events" => TopicKind::GroupEvents,
            "receipts" => TopicKind::Receipts,
            "session_control" => TopicKind::SessionControl,
            "admin_commands" => TopicKind::AdminCommands,
            "user_events" => TopicKind::UserEvents,
            "push_tasks" => TopicKind::PushTasks,
            _ => return None,
        })
    }

    /// A built-in copy of the committed topology, for tests and `dev`.
    pub fn builtin(name: &str) -> Option<Topology> {
        let text = match name {
            "store" => include_str!("../../topologies/store.toml"),
            "members" => include_str!("../../topologies/members.toml"),
            "hot" => include_str!("../../topologies/hot.toml"),
            "fanout" => include_str!("../../topologies/fanout.toml"),
            "receipts" => include_str!("../../topologies/receipts.toml"),
            "control" => include_str!("../../topologies/control.toml"),
            "commands" => include_str!("../../topologies/commands.toml"),
            "relations" => include_str!("../../topologies/relations.toml"),
            "notify" => include_str!("../../topologies/notify.toml"),
            "push" => include_str!("../../topologies/push.toml"),
            "pushsend" => include_str!("../../topologies/pushsend.toml"),
            "conversations" => include_str!("../../topologies/conversations.toml"),
            "stats" => include_str!("../../topologies/stats.toml"),
            "references" => include_str!("../../topologies/references.toml"),
            "search" => include_str!("../../topologies/search.toml"),
            "notifications" => include_str!("../../topologies/notifications.toml"),
            "scan" => include_str!("../../topologies/scan.toml"),
            _ => return None,
        };
        Self::parse(text, &format!("topologies/{name}.toml")).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_topologies_are_valid() {
        for &name in crate::pipeline::PIPELINES {
            let t = Topology::builtin(name).expect(name);
            assert_eq!(t.name, name);
        }
    }

    #[test]
    fn unknown_keys_and_sources_are_refused() {
        let err = Topology::parse(
            "name = \"x\"\nsource = \"group_events\"\nbatchmax = 3\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("batchmax"), "{err}");
        let err = Topology::parse("name = \"x\"\nsource = \"nowhere\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nowhere"), "{err}");
    }

    #[test]
    fn fetch_sizes_default_to_at_once_and_are_bounded() {
        let t = Topology::parse("name = \"x\"\nsource = \"group_events\"\n", "x.toml").unwrap();
        assert_eq!((t.fetch_min_bytes, t.fetch_wait_max_ms), (1, 500));
        for bad in [
            "fetch_min_bytes = 0",
            "fetch_wait_max_ms = 0",
            "fetch_wait_max_ms = 60000",
        ] {
            let err = Topology::parse(
                &format!("name = \"x\"\nsource = \"group_events\"\n{bad}\n"),
                "x.toml",
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(bad.split(' ').next().unwrap()), "{bad}: {err}");
        }
        // What waits on nobody fetches in bulk; what a user waits on, at once.
        assert!(Topology::builtin("search").unwrap().fetch_min_bytes > 1);
        assert_eq!(Topology::builtin("fanout").unwrap().fetch_min_bytes, 1);
    }
}
