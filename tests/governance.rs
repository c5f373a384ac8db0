//! Group governance and admin commands (seed 002 §5, §7.2 and §10) against
//! the real services, across two gateways:
//!
//! - a role change by admin command reaches the user's sessions on every
//!   gateway, and admin actions become allowed (a kick that was refused
//!   now evicts the member's session);
//! - a mute by admin command makes the muted user's next send on another
//!   gateway fail with GROUP_MUTED;
//! - dissolving a group evicts members' sessions and refuses further sends;
//! - a command delivered twice executes once and yields one result;
//! - bad commands are rejected with a result that says why.

mod common;
mod realtime_support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use common::{call, read_events, send_http, wait_for, Stack};
use imstream::events::{AdminResult, GroupEvent, GroupEventBody};
use imstream::kafka::topics::TopicKind;
use realtime_support::{usr, Client, DELIVERY};

/// Puts one admin command on the commands topic through gateway `addr`.
async fn command(stack: &Stack, addr: SocketAddr, id: &str, mut body: Value) {
    body["command_id"] = json!(id);
    body["tenant"] = json!(stack.tenant());
    body["operator"] = json!("ops@example.com");
    let resp = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/admin/commands",
            stack.admin_addr_of(addr)
        ))
        .bearer_auth(&stack.config().auth.admin_token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    assert_eq!(status, 202, "{}", resp.text().await.unwrap_or_default());
}

