//! Realtime delivery across three gateway processes (seed 002 §10): the same
//! user on two gateways gets every message on both devices, members spread
//! over three gateways all get it in real time, an offline member completes
//! by seq, a client_mid retry keeps its seq and is delivered once, and a
//! read on one device reaches the user's other devices and the sender.
//!
//! Each test has its own stack (registry, tenant DB, topics, every
//! pipeline, three in-process gateways with distinct node ids).

mod common;
mod realtime_support;

use std::time::Duration;

use serde_json::json;

use common::{wait_for, Stack};
use realtime_support::{is_data, stored_rows, usr, wait_stored, Client, DELIVERY};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_user_on_two_gateways_gets_each_message_on_both_devices() {
    let stack = Stack::realtime(3).await;
    const TOPIC: &str = "grpMultiDevice";
    const A: i64 = 11;
    const B: i64 = 12;
    stack.create_group(TOPIC, A, &[B]).await;

    // A on gateway 0 and gateway 1; B sends from gateway 2 and has a second
    // device on gateway 0.
    let mut a_phone = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(A, "phone"),
        TOPIC,
        "a-phone",
    )
    .await;
    let a_web = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(A, "web"),
        TOPIC,
        "a-web",
    )
    .await;
    let mut b_phone = Client::open_sub(
        stack.gateway_addr(2),
        &stack.token(B, "phone"),
        TOPIC,
        "b-phone",
    )
    .await;
    let b_pad = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(B, "pad"),
        TOPIC,
        "b-pad",
    )
    .await;

    let s1 = b_phone.send_text(TOPIC, "hello A").await;
    for c in [&a_phone, &a_web, &b_pad] {
        let d = c.expect_data(TOPIC, s1).await;
        assert_eq!(
            (d["from"].clone(), d["content"].clone()),
            (json!(usr(B)), json!({"txt": "hello A"})),
            "[{}] {d}",
            c.label
        );
    }

    // A answers from one device: A's other device and both of B's get it.
    let s2 = a_phone.send_text(TOPIC, "hi B, from my phone").await;
    assert!(s2 > s1);
    for c in [&a_web, &b_phone, &b_pad] {
        let d = c.expect_data(TOPIC, s2).await;
        assert_eq!(d["from"], json!(usr(A)), "[{}] {d}", c.label);
    }

    // One more from B: everything before it in the topic has been delivered
    // once it arrives, so each device's list of seqs is now final.
    let s3 = b_phone.send_text(TOPIC, "third").await;
    for c in [&a_phone, &a_web, &b_pad] {
        c.expect_data(TOPIC, s3).await;
    }
    assert_eq!(
        a_web.data_seqs(TOPIC),
        vec![s1, s2, s3],
        "A's second device: each message once, in order"
    );
    assert_eq!(
        b_pad.data_seqs(TOPIC),
        vec![s1, s2, s3],
        "B's second device gets B's own messages too"
    );
    // The sending session itself only gets its ctrl 202 (skip_sid).
    assert_eq!(
        a_phone.data_seqs(TOPIC),
        vec![s1, s3],
        "A's sending session"
    );
    b_phone.expect_data(TOPIC, s2).await;
    assert_eq!(b_phone.data_seqs(TOPIC), vec![s2], "B's sending session");

    // Stored once each, whatever the number of devices.
    let pool = stack.pool();
    for s in [s1, s2, s3] {
        assert_eq!(wait_stored(&pool, TOPIC, s).await, 1, "seq {s} stored once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_on_three_gateways_get_messages_and_offline_members_catch_up() {
    let stack = Stack::realtime(3).await;
    const TOPIC: &str = "grpThreePods";
    let (u1, u2, u3, u4, u5) = (21, 22, 23, 24, 25);
    stack.create_group(TOPIC, u1, &[u2, u3, u4, u5]).await;

    let mut c1 = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(u1, "d"),
        TOPIC,
        "u1@gw0",
    )
    .await;
    let mut c2 = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(u2, "d"),
        TOPIC,
        "u2@gw1",
    )
    .await;
    let mut c3 = Client::open_sub(
        stack.gateway_addr(2),
        &stack.token(u3, "d"),
        TOPIC,
        "u3@gw2",
    )
    .await;
    let mut c5 = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(u5, "d"),
        TOPIC,
        "u5@gw1",
    )
    .await;
    // u4 is offline throughout.

    let m1 = c1.send_text(TOPIC, "one").await;
    for c in [&c2, &c3, &c5] {
        c.expect_data(TOPIC, m1).await;
    }
    // u5 goes offline; two more messages from the other gateways.
    c5.close().await;
    let m2 = c2.send_text(TOPIC, "two").await;
    let m3 = c3.send_text(TOPIC, "three").await;
    c1.expect_data(TOPIC, m2).await;
    c1.expect_data(TOPIC, m3).await;
    c2.expect_data(TOPIC, m3).await;
    c3.expect_data(TOPIC, m2).await;

    // u5 reconnects on another gateway and completes from its last seq.
    let mut c5 = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(u5, "d"),
        TOPIC,
        "u5@gw0",
    )
    .await;
    let got = catch_up(&mut c5, TOPIC, m1 + 1, m3).await;
    assert_eq!(got, vec![m2, m3], "u5 completes what it missed");
    // u4 was never online: it gets everything from the start.
    let mut c4 = Client::open_sub(
        stack.gateway_addr(2),
        &stack.token(u4, "d"),
        TOPIC,
        "u4@gw2",
    )
    .await;
    let got = catch_up(&mut c4, TOPIC, 1, m3).await;
    assert_eq!(got, vec![m1, m2, m3], "u4 completes from seq 1");
    let first = c4.get_since(TOPIC, 1).await.0;
    let first = first
        .iter()
        .find(|d| d["data"]["seq"] == json!(m1))
        .unwrap();
    assert_eq!(
        (
            first["data"]["from"].clone(),
            first["data"]["content"].clone()
        ),
        (json!(usr(u1)), json!({"txt": "one"}))
    );

    // Once back, both get new messages in real time.
    let m4 = c3.send_text(TOPIC, "four").await;
    for c in [&c1, &c2, &c4, &c5] {
        c.expect_data(TOPIC, m4).await;
    }
}

