//! One-to-one conversations, relations, user-targeted events and offline
//! push (seed 002 §5–§6.2 and §10, seed 001 §5.2 and §5.4) against the real
//! services, over WebSocket with two and three gateways:
//!
//! - seed 002 §10 row 1: user A on two gateways, B sends a p2p message from
//!   a third → both A devices and B's other device receive it, stored once
//!   (in the p2p table family);
//! - a blocked sender is refused; after unblocking the send goes through;
//! - an offline recipient gets exactly one push task, online recipients and
//!   do-not-disturb users none, a replay adds none, and the task has no
//!   content;
//! - p2p history pages across a month switch like groups;
//! - a friend request reaches every online device of its target.

mod common;
mod realtime_support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use sqlx::MySqlPool;

use common::{call, read_events, wait_for, Stack};
use imstream::events::PushTask;
use imstream::kafka::topics::TopicKind;
use imstream::tinode::p2p_topic;
use realtime_support::{accepted_seq, usr, Client, DELIVERY};

/// `POST /v1/users/{peer}/messages` as `uid`: status and body.
async fn send_p2p(
    stack: &Stack,
    addr: SocketAddr,
    uid: i64,
    peer: i64,
    cmid: &str,
    text: &str,
) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/users/{peer}/messages"))
        .bearer_auth(stack.token(uid, "http"))
        .json(&json!({"content": text, "client_msg_id": cmid}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Rows of `topic` in a month table of `family` (`group` or `p2p`).
async fn rows(pool: &MySqlPool, family: &str, month: &str, topic: &str) -> Vec<i64> {
    sqlx::query_scalar(&format!(
        "SELECT seqid FROM im_{family}_messages_{month} WHERE topic = ? ORDER BY seqid"
    ))
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap()
}

fn this_month() -> String {
    chrono::Utc::now().format("%Y%m").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_p2p_message_reaches_every_device_of_both_users_and_is_stored_once() {
    let stack = Stack::realtime(3).await;
    const A: i64 = 21;
    const B: i64 = 22;
    let mut a_phone =
        Client::open(stack.gateway_addr(0), &stack.token(A, "phone"), "a-phone").await;
    let a_web = Client::open(stack.gateway_addr(1), &stack.token(A, "web"), "a-web").await;
    let mut b_phone =
        Client::open(stack.gateway_addr(2), &stack.token(B, "phone"), "b-phone").await;
    let b_pad = Client::open(stack.gateway_addr(0), &stack.token(B, "pad"), "b-pad").await;

    // B addresses A as usr<A>; the reply names the topic the same way.
    let ctrl = b_phone.request(json!({"sub": {"topic": usr(A)}})).await;
    assert_eq!(
        (ctrl["code"].clone(), ctrl["topic"].clone()),
        (json!(200), json!(usr(A))),
        "{ctrl}"
    );
    let ctrl = b_phone
        .request(json!({"pub": {"topic": usr(A), "content": "hi A", "head": {"client_mid": "p1"}}}))
        .await;
    let seq = accepted_seq(&ctrl, "b-phone");

    // Both of A's devices (not attached to anything) get it as usr<B>; B's
    // other device as usr<A>; the sending session does not.
    for a in [&a_phone, &a_web] {
        let d = a.expect_data(&usr(B), seq).await;
        assert_eq!(d["from"], json!(usr(B)));
        assert_eq!(d["content"], json!("hi A"));
    }
    b_pad.expect_data(&usr(A), seq).await;
    // A retry with the same client_mid is the same message.
    let again = b_phone
        .request(json!({"pub": {"topic": usr(A), "content": "hi A", "head": {"client_mid": "p1"}}}))
        .await;
    assert_eq!(accepted_seq(&again, "b-phone retry"), seq);

    let topic = p2p_topic(A, B);
    let pool = stack.pool();
    let month = this_month();
    let stored = wait_for("p2p message stored", DELIVERY, || async {
        let r = rows(&pool, "p2p", &month, &topic).await;
        if r.is_empty() {
            Err("not yet".to_string())
        } else {
            Ok(r)
        }
    })
    .await;
    assert_eq!(stored, vec![seq], "stored once");
    assert!(
        rows(&pool, "group", &month, &topic).await.is_empty(),
        "never in the group tables"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        b_phone.count(|f| f["data"]["seq"] == json!(seq)),
        0,
        "no echo to the sender"
    );
    assert_eq!(
        a_phone.count(|f| f["data"]["seq"] == json!(seq)),
        1,
        "delivered once"
    );

    // A reads it on the phone: B's devices see the receipt as usr<A>.
    a_phone.sub(&usr(B)).await;
    a_phone.note(&usr(B), "read", Some(seq)).await;
    for b in [&b_phone, &b_pad] {
        b.expect("read receipt", DELIVERY, |f| {
            f["info"]["topic"] == json!(usr(A))
                && f["info"]["what"] == json!("read")
                && f["info"]["seq"] == json!(seq)
        })
        .await;
    }

    // A answers; someone else cannot read or write their topic.
    let (status, body) = send_p2p(&stack, stack.gateway_addr(1), A, B, "r1", "hi B").await;
    assert_eq!(status, 202, "{body}");
    let mut eve = Client::open(stack.gateway_addr(0), &stack.token(99, "x"), "eve").await;
    let ctrl = eve.request(json!({"sub": {"topic": topic}})).await;
    assert_eq!(ctrl["code"], json!(404), "{ctrl}");
    let ctrl = eve.request(json!({"sub": {"topic": usr(99)}})).await;
    assert_eq!(ctrl["code"], json!(404), "no topic with oneself: {ctrl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocked_sender_is_refused_until_unblocked() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "relations"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const A: i64 = 31;
    const B: i64 = 32;
    let (status, body) = send_p2p(&stack, gw, B, A, "before", "hello").await;
    assert_eq!(status, 202, "{body}");

    let (status, _) = call(&stack, gw, A, "POST", "/v1/blocks", json!({"uid": B})).await;
    assert_eq!(status, 202);
    let refused = wait_for("B refused", DELIVERY, || async {
        match send_p2p(&stack, gw, B, A, &common::unique_id(), "still there?").await {
            (403, body) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(refused["params"]["code"], json!("BLOCKED"), "{refused}");
    // Blocking is one-way: A can still write to B.
    let (status, _) = send_p2p(&stack, gw, A, B, "a1", "I can").await;
    assert_eq!(status, 202);

    let (status, _) = call(
        &stack,
        gw,
        A,
        "DELETE",
        &format!("/v1/blocks/{B}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202);
    wait_for("B allowed again", DELIVERY, || async {
        match send_p2p(&stack, gw, B, A, &common::unique_id(), "again").await {
            (202, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The `acs` of `topic` in `{get me sub}` of `ws`, if listed.
async fn listed_acs(ws: &mut common::Ws, topic: &str) -> Option<Value> {
    let (_, meta) = ws
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    meta["meta"]["sub"]
        .as_array()?
        .iter()
        .find(|s| s["topic"] == json!(topic))
        .map(|s| s["acs"].clone())
}

/// An undone block or mute stays undone while the relations projection
/// catches up (issue 40): B blocks A and unblocks him, mutes the chat and
/// unmutes it, eight times with the projection stopped; each change is in
/// force when answered (written through). Started again, the projection
/// applies the same events in their order, and never puts an earlier block
/// or mute back over the later change already written: the stored rows and
/// the cached block set the send path reads are polled all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_undone_block_stays_undone_while_the_projection_replays_it() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "conversations", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const A: i64 = 61;
    const B: i64 = 62;
    let (status, body) = send_p2p(&stack, gw, A, B, "first", "hi B").await;
    assert_eq!(status, 202, "{body}");
    let mut b = common::Ws::connect(gw, &stack.token(B, "web")).await;
    for mode in ["RWA", "JRWA", "JRWPA"].repeat(8) {
        let (_, ctrl) = b
            .request(json!({"set": {"topic": usr(A), "sub": {"mode": mode}}}))
            .await;
        assert_eq!(ctrl["ctrl"]["code"], json!(200), "{mode}: {ctrl}");
    }
    let (status, body) = send_p2p(&stack, gw, A, B, "after", "unblocked").await;
    assert_eq!(status, 202, "A writes once unblocked: {body}");
    // A later event of B's that only the projection writes: once it is
    // stored, everything before it was applied.
    let (status, _) = call(&stack, gw, B, "PUT", "/v1/me/push", json!({"dnd": true})).await;
    assert_eq!(status, 202);

    let pool = stack.pool();
    let mut redis = stack.redis().await;
    let blocks = imstream::keys::TenantKeys::new(stack.tenant()).blocks(B);
    stack.start_pipeline("relations").await;
    let started = std::time::Instant::now();
    let mut polls = 0;
    loop {
        let (blocked, muted, dnd): (i64, i64, i64) = sqlx::query_as(
            "SELECT \
               (SELECT COUNT(*) FROM im_blocks WHERE uid = ? AND blocked_uid = ?), \
               (SELECT COUNT(*) FROM im_push_muted_topics WHERE uid = ? AND topic = ?), \
               (SELECT COUNT(*) FROM im_push_settings WHERE uid = ? AND dnd = 1)",
        )
        .bind(B)
        .bind(A)
        .bind(B)
        .bind(p2p_topic(A, B))
        .bind(B)
        .fetch_one(&pool)
        .await
        .unwrap();
        let cached: bool = redis::cmd("SISMEMBER")
            .arg(&blocks)
            .arg(A)
            .query_async(&mut redis)
            .await
            .unwrap();
        polls += 1;
        assert_eq!(
            (blocked, cached, muted),
            (0, false, 0),
            "poll {polls}, {:?} after the projection started: an earlier block or mute \
             came back (blocked rows, cached, muted rows)",
            started.elapsed()
        );
        if dnd == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the projection did not catch up"
        );
    }
    println!("{polls} polls while the projection replayed 24 changes");
    let (status, body) = send_p2p(&stack, gw, A, B, "last", "still unblocked").await;
    assert_eq!(status, 202, "{body}");
}

/// Waits until `uid`'s chat list has `topic` (and `also`, more of the
/// row's condition).
async fn wait_for_row(stack: &Stack, what: &str, also: &str, uid: i64, topic: &str) {
    let sql = format!("SELECT COUNT(*) FROM im_conversations WHERE uid = ? AND topic = ? {also}");
    wait_for(what, DELIVERY, || {
        let (pool, sql) = (stack.pool(), sql.clone());
        async move {
            let n: i64 = sqlx::query_scalar(&sql)
                .bind(uid)
                .bind(topic)
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
}

/// Every frame that reaches `ws` within `wait`.
async fn frames_for(ws: &mut common::Ws, wait: Duration) -> Vec<Value> {
    let mut frames = Vec::new();
    let until = tokio::time::Instant::now() + wait;
    while let Ok(frame) = tokio::time::timeout_at(until, ws.next_frame()).await {
        frames.push(frame);
    }
    frames
}

/// `{pres topic="me" src=usr… what}` frames about `src` that reach `ws`
/// within `wait`.
async fn presence_of(ws: &mut common::Ws, src: &str, wait: Duration) -> Vec<String> {
    frames_for(ws, wait)
        .await
        .iter()
        .filter(|f| f["pres"]["topic"] == json!("me") && f["pres"]["src"] == json!(src))
        .map(|f| f["pres"]["what"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Whether `topic` shows online in `ws`'s chat list.
async fn listed_online(ws: &mut common::Ws, topic: &str) -> bool {
    let (_, meta) = ws
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    meta["meta"]["sub"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["topic"] == json!(topic)).cloned())
        .unwrap_or_else(|| panic!("{topic} listed: {meta}"))["online"]
        == json!(true)
}

/// Issue 40: the web app's Incognito (`{set topic="me" sub={mode}}`, a want
/// without `P`). While it is on, the user shows offline to everyone: their
/// peer is told "off" at once, lists show them offline, signing out and in
/// again announces no "on"; `me`'s `acs` says so (the app's checkbox reads
/// it), also to a new session; off again, the peer is told "on". A mode
/// that is no access mode is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn incognito_shows_the_user_offline_to_everyone_until_turned_off() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "conversations", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const A: i64 = 71;
    const B: i64 = 72;
    let (status, body) = send_p2p(&stack, gw, A, B, "first", "hi B").await;
    assert_eq!(status, 202, "{body}");
    let mut b = common::Ws::connect(gw, &stack.token(B, "web")).await;
    let (_, sub) = b.request(json!({"sub": {"topic": "me"}})).await;
    assert_eq!(sub["ctrl"]["code"], json!(200), "{sub}");
    wait_for("B lists A", DELIVERY, || {
        let addr = gw;
        let token = stack.token(B, "web");
        async move {
            let mut w = common::Ws::connect(addr, &token).await;
            let (_, meta) = w
                .request(json!({"get": {"topic": "me", "what": "sub"}}))
                .await;
            let listed = meta["meta"]["sub"]
                .as_array()
                .is_some_and(|s| s.iter().any(|e| e["topic"] == json!(usr(A))));
            if listed {
                Ok(())
            } else {
                Err(meta.to_string())
            }
        }
    })
    .await;

    let mut a = common::Ws::connect(gw, &stack.token(A, "web")).await;
    assert_eq!(
        presence_of(&mut b, &usr(A), Duration::from_secs(3)).await,
        ["on"],
        "B sees A come online"
    );
    assert!(listed_online(&mut b, &usr(A)).await);

    // Incognito on: A's want on `me` without P.
    let (_, ctrl) = a
        .request(json!({"set": {"topic": "me", "sub": {"mode": "JS"}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    assert_eq!(
        ctrl["ctrl"]["params"]["acs"],
        json!({"want": "JS", "given": "JPS", "mode": "JS"}),
        "{ctrl}"
    );
    assert_eq!(
        presence_of(&mut b, &usr(A), Duration::from_secs(3)).await,
        ["off"],
        "B is told A went offline"
    );
    assert!(!listed_online(&mut b, &usr(A)).await, "A listed offline");
    // A signs out and in again: no "on" (an "off" may come: it shows
    // nothing new), and the new session reads incognito on.
    drop(a);
    let seen = presence_of(&mut b, &usr(A), Duration::from_secs(2)).await;
    assert!(!seen.contains(&"on".to_string()), "{seen:?}");
    let mut a = common::Ws::connect(gw, &stack.token(A, "phone")).await;
    let mut a2 = common::Ws::connect(gw, &stack.token(A, "tablet")).await;
    let (_, me) = a2.request(json!({"sub": {"topic": "me"}})).await;
    assert_eq!(me["ctrl"]["params"]["acs"]["want"], json!("JS"), "{me}");
    let (_, desc) = a2
        .request(json!({"get": {"topic": "me", "what": "desc"}}))
        .await;
    assert_eq!(desc["meta"]["desc"]["acs"]["mode"], json!("JS"), "{desc}");
    assert!(presence_of(&mut b, &usr(A), Duration::from_secs(2))
        .await
        .is_empty());
    assert!(!listed_online(&mut b, &usr(A)).await, "still offline");
    drop(a2);
    // Typing is hidden too (the app: "Hide your online status and typing
    // indicators").
    let (_, ctrl) = b.request(json!({"sub": {"topic": usr(A)}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (_, ctrl) = a.request(json!({"sub": {"topic": usr(B)}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let typing = json!({"note": {"topic": usr(B), "what": "kp"}});
    a.send(typing.clone()).await;
    assert_eq!(
        typing_seen(&mut b, Duration::from_secs(2)).await,
        0,
        "typing hidden"
    );
    // In a group both have open, A shows offline in its member list, and
    // to B the group has nobody else online.
    const GROUP: &str = "grpIncognito";
    stack.create_group(GROUP, B, &[A]).await;
    let (_, ctrl) = a.request(json!({"sub": {"topic": GROUP}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (_, ctrl) = b.request(json!({"sub": {"topic": GROUP}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let group_online: Vec<Value> = frames_for(&mut b, Duration::from_secs(1))
        .await
        .into_iter()
        .filter(|f| f["pres"]["topic"] == json!("me") && f["pres"]["src"] == json!(GROUP))
        .collect();
    assert_eq!(
        group_online
            .iter()
            .map(|f| f["pres"]["what"].clone())
            .collect::<Vec<_>>(),
        [json!("off")],
        "the group shows nobody else online to B"
    );
    // A writes there (so her presence would show to its members).
    let (_, ctrl) = a
        .request(json!({"pub": {"topic": GROUP, "content": "hello group"}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(202), "{ctrl}");
    wait_for_row(
        &stack,
        "A engaged in the group",
        "AND engaged = 1",
        A,
        GROUP,
    )
    .await;
    let (_, meta) = b
        .request(json!({"get": {"topic": GROUP, "what": "sub"}}))
        .await;
    let entry_of_a = meta["meta"]["sub"]
        .as_array()
        .and_then(|s| s.iter().find(|e| e["user"] == json!(usr(A))).cloned())
        .unwrap_or_else(|| panic!("A is a member: {meta}"));
    assert_eq!(entry_of_a["online"], json!(false), "{entry_of_a}");
    // A's presence lost (Redis restarted): still hidden, typing too.
    let mut redis = stack.redis().await;
    let presence = imstream::keys::TenantKeys::new(stack.tenant()).presence_user(A);
    let _: () = redis::cmd("DEL")
        .arg(&presence)
        .query_async(&mut redis)
        .await
        .unwrap();
    a.send(json!({"note": {"topic": GROUP, "what": "kp"}}))
        .await;
    assert_eq!(
        typing_seen(&mut b, Duration::from_secs(2)).await,
        0,
        "typing hidden without a presence in Redis"
    );
    // A signs in again, which makes her presence anew (still hidden).
    drop(a);
    let mut a = common::Ws::connect(gw, &stack.token(A, "phone")).await;
    let seen = presence_of(&mut b, &usr(A), Duration::from_secs(1)).await;
    assert!(!seen.contains(&"on".to_string()), "{seen:?}");

    // Not an access mode: refused, nothing changed.
    let (_, ctrl) = a
        .request(json!({"set": {"topic": "me", "sub": {"mode": "J{S"}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(400), "{ctrl}");
    assert!(!listed_online(&mut b, &usr(A)).await);

    // Off: B is told A is online again.
    let (_, ctrl) = a
        .request(json!({"set": {"topic": "me", "sub": {"mode": "JPS"}}}))
        .await;
    assert_eq!(
        ctrl["ctrl"]["params"]["acs"]["mode"],
        json!("JPS"),
        "{ctrl}"
    );
    assert_eq!(
        presence_of(&mut b, &usr(A), Duration::from_secs(3)).await,
        ["on"],
        "B is told A is online"
    );
    assert!(
        listed_online(&mut b, &usr(A)).await,
        "A listed online again"
    );
    // Typing shows again (from another session of A's: one `kp` per 3 s
    // of a session is relayed).
    let mut a3 = common::Ws::connect(gw, &stack.token(A, "laptop")).await;
    let (_, ctrl) = a3.request(json!({"sub": {"topic": usr(B)}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    a3.send(typing).await;
    assert_eq!(
        typing_seen(&mut b, Duration::from_secs(3)).await,
        1,
        "typing shown"
    );
}

/// `{info what="kp"}` frames that reach `ws` within `wait`.
async fn typing_seen(ws: &mut common::Ws, wait: Duration) -> usize {
    frames_for(ws, wait)
        .await
        .iter()
        .filter(|f| f["info"]["what"] == json!("kp"))
        .count()
}

/// A block made over HTTP reaches the blocked peer's open app as the web
/// app's own Block does: `{pres topic="me" what="acs"}` taking `W` from
/// what they are given (the app shows "Messaging disabled" at once), and
/// the unblock gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http_block_is_told_to_the_peers_open_app() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "conversations", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const A: i64 = 81;
    const B: i64 = 82;
    let (status, body) = send_p2p(&stack, gw, A, B, "first", "hi B").await;
    assert_eq!(status, 202, "{body}");
    let mut a = common::Ws::connect(gw, &stack.token(A, "web")).await;
    wait_for_row(&stack, "A lists B", "", A, &p2p_topic(A, B)).await;
    let given = |frames: Vec<Value>| -> Vec<String> {
        frames
            .iter()
            .filter(|f| f["pres"]["what"] == json!("acs") && f["pres"]["src"] == json!(usr(B)))
            .map(|f| {
                f["pres"]["dacs"]["given"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    let (status, _) = call(&stack, gw, B, "POST", "/v1/blocks", json!({"uid": A})).await;
    assert_eq!(status, 202);
    assert_eq!(
        given(frames_for(&mut a, Duration::from_secs(2)).await),
        ["-W"],
        "A is told at once"
    );
    let (status, _) = call(
        &stack,
        gw,
        B,
        "DELETE",
        &format!("/v1/blocks/{A}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        given(frames_for(&mut a, Duration::from_secs(2)).await),
        ["+W"],
        "and of the unblock"
    );
}

/// Issue 40: Tinode's web app blocks, unblocks, mutes and unmutes with
/// `{set sub={mode}}` of the user's own subscription. Each is in force when
/// answered (the relations projection does not run here), is what every later
/// read of the user's access shows, and the blocked peer is told they may
/// not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_web_apps_block_and_mute_are_in_force_when_answered() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "conversations", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const A: i64 = 41;
    const B: i64 = 42;
    const C: i64 = 43;
    let (status, body) = send_p2p(&stack, gw, A, B, "first", "hi B").await;
    assert_eq!(status, 202, "{body}");
    let mut b = common::Ws::connect(gw, &stack.token(B, "web")).await;
    let mut a = common::Ws::connect(gw, &stack.token(A, "web")).await;

    // B blocks A: the want the app sends (its want minus J and P).
    let (_, ctrl) = b
        .request(json!({"set": {"topic": usr(A), "sub": {"mode": "RWA"}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    assert_eq!(ctrl["ctrl"]["topic"], json!(usr(A)), "{ctrl}");
    assert_eq!(
        ctrl["ctrl"]["params"]["acs"]["want"],
        json!("RWA"),
        "{ctrl}"
    );
    // In force at once: A's next send is refused with the reason.
    let (status, body) = send_p2p(&stack, gw, A, B, "second", "still there?").await;
    assert_eq!(
        (status, body["params"]["code"].clone()),
        (403, json!("BLOCKED")),
        "{body}"
    );
    // A is given no W (the app shows "Messaging disabled"); B's list keeps
    // the chat, not joined (the app's "Blocked contacts").
    let (_, sub) = a.request(json!({"sub": {"topic": usr(B)}})).await;
    assert_eq!(
        sub["ctrl"]["params"]["acs"]["given"],
        json!("JRPA"),
        "{sub}"
    );
    let (_, ctrl) = a
        .request(json!({"pub": {"topic": usr(B), "content": "and over ws?"}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(403), "{ctrl}");
    assert_eq!(
        ctrl["ctrl"]["text"],
        json!("blocked by the recipient"),
        "{ctrl}"
    );
    let mut listed = None;
    for _ in 0..100 {
        listed = listed_acs(&mut a, &usr(B)).await;
        if listed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = listed.expect("A lists B once the first message is projected");
    assert_eq!(listed["mode"], json!("JRPA"), "{listed}");
    let listed = listed_acs(&mut b, &usr(A)).await.expect("B lists A");
    assert_eq!(listed["want"], json!("RWA"), "{listed}");

    // A block made over HTTP of someone B never spoke with is listed too,
    // so it can be undone from the app.
    let (status, _) = call(&stack, gw, B, "POST", "/v1/blocks", json!({"uid": C})).await;
    assert_eq!(status, 202);
    let listed = listed_acs(&mut b, &usr(C))
        .await
        .expect("B lists C, blocked");
    assert!(!listed["mode"].as_str().unwrap().contains('J'), "{listed}");

    // B unblocks A, muted (want with J, without P): A may write again, and
    // B's chat shows muted, here and in the table the push pipeline reads.
    let (_, ctrl) = b
        .request(json!({"set": {"topic": usr(A), "sub": {"mode": "JRWA"}}}))
        .await;
    assert_eq!(
        ctrl["ctrl"]["params"]["acs"]["mode"],
        json!("JRWA"),
        "{ctrl}"
    );
    let (status, body) = send_p2p(&stack, gw, A, B, "third", "back").await;
    assert_eq!(status, 202, "{body}");
    let listed = listed_acs(&mut b, &usr(A)).await.expect("B lists A");
    assert_eq!(listed["mode"], json!("JRWA"), "{listed}");
    let muted: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_push_muted_topics WHERE uid = ? AND topic = ?")
            .bind(B)
            .bind(p2p_topic(A, B))
            .fetch_one(&stack.pool())
            .await
            .unwrap();
    assert_eq!(muted, 1);
    // Unmuted: P again.
    let (_, ctrl) = b
        .request(json!({"set": {"topic": usr(A), "sub": {"mode": "JRWPA"}}}))
        .await;
    assert_eq!(
        ctrl["ctrl"]["params"]["acs"]["mode"],
        json!("JRWPA"),
        "{ctrl}"
    );

    // B archives the chat (the app's Archive: `private.arch`), kept in
    // B's list entry; Restore (the delete marker) takes it away again.
    let (_, ctrl) = b
        .request(json!({"set": {"topic": usr(A), "desc": {"private": {"arch": true}}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let entry = |meta: &Value| {
        meta["meta"]["sub"]
            .as_array()
            .and_then(|subs| subs.iter().find(|s| s["topic"] == json!(usr(A))).cloned())
    };
    let (_, meta) = b
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    assert_eq!(
        entry(&meta).expect("listed")["private"],
        json!({"arch": true}),
        "{meta}"
    );
    let (_, ctrl) = b
        .request(json!({"set": {"topic": usr(A), "desc": {"private": {"arch": "\u{2421}"}}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (_, meta) = b
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    assert!(
        entry(&meta).expect("listed").get("private").is_none(),
        "{meta}"
    );
    let big = "x".repeat(imstream::fields::CHAT_PRIVATE_CHARS);
    let (_, ctrl) = b
        .request(json!({"set": {"topic": usr(A), "desc": {"private": {"comment": big}}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(413), "{ctrl}");

    // B deletes the chat (the app's Delete): every message leaves B's
    // view, A keeps hers, and it leaves B's list until A writes again.
    let (_, ctrl) = b
        .request(json!({"del": {"topic": usr(A), "what": "topic", "hard": true}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let mut left = Vec::new();
    for _ in 0..100 {
        (left, _) = b.get_data(&usr(A), json!({"since": 1})).await;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(left.is_empty(), "B still sees {left:?}");
    // (A was told of the unblock before: a `{pres}` precedes her page.)
    let (frames, _) = a
        .request(json!({"get": {"topic": usr(B), "what": "data", "data": {"since": 1}}}))
        .await;
    let kept = frames
        .iter()
        .filter(|f| f["data"]["topic"] == json!(usr(B)))
        .count();
    assert!(kept >= 2, "A lost her messages: {frames:?}");
    assert!(
        listed_acs(&mut b, &usr(A)).await.is_none(),
        "the deleted chat is listed"
    );
    let (status, body) = send_p2p(&stack, gw, A, B, "fourth", "still friends?").await;
    assert_eq!(status, 202, "{body}");
    let mut back = None;
    for _ in 0..100 {
        back = listed_acs(&mut b, &usr(A)).await;
        if back.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(back.is_some(), "a new message did not bring the chat back");

    // A group: a member mutes it; blocking a group is refused with the
    // way out; a stranger's mode of it is "not found", as any other name.
    stack.create_group("grpModes", A, &[B]).await;
    let (_, ctrl) = b
        .request(json!({"set": {"topic": "grpModes", "sub": {"mode": "JRWS"}}}))
        .await;
    assert_eq!(
        ctrl["ctrl"]["params"]["acs"]["want"],
        json!("JRWS"),
        "{ctrl}"
    );
    let (_, ctrl) = b
        .request(json!({"set": {"topic": "grpModes", "sub": {"mode": "RWS"}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(403), "{ctrl}");
    let mut c = common::Ws::connect(gw, &stack.token(C, "web")).await;
    let (_, ctrl) = c
        .request(json!({"set": {"topic": "grpModes", "sub": {"mode": "JRWS"}}}))
        .await;
    let (_, none) = c
        .request(json!({"set": {"topic": "grpNoSuch", "sub": {"mode": "JRWS"}}}))
        .await;
    assert_eq!(
        (ctrl["ctrl"]["code"].clone(), ctrl["ctrl"]["text"].clone()),
        (none["ctrl"]["code"].clone(), none["ctrl"]["text"].clone()),
        "{ctrl} / {none}"
    );

    // Pins (the app's Pin, `{set aux={pins}}`): the owner pins a message,
    // a member reads it with `{get aux}` and may not pin; a seq that does
    // not exist is refused; the delete marker unpins.
    let mut owner = common::Ws::connect(gw, &stack.token(A, "pins")).await;
    let (_, ctrl) = owner.request(json!({"sub": {"topic": "grpModes"}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (_, ctrl) = owner
        .request(json!({"pub": {"topic": "grpModes", "content": "pin me"}}))
        .await;
    let seq = ctrl["ctrl"]["params"]["seq"].as_i64().expect("a seq");
    let (_, ctrl) = b
        .request(json!({"set": {"topic": "grpModes", "aux": {"pins": [seq]}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(403), "{ctrl}");
    let (_, ctrl) = owner
        .request(json!({"set": {"topic": "grpModes", "aux": {"pins": [seq + 1]}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(400), "{ctrl}");
    let (_, ctrl) = owner
        .request(json!({"set": {"topic": "grpModes", "aux": {"pins": [seq]}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (_, aux) = b
        .request(json!({"get": {"topic": "grpModes", "what": "aux"}}))
        .await;
    assert_eq!(aux["meta"]["aux"]["pins"], json!([seq]), "{aux}");
    let (_, aux) = c
        .request(json!({"get": {"topic": "grpModes", "what": "aux"}}))
        .await;
    assert_ne!(
        aux["meta"]["aux"]["pins"],
        json!([seq]),
        "a stranger read the pins: {aux}"
    );
    let (_, ctrl) = owner
        .request(json!({"set": {"topic": "grpModes", "aux": {"pins": "\u{2421}"}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (_, aux) = b
        .request(json!({"get": {"topic": "grpModes", "what": "aux"}}))
        .await;
    assert_eq!(aux["meta"]["aux"]["pins"], json!("\u{2421}"), "{aux}");

    // A deleted chat that is B's newest never ends B's paging early: a
    // page of one that is all hidden still names the next page.
    let (status, body) = send_p2p(&stack, gw, A, B, "fifth", "newest").await;
    assert_eq!(status, 202, "{body}");
    let mut found = None;
    for _ in 0..100 {
        found = listed_acs(&mut b, &usr(A)).await;
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(found.is_some(), "A's newest message did not list the chat");
    let (_, ctrl) = b
        .request(json!({"del": {"topic": usr(A), "what": "topic", "hard": true}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (mut topics, mut cursor) = (Vec::new(), None::<String>);
    for _ in 0..10 {
        let path = match &cursor {
            None => "/v1/me/conversations?limit=1".to_string(),
            Some(c) => format!("/v1/me/conversations?limit=1&cursor={c}"),
        };
        let (status, page) = call(&stack, gw, B, "GET", &path, json!(null)).await;
        assert_eq!(status, 200, "{page}");
        for c in page["conversations"].as_array().unwrap() {
            topics.push(c["topic"].as_str().unwrap().to_string());
        }
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert!(
        topics.contains(&"grpModes".to_string()),
        "paging stopped early: {topics:?}"
    );
    assert!(
        !topics.contains(&usr(A)),
        "the deleted chat is listed: {topics:?}"
    );

    // Blocked users with no chat are listed without their note (only
    // someone who shares a chat sees it).
    stack.start_pipeline("relations").await;
    let (status, _) = call(
        &stack,
        gw,
        C,
        "PUT",
        "/v1/me/profile",
        json!({"note": "private note of C"}),
    )
    .await;
    assert_eq!(status, 202);
    common::wait_for("C's note projected", Duration::from_secs(30), || async {
        let note: Option<Option<String>> =
            sqlx::query_scalar("SELECT note FROM im_user_profiles WHERE uid = ?")
                .bind(C)
                .fetch_optional(&stack.pool())
                .await
                .map_err(|e| e.to_string())?;
        match note.flatten() {
            Some(_) => Ok(()),
            None => Err("not yet".to_string()),
        }
    })
    .await;
    let (_, meta) = b
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    let entry = meta["meta"]["sub"]
        .as_array()
        .and_then(|subs| subs.iter().find(|s| s["topic"] == json!(usr(C))).cloned())
        .expect("C listed as blocked");
    assert!(entry["public"].get("note").is_none(), "{entry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn offline_recipients_get_exactly_one_push_task_without_content() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "relations", "push"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const TOPIC: &str = "grpPush";
    const SENDER: i64 = 41;
    const ONLINE: i64 = 42;
    const OFFLINE: i64 = 43;
    const QUIET: i64 = 44;
    stack
        .create_group(TOPIC, SENDER, &[ONLINE, OFFLINE, QUIET])
        .await;
    let _online = Client::open(gw, &stack.token(ONLINE, "phone"), "online").await;
    let (status, _) = call(
        &stack,
        gw,
        QUIET,
        "PUT",
        "/v1/me/push",
        json!({"dnd": true}),
    )
    .await;
    assert_eq!(status, 202);
    let redis = stack.redis().await;
    let dnd = imstream::keys::TenantKeys::new(stack.tenant()).dnd(QUIET);
    wait_for("dnd projected", DELIVERY, || {
        let (mut redis, dnd) = (redis.clone(), dnd.clone());
        async move {
            let on: bool = redis::cmd("EXISTS")
                .arg(&dnd)
                .query_async(&mut redis)
                .await
                .unwrap();
            if on {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
    })
    .await;

    const SECRET: &str = "the secret content";
    let (_, body) = common::send_http(
        &reqwest::Client::new(),
        gw,
        &stack.token(SENDER, "http"),
        TOPIC,
        "m1",
        SECRET,
    )
    .await;
    let seq = body["seq"].as_i64().unwrap();
    // And a one-to-one message to a user who is offline.
    let (status, body) = send_p2p(&stack, gw, SENDER, OFFLINE, "p1", SECRET).await;
    assert_eq!(status, 202, "{body}");
    let p2p_seq = body["seq"].as_i64().unwrap();
    let p2p = p2p_topic(SENDER, OFFLINE);

    let task_of = |tasks: &[PushTask], topic: &str, seq: i64| {
        tasks
            .iter()
            .filter(|t| t.topic == topic && t.seq == seq)
            .cloned()
            .collect::<Vec<_>>()
    };
    let tasks = read_events::<PushTask>(stack.config(), TopicKind::PushTasks, |ts| {
        !task_of(ts, TOPIC, seq).is_empty() && !task_of(ts, &p2p, p2p_seq).is_empty()
    })
    .await;
    let group_tasks = task_of(&tasks, TOPIC, seq);
    assert_eq!(
        group_tasks.len(),
        1,
        "only the offline member: {group_tasks:?}"
    );
    let t = &group_tasks[0];
    assert_eq!(
        (t.recipient_uid, t.sender_uid, t.tenant_id.as_str()),
        (OFFLINE, SENDER, stack.tenant())
    );
    assert_eq!(t.task_id, format!("{TOPIC}:{seq}:{OFFLINE}"));
    assert!(
        !format!("{t:?}").contains(SECRET),
        "no content in a push task"
    );
    assert_eq!(task_of(&tasks, &p2p, p2p_seq).len(), 1);

    // Replaying the log through a fresh push group produces no second task.
    stack.stop_pipeline("push").await;
    stack.world.config.pipelines.group_prefix = format!("replay-{}", common::unique_id());
    stack.start_pipeline("push").await;
    let (_, body) = common::send_http(
        &reqwest::Client::new(),
        gw,
        &stack.token(SENDER, "http"),
        TOPIC,
        "m2",
        "later",
    )
    .await;
    let later = body["seq"].as_i64().unwrap();
    let tasks = read_events::<PushTask>(stack.config(), TopicKind::PushTasks, |ts| {
        !task_of(ts, TOPIC, later).is_empty()
    })
    .await;
    assert_eq!(task_of(&tasks, TOPIC, seq).len(), 1, "no task twice");
    assert_eq!(task_of(&tasks, &p2p, p2p_seq).len(), 1, "no task twice");
    assert!(
        tasks.iter().all(|t| t.recipient_uid == OFFLINE),
        "none for online, DND or the sender: {tasks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_push_pipeline_that_lagged_past_the_horizon_pushes_only_fresh_messages() {
    let mut stack = Stack::prepared(None).await;
    stack.world.config.push.horizon_secs = 2;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const TOPIC: &str = "grpHorizon";
    const SENDER: i64 = 61;
    const OFFLINE: i64 = 62;
    stack.create_group(TOPIC, SENDER, &[OFFLINE]).await;
    let web = reqwest::Client::new();
    let token = stack.token(SENDER, "http");
    // Sent while the push pipeline is down: by the time it runs they are
    // past the horizon.
    let mut old = Vec::new();
    for n in 0..3 {
        let (_, body) =
            common::send_http(&web, gw, &token, TOPIC, &format!("old{n}"), "stale news").await;
        old.push(body["seq"].as_i64().expect("seq"));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stack.start_pipeline("push").await;
    let (_, body) = common::send_http(&web, gw, &token, TOPIC, "fresh", "fresh news").await;
    let fresh = body["seq"].as_i64().expect("seq");
    // Same topic, same partition: once the fresh message's task is out,
    // the old ones were handled before it.
    let tasks = read_events::<PushTask>(stack.config(), TopicKind::PushTasks, |ts| {
        ts.iter().any(|t| t.topic == TOPIC && t.seq == fresh)
    })
    .await;
    let ours: Vec<i64> = tasks
        .iter()
        .filter(|t| t.topic == TOPIC)
        .map(|t| t.seq)
        .collect();
    assert_eq!(
        ours,
        vec![fresh],
        "only the fresh message is pushed, not {old:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn p2p_history_pages_across_a_month_switch() {
    let mut stack = Stack::prepared(Some("2026-09-30T23:59:00Z")).await;
    stack.start_pipeline("store").await;
    let gw = stack.start_gateway("gw").await;
    const A: i64 = 51;
    const B: i64 = 52;
    let topic = p2p_topic(A, B);
    let pool = stack.pool();
    let mut sent = Vec::new();
    for n in 0..3 {
        let (status, body) =
            send_p2p(&stack, gw, A, B, &format!("s{n}"), &format!("sep {n}")).await;
        assert_eq!(status, 202, "{body}");
        sent.push(body["seq"].as_i64().unwrap());
    }
    wait_for("september rows", DELIVERY, || async {
        let r = rows(&pool, "p2p", "202609", &topic).await;
        if r.len() == 3 {
            Ok(())
        } else {
            Err(format!("{r:?}"))
        }
    })
    .await;
    stack.shard_pass(Some("2026-10-01T00:00:05Z")).await;
    // Send until a message lands in October (the gateway caches the month ≤ 1 s).
    for n in 0..100 {
        let (status, body) =
            send_p2p(&stack, gw, B, A, &format!("o{n}"), &format!("oct {n}")).await;
        assert_eq!(status, 202, "{body}");
        let seq = body["seq"].as_i64().unwrap();
        sent.push(seq);
        let month = wait_for("stored", DELIVERY, || async {
            for m in ["202609", "202610"] {
                if rows(&pool, "p2p", m, &topic).await.contains(&seq) {
                    return Ok(m);
                }
            }
            Err("not yet".to_string())
        })
        .await;
        if month == "202610" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!rows(&pool, "p2p", "202610", &topic).await.is_empty());

    // Both sides page through both months, newest first, in pages of 2.
    let mut b = Client::open(gw, &stack.token(B, "phone"), "b").await;
    b.sub(&usr(A)).await;
    let mut seen: Vec<i64> = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let mut data = json!({"limit": 2});
        if let Some(bf) = before {
            data["before"] = json!(bf);
        }
        let start = b.frames().len();
        let ctrl = b
            .request(json!({"get": {"topic": usr(A), "what": "data", "data": data}}))
            .await;
        let page: Vec<i64> = b.frames()[start..]
            .iter()
            .filter(|f| f["data"]["topic"] == json!(usr(A)))
            .map(|f| f["data"]["seq"].as_i64().unwrap())
            .collect();
        if ctrl["code"] == json!(204) {
            break;
        }
        assert_eq!(ctrl["code"], json!(208), "{ctrl}");
        seen.extend(&page);
        before = page.last().copied();
    }
    let mut expected = sent.clone();
    expected.sort_unstable_by(|x, y| y.cmp(x));
    assert_eq!(seen, expected);
    // HTTP agrees.
    let listed: Value = reqwest::Client::new()
        .get(format!("http://{gw}/v1/users/{B}/messages?limit=100"))
        .bearer_auth(stack.token(A, "http"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let http_seqs: Vec<i64> = listed["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(http_seqs, expected, "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_friend_request_reaches_every_device_of_its_target() {
    let stack = Stack::realtime(2).await;
    const A: i64 = 61;
    const B: i64 = 62;
    let a_phone = Client::open(stack.gateway_addr(0), &stack.token(A, "phone"), "a-phone").await;
    let a_web = Client::open(stack.gateway_addr(1), &stack.token(A, "web"), "a-web").await;
    let b = Client::open(stack.gateway_addr(1), &stack.token(B, "phone"), "b").await;

    let (status, body) = call(
        &stack,
        stack.gateway_addr(0),
        B,
        "POST",
        "/v1/friends/requests",
        json!({"uid": A, "message": "hi"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    for a in [&a_phone, &a_web] {
        let f = a
            .expect("friend request", DELIVERY, |f| {
                f["pres"]["event"] == json!("friend.request")
            })
            .await;
        assert_eq!(f["pres"]["topic"], json!("me"));
        assert_eq!(f["pres"]["src"], json!(usr(B)));
        assert_eq!(f["pres"]["params"]["message"], json!("hi"));
    }
    // A accepts once the request is recorded; B hears of it, both are friends.
    let pool = stack.pool();
    wait_for("accepted", DELIVERY, || async {
        match call(
            &stack,
            stack.gateway_addr(1),
            A,
            "POST",
            &format!("/v1/friends/requests/{B}/accept"),
            json!(null),
        )
        .await
        {
            (202, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    b.expect("accepted", DELIVERY, |f| {
        f["pres"]["event"] == json!("friend.accepted")
    })
    .await;
    wait_for("friends both ways", DELIVERY, || async {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_friends WHERE (uid = ? AND friend_uid = ?) OR (uid = ? AND friend_uid = ?)")
            .bind(A).bind(B).bind(B).bind(A)
            .fetch_one(&pool).await.unwrap();
        if n == 2 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    // A system notification reaches both of A's devices too.
    let resp = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/admin/notifications",
            stack.admin_addr(0)
        ))
        .bearer_auth(&stack.config().auth.admin_token)
        .json(
            &json!({"tenant": stack.tenant(), "uid": A, "title": "Maintenance", "text": "tonight"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    for a in [&a_phone, &a_web] {
        let n = a
            .expect("notification", DELIVERY, |f| {
                f["pres"]["event"] == json!("notification")
            })
            .await;
        assert_eq!(n["pres"]["params"]["title"], json!("Maintenance"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_webhook_sender_retries_delivers_each_task_once_and_gives_up_to_the_dlq() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    // A push provider that fails each task's first two calls (503), and
    // always refuses recipient 666 (410).
    let calls: Arc<Mutex<HashMap<String, (u32, u32)>>> = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/push",
        axum::routing::post(move |axum::Json(task): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                let id = task["task_id"].as_str().unwrap_or_default().to_string();
                let mut calls = seen.lock().unwrap();
                let entry = calls.entry(id).or_default();
                entry.0 += 1;
                if task["recipient"] == json!(666) {
                    // This recipient's device token is gone: refused for good.
                    axum::http::StatusCode::GONE
                } else if entry.0 <= 2 {
                    // Overloaded: an outage, waited out.
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                } else {
                    entry.1 += 1;
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut stack = Stack::prepared(None).await;
    stack.world.config.push.webhook_url = format!("http://{addr}/push");
    stack.start_pipeline("pushsend").await;
    let codec = imstream::events::EventCodec::new(&stack.config().registry.url).unwrap();
    let producer =
        imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
    let task = |recipient: i64| PushTask {
        task_id: format!("grpHook:7:{recipient}"),
        tenant_id: stack.tenant().to_string(),
        topic: "grpHook".into(),
        seq: 7,
        sender_uid: 1,
        recipient_uid: recipient,
        created_at: imstream::events::now_ms(),
    };
    // Task for 5 twice (a duplicate), one for 6, one that never succeeds.
    for t in [task(5), task(5), task(6), task(666)] {
        producer
            .send(
                TopicKind::PushTasks,
                &format!("{}:{}", t.tenant_id, t.recipient_uid),
                &t,
                None,
            )
            .await
            .unwrap();
    }
    let names = imstream::kafka::topics::TopicNames::new(&stack.config().kafka);
    let dlq = names.dlq(TopicKind::PushTasks, "pushsend");
    let dead = common::read_topic::<PushTask>(stack.config(), &dlq, |ts| !ts.is_empty()).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].recipient_uid, 666);
    wait_for("delivered", DELIVERY, || async {
        let calls = calls.lock().unwrap().clone();
        let ok = |id: &str| calls.get(id).map_or(0, |c| c.1);
        if ok("grpHook:7:5") == 1 && ok("grpHook:7:6") == 1 {
            Ok(())
        } else {
            Err(format!("{calls:?}"))
        }
    })
    .await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls["grpHook:7:5"],
        (3, 1),
        "retried twice, delivered once despite the duplicate"
    );
    assert_eq!(calls["grpHook:7:666"].1, 0);
    assert!(calls["grpHook:7:666"].0 >= 2, "retried before giving up");
}
