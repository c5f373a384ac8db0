//! Who owns a group, tried against the real services: two creates of one
//! topic name racing while the members projection lags leave one group and
//! one owner, and a forged second `GroupCreated` in the log (another group
//! id for the same topic) changes nothing.

mod common;

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
    let producer = imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
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
    let got = wait_for("the group projected", std::time::Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let m = members(&pool, topic).await;
            if m.is_empty() { Err("no members yet".to_string()) } else { Ok(m) }
        }
    })
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
    let after = wait_for("the later member projected", std::time::Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let m = members(&pool, topic).await;
            if m.iter().any(|(u, _)| *u == 5) { Ok(m) } else { Err(format!("{m:?}")) }
        }
    })
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
    let (status, _) = common::send_http(&reqwest::Client::new(), addr, &stack.token(loser, "web"), topic, "x", "intruder").await;
    assert_eq!(status, 403);
}
