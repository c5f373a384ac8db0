//! A real third-party client, tinode-sdk from npm, drives the WebSocket
//! gateway: hi, token and basic login, subscribe, publish (with and without
//! a client_mid), leave, and the refusals (403 for a non-member, 409 for a
//! publish after leave). The messages it published are stored once each.

mod common;

use std::time::Duration;

use common::{wait_for, Stack};

const TOPIC: &str = "grpTinodeSdk";
const OWNER: i64 = 1;
const MEMBER: i64 = 2;
const DEV_UID: i64 = 3;

#[tokio::test]
async fn tinode_sdk_client_sends_through_the_gateway() {
    // Stack::running(), plus a development user for `basic` login (the
    // gateway reads dev_users from the config it starts with).
    let mut stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    stack
        .world
        .config
        .auth
        .dev_users
        .push(imstream::config::DevUser {
            tenant,
            uid: DEV_UID,
            login: "sdkdev".into(),
            password: "sdkdev-pass".into(),
            name: None,
            photo: None,
        });
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    stack.start_gateway("node-a").await;
    stack.create_group(TOPIC, OWNER, &[MEMBER, DEV_UID]).await;

    common::run_node(
        "tinode_send.js",
        &[
            ("GATEWAY_HOST", stack.gateway_addr(0).to_string()),
            ("TOKEN", stack.token(MEMBER, "sdk")),
            ("TOPIC", TOPIC.to_string()),
            ("BASIC", "sdkdev:sdkdev-pass".to_string()),
        ],
        Duration::from_secs(60),
    )
    .await;

    // Two plain publishes, one with client_mid x1 (its retry is a duplicate)
    // by the token user, then one by the basic user: four rows, seqs 1..=4.
    let pool = stack.pool();
    let month = imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string();
    let row =
        |seq: i64, from: i64, cmid: &str, txt: &str| (seq, from, cmid.to_string(), txt.to_string());
    let expected = vec![
        row(1, MEMBER, "", "hello from tinode-sdk"),
        row(2, MEMBER, "", "second message"),
        row(3, MEMBER, "x1", "with a client id"),
        row(4, DEV_UID, "", "hello from basic"),
    ];
    wait_for("the SDK's messages stored", Duration::from_secs(30), || {
        let pool = pool.clone();
        let month = month.clone();
        let expected = expected.clone();
        async move {
            // The SDK sends plain text as a bare JSON string. JSON_UNQUOTE's
            // result is flagged binary, so it is read as bytes.
            let rows: Vec<(i64, i64, Option<String>, Option<Vec<u8>>)> = sqlx::query_as(&format!(
                "SELECT seqid, from_user, CAST(client_msg_id AS CHAR), JSON_UNQUOTE(content) \
                 FROM im_group_messages_{month} WHERE topic = ? ORDER BY seqid"
            ))
            .bind(TOPIC)
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
            let rows: Vec<(i64, i64, String, String)> = rows
                .into_iter()
                .map(|(s, f, c, t)| {
                    (
                        s,
                        f,
                        c.unwrap_or_default(),
                        String::from_utf8_lossy(&t.unwrap_or_default()).into_owned(),
                    )
                })
                .collect();
            if rows == expected {
                Ok(())
            } else {
                Err(format!("{rows:?}"))
            }
        }
    })
    .await;
}
