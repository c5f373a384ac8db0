//! The chat list (issue 14) against the real services: the `me` topic
//! through tinode-sdk (tests/node/tinode_chatlist.js: conversations with
//! names and unread counts, live re-sort and badge, a read on a second
//! device, a new one-to-one conversation, a group's member list), the HTTP
//! list with its badge and catch-up, the conversations projection rebuilt
//! by `imstream replay conversations` identically (and again, redelivered),
//! and a 10,000-member group whose messages write one topic row each, never
//! a row per member.

mod common;

use std::time::Duration;

use futures::SinkExt;
use imstream::conversations::{self, Conversation};
use imstream::groups::Role;
use imstream::keys::{TopicKeys, UserKeys};
use imstream::replay::{projection, replay, ReplayArgs};
use imstream::store::dellog;
use serde_json::{json, Value};

use common::{call, send_http, wait_for, Stack, Ws};

const TEAM: &str = "grpChatsTeam";
const PAIR: &str = "grpChatsPair";
const A: i64 = 401;
const B: i64 = 402;
const C: i64 = 403;

async fn get(stack: &Stack, uid: i64, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("http://{}{path}", stack.gateway_addr(0)))
        .bearer_auth(stack.token(uid, "http"))
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Stops the conversations pipeline and empties its tables and their hot
/// copy in Redis.
async fn wipe_conversations(stack: &mut Stack) {
    stack.stop_pipeline("conversations").await;
    let pool = stack.pool();
    for table in ["im_conversations", "im_conversation_topics"] {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(&pool)
            .await
            .unwrap();
    }
    let mut redis = stack.redis().await;
    conversations::hot::drop_all(&mut redis, stack.tenant())
        .await
        .unwrap();
}

/// `imstream replay conversations` from the start of the log.
async fn replay_conversations(stack: &Stack) {
    let args = ReplayArgs {
        pipeline: "conversations".into(),
        from: "earliest".into(),
        tenant: None,
        into: None,
        wait_inactive_secs: 30,
    };
    replay(stack.config(), &args, stack.world.shutdown.child())
        .await
        .expect("replay");
}

/// A's, B's and C's lists as `GET /v1/me/conversations` serves them, less
/// who is online (sessions come and go) and when rows were last written (a
/// rebuild writes them anew).
async fn served_lists(stack: &Stack) -> Vec<Value> {
    let mut out = Vec::new();
    for uid in [A, B, C] {
        let (status, mut list) = get(stack, uid, "/v1/me/conversations").await;
        assert_eq!(status, 200, "{list}");
        for c in list["conversations"].as_array_mut().unwrap() {
            let c = c.as_object_mut().unwrap();
            c.remove("online");
            c.remove("updated");
        }
        out.push(list);
    }
    out
}

