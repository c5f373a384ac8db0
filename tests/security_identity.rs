//! Identity and secrets, tried against the real services:
//!
//! - a gateway process refuses to start with a published default or a
//!   short secret, and starts with strong ones;
//! - tokens for uid 0 or a negative uid are refused over HTTP and
//!   WebSocket, even when correctly signed; the cached member set holds no
//!   uid as its placeholder;
//! - an admin token that differs from the real one is refused.

mod common;
mod realtime_support;

use std::time::Duration;

use serde_json::json;

use common::process::Proc;
use common::{write_config_file, Stack};
use realtime_support::Client;

/// Runs `imstream gateway` with `config`; its exit status and stderr if it
/// ended within `wait`, else `None` (it is killed).
async fn run_gateway(
    config: &imstream::config::Config,
    name: &str,
    wait: Duration,
) -> Option<(bool, String)> {
    let file = write_config_file(config, name);
    let mut gateway = Proc::spawn(name, &file, &["gateway", "--listen", "127.0.0.1:0"]);
    match tokio::time::timeout(wait, gateway.wait()).await {
        Ok(status) => Some((status.success(), gateway.log_text())),
        Err(_) => {
            gateway.kill().await;
            None
        }
    }
}

#[tokio::test]
async fn a_gateway_refuses_published_or_short_secrets() {
    let stack = Stack::prepared(None).await;
    let defaults = imstream::config::AuthConfig::default();
    for (label, jwt, admin) in [
        (
            "built-in defaults",
            defaults.jwt_secret.clone(),
            defaults.admin_token.clone(),
        ),
        (
            "local config's",
            "local-dev-secret-change-me".to_string(),
            "x".repeat(40),
        ),
        (
            "short admin token",
            "s".repeat(40),
            "short-admin-token".to_string(),
        ),
    ] {
        let mut config = stack.config().clone();
        config.node.id = format!("weak-{}", stack.world.id);
        config.auth.jwt_secret = jwt;
        config.auth.admin_token = admin;
        let ended = run_gateway(
            &config,
            &format!("weak-{}", stack.world.id),
            Duration::from_secs(20),
        )
        .await;
        let (ok, stderr) = ended.unwrap_or_else(|| panic!("{label}: the gateway kept running"));
        assert!(!ok, "{label}: exited successfully");
        assert!(stderr.contains("weak secrets"), "{label}: {stderr}");
    }
    // The world's own secrets are strong: it starts (and keeps running).
    let mut config = stack.config().clone();
    config.node.id = format!("strong-{}", stack.world.id);
    let ended = run_gateway(
        &config,
        &format!("strong-{}", stack.world.id),
        Duration::from_secs(5),
    )
    .await;
    assert!(
        ended.is_none(),
        "a gateway with strong secrets ended: {ended:?}"
    );
}

