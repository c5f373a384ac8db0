//! Test harness: makes sure the local stack is up (idempotently) and hands
//! each test its own world — a unique Kafka topic prefix, tenant database,
//! registry database and consumer-group prefix — so tests run in parallel
//! without stepping on each other. A failing test leaves its databases
//! behind for inspection. Tests start the `imstream` binary only through
//! [`process`].
#![allow(dead_code)]

pub mod process;
pub mod services;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

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

/// The local S3-compatible store (moto) of `docker/local/stack`.
pub fn s3_endpoint() -> String {
    env_or("IMSTREAM_S3_ENDPOINT", "http://127.0.0.1:19900")
}

static S3: OnceLock<()> = OnceLock::new();

/// Starts the stack's S3-compatible store unless it already answers
/// (`docker/local/stack start s3`, idempotent; installs moto from PyPI).
pub fn ensure_s3() {
    S3.get_or_init(|| {
        if port_open(&s3_endpoint()) {
            return;
        }
        let script = repo_root().join("docker/local/stack");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .args(["start", "s3"])
            .status()
            .expect("run docker/local/stack start s3");
        assert!(status.success(), "docker/local/stack start s3 failed");
    });
}

/// A fresh bucket on the local S3-compatible store (S3 CreateBucket, path
/// style); returns the `shards.archive_options` that reach it.
pub async fn s3_bucket(bucket: &str) -> std::collections::BTreeMap<String, String> {
    ensure_s3();
    let endpoint = s3_endpoint();
    let resp = reqwest::Client::new()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .expect("S3 endpoint reachable");
    assert!(
        resp.status().is_success(),
        "CreateBucket {bucket}: {}",
        resp.status()
    );
    [
        ("aws_endpoint", endpoint.as_str()),
        ("aws_allow_http", "true"),
        ("aws_region", "us-east-1"),
        ("aws_access_key_id", "imstream-test"),
        ("aws_secret_access_key", "imstream-test"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A multipart form with one field `file` named `name` (sent with the
/// content type `claimed`, which the server must not believe).
pub fn upload_form(name: &str, claimed: &str, bytes: &[u8]) -> (String, Vec<u8>) {
    let boundary = format!("imstream-test-{}", rand::random::<u64>());
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
             Content-Type: {claimed}\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(bytes);
    body.extend_from_slice(
        format!(
            "\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"id\"\r\n\r\n7\r\n--{boundary}--\r\n"
        )
        .as_bytes(),
    );
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// `POST /v0/file/u/` as Tinode's clients send it: status and the `{ctrl}`.
pub async fn upload(
    addr: std::net::SocketAddr,
    token: &str,
    name: &str,
    claimed: &str,
    bytes: &[u8],
) -> (u16, serde_json::Value) {
    let (content_type, body) = upload_form(name, claimed, bytes);
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v0/file/u/"))
        .header("X-Tinode-APIKey", "AQEAAAABAAD_rAp4DJh05a1HAwFT3A6K")
        .header("X-Tinode-Auth", format!("Token {token}"))
        .header("Content-Type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

/// Every file below `dir`.
pub fn files_below(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_below(&p));
        } else {
            out.push(p);
        }
    }
    out
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
        // The local stack's one broker (tests/kafka_cluster.rs runs three).
        (
            config.kafka.replication_factor,
            config.kafka.min_insync_replicas,
        ) = (1, 1);
        config.kafka.single_broker = true;
        config.kafka.topic_prefix = format!("t{id}.");
        let t = &mut config.kafka.topics;
        t.group_events = TopicSpec::new(4, -1);
        t.receipts = TopicSpec::new(2, 86_400_000);
        t.session_control = TopicSpec::new(1, 15 * 86_400_000);
        t.admin_commands = TopicSpec::new(1, 86_400_000);
        t.admin_results = TopicSpec::new(1, 86_400_000);
        t.user_events = TopicSpec::new(2, -1);
        t.push_tasks = TopicSpec::new(1, 86_400_000);
        t.dlq = TopicSpec::new(1, -1);
        config.registry.database = format!("imsr_{id}");
        config.pipelines.group_prefix = format!("t{id}");
        // Search indexes: one folder per tenant, and the tenant is this world's.
        config.search.index_dir = repo_root()
            .join("target/tmp/search-index")
            .display()
            .to_string();
        // Uploaded files: one folder per world.
        config.files.store_url = repo_root()
            .join(format!("target/tmp/files-{id}"))
            .display()
            .to_string();
        config.telemetry.listen = "127.0.0.1:0".parse().unwrap();
        // Secrets of this world only (a gateway process refuses the defaults).
        config.auth.jwt_secret = format!("jwt-{}", uuid::Uuid::new_v4().simple());
        config.auth.admin_token = format!("admin-{}", uuid::Uuid::new_v4().simple());
        // Rate limits out of the way of tests that send in bursts (the
        // limits' own tests set theirs: tests/security_limits.rs).
        let roomy = imstream::config::BucketConfig::new(100_000, 6_000_000);
        let l = &mut config.limits;
        (l.sends, l.receipts, l.clears) = (roomy, roomy, roomy);
        (l.searches, l.group_creates, l.friend_requests) = (roomy, roomy, roomy);
        config.tenants = vec![TenantConfig {
            id: format!("t{id}"),
            database: format!("imt_{id}"),
            signing_keys: Vec::new(),
            ..Default::default()
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
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A running deployment for one test: registry, migrated tenant database,
/// topics, registered schemas, the current month tables, and optionally the
/// pipelines and gateways, all in-process and stopped with the world.
pub struct Stack {
    pub world: World,
    pub gateways: Vec<imstream::gateway::RunningGateway>,
    pub pipelines: Vec<(String, Shutdown, tokio::task::JoinHandle<()>)>,
}

impl Stack {
    /// Registry, tenant DB, topics, schemas, shard tables (for `now`, or
    /// Redis TIME when `None`).
    pub async fn prepared(now: Option<&str>) -> Stack {
        Stack::prepared_with(now, |_| ()).await
    }

    /// [`Stack::prepared`] with `tweak` applied to the configuration before
    /// anything is created from it (another Kafka cluster, for example).
    pub async fn prepared_with(now: Option<&str>, tweak: impl FnOnce(&mut Config)) -> Stack {
        let mut world = World::with_registry().await;
        tweak(&mut world.config);
        let config = &world.config;
        imstream::tenant::migrate(config, None)
            .await
            .expect("migrate");
        imstream::send::establish_generations(config)
            .await
            .expect("generation");
        imstream::kafka::topics::ensure(config)
            .await
            .expect("topics");
        let names = imstream::kafka::topics::TopicNames::new(&config.kafka);
        imstream::registry::client::register_all(&config.registry.url, &names)
            .await
            .expect("schemas");
        let stack = Stack {
            world,
            gateways: Vec::new(),
            pipelines: Vec::new(),
        };
        stack.shard_pass(now).await;
        stack
    }

    /// Registry, DB, topics, schemas, shards, the store and members
    /// pipelines and one gateway.
    pub async fn running() -> Stack {
        let mut stack = Stack::prepared(None).await;
        stack.start_pipeline("store").await;
        stack.start_pipeline("members").await;
        stack.start_gateway("node-a").await;
        stack
    }

    pub fn config(&self) -> &Config {
        &self.world.config
    }

    pub fn tenant(&self) -> &str {
        self.world.tenant()
    }

    /// The first tenant's database, on its own server when it has one.
    pub fn pool(&self) -> sqlx::MySqlPool {
        let tenant = &self.world.config.tenants[0];
        imstream::tenant::database_pool(&tenant.mysql(&self.world.config.mysql), &tenant.database)
            .expect("pool")
    }

    pub async fn redis(&self) -> imstream::redis_util::Redis {
        imstream::redis_util::connect(&self.world.config.redis.url)
            .await
            .expect("redis")
    }

    /// One shard-manager pass at `now` (RFC 3339) or Redis TIME.
    pub async fn shard_pass(&self, now: Option<&str>) {
        let clock = imstream::redis_util::Clock::from_override(now.unwrap_or(""));
        let manager = imstream::store::shards::ShardManager::connect(
            &self.world.config,
            clock,
            imstream::pipeline::store_topics(&self.world.config).expect("store topics"),
        )
        .await
        .expect("shard manager");
        manager.pass().await.expect("shard pass");
    }

    /// Starts a pipeline in-process; stop it with `stop_pipeline`.
    pub async fn start_pipeline(&mut self, name: &str) {
        let shutdown = self.world.shutdown.child();
        let config = self.world.config.clone();
        let (n, s) = (name.to_string(), shutdown.clone());
        let task = tokio::spawn(async move {
            imstream::pipeline::run_named(&config, &n, s)
                .await
                .expect("pipeline");
        });
        self.pipelines.push((name.to_string(), shutdown, task));
    }

    /// Declares the deployment units of this stack (`units.toml` in a
    /// fresh topologies directory; every pipeline keeps its built-in
    /// topology).
    pub fn use_units(&mut self, text: &str) {
        let dir = repo_root().join(format!("target/tmp/units-{}", unique_id()));
        std::fs::create_dir_all(&dir).expect("units dir");
        std::fs::write(dir.join("units.toml"), text).expect("units.toml");
        self.world.config.pipelines.topologies_dir = dir.display().to_string();
    }

    /// Starts deployment unit `name` in-process; stop it with
    /// `stop_pipeline(name)`.
    pub async fn start_unit(&mut self, name: &str) {
        let shutdown = self.world.shutdown.child();
        let config = self.world.config.clone();
        let (n, s) = (name.to_string(), shutdown.clone());
        let task = tokio::spawn(async move {
            imstream::pipeline::unit::run_named(&config, &n, s)
                .await
                .expect("unit");
        });
        self.pipelines.push((name.to_string(), shutdown, task));
    }

    /// Starts `name`: a declared unit, else a pipeline.
    pub async fn start(&mut self, name: &str) {
        let is_unit = imstream::pipeline::unit::units(&self.world.config)
            .map(|units| units.iter().any(|u| u.name == name))
            .unwrap_or(false);
        if is_unit {
            self.start_unit(name).await;
        } else {
            self.start_pipeline(name).await;
        }
    }

    pub async fn stop_pipeline(&mut self, name: &str) {
        let mut kept = Vec::new();
        for (n, s, t) in std::mem::take(&mut self.pipelines) {
            if n == name {
                s.trigger();
                let _ = t.await;
            } else {
                kept.push((n, s, t));
            }
        }
        self.pipelines = kept;
    }

    /// Adds tenant `id` on database `database` to the configuration (not
    /// migrated: a database that does not exist makes every query fail).
    pub fn add_tenant(
        &mut self,
        id: &str,
        database: String,
        signing_keys: Vec<imstream::config::SigningKey>,
    ) {
        self.world
            .config
            .tenants
            .push(imstream::config::TenantConfig {
                id: id.to_string(),
                database,
                signing_keys,
                ..Default::default()
            });
    }

    /// Starts a gateway with its own node id on a free port.
    pub async fn start_gateway(&mut self, node: &str) -> std::net::SocketAddr {
        let mut config = self.world.config.clone();
        config.node.id = format!("{node}-{}", self.world.id);
        let running = imstream::gateway::start(
            &config,
            "127.0.0.1:0".parse().unwrap(),
            Readiness::default(),
            self.world.shutdown.child(),
        )
        .await
        .expect("gateway");
        let addr = running.addr;
        self.gateways.push(running);
        addr
    }

    /// This stack's configuration as it is now, written for a child
    /// `imstream` process (`target/tmp/<label>-<world id>.toml`).
    pub fn config_file(&self, label: &str) -> PathBuf {
        write_config_file(self.config(), &format!("{label}-{}", self.world.id))
    }

    /// `imstream <args>` as an operator runs it (a child process with this
    /// stack's configuration); whether it succeeded, and what it printed.
    pub fn imstream(&self, args: &[&str]) -> (bool, String) {
        let mut cmd = process::command(&self.config_file("cli"), args);
        cmd.env("RUST_LOG", "error");
        let ran = process::run(cmd);
        (ran.ok, ran.printed())
    }

    pub fn gateway_addr(&self, i: usize) -> std::net::SocketAddr {
        self.gateways[i].addr
    }

    /// The operator port of the `i`-th gateway: `/v1/admin/…` is served
    /// there only (`gateway.admin_addr`).
    pub fn admin_addr(&self, i: usize) -> std::net::SocketAddr {
        self.gateways[i].admin_addr
    }

    /// The operator port of the gateway whose public port is `addr`.
    pub fn admin_addr_of(&self, addr: std::net::SocketAddr) -> std::net::SocketAddr {
        self.gateways
            .iter()
            .find(|g| g.addr == addr)
            .expect("a gateway of this stack")
            .admin_addr
    }

    pub fn token(&self, uid: i64, device: &str) -> String {
        imstream::auth::Tokens::new(&self.world.config)
            .issue(self.tenant(), uid, device, 0, 0)
            .token
    }

    /// Creates the group as its owner's command does (the group write
    /// model, stored, then `GroupCreated` produced: the governance
    /// executor, in this process), then waits until the members pipeline
    /// made the group usable (cached facts in MySQL).
    pub async fn create_group(&self, topic: &str, owner: i64, members: &[i64]) {
        use imstream::events::*;
        let config = &self.world.config;
        let codec = EventCodec::new(&config.registry.url).unwrap();
        let producer =
            imstream::kafka::producer::EventProducer::new(&config.kafka, codec.clone()).unwrap();
        let pools = imstream::tenant::TenantPools::connect_lazy(config).unwrap();
        let model = imstream::group_model::GroupModel::new(
            config.clone(),
            pools,
            self.redis().await,
            codec,
        );
        let executor =
            imstream::governance::exec::Executor::new(model, producer, "test-fixture".into());
        let created = GroupCreated {
            group_id: (rand_id() & 0x7fff_ffff) as i64,
            name: topic.to_string(),
            owner_uid: owner,
            members: members.to_vec(),
        };
        let origin = imstream::governance::exec::Origin::default();
        executor
            .create(self.tenant(), topic, owner, created, &origin)
            .await
            .unwrap_or_else(|r| panic!("creating {topic}: {} {}", r.0, r.1));
        let pool = self.pool();
        let expected = members
            .iter()
            .chain(std::iter::once(&owner))
            .collect::<std::collections::HashSet<_>>()
            .len() as i64;
        wait_for(
            &format!("group {topic} projected"),
            Duration::from_secs(60),
            || {
                let pool = pool.clone();
                let topic = topic.to_string();
                async move {
                    let n: i64 =
                        sqlx::query_scalar("SELECT COUNT(*) FROM im_group_members WHERE topic = ?")
                            .bind(&topic)
                            .fetch_one(&pool)
                            .await
                            .map_err(|e| e.to_string())?;
                    if n == expected {
                        Ok(())
                    } else {
                        Err(format!("{n} of {expected} members"))
                    }
                }
            },
        )
        .await;
    }
}

fn rand_id() -> u64 {
    let b = uuid::Uuid::new_v4();
    u64::from_le_bytes(b.as_bytes()[..8].try_into().unwrap())
}

/// One `POST /v1/groups/{topic}/messages` through gateway `addr`; returns the
/// HTTP status and the JSON body.
pub async fn send_http(
    client: &reqwest::Client,
    addr: std::net::SocketAddr,
    token: &str,
    topic: &str,
    client_msg_id: &str,
    text: &str,
) -> (u16, serde_json::Value) {
    let resp = client
        .post(format!("http://{addr}/v1/groups/{topic}/messages"))
        .bearer_auth(token)
        .json(&serde_json::json!({"content": {"txt": text}, "client_msg_id": client_msg_id}))
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// Writes `config` as a TOML file for a child `imstream` process.
pub fn write_config_file(config: &Config, name: &str) -> PathBuf {
    let dir = repo_root().join("target/tmp");
    std::fs::create_dir_all(&dir).expect("target/tmp");
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml::to_string(config).expect("config serializes"))
        .expect("write config");
    path
}

impl Stack {
    /// Everything for realtime tests: every pipeline (store, members, hot,
    /// fanout, receipts, control) and `gateways` gateways with distinct node
    /// ids, heartbeats every second.
    pub async fn realtime(gateways: usize) -> Stack {
        let mut stack = Stack::prepared(None).await;
        stack.world.config.gateway.heartbeat_secs = 1;
        for p in imstream::pipeline::PIPELINES {
            stack.start_pipeline(p).await;
        }
        for i in 0..gateways {
            stack.start_gateway(&format!("gw{i}")).await;
        }
        stack
    }
}

/// Reads the events of topic `kind` from the beginning (a fresh consumer
/// group) until `done` holds for what was read; returns them in log order
/// per partition. Panics after a minute.
pub async fn read_events<E: imstream::events::Event>(
    config: &Config,
    kind: imstream::kafka::topics::TopicKind,
    done: impl Fn(&[E]) -> bool,
) -> Vec<E> {
    let topic = imstream::kafka::topics::TopicNames::new(&config.kafka).name(kind);
    read_topic(config, &topic, done).await
}

/// Like [`read_events`], from a topic given by name (a DLQ).
pub async fn read_topic<E: imstream::events::Event>(
    config: &Config,
    topic: &str,
    done: impl Fn(&[E]) -> bool,
) -> Vec<E> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::Message;
    let consumer: StreamConsumer = imstream::kafka::client_config(&config.kafka)
        .set("group.id", format!("reader-{}", unique_id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let codec = imstream::events::EventCodec::new(&config.registry.url).expect("codec");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut events: Vec<E> = Vec::new();
    while !done(&events) {
        assert!(
            Instant::now() < deadline,
            "reading {topic}: condition not met after {} events",
            events.len()
        );
        match tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            Ok(Ok(m)) => {
                let event = codec.decode::<E>(m.payload()).await.expect("decode");
                events.push(event);
            }
            Ok(Err(e)) => panic!("consume {topic}: {e}"),
            Err(_) => {}
        }
    }
    events
}

/// One HTTP call (`POST`, `PUT`, `DELETE`, JSON body) as `uid` through
/// gateway `addr`; the status and body.
pub async fn call(
    stack: &Stack,
    addr: std::net::SocketAddr,
    uid: i64,
    method: &str,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let client = reqwest::Client::new();
    let url = format!("http://{addr}{path}");
    let req = match method {
        "GET" => client.get(url),
        "POST" => client.post(url),
        "PUT" => client.put(url),
        "PATCH" => client.patch(url),
        "DELETE" => client.delete(url),
        other => panic!("method {other}"),
    };
    let req = req.bearer_auth(stack.token(uid, "http"));
    // A GET carries no body.
    let req = if method == "GET" {
        req
    } else {
        req.json(&body)
    };
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

/// Every Redis key of `tenant`: per-topic `im:{tenant:…}` and tenant-wide
/// `im:{tenant}…` (only this test's tenant; the server is shared), plus the
/// keys the re-seed depends on by name. Deletes nothing: SCAN walks the
/// whole shared keyspace, hundreds of thousands of keys, which takes tens
/// of seconds on a loaded machine.
pub async fn tenant_keys(
    redis: &mut imstream::redis_util::Redis,
    tenant: &str,
    topic: &str,
) -> std::collections::BTreeSet<String> {
    let mut keys: std::collections::BTreeSet<String> = [
        imstream::keys::TopicKeys::new(tenant, topic).seq(),
        imstream::keys::TopicKeys::new(tenant, topic).reseed_lock(),
        imstream::keys::TenantKeys::new(tenant).generation(),
        imstream::keys::TenantKeys::new(tenant).active_month(),
    ]
    .into_iter()
    .collect();
    for pattern in [format!("im:{{{tenant}:*"), format!("im:{{{tenant}}}*")] {
        let mut cursor: u64 = 0;
        loop {
            let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(redis)
                .await
                .unwrap();
            keys.extend(found);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    keys
}

/// Records in the store DLQ (all partitions).
pub async fn store_dlq_depth(config: &Config) -> i64 {
    use imstream::kafka::topics::{TopicKind, TopicNames};
    let kafka = config.kafka.clone();
    let dlq = TopicNames::new(&kafka).dlq(TopicKind::GroupEvents, "store");
    tokio::task::spawn_blocking(move || {
        imstream::kafka::lag::watermarks(&kafka, &format!("probe-{}", unique_id()), &dlq)
            .expect("DLQ watermarks")
            .values()
            .map(|(low, high)| high - low)
            .sum()
    })
    .await
    .unwrap()
}

/// Runs `tests/node/<script>` with `env` (its npm packages installed by
/// `npm ci --prefix tests/node`, as the README's test command does) and
/// asserts it printed "ok" within `limit`; its output is shown otherwise.
pub async fn run_node(script: &str, env: &[(&str, String)], limit: Duration) {
    let node_dir = repo_root().join("tests/node");
    for package in ["tinode-sdk", "ws", "fake-indexeddb"] {
        assert!(
            node_dir.join("node_modules").join(package).exists(),
            "npm package {package} missing: run `npm ci --prefix tests/node` (the README's test command does)"
        );
    }
    let mut command = tokio::process::Command::new("node");
    command
        .arg(script)
        .current_dir(&node_dir)
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = tokio::time::timeout(limit, command.output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {limit:?}"))
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "{script} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
}

/// [`run_node`] that hands back what the script printed (its stdout).
pub async fn run_node_output(script: &str, env: &[(&str, String)], limit: Duration) -> String {
    let node_dir = repo_root().join("tests/node");
    assert!(
        node_dir.join("node_modules/tinode-sdk").exists(),
        "npm package tinode-sdk missing: run `npm ci --prefix tests/node`"
    );
    let mut command = tokio::process::Command::new("node");
    command
        .arg(script)
        .current_dir(&node_dir)
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = tokio::time::timeout(limit, command.output())
        .await
        .unwrap_or_else(|_| panic!("{script} did not finish within {limit:?}"))
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "{script} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );
    stdout
}

/// A logged-in Tinode WebSocket session.
pub struct Ws {
    pub stream: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
}

impl Ws {
    pub async fn connect(addr: std::net::SocketAddr, token: &str) -> Ws {
        let (stream, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v0/channels"))
            .await
            .expect("websocket");
        let mut ws = Ws { stream, next_id: 0 };
        let (_, hi) = ws.request(json!({"hi": {"ver": "0.25.3"}})).await;
        assert_eq!(hi["ctrl"]["code"], json!(201), "{hi}");
        let (_, login) = ws
            .request(json!({"login": {"scheme": "token", "secret": token}}))
            .await;
        assert_eq!(login["ctrl"]["code"], json!(200), "{login}");
        ws
    }

    pub async fn next_frame(&mut self) -> Value {
        loop {
            let frame = tokio::time::timeout(
                Duration::from_secs(20),
                futures::StreamExt::next(&mut self.stream),
            )
            .await
            .expect("a frame within 20 s")
            .expect("socket open")
            .expect("frame");
            if let tokio_tungstenite::tungstenite::Message::Text(t) = frame {
                return serde_json::from_str(&t).expect("json frame");
            }
        }
    }

    /// Sends `msg` (its single verb gets a fresh id) and returns the frames
    /// that came before the reply with that id, and the reply (a `ctrl` or,
    /// for `{get what="del"}`, a `meta`).
    pub async fn request(&mut self, mut msg: Value) -> (Vec<Value>, Value) {
        self.next_id += 1;
        let id = self.next_id.to_string();
        let verb = msg.as_object().unwrap().keys().next().unwrap().clone();
        msg[&verb]["id"] = json!(id);
        futures::SinkExt::send(
            &mut self.stream,
            tokio_tungstenite::tungstenite::Message::Text(msg.to_string().into()),
        )
        .await
        .expect("send");
        self.until_reply(&id).await
    }

    /// Sends `msg` as it is (a `{note}` has no id and no answer).
    pub async fn send(&mut self, msg: Value) {
        futures::SinkExt::send(
            &mut self.stream,
            tokio_tungstenite::tungstenite::Message::Text(msg.to_string().into()),
        )
        .await
        .expect("send");
    }

    pub async fn until_reply(&mut self, id: &str) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let frame = self.next_frame().await;
            if frame["ctrl"]["id"] == json!(id) || frame["meta"]["id"] == json!(id) {
                return (before, frame);
            }
            before.push(frame);
        }
    }

    /// `{get what="data"}`: the seqs of the `{data}` frames and the ending ctrl.
    pub async fn get_data(&mut self, topic: &str, data: Value) -> (Vec<i64>, Value) {
        let (frames, ctrl) = self
            .request(json!({"get": {"topic": topic, "what": "data", "data": data}}))
            .await;
        let seqs = frames
            .iter()
            .map(|f| {
                assert_eq!(f["data"]["topic"], json!(topic), "{f}");
                f["data"]["seq"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("a data frame: {f}"))
            })
            .collect();
        (seqs, ctrl)
    }
}

/// A TCP proxy in front of MariaDB that the test can take down: while
/// down, every open connection is cut and new ones are closed at once.
pub struct DbProxy {
    pub addr: std::net::SocketAddr,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl DbProxy {
    pub async fn start(target: String) -> DbProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> =
            std::sync::Arc::default();
        let accept = {
            let (up, connections) = (up.clone(), connections.clone());
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !up.load(std::sync::atomic::Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let target = target.clone();
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    connections.lock().unwrap().push(task);
                }
            })
        };
        DbProxy {
            addr,
            up,
            connections,
            accept,
        }
    }

    pub fn down(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        for c in self.connections.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    pub fn up(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.down();
        self.accept.abort();
    }
}

/// `mysql://user:pass@host:port[/…][?…]` → `host:port`.
pub fn server_of(url: &str) -> String {
    let rest = url.rsplit_once('@').map_or(url, |(_, r)| r);
    let rest = rest.strip_prefix("mysql://").unwrap_or(rest);
    rest.split(['/', '?']).next().unwrap_or(rest).to_string()
}

/// `config` with its MySQL server replaced by `addr`.
pub fn through(config: &Config, addr: std::net::SocketAddr) -> Config {
    let mut config = config.clone();
    let server = server_of(&config.mysql.url);
    config.mysql.url = config.mysql.url.replacen(&server, &addr.to_string(), 1);
    config
}

/// `(rows, distinct seqs)` of a topic in the current month table.
pub async fn stored_counts(pool: &sqlx::MySqlPool, topic: &str) -> (i64, i64) {
    sqlx::query_as(&format!(
        "SELECT COUNT(*), COUNT(DISTINCT seqid) FROM im_group_messages_{} WHERE topic = ?",
        imstream::store::month::ShardMonth::of(chrono::Utc::now())
    ))
    .bind(topic)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A `MessageSent` of `topic` at `seq` (group 42, from user 7, this
/// month), as the send path would produce it.
pub fn message_sent(
    tenant: &str,
    topic: &str,
    seq: i64,
    content: String,
) -> imstream::events::GroupEvent {
    let now = imstream::events::now_ms();
    let mut event = imstream::events::GroupEvent::new(
        tenant,
        topic,
        7,
        imstream::events::GroupEventBody::MessageSent(imstream::events::MessageSent {
            message_id: (rand::random::<u32>() as i64) << 20 | seq,
            group_id: 42,
            seq,
            shard_month: imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string(),
            client_msg_id: Some(format!("{topic}-{seq}")),
            from_user: 7,
            msg_type: "text".into(),
            head: None,
            content_size: content.len() as i32,
            content: Some(content),
            mentioned_user_ids: vec![],
            mention_all: false,
            reply_seq: None,
            root_seq: None,
            file_count: 0,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: now,
            expires_at: None,
        }),
    );
    event.actor_device = "test".into();
    event
}
