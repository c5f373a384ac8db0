//! Session control across gateways (seed 002 §5, §10): revoking a device
//! closes its sessions wherever they are and nothing else; signing out
//! everywhere (and disabling) closes every session and refuses the old
//! token; a gateway whose Pub/Sub subscription is cut still lets its clients
//! complete by seq and still closes a device revoked meanwhile at its next
//! heartbeat; a node id can be live in one gateway only.

mod common;
mod realtime_support;

use std::time::Duration;

use serde_json::json;

use common::{wait_for, Stack};
use realtime_support::{
    admin, closing_reason, node_of, numsub, token_for, wait_heartbeats, Client, DELIVERY,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_a_device_closes_it_on_every_gateway_and_nothing_else() {
    let stack = Stack::realtime(3).await;
    const TOPIC: &str = "grpRevoke";
    const A: i64 = 51;
    const B: i64 = 52;
    stack.create_group(TOPIC, A, &[B]).await;
    let tenant = stack.tenant().to_string();
    let admin_token = stack.config().auth.admin_token.clone();

    // device-1 has two connections (two windows) on two gateways.
    let old_token = stack.token(A, "device-1");
    let d1_a = Client::open_sub(stack.gateway_addr(2), &old_token, TOPIC, "d1@gw2").await;
    let d1_b = Client::open_sub(stack.gateway_addr(0), &old_token, TOPIC, "d1@gw0").await;
    let mut d2 = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(A, "device-2"),
        TOPIC,
        "d2@gw0",
    )
    .await;
    let mut d3 = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(A, "device-3"),
        TOPIC,
        "d3@gw1",
    )
    .await;
    let mut b = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(B, "phone"),
        TOPIC,
        "b@gw1",
    )
    .await;

    // The admin endpoint wants the admin token and a known tenant.
    assert_eq!(
        admin(
            stack.admin_addr(1),
            "wrong",
            &format!("{A}/devices/device-1/revoke"),
            &tenant
        )
        .await,
        401
    );
    assert_eq!(
        admin(
            stack.admin_addr(1),
            &admin_token,
            &format!("{A}/devices/device-1/revoke"),
            "nosuchtenant"
        )
        .await,
        404
    );
    assert!(!d1_a.is_closed() && !d1_b.is_closed());

    assert_eq!(
        admin(
            stack.admin_addr(1),
            &admin_token,
            &format!("{A}/devices/device-1/revoke"),
            &tenant
        )
        .await,
        202
    );
    for c in [&d1_a, &d1_b] {
        let frames = c.expect_closed(DELIVERY).await;
        assert_eq!(
            closing_reason(&frames).as_deref(),
            Some("device revoked"),
            "[{}] {frames:?}",
            c.label
        );
    }

    // The other devices survive the envelope and the next heartbeats, and
    // keep receiving.
    let mut redis = stack.redis().await;
    for node in [node_of(&stack, 0), node_of(&stack, 1)] {
        wait_heartbeats(&mut redis, &tenant, TOPIC, &node, 2).await;
    }
    d2.assert_alive(TOPIC).await;
    d3.assert_alive(TOPIC).await;
    let seq = b.send_text(TOPIC, "still there?").await;
    d2.expect_data(TOPIC, seq).await;
    d3.expect_data(TOPIC, seq).await;

    // The revoked device's token is refused from now on.
    let mut again = Client::connect(stack.gateway_addr(1), "d1-again").await;
    let ctrl = again.login(&old_token).await;
    assert_eq!(
        (ctrl["code"].clone(), ctrl["params"]["reason"].clone()),
        (json!(401), json!("device revoked")),
        "{ctrl}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signing_out_everywhere_closes_every_session_and_refuses_the_old_token() {
    let stack = Stack::realtime(3).await;
    const TOPIC: &str = "grpSignOut";
    const A: i64 = 61;
    const B: i64 = 62;
    stack.create_group(TOPIC, A, &[B]).await;
    let tenant = stack.tenant().to_string();
    let admin_token = stack.config().auth.admin_token.clone();

    let old_token = stack.token(A, "phone");
    let sessions = vec![
        Client::open_sub(stack.gateway_addr(0), &old_token, TOPIC, "a-phone@gw0").await,
        Client::open_sub(
            stack.gateway_addr(1),
            &stack.token(A, "web"),
            TOPIC,
            "a-web@gw1",
        )
        .await,
        Client::open_sub(
            stack.gateway_addr(2),
            &stack.token(A, "pad"),
            TOPIC,
            "a-pad@gw2",
        )
        .await,
        // Logged in but not attached to any topic.
        Client::open(stack.gateway_addr(2), &stack.token(A, "tv"), "a-tv@gw2").await,
    ];
    let mut b = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(B, "phone"),
        TOPIC,
        "b@gw1",
    )
    .await;

    assert_eq!(
        admin(
            stack.admin_addr(0),
            &admin_token,
            &format!("{A}/signout"),
            &tenant
        )
        .await,
        202
    );
    for c in &sessions {
        let frames = c.expect_closed(DELIVERY).await;
        assert_eq!(
            closing_reason(&frames).as_deref(),
            Some("signed out"),
            "[{}] {frames:?}",
            c.label
        );
    }
    // B is untouched.
    let mut redis = stack.redis().await;
    wait_heartbeats(&mut redis, &tenant, TOPIC, &node_of(&stack, 1), 2).await;
    b.assert_alive(TOPIC).await;
    // A's leaving was announced to the others.
    b.expect("A's presence off", DELIVERY, |f| {
        f["pres"]["topic"] == json!(TOPIC)
            && f["pres"]["src"] == json!(format!("usr{A}"))
            && f["pres"]["what"] == json!("off")
    })
    .await;

    // Old tokens are refused at login, on any gateway.
    for i in 0..3 {
        let mut c = Client::connect(stack.gateway_addr(i), "old-token").await;
        let ctrl = c.login(&old_token).await;
        assert_eq!(
            (ctrl["code"].clone(), ctrl["params"]["reason"].clone()),
            (json!(401), json!("signed out")),
            "gateway {i}: {ctrl}"
        );
    }
    // ...and over HTTP too.
    let resp = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/groups/{TOPIC}/messages",
            stack.gateway_addr(0)
        ))
        .bearer_auth(&old_token)
        .json(&json!({"content": "after sign-out"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        401,
        "old token must not send over HTTP"
    );
    // A token issued after the sign-out (current auth_version) works.
    let av: i64 = redis::cmd("HGET")
        .arg(imstream::keys::TenantKeys::new(&tenant).control(A))
        .arg("av")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(av >= 1, "auth_version bumped: {av}");
    let fresh = token_for(stack.config(), &tenant, A, "phone", av);
    let a = Client::open_sub(stack.gateway_addr(0), &fresh, TOPIC, "a-fresh@gw0").await;
    let seq = b.send_text(TOPIC, "welcome back").await;
    a.expect_data(TOPIC, seq).await;

    // Disabling closes the new session too and refuses every login until
    // the user is enabled again.
    assert_eq!(
        admin(
            stack.admin_addr(2),
            &admin_token,
            &format!("{A}/disable"),
            &tenant
        )
        .await,
        202
    );
    let frames = a.expect_closed(DELIVERY).await;
    assert_eq!(
        closing_reason(&frames).as_deref(),
        Some("user disabled"),
        "{frames:?}"
    );
    let av: i64 = redis::cmd("HGET")
        .arg(imstream::keys::TenantKeys::new(&tenant).control(A))
        .arg("av")
        .query_async(&mut redis)
        .await
        .unwrap();
    let newest = token_for(stack.config(), &tenant, A, "phone", av);
    let mut c = Client::connect(stack.gateway_addr(1), "while-disabled").await;
    let ctrl = c.login(&newest).await;
    assert_eq!(
        (ctrl["code"].clone(), ctrl["params"]["reason"].clone()),
        (json!(401), json!("user disabled")),
        "{ctrl}"
    );
    assert_eq!(
        admin(
            stack.admin_addr(2),
            &admin_token,
            &format!("{A}/enable"),
            &tenant
        )
        .await,
        202
    );
    wait_for("A enabled", DELIVERY, || {
        let addr = stack.gateway_addr(1);
        let newest = newest.clone();
        async move {
            let mut c = Client::connect(addr, "after-enable").await;
            let ctrl = c.login(&newest).await;
            if ctrl["code"] == json!(200) {
                Ok(())
            } else {
                Err(ctrl.to_string())
            }
        }
    })
    .await;
    let mut c = Client::connect(stack.gateway_addr(1), "old-after-enable").await;
    assert_eq!(
        c.login(&old_token).await["code"],
        json!(401),
        "tokens from before stay refused"
    );
    b.assert_alive(TOPIC).await;
}

/// Pub/Sub loss only delays: a gateway whose subscription is cut misses
/// realtime copies, its clients complete by seq, it resubscribes, and a
/// device revoked meanwhile (control key only, no envelope at all) is
/// closed by its heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_subscription_delays_but_loses_nothing_and_control_still_applies() {
    let mut stack = Stack::realtime(2).await;
    // The third gateway connects to Redis as its own ACL user, so its
    // subscriber connection can be told apart in CLIENT LIST (every
    // gateway of every test shares this Redis).
    let user = format!("rtcut_{}", stack.world.id);
    let mut redis = stack.redis().await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(">rtcut-pass")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut redis)
        .await
        .expect("ACL SETUSER");
    let shared_url = stack.world.config.redis.url.clone();
    stack.world.config.redis.url =
        shared_url.replacen("redis://", &format!("redis://{user}:rtcut-pass@"), 1);
    stack.start_gateway("gw2").await;
    stack.world.config.redis.url = shared_url;
    let cut_node = node_of(&stack, 2);
    let channel = format!("im:rt:node:{cut_node}");

    const TOPIC: &str = "grpPubSubCut";
    const A: i64 = 71;
    const B: i64 = 72;
    let tenant = stack.tenant().to_string();
    stack.create_group(TOPIC, A, &[B]).await;
    let mut a = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(A, "phone"),
        TOPIC,
        "a@gw0",
    )
    .await;
    let mut b_cut = Client::open_sub(
        stack.gateway_addr(2),
        &stack.token(B, "cut"),
        TOPIC,
        "b@gw2",
    )
    .await;
    let b_other = Client::open_sub(
        stack.gateway_addr(1),
        &stack.token(B, "other"),
        TOPIC,
        "b@gw1",
    )
    .await;

    let s1 = a.send_text(TOPIC, "before the cut").await;
    b_cut.expect_data(TOPIC, s1).await;

    let killed = kill_subscriber(&mut redis, &user).await;
    assert_eq!(killed, 1, "one subscriber connection of {user}");
    // Gateway 2 hears nothing now: whatever is published to it until it
    // resubscribes is lost for its sessions.
    assert_eq!(numsub(&mut redis, &channel).await, 0, "gateway 2 cut off");
    let s2 = a.send_text(TOPIC, "during the cut").await;
    let s3 = a.send_text(TOPIC, "during the cut, again").await;
    b_other.expect_data(TOPIC, s3).await;
    // Whatever b_cut got in real time, it completes by seq from the last
    // seq it is sure of.
    let started = std::time::Instant::now();
    loop {
        let mut all = b_cut.data_seqs(TOPIC);
        let (data, ctrl) = b_cut.get_since(TOPIC, s1 + 1).await;
        all.extend(data.iter().filter_map(|d| d["data"]["seq"].as_i64()));
        all.sort_unstable();
        all.dedup();
        if all == vec![s1, s2, s3] {
            break;
        }
        assert!(
            started.elapsed() < DELIVERY,
            "b@gw2 did not complete by seq: {all:?} / {ctrl}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The gateway resubscribes by itself and real time resumes.
    wait_for("gateway 2 resubscribed", DELIVERY, || {
        let mut redis = redis.clone();
        let channel = channel.clone();
        async move {
            match numsub(&mut redis, &channel).await {
                1 => Ok(()),
                n => Err(format!("{n} subscribers")),
            }
        }
    })
    .await;
    let s4 = a.send_text(TOPIC, "after the cut").await;
    b_cut.expect_data(TOPIC, s4).await;

    // Cut again and revoke b_cut's device by writing the control key only,
    // as if the control envelope had been lost: the heartbeat closes it.
    assert_eq!(kill_subscriber(&mut redis, &user).await, 1);
    let key = imstream::keys::TenantKeys::new(&tenant).control(B);
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg("d:cut")
        .arg(imstream::events::now_ms())
        .query_async(&mut redis)
        .await
        .unwrap();
    let frames = b_cut.expect_closed(Duration::from_secs(10)).await;
    assert_eq!(
        closing_reason(&frames).as_deref(),
        Some("device revoked"),
        "{frames:?}"
    );
    // B's other device is not concerned.
    let mut b_other = b_other;
    wait_heartbeats(&mut redis, &tenant, TOPIC, &node_of(&stack, 1), 2).await;
    b_other.assert_alive(TOPIC).await;

    let _: redis::RedisResult<i64> = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut redis)
        .await;
}

