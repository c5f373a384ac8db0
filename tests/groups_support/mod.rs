//! Helpers of the group write model tests (tests/write_model.rs and the
//! governance cases of tests/adversary.rs): a stack with every projector,
//! stopping and starting them around a race, and the members projection as
//! the tests wait for it.
#![allow(dead_code)]

use serde_json::{json, Value};

use crate::common::{call, send_http, wait_for, Stack};
use crate::realtime_support::DELIVERY;

/// Every pipeline and `gateways` gateways; heartbeats a minute apart, so
/// no heartbeat re-check can hide what a command did or did not do.
pub async fn everything(gateways: usize) -> Stack {
    let mut stack = Stack::prepared(None).await;
    stack.world.config.gateway.heartbeat_secs = 60;
    start_projectors(&mut stack).await;
    for i in 0..gateways {
        stack.start_gateway(&format!("gw{i}")).await;
    }
    stack
}

pub async fn start_projectors(stack: &mut Stack) {
    for p in imstream::pipeline::PIPELINES {
        stack.start_pipeline(p).await;
    }
}

pub async fn stop_projectors(stack: &mut Stack) {
    for p in imstream::pipeline::PIPELINES {
        stack.stop_pipeline(p).await;
    }
}

pub async fn members(pool: &sqlx::MySqlPool, topic: &str) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT uid, role FROM im_group_members WHERE topic = ? ORDER BY uid")
        .bind(topic)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Waits until the members projection of `topic` is `expected`.
pub async fn members_become(stack: &Stack, topic: &str, expected: Vec<(i64, &str)>) {
    let pool = stack.pool();
    let expected: Vec<(i64, String)> = expected
        .into_iter()
        .map(|(u, r)| (u, r.to_string()))
        .collect();
    wait_for(
        &format!("members of {topic} to be {expected:?}"),
        DELIVERY,
        || {
            let (pool, expected) = (pool.clone(), expected.clone());
            async move {
                let got = members(&pool, topic).await;
                if got == expected {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                }
            }
        },
    )
    .await;
}

/// An HTTP send as `uid` that is not answered 503 (a rebuild in progress
/// answers "retry"); its status and body.
pub async fn send_settled(stack: &Stack, uid: i64, topic: &str, text: &str) -> (u16, Value) {
    let client = reqwest::Client::new();
    let token = stack.token(uid, "http");
    let addr = stack.gateway_addr(0);
    wait_for(
        &format!("a settled answer to {uid}'s send"),
        DELIVERY,
        || {
            let (client, token) = (client.clone(), token.clone());
            async move {
                let cmid = crate::common::unique_id();
                match send_http(&client, addr, &token, topic, &cmid, text).await {
                    (503, body) => Err(format!("503 {body}")),
                    other => Ok(other),
                }
            }
        },
    )
    .await
}

/// `PUT /v1/me/settings` as `uid`.
pub async fn set_policy(stack: &Stack, uid: i64, policy: &str) {
    let (status, body) = call(
        stack,
        stack.gateway_addr(0),
        uid,
        "PUT",
        "/v1/me/settings",
        json!({"add_policy": policy}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}
