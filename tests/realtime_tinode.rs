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

/// Tinode's web app menus through the real tinode-sdk (issue 40): a group
/// made with `{sub topic="new…"}` exists with its name, its creator as the
/// owner and its first message stored; typing in a one-to-one chat reaches
/// the peer as `usr<writer>` (tests/node/tinode_groups.js).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_made_in_the_app_and_typing_in_a_one_to_one_chat() {
    let stack = Stack::realtime(1).await;
    let gw = stack.gateway_addr(0);
    let out = common::run_node_output(
        "tinode_groups.js",
        &[
            ("GATEWAY", gw.to_string()),
            ("TOKEN_A", stack.token(A, "sdk")),
            ("TOKEN_B", stack.token(B, "sdk")),
        ],
        Duration::from_secs(90),
    )
    .await;
    let group = out
        .lines()
        .find_map(|l| l.strip_prefix("group="))
        .expect("the script names the group it made")
        .to_string();
    // The group as its owner reads it over HTTP once the members
    // projection has it: A alone, the owner.
    let token = stack.token(A, "http");
    let url = format!("http://{gw}/v1/groups/{group}/subscribers");
    let body = common::wait_for("the new group's members", Duration::from_secs(30), || {
        let (url, token) = (url.clone(), token.clone());
        async move {
            let body: serde_json::Value = reqwest::Client::new()
                .get(&url)
                .bearer_auth(&token)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            match body["subscribers"].as_array() {
                Some(subs) if subs.len() == 1 => Ok(body),
                _ => Err(body.to_string()),
            }
        }
    })
    .await;
    let sub = &body["subscribers"][0];
    assert_eq!(sub["user"], serde_json::json!(format!("usr{A}")), "{body}");
    assert_eq!(sub["role"], serde_json::json!("owner"), "{body}");
    assert_eq!(wait_stored(&stack.pool(), &group, 1).await, 1);
}

/// A person's own settings of a one-to-one chat from Tinode's web app,
/// through the real tinode-sdk (issue 40): Block / Unblock and Mute /
/// Unmute (`topic.updateMode`), Archive read back by another client, Pin
/// read by the peer, a token session's password change refused with what
/// to do, and Delete gone from the list another client reads
/// (tests/node/tinode_settings.js).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_persons_settings_of_a_chat_through_the_sdk() {
    let stack = Stack::realtime(1).await;
    let gw = stack.gateway_addr(0);
    common::run_node(
        "tinode_settings.js",
        &[
            ("GATEWAY", gw.to_string()),
            ("TOKEN_A", stack.token(93, "sdk")),
            ("TOKEN_B", stack.token(94, "sdk")),
        ],
        Duration::from_secs(90),
    )
    .await;
}