/// Kills the Pub/Sub connections of Redis user `user` (found with CLIENT
/// LIST, killed by id); returns how many.
async fn kill_subscriber(redis: &mut imstream::redis_util::Redis, user: &str) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(redis)
        .await
        .expect("CLIENT LIST");
    let ids: Vec<String> = list
        .lines()
        .filter(|l| l.split(' ').any(|f| f == format!("user={user}")))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .map(String::from)
        })
        .collect();
    for id in &ids {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(redis)
            .await
            .expect("CLIENT KILL ID");
    }
    ids.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_id_is_live_in_one_gateway_only() {
    let stack = Stack::prepared(None).await;
    let mut config = stack.config().clone();
    config.node.id = format!("dup-{}", stack.world.id);
    let first_stop = stack.world.shutdown.child();
    let first = imstream::gateway::start(
        &config,
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        first_stop.clone(),
    )
    .await
    .expect("first gateway");

    let second = imstream::gateway::start(
        &config,
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        stack.world.shutdown.child(),
    )
    .await;
    let err = second
        .err()
        .expect("a second gateway with a live node id must not start");
    assert!(err.to_string().contains(&config.node.id), "{err:#}");

    // Another id is fine.
    let mut other = config.clone();
    other.node.id = format!("other-{}", stack.world.id);
    imstream::gateway::start(
        &other,
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        stack.world.shutdown.child(),
    )
    .await
    .expect("a gateway with its own id");

    // If the first one's lease lapses (say Redis lost it) and another
    // process takes the id meanwhile, the first does not take it over when
    // it renews (every 5 s) — it only takes it back once it is free again.
    let mut redis = stack.redis().await;
    let lease = format!("im:{{global}}:node:{}", config.node.id);
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("another-process")
        .arg("PX")
        .arg(6000)
        .query_async(&mut redis)
        .await
        .unwrap();
    let taken = std::time::Instant::now();
    loop {
        let holder: Option<String> = redis::cmd("GET")
            .arg(&lease)
            .query_async(&mut redis)
            .await
            .unwrap();
        match holder.as_deref() {
            Some("another-process") => {}
            None => {}
            Some(_) if taken.elapsed() >= Duration::from_millis(6000) => break,
            Some(other) => panic!(
                "the lease was taken over after {:?}: {other}",
                taken.elapsed()
            ),
        }
        assert!(
            taken.elapsed() < Duration::from_secs(30),
            "the free lease was not taken back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Once the first one stopped, its id is free again.
    first_stop.trigger();
    let _ = first.task.await;
    wait_for("the first gateway's lease released", DELIVERY, || {
        let mut redis = redis.clone();
        let lease = lease.clone();
        async move {
            let held: bool = redis::cmd("EXISTS")
                .arg(&lease)
                .query_async(&mut redis)
                .await
                .map_err(|e| e.to_string())?;
            if held {
                Err("still held".into())
            } else {
                Ok(())
            }
        }
    })
    .await;
    imstream::gateway::start(
        &config,
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        stack.world.shutdown.child(),
    )
    .await
    .expect("the id is free after the first gateway stopped");
}

/// A revoked device is closed even when its client stopped reading: its
/// connection is stuck (the TCP window is full and its outbound queue too),
/// so the final ctrl cannot be delivered, and the gateway must drop it
/// anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_device_is_closed_even_when_its_client_stopped_reading() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let stack = Stack::realtime(2).await;
    const TOPIC: &str = "grpStuckClient";
    const A: i64 = 75;
    const B: i64 = 76;
    stack.create_group(TOPIC, A, &[B]).await;
    let tenant = stack.tenant().to_string();
    let admin_token = stack.config().auth.admin_token.clone();

    // B's device "stuck": a tiny receive buffer, and after sub it never
    // reads again.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(2048).unwrap();
    let tcp = socket.connect(stack.gateway_addr(1)).await.unwrap();
    let url = format!("ws://{}/v0/channels", stack.gateway_addr(1));
    let (ws, _) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
    let (mut sink, mut stream) = ws.split();
    let token = stack.token(B, "stuck");
    let mut sid = String::new();
    for (i, msg) in [
        json!({"hi": {"id": "1", "ver": "0.25"}}),
        json!({"login": {"id": "2", "scheme": "token", "secret": token}}),
        json!({"sub": {"id": "3", "topic": TOPIC}}),
    ]
    .into_iter()
    .enumerate()
    {
        sink.send(Message::Text(msg.to_string().into()))
            .await
            .unwrap();
        loop {
            let Some(Ok(Message::Text(t))) = stream.next().await else {
                panic!("stuck client: no reply")
            };
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            if v["ctrl"]["id"] == json!((i + 1).to_string()) {
                assert!(v["ctrl"]["code"].as_i64().unwrap() < 300, "{v}");
                if i == 0 {
                    sid = v["ctrl"]["params"]["sid"].as_str().unwrap().to_string();
                }
                break;
            }
        }
    }
    let sessions_key = imstream::keys::TenantKeys::new(&tenant).presence_sessions(B);
    let redis = stack.redis().await;
    let online = |mut redis: imstream::redis_util::Redis, key: String, sid: String| async move {
        redis::cmd("SISMEMBER")
            .arg(key)
            .arg(sid)
            .query_async::<bool>(&mut redis)
            .await
            .unwrap()
    };
    assert!(online(redis.clone(), sessions_key.clone(), sid.clone()).await);

    // A floods the topic: big messages fill the TCP window, small ones then
    // fill the session's outbound queue.
    let mut a = Client::open_sub(
        stack.gateway_addr(0),
        &stack.token(A, "phone"),
        TOPIC,
        "a@gw0",
    )
    .await;
    let big = "x".repeat(200 * 1024);
    let mut last = 0;
    for _ in 0..40 {
        last = a.send_text(TOPIC, &big).await;
    }
    for i in 0..300 {
        last = a.send_text(TOPIC, &format!("small {i}")).await;
    }
    // Everything was fanned out (the store is behind the same log).
    realtime_support::wait_stored(&stack.pool(), TOPIC, last).await;

    assert_eq!(
        admin(
            stack.admin_addr(0),
            &admin_token,
            &format!("{B}/devices/stuck/revoke"),
            &tenant
        )
        .await,
        202
    );
    wait_for(
        "the stuck, revoked session dropped by the gateway",
        DELIVERY,
        || {
            let (redis, key, sid) = (redis.clone(), sessions_key.clone(), sid.clone());
            async move {
                if online(redis, key, sid).await {
                    Err("still online".to_string())
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
    // And its connection is gone: reading now drains what was buffered,
    // then ends.
    let drained = tokio::time::timeout(DELIVERY, async {
        let mut frames = 0usize;
        while let Some(Ok(m)) = stream.next().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
            frames += 1;
        }
        frames
    })
    .await
    .expect("the gateway closed the stuck connection");
    assert!(
        drained < last as usize,
        "not everything fits in a stuck connection: {drained} of {last}"
    );
    drop((sink, stream));
}

/// Once session control refused a session on uplink, nothing more it sends
/// is served, even what was already on the wire behind the refused message
/// (the re-check is throttled to one per few seconds, so a refusal must
/// stick).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_refused_on_uplink_gets_nothing_more_served() {
    let stack = Stack::realtime(2).await;
    const TOPIC: &str = "grpUplinkRefusal";
    const A: i64 = 77;
    const B: i64 = 78;
    const C: i64 = 79;
    stack.create_group(TOPIC, B, &[A, C]).await;
    let tenant = stack.tenant().to_string();
    let b = Client::open_sub(stack.gateway_addr(1), &stack.token(B, "d"), TOPIC, "b@gw1").await;

    // A is logged in, not attached yet; then its device is revoked (control
    // key only, as if the envelope were lost).
    let mut a = Client::open(stack.gateway_addr(0), &stack.token(A, "d"), "a@gw0").await;
    let mut redis = stack.redis().await;
    let _: () = redis::cmd("HSET")
        .arg(imstream::keys::TenantKeys::new(&tenant).control(A))
        .arg("d:d")
        .arg(imstream::events::now_ms())
        .query_async(&mut redis)
        .await
        .unwrap();
    // Two subs back to back: the first is refused by the uplink re-check,
    // the second must not be served either.
    // (One write: sent one by one, the second could meet the close. The
    // heartbeat may find the revocation first and close the session before
    // either is sent: then nothing is served either.)
    a.send_together_unless_closed(&[
        json!({"sub": {"id": "s1", "topic": TOPIC}}),
        json!({"sub": {"id": "s2", "topic": TOPIC}}),
    ])
    .await;
    let frames = a.expect_closed(DELIVERY).await;
    assert_eq!(
        closing_reason(&frames).as_deref(),
        Some("device revoked"),
        "{frames:?}"
    );

    // C attaches on the same gateway: B sees C come online, after anything
    // A's session could have announced.
    let _c = Client::open_sub(stack.gateway_addr(0), &stack.token(C, "d"), TOPIC, "c@gw0").await;
    let pres_on = |uid: i64| {
        move |f: &serde_json::Value| {
            f["pres"]["what"] == json!("on") && f["pres"]["src"] == json!(format!("usr{uid}"))
        }
    };
    b.expect("C online", DELIVERY, pres_on(C)).await;
    assert_eq!(
        b.count(pres_on(A)),
        0,
        "the revoked session attached: {:?}",
        b.frames()
    );
    let attached: bool = redis::cmd("SISMEMBER")
        .arg(imstream::keys::TopicKeys::new(&tenant, TOPIC).online_members())
        .arg(A)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(!attached, "A is not among the topic's online members");
}