/// Results on the results topic until one for `id` has arrived.
async fn result_of(stack: &Stack, id: &str) -> AdminResult {
    let results = read_events::<AdminResult>(stack.config(), TopicKind::AdminResults, |rs| {
        rs.iter().any(|r| r.command_id == id)
    })
    .await;
    results.into_iter().find(|r| r.command_id == id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_change_reaches_every_gateway_and_admin_actions_become_allowed() {
    let stack = Stack::realtime(2).await;
    let (gw0, gw1) = (stack.gateway_addr(0), stack.gateway_addr(1));
    const TOPIC: &str = "grpRoles";
    const OWNER: i64 = 1;
    const ALICE: i64 = 2;
    const CAROL: i64 = 3;
    stack.create_group(TOPIC, OWNER, &[ALICE, CAROL]).await;
    let alice_phone =
        Client::open_sub(gw0, &stack.token(ALICE, "phone"), TOPIC, "alice-phone").await;
    let alice_web = Client::open_sub(gw1, &stack.token(ALICE, "web"), TOPIC, "alice-web").await;
    let mut carol = Client::open_sub(gw1, &stack.token(CAROL, "phone"), TOPIC, "carol").await;

    // A plain member may not remove anyone.
    let kick = format!("/v1/groups/{TOPIC}/members/{CAROL}");
    let (status, body) = call(&stack, gw0, ALICE, "DELETE", &kick, json!(null)).await;
    assert_eq!(status, 403, "{body}");

    command(
        &stack,
        gw0,
        "make-alice-admin",
        json!({"kind": "group.admin.set", "topic": TOPIC, "uid": ALICE}),
    )
    .await;
    let result = result_of(&stack, "make-alice-admin").await;
    assert_eq!(result.status, "ok", "{result:?}");
    assert_eq!(result.event_ids.len(), 1);

    // Both of Alice's sessions, on both gateways, learn their new role.
    for client in [&alice_phone, &alice_web] {
        let pres = client
            .expect("pres me acs", DELIVERY, |f| {
                f["pres"]["topic"] == json!("me")
                    && f["pres"]["src"] == json!(TOPIC)
                    && f["pres"]["what"] == json!("acs")
            })
            .await;
        assert_eq!(pres["pres"]["role"], json!("admin"), "{pres}");
        assert!(
            pres["pres"]["dacs"]["given"]
                .as_str()
                .unwrap()
                .contains('A'),
            "{pres}"
        );
    }
    // Other members see the change on the topic.
    carol
        .expect("pres acs of alice", DELIVERY, |f| {
            f["pres"]["topic"] == json!(TOPIC)
                && f["pres"]["src"] == json!(usr(ALICE))
                && f["pres"]["role"] == json!("admin")
        })
        .await;

    // Now Alice may remove Carol: Carol's session is evicted.
    let (status, body) = wait_for("alice's kick accepted", DELIVERY, || async {
        match call(&stack, gw0, ALICE, "DELETE", &kick, json!(null)).await {
            (202, body) => Ok((202, body)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(status, 202, "{body}");
    carol
        .expect("ctrl 205 evicted", DELIVERY, |f| {
            f["ctrl"]["code"] == json!(205) && f["ctrl"]["topic"] == json!(TOPIC)
        })
        .await;
    carol
        .expect("pres me gone", DELIVERY, |f| {
            f["pres"]["topic"] == json!("me") && f["pres"]["what"] == json!("gone")
        })
        .await;
    // Once the removal is projected, Carol can no longer attach or send.
    let deadline = std::time::Instant::now() + DELIVERY;
    loop {
        let ctrl = carol.request(json!({"sub": {"topic": TOPIC}})).await;
        if ctrl["code"] == json!(403) {
            break;
        }
        if ctrl["code"] == json!(200) {
            carol.leave(TOPIC).await; // the removal is not projected yet
        }
        assert!(
            std::time::Instant::now() < deadline,
            "carol still attaches: {ctrl}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = send_http(
        &reqwest::Client::new(),
        gw1,
        &stack.token(CAROL, "http"),
        TOPIC,
        "c1",
        "hi",
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mute_by_admin_command_refuses_the_next_send_on_another_gateway() {
    let stack = Stack::realtime(2).await;
    let (gw0, gw1) = (stack.gateway_addr(0), stack.gateway_addr(1));
    const TOPIC: &str = "grpMute";
    const OWNER: i64 = 1;
    const ALICE: i64 = 2;
    stack.create_group(TOPIC, OWNER, &[ALICE]).await;
    let mut alice = Client::open_sub(gw1, &stack.token(ALICE, "phone"), TOPIC, "alice").await;
    alice.send_text(TOPIC, "before").await;

    let until = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    command(
        &stack,
        gw0,
        "mute-alice",
        json!({"kind": "group.member.mute", "topic": TOPIC, "uid": ALICE, "until": until}),
    )
    .await;
    assert_eq!(result_of(&stack, "mute-alice").await.status, "ok");
    alice
        .expect("pres me acs without W", DELIVERY, |f| {
            f["pres"]["topic"] == json!("me") && f["pres"]["what"] == json!("acs")
        })
        .await;
    // The members pipeline has the mute in Redis once the result is out
    // and the pres arrived; the very next send fails everywhere.
    let redis = stack.redis().await;
    let key = imstream::keys::TopicKeys::new(stack.tenant(), TOPIC).mutes();
    wait_for("mute projected", DELIVERY, || {
        let (mut redis, key) = (redis.clone(), key.clone());
        async move {
            let v: Option<i64> = redis::cmd("HGET")
                .arg(&key)
                .arg(ALICE)
                .query_async(&mut redis)
                .await
                .unwrap();
            v.ok_or("not yet".to_string())
        }
    })
    .await;
    let ctrl = alice.publish(TOPIC, "while muted", None).await;
    assert_eq!(ctrl["code"], json!(403), "{ctrl}");
    assert_eq!(ctrl["params"]["code"], json!("GROUP_MUTED"), "{ctrl}");
    let (status, body) = send_http(
        &reqwest::Client::new(),
        gw0,
        &stack.token(ALICE, "http"),
        TOPIC,
        "m2",
        "x",
    )
    .await;
    assert_eq!(
        (status, &body["params"]["code"]),
        (403, &json!("GROUP_MUTED")),
        "{body}"
    );

    // Lifting it (by the owner over HTTP) lets Alice send again.
    let (status, body) = call(
        &stack,
        gw0,
        OWNER,
        "PUT",
        &format!("/v1/groups/{TOPIC}/members/{ALICE}/mute"),
        json!({"until": null}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    wait_for("unmuted", DELIVERY, || async {
        let v: Option<i64> = redis::cmd("HGET")
            .arg(&key)
            .arg(ALICE)
            .query_async(&mut redis.clone())
            .await
            .unwrap();
        if v.is_none() {
            Ok(())
        } else {
            Err("still muted".to_string())
        }
    })
    .await;
    alice.send_text(TOPIC, "after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dissolving_a_group_evicts_members_and_refuses_sends() {
    let stack = Stack::realtime(2).await;
    let (gw0, gw1) = (stack.gateway_addr(0), stack.gateway_addr(1));
    const TOPIC: &str = "grpGone";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    let alice = Client::open_sub(gw0, &stack.token(2, "phone"), TOPIC, "alice").await;
    let bob = Client::open_sub(gw1, &stack.token(3, "phone"), TOPIC, "bob").await;

    // Only the owner may dissolve.
    let (status, _) = call(
        &stack,
        gw0,
        2,
        "DELETE",
        &format!("/v1/groups/{TOPIC}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = call(
        &stack,
        gw0,
        1,
        "DELETE",
        &format!("/v1/groups/{TOPIC}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    for c in [&alice, &bob] {
        c.expect("evicted", DELIVERY, |f| {
            f["ctrl"]["code"] == json!(205) && f["ctrl"]["topic"] == json!(TOPIC)
        })
        .await;
        c.expect("pres me gone", DELIVERY, |f| {
            f["pres"]["what"] == json!("gone") && f["pres"]["src"] == json!(TOPIC)
        })
        .await;
    }
    let http = reqwest::Client::new();
    let (status, body) = wait_for("sends refused", DELIVERY, || async {
        match send_http(&http, gw1, &stack.token(3, "http"), TOPIC, "late", "late").await {
            (404, body) => Ok((404, body)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        (status, &body["params"]["code"]),
        (404, &json!("GROUP_DISSOLVED")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_delivered_twice_executes_once_and_yields_one_result() {
    let mut stack = Stack::prepared(None).await;
    for p in ["members", "commands"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const TOPIC: &str = "grpOnce";
    stack.create_group(TOPIC, 1, &[2, 3]).await;

    command(
        &stack,
        gw,
        "admin-2",
        json!({"kind": "group.admin.set", "topic": TOPIC, "uid": 2}),
    )
    .await;
    command(
        &stack,
        gw,
        "admin-2",
        json!({"kind": "group.admin.set", "topic": TOPIC, "uid": 2}),
    )
    .await;
    // A later command on the same group: its result and its event come
    // after both deliveries of the first.
    command(
        &stack,
        gw,
        "admin-3",
        json!({"kind": "group.admin.set", "topic": TOPIC, "uid": 3}),
    )
    .await;
    // And bad commands get a result that says why.
    command(
        &stack,
        gw,
        "kick-owner",
        json!({"kind": "group.member.remove", "topic": TOPIC, "uid": 1}),
    )
    .await;
    command(
        &stack,
        gw,
        "no-group",
        json!({"kind": "group.delete", "topic": "grpNoSuchGroup"}),
    )
    .await;

    let results = read_events::<AdminResult>(stack.config(), TopicKind::AdminResults, |rs| {
        rs.iter().any(|r| r.command_id == "no-group")
    })
    .await;
    let once: Vec<&AdminResult> = results
        .iter()
        .filter(|r| r.command_id == "admin-2")
        .collect();
    assert_eq!(once.len(), 1, "{results:?}");
    assert_eq!(once[0].status, "ok");
    let by_id = |id: &str| results.iter().find(|r| r.command_id == id).unwrap();
    assert_eq!(by_id("admin-3").status, "ok");
    assert_eq!(by_id("kick-owner").status, "rejected");
    assert!(
        by_id("kick-owner").message.contains("owner"),
        "{:?}",
        by_id("kick-owner")
    );
    assert_eq!(by_id("no-group").status, "rejected");

    let sentinel = by_id("admin-3").event_ids[0].clone();
    let events = read_events::<GroupEvent>(stack.config(), TopicKind::GroupEvents, |es| {
        es.iter().any(|e| e.event_id == sentinel)
    })
    .await;
    let role_changes: Vec<&GroupEvent> = events
        .iter()
        .filter(|e| {
            e.topic == TOPIC
                && matches!(&e.body, GroupEventBody::MemberRoleChanged(c) if c.uid == 2)
        })
        .collect();
    assert_eq!(role_changes.len(), 1, "{role_changes:?}");
    assert_eq!(role_changes[0].event_id, once[0].event_ids[0]);
    let role: String =
        sqlx::query_scalar("SELECT role FROM im_group_members WHERE topic = ? AND uid = 2")
            .bind(TOPIC)
            .fetch_one(&stack.pool())
            .await
            .unwrap();
    assert_eq!(role, "admin");
    let recorded: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM im_admin_commands WHERE command_id = 'admin-2' AND status = 'ok'",
    )
    .fetch_one(&stack.pool())
    .await
    .unwrap();
    assert_eq!(recorded, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ownership_transfer_mute_all_and_leaving_follow_the_rules() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const TOPIC: &str = "grpRules2";
    const OWNER: i64 = 1;
    const ALICE: i64 = 2;
    const BOB: i64 = 3;
    stack.create_group(TOPIC, OWNER, &[ALICE, BOB]).await;
    let pool = stack.pool();
    let role_of = |uid: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT role FROM im_group_members WHERE topic = ? AND uid = ?",
            )
            .bind(TOPIC)
            .bind(uid)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };

    // The owner cannot leave; a member cannot transfer ownership.
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/{OWNER}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = call(
        &stack,
        gw,
        ALICE,
        "PUT",
        &format!("/v1/groups/{TOPIC}/owner"),
        json!({"uid": ALICE}),
    )
    .await;
    assert_eq!(status, 403);

    // Transfer: Alice owns the group, the old owner is an admin.
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "PUT",
        &format!("/v1/groups/{TOPIC}/owner"),
        json!({"uid": ALICE}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    wait_for("ownership moved", DELIVERY, || async {
        match (
            role_of(ALICE).await.as_deref(),
            role_of(OWNER).await.as_deref(),
        ) {
            (Some("owner"), Some("admin")) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let owner: i64 = sqlx::query_scalar("SELECT owner_uid FROM im_groups WHERE topic = ?")
        .bind(TOPIC)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(owner, ALICE);

    // Mute all (by the new owner): members are refused, admins still send.
    let (status, _) = call(
        &stack,
        gw,
        ALICE,
        "PUT",
        &format!("/v1/groups/{TOPIC}/mute"),
        json!({"mute_all": true}),
    )
    .await;
    assert_eq!(status, 202);
    let http = reqwest::Client::new();
    let refused = wait_for("bob muted", DELIVERY, || async {
        match send_http(
            &http,
            gw,
            &stack.token(BOB, "http"),
            TOPIC,
            &common::unique_id(),
            "x",
        )
        .await
        {
            (403, body) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(refused["params"]["code"], json!("GROUP_MUTED"), "{refused}");
    let (status, _) = send_http(
        &http,
        gw,
        &stack.token(OWNER, "http"),
        TOPIC,
        "admin-speaks",
        "x",
    )
    .await;
    assert_eq!(status, 202, "admins are not muted by mute-all");

    // Bob leaves; his sends are refused once that is projected.
    let (status, _) = call(
        &stack,
        gw,
        BOB,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/{BOB}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202);
    wait_for("bob gone", DELIVERY, || async {
        match role_of(BOB).await {
            None => Ok(()),
            Some(r) => Err(r),
        }
    })
    .await;
    let (status, _) = send_http(
        &http,
        gw,
        &stack.token(BOB, "http"),
        TOPIC,
        "after-leave",
        "x",
    )
    .await;
    assert_eq!(status, 403);
    // Malformed and unknown targets get clear errors.
    let (status, _) = call(
        &stack,
        gw,
        ALICE,
        "PUT",
        &format!("/v1/groups/{TOPIC}/members/{BOB}/role"),
        json!({"role": "emperor"}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = call(
        &stack,
        gw,
        ALICE,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/999"),
        json!(null),
    )
    .await;
    assert_eq!(status, 404);
}
