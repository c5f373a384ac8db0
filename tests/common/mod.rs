//! Test harness: makes sure the local stack is up (idempotently) and hands
//! each test its own world — a unique Kafka topic prefix, tenant database,
//! registry database and consumer-group prefix — so tests run in parallel
//! without stepping on each other. A failing test leaves its databases
//! behind for inspection.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use imstream::config::{Config, TenantConfig, TopicSpec};
use imstream::registry::RunningRegistry;
use imstream::shutdown::Shutdown;
use imstream::telemetry::Readiness;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

pub fn redis_url() -> String {
    env_or("IMSTREAM_REDIS_URL", "redis://127.0.0.1:16379")
}
pub fn mysql_url() -> String {
    env_or(
        "IMSTREAM_MYSQL_URL",
        "mysql://imstream:imstream@127.0.0.1:13306",
    )
}
pub fn kafka_brokers() -> String {
    env_or("IMSTREAM_KAFKA_BROKERS", "127.0.0.1:19092")
}

static STACK: OnceLock<()> = OnceLock::new();

/// Starts the local stack unless its services already answer.
pub fn ensure_stack() {
    STACK.get_or_init(|| {
        let reachable =
            port_open(&redis_url()) && port_open(&mysql_url()) && port_open(&kafka_brokers());
        if reachable {
            return;
        }
        let script = repo_root().join("docker/local/stack");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .arg("up")
            .status()
            .expect("run docker/local/stack up");
        assert!(status.success(), "docker/local/stack up failed");
    });
}

/// Whether host:port from a URL or broker list accepts TCP connections.
fn port_open(url: &str) -> bool {
    let without_scheme = url.split("://").last().unwrap_or(url);
    let host_port = without_scheme
        .rsplit('@')
        .next()
        .unwrap_or(without_scheme)
        .split(['/', ',', '?'])
        .next()
        .unwrap_or("");
    use std::net::ToSocketAddrs;
    match host_port.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .any(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()),
        Err(_) => false,
    }
}

/// A short unique id for names in this test.
pub fn unique_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_string()
}

/// One test's isolated world.
pub struct World {
    pub id: String,
    pub config: Config,
    pub shutdown: Shutdown,
    pub registry: Option<RunningRegistry>,
}

impl World {
    /// Config only: unique names, nothing started.
    pub fn config_only() -> World {
        ensure_stack();
        let id = unique_id();
        let mut config = Config::from_toml_with_env("", "<test>", Vec::new()).expect("defaults");
        config.redis.url = redis_url();
        config.mysql.url = mysql_url();
        config.mysql.max_connections = 8;
        config.kafka.brokers = kafka_brokers();
        config.kafka.topic_prefix = format!("t{id}.");
        let t = &mut config.kafka.topics;
        t.group_events = TopicSpec::new(4, -1);
        t.receipts = TopicSpec::new(2, 86_400_000);
        t.session_control = TopicSpec::new(1, 86_400_000);
        t.admin_commands = TopicSpec::new(1, 86_400_000);
        t.admin_results = TopicSpec::new(1, 86_400_000);
        t.dlq = TopicSpec::new(1, -1);
        config.registry.database = format!("imsr_{id}");
        config.pipelines.group_prefix = format!("t{id}");
        config.telemetry.listen = "127.0.0.1:0".parse().unwrap();
        config.tenants = vec![TenantConfig {
            id: format!("t{id}"),
            database: format!("imt_{id}"),
        }];
        World {
            id,
            config,
            shutdown: Shutdown::new(),
            registry: None,
        }
    }

    /// A world with its own schema registry running on a free port.
    pub async fn with_registry() -> World {
        let mut world = World::config_only();
        let running = imstream::registry::start(
            &world.config,
            "127.0.0.1:0".parse().unwrap(),
            Readiness::default(),
            world.shutdown.clone(),
        )
        .await
        .expect("start registry");
        world.config.registry.url = format!("http://{}", running.addr);
        world.registry = Some(running);
        world
    }

    pub fn tenant(&self) -> &str {
        &self.config.tenants[0].id
    }

    pub fn registry_url(&self) -> &str {
        &self.config.registry.url
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

/// Polls `check` until it returns `Some`, or panics after `deadline` with
/// what was expected and the last thing seen.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let mut last = String::from("nothing yet");
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) => last = seen,
        }
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
