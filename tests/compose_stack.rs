//! docker/compose.yaml, checked without a container engine:
//! `docker compose config` (a Compose v2 CLI, installed by
//! `docker/local/compose-cli` when missing) must accept it and list every
//! service; every imstream service's configuration (the mounted TOML plus
//! its `IMSTREAM__…` environment) must load through imstream's own config
//! loader; Prometheus must scrape every long-running imstream process at
//! the address its config listens on; the Grafana dashboard must parse and
//! use only metric names that `src/metrics.rs` exports — the seed 000 §11
//! names, latency, lag and DLQ among them; Prometheus loads the alert rules
//! (docker/prometheus/alerts.yml) and sends to the Alertmanager service;
//! the rules use exported metrics only, cover the seeds' thresholds, and
//! pass `promtool check` and their unit tests (each alert fires and
//! clears, docker/prometheus/alerts.test.yml).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use imstream::config::Config;
use imstream::metrics as m;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Compose v2 command, installing it when missing.
fn compose_cli() -> Vec<String> {
    let script = repo().join("docker/local/compose-cli");
    let run = |what: &str| {
        Command::new("bash")
            .arg(&script)
            .arg(what)
            .output()
            .expect("run docker/local/compose-cli")
    };
    let mut out = run("path");
    if !out.status.success() {
        out = run("install");
    }
    assert!(
        out.status.success(),
        "no Docker Compose v2 CLI and docker/local/compose-cli install failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .expect("a command")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// What an operator must set; the file has no defaults for these.
const DEPLOYMENT_SECRETS: &[(&str, &str)] = &[
    (
        "IMSTREAM_JWT_SECRET",
        "a-deployment-jwt-secret-of-40-bytes-xxxxx",
    ),
    (
        "IMSTREAM_ADMIN_TOKEN",
        "a-deployment-admin-token-of-40-bytes-xxxx",
    ),
    ("IMSTREAM_MYSQL_PASSWORD", "mysql-password"),
    ("IMSTREAM_MYSQL_ROOT_PASSWORD", "mysql-root-password"),
    ("GRAFANA_ADMIN_PASSWORD", "grafana-password"),
];

/// `docker compose -f docker/compose.yaml config --format json` with only
/// `env` of the deployment secrets set.
fn compose_config(cli: &[String], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(&cli[0]);
    cmd.args(&cli[1..])
        .args(["-f", "docker/compose.yaml", "config", "--format", "json"])
        .current_dir(repo());
    for (name, _) in DEPLOYMENT_SECRETS {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run docker compose config")
}

/// `docker compose -f docker/compose.yaml config --format json`, once.
fn compose() -> &'static Value {
    static CONFIG: OnceLock<Value> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let cli = compose_cli();
        let out = compose_config(&cli, DEPLOYMENT_SECRETS);
        assert!(
            out.status.success(),
            "docker compose config refused docker/compose.yaml:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("compose config prints JSON")
    })
}

fn services() -> &'static serde_json::Map<String, Value> {
    compose()["services"].as_object().expect("services")
}

/// Services built from docker/Dockerfile (every imstream process).
fn imstream_services() -> BTreeMap<&'static str, &'static Value> {
    services()
        .iter()
        .filter(|(_, s)| {
            s["build"]["dockerfile"]
                .as_str()
                .is_some_and(|d| d.ends_with("docker/Dockerfile"))
        })
        .map(|(n, s)| (n.as_str(), s))
        .collect()
}

/// Long-running imstream processes (everything but one-shot jobs).
fn long_running() -> BTreeMap<&'static str, &'static Value> {
    imstream_services()
        .into_iter()
        .filter(|(_, s)| s["restart"].as_str() != Some("no"))
        .collect()
}

