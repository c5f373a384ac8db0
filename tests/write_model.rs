//! The group write model (issue 30) against the real services: commands
//! are checked against one consistent state per group, not against the
//! projections the pipelines write later. Every race here runs with every
//! projector stopped, and the projections are caught up afterwards:
//!
//! - a removed (kicked or left) member's `{pub}`, HTTP sends, `{get}` and
//!   `{note}` are refused right after the removal's ack, on every gateway,
//!   and no `{data}` of a later seq reaches them once the fan-out runs;
//! - a dissolved group accepts nothing;
//! - per-user caps (favorites, history clears) hold under 50 concurrent
//!   requests;
//! - the write model survives a Redis that lost it and one that comes back
//!   older (another incarnation): it is re-derived from MySQL and the log;
//! - requests are bounded (`limits.members_per_request`), operators add in
//!   bulk, a retried command gets the same answer and the same events.
//!
//! The races and consent cases (two concurrent ownership transfers, a
//! blocked adder, a 20,001-user create, invitations) are in the
//! adversarial suite: tests/adversary/governance.rs.

mod common;
mod groups_support;
mod realtime_support;

use serde_json::{json, Value};

use common::{call, send_http, wait_for, Stack};
use groups_support::*;
use realtime_support::{usr, Client, DELIVERY};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_member_is_refused_from_the_ack_on_with_every_projector_stopped() {
    let mut stack = everything(2).await;
    let (gw0, gw1) = (stack.gateway_addr(0), stack.gateway_addr(1));
    const TOPIC: &str = "grpGone";
    const OWNER: i64 = 1;
    const KICKED: i64 = 2;
    const STAYS: i64 = 3;
    const LEAVER: i64 = 4;
    stack
        .create_group(TOPIC, OWNER, &[KICKED, STAYS, LEAVER])
        .await;
    let mut owner = Client::open_sub(gw0, &stack.token(OWNER, "o"), TOPIC, "owner@gw0").await;
    let mut kicked = [
        Client::open_sub(gw0, &stack.token(KICKED, "a"), TOPIC, "kicked@gw0").await,
        Client::open_sub(gw1, &stack.token(KICKED, "b"), TOPIC, "kicked@gw1").await,
    ];
    let stays = [
        Client::open_sub(gw0, &stack.token(STAYS, "c"), TOPIC, "stays@gw0").await,
        Client::open_sub(gw1, &stack.token(STAYS, "d"), TOPIC, "stays@gw1").await,
    ];
    let before = owner.send_text(TOPIC, "before").await;
    for c in kicked.iter().chain(&stays) {
        c.expect_data(TOPIC, before).await;
    }

    stop_projectors(&mut stack).await;
    let (status, body) = call(
        &stack,
        gw0,
        OWNER,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/{KICKED}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = call(
        &stack,
        gw1,
        LEAVER,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/{LEAVER}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "{body}");

    // Right after the acks, no projector running, on both gateways.
    let refused = |ctrl: &Value| [json!(403), json!(409)].contains(&ctrl["code"]);
    for c in kicked.iter_mut() {
        let label = c.label.clone();
        let ctrl = c.publish(TOPIC, "still here?", None).await;
        assert!(refused(&ctrl), "{label} pub: {ctrl}");
        let ctrl = c
            .request(json!({"get": {"topic": TOPIC, "what": "data"}}))
            .await;
        assert!(refused(&ctrl), "{label} get: {ctrl}");
        c.note(TOPIC, "kp", None).await;
    }
    for (uid, addr) in [(KICKED, gw0), (KICKED, gw1), (LEAVER, gw0), (LEAVER, gw1)] {
        let (status, body) = send_http(
            &reqwest::Client::new(),
            addr,
            &stack.token(uid, "http"),
            TOPIC,
            &common::unique_id(),
            "intruder",
        )
        .await;
        assert_eq!(status, 403, "usr{uid} HTTP send via {addr}: {body}");
    }
    // Typing of the member who stays reaches the owner; the kicked one's
    // never does.
    let mut stays = stays;
    stays[0].note(TOPIC, "kp", None).await;
    let from = |uid: i64| {
        move |f: &Value| f["info"]["topic"] == json!(TOPIC) && f["info"]["from"] == json!(usr(uid))
    };
    owner
        .expect("the member's {info kp}", DELIVERY, from(STAYS))
        .await;
    let after = owner.send_text(TOPIC, "after").await;

    // The projectors catch up: the later message reaches the members who
    // stay on both gateways, never the removed ones.
    start_projectors(&mut stack).await;
    for c in &stays {
        c.expect_data(TOPIC, after).await;
    }
    members_become(&stack, TOPIC, vec![(OWNER, "owner"), (STAYS, "member")]).await;
    assert_eq!(owner.count(from(KICKED)), 0, "{:?}", owner.frames());
    for c in &kicked {
        assert_eq!(c.data_seqs(TOPIC), vec![before], "{}", c.label);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dissolved_group_accepts_nothing() {
    let mut stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    const TOPIC: &str = "grpDissolved";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    stop_projectors(&mut stack).await;
    let (status, body) = call(
        &stack,
        gw,
        1,
        "DELETE",
        &format!("/v1/groups/{TOPIC}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "{body}");

    for uid in [1, 2] {
        let (status, body) = send_http(
            &reqwest::Client::new(),
            gw,
            &stack.token(uid, "http"),
            TOPIC,
            &common::unique_id(),
            "anyone?",
        )
        .await;
        assert_eq!(status, 404, "usr{uid} send: {body}");
    }
    for (uid, method, path, body) in [
        (
            1,
            "POST",
            format!("/v1/groups/{TOPIC}/members"),
            json!({"uid": 9}),
        ),
        (
            1,
            "PUT",
            format!("/v1/groups/{TOPIC}/owner"),
            json!({"uid": 2}),
        ),
        (
            1,
            "PUT",
            format!("/v1/groups/{TOPIC}/members/2/role"),
            json!({"role": "admin"}),
        ),
        (
            1,
            "PUT",
            format!("/v1/groups/{TOPIC}/mute"),
            json!({"mute_all": true}),
        ),
        (
            1,
            "DELETE",
            format!("/v1/groups/{TOPIC}/members/2"),
            json!(null),
        ),
        (
            2,
            "DELETE",
            format!("/v1/groups/{TOPIC}/members/2"),
            json!(null),
        ),
        (1, "DELETE", format!("/v1/groups/{TOPIC}"), json!(null)),
    ] {
        let (status, reply) = call(&stack, gw, uid, method, &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {reply}");
    }
    let mut c = Client::open(gw, &stack.token(3, "web"), "member").await;
    let ctrl = c.request(json!({"sub": {"topic": TOPIC}})).await;
    assert_eq!(ctrl["code"], json!(404), "{ctrl}");
    start_projectors(&mut stack).await;
}

/// Sends `n` messages as `uid` and waits until all are stored; their seqs.
async fn stored_messages(stack: &Stack, uid: i64, topic: &str, n: usize) -> Vec<i64> {
    let client = reqwest::Client::new();
    let mut seqs = Vec::new();
    for i in 0..n {
        let (status, body) = send_http(
            &client,
            stack.gateway_addr(0),
            &stack.token(uid, "http"),
            topic,
            &format!("m{i}"),
            &format!("message {i}"),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        seqs.push(body["seq"].as_i64().unwrap());
    }
    let last = *seqs.last().unwrap();
    realtime_support::wait_stored(&stack.pool(), topic, last).await;
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_user_caps_hold_under_50_concurrent_requests() {
    let mut stack = Stack::prepared_with(None, |c| {
        c.limits.favorites_per_user = 5;
        c.limits.dellog_per_user = 5;
        c.limits.clears = imstream::config::BucketConfig::new(1000, 1000);
    })
    .await;
    stack.world.config.gateway.heartbeat_secs = 60;
    start_projectors(&mut stack).await;
    let gw = stack.start_gateway("gw0").await;
    const TOPIC: &str = "grpCaps";
    stack.create_group(TOPIC, 1, &[2]).await;
    let seqs = stored_messages(&stack, 1, TOPIC, 50).await;
    // No projection can catch up during the race.
    stop_projectors(&mut stack).await;

    let favorites = futures::future::join_all(seqs.iter().map(|seq| {
        let path = format!("/v1/me/favorites/{TOPIC}/{seq}");
        let stack = &stack;
        async move { call(stack, gw, 2, "PUT", &path, json!(null)).await }
    }))
    .await;
    let accepted = favorites.iter().filter(|(s, _)| *s == 202).count();
    let refused = favorites.iter().filter(|(s, _)| *s == 409).count();
    assert_eq!(
        (accepted, refused),
        (5, 45),
        "favorites: {:?}",
        favorites.iter().map(|(s, _)| *s).collect::<Vec<_>>()
    );

    let clears = futures::future::join_all(seqs.iter().map(|seq| {
        let path = format!("/v1/groups/{TOPIC}/history/clear");
        let stack = &stack;
        let body = json!({"ranges": [{"low": seq}]});
        async move { call(stack, gw, 2, "POST", &path, body).await }
    }))
    .await;
    let accepted = clears.iter().filter(|(s, _)| *s < 300).count();
    let refused = clears.iter().filter(|(s, _)| *s == 409).count();
    assert_eq!(
        (accepted, refused),
        (5, 45),
        "clears: {:?}",
        clears.iter().map(|(s, _)| *s).collect::<Vec<_>>()
    );

    // What the projections hold once caught up: the caps, not more.
    start_projectors(&mut stack).await;
    let pool = stack.pool();
    for (what, sql) in [
        (
            "favorites",
            "SELECT COUNT(*) FROM im_favorites WHERE uid = 2",
        ),
        (
            "history-clear rows",
            "SELECT COUNT(*) FROM im_dellog WHERE topic = 'grpCaps' AND deletedfor = 2",
        ),
    ] {
        wait_for(&format!("the {what} projected"), DELIVERY, || {
            let pool = pool.clone();
            async move {
                let n: i64 = sqlx::query_scalar(sql)
                    .fetch_one(&pool)
                    .await
                    .map_err(|e| e.to_string())?;
                if n == 5 {
                    Ok(())
                } else {
                    Err(format!("{n} {what}"))
                }
            }
        })
        .await;
    }
    // Once caught up, a refused favorite (of a message still in view) is
    // still refused.
    let cleared: Vec<i64> = seqs
        .iter()
        .zip(&clears)
        .filter(|(_, (status, _))| *status < 300)
        .map(|(seq, _)| *seq)
        .collect();
    let refused_seq = seqs
        .iter()
        .zip(&favorites)
        .find(|(seq, (status, _))| *status == 409 && !cleared.contains(seq))
        .map(|(seq, _)| *seq)
        .unwrap();
    let path = format!("/v1/me/favorites/{TOPIC}/{refused_seq}");
    let (status, body) = call(&stack, gw, 2, "PUT", &path, json!(null)).await;
    assert_eq!(status, 409, "{body}");
}

/// Every key of the group's state in Redis (its hash tag), and the
/// tenant's generation marker: what a Redis that lost its data lacks.
async fn forget_group(stack: &Stack, topic: &str) {
    let mut redis = stack.redis().await;
    let keys = common::tenant_keys(&mut redis, stack.tenant(), topic).await;
    let base = imstream::keys::TopicKeys::new(stack.tenant(), topic);
    let generation = imstream::keys::TenantKeys::new(stack.tenant()).generation();
    for key in keys {
        if key.starts_with(&format!("{}:", base.base())) || key == generation {
            let _: i64 = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_that_lost_the_group_rebuilds_it_from_mysql_and_the_log() {
    let mut stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    const TOPIC: &str = "grpLost";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    // The removal is acknowledged but not projected: only the log has it.
    stack.stop_pipeline("members").await;
    let (status, body) = call(
        &stack,
        gw,
        1,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/2"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    forget_group(&stack, TOPIC).await;

    let (status, body) = send_settled(&stack, 2, TOPIC, "back?").await;
    assert_eq!(status, 403, "the removed member after the loss: {body}");
    let (status, body) = send_settled(&stack, 3, TOPIC, "still in").await;
    assert_eq!(status, 202, "a member after the loss: {body}");
    // Governance goes on from the rebuilt state.
    let (status, body) = call(
        &stack,
        gw,
        1,
        "PUT",
        &format!("/v1/groups/{TOPIC}/owner"),
        json!({"uid": 3}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    stack.start_pipeline("members").await;
    members_become(&stack, TOPIC, vec![(1, "admin"), (3, "owner")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_that_comes_back_older_is_fenced_and_rebuilt() {
    let mut stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    const TOPIC: &str = "grpStale";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    let (status, body) = send_settled(&stack, 2, TOPIC, "hello").await;
    assert_eq!(status, 202, "{body}");
    stack.stop_pipeline("members").await;
    let (status, body) = call(
        &stack,
        gw,
        1,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/2"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    // An older incarnation of Redis: written by another server (run_id),
    // from before the removal (2 still in the member set, the version
    // before the removal's).
    let keys = imstream::keys::TopicKeys::new(stack.tenant(), TOPIC);
    let mut redis = stack.redis().await;
    let _: () = redis::pipe()
        .hset(
            keys.meta(),
            "inc",
            "0000000000000000000000000000000000000000",
        )
        .hincr(keys.meta(), "version", -1)
        .sadd(keys.members(), 2)
        .query_async(&mut redis)
        .await
        .unwrap();

    let (status, body) = send_settled(&stack, 2, TOPIC, "back?").await;
    assert_eq!(status, 403, "the removed member on the older Redis: {body}");
    let (status, body) = send_settled(&stack, 3, TOPIC, "still in").await;
    assert_eq!(status, 202, "{body}");
    stack.start_pipeline("members").await;
    members_become(&stack, TOPIC, vec![(1, "owner"), (3, "member")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_are_bounded_and_operators_add_in_bulk() {
    let stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    const TOPIC: &str = "grpBulk";
    let (status, body) = call(
        &stack,
        gw,
        1,
        "POST",
        "/v1/groups",
        json!({"topic": TOPIC, "name": "bulk", "members": (2..=500).collect::<Vec<i64>>()}),
    )
    .await;
    assert_eq!(status, 201, "500 members are fine: {body}");
    let (status, body) = call(
        &stack,
        gw,
        1,
        "POST",
        &format!("/v1/groups/{TOPIC}/members"),
        json!({"uids": (1000..1501).collect::<Vec<i64>>()}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    // An operator adds 1,200 at once.
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/admin/commands", stack.admin_addr(0)))
        .bearer_auth(&stack.config().auth.admin_token)
        .json(&json!({"command_id": "bulk-1", "tenant": stack.tenant(), "operator": "ops",
            "kind": "group.member.add", "topic": TOPIC, "uids": (5000..6200).collect::<Vec<i64>>()}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        202,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let pool = stack.pool();
    wait_for("the bulk add projected", DELIVERY, || {
        let pool = pool.clone();
        async move {
            let n: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM im_group_members WHERE topic = ?")
                    .bind(TOPIC)
                    .fetch_one(&pool)
                    .await
                    .map_err(|e| e.to_string())?;
            if n == 500 + 1200 {
                Ok(())
            } else {
                Err(format!("{n} members"))
            }
        }
    })
    .await;
    let (status, body) = send_settled(&stack, 6199, TOPIC, "hello").await;
    assert_eq!(status, 202, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retried_command_gets_the_same_answer_and_the_same_events() {
    let mut stack = everything(1).await;
    let gw = stack.gateway_addr(0);
    const TOPIC: &str = "grpRetry";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    stop_projectors(&mut stack).await;
    let kick = |key: &'static str| {
        let token = stack.token(1, "http");
        async move {
            let resp = reqwest::Client::new()
                .delete(format!("http://{gw}/v1/groups/{TOPIC}/members/2"))
                .bearer_auth(token)
                .header("Idempotency-Key", key)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (s1, first) = kick("kick-2").await;
    assert_eq!(s1, 202, "{first}");
    let (s2, again) = kick("kick-2").await;
    assert_eq!(s2, 202, "{again}");
    assert_eq!(first["events"], again["events"]);
    assert_eq!(again["replayed"], json!(true));
    // Another command id is another command: 2 is no member now.
    let (s3, other) = kick("kick-2b").await;
    assert_eq!(s3, 404, "{other}");
    start_projectors(&mut stack).await;
    members_become(&stack, TOPIC, vec![(1, "owner"), (3, "member")]).await;
}
