//! Who owns a group and who is in it, tried against the real services:
//!
//! - two creates of one topic name racing while the members projection
//!   lags leave one group and one owner, and a forged second `GroupCreated`
//!   in the log (another group id for the same topic) changes nothing;
//! - a removed member whose eviction never arrives over Pub/Sub (no fan-out
//!   runs here) still loses `{get}` at once and its attachment within a
//!   heartbeat, and cannot send;
//! - with Pub/Sub working (heartbeats too slow to matter), a kicked member
//!   loses `{get}`, `{note}`, `{pub}` and live `{data}` on every gateway.

mod common;
mod realtime_support;

use serde_json::json;

use imstream::events::{GroupCreated, GroupEvent, GroupEventBody};
use imstream::kafka::topics::TopicKind;

use common::{wait_for, Stack};

async fn members(pool: &sqlx::MySqlPool, topic: &str) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT uid, role FROM im_group_members WHERE topic = ? ORDER BY uid")
        .bind(topic)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn racing_creates_of_one_name_leave_one_group_and_one_owner() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("store").await;
    let addr = stack.start_gateway("node-a").await;
    let pool = stack.pool();
    let topic = "grpRace";

    // The members pipeline is not running: the projection lags.
    let create = |uid: i64| {
        let token = stack.token(uid, "web");
        async move {
            let resp = reqwest::Client::new()
                .post(format!("http://{addr}/v1/groups"))
                .bearer_auth(token)
                .json(&json!({"topic": topic, "name": format!("by {uid}"), "members": []}))
                .send()
                .await
                .unwrap();
            resp.status().as_u16()
        }
    };
    let (a, b) = tokio::join!(create(1), create(9));
    let mut codes = [a, b];
    codes.sort();
    assert_eq!(codes, [201, 409], "one create wins");
    let winner = if a == 201 { 1 } else { 9 };
    let loser = 10 - winner;
    // Later, still before the projection caught up: refused too.
    assert_eq!(create(loser).await, 409);

    // A forged GroupCreated for the same topic with another group id and
    // the loser as owner, produced straight into the log.
    let codec = imstream::events::EventCodec::new(&stack.config().registry.url).unwrap();
    let producer =
        imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
    let forged = GroupEvent::new(
        stack.tenant(),
        topic,
        loser,
        GroupEventBody::GroupCreated(GroupCreated {
            group_id: 777,
            name: "forged".into(),
            owner_uid: loser,
            members: vec![loser],
        }),
    );
    producer
        .send(TopicKind::GroupEvents, &forged.key(), &forged, None)
        .await
        .unwrap();

    stack.start_pipeline("members").await;
    let got = wait_for(
        "the group projected",
        std::time::Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let m = members(&pool, topic).await;
                if m.is_empty() {
                    Err("no members yet".to_string())
                } else {
                    Ok(m)
                }
            }
        },
    )
    .await;
    // A later event of the topic (same partition, after the forged one):
    // once it is projected, the forged create was handled too.
    let status = reqwest::Client::new()
        .post(format!("http://{addr}/v1/groups/{topic}/members"))
        .bearer_auth(stack.token(winner, "web"))
        .json(&json!({"uid": 5}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert!(status < 300, "add member: {status}");
    let after = wait_for(
        "the later member projected",
        std::time::Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let m = members(&pool, topic).await;
                if m.iter().any(|(u, _)| *u == 5) {
                    Ok(m)
                } else {
                    Err(format!("{m:?}"))
                }
            }
        },
    )
    .await;
    assert_eq!(got, vec![(winner, "owner".to_string())]);
    let mut expected = vec![(5, "member".to_string()), (winner, "owner".to_string())];
    expected.sort();
    assert_eq!(after, expected, "the forged create changed members");
    let (group_id, name): (i64, String) =
        sqlx::query_as("SELECT group_id, name FROM im_groups WHERE topic = ?")
            .bind(topic)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_ne!(group_id, 777);
    assert_eq!(name, format!("by {winner}"));
    // The loser cannot send.
    let (status, _) = common::send_http(
        &reqwest::Client::new(),
        addr,
        &stack.token(loser, "web"),
        topic,
        "x",
        "intruder",
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn a_removed_member_loses_reads_and_its_attachment_without_pubsub() {
    use realtime_support::Client;
    let mut stack = Stack::prepared(None).await;
    stack.world.config.gateway.heartbeat_secs = 1;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let addr = stack.start_gateway("node-a").await;
    let pool = stack.pool();
    let topic = "grpKicked";
    stack.create_group(topic, 1, &[2, 3]).await;
    let mut kicked = Client::open_sub(addr, &stack.token(2, "web"), topic, "kicked").await;
    let mut other = Client::open_sub(addr, &stack.token(3, "web"), topic, "other").await;

    let status = reqwest::Client::new()
        .delete(format!("http://{addr}/v1/groups/{topic}/members/2"))
        .bearer_auth(stack.token(1, "web"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert!(status < 300, "remove: {status}");
    wait_for(
        "the removal projected",
        std::time::Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let m = members(&pool, topic).await;
                if m.iter().any(|(u, _)| *u == 2) {
                    Err(format!("{m:?}"))
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;

    // Still attached as far as its session knows: reads are refused anyway.
    let ctrl = kicked
        .request(json!({"get": {"topic": topic, "what": "data"}}))
        .await;
    assert_eq!(ctrl["code"], json!(403), "{ctrl}");
    // Within a heartbeat or two the gateway evicts it by itself.
    kicked
        .expect(
            "{ctrl 205 evicted}",
            std::time::Duration::from_secs(10),
            |f| f["ctrl"]["code"] == json!(205) && f["ctrl"]["topic"] == json!(topic),
        )
        .await;
    // The member who stays is not evicted by the same heartbeats.
    let ctrl = other
        .request(json!({"get": {"topic": topic, "what": "data"}}))
        .await;
    assert!(ctrl["code"].as_i64().is_some_and(|c| c < 300), "{ctrl}");
    assert_eq!(
        other.count(|f| f["ctrl"]["code"] == json!(205)),
        0,
        "the member who stays was evicted"
    );
    let (status, _) = common::send_http(
        &reqwest::Client::new(),
        addr,
        &stack.token(2, "web"),
        topic,
        "x",
        "intruder",
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kicked_member_loses_everything_on_every_gateway_through_pubsub() {
    use realtime_support::{usr, Client};
    use std::time::Duration;
    // Every pipeline and two gateways, as Stack::realtime, but with
    // heartbeats a minute apart: only the Pub/Sub eviction can act in time.
    let mut stack = Stack::prepared(None).await;
    stack.world.config.gateway.heartbeat_secs = 60;
    for p in imstream::pipeline::PIPELINES {
        stack.start_pipeline(p).await;
    }
    let gw0 = stack.start_gateway("gw0").await;
    let gw1 = stack.start_gateway("gw1").await;
    let topic = "grpKickedLive";
    stack.create_group(topic, 1, &[2, 3]).await;
    let mut owner = Client::open_sub(gw0, &stack.token(1, "o"), topic, "owner@gw0").await;
    let mut kicked = [
        Client::open_sub(gw0, &stack.token(2, "a"), topic, "kicked@gw0").await,
        Client::open_sub(gw1, &stack.token(2, "b"), topic, "kicked@gw1").await,
    ];
    let mut stays = Client::open_sub(gw1, &stack.token(3, "c"), topic, "stays@gw1").await;
    let before = owner.send_text(topic, "before").await;
    for c in kicked.iter().chain([&stays]) {
        c.expect_data(topic, before).await;
    }

    let status = reqwest::Client::new()
        .delete(format!("http://{gw0}/v1/groups/{topic}/members/2"))
        .bearer_auth(stack.token(1, "o"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert!(status < 300, "remove: {status}");
    for c in &kicked {
        c.expect("{ctrl 205 evicted}", Duration::from_secs(20), |f| {
            f["ctrl"]["code"] == json!(205) && f["ctrl"]["topic"] == json!(topic)
        })
        .await;
    }
    for c in kicked.iter_mut() {
        let label = c.label.clone();
        // Refused: not a member (403) or no longer attached (409).
        let refused = |ctrl: &serde_json::Value| [json!(403), json!(409)].contains(&ctrl["code"]);
        let ctrl = c
            .request(json!({"get": {"topic": topic, "what": "data"}}))
            .await;
        assert!(refused(&ctrl), "{label} get: {ctrl}");
        let ctrl = c.publish(topic, "still here?", None).await;
        assert!(refused(&ctrl), "{label} pub: {ctrl}");
        let ctrl = c.request(json!({"sub": {"topic": topic}})).await;
        assert_eq!(ctrl["code"], json!(403), "{label} sub again: {ctrl}");
        c.note(topic, "kp", None).await;
        c.note(topic, "read", Some(before)).await;
    }
    // The member who stays notes too: the owner sees that one only.
    stays.note(topic, "kp", None).await;
    let from = |uid: i64| {
        move |f: &serde_json::Value| {
            f["info"]["topic"] == json!(topic) && f["info"]["from"] == json!(usr(uid))
        }
    };
    owner
        .expect("the member's {info kp}", Duration::from_secs(30), from(3))
        .await;
    let after = owner.send_text(topic, "after").await;
    stays.expect_data(topic, after).await;
    // The kicked sessions' notes reached nobody; no {data} after the kick.
    owner.assert_alive(topic).await;
    assert_eq!(owner.count(from(2)), 0, "{:?}", owner.frames());
    assert_eq!(stays.count(from(2)), 0, "{:?}", stays.frames());
    for c in &kicked {
        assert_eq!(c.data_seqs(topic), vec![before], "{}", c.label);
    }
}