fn entry<'a>(list: &'a Value, topic: &str) -> Option<&'a Value> {
    list["conversations"]
        .as_array()?
        .iter()
        .find(|c| c["topic"] == json!(topic))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chat_list_through_tinode_sdk_and_http() {
    let mut stack = Stack::realtime(2).await;
    let gw = stack.gateway_addr(0);
    for (uid, name) in [(A, "Alice"), (B, "Bob"), (C, "Carol")] {
        let (status, body) = call(
            &stack,
            gw,
            uid,
            "PUT",
            "/v1/me/profile",
            json!({"fn": name}),
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
    // Bad profiles are refused with a reason, nothing produced.
    let (status, _) = call(
        &stack,
        gw,
        A,
        "PUT",
        "/v1/me/profile",
        json!({"fn": "x".repeat(200)}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = call(
        &stack,
        gw,
        A,
        "PUT",
        "/v1/me/profile",
        json!({"photo": {"data": "A".repeat(12_000), "type": "image/png"}}),
    )
    .await;
    // A picture kept inline is small (fields::PHOTO_CHARS); a larger one is
    // uploaded, and something that is no picture is no photo.
    assert_eq!(status, 413);
    let (status, _) = call(
        &stack,
        gw,
        A,
        "PUT",
        "/v1/me/profile",
        json!({"photo": {"data": "AAAA", "type": "text/html"}}),
    )
    .await;
    assert_eq!(status, 415);

    stack.create_group(TEAM, A, &[B, C]).await;
    stack.create_group(PAIR, B, &[A]).await;
    let (status, body) = call(
        &stack,
        gw,
        A,
        "PUT",
        &format!("/v1/groups/{TEAM}/profile"),
        json!({"fn": "Team"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    // Only an owner or admin names a group.
    let (status, _) = call(
        &stack,
        gw,
        C,
        "PUT",
        &format!("/v1/groups/{TEAM}/profile"),
        json!({"fn": "Mine"}),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = call(
        &stack,
        gw,
        A,
        "PUT",
        &format!("/v1/groups/{PAIR}/profile"),
        json!({"fn": "Pair"}),
    )
    .await;
    assert_eq!(status, 403, "A is a plain member of PAIR");

    let client = reqwest::Client::new();
    for i in 1..=3 {
        let (status, _) = send_http(
            &client,
            gw,
            &stack.token(B, "http"),
            TEAM,
            &format!("t{i}"),
            &format!("team message {i}"),
        )
        .await;
        assert_eq!(status, 202);
    }
    let (status, _) = send_http(
        &client,
        gw,
        &stack.token(A, "http"),
        PAIR,
        "p1",
        "pair message",
    )
    .await;
    assert_eq!(status, 202);
    let (status, body) = call(
        &stack,
        gw,
        C,
        "POST",
        &format!("/v1/users/{A}/messages"),
        json!({"content": {"txt": "hi Alice"}}),
    )
    .await;
    assert_eq!(status, 202, "{body}");

    // The HTTP list, once the projections caught up.
    let list = wait_for(
        "A's conversations projected",
        Duration::from_secs(60),
        || async {
            let (_, list) = get(&stack, A, "/v1/me/conversations?catchup=5").await;
            let ready = entry(&list, TEAM)
                .is_some_and(|t| t["unread"] == json!(3) && t["public"]["fn"] == json!("Team"))
                && entry(&list, PAIR).is_some()
                && entry(&list, &format!("usr{C}"))
                    .is_some_and(|c| c["public"]["fn"] == json!("Carol"));
            if ready {
                Ok(list)
            } else {
                Err(list.to_string())
            }
        },
    )
    .await;
    assert_eq!(
        list["unread"],
        json!(4),
        "the badge: 3 in Team, 1 from C; {list}"
    );
    assert_eq!(list["conversations_with_unread"], json!(2));
    assert_eq!(
        entry(&list, PAIR).unwrap()["unread"],
        json!(0),
        "what A sent is read"
    );
    let team = entry(&list, TEAM).unwrap();
    assert_eq!(team["last"]["preview"], json!("team message 3"));
    let caught: Vec<&str> = team["catchup"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"]["txt"].as_str().unwrap())
        .collect();
    assert_eq!(
        caught,
        ["team message 1", "team message 2", "team message 3"],
        "catch-up: the unread messages, oldest first"
    );
    // With fewer than the unread count allowed, only the count.
    let (_, short) = get(&stack, A, "/v1/me/conversations?catchup=2").await;
    assert_eq!(
        entry(&short, TEAM).unwrap()["catchup"],
        json!({"unread": 3, "messages": null})
    );
    // Paged: one per page, newest first, the cursor walks all three.
    let mut seen = Vec::new();
    let mut path = "/v1/me/conversations?limit=1".to_string();
    loop {
        let (status, page) = get(&stack, A, &path).await;
        assert_eq!(status, 200, "{page}");
        for c in page["conversations"].as_array().unwrap() {
            seen.push(c["topic"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(next) => path = format!("/v1/me/conversations?limit=1&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [format!("usr{C}"), PAIR.to_string(), TEAM.to_string()],
        "newest activity first"
    );
    let (_, badge) = get(&stack, A, "/v1/me/unread").await;
    assert_eq!(badge, json!({"unread": 4, "conversations_with_unread": 2}));
    let (status, _) = get(&stack, A, "/v1/me/conversations?cursor=nonsense").await;
    assert_eq!(status, 400);

    // The `me` topic and the live updates through the real client.
    common::run_node(
        "tinode_chatlist.js",
        &[
            ("GATEWAY_A", stack.gateway_addr(0).to_string()),
            ("GATEWAY_B", stack.gateway_addr(1).to_string()),
            ("TOKEN_A", stack.token(A, "sdk")),
            ("TOKEN_A2", stack.token(A, "phone")),
            ("TOKEN_B", stack.token(B, "sdk")),
            ("TOKEN_C", stack.token(C, "sdk")),
            ("TEAM", TEAM.to_string()),
            ("PAIR", PAIR.to_string()),
            ("A", A.to_string()),
            ("B", B.to_string()),
            ("C", C.to_string()),
        ],
        Duration::from_secs(120),
    )
    .await;

    // Rebuilt from the log: wipe the projection, replay, identical lists;
    // replay again (every record redelivered): still identical.
    let pool = stack.pool();
    let c_has_b = || async {
        let (_, l) = get(&stack, C, "/v1/me/conversations").await;
        entry(&l, &format!("usr{B}"))
            .map(|_| ())
            .ok_or(l.to_string())
    };
    wait_for(
        "B's message to C projected",
        Duration::from_secs(30),
        c_has_b,
    )
    .await;
    let before = projection::conversation_lists(&pool).await.unwrap();
    assert_eq!(before.len(), 3, "three users with lists: {before:?}");
    let served_before = served_lists(&stack).await;
    wipe_conversations(&mut stack).await;
    let (_, empty) = get(&stack, A, "/v1/me/conversations").await;
    assert_eq!(empty["conversations"], json!([]), "wiped");
    replay_conversations(&stack).await;
    assert_eq!(
        projection::conversation_lists(&pool).await.unwrap(),
        before,
        "replay rebuilt the same lists"
    );
    assert_eq!(
        served_lists(&stack).await,
        served_before,
        "the lists served (from the hot copy, filled again) are the same"
    );
    replay_conversations(&stack).await;
    assert_eq!(
        projection::conversation_lists(&pool).await.unwrap(),
        before,
        "redelivered: unchanged"
    );
}

/// A 10,000-member group: membership writes 10,000 rows once; each message
/// then writes its topic row and the sender's cursor only — no member's
/// row is touched — and every member's list shows it unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_big_group_costs_one_row_per_message() {
    const BIG: &str = "grpChatsBig";
    const MEMBERS: i64 = 10_000;
    const MESSAGES: i64 = 20;
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    stack.start_pipeline("conversations").await;
    stack.start_gateway("node-a").await;
    let members: Vec<i64> = (2..=MEMBERS).collect();
    stack.create_group(BIG, 1, &members).await;
    let pool = stack.pool();
    let count = || async {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_conversations WHERE topic = ?")
            .bind(BIG)
            .fetch_one(&pool)
            .await
            .unwrap();
        if n == MEMBERS {
            Ok(())
        } else {
            Err(format!("{n} rows"))
        }
    };
    wait_for("10,000 conversation rows", Duration::from_secs(120), count).await;
    let (mark,): (chrono::NaiveDateTime,) = sqlx::query_as("SELECT CURRENT_TIMESTAMP(3)")
        .fetch_one(&pool)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    for i in 1..=MESSAGES {
        let (status, _) = send_http(
            &client,
            stack.gateway_addr(0),
            &stack.token(1, "http"),
            BIG,
            &format!("b{i}"),
            "to everyone",
        )
        .await;
        assert_eq!(status, 202);
    }
    let projected = || async {
        let seq: Option<i64> =
            sqlx::query_scalar("SELECT last_seq FROM im_conversation_topics WHERE topic = ?")
                .bind(BIG)
                .fetch_optional(&pool)
                .await
                .unwrap();
        if seq == Some(MESSAGES) {
            Ok(())
        } else {
            Err(format!("last_seq {seq:?}"))
        }
    };
    wait_for("20 messages projected", Duration::from_secs(60), projected).await;
    let touched: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM im_conversations WHERE topic = ? AND updated_at > ?",
    )
    .bind(BIG)
    .bind(mark)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        touched, 0,
        "no member's conversation row is written per message"
    );
    let cursors: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_subscriptions WHERE topic = ?")
        .bind(BIG)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(cursors, 1, "only the sender's cursor moved");
    for uid in [2, 5_000, MEMBERS] {
        let (_, list) = get(&stack, uid, "/v1/me/conversations").await;
        assert_eq!(
            entry(&list, BIG).unwrap()["unread"],
            json!(MESSAGES),
            "member {uid}"
        );
    }
    let (_, owner) = get(&stack, 1, "/v1/me/conversations").await;
    assert_eq!(
        entry(&owner, BIG).unwrap()["unread"],
        json!(0),
        "the sender read what they sent"
    );
}

/// Ok when `uid`'s list shows `want` as the preview of `topic`.
async fn preview_of(stack: &Stack, uid: i64, topic: &str, want: Value) -> Result<(), String> {
    let (_, list) = get(stack, uid, "/v1/me/conversations").await;
    let got = entry(&list, topic).map(|c| c["last"]["preview"].clone());
    if got.as_ref() == Some(&want) {
        Ok(())
    } else {
        Err(format!("preview {got:?}"))
    }
}

/// What the list shows of a message its sender took back: an edit shows
/// the new text; recalling the original withdraws it (the edit's text
/// too, from the list and from history), and a replay, where the message, its edit and its recall arrive
/// in one batch, ends the same: no preview of a recalled message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recalled_message_leaves_no_preview_even_edited_and_replayed() {
    const TOPIC: &str = "grpChatsRecall";
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    stack.start_pipeline("conversations").await;
    let gw = stack.start_gateway("node-a").await;
    stack.create_group(TOPIC, A, &[B]).await;
    let client = reqwest::Client::new();
    let (status, body) = send_http(
        &client,
        gw,
        &stack.token(A, "http"),
        TOPIC,
        "r1",
        "a secret",
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let seq = body["seq"].as_i64().expect("seq");
    wait_for("the message's preview", Duration::from_secs(60), || {
        preview_of(&stack, B, TOPIC, json!("a secret"))
    })
    .await;
    let (status, body) = call(
        &stack,
        gw,
        A,
        "PATCH",
        &format!("/v1/groups/{TOPIC}/messages/{seq}"),
        json!({"content": {"txt": "a secret, edited"}, "client_msg_id": "r1-edit"}),
    )
    .await;
    assert_eq!(status, 202, "edit: {body}");
    wait_for("the edit's preview", Duration::from_secs(60), || {
        preview_of(&stack, B, TOPIC, json!("a secret, edited"))
    })
    .await;
    let (status, body) = call(
        &stack,
        gw,
        A,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/messages/{seq}"),
        json!({}),
    )
    .await;
    assert!(status == 200 || status == 202, "recall: {status} {body}");
    wait_for("no preview once recalled", Duration::from_secs(60), || {
        preview_of(&stack, B, TOPIC, Value::Null)
    })
    .await;
    // Nor is any of its texts in the history: the edit went with it.
    wait_for(
        "the recalled message gone from history",
        Duration::from_secs(60),
        || async {
            let (status, page) =
                get(&stack, B, &format!("/v1/groups/{TOPIC}/messages?limit=50")).await;
            let texts = page["messages"].to_string();
            if status == 200 && !texts.contains("a secret") {
                Ok(())
            } else {
                Err(format!("{status} {texts}"))
            }
        },
    )
    .await;

    // Rebuilt from the log in one go.
    let pool = stack.pool();
    let before = projection::conversation_lists(&pool).await.unwrap();
    wipe_conversations(&mut stack).await;
    replay_conversations(&stack).await;
    assert_eq!(
        projection::conversation_lists(&pool).await.unwrap(),
        before,
        "replay rebuilt the same lists"
    );
    preview_of(&stack, B, TOPIC, Value::Null)
        .await
        .expect("still no preview after the replay");
}

/// `uid`'s whole list from the hot copy and from MySQL: Ok when they are the
/// same and `check` holds for it.
async fn hot_matches(
    stack: &Stack,
    deletes: &dellog::Cache,
    uid: i64,
    check: impl Fn(&[Conversation]) -> bool,
) -> Result<Vec<Conversation>, String> {
    let pool = stack.pool();
    let redis = stack.redis().await;
    let all = conversations::Query::default();
    let hot = conversations::hot::list(&pool, &redis, deletes, stack.tenant(), uid, &all)
        .await
        .map_err(|e| e.to_string())?;
    let cold = conversations::list(&pool, uid, &all)
        .await
        .map_err(|e| e.to_string())?;
    if hot != cold {
        return Err(format!("hot {hot:#?}\nMySQL {cold:#?}"));
    }
    if !check(&hot) {
        return Err(format!("not yet: {hot:#?}"));
    }
    Ok(hot)
}

fn in_list<'a>(list: &'a [Conversation], topic: &str) -> Option<&'a Conversation> {
    list.iter().find(|c| c.topic == topic)
}

/// The chat list is served from its hot copy in Redis: the same lists and
/// counts MySQL holds, following every change (messages, a read on a
/// device, a profile, a role, a member removed); when Redis loses the copy,
/// lists come back from MySQL and are cached again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_hot_copy_serves_what_mysql_holds_and_comes_back_after_redis_loss() {
    const TOPIC: &str = "grpChatsHot";
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "conversations", "receipts", "relations"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("node-a").await;
    let deletes = dellog::Cache::default();
    for (uid, name) in [(A, "Alice"), (B, "Bob")] {
        let (status, body) = call(
            &stack,
            gw,
            uid,
            "PUT",
            "/v1/me/profile",
            json!({"fn": name}),
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
    stack.create_group(TOPIC, A, &[B, C]).await;
    let client = reqwest::Client::new();
    for i in 1..=3 {
        let (status, _) = send_http(
            &client,
            gw,
            &stack.token(A, "http"),
            TOPIC,
            &format!("h{i}"),
            &format!("hot {i}"),
        )
        .await;
        assert_eq!(status, 202);
    }
    let (status, body) = call(
        &stack,
        gw,
        B,
        "POST",
        &format!("/v1/users/{A}/messages"),
        json!({"content": {"txt": "hi Alice"}}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let pair = imstream::tinode::p2p_topic(A, B);

    let b_list = wait_for("B's list in the hot copy", Duration::from_secs(60), || {
        hot_matches(&stack, &deletes, B, |l| {
            in_list(l, TOPIC).is_some_and(|c| c.unread == 3)
                && in_list(l, &pair)
                    .is_some_and(|c| c.profile.full_name.as_deref() == Some("Alice"))
        })
    })
    .await;
    let group = in_list(&b_list, TOPIC).unwrap();
    assert_eq!(group.preview.as_deref(), Some("hot 3"));
    assert_eq!(
        in_list(&b_list, &pair)
            .unwrap()
            .profile
            .full_name
            .as_deref(),
        Some("Alice")
    );
    wait_for("A's list in the hot copy", Duration::from_secs(60), || {
        hot_matches(&stack, &deletes, A, |l| {
            in_list(l, &pair).is_some_and(|c| c.unread == 1)
        })
    })
    .await;

    // Served from Redis: a change MySQL alone sees (no pipeline wrote it)
    // does not show …
    let mut redis = stack.redis().await;
    let tenant = stack.tenant().to_string();
    // A read fills the copy unless a change was still being projected
    // (a late membership event drops it again): read until it stays.
    wait_for(
        "B's list and the topic's state in Redis",
        Duration::from_secs(30),
        || async {
            hot_matches(&stack, &deletes, B, |_| true).await?;
            let exists: i64 = redis::cmd("EXISTS")
                .arg(UserKeys::new(&tenant, B).chats())
                .arg(TopicKeys::new(&tenant, TOPIC).chat())
                .query_async(&mut stack.redis().await)
                .await
                .unwrap();
            if exists == 2 {
                Ok(())
            } else {
                Err(format!("{exists} of 2 keys"))
            }
        },
    )
    .await;
    let pool = stack.pool();
    sqlx::query("UPDATE im_conversation_topics SET preview = 'only in MySQL' WHERE topic = ?")
        .bind(TOPIC)
        .execute(&pool)
        .await
        .unwrap();
    let all = conversations::Query::default();
    let hot = conversations::hot::list(&pool, &redis, &deletes, &tenant, B, &all)
        .await
        .unwrap();
    assert_eq!(
        in_list(&hot, TOPIC).unwrap().preview.as_deref(),
        Some("hot 3")
    );
    // … until Redis loses the copy: then the list comes from MySQL, whole,
    // and is cached again.
    let dropped = conversations::hot::drop_all(&mut redis, &tenant)
        .await
        .unwrap();
    assert!(
        dropped >= 4,
        "lists, states and profiles dropped: {dropped}"
    );
    let back = hot_matches(&stack, &deletes, B, |_| true)
        .await
        .expect("hot == MySQL after the loss");
    assert_eq!(
        in_list(&back, TOPIC).unwrap().preview.as_deref(),
        Some("only in MySQL")
    );
    assert_eq!(in_list(&back, TOPIC).unwrap().unread, 3);
    let badge = conversations::hot::badge(&pool, &redis, &deletes, &tenant, B)
        .await
        .unwrap();
    assert_eq!(badge, conversations::badge(&pool, B).await.unwrap());
    assert_eq!(
        badge,
        (3, 1),
        "3 unread in the group; B sent the one-to-one message"
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg(UserKeys::new(&tenant, B).chats())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(exists, 1, "cached again");

    // Every change reaches the copy: a read on a device …
    let mut ws = Ws::connect(gw, &stack.token(B, "phone")).await;
    ws.request(json!({"sub": {"topic": TOPIC}})).await;
    let note = json!({"note": {"topic": TOPIC, "what": "read", "seq": 3}});
    ws.stream
        .send(tokio_tungstenite::tungstenite::Message::Text(
            note.to_string().into(),
        ))
        .await
        .unwrap();
    wait_for("B's read in the copy", Duration::from_secs(60), || {
        hot_matches(&stack, &deletes, B, |l| {
            in_list(l, TOPIC).is_some_and(|c| c.read == 3 && c.unread == 0)
        })
    })
    .await;
    // … a new message and a profile …
    let (status, _) = send_http(&client, gw, &stack.token(A, "http"), TOPIC, "h4", "hot 4").await;
    assert_eq!(status, 202);
    let (status, _) = call(
        &stack,
        gw,
        A,
        "PUT",
        "/v1/me/profile",
        json!({"fn": "Alice L"}),
    )
    .await;
    assert_eq!(status, 202);
    wait_for(
        "the message and the profile in the copy",
        Duration::from_secs(60),
        || {
            hot_matches(&stack, &deletes, B, |l| {
                in_list(l, TOPIC)
                    .is_some_and(|c| c.unread == 1 && c.preview.as_deref() == Some("hot 4"))
                    && in_list(l, &pair)
                        .is_some_and(|c| c.profile.full_name.as_deref() == Some("Alice L"))
            })
        },
    )
    .await;
    // … a role, and a member removed.
    let (status, body) = call(
        &stack,
        gw,
        A,
        "PUT",
        &format!("/v1/groups/{TOPIC}/members/{B}/role"),
        json!({"role": "admin"}),
    )
    .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    wait_for("B's role in the copy", Duration::from_secs(60), || {
        hot_matches(&stack, &deletes, B, |l| {
            in_list(l, TOPIC).is_some_and(|c| c.role == Some(Role::Admin))
        })
    })
    .await;
    wait_for("C's list before", Duration::from_secs(60), || {
        hot_matches(&stack, &deletes, C, |l| in_list(l, TOPIC).is_some())
    })
    .await;
    let (status, body) = call(
        &stack,
        gw,
        A,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/{C}"),
        json!(null),
    )
    .await;
    assert!(status == 200 || status == 202, "{status} {body}");
    wait_for(
        "the group gone from C's copy",
        Duration::from_secs(60),
        || hot_matches(&stack, &deletes, C, |l| in_list(l, TOPIC).is_none()),
    )
    .await;
}

/// Frames that reach `ws` until it has been quiet for `quiet`.
async fn frames_until_quiet(ws: &mut Ws, quiet: Duration) -> Vec<Value> {
    let mut frames = Vec::new();
    while let Ok(frame) = tokio::time::timeout(quiet, ws.next_frame()).await {
        frames.push(frame);
    }
    frames
}

/// `(topic, seq)` of the `{data}` frames among `frames`.
fn data_of(frames: &[Value]) -> Vec<(String, i64)> {
    frames
        .iter()
        .filter(|f| f.get("data").is_some())
        .map(|f| {
            (
                f["data"]["topic"].as_str().unwrap_or_default().to_string(),
                f["data"]["seq"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

/// Issue 40: previews at a fresh login. Tinode's web app draws a chat's
/// last message only from messages it holds, so a client that subscribes
/// to `me` with nothing cached (the whole list, no `ims`) gets, after the
/// list, the newest messages (`gateway.warm_messages`, the app's page of
/// 24) of its most recent chats (`gateway.warm_chats`, 2 here) as `{data}`
/// of each chat, newest first, as its own cache would give them; older
/// chats get none, and a client that asks only for changes (`ims`) or
/// just reads the list gets none either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_login_gets_its_recent_chats_newest_messages() {
    let mut stack = Stack::prepared_with(None, |c| {
        c.gateway.warm_chats = 2;
        c.gateway.warm_messages = 24;
    })
    .await;
    for p in ["store", "conversations", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const A: i64 = 431;
    const B: i64 = 432;
    const C: i64 = 433;
    const D: i64 = 434;
    let send = |from: i64, n: i64| {
        let stack = &stack;
        async move {
            let path = format!("/v1/users/{A}/messages");
            let body = json!({"content": format!("{from} says {n}"), "client_msg_id": format!("m{from}-{n}")});
            let (status, body) = call(stack, gw, from, "POST", &path, body).await;
            assert_eq!(status, 202, "{body}");
        }
    };
    // D's chat is the oldest, then B's (30 messages), then C's (3).
    send(D, 1).await;
    for n in 1..=30 {
        send(B, n).await;
    }
    for n in 1..=3 {
        send(C, n).await;
    }
    wait_for(
        "A lists the three chats to their last message",
        Duration::from_secs(30),
        || {
            let stack = &stack;
            async move {
                let (_, list) =
                    call(stack, gw, A, "GET", "/v1/me/conversations", json!(null)).await;
                let seqs: Vec<i64> = list["conversations"]
                    .as_array()
                    .map(|l| l.iter().filter_map(|c| c["seq"].as_i64()).collect())
                    .unwrap_or_default();
                // And each chat's history has its last message.
                let mut last = Vec::new();
                for peer in [C, B, D] {
                    let path = format!("/v1/users/{peer}/messages?limit=1");
                    let (_, page) = call(stack, gw, A, "GET", &path, json!(null)).await;
                    last.push(page["messages"][0]["seq"].as_i64().unwrap_or(0));
                }
                if seqs == [3, 30, 1] && last == seqs {
                    Ok(())
                } else {
                    Err(list.to_string())
                }
            }
        },
    )
    .await;
    let usr = imstream::tinode::user_id;

    let mut a = Ws::connect(gw, &stack.token(A, "web")).await;
    let (_, ctrl) = a
        .request(json!({"sub": {"topic": "me", "get": {"what": "sub desc"}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let frames = frames_until_quiet(&mut a, Duration::from_millis(1500)).await;
    let list_at = frames
        .iter()
        .position(|f| f["meta"]["sub"].is_array())
        .expect("the list");
    let first_data = frames.iter().position(|f| f.get("data").is_some());
    assert!(
        first_data.is_some_and(|d| d > list_at),
        "the messages come after the list: {frames:?}"
    );
    let mut want: Vec<(String, i64)> = (1..=3).rev().map(|s| (usr(C), s)).collect();
    want.extend((7..=30).rev().map(|s| (usr(B), s)));
    assert_eq!(
        data_of(&frames),
        want,
        "C's 3, then B's newest 24; nothing of D's"
    );
    let last_of_b = frames
        .iter()
        .find(|f| f["data"]["topic"] == json!(usr(B)) && f["data"]["seq"] == json!(30))
        .expect("B's last message");
    assert_eq!(last_of_b["data"]["content"], json!(format!("{B} says 30")));

    // Once a session: subscribing again gets the list, not the messages.
    let (_, left) = a.request(json!({"leave": {"topic": "me"}})).await;
    assert_eq!(left["ctrl"]["code"], json!(200), "{left}");
    let (_, ctrl) = a
        .request(json!({"sub": {"topic": "me", "get": {"what": "sub desc"}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let frames = frames_until_quiet(&mut a, Duration::from_millis(1500)).await;
    assert!(
        frames.iter().any(|f| f["meta"]["sub"].is_array()),
        "{frames:?}"
    );
    assert!(data_of(&frames).is_empty(), "{frames:?}");

    // A client with a cache asks for changes only: no messages.
    let updated = frames[list_at]["meta"]["sub"][0]["updated"].clone();
    let mut a2 = Ws::connect(gw, &stack.token(A, "phone")).await;
    let (_, ctrl) = a2
        .request(json!({"sub": {"topic": "me", "get": {"what": "sub", "sub": {"ims": updated}}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let frames = frames_until_quiet(&mut a2, Duration::from_millis(1500)).await;
    assert!(data_of(&frames).is_empty(), "{frames:?}");
    // Nor does a read of the list.
    let (_, meta) = a2
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    assert!(meta["meta"]["sub"].is_array(), "{meta}");
    let frames = frames_until_quiet(&mut a2, Duration::from_millis(1000)).await;
    assert!(data_of(&frames).is_empty(), "{frames:?}");
}