#[tokio::test]
async fn tokens_of_no_user_are_refused_and_the_member_placeholder_is_no_uid() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let addr = stack.start_gateway("node-a").await;
    let topic = "grpIdentity";
    stack.create_group(topic, 1, &[2]).await;
    let http = reqwest::Client::new();

    // Make the group's facts cached (a send loads them).
    let (status, body) =
        common::send_http(&http, addr, &stack.token(1, "web"), topic, "m1", "hello").await;
    assert_eq!(status, 202, "{body}");
    let mut redis = stack.redis().await;
    let members: Vec<String> = redis::cmd("SMEMBERS")
        .arg(imstream::keys::TopicKeys::new(stack.tenant(), topic).members())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(members.contains(&"1".to_string()), "{members:?}");
    assert!(
        members
            .iter()
            .all(|m| m.parse::<i64>().map_or(true, |u| u > 0)),
        "a non-positive uid is a member: {members:?}"
    );

    for uid in [0, -1] {
        let token = stack.token(uid, "web");
        let status = http
            .get(format!("http://{addr}/v1/groups/{topic}/messages"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(status, 401, "uid {uid} read the group");
        let (status, body) = common::send_http(&http, addr, &token, topic, "x", "intruder").await;
        assert_eq!(status, 401, "uid {uid} sent: {body}");
        let mut ws = Client::connect(addr, &format!("uid{uid}")).await;
        let ctrl = ws.login(&token).await;
        assert_eq!(ctrl["code"], json!(401), "uid {uid} logged in: {ctrl}");
    }
}

#[tokio::test]
async fn an_admin_token_that_differs_is_refused() {
    let mut stack = Stack::prepared(None).await;
    stack.start_gateway("node-a").await;
    let addr = stack.admin_addr(0);
    let real = stack.config().auth.admin_token.clone();
    let mut near = real.clone().into_bytes();
    let last = near.len() - 1;
    near[last] ^= 1;
    let near = String::from_utf8(near).unwrap();
    for (token, expected) in [(near.as_str(), 401), ("", 401), (real.as_str(), 202)] {
        let status = http_admin(addr, token, stack.tenant()).await;
        assert_eq!(status, expected, "admin token {token:?}");
    }
}

/// `POST /v1/admin/notifications` on operator port `addr`; the status.
async fn http_admin(addr: std::net::SocketAddr, token: &str, tenant: &str) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{addr}/v1/admin/notifications"))
        .bearer_auth(token)
        .json(&json!({"tenant": tenant, "uid": 5, "title": "t", "text": "x"}))
        .send()
        .await
        .expect("gateway reachable")
        .status()
        .as_u16()
}

