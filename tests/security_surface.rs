//! Issue 28, what an attacker reaches beyond identities, tried against the
//! real services:
//!
//! - a refused send (a made-up group, a real group the sender is not in, a
//!   one-to-one topic of two other users) leaves no Redis state behind but
//!   the sender's own rate-limit bucket, which expires;
//! - `fnd` (user search) is rate limited, matches name prefixes only, never
//!   shows a note, and never finds someone who blocked the searcher; a
//!   one-to-one peer's note and presence are shown only to someone who
//!   shares a conversation with them and is not blocked by them;
//! - the web app's pages carry a strict Content-Security-Policy and the
//!   other browser hardening headers;
//! - internal failures answer a generic text with a request id (header and
//!   body), never the internal detail.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use imstream::config::BucketConfig;

use common::{tenant_keys, wait_for, Stack, Ws};

const OWNER: i64 = 8101;
const MEMBER: i64 = 8102;
const STRANGER: i64 = 8103;

/// Store and members pipelines and one gateway; `tweak` adjusts the
/// configuration first.
async fn stack_with(tweak: impl FnOnce(&mut imstream::config::Config)) -> Stack {
    let mut stack = Stack::prepared_with(None, tweak).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    stack.start_gateway("surface").await;
    stack
}

async fn post(addr: std::net::SocketAddr, token: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn get(addr: std::net::SocketAddr, token: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_sends_leave_no_state_but_an_expiring_rate_bucket() {
    // Enough tokens that every attempt below reaches the send path.
    let stack = stack_with(|c| c.limits.sends = BucketConfig::new(200, 6000)).await;
    let addr = stack.gateway_addr(0);
    let tenant = stack.tenant().to_string();
    let real = ["grpSurfaceA", "grpSurfaceB"];
    for topic in real {
        stack.create_group(topic, OWNER, &[MEMBER]).await;
        // A member's read caches the group's facts, as any use would.
        let (status, body) = get(
            addr,
            &stack.token(MEMBER, "w"),
            &format!("/v1/groups/{topic}/messages"),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let stranger = stack.token(STRANGER, "w");
    // The stranger's own session state (cached at any authenticated
    // request) exists before the attempts.
    let (status, body) = get(addr, &stranger, "/v1/me/unread").await;
    assert_eq!(status, 200, "{body}");
    let mut redis = stack.redis().await;
    let before = tenant_keys(&mut redis, &tenant, real[0]).await;

    let mut targets: Vec<String> = (0..20).map(|i| format!("grpMadeUp{i}x")).collect();
    for i in 0..10 {
        targets.push(real[i % 2].to_string());
    }
    // One-to-one topics of two other users, named directly.
    for i in 0..10 {
        targets.push(imstream::tinode::p2p_topic(9000 + i, 9100 + i));
    }
    assert_eq!(targets.len(), 40);
    for (i, topic) in targets.iter().enumerate() {
        let (status, body) = post(
            addr,
            &stranger,
            &format!("/v1/groups/{topic}/messages"),
            json!({"content": {"txt": "let me in"}, "client_msg_id": format!("x{i}")}),
        )
        .await;
        assert!(
            status == 403 || status == 404,
            "send {i} to {topic}: {status} {body}"
        );
        // Reads of the same names are refused and leave nothing either.
        let (status, body) = get(addr, &stranger, &format!("/v1/groups/{topic}/messages")).await;
        assert!(
            status == 403 || status == 404,
            "read {i} of {topic}: {status} {body}"
        );
    }

    let after = tenant_keys(&mut redis, &tenant, real[0]).await;
    let new: Vec<&String> = after.difference(&before).collect();
    for key in &new {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key.as_str())
            .query_async(&mut redis)
            .await
            .unwrap();
        // An expiring rate bucket, or the name's "no such group" marker
        // every gateway answers from (issue 38: a lookup of a made-up name
        // asks MySQL once per 30 s, counted against the asker).
        let expiring_marker = key.ends_with(":absent") && ttl > 0 && ttl <= 30_000;
        assert!(
            (key.contains(":rl:") && ttl > 0) || expiring_marker,
            "a refused request left {key} (ttl {ttl} ms); new keys: {new:?}"
        );
    }
    for topic in real {
        let seq = imstream::keys::TopicKeys::new(&tenant, topic).seq();
        let exists: bool = redis::cmd("EXISTS")
            .arg(&seq)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(!exists, "{seq} exists without any accepted send");
    }
}

const SEARCHER: i64 = 8201;
const FRIEND: i64 = 8202;
const OUTSIDER: i64 = 8203;
const BLOCKER: i64 = 8204;

async fn put(addr: std::net::SocketAddr, token: &str, path: &str, body: Value) -> u16 {
    reqwest::Client::new()
        .put(format!("http://{addr}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("gateway reachable")
        .status()
        .as_u16()
}

async fn count(pool: &sqlx::MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// `{get topic="fnd" what="sub"}` for `query`: the users found, or the ctrl.
async fn find(ws: &mut Ws, query: &str) -> Result<Vec<Value>, Value> {
    let (_, ctrl) = ws
        .request(json!({"set": {"topic": "fnd", "desc": {"public": query}}}))
        .await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let (_, reply) = ws
        .request(json!({"get": {"topic": "fnd", "what": "sub"}}))
        .await;
    match reply["meta"]["sub"].as_array() {
        Some(subs) => Ok(subs.clone()),
        None => Err(reply),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_directory_and_peer_views_show_no_private_data_to_outsiders_or_the_blocked() {
    let mut stack = Stack::prepared_with(None, |c| {
        c.limits.finds = BucketConfig::new(8, 1);
    })
    .await;
    for p in ["store", "members", "relations", "conversations"] {
        stack.start_pipeline(p).await;
    }
    let addr = stack.start_gateway("surface").await;
    let pool = stack.pool();
    let token = |uid: i64| stack.token(uid, "w");
    for (uid, name) in [
        (FRIEND, "Zyx Friend"),
        (OUTSIDER, "Zyx Outsider"),
        (BLOCKER, "Zyx Blocker"),
    ] {
        let status = put(
            addr,
            &token(uid),
            "/v1/me/profile",
            json!({"fn": name, "note": format!("private note of {uid}")}),
        )
        .await;
        assert_eq!(status, 202);
    }
    // The searcher talks with FRIEND (both write) and BLOCKER; BLOCKER then
    // blocks them; OUTSIDER shares nothing with the searcher. A group of
    // the searcher and BLOCKER shows members.
    for (from, to) in [(SEARCHER, FRIEND), (FRIEND, SEARCHER), (BLOCKER, SEARCHER)] {
        let (status, body) = post(
            addr,
            &token(from),
            &format!("/v1/users/usr{to}/messages"),
            json!({"content": {"txt": "hello"}}),
        )
        .await;
        assert_eq!(status, 202, "{body}");
    }
    stack
        .create_group("grpSurfacePriv", SEARCHER, &[BLOCKER])
        .await;
    let (status, body) = post(
        addr,
        &token(BLOCKER),
        "/v1/blocks",
        json!({ "uid": SEARCHER }),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    wait_for(
        "profiles, the block and the conversations projected",
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            async move {
                let seen = (
                    count(&pool, "SELECT COUNT(*) FROM im_user_profiles").await,
                    count(&pool, "SELECT COUNT(*) FROM im_blocks").await,
                    count(
                        &pool,
                        "SELECT COUNT(*) FROM im_conversations WHERE uid = 8201",
                    )
                    .await,
                );
                if seen == (3, 1, 3) {
                    Ok(())
                } else {
                    Err(format!("(profiles, blocks, conversations) = {seen:?}"))
                }
            }
        },
    )
    .await;
    // Everyone but the searcher is online.
    let mut others = Vec::new();
    for uid in [FRIEND, OUTSIDER, BLOCKER] {
        others.push(Ws::connect(addr, &token(uid)).await);
    }
    let mut ws = Ws::connect(addr, &token(SEARCHER)).await;
    let (_, ctrl) = ws.request(json!({"sub": {"topic": "fnd"}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");

    // The directory: a name prefix in any case finds FRIEND and OUTSIDER,
    // never BLOCKER, and never a note.
    let found = find(&mut ws, "zyx").await.expect("users found");
    let users: Vec<&str> = found.iter().filter_map(|e| e["user"].as_str()).collect();
    assert_eq!(users, ["usr8202", "usr8203"], "{found:?}");
    for entry in &found {
        assert!(entry["public"]["fn"].is_string(), "{entry}");
        assert!(entry["public"].get("note").is_none(), "a note in {entry}");
        assert!(entry.get("online").is_none() && entry.get("seen").is_none());
    }
    // The blocker is not found by id either; a prefix only, not a part.
    let (ids, part) = (
        find(&mut ws, "usr8204").await,
        find(&mut ws, "Outsider").await,
    );
    assert_eq!(ids.unwrap_err()["ctrl"]["code"], json!(204));
    assert_eq!(part.unwrap_err()["ctrl"]["code"], json!(204));

    // Naming a one-to-one topic shows a note and presence only to someone
    // who shares a conversation with the peer and is not blocked by them.
    for (peer, private) in [(FRIEND, true), (OUTSIDER, false), (BLOCKER, false)] {
        let topic = format!("usr{peer}");
        let (_, desc) = ws
            .request(json!({"get": {"topic": topic, "what": "desc"}}))
            .await;
        let public = &desc["meta"]["desc"]["public"];
        assert!(public["fn"].is_string(), "{desc}");
        assert_eq!(public.get("note").is_some(), private, "{peer}: {desc}");
        let (_, subs) = ws
            .request(json!({"get": {"topic": topic, "what": "sub"}}))
            .await;
        let entry = subs["meta"]["sub"]
            .as_array()
            .and_then(|s| s.iter().find(|e| e["user"] == json!(topic)))
            .unwrap_or_else(|| panic!("{topic} in {subs}"))
            .clone();
        assert_eq!(entry["online"], json!(private), "{peer}: {entry}");
        assert_eq!(
            entry["public"].get("note").is_some(),
            private,
            "{peer}: {entry}"
        );
    }
    // The chat list: FRIEND with note and presence, BLOCKER with neither.
    let (_, list) = ws
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    let subs = list["meta"]["sub"].as_array().expect("a chat list").clone();
    let entry = |user: &str| {
        subs.iter()
            .find(|e| e["topic"] == json!(user))
            .unwrap_or_else(|| panic!("{user} in {list}"))
            .clone()
    };
    let (friend, blocker) = (entry("usr8202"), entry("usr8204"));
    assert_eq!(friend["online"], json!(true), "{friend}");
    assert!(friend["public"]["note"].is_string(), "{friend}");
    assert_eq!(blocker["online"], json!(false), "{blocker}");
    assert!(blocker["public"].get("note").is_none(), "{blocker}");
    // The group's member list: the blocker without note and presence.
    let (status, members) = get(
        addr,
        &token(SEARCHER),
        "/v1/groups/grpSurfacePriv/subscribers",
    )
    .await;
    assert_eq!(status, 200, "{members}");
    let blocker = members["subscribers"]
        .as_array()
        .and_then(|s| s.iter().find(|e| e["user"] == json!("usr8204")))
        .unwrap_or_else(|| panic!("{members}"))
        .clone();
    assert_eq!(blocker["online"], json!(false), "{blocker}");
    assert!(blocker["public"].get("note").is_none(), "{blocker}");

    // Searches are limited per user: the bucket held 8, 3 were used.
    for i in 0..5 {
        find(&mut ws, "zyx")
            .await
            .unwrap_or_else(|c| panic!("search {i}: {c}"));
    }
    let refused = find(&mut ws, "zyx").await.unwrap_err();
    assert_eq!(refused["ctrl"]["code"], json!(429), "{refused}");
    assert!(
        refused["ctrl"]["params"]["retry_after_ms"]
            .as_u64()
            .unwrap()
            > 0
    );
}

fn webapp_dir() -> std::path::PathBuf {
    let dir = common::repo_root().join("webapp");
    assert!(
        dir.join("node_modules/tinode-webapp/index.html").is_file(),
        "the web app is not installed: run `npm ci --prefix webapp` (docker/local/test does)"
    );
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_web_apps_answers_carry_the_browser_hardening_headers() {
    let mut stack = Stack::prepared(None).await;
    stack.world.config.gateway.webapp_dir = webapp_dir().display().to_string();
    let addr = stack.start_gateway("web").await;
    let client = reqwest::Client::new();
    let page = client
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let script = page
        .lines()
        .find_map(|l| {
            let start = l.find("src=\"/vendor/")? + 5;
            Some(l[start..start + l[start..].find('"')?].to_string())
        })
        .expect("a vendored script in the page");
    for path in [
        "/",
        "/index.html",
        &script,
        "/umd/index.prod.js",
        "/no-such-file",
    ] {
        let resp = client
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .unwrap();
        let h = resp.headers().clone();
        let header = |name: &str| {
            h.get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("{path}: no {name} in {h:?}"))
                .to_string()
        };
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "connect-src 'self'",
            "object-src 'none'",
            "frame-ancestors 'self'",
        ] {
            assert!(csp.contains(directive), "{path}: {directive} not in {csp}");
        }
        assert!(!csp.contains("unsafe-"), "{path}: {csp}");
        assert_eq!(header("x-frame-options"), "SAMEORIGIN", "{path}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn internal_failures_answer_a_generic_text_and_a_request_id() {
    let mut stack = Stack::prepared(None).await;
    // A tenant whose database does not exist: every query it makes fails.
    let database = format!("imt_missing_{}", common::unique_id());
    stack.add_tenant("broken", database.clone(), Vec::new());
    let addr = stack.start_gateway("surface").await;
    let broken = imstream::auth::Tokens::new(stack.config())
        .issue("broken", 8301, "w", 0, 0)
        .token;
    let client = reqwest::Client::new();
    let internal = |text: &str| {
        [
            "imt_",
            "Unknown database",
            "mysql",
            "sqlx",
            "redis:",
            &database,
        ]
        .iter()
        .any(|t| text.contains(t))
    };

    // HTTP: generic text, the id in the body and the header.
    for (method, path) in [
        ("GET", "/v1/me/conversations".to_string()),
        ("POST", "/v1/groups/grpAnything/messages".to_string()),
        ("GET", "/v1/groups/grpAnything/messages".to_string()),
    ] {
        let req = match method {
            "GET" => client.get(format!("http://{addr}{path}")),
            _ => client
                .post(format!("http://{addr}{path}"))
                .json(&json!({"content": {"txt": "x"}})),
        };
        let resp = req.bearer_auth(&broken).send().await.unwrap();
        let status = resp.status().as_u16();
        let header = resp
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp.text().await.unwrap();
        assert!(status >= 500, "{method} {path}: {status} {text}");
        assert!(
            !internal(&text),
            "{method} {path}: internal detail in {text}"
        );
        let body: Value = serde_json::from_str(&text).unwrap();
        let id = body["request_id"].as_str().expect("request_id in the body");
        assert_eq!(Some(id), header.as_deref(), "{text}");
        assert!(
            imstream::request_id::acceptable(id),
            "{method} {path}: {id}"
        );
    }

    // Every answer names its request; a sane client id is kept, another
    // is replaced.
    let ok_token = stack.token(OWNER, "w");
    let long = "a".repeat(65);
    for (sent, kept) in [
        ("trace-1.a_B", true),
        ("bad id!", false),
        (long.as_str(), false),
        ("", false),
    ] {
        let mut req = client
            .get(format!("http://{addr}/v1/me/conversations"))
            .bearer_auth(&ok_token);
        if !sent.is_empty() {
            req = req.header(
                "x-request-id",
                reqwest::header::HeaderValue::from_bytes(sent.as_bytes()).unwrap(),
            );
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
        assert_eq!(id == sent, kept, "sent {sent:?}, got {id:?}");
        assert!(imstream::request_id::acceptable(&id));
    }
    let resp = client
        .get(format!("http://{addr}/v1/groups/grpNone/messages"))
        .bearer_auth(&ok_token)
        .header("x-request-id", "client-42")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["request_id"], json!("client-42"), "{body}");

    // WebSocket: a ctrl of 500 or more carries params.request_id.
    let (mut stream, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v0/channels"))
        .await
        .unwrap();
    use futures::{SinkExt, StreamExt};
    for msg in [
        json!({"hi": {"id": "1", "ver": "0.25.3"}}),
        json!({"login": {"id": "2", "scheme": "token", "secret": broken}}),
    ] {
        stream
            .send(tokio_tungstenite::tungstenite::Message::Text(
                msg.to_string().into(),
            ))
            .await
            .unwrap();
    }
    let login = loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("a reply")
            .expect("open")
            .unwrap();
        let v: Value = serde_json::from_str(frame.to_text().unwrap()).unwrap();
        if v["ctrl"]["id"] == json!("2") {
            break v;
        }
    };
    let code = login["ctrl"]["code"].as_u64().unwrap();
    assert!(code >= 500, "{login}");
    assert!(!internal(&login.to_string()), "{login}");
    assert!(login["ctrl"]["params"]["request_id"].is_string(), "{login}");
}
