//! Issue 13, "Limits": what one user, one address or one message can make
//! the system do, tried against the real services. Each limit answers the
//! way a client can act on (`429` + `Retry-After`, `{ctrl 429
//! params.retry_after_ms}` with the request id) and leaves the connection
//! and the data alone; the next request after the wait succeeds. Sockets
//! that never log in or go silent are closed; amplifiers (pushes in big
//! groups, hot messages, delete logs, delete widths, `{get}` ranges, first
//! sends to new topics) are bounded; `/metrics` is off the public port.

mod common;
mod realtime_support;

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use imstream::config::BucketConfig;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::keys::TopicKeys;

use common::{call, send_http, wait_for, Stack};
use realtime_support::{accepted_seq, closing_reason, Client, REPLY};

const OWNER: i64 = 7101;
const ALICE: i64 = 7102;
const BOB: i64 = 7103;

/// Store and members pipelines; `tweak` adjusts the limits before the
/// gateway starts.
async fn stack_with(tweak: impl FnOnce(&mut imstream::config::LimitsConfig)) -> Stack {
    let mut stack = Stack::prepared(None).await;
    tweak(&mut stack.world.config.limits);
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    stack.start_gateway("lim").await;
    stack
}

/// A client text frame (masked with a zero key, which leaves the payload
/// as it is).
fn masked_text(text: &str) -> Vec<u8> {
    let payload = text.as_bytes();
    let mut frame = vec![0x81u8];
    if payload.len() < 126 {
        frame.push(0x80 | payload.len() as u8);
    } else {
        frame.push(0x80 | 126);
        frame.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(payload);
    frame
}

fn retry_after_ms(ctrl: &Value) -> u64 {
    ctrl["params"]["retry_after_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("no retry_after_ms in {ctrl}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_over_the_limit_get_429_and_the_next_after_the_wait_succeeds() {
    let stack = stack_with(|l| l.sends = BucketConfig::new(3, 60)).await;
    let gw = stack.gateway_addr(0);
    let topic = "grpLimitSends";
    stack.create_group(topic, OWNER, &[ALICE, BOB]).await;

    // WebSocket: three sends at once pass, the fourth is refused with its id.
    let mut alice = Client::open_sub(gw, &stack.token(ALICE, "phone"), topic, "alice").await;
    let mut seqs = Vec::new();
    for i in 0..3 {
        seqs.push(accepted_seq(
            &alice.publish(topic, &format!("a{i}"), None).await,
            "alice",
        ));
    }
    let over = alice.publish(topic, "too many", None).await;
    assert_eq!(over["code"], json!(429), "{over}");
    assert!(
        over["id"].as_str().is_some(),
        "the 429 names the request: {over}"
    );
    let wait = retry_after_ms(&over);
    assert!(wait > 0 && wait <= 1_000, "one token per second: {over}");
    // The session is unharmed: after the wait the next send is accepted.
    tokio::time::sleep(Duration::from_millis(wait + 50)).await;
    seqs.push(accepted_seq(
        &alice.publish(topic, "later", None).await,
        "alice",
    ));

    // HTTP: the same for another user, with Retry-After.
    let client = reqwest::Client::new();
    let bob = stack.token(BOB, "web");
    for i in 0..3 {
        let (status, body) = send_http(&client, gw, &bob, topic, &format!("b{i}"), "hi").await;
        assert_eq!(status, 202, "{body}");
        seqs.push(body["seq"].as_i64().unwrap());
    }
    let resp = client
        .post(format!("http://{gw}/v1/groups/{topic}/messages"))
        .bearer_auth(&bob)
        .json(&json!({"content": {"txt": "too many"}, "client_msg_id": "b-over"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let header: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=1).contains(&header),
        "Retry-After in whole seconds: {header}"
    );
    let body: Value = resp.json().await.unwrap();
    let wait = retry_after_ms(&body);
    tokio::time::sleep(Duration::from_millis(wait + 50)).await;
    let (status, body) = send_http(&client, gw, &bob, topic, "b-later", "hi").await;
    assert_eq!(status, 202, "{body}");
    seqs.push(body["seq"].as_i64().unwrap());

    // Refused sends took no seq: the history holds exactly the accepted ones.
    seqs.sort();
    assert_eq!(seqs, (1..=8).collect::<Vec<i64>>());
    realtime_support::wait_stored(&stack.pool(), topic, 8).await;
    let (data, _) = alice.get_since(topic, 1).await;
    let mut read: Vec<i64> = data
        .iter()
        .filter_map(|d| d["data"]["seq"].as_i64())
        .collect();
    read.sort();
    assert_eq!(read, seqs, "history after the limits");
    alice.assert_alive(topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn receipts_clears_searches_group_creates_and_friend_requests_are_limited() {
    let one = BucketConfig::new(1, 60);
    let stack = stack_with(|l| {
        l.receipts = one;
        l.clears = one;
        l.searches = one;
        l.group_creates = one;
        l.friend_requests = one;
    })
    .await;
    let gw = stack.gateway_addr(0);
    let topic = "grpLimitOthers";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    let mut alice = Client::open_sub(gw, &stack.token(ALICE, "phone"), topic, "alice").await;
    let seq = accepted_seq(&alice.publish(topic, "one", None).await, "alice");

    // Receipts: the second read note at once gets a 429 naming the topic.
    alice.note(topic, "read", Some(seq)).await;
    alice.note(topic, "recv", Some(seq)).await;
    let over = alice
        .expect("a 429 for the second receipt", REPLY, |f| {
            f["ctrl"]["code"] == json!(429) && f["ctrl"]["topic"] == json!(topic)
        })
        .await;
    assert!(retry_after_ms(&over["ctrl"]) > 0);
    // History clears over the WebSocket.
    let del = json!({"del": {"topic": topic, "what": "msg", "delseq": [{"low": seq}]}});
    assert_eq!(alice.request(del.clone()).await["code"], json!(200));
    let over = alice.request(del).await;
    assert_eq!(over["code"], json!(429), "{over}");
    alice.assert_alive(topic).await;

    // HTTP: searches, group creation, friend requests; each 429 has a
    // Retry-After and the call passes again after it.
    let client = reqwest::Client::new();
    let token = stack.token(OWNER, "web");
    let now = imstream::events::now_ms();
    let search = format!(
        "http://{gw}/v1/groups/{topic}/search?q=one&from={}&to={}",
        now - 86_400_000,
        now + 3_600_000
    );
    let get = || client.get(&search).bearer_auth(&token).send();
    assert_eq!(get().await.unwrap().status().as_u16(), 200);
    let over = get().await.unwrap();
    assert_eq!(over.status().as_u16(), 429);
    assert!(over.headers().contains_key("retry-after"));

    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "POST",
        "/v1/groups",
        json!({"name": "a"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "POST",
        "/v1/groups",
        json!({"name": "b"}),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    tokio::time::sleep(Duration::from_millis(retry_after_ms(&body) + 50)).await;
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "POST",
        "/v1/groups",
        json!({"name": "c"}),
    )
    .await;
    assert_eq!(status, 201, "after the wait: {body}");

    let request = |to: i64| json!({"uid": to});
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "POST",
        "/v1/friends/requests",
        request(ALICE),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = call(
        &stack,
        gw,
        OWNER,
        "POST",
        "/v1/friends/requests",
        request(BOB),
    )
    .await;
    assert_eq!(status, 429, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_logins_lock_the_login_name_out_with_backoff() {
    let name = format!("mallory{}", common::unique_id());
    let mut stack = Stack::prepared(None).await;
    stack.world.config.limits.login_failures = 2;
    stack.world.config.limits.login_lockout_ms = 1_000;
    stack.world.config.auth.dev_users = vec![imstream::config::DevUser {
        tenant: stack.tenant().to_string(),
        uid: ALICE,
        login: name.clone(),
        password: "right-password".into(),
        name: None,
        photo: None,
    }];
    stack.start_gateway("lim").await;
    let gw = stack.gateway_addr(0);
    use base64::Engine;
    let basic = |password: &str| {
        base64::engine::general_purpose::STANDARD.encode(format!("{name}:{password}"))
    };
    let mut c = Client::connect(gw, "guesser").await;
    let login = |secret: String| json!({"login": {"scheme": "basic", "secret": secret}});
    // Two passwords checked; the second attempt starts a one-second lockout.
    for _ in 0..2 {
        let r = c.request(login(basic("wrong"))).await;
        assert_eq!(r["code"], json!(401), "{r}");
    }
    // Locked out: even the right password is not tried now.
    let r = c.request(login(basic("right-password"))).await;
    assert_eq!(r["code"], json!(429), "{r}");
    let first = retry_after_ms(&r);
    assert!(first <= 1_000, "{r}");
    tokio::time::sleep(Duration::from_millis(first + 50)).await;
    // The next attempt is checked and doubles the lockout.
    assert_eq!(c.request(login(basic("wrong"))).await["code"], json!(401));
    let r = c.request(login(basic("right-password"))).await;
    assert_eq!(r["code"], json!(429), "{r}");
    let second = retry_after_ms(&r);
    assert!(second > 1_000 && second <= 2_000, "doubled: {r}");
    tokio::time::sleep(Duration::from_millis(second + 50)).await;
    let r = c.request(login(basic("right-password"))).await;
    assert_eq!(r["code"], json!(200), "after the lockout: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sockets_that_never_log_in_or_go_silent_are_closed() {
    let stack = stack_with(|l| {
        l.login_deadline_secs = 2;
        l.idle_timeout_secs = 3;
    })
    .await;
    let gw = stack.gateway_addr(0);
    // Says {hi} but never logs in.
    let lurker = Client::connect(gw, "lurker").await;
    let frames = lurker.expect_closed(Duration::from_secs(15)).await;
    assert_eq!(
        closing_reason(&frames).as_deref(),
        Some("login deadline passed"),
        "{frames:?}"
    );
    // Logged in, then silent: a hand-made WebSocket that answers no ping
    // (and writes nothing more, so everything the gateway sent is read).
    let mut raw = tokio::net::TcpStream::connect(gw).await.unwrap();
    raw.write_all(
        b"GET /v0/channels?apikey=test HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
          Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    for m in [
        json!({"hi": {"id": "1", "ver": "0.25.3"}}),
        json!({"login": {"id": "2", "scheme": "token", "secret": stack.token(ALICE, "x")}}),
    ] {
        raw.write_all(&masked_text(&m.to_string())).await.unwrap();
    }
    let mut bytes = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), raw.read_to_end(&mut bytes)).await;
    let seen = String::from_utf8_lossy(&bytes).into_owned();
    assert!(read.is_ok(), "the silent socket stayed open: {seen}");
    assert!(seen.contains("\"code\":200"), "logged in: {seen}");
    assert!(seen.contains("idle timeout"), "closed for idleness: {seen}");
    // A client that answers pings (as every WebSocket client does) stays.
    let mut live = Client::open(gw, &stack.token(BOB, "y"), "live").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!live.is_closed(), "{:?}", live.frames());
    live.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_per_address_are_capped() {
    let stack = stack_with(|l| {
        l.exempt_loopback = false;
        l.connections_per_ip = 3;
    })
    .await;
    let gw = stack.gateway_addr(0);
    let a = Client::open(gw, &stack.token(ALICE, "a"), "a").await;
    let _b = Client::connect(gw, "b").await;
    let c = Client::connect(gw, "c").await;
    let url = format!("ws://{gw}/v0/channels?apikey=test");
    let refused = tokio_tungstenite::connect_async(&url).await;
    assert!(refused.is_err(), "a fourth connection was accepted");
    // The others are unharmed, and a closed one frees its place.
    assert!(!a.is_closed());
    drop(c);
    wait_for("a place to free up", Duration::from_secs(10), || async {
        tokio_tungstenite::connect_async(&url)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_per_user_frames_headers_and_bodies_are_capped() {
    let stack = stack_with(|l| {
        l.sessions_per_user = 1;
        l.header_timeout_secs = 1;
        l.max_body_bytes = 64 * 1024;
    })
    .await;
    let gw = stack.gateway_addr(0);
    let topic = "grpLimitSessions";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    // One session per user here: a second login is refused and closed,
    // the first keeps working.
    let mut first = Client::open_sub(gw, &stack.token(ALICE, "a"), topic, "first").await;
    let mut second = Client::connect(gw, "second").await;
    let r = second.login(&stack.token(ALICE, "b")).await;
    assert_eq!(r["code"], json!(429), "{r}");
    assert_eq!(r["text"], json!("too many sessions"));
    second.expect_closed(REPLY).await;
    first.assert_alive(topic).await;

    // A frame beyond the size limit is refused before it is buffered: the
    // connection closes.
    let mut big = Client::connect(gw, "big").await;
    let huge = "x".repeat(stack.config().gateway.max_message_size + 128 * 1024);
    big.send(json!({"pub": {"topic": topic, "content": huge}}))
        .await;
    big.expect_closed(REPLY).await;

    // HTTP: a body beyond the limit is 413, and a client that never
    // finishes its headers is cut off.
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("http://{gw}/v1/groups"))
        .bearer_auth(stack.token(OWNER, "w"))
        .body(vec![b' '; 128 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 413);
    let mut slow = tokio::net::TcpStream::connect(gw).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "a connection with unfinished headers stayed open"
    );
    assert!(!String::from_utf8_lossy(&buf).contains(" 200 "), "{buf:?}");
    first.assert_alive(topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_ranges_and_history_clears_are_bounded() {
    let stack = stack_with(|l| {
        l.get_ranges = 5;
        l.get_range_seqs = 50;
        l.dellog_per_user = 2;
    })
    .await;
    let gw = stack.gateway_addr(0);
    let topic = "grpLimitWidth";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    let mut owner = Client::open_sub(gw, &stack.token(OWNER, "o"), topic, "owner").await;
    for i in 0..3 {
        accepted_seq(&owner.publish(topic, &format!("m{i}"), None).await, "owner");
    }
    let ranges = |n: i64, width: i64| -> Vec<Value> {
        (0..n)
            .map(|i| json!({"low": 1 + i * width, "hi": 1 + (i + 1) * width}))
            .collect()
    };
    let get =
        |r: Vec<Value>| json!({"get": {"topic": topic, "what": "data", "data": {"ranges": r}}});
    let r = owner.request(get(ranges(6, 1))).await;
    assert_eq!(r["code"], json!(400), "{r}");
    assert!(
        r["text"].as_str().unwrap().contains("at most 5 ranges"),
        "{r}"
    );
    let r = owner.request(get(ranges(2, 30))).await;
    assert_eq!(r["code"], json!(400), "{r}");
    assert!(r["text"].as_str().unwrap().contains("50 seqs"), "{r}");
    // Three single-seq ranges are within both limits: answered with the
    // three messages once the read models hold them (the acks came first).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = owner.request(get(ranges(3, 1))).await;
        if r["code"] == json!(208) {
            break;
        }
        assert_eq!(r["code"], json!(204), "accepted, not yet projected: {r}");
        assert!(
            std::time::Instant::now() < deadline,
            "never answered with data: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A user's delete log per topic is bounded.
    let clear =
        |low: i64| json!({"del": {"topic": topic, "what": "msg", "delseq": [{"low": low}]}});
    assert_eq!(owner.request(clear(2)).await["code"], json!(200));
    let pool = stack.pool();
    wait_for("the first clear stored", Duration::from_secs(30), || {
        let pool = pool.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM im_dellog WHERE topic = ? AND deletedfor = ?",
            )
            .bind(topic)
            .bind(OWNER)
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if n >= 1 {
                Ok(())
            } else {
                Err(format!("{n} rows"))
            }
        }
    })
    .await;
    let r = owner
        .request(
            json!({"del": {"topic": topic, "what": "msg", "delseq": [{"low": 3}, {"low": 1}]}}),
        )
        .await;
    assert_eq!(r["code"], json!(409), "{r}");
    assert!(r["text"].as_str().unwrap().contains("at most 2"), "{r}");
    owner.assert_alive(topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn moderation_deletes_wider_than_the_cap_are_refused() {
    let stack = stack_with(|l| l.delete_width = 2).await;
    let gw = stack.gateway_addr(0);
    let topic = "grpLimitModerate";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    let mut owner = Client::open_sub(gw, &stack.token(OWNER, "o"), topic, "owner").await;
    for i in 0..4 {
        accepted_seq(&owner.publish(topic, &format!("m{i}"), None).await, "owner");
    }
    let hard = |low: i64, hi: i64| json!({"del": {"topic": topic, "what": "msg", "hard": true, "delseq": [{"low": low, "hi": hi}]}});
    let r = owner.request(hard(1, 5)).await;
    assert_eq!(r["code"], json!(400), "{r}");
    assert!(
        r["text"].as_str().unwrap().contains("at most 2 messages"),
        "{r}"
    );
    assert_eq!(owner.request(hard(1, 3)).await["code"], json!(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn big_groups_push_only_mentions_and_hot_messages_are_capped_per_topic() {
    let mut stack = Stack::prepared(None).await;
    stack.world.config.limits.push_group_members = 1;
    stack.world.config.limits.hot_per_topic = 3;
    for p in ["store", "members", "hot", "push"] {
        stack.start_pipeline(p).await;
    }
    stack.start_gateway("lim").await;
    let gw = stack.gateway_addr(0);
    let topic = "grpLimitPush";
    // Alice and Bob are offline: in a group this small both would be pushed.
    stack.create_group(topic, OWNER, &[ALICE, BOB]).await;
    let client = reqwest::Client::new();
    let token = stack.token(OWNER, "w");
    for i in 1..=5 {
        let (status, body) = send_http(&client, gw, &token, topic, &format!("p{i}"), "hi").await;
        assert_eq!(status, 202, "{body}");
    }
    let mut redis = stack.redis().await;
    let keys = TopicKeys::new(stack.tenant(), topic);
    wait_for(
        "every message's push handled",
        Duration::from_secs(60),
        || {
            let (mut redis, claim) = (redis.clone(), keys.push_claim(5));
            async move {
                let state: Option<String> = redis::cmd("GET")
                    .arg(&claim)
                    .query_async(&mut redis)
                    .await
                    .map_err(|e| e.to_string())?;
                (state.as_deref() == Some("done"))
                    .then_some(())
                    .ok_or(format!("{state:?}"))
            }
        },
    )
    .await;
    let kafka = stack.config().kafka.clone();
    let tasks = TopicNames::new(&kafka).name(TopicKind::PushTasks);
    let produced: i64 = tokio::task::spawn_blocking(move || {
        imstream::kafka::lag::watermarks(&kafka, &format!("probe-{}", common::unique_id()), &tasks)
            .unwrap()
            .values()
            .map(|(low, high)| high - low)
            .sum()
    })
    .await
    .unwrap();
    assert_eq!(
        produced, 0,
        "a group over the cap pushes only mentioned members"
    );

    // Hot messages: at most 3 kept for the topic, the newest.
    wait_for("hot index capped", Duration::from_secs(60), || {
        let (mut redis, k) = (redis.clone(), keys.hot_seqs());
        async move {
            let seqs: Vec<i64> = redis::cmd("ZRANGEBYSCORE")
                .arg(&k)
                .arg("-inf")
                .arg("+inf")
                .arg("WITHSCORES")
                .query_async::<Vec<(String, i64)>>(&mut redis)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|(_, s)| s)
                .collect();
            (seqs == vec![3, 4, 5])
                .then_some(())
                .ok_or(format!("{seqs:?}"))
        }
    })
    .await;
    let old: bool = redis::cmd("EXISTS")
        .arg(keys.hot_msg(1))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(!old, "the snapshot of a message beyond the cap is gone");
    // Reads still see every message (from MySQL past the hot ones).
    realtime_support::wait_stored(&stack.pool(), topic, 5).await;
    let resp: Value = client
        .get(format!("http://{gw}/v1/groups/{topic}/messages?limit=10"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["messages"].as_array().map(Vec::len), Some(5), "{resp}");
}

/// A `MessageSent` of `seq` for `topic` in the log, produced directly.
async fn plant(stack: &Stack, topic: &str, seq: i64) {
    use imstream::events::*;
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer =
        imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
    let event = GroupEvent::new(
        stack.tenant(),
        topic,
        ALICE,
        GroupEventBody::MessageSent(MessageSent {
            message_id: 9_000 + seq,
            group_id: 0,
            seq,
            shard_month: chrono::Utc::now().format("%Y%m").to_string(),
            client_msg_id: None,
            from_user: ALICE,
            msg_type: "text".into(),
            head: None,
            content: Some("{\"txt\":\"planted\"}".into()),
            mentioned_user_ids: vec![],
            mention_all: false,
            reply_seq: None,
            root_seq: None,
            file_count: 0,
            content_size: 3,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: now_ms(),
            expires_at: None,
        }),
    );
    producer
        .send(
            TopicKind::GroupEvents,
            &format!("{}:{topic}", stack.tenant()),
            &event,
            None,
        )
        .await
        .expect("plant");
}

async fn garbage(stack: &Stack, topic: &str) {
    let codec = imstream::events::EventCodec::new(&stack.config().registry.url).unwrap();
    let producer =
        imstream::kafka::producer::EventProducer::new(&stack.config().kafka, codec).unwrap();
    let events = TopicNames::new(&stack.config().kafka).name(TopicKind::GroupEvents);
    let key = format!("{}:{topic}", stack.tenant());
    producer
        .send_bytes(&events, key.as_bytes(), b"not avro at all", &[])
        .await
        .expect("garbage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_topics_first_send_reads_no_log_and_undecodable_records_do_not_block_a_reseed() {
    // No store pipeline: everything sent stays in the uncommitted tail.
    let mut stack = Stack::prepared(None).await;
    stack.start_gateway("lim").await;
    let gw = stack.gateway_addr(0);
    let client = reqwest::Client::new();
    let alice = stack.token(ALICE, "w");
    let p2p = |peer: i64| imstream::tinode::p2p_topic(ALICE, peer);
    let send = |peer: i64, cmid: String| {
        let (client, alice) = (client.clone(), alice.clone());
        async move {
            let resp = client
                .post(format!("http://{gw}/v1/users/usr{peer}/messages"))
                .bearer_auth(&alice)
                .json(&json!({"content": {"txt": "hi"}, "client_msg_id": cmid}))
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };

    // A topic nobody has written to is new: its first send is seq 1 at
    // once, without reading the log (a record planted there for it, which
    // a scan would find, is not looked at; an undecodable one neither).
    let fresh = 7201;
    plant(&stack, &p2p(fresh), 41).await;
    garbage(&stack, &p2p(fresh)).await;
    let (status, body) = send(fresh, "f1".into()).await;
    assert_eq!((status, body["seq"].as_i64()), (202, Some(1)), "{body}");

    // A topic that has messages (its hot index says so) lost its allocator:
    // the re-seed reads its partition, skipping an undecodable record, and
    // continues above every seq in the log.
    let used = 7202;
    for i in 1..=3 {
        let (status, body) = send(used, format!("u{i}")).await;
        assert_eq!((status, body["seq"].as_i64()), (202, Some(i)), "{body}");
    }
    garbage(&stack, &p2p(used)).await;
    let mut redis = stack.redis().await;
    let keys = TopicKeys::new(stack.tenant(), &p2p(used));
    let _: () = redis::pipe()
        .del(keys.seq())
        .ignore()
        .zadd(keys.hot_seqs(), "3:0", 3)
        .ignore()
        .query_async(&mut redis)
        .await
        .unwrap();
    let seq = wait_for("a send after the re-seed", Duration::from_secs(90), || {
        let send = send.clone();
        async move {
            let (status, body) = send(used, "u-after".into()).await;
            match status {
                202 => Ok(body["seq"].as_i64().unwrap()),
                503 => Err(format!("{body}")),
                other => panic!("unexpected {other}: {body}"),
            }
        }
    })
    .await;
    assert!(
        seq > 3,
        "a re-seeded seq must not reuse an acked one: {seq}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_are_served_on_the_telemetry_port_only() {
    let stack = stack_with(|_| {}).await;
    let gw = stack.gateway_addr(0);
    let client = reqwest::Client::new();
    let metrics = client
        .get(format!("http://{gw}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        metrics.status().as_u16(),
        404,
        "the public port serves no metrics"
    );
    let health = client
        .get(format!("http://{gw}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
}

/// Admission control: beyond `limits.sends_in_flight` sends held at once a
/// send is refused at once (`503`, code `OVERLOADED`, `Retry-After`),
/// before any seq is allocated; retried with the same client_msg_id, each
/// goes through, and the history holds every message once with no hole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_beyond_the_in_flight_bound_are_refused_at_once_and_take_no_seq() {
    const SENDS: usize = 100;
    let stack = stack_with(|l| {
        l.sends_in_flight = 2;
        l.sends = BucketConfig::new(10_000, 1_000_000);
    })
    .await;
    let gw = stack.gateway_addr(0);
    let topic = "grpLimitInFlight";
    stack.create_group(topic, OWNER, &[ALICE]).await;
    let client = reqwest::Client::new();
    let token = stack.token(ALICE, "web");
    let send = |i: usize| {
        let (client, token) = (client.clone(), token.clone());
        async move {
            let resp = client
                .post(format!("http://{gw}/v1/groups/{topic}/messages"))
                .bearer_auth(&token)
                .json(
                    &json!({"content": {"txt": format!("m{i}")}, "client_msg_id": format!("m{i}")}),
                )
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let retry_after = resp.headers().get("retry-after").cloned();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (i, status, retry_after, body)
        }
    };
    // The topic's first send sets up its seq (a re-seed); then the burst.
    let (_, status, _, body) = send(SENDS).await;
    assert_eq!(status, 202, "{body}");
    let mut seqs = vec![body["seq"].as_i64().unwrap()];
    let first = futures::future::join_all((0..SENDS).map(send)).await;
    let mut refused = Vec::new();
    for (i, status, retry_after, body) in first {
        match status {
            202 => seqs.push(body["seq"].as_i64().unwrap()),
            503 => {
                assert_eq!(body["params"]["code"], json!("OVERLOADED"), "{body}");
                assert!(retry_after.is_some(), "Retry-After with {body}");
                assert!(retry_after_ms(&body) > 0);
                refused.push(i);
            }
            other => panic!("send {i}: {other} {body}"),
        }
    }
    assert!(
        !refused.is_empty(),
        "{SENDS} sends at once beyond 2 in flight: some refused"
    );
    // Refused sends took no seq: the accepted ones are 1..=n already.
    let mut accepted = seqs.clone();
    accepted.sort();
    assert_eq!(accepted, (1..=seqs.len() as i64).collect::<Vec<i64>>());
    // One at a time, each retry is admitted.
    for i in refused {
        let (_, status, _, body) = send(i).await;
        assert_eq!(status, 202, "retry of m{i}: {body}");
        seqs.push(body["seq"].as_i64().unwrap());
    }
    seqs.sort();
    assert_eq!(seqs, (1..=SENDS as i64 + 1).collect::<Vec<i64>>());
    realtime_support::wait_stored(&stack.pool(), topic, SENDS as i64 + 1).await;
}