#[tokio::test]
async fn internal_failures_are_not_echoed_and_bad_traceparents_are_not_copied() {
    let mut stack = Stack::prepared(None).await;
    // A tenant whose database does not exist: every query of it fails.
    let broken = format!("b{}", stack.world.id);
    let missing = format!("imt_missing_{}", stack.world.id);
    stack.add_tenant(&broken, missing, Vec::new());
    stack.start_pipeline("members").await;
    let addr = stack.start_gateway("node-a").await;
    let token = imstream::auth::Tokens::new(stack.config())
        .issue(&broken, 7, "web", 0, 0)
        .token;
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/groups"))
        .bearer_auth(&token)
        .json(&json!({"topic": "grpBroken", "name": "x", "members": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    let body: serde_json::Value = resp.json().await.unwrap();
    let text = body.to_string();
    assert!(
        !text.contains("imt_missing") && !text.to_lowercase().contains("database"),
        "{text}"
    );
    assert!(body["params"]["request_id"].is_string(), "{text}");

    // A traceparent that is not W3C is dropped; a valid one is kept.
    let topic = "grpTrace";
    stack.create_group(topic, 1, &[]).await;
    let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (cmid, header) in [
        ("bad", "x-injected\r"),
        ("bad2", "not-a-trace"),
        ("good", good),
    ] {
        let status = reqwest::Client::new()
            .post(format!("http://{addr}/v1/groups/{topic}/messages"))
            .bearer_auth(stack.token(1, "web"))
            .header("traceparent", header.trim_end())
            .json(&json!({"content": "hi", "client_msg_id": cmid}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 202);
    }
    let events = common::read_events::<imstream::events::GroupEvent>(
        stack.config(),
        imstream::kafka::topics::TopicKind::GroupEvents,
        |events| events.iter().filter(|e| e.topic == topic).count() >= 4,
    )
    .await;
    let traces: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.body {
            imstream::events::GroupEventBody::MessageSent(m) => Some((
                m.client_msg_id.clone().unwrap_or_default(),
                e.traceparent.clone(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        traces,
        vec![
            ("bad".to_string(), String::new()),
            ("bad2".to_string(), String::new()),
            ("good".to_string(), good.to_string())
        ]
    );
}

/// The embedded registry with a write token: changes need it; looking up a
/// schema's id (a register call of a schema already there) does not.
#[tokio::test]
async fn registry_changes_need_the_write_token() {
    use imstream::registry::client::{self, RegistryClient};
    let mut world = common::World::config_only();
    world.config.registry.write_token = format!("w-{}", uuid::Uuid::new_v4().simple());
    let running = imstream::registry::start(
        &world.config,
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        world.shutdown.clone(),
    )
    .await
    .expect("registry");
    let base = format!("http://{}", running.addr);
    let names = imstream::kafka::topics::TopicNames::new(&world.config.kafka);
    let token = world.config.registry.write_token.clone();

    // Without the token nothing new is registered.
    let refused = client::register_all(&base, &names).await;
    assert!(refused.is_err(), "registered without the token");
    let first = client::register_all_with(RegistryClient::new(&base).with_token(&token), &names)
        .await
        .expect("register with the token");
    // The same schemas again: a lookup, fine without the token, same ids.
    let again = client::register_all(&base, &names).await.expect("lookup");
    assert_eq!(
        first.iter().map(|r| r.id).collect::<Vec<_>>(),
        again.iter().map(|r| r.id).collect::<Vec<_>>()
    );

    let http = reqwest::Client::new();
    let subject = &first[0].subject;
    for (method, path, body) in [
        (
            reqwest::Method::DELETE,
            format!("/subjects/{subject}?permanent=true"),
            None,
        ),
        (
            reqwest::Method::DELETE,
            format!("/subjects/{subject}/versions/1"),
            None,
        ),
        (
            reqwest::Method::PUT,
            "/config".to_string(),
            Some(json!({"compatibility": "NONE"})),
        ),
        (
            reqwest::Method::PUT,
            format!("/config/{subject}"),
            Some(json!({"compatibility": "NONE"})),
        ),
        (reqwest::Method::DELETE, format!("/config/{subject}"), None),
    ] {
        for bearer in [None, Some("wrong-token")] {
            let mut req = http.request(method.clone(), format!("{base}{path}"));
            if let Some(b) = &body {
                req = req
                    .header("content-type", "application/vnd.schemaregistry.v1+json")
                    .body(b.to_string());
            }
            if let Some(t) = bearer {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(
                resp.status().as_u16(),
                401,
                "{method} {path} with {bearer:?}"
            );
        }
    }
    // Nothing changed: the subject still answers, at its level.
    let versions: serde_json::Value = http
        .get(format!("{base}/subjects/{subject}/versions"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(versions, json!([1]));
    let resp = http
        .put(format!("{base}/config/{subject}"))
        .bearer_auth(&token)
        .header("content-type", "application/vnd.schemaregistry.v1+json")
        .body(json!({"compatibility": "FULL"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200, "with the token");
}

/// Logging in with a token never extends it: the token the login answers
/// with expires when the presented one does. And the control topic must
/// outlive every token.
#[tokio::test]
async fn a_token_login_keeps_its_expiry_and_revocations_outlive_tokens() {
    let mut stack = Stack::prepared(None).await;
    let addr = stack.start_gateway("node-a").await;
    let mut short = stack.config().clone();
    short.auth.token_ttl_secs = 3600;
    let issued = imstream::auth::Tokens::new(&short).issue(stack.tenant(), 4, "web", 0, 0);
    let mut ws = Client::connect(addr, "short").await;
    let ctrl = ws.login(&issued.token).await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
    let expires = chrono::DateTime::parse_from_rfc3339(ctrl["params"]["expires"].as_str().unwrap())
        .unwrap()
        .timestamp();
    assert_eq!(expires, issued.expires.timestamp(), "{ctrl}");
    let again = imstream::auth::Tokens::new(stack.config())
        .verify(ctrl["params"]["token"].as_str().unwrap())
        .unwrap();
    assert_eq!(again.exp, issued.expires.timestamp());

    let text = "[auth]\ntoken_ttl_secs = 1209600\n[kafka.topics.session_control]\npartitions = 1\nretention_ms = 604800000\n";
    let err = imstream::config::Config::from_toml_with_env(text, "<test>", Vec::new())
        .err()
        .expect("a control topic shorter than a token's life is refused");
    assert!(err.to_string().contains("session_control"), "{err}");
}

/// A token signed with `secret` under `kid` with these claims.
fn signed(kid: &str, secret: &str, claims: serde_json::Value) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some(kid.to_string());
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

/// What a login and an authenticated HTTP call answer for `token`:
/// (WebSocket ctrl code, HTTP status).
async fn answers(addr: std::net::SocketAddr, token: &str) -> (i64, u16) {
    let mut ws = Client::connect(addr, "keys").await;
    let ctrl = ws.login(token).await;
    let status = reqwest::Client::new()
        .get(format!("http://{addr}/v1/groups/grpNobody/messages"))
        .bearer_auth(token)
        .send()
        .await
        .expect("gateway reachable")
        .status()
        .as_u16();
    (ctrl["code"].as_i64().unwrap_or(0), status)
}

fn key(kid: &str, secret: &str) -> imstream::config::SigningKey {
    imstream::config::SigningKey {
        kid: kid.into(),
        secret: secret.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_tenant_signs_its_own_tokens_and_rolls_its_keys_over() {
    let mut stack = Stack::prepared(None).await;
    let a = stack.tenant().to_string();
    let b = format!("{a}b");
    let old_a = format!("a-old-{}", uuid::Uuid::new_v4().simple());
    let new_a = format!("a-new-{}", uuid::Uuid::new_v4().simple());
    let key_b = format!("b-key-{}", uuid::Uuid::new_v4().simple());
    stack.world.config.tenants[0].signing_keys = vec![key("k1", &old_a)];
    let database = format!("imt_{}_b", stack.world.id);
    stack.add_tenant(&b, database, vec![key("kb", &key_b)]);
    let global = stack.config().auth.jwt_secret.clone();
    let issuer = stack.config().auth.issuer.clone();
    let addr = stack.start_gateway("keys-1").await;

    let now = chrono::Utc::now().timestamp();
    let claims = |ten: &str, aud: &str, exp: i64| {
        json!({"ten": ten, "uid": 7, "dev": "web", "av": 0, "gen": 0, "jti": "j",
               "iss": issuer, "aud": aud, "iat": now, "exp": exp})
    };
    let valid = signed("k1", &old_a, claims(&a, &a, now + 3600));
    let (ws, http) = answers(addr, &valid).await;
    assert_eq!(ws, 200, "a token of tenant A's key");
    assert_ne!(http, 401, "a token of tenant A's key over HTTP");
    // The test helper mints with the tenant's key too.
    assert_eq!(answers(addr, &stack.token(8, "web")).await.0, 200);

    let mut forged = valid.clone();
    forged.pop();
    forged.push(if valid.ends_with('A') { 'B' } else { 'A' });
    for (label, token) in [
        ("forged signature", forged),
        ("expired", signed("k1", &old_a, claims(&a, &a, now - 3600))),
        (
            "unknown kid",
            signed("k9", &old_a, claims(&a, &a, now + 3600)),
        ),
        ("no kid", {
            let c = claims(&a, &a, now + 3600);
            jsonwebtoken::encode(
                &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
                &c,
                &jsonwebtoken::EncodingKey::from_secret(old_a.as_bytes()),
            )
            .unwrap()
        }),
        // Signed with A's key, claiming to be B's.
        (
            "other tenant",
            signed("k1", &old_a, claims(&b, &b, now + 3600)),
        ),
        (
            "other tenant, B's kid",
            signed("kb", &old_a, claims(&b, &b, now + 3600)),
        ),
        (
            "audience of B",
            signed("k1", &old_a, claims(&a, &b, now + 3600)),
        ),
        (
            "global secret",
            signed("global", &global, claims(&a, &a, now + 3600)),
        ),
        ("other issuer", {
            let mut c = claims(&a, &a, now + 3600);
            c["iss"] = json!("elsewhere");
            signed("k1", &old_a, c)
        }),
    ] {
        assert_eq!(answers(addr, &token).await, (401, 401), "{label}");
    }

    // Roll-over: a new key first, the old one still listed.
    stack.world.config.tenants[0].signing_keys = vec![key("k2", &new_a), key("k1", &old_a)];
    let rolling = stack.start_gateway("keys-2").await;
    let mut ws = Client::connect(rolling, "rolling").await;
    let ctrl = ws.login(&valid).await;
    assert_eq!(
        ctrl["code"],
        json!(200),
        "the old key still verifies: {ctrl}"
    );
    let reissued = ctrl["params"]["token"].as_str().unwrap().to_string();
    let header = jsonwebtoken::decode_header(&reissued).unwrap();
    assert_eq!(
        header.kid.as_deref(),
        Some("k2"),
        "re-issued with the new key"
    );
    // The old key removed: its tokens are refused, the new key's are not.
    stack.world.config.tenants[0].signing_keys = vec![key("k2", &new_a)];
    let rolled = stack.start_gateway("keys-3").await;
    assert_eq!(answers(rolled, &valid).await, (401, 401), "removed key");
    let (ws, http) = answers(rolled, &reissued).await;
    assert_eq!(ws, 200);
    assert_ne!(http, 401);

    // A tenant's weak key keeps a gateway from starting.
    let mut weak = stack.config().clone();
    weak.node.id = format!("weakkey-{}", stack.world.id);
    weak.tenants[0].signing_keys = vec![key("k3", "sixteen-bytes-ok")];
    let ended = run_gateway(
        &weak,
        &format!("weakkey-{}", stack.world.id),
        Duration::from_secs(20),
    )
    .await;
    let (ok, stderr) = ended.expect("the gateway kept running with a weak tenant key");
    assert!(!ok && stderr.contains("weak secrets"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_calls_are_audited_with_the_tokens_operator_and_scoped_to_its_tenant() {
    let mut stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    let other = format!("{tenant}o");
    let alice = format!("alice-{}", uuid::Uuid::new_v4().simple());
    let bob = format!("bob-{}", uuid::Uuid::new_v4().simple());
    let database = format!("imt_{}_o", stack.world.id);
    stack.add_tenant(&other, database, Vec::new());
    stack.world.config.auth.admin_tokens = vec![
        imstream::config::AdminToken {
            name: "ops-alice".into(),
            token: alice.clone(),
            tenant: Some(tenant.clone()),
        },
        imstream::config::AdminToken {
            name: "ops-bob".into(),
            token: bob.clone(),
            tenant: Some(other.clone()),
        },
    ];
    stack.start_pipeline("commands").await;
    stack.start_gateway("node-a").await;
    let addr = stack.admin_addr(0);
    let command = |token: &str, id: &str, operator: &str| {
        let body = json!({"command_id": id, "tenant": tenant, "operator": operator,
                          "kind": "user.enable", "uid": 5});
        let token = token.to_string();
        async move {
            reqwest::Client::new()
                .post(format!("http://{addr}/v1/admin/commands"))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .expect("gateway reachable")
                .status()
                .as_u16()
        }
    };
    // Alice claims to be someone else; Bob's token is for another tenant.
    assert_eq!(command(&alice, "cmd-alice", "mallory").await, 202);
    assert_eq!(command(&bob, "cmd-bob", "ops-alice").await, 403);
    let unnamed = stack.config().auth.admin_token.clone();
    assert_eq!(command(&unnamed, "cmd-unnamed", "someone").await, 202);
    for (path, token, expected) in [("5/disable", &bob, 403), ("5/signout", &alice, 202)] {
        let status = realtime_support::admin(addr, token, path, &tenant).await;
        assert_eq!(status, expected, "{path}");
    }
    assert_eq!(
        http_admin(addr, &bob, &tenant).await,
        403,
        "bob's notification"
    );

    let pool = stack.pool();
    let rows = common::wait_for("the audit rows", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT CAST(command_id AS CHAR), CAST(operator AS CHAR) FROM im_admin_commands ORDER BY command_id",
            )
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if rows.len() >= 2 {
                Ok(rows)
            } else {
                Err(format!("{rows:?}"))
            }
        }
    })
    .await;
    assert_eq!(
        rows,
        vec![
            ("cmd-alice".to_string(), "ops-alice".to_string()),
            ("cmd-unnamed".to_string(), "admin".to_string()),
        ]
    );
}
