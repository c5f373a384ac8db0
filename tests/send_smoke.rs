//! The send path end to end over HTTP: a message sent to a group is acked
//! with a seq, lands in its month table once, and a retry with the same
//! client_msg_id gets the same seq back.

mod common;

use std::time::Duration;

use serde_json::json;

use common::{wait_for, Stack};

#[tokio::test]
async fn http_send_is_acked_and_stored_once() {
    let stack = Stack::running().await;
    stack.create_group("grpSmoke", 1, &[2]).await;
    let url = format!(
        "http://{}/v1/groups/grpSmoke/messages",
        stack.gateway_addr(0)
    );
    let client = reqwest::Client::new();
    let token = stack.token(2, "web");
    let send = |cmid: &'static str| {
        let client = client.clone();
        let (url, token) = (url.clone(), token.clone());
        async move {
            let resp = client
                .post(&url)
                .bearer_auth(&token)
                .json(&json!({"content": {"txt": "hello"}, "client_msg_id": cmid}))
                .send()
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let (status, first) = send("m1").await;
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["seq"], json!(1));
    let (_, second) = send("m2").await;
    assert_eq!(second["seq"], json!(2));
    let (status, retry) = send("m1").await;
    assert_eq!(
        (status, retry["seq"].clone(), retry["duplicate"].clone()),
        (202, json!(1), json!(true))
    );

    // A non-member is refused; a bad token too.
    let resp = client
        .post(&url)
        .bearer_auth(stack.token(99, "web"))
        .json(&json!({"content": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let resp = client
        .post(&url)
        .bearer_auth("garbage")
        .json(&json!({"content": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);

    let pool = stack.pool();
    let month = imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string();
    wait_for("two rows stored", Duration::from_secs(30), || {
        let pool = pool.clone();
        let month = month.clone();
        async move {
            let rows: Vec<(i64, String)> = sqlx::query_as(&format!(
                "SELECT seqid, CAST(client_msg_id AS CHAR) FROM im_group_messages_{month} WHERE topic = 'grpSmoke' ORDER BY seqid"
            ))
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if rows == vec![(1, "m1".to_string()), (2, "m2".to_string())] { Ok(()) } else { Err(format!("{rows:?}")) }
        }
    })
    .await;
}