fn command(service: &Value) -> Vec<&str> {
    service["command"]
        .as_array()
        .map(|c| c.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The service's config as the process would load it: the host file bound
/// at `IMSTREAM_CONFIG`, plus the environment.
fn service_config(name: &str, service: &Value) -> Config {
    let env: Vec<(String, String)> = service["environment"]
        .as_object()
        .unwrap_or_else(|| panic!("{name} has no environment"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    let target = env
        .iter()
        .find(|(k, _)| k == "IMSTREAM_CONFIG")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("{name}: IMSTREAM_CONFIG is not set"));
    let source = service["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["target"] == Value::String(target.clone()))
        .and_then(|v| v["source"].as_str())
        .unwrap_or_else(|| panic!("{name}: nothing is mounted at {target}"));
    let text = std::fs::read_to_string(source)
        .unwrap_or_else(|e| panic!("{name}: the mounted config {source}: {e}"));
    Config::from_toml_with_env(&text, source, env)
        .unwrap_or_else(|e| panic!("{name}: its configuration does not load: {e}"))
}

fn host_of(url: &str) -> &str {
    let rest = url.split("://").last().unwrap_or(url);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    rest.split([':', '/']).next().unwrap_or(rest)
}

#[test]
fn compose_config_accepts_the_file_and_lists_every_service() {
    let names: BTreeSet<&str> = services().keys().map(String::as_str).collect();
    let mut expected: BTreeSet<String> = [
        "kafka-1",
        "kafka-2",
        "kafka-3",
        "schema-registry",
        "redis",
        "mysql",
        "setup",
        "gateway",
        "shards",
        "prometheus",
        "alertmanager",
        "grafana",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    for p in imstream::pipeline::PIPELINES {
        expected.insert(format!("project-{p}"));
    }
    for e in &expected {
        assert!(
            names.contains(e.as_str()),
            "service {e} missing; have {names:?}"
        );
    }
    let image = |n: &str| {
        services()[n]["image"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    for k in ["kafka-1", "kafka-2", "kafka-3"] {
        assert!(image(k).starts_with("apache/kafka:"), "{}", image(k));
    }
    assert!(image("schema-registry").starts_with("confluentinc/cp-schema-registry:"));
    assert!(image("redis").starts_with("redis:7"));
    assert!(image("mysql").starts_with("mysql:8"));
    // KRaft: three brokers, each its own controller (a quorum of three),
    // no ZooKeeper; what the brokers create themselves is replicated too.
    for (n, k) in ["kafka-1", "kafka-2", "kafka-3"].into_iter().enumerate() {
        let env = &services()[k]["environment"];
        assert_eq!(env["KAFKA_PROCESS_ROLES"], "broker,controller");
        assert_eq!(
            env["KAFKA_NODE_ID"].to_string().trim_matches('"'),
            (n + 1).to_string()
        );
        assert_eq!(
            env["KAFKA_CONTROLLER_QUORUM_VOTERS"],
            "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
        );
        assert_eq!(
            env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]
                .to_string()
                .trim_matches('"'),
            "3"
        );
        assert_eq!(
            env["KAFKA_MIN_INSYNC_REPLICAS"]
                .to_string()
                .trim_matches('"'),
            "2"
        );
    }
    assert!(!names.iter().any(|n| n.contains("zookeeper")));

    // Every imstream process runs the subcommand a user would run.
    let imstream = imstream_services();
    for p in imstream::pipeline::PIPELINES {
        let s = imstream[format!("project-{p}").as_str()];
        assert_eq!(command(s), vec!["project", p]);
    }
    assert_eq!(command(imstream["gateway"]), vec!["gateway"]);
    assert_eq!(command(imstream["shards"]), vec!["shards"]);
    // The image is a multi-stage build of this repository.
    let dockerfile = std::fs::read_to_string(repo().join("docker/Dockerfile")).unwrap();
    assert!(
        dockerfile.matches("\nFROM ").count() >= 2,
        "multi-stage Dockerfile"
    );
    assert!(dockerfile.contains("cargo build --release --locked"));
}

#[test]
fn every_imstream_service_configuration_loads_with_imstream_keys() {
    let names: BTreeSet<&str> = services().keys().map(String::as_str).collect();
    let imstream = imstream_services();
    assert!(imstream.len() >= 3 + imstream::pipeline::PIPELINES.len());
    for (name, service) in imstream {
        let config = service_config(name, service);
        // Topics as `imstream topics ensure` creates them for this file
        // cannot lose an acknowledged message with one broker down.
        assert_eq!(
            imstream::kafka::topics::replication_risk(&config.kafka),
            None,
            "{name}: kafka replication"
        );
        assert_eq!(
            config.kafka.brokers.split(',').count(),
            3,
            "{name}: three brokers"
        );
        // Every address points at a service of this compose file.
        for url in [
            config.kafka.brokers.as_str(),
            config.redis.url.as_str(),
            config.mysql.url.as_str(),
            config.registry.url.as_str(),
        ] {
            assert!(
                names.contains(host_of(url)),
                "{name}: {url} is not a compose service"
            );
        }
        assert!(!config.tenants.is_empty(), "{name}: no tenants");
        assert!(
            config.telemetry.listen.ip().is_unspecified(),
            "{name}: metrics must listen on all interfaces for Prometheus"
        );
    }
    let gateway = service_config("gateway", imstream_services()["gateway"]);
    assert!(gateway.gateway.listen.ip().is_unspecified());
}

/// `host:port` strings on the `targets:` lines of prometheus.yml.
fn scrape_targets(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| {
            l.trim_start().starts_with("- targets:") || l.trim_start().starts_with("targets:")
        })
        .flat_map(|l| l.split('"').skip(1).step_by(2).map(str::to_string))
        .collect()
}

#[test]
fn prometheus_scrapes_every_imstream_process() {
    let prometheus = &services()["prometheus"];
    let mounted = prometheus["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["target"] == "/etc/prometheus/prometheus.yml")
        .and_then(|v| v["source"].as_str())
        .expect("prometheus.yml mounted");
    assert_eq!(
        Path::new(mounted),
        repo().join("docker/prometheus/prometheus.yml")
    );
    let targets = scrape_targets(&std::fs::read_to_string(mounted).unwrap());
    let running = long_running();
    assert!(running.len() >= 2 + imstream::pipeline::PIPELINES.len());
    for (name, service) in running {
        let config = service_config(name, service);
        // Every process, the gateway too, serves /metrics on its telemetry port.
        let port = config.telemetry.listen.port();
        let target = format!("{name}:{port}");
        assert!(
            targets.contains(&target),
            "Prometheus does not scrape {target}; targets: {targets:?}"
        );
    }
}

/// Metric names (`group_message_…`, `imstream_…`) in a PromQL expression,
/// without histogram sample suffixes.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("group_message_") || t.starts_with("imstream_"))
        .map(|t| {
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| t.strip_suffix(s))
                .filter(|base| m::ALL.contains(base))
                .unwrap_or(t)
                .to_string()
        })
        .collect()
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[test]
fn the_grafana_dashboard_uses_exported_metrics_only_and_covers_the_seed() {
    let path = repo().join("docker/grafana/dashboards/imstream.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("dashboard JSON");
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    assert!(!all.is_empty(), "no queries in the dashboard");
    let used: BTreeSet<String> = all.iter().flat_map(|e| metric_names(e)).collect();
    for name in &used {
        assert!(
            m::ALL.contains(&name.as_str()),
            "the dashboard queries {name}, which src/metrics.rs does not export"
        );
    }
    let wanted = m::SEED_000.iter().chain(&[
        m::SEND_ACK_LATENCY,
        m::DELIVERY_LATENCY,
        m::PIPELINE_LAG,
        m::PIPELINE_DLQ_TOTAL,
    ]);
    for name in wanted {
        assert!(
            used.contains(*name),
            "the dashboard has no panel for {name}"
        );
    }
    // Provisioned: Grafana mounts the folder its provider reads, and the
    // panels use the provisioned data source.
    let provider =
        std::fs::read_to_string(repo().join("docker/grafana/provisioning/dashboards/imstream.yml"))
            .unwrap();
    let grafana_mounts: Vec<(String, String)> = services()["grafana"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["source"].as_str().unwrap_or_default().to_string(),
                v["target"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let dashboards_dir = repo().join("docker/grafana/dashboards");
    assert!(grafana_mounts.iter().any(|(source, target)| {
        Path::new(source) == dashboards_dir && provider.contains(&format!("path: {target}"))
    }));
    let datasource = std::fs::read_to_string(
        repo().join("docker/grafana/provisioning/datasources/prometheus.yml"),
    )
    .unwrap();
    assert!(
        datasource.contains("uid: prometheus") && datasource.contains("http://prometheus:9090")
    );
    assert!(dashboard.to_string().contains("\"uid\":\"prometheus\""));
}

#[test]
fn metric_names_strip_histogram_suffixes_of_known_histograms_only() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(imstream_send_ack_latency_seconds_bucket[5m]))) + imstream_made_up_count",
    );
    assert_eq!(
        names,
        BTreeSet::from([
            "imstream_send_ack_latency_seconds".to_string(),
            "imstream_made_up_count".to_string()
        ])
    );
}

#[test]
fn compose_refuses_to_run_without_the_deployment_secrets() {
    let cli = compose_cli();
    for missing in DEPLOYMENT_SECRETS.iter().map(|(name, _)| *name) {
        let env: Vec<(&str, &str)> = DEPLOYMENT_SECRETS
            .iter()
            .copied()
            .filter(|(name, _)| *name != missing)
            .collect();
        let out = compose_config(&cli, &env);
        assert!(
            !out.status.success(),
            "compose config ran without {missing}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(missing), "{missing}: {stderr}");
    }
}

#[test]
fn only_the_gateway_is_published_beyond_loopback() {
    for (name, service) in services() {
        for port in service["ports"].as_array().into_iter().flatten() {
            let host_ip = port["host_ip"].as_str().unwrap_or("");
            assert!(
                name == "gateway" || host_ip == "127.0.0.1",
                "{name} publishes {port} beyond loopback"
            );
        }
    }
    assert!(
        services()["schema-registry"]["ports"].is_null(),
        "the registry is published"
    );
    // The gateway's operator port (`/v1/admin/…`) only on the host's loopback.
    let gateway = &services()["gateway"];
    assert_eq!(
        gateway["environment"]["IMSTREAM__GATEWAY__ADMIN_ADDR"], "0.0.0.0:6061",
        "{gateway}"
    );
    let admin: Vec<&serde_json::Value> = gateway["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["target"].as_u64() == Some(6061))
        .collect();
    assert!(
        admin.len() == 1 && admin[0]["host_ip"] == "127.0.0.1",
        "operator port published as {admin:?}"
    );
    let grafana = &services()["grafana"]["environment"];
    assert_eq!(grafana["GF_AUTH_ANONYMOUS_ENABLED"], "false");
}

/// The mount of `target` in `service`: its source path.
fn mount_source<'a>(service: &'a Value, target: &str) -> Option<&'a str> {
    service["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["target"] == target)
        .and_then(|v| v["source"].as_str())
}

#[test]
fn prometheus_loads_the_alert_rules_and_sends_them_to_alertmanager() {
    let prometheus = &services()["prometheus"];
    let rules = mount_source(prometheus, "/etc/prometheus/alerts.yml").expect("alerts.yml mounted");
    assert_eq!(
        Path::new(rules),
        repo().join("docker/prometheus/alerts.yml")
    );
    let config = std::fs::read_to_string(repo().join("docker/prometheus/prometheus.yml")).unwrap();
    // rule_files are relative to the config file: /etc/prometheus/alerts.yml.
    assert!(
        config.contains("rule_files:\n  - alerts.yml"),
        "prometheus.yml does not load alerts.yml"
    );
    assert!(
        config.contains("targets: [\"alertmanager:9093\"]"),
        "{config}"
    );
    let alertmanager = &services()["alertmanager"];
    assert!(alertmanager["image"]
        .as_str()
        .unwrap_or_default()
        .starts_with("prom/alertmanager:"));
    let routes = mount_source(alertmanager, "/etc/alertmanager/alertmanager.yml")
        .expect("alertmanager.yml mounted");
    assert_eq!(
        Path::new(routes),
        repo().join("docker/prometheus/alertmanager.yml")
    );
    let command: Vec<&str> = alertmanager["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(command.contains(&"--config.file=/etc/alertmanager/alertmanager.yml"));
}

/// Alert names of a rules file (`- alert: Name` lines).
fn alert_names(rules: &str) -> BTreeSet<String> {
    rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert:"))
        .map(|n| n.trim().to_string())
        .collect()
}

#[test]
fn alert_rules_use_exported_metrics_cover_the_seeds_and_each_has_a_unit_test() {
    let rules = std::fs::read_to_string(repo().join("docker/prometheus/alerts.yml")).unwrap();
    let code: String = rules
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let used = metric_names(&code);
    for name in &used {
        assert!(
            m::ALL.contains(&name.as_str()),
            "alerts.yml queries {name}, which src/metrics.rs does not export"
        );
    }
    // The seeds' thresholds (seed 003 §11.2, seed 000 §4, §5.3, §11) and
    // the two counters that must never move.
    let alerts = alert_names(&rules);
    for wanted in [
        "SendLatencyP99High",
        "PushLatencyP99High",
        "ConsumerLagHigh",
        "RedisLatencyP99High",
        "MySQLSlowQueryRateHigh",
        "GatewayConnectionsHigh",
        "DeadLettersWaiting",
        "PipelineDegraded",
        "ReplicaLagOverBound",
        "NextMonthTableMissing",
        "CurrentMonthNotWritable",
        "ActiveMonthMissing",
        "SeqCollision",
        "PipelineRewound",
    ] {
        assert!(
            alerts.contains(wanted),
            "no alert {wanted}; have {alerts:?}"
        );
    }
    for name in [
        m::SEND_ACK_LATENCY,
        m::DELIVERY_LATENCY,
        m::PIPELINE_LAG,
        m::REDIS_COMMAND_LATENCY,
        m::MYSQL_SLOW_QUERIES_TOTAL,
        m::GATEWAY_SESSIONS,
        m::PIPELINE_DLQ_PENDING,
        m::PIPELINE_DEGRADED,
        m::MYSQL_REPLICA_LAG,
        m::SHARD_NEXT_MONTH_READY,
        m::SHARD_CURRENT_MONTH_WRITABLE,
        m::SHARD_ACTIVE_MONTH,
        m::SEQ_COLLISIONS_TOTAL,
        m::PIPELINE_REWINDS_TOTAL,
    ] {
        assert!(used.contains(name), "no alert reads {name}");
    }
    // Every alert is unit-tested: evaluated once firing (an expected
    // alert) and once cleared (`exp_alerts: []`).
    let tests = std::fs::read_to_string(repo().join("docker/prometheus/alerts.test.yml")).unwrap();
    for alert in &alerts {
        let evals: Vec<&str> = tests
            .split("- eval_time:")
            .skip(1)
            .filter(|e| e.contains(&format!("alertname: {alert}\n")))
            .collect();
        assert!(
            evals.iter().any(|e| e.contains("exp_labels:")),
            "{alert} is never tested firing"
        );
        assert!(
            evals.iter().any(|e| e.contains("exp_alerts: []")),
            "{alert} is never tested cleared"
        );
    }
}

#[test]
fn alert_rules_pass_promtool_checks_and_their_unit_tests() {
    let installed = Command::new("bash")
        .arg(repo().join("docker/local/promtool"))
        .output()
        .expect("run docker/local/promtool");
    assert!(
        installed.status.success(),
        "docker/local/promtool: {}",
        String::from_utf8_lossy(&installed.stderr)
    );
    let promtool = String::from_utf8(installed.stdout)
        .unwrap()
        .trim()
        .to_string();
    for args in [
        ["check", "config", "prometheus.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(repo().join("docker/prometheus"))
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
