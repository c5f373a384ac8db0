//! The races and consent cases of the group write model (issue 30), among
//! the adversarial suite's attackers: a group owner racing themself, a
//! user who blocked the adder, an oversized create, and users who let only
//! their contacts (or nobody) add them. Every race runs with every
//! projector stopped, and the projections are caught up afterwards.

use serde_json::{json, Value};

use crate::common::{call, wait_for};
use crate::groups_support::*;
use crate::realtime_support::{Client, DELIVERY, REPLY};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_owner_transfers_leave_exactly_one_owner() {
    // Not while the main run restarts the shared Redis.
    let _redis = crate::REDIS_IN_USE.read().await;
    let mut stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    const TOPIC: &str = "grpRace1";
    stack.create_group(TOPIC, 1001, &[1002, 1003]).await;
    stop_projectors(&mut stack).await;

    let path = format!("/v1/groups/{TOPIC}/owner");
    let (a, b) = tokio::join!(
        call(&stack, gw, 1001, "PUT", &path, json!({"uid": 1002})),
        call(&stack, gw, 1001, "PUT", &path, json!({"uid": 1003})),
    );
    let mut codes = [a.0, b.0];
    codes.sort();
    assert_eq!(codes, [202, 409], "one transfer wins: {a:?} {b:?}");
    let (winner, loser) = if a.0 == 202 {
        (1002, 1003)
    } else {
        (1003, 1002)
    };
    // Inside the projection's lag, a sequential transfer by the old owner
    // is refused as well: ownership already moved.
    let (status, body) = call(&stack, gw, 1001, "PUT", &path, json!({"uid": loser})).await;
    assert_eq!(status, 409, "{body}");
    // The new owner may govern at once; the old owner is an admin now.
    let (status, body) = call(
        &stack,
        gw,
        winner,
        "PUT",
        &format!("/v1/groups/{TOPIC}/members/{loser}/role"),
        json!({"role": "admin"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");

    start_projectors(&mut stack).await;
    let mut expected = vec![(1001, "admin"), (winner, "owner"), (loser, "admin")];
    expected.sort();
    members_become(&stack, TOPIC, expected).await;
    let owner: i64 = sqlx::query_scalar("SELECT owner_uid FROM im_groups WHERE topic = ?")
        .bind(TOPIC)
        .fetch_one(&stack.pool())
        .await
        .unwrap();
    assert_eq!(owner, winner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_adder_adds_nobody_and_a_20001_user_create_is_refused() {
    // Not while the main run restarts the shared Redis.
    let _redis = crate::REDIS_IN_USE.read().await;
    let stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    let (status, body) = call(&stack, gw, 1002, "POST", "/v1/blocks", json!({"uid": 1001})).await;
    assert!(status < 300, "block: {status} {body}");
    // The block is in force: 1001's direct message is refused.
    let client = reqwest::Client::new();
    wait_for("the block in force", DELIVERY, || {
        let client = client.clone();
        let token = stack.token(1001, "http");
        async move {
            let resp = client
                .post(format!("http://{gw}/v1/users/usr1002/messages"))
                .bearer_auth(token)
                .json(&json!({"content": {"txt": "hi"}}))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            if status == 403 && body.to_string().contains("BLOCKED") {
                Ok(())
            } else {
                Err(format!("{status} {body}"))
            }
        }
    })
    .await;

    // One request naming 1002 and 20,000 others.
    let mut huge: Vec<i64> = vec![1002];
    huge.extend(100_000..120_000);
    let (status, body) = call(
        &stack,
        gw,
        1001,
        "POST",
        "/v1/groups",
        json!({"topic": "grpHuge", "name": "huge", "members": huge}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap_or("").contains("500"),
        "the answer names the limit: {body}"
    );

    // A create naming the blocker: refused, nothing created.
    let (status, body) = call(
        &stack,
        gw,
        1001,
        "POST",
        "/v1/groups",
        json!({"topic": "grpBlocked", "name": "b", "members": [1002, 1003]}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // An add of the blocker to a group of the adder: refused.
    let (status, body) = call(
        &stack,
        gw,
        1001,
        "POST",
        "/v1/groups",
        json!({"topic": "grpAdder", "name": "a", "members": [1003]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(
        &stack,
        gw,
        1001,
        "POST",
        "/v1/groups/grpAdder/members",
        json!({"uid": 1002}),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    members_become(&stack, "grpAdder", vec![(1001, "owner"), (1003, "member")]).await;
    let (status, body) = send_settled(&stack, 1002, "grpAdder", "am I in?").await;
    assert_eq!(status, 403, "{body}");
    assert!(members(&stack.pool(), "grpHuge").await.is_empty());
    assert!(members(&stack.pool(), "grpBlocked").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_who_may_not_be_added_is_invited_and_answers() {
    // Not while the main run restarts the shared Redis.
    let _redis = crate::REDIS_IN_USE.read().await;
    let mut stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    const OWNER: i64 = 2001;
    const PRIVATE: i64 = 2002; // nobody adds them
    const CAREFUL: i64 = 2003; // contacts only; OWNER is not one
    const FRIEND: i64 = 2004; // contacts only; OWNER is one
    const OPEN: i64 = 2005;
    set_policy(&stack, PRIVATE, "nobody").await;
    set_policy(&stack, CAREFUL, "contacts").await;
    set_policy(&stack, FRIEND, "contacts").await;
    let (status, body) = call(
        &stack,
        gw,
        1,
        "PUT",
        "/v1/me/settings",
        json!({"add_policy": "everyone"}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // OWNER and FRIEND become friends.
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "POST",
        "/v1/friends/requests",
        json!({"uid": FRIEND}),
    )
    .await;
    assert!(status < 300, "{status} {body}");
    // Accepted once the request is projected.
    let accept = format!("/v1/friends/requests/{OWNER}/accept");
    wait_for("the friend request accepted", DELIVERY, || {
        let (stack, accept) = (&stack, accept.clone());
        async move {
            match call(stack, gw, FRIEND, "POST", &accept, json!(null)).await {
                (status, _) if status < 300 => Ok(()),
                (status, body) => Err(format!("{status} {body}")),
            }
        }
    })
    .await;
    let pool = stack.pool();
    wait_for("the friendship projected", DELIVERY, || {
        let pool = pool.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM im_friends WHERE uid = ? AND friend_uid = ?",
            )
            .bind(FRIEND)
            .bind(OWNER)
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if n == 1 {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
    })
    .await;

    const TOPIC: &str = "grpConsent";
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "POST",
        "/v1/groups",
        json!({"topic": TOPIC, "name": "consent", "members": [PRIVATE, CAREFUL, FRIEND, OPEN]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["invited"], json!([PRIVATE, CAREFUL]), "{body}");
    // Invited is not a member: no send, no read; the invitation shows.
    let (status, body) = send_settled(&stack, PRIVATE, TOPIC, "in?").await;
    assert_eq!(status, 403, "{body}");
    for uid in [FRIEND, OPEN] {
        let (status, body) = send_settled(&stack, uid, TOPIC, "in").await;
        assert_eq!(status, 202, "usr{uid}: {body}");
    }
    let mut private = Client::open(gw, &stack.token(PRIVATE, "web"), "private").await;
    let ctrl = private.request(json!({"sub": {"topic": TOPIC}})).await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
    // Tinode's invitation: given access the user does not want yet, so
    // their mode reads nothing.
    let acs = &ctrl["params"]["acs"];
    assert!(acs["given"].as_str().unwrap().contains("JRW"), "{ctrl}");
    assert!(!acs["mode"].as_str().unwrap().contains('R'), "{ctrl}");
    let ctrl = private
        .request(json!({"get": {"topic": TOPIC, "what": "data"}}))
        .await;
    assert!([json!(403), json!(409)].contains(&ctrl["code"]), "{ctrl}");
    // The chat list shows it as an invitation once projected.
    wait_for("the invitation in the chat list", DELIVERY, || {
        let addr = gw;
        let token = stack.token(PRIVATE, "me");
        async move {
            let mut c = Client::open(addr, &token, "private-me").await;
            c.send(json!({"sub": {"id": "m1", "topic": "me", "get": {"what": "sub"}}}))
                .await;
            let meta = c
                .expect("the chat list", REPLY, |f| {
                    f["meta"]["topic"] == json!("me")
                        || f["ctrl"]["id"] == json!("m1") && f["ctrl"]["code"] == json!(204)
                })
                .await;
            let subs = meta["meta"]["sub"].as_array().cloned().unwrap_or_default();
            match subs.iter().find(|s| s["topic"] == json!(TOPIC)) {
                Some(s)
                    if s["acs"]["mode"] == json!("JP") && s["acs"]["given"] == json!("JRWPS") =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?} in {meta}")),
            }
        }
    })
    .await;

    // Accept on the WebSocket (the web app's Accept), decline over HTTP.
    let ctrl = private
        .request(json!({"set": {"topic": TOPIC, "sub": {"mode": "JRWPS"}}}))
        .await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
    let seq = private.send_text(TOPIC, "joined").await;
    assert!(seq > 0);
    let (status, body) = call(
        &stack,
        gw,
        CAREFUL,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/invitation"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = call(
        &stack,
        gw,
        CAREFUL,
        "POST",
        &format!("/v1/groups/{TOPIC}/invitation"),
        json!(null),
    )
    .await;
    assert_eq!(status, 404, "the invitation is gone: {body}");
    stop_projectors(&mut stack).await;
    start_projectors(&mut stack).await;
    members_become(
        &stack,
        TOPIC,
        vec![
            (OWNER, "owner"),
            (PRIVATE, "member"),
            (FRIEND, "member"),
            (OPEN, "member"),
        ],
    )
    .await;
    let invites: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_group_invites WHERE topic = ?")
        .bind(TOPIC)
        .fetch_one(&stack.pool())
        .await
        .unwrap();
    assert_eq!(invites, 0);
}
