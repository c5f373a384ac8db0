//! The local stack's services as `docker/local/stack` runs them: a test
//! that kills or restarts one (the fault suite, the adversarial suite's
//! Redis restart) goes through the script, after checking it names the
//! very services this test talks to.

use std::path::PathBuf;
use std::time::Instant;

pub fn stack_script() -> PathBuf {
    super::repo_root().join("docker/local/stack")
}

/// The stack script's addresses must be the ones this test talks to, or a
/// `kill` would hit another instance (another engineer's, on a shared box).
pub fn assert_same_instance() {
    let out = std::process::Command::new("bash")
        .arg(stack_script())
        .arg("env")
        .output()
        .expect("docker/local/stack env");
    let text = String::from_utf8_lossy(&out.stdout);
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .unwrap_or("")
            .to_string()
    };
    let pairs = [
        ("IMSTREAM_REDIS_URL", super::redis_url()),
        ("IMSTREAM_MYSQL_URL", super::mysql_url()),
        ("IMSTREAM_KAFKA_BROKERS", super::kafka_brokers()),
    ];
    for (name, ours) in pairs {
        assert_eq!(
            value(name),
            ours,
            "docker/local/stack (IMSTREAM_STACK_DIR, IMSTREAM_*_PORT) names another {name} \
             than this test uses: refusing to kill services"
        );
    }
}

/// `docker/local/stack ACTION SERVICE`, blocking; whether it succeeded.
pub fn stack(action: &str, service: &str) -> bool {
    stack_cmd(&[action, service])
}

/// `docker/local/stack ARGS…`, blocking; whether it succeeded.
pub fn stack_cmd(args: &[&str]) -> bool {
    let started = Instant::now();
    // A broker restarted after `kill -9` recovers every partition of every
    // test world on this machine first: give it longer than `up` waits.
    let timeout = std::env::var("IMSTREAM_STACK_TIMEOUT").unwrap_or_else(|_| "300".into());
    let ok = std::process::Command::new("bash")
        .arg(stack_script())
        .args(args)
        .env("IMSTREAM_STACK_TIMEOUT", timeout)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    eprintln!(
        "[stack] stack {}: {} after {:.1}s",
        args.join(" "),
        if ok { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    ok
}