/// `{get what="data" since}` until every seq up to `last` is there (the
/// store may still be projecting); returns the seqs the final reply held,
/// ascending.
async fn catch_up(c: &mut Client, topic: &str, since: i64, last: i64) -> Vec<i64> {
    let started = std::time::Instant::now();
    loop {
        let (data, ctrl) = c.get_since(topic, since).await;
        let mut seqs: Vec<i64> = data
            .iter()
            .filter_map(|d| d["data"]["seq"].as_i64())
            .collect();
        seqs.sort_unstable();
        if seqs.last() == Some(&last) {
            assert_eq!(
                ctrl["code"],
                json!(208),
                "[{}] get ends with 208: {ctrl}",
                c.label
            );
            assert_eq!(
                ctrl["params"]["count"],
                json!(seqs.len()),
                "[{}] count: {ctrl}",
                c.label
            );
            return seqs;
        }
        assert!(
            started.elapsed() < DELIVERY,
            "[{}] {{get since={since}}} still incomplete: {seqs:?} / {ctrl}",
            c.label
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_mid_retry_keeps_its_seq_and_is_delivered_once() {
    let stack = Stack::realtime(3).await;
    const TOPIC: &str = "grpRetry";
    let (sender, r1, r2) = (31, 32, 33);
    stack.create_group(TOPIC, sender, &[r1, r2]).await;

    let mut s = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(sender, "phone"),
        TOPIC,
        "sender@gw0",
    )
    .await;
    let recv1 = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(r1, "d"),
        TOPIC,
        "r1@gw1",
    )
    .await;
    let recv2 = Client::open_sub(
        stack.gateway_addr(2),
        &stack.token(r2, "d"),
        TOPIC,
        "r2@gw2",
    )
    .await;
    let sender_web = Client::open_sub(
        stack.gateway_addr(2),
        &stack.token(sender, "web"),
        TOPIC,
        "sender-web@gw2",
    )
    .await;

    let first = s.publish(TOPIC, "exactly once", Some("cm-1")).await;
    let seq = realtime_support::accepted_seq(&first, "sender");
    recv1.expect_data(TOPIC, seq).await;

    // The connection drops; the client reconnects (to another gateway) and
    // resends with the same client_mid: same seq.
    s.close().await;
    let mut s = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(sender, "phone"),
        TOPIC,
        "sender@gw1",
    )
    .await;
    let again = s.publish(TOPIC, "exactly once", Some("cm-1")).await;
    assert_eq!(
        realtime_support::accepted_seq(&again, "sender retry"),
        seq,
        "retry keeps its seq: {again}"
    );
    // Over HTTP too (same user, same client_msg_id).
    let (status, body) = common::send_http(
        &reqwest::Client::new(),
        stack.gateway_addr(2),
        &stack.token(sender, "phone"),
        TOPIC,
        "cm-1",
        "exactly once",
    )
    .await;
    assert_eq!(
        (status, body["seq"].clone(), body["duplicate"].clone()),
        (202, json!(seq), json!(true)),
        "{body}"
    );

    // A later message: once it has arrived everywhere, anything the retries
    // could have caused would have arrived before it.
    let next = s.send_text(TOPIC, "after the retry").await;
    assert_eq!(next, seq + 1, "the retries allocated no seq");
    for c in [&recv1, &recv2, &sender_web] {
        c.expect_data(TOPIC, next).await;
        assert_eq!(
            c.count(|f| is_data(f, TOPIC, seq)),
            1,
            "[{}] got seq {seq} once: {:?}",
            c.label,
            c.frames()
        );
    }
    let pool = stack.pool();
    assert_eq!(wait_stored(&pool, TOPIC, next).await, 1);
    assert_eq!(stored_rows(&pool, TOPIC, seq).await, 1, "stored once");
    let month = imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string();
    let rows: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ? AND client_msg_id = 'cm-1'"
    ))
    .bind(TOPIC)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rows, 1, "one row for the client_mid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_on_one_device_reaches_the_other_devices_and_the_sender() {
    let stack = Stack::realtime(3).await;
    const TOPIC: &str = "grpReadSync";
    const A: i64 = 41;
    const B: i64 = 42;
    stack.create_group(TOPIC, B, &[A]).await;

    let mut a_phone = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(A, "phone"),
        TOPIC,
        "a-phone@gw0",
    )
    .await;
    let mut a_web = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(A, "web"),
        TOPIC,
        "a-web@gw1",
    )
    .await;
    let mut b_phone = Client::open_sub(
        stack.gateway_addr(2),
        &stack.token(B, "phone"),
        TOPIC,
        "b-phone@gw2",
    )
    .await;
    let b_pad = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(B, "pad"),
        TOPIC,
        "b-pad@gw0",
    )
    .await;

    let mut last = 0;
    for i in 1..=3 {
        last = b_phone.send_text(TOPIC, &format!("message {i}")).await;
    }
    a_phone.expect_data(TOPIC, last).await;
    a_web.expect_data(TOPIC, last).await;

    // A reads everything on the phone.
    a_phone.note(TOPIC, "read", Some(last)).await;
    let read_by_a = |f: &serde_json::Value| {
        f["info"]["topic"] == json!(TOPIC)
            && f["info"]["from"] == json!(usr(A))
            && f["info"]["what"] == json!("read")
            && f["info"]["seq"] == json!(last)
    };
    // A's other device learns it (its unread count for the topic clears).
    a_web
        .expect("read of A's phone, on the topic", DELIVERY, read_by_a)
        .await;
    a_web
        .expect("read of A's phone, on me", DELIVERY, |f| {
            f["pres"]["topic"] == json!("me")
                && f["pres"]["src"] == json!(TOPIC)
                && f["pres"]["what"] == json!("read")
                && f["pres"]["seq"] == json!(last)
        })
        .await;
    // The sender sees the read on all of B's devices.
    b_phone
        .expect("A's read at B's sending device", DELIVERY, read_by_a)
        .await;
    b_pad
        .expect("A's read at B's other device", DELIVERY, read_by_a)
        .await;

    let pool = stack.pool();
    let cursor = |pool: sqlx::MySqlPool| async move {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT read_seq, recv_seq FROM im_subscriptions WHERE topic = ? AND uid = ?",
        )
        .bind(TOPIC)
        .bind(A)
        .fetch_optional(&pool)
        .await
        .map_err(|e| e.to_string())
    };
    wait_for("A's read cursor stored", DELIVERY, || {
        let pool = pool.clone();
        async move {
            match cursor(pool).await? {
                Some((read, _)) if read == last => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    // A stale read from the other device does not move the cursor back
    // (max wins). A recv note sent after it is the marker that both were
    // processed (same topic, same receipts partition).
    a_web.note(TOPIC, "read", Some(1)).await;
    a_web.note(TOPIC, "recv", Some(last)).await;
    b_phone
        .expect("A's recv", DELIVERY, |f| {
            f["info"]["from"] == json!(usr(A))
                && f["info"]["what"] == json!("recv")
                && f["info"]["seq"] == json!(last)
        })
        .await;
    wait_for("A's recv cursor stored", DELIVERY, || {
        let pool = pool.clone();
        async move {
            match cursor(pool).await? {
                Some((read, recv)) if recv == last => Ok(read),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!(
        cursor(pool.clone()).await.unwrap(),
        Some((last, last)),
        "read cursor kept its maximum"
    );

    // A read beyond the topic's last seq is dropped by the gateway; the recv
    // sent after it is the marker.
    a_phone.note(TOPIC, "read", Some(last + 100)).await;
    a_phone.note(TOPIC, "recv", Some(last)).await;
    let recv_by_a = |f: &serde_json::Value| {
        f["info"]["topic"] == json!(TOPIC)
            && f["info"]["what"] == json!("recv")
            && f["info"]["from"] == json!(usr(A))
    };
    b_phone
        .expect_count("A's two recvs", DELIVERY, 2, recv_by_a)
        .await;
    assert_eq!(
        b_phone
            .count(|f| f["info"]["what"] == json!("read") && f["info"]["seq"] == json!(last + 100)),
        0,
        "a read past the last seq is not relayed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn presence_follows_a_users_sessions_across_gateways() {
    let stack = Stack::realtime(3).await;
    const TOPIC: &str = "grpPresence";
    const A: i64 = 45;
    const B: i64 = 46;
    stack.create_group(TOPIC, B, &[A]).await;
    let tenant = stack.tenant().to_string();
    let keys = imstream::keys::TenantKeys::new(&tenant);
    let mut redis = stack.redis().await;
    let node = |i: usize| realtime_support::node_of(&stack, i);

    let mut b = Client::open_sub(stack.gateway_addr(2), &stack.token(B, "d"), TOPIC, "b@gw2").await;
    let pres = |what: &'static str| {
        move |f: &serde_json::Value| {
            f["pres"]["topic"] == json!(TOPIC)
                && f["pres"]["src"] == json!(usr(A))
                && f["pres"]["what"] == json!(what)
        }
    };
    // Every realtime copy sent to gateway 2 before a message of B's is
    // delivered before it: a marker for "nothing else is on its way".
    async fn marker(b: &mut Client, a: &Client) {
        let s = b.send_text(TOPIC, "marker").await;
        a.expect_data(TOPIC, s).await;
    }

    // A's first session attaches: B sees A come online once.
    let mut a0 = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(A, "phone"),
        TOPIC,
        "a@gw0",
    )
    .await;
    b.expect("A on", DELIVERY, pres("on")).await;
    // A's second session, on another gateway: no second "on".
    let mut a1 = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(A, "web"),
        TOPIC,
        "a@gw1",
    )
    .await;
    marker(&mut b, &a1).await;
    assert_eq!(b.count(pres("on")), 1, "{:?}", b.frames());
    let probe = redis.clone();
    let is_member = |key: String, uid: i64| {
        let mut redis = probe.clone();
        async move {
            redis::cmd("SISMEMBER")
                .arg(key)
                .arg(uid)
                .query_async::<bool>(&mut redis)
                .await
                .unwrap()
        }
    };
    assert!(is_member(keys.presence_node_users(&node(0)), A).await);
    assert!(is_member(keys.presence_node_users(&node(1)), A).await);

    // The first one leaves the topic and disconnects: A is still online
    // (on gateway 1), so no "off", and gateway 0 no longer lists A.
    assert_eq!(a0.leave(TOPIC).await["code"], json!(200));
    a0.close().await;
    marker(&mut b, &a1).await;
    assert_eq!(b.count(pres("off")), 0, "{:?}", b.frames());
    wait_for(
        "gateway 0 no longer lists A (no session of A left there)",
        DELIVERY,
        || {
            let f = is_member(keys.presence_node_users(&node(0)), A);
            async move {
                if f.await {
                    Err("still listed".to_string())
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
    assert!(is_member(keys.presence_node_users(&node(1)), A).await);
    let online: (String, i64) = redis::cmd("HMGET")
        .arg(keys.presence_user(A))
        .arg("online")
        .arg("session_count")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(online, ("1".to_string(), 1));

    // The last one goes: B sees A go offline, and A is offline everywhere.
    a1.close().await;
    b.expect("A off", DELIVERY, pres("off")).await;
    assert!(!is_member(keys.presence_node_users(&node(1)), A).await);
    wait_for("A offline", DELIVERY, || {
        let mut redis = redis.clone();
        let key = keys.presence_user(A);
        async move {
            let online: (String, i64) = redis::cmd("HMGET")
                .arg(key)
                .arg("online")
                .arg("session_count")
                .query_async(&mut redis)
                .await
                .unwrap();
            if online == ("0".to_string(), 0) {
                Ok(())
            } else {
                Err(format!("{online:?}"))
            }
        }
    })
    .await;
    let topic_online: bool = redis::cmd("SISMEMBER")
        .arg(imstream::keys::TopicKeys::new(&tenant, TOPIC).online_members())
        .arg(A)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(!topic_online, "A is not among the topic's online members");
}

/// A group larger than `PRESENCE_ANNOUNCE_MAX_MEMBERS` announces no
/// per-member `{pres on}` (a mass reconnect would otherwise send N² frames),
/// while messages still reach everyone.
#[tokio::test]
async fn big_groups_do_not_announce_member_presence() {
    let stack = Stack::realtime(2).await;
    const TOPIC: &str = "grpBigPresence";
    const A: i64 = 71;
    const B: i64 = 72;
    let members: Vec<i64> = std::iter::once(A)
        .chain(1000..1000 + imstream::realtime::presence::PRESENCE_ANNOUNCE_MAX_MEMBERS)
        .collect();
    stack.create_group(TOPIC, B, &members).await;

    let mut b = Client::open_sub(stack.gateway_addr(1), &stack.token(B, "d"), TOPIC, "b@gw1").await;
    let a = Client::open_sub(stack.gateway_addr(0), &stack.token(A, "d"), TOPIC, "a@gw0").await;
    // A marker message from A's side: everything sent before it has arrived.
    let seq = b.send_text(TOPIC, "marker").await;
    a.expect_data(TOPIC, seq).await;
    let mut a2 = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(A, "tablet"),
        TOPIC,
        "a2@gw0",
    )
    .await;
    let seq2 = a2.send_text(TOPIC, "from A").await;
    b.expect_data(TOPIC, seq2).await;
    assert_eq!(
        b.count(|f| f["pres"]["topic"] == json!(TOPIC) && f["pres"]["what"] == json!("on")),
        0,
        "no presence announcements in a big group: {:?}",
        b.frames()
    );
}
