//! Two tinode-sdk clients (the real npm package) on two different gateways
//! see each other in real time: {pres on/off}, {data} both ways and {info}
//! recv/read/kp (tests/node/tinode_realtime.js). Then the messages they
//! exchanged are stored once each.

mod common;
mod realtime_support;

use std::time::Duration;

use common::Stack;
use realtime_support::wait_stored;

const TOPIC: &str = "grpTinodeRealtime";
const A: i64 = 91;
const B: i64 = 92;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_tinode_sdk_clients_on_two_gateways_see_each_other() {
    let stack = Stack::realtime(2).await;
    stack.create_group(TOPIC, A, &[B]).await;

    common::run_node(
        "tinode_realtime.js",
        &[
            ("GATEWAY_A", stack.gateway_addr(0).to_string()),
            ("GATEWAY_B", stack.gateway_addr(1).to_string()),
            ("TOKEN_A", stack.token(A, "sdk")),
            ("TOKEN_B", stack.token(B, "sdk")),
            ("TOPIC", TOPIC.to_string()),
        ],
        Duration::from_secs(90),
    )
    .await;

    // One message each way, stored once each.
    let pool = stack.pool();
    for seq in [1, 2] {
        assert_eq!(wait_stored(&pool, TOPIC, seq).await, 1, "seq {seq}");
    }
}
