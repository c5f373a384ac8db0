//! Two tinode-sdk clients (the real npm package) on two different gateways
//! see each other in real time: {pres on/off}, {data} both ways and {info}
//! recv/read/kp (tests/node/tinode_realtime.js). Then the messages they
//! exchanged are stored once each.

mod common;
mod realtime_support;

use std::time::Duration;

use common::{repo_root, Stack};
use realtime_support::wait_stored;

const TOPIC: &str = "grpTinodeRealtime";
const A: i64 = 91;
const B: i64 = 92;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_tinode_sdk_clients_on_two_gateways_see_each_other() {
    let node_dir = repo_root().join("tests/node");
    for package in ["tinode-sdk", "ws", "fake-indexeddb"] {
        assert!(
            node_dir.join("node_modules").join(package).exists(),
            "npm package {package} missing: run `npm ci --prefix tests/node` (the README's test command does)"
        );
    }
    let stack = Stack::realtime(2).await;
    stack.create_group(TOPIC, A, &[B]).await;

    let output = tokio::process::Command::new("node")
        .arg("tinode_realtime.js")
        .current_dir(&node_dir)
        .env("GATEWAY_A", stack.gateway_addr(0).to_string())
        .env("GATEWAY_B", stack.gateway_addr(1).to_string())
        .env("TOKEN_A", stack.token(A, "sdk"))
        .env("TOKEN_B", stack.token(B, "sdk"))
        .env("TOPIC", TOPIC)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(90), output)
        .await
        .expect("node clients did not finish within 90 s")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "node clients failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
        output.status
    );

    // One message each way, stored once each.
    let pool = stack.pool();
    for seq in [1, 2] {
        assert_eq!(wait_stored(&pool, TOPIC, seq).await, 1, "seq {seq}");
    }
}
