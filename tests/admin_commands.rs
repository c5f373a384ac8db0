//! Admin commands over Kafka end to end (seed 002 §7.2), users changing
//! their own password, and `imstream users`:
//!
//! - `user.password.reset` through `POST /v1/admin/commands` →
//!   `im.admin.commands.v1` → the command pipeline → a result on
//!   `im.admin.results.v1`: the stored password is the new one (Argon2id;
//!   the old one no longer logs in) and every token of the user is refused;
//!   a reset without a password leaves no password that logs in;
//! - `user.device.revoke`: that device's tokens are refused, another
//!   device's still work;
//! - `file.audit.update`: a blocked file stays in the conversation's file
//!   list without its file; an audit of a message that is no file is
//!   rejected with a result saying so;
//! - `abuse.report.resolve`: the report is closed by the operator named by
//!   the admin token; resolving it again changes nothing;
//! - `PUT /v1/me/password`: a wrong old password is refused and counted like
//!   a failed login (locked out after `limits.login_failures`), the right
//!   one changes the password, signs every session out and answers with a
//!   new token;
//! - `imstream users list | reset | remove`.

mod common;
mod realtime_support;

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

use common::{process, read_events, send_http, wait_for, Stack};
use imstream::events::AdminResult;
use imstream::kafka::topics::TopicKind;
use realtime_support::Client;

const UID: i64 = 7;
const OLD: &str = "the old passphrase";
const NEW: &str = "a brand new passphrase";

/// Carol's login in `stack` (its own per test: failed logins lock a login
/// name out on the shared Redis, whatever the tenant).
fn login_of(stack: &Stack) -> String {
    format!("carol-{}@example.com", stack.world.id)
}

/// A stack with the command, control, store, members and references
/// pipelines and one gateway, whose tenant takes password logins; Carol
/// (uid 7) has a login.
async fn stack_with(tweak: impl FnOnce(&mut imstream::config::Config)) -> (Stack, SocketAddr) {
    let mut stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    stack.world.config.auth.basic.tenants = vec![tenant.clone()];
    tweak(&mut stack.world.config);
    imstream::users::add(&stack.pool(), &tenant, UID, &login_of(&stack), OLD)
        .await
        .unwrap();
    for p in ["commands", "control", "store", "members", "references"] {
        stack.start_pipeline(p).await;
    }
    let addr = stack.start_gateway("node-a").await;
    (stack, addr)
}

/// Puts one admin command on the commands topic through the gateway's
/// operator port.
async fn command(stack: &Stack, addr: SocketAddr, id: &str, mut body: Value) {
    body["command_id"] = json!(id);
    body["tenant"] = json!(stack.tenant());
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

/// The result of command `id` from the results topic.
async fn result_of(stack: &Stack, id: &str) -> AdminResult {
    read_events::<AdminResult>(stack.config(), TopicKind::AdminResults, |rs| {
        rs.iter().any(|r| r.command_id == id)
    })
    .await
    .into_iter()
    .find(|r| r.command_id == id)
    .unwrap()
}

fn basic(login: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{login}:{password}"))
}

/// `{login scheme="basic"}`'s answer as Carol of `stack`.
async fn basic_login(stack: &Stack, addr: SocketAddr, password: &str) -> Value {
    let mut c = Client::connect(addr, "basic").await;
    c.request(json!({"login": {"scheme": "basic", "secret": basic(&login_of(stack), password)}}))
        .await
}

/// `GET /v1/me/unread` with `token`: its status.
async fn token_status(addr: SocketAddr, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("http://{addr}/v1/me/unread"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Waits until `token` gets `status` from the gateway.
async fn wait_token(addr: SocketAddr, token: &str, status: u16, what: &str) {
    wait_for(what, Duration::from_secs(30), || async move {
        match token_status(addr, token).await {
            s if s == status => Ok(()),
            s => Err(format!("status {s}")),
        }
    })
    .await;
}

async fn stored_hash(stack: &Stack) -> String {
    imstream::users::login_of(&stack.pool(), UID)
        .await
        .unwrap()
        .expect("carol's login")
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_password_reset_command_changes_the_password_and_signs_the_user_out() {
    let (stack, addr) = stack_with(|_| {}).await;
    let login = basic_login(&stack, addr, OLD).await;
    assert_eq!(login["code"], json!(200), "{login}");
    let token = login["params"]["token"].as_str().unwrap().to_string();
    assert_eq!(token_status(addr, &token).await, 200);
    let other_device = stack.token(UID, "tablet");
    assert_eq!(token_status(addr, &other_device).await, 200);

    command(
        &stack,
        addr,
        "reset-carol",
        json!({"kind": "user.password.reset", "uid": UID, "password": NEW}),
    )
    .await;
    let result = result_of(&stack, "reset-carol").await;
    assert_eq!(result.status, "ok", "{result:?}");
    assert_eq!(result.event_ids.len(), 1, "{result:?}");

    // The stored password is the new one, as an Argon2id hash.
    let hash = stored_hash(&stack).await;
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(imstream::users::verify_password(NEW, &hash));
    assert!(!imstream::users::verify_password(OLD, &hash));
    // Every token of the user is refused, whatever its device.
    wait_token(addr, &token, 401, "the login's token refused").await;
    assert_eq!(token_status(addr, &other_device).await, 401);
    assert_eq!(basic_login(&stack, addr, OLD).await["code"], json!(401));
    let login = basic_login(&stack, addr, NEW).await;
    assert_eq!(login["code"], json!(200), "{login}");
    let fresh = login["params"]["token"].as_str().unwrap().to_string();
    assert_eq!(token_status(addr, &fresh).await, 200);

    // A reset without a new password: no password logs in any more.
    command(
        &stack,
        addr,
        "lock-carol",
        json!({"kind": "user.password.reset", "uid": UID}),
    )
    .await;
    assert_eq!(result_of(&stack, "lock-carol").await.status, "ok");
    assert_eq!(stored_hash(&stack).await, imstream::users::LOCKED_HASH);
    wait_token(addr, &fresh, 401, "the new login's token refused").await;
    assert_eq!(basic_login(&stack, addr, NEW).await["code"], json!(401));

    // A user without a password login: rejected, nothing produced.
    command(
        &stack,
        addr,
        "reset-nobody",
        json!({"kind": "user.password.reset", "uid": 999, "password": NEW}),
    )
    .await;
    let result = result_of(&stack, "reset-nobody").await;
    assert_eq!(result.status, "rejected", "{result:?}");
    assert!(result.message.contains("no password login"), "{result:?}");
    assert!(result.event_ids.is_empty());
    // A short password is refused at the door.
    let resp = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/admin/commands",
            stack.admin_addr_of(addr)
        ))
        .bearer_auth(&stack.config().auth.admin_token)
        .json(&json!({"command_id": "short", "tenant": stack.tenant(),
            "kind": "user.password.reset", "uid": UID, "password": "short"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_device_revoke_command_refuses_that_devices_tokens_only() {
    let (stack, addr) = stack_with(|_| {}).await;
    let phone = stack.token(UID, "phone");
    let web = stack.token(UID, "web");
    assert_eq!(token_status(addr, &phone).await, 200);
    command(
        &stack,
        addr,
        "revoke-phone",
        json!({"kind": "user.device.revoke", "uid": UID, "device": "phone"}),
    )
    .await;
    let result = result_of(&stack, "revoke-phone").await;
    assert_eq!(result.status, "ok", "{result:?}");
    assert_eq!(result.event_ids.len(), 1);
    wait_token(addr, &phone, 401, "the phone's token refused").await;
    assert_eq!(token_status(addr, &web).await, 200);
    // A token issued to the phone after the revocation works again.
    let control = imstream::session_control::load(&stack.pool(), UID)
        .await
        .unwrap();
    let renewed = imstream::auth::Tokens::new(stack.config())
        .issue(
            stack.tenant(),
            UID,
            "phone",
            control.auth_version,
            control.generation("phone"),
        )
        .token;
    assert_eq!(token_status(addr, &renewed).await, 200);
}

/// A Drafty message with one attached file.
fn file_message(name: &str) -> Value {
    json!({"txt": " ", "fmt": [{"at": -1, "len": 0, "key": 0}],
        "ent": [{"tp": "EX", "data": {"mime": "application/pdf", "name": name, "size": 5,
            "ref": format!("https://files.example.com/{name}")}}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn file_audit_and_report_commands_change_the_references() {
    let (stack, addr) = stack_with(|_| {}).await;
    const TOPIC: &str = "grpAudit";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    let client = reqwest::Client::new();
    let sender = stack.token(2, "web");
    let resp = client
        .post(format!("http://{addr}/v1/groups/{TOPIC}/messages"))
        .bearer_auth(&sender)
        .json(&json!({"content": file_message("plan.pdf"), "client_msg_id": "f1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let seq = resp.json::<Value>().await.unwrap()["seq"].as_i64().unwrap();
    let (status, _) = send_http(&client, addr, &sender, TOPIC, "t1", "plain text").await;
    assert_eq!(status, 202);

    let reader = stack.token(3, "web");
    let files = |reader: String| {
        let client = client.clone();
        async move {
            let resp = client
                .get(format!("http://{addr}/v1/groups/{TOPIC}/files"))
                .bearer_auth(&reader)
                .send()
                .await
                .unwrap();
            resp.json::<Value>().await.unwrap()["files"].clone()
        }
    };
    let listed = wait_for("the file listed", Duration::from_secs(30), || {
        let f = files(reader.clone());
        async move {
            let f = f.await;
            if f.as_array().is_some_and(|a| a.len() == 1) {
                Ok(f)
            } else {
                Err(f.to_string())
            }
        }
    })
    .await;
    assert_eq!(listed[0]["audit"], json!("ok"), "{listed}");
    assert_eq!(listed[0]["file"]["data"]["name"], json!("plan.pdf"));

    command(
        &stack,
        addr,
        "block-plan",
        json!({"kind": "file.audit.update", "topic": TOPIC, "seq": seq, "status": "blocked"}),
    )
    .await;
    let result = result_of(&stack, "block-plan").await;
    assert_eq!(result.status, "ok", "{result:?}");
    let blocked = wait_for("the file blocked", Duration::from_secs(30), || {
        let f = files(reader.clone());
        async move {
            let f = f.await;
            if f[0]["audit"] == json!("blocked") {
                Ok(f)
            } else {
                Err(f.to_string())
            }
        }
    })
    .await;
    assert_eq!(blocked[0]["seq"], json!(seq));
    assert_eq!(blocked[0]["file"], Value::Null, "{blocked}");
    let audited: (String, String) =
        sqlx::query_as("SELECT audit, audited_by FROM im_group_files WHERE topic = ? AND seq = ?")
            .bind(TOPIC)
            .bind(seq)
            .fetch_one(&stack.pool())
            .await
            .unwrap();
    assert_eq!(audited, ("blocked".to_string(), "admin".to_string()));
    // A message that carries no file cannot be audited as one.
    command(
        &stack,
        addr,
        "block-text",
        json!({"kind": "file.audit.update", "topic": TOPIC, "seq": seq + 1, "status": "blocked"}),
    )
    .await;
    let result = result_of(&stack, "block-text").await;
    assert_eq!(result.status, "rejected", "{result:?}");
    assert!(result.message.contains("no file message"), "{result:?}");

    // Member 3 reports member 2's message; an operator resolves it by command.
    let resp = client
        .post(format!(
            "http://{addr}/v1/groups/{TOPIC}/messages/{}/report",
            seq + 1
        ))
        .bearer_auth(&reader)
        .json(&json!({"reason": "spam"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let report_id = resp.json::<Value>().await.unwrap()["report_id"]
        .as_str()
        .unwrap()
        .to_string();
    let pool = stack.pool();
    wait_for("the report recorded", Duration::from_secs(30), || {
        let (pool, id) = (pool.clone(), report_id.clone());
        async move {
            match imstream::references::reports::get(&pool, &id).await {
                Ok(Some(r)) => Ok(r),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    command(
        &stack,
        addr,
        "resolve-spam",
        json!({"kind": "abuse.report.resolve", "report_id": report_id,
            "resolution": "actioned", "note": "removed the sender"}),
    )
    .await;
    let result = result_of(&stack, "resolve-spam").await;
    assert_eq!(result.status, "ok", "{result:?}");
    assert_eq!(result.event_ids.len(), 1);
    let closed = wait_for("the report closed", Duration::from_secs(30), || {
        let (pool, id) = (pool.clone(), report_id.clone());
        async move {
            match imstream::references::reports::get(&pool, &id).await {
                Ok(Some(r)) if r.status == "actioned" => Ok(r),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!(closed.resolved_by.as_deref(), Some("admin"));
    assert_eq!(closed.note, "removed the sender");
    // Resolving a closed report changes nothing.
    command(
        &stack,
        addr,
        "resolve-again",
        json!({"kind": "abuse.report.resolve", "report_id": report_id, "resolution": "dismissed"}),
    )
    .await;
    let result = result_of(&stack, "resolve-again").await;
    assert_eq!(result.status, "ok", "{result:?}");
    assert!(result.message.contains("already actioned"), "{result:?}");
    assert!(result.event_ids.is_empty());
}

/// `PUT /v1/me/password` as the holder of `token`.
async fn change(addr: SocketAddr, token: &str, old: &str, new: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .put(format!("http://{addr}/v1/me/password"))
        .bearer_auth(token)
        .json(&json!({"old_password": old, "new_password": new}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_changes_their_own_password_with_the_old_one() {
    let (stack, addr) = stack_with(|c| {
        c.limits.login_failures = 3;
        c.limits.login_lockout_ms = 1_000;
        // Out of the way: this test counts failed logins, not the bucket.
        c.limits.password_changes = imstream::config::BucketConfig::new(1_000, 60_000);
    })
    .await;
    let login = basic_login(&stack, addr, OLD).await;
    let token = login["params"]["token"].as_str().unwrap().to_string();
    let other = stack.token(UID, "tablet");

    // Wrong old passwords count like failed logins of the login's name.
    for i in 0..3 {
        let (status, body) = change(addr, &token, "not the password", NEW).await;
        assert_eq!(status, 403, "attempt {i}: {body}");
        assert_eq!(body["params"]["code"], json!("WRONG_PASSWORD"), "{body}");
    }
    let (status, body) = change(addr, &token, OLD, NEW).await;
    assert_eq!(status, 429, "locked out after 3 failures: {body}");
    assert!(
        body["params"]["retry_after_ms"].as_u64().is_some(),
        "{body}"
    );
    // The login itself is locked out too.
    assert_eq!(basic_login(&stack, addr, OLD).await["code"], json!(429));
    // A new password that is too short is refused before anything is checked.
    let (status, _) = change(addr, &token, OLD, "short").await;
    assert_eq!(status, 400);

    // After the lockout (a client waits what Retry-After says) the right
    // old password is checked and changes the password.
    let wait = body["params"]["retry_after_ms"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(wait + 50)).await;
    let (status, body) = change(addr, &token, OLD, NEW).await;
    assert_eq!(status, 200, "{body}");
    let renewed = body["token"].as_str().expect("a new token").to_string();
    assert!(imstream::users::verify_password(
        NEW,
        &stored_hash(&stack).await
    ));
    // Every earlier token is refused; the one it answered with works.
    wait_token(addr, &token, 401, "the old token refused").await;
    assert_eq!(token_status(addr, &other).await, 401);
    assert_eq!(token_status(addr, &renewed).await, 200);
    assert_eq!(basic_login(&stack, addr, OLD).await["code"], json!(401));
    assert_eq!(basic_login(&stack, addr, NEW).await["code"], json!(200));
    // The old password no longer changes anything.
    let (status, _) = change(addr, &renewed, OLD, "yet another passphrase").await;
    assert_eq!(status, 403);
    // Someone without a password login has none to change.
    let (status, _) = change(addr, &stack.token(8, "web"), OLD, NEW).await;
    assert_eq!(status, 404);
}

/// Two password changes before the control projection has applied either
/// (issue 39): each takes its own auth version, so the first one's token
/// is refused once they are applied (before: both computed the version
/// from the projection's row, took the same one, and the first token
/// survived the second change).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_quick_password_changes_leave_only_the_last_token() {
    let mut stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    stack.world.config.auth.basic.tenants = vec![tenant.clone()];
    imstream::users::add(&stack.pool(), &tenant, UID, &login_of(&stack), OLD)
        .await
        .unwrap();
    let addr = stack.start_gateway("node-a").await;
    let login = basic_login(&stack, addr, OLD).await;
    let token = login["params"]["token"].as_str().unwrap().to_string();
    let (status, body) = change(addr, &token, OLD, NEW).await;
    assert_eq!(status, 200, "{body}");
    let first = body["token"].as_str().unwrap().to_string();
    let (status, body) = change(addr, &first, NEW, "a third passphrase").await;
    assert_eq!(status, 200, "{body}");
    let second = body["token"].as_str().unwrap().to_string();
    // Now the projection runs and applies both.
    stack.start_pipeline("control").await;
    wait_token(
        addr,
        &first,
        401,
        "the first change's token refused after the second",
    )
    .await;
    assert_eq!(token_status(addr, &second).await, 200);
}

/// `imstream users <args>` with `password` in `IMSTREAM_PASSWORD`.
fn users_cli(stack: &Stack, args: &[&str], password: Option<&str>) -> (bool, String) {
    let args = [&["users"], args].concat();
    let mut cmd = process::command(&stack.config_file("users"), &args);
    cmd.env("RUST_LOG", "error").env_remove("IMSTREAM_PASSWORD");
    if let Some(p) = password {
        cmd.env("IMSTREAM_PASSWORD", p);
    }
    let ran = process::run(cmd);
    (ran.ok, ran.printed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn imstream_users_lists_resets_and_removes_logins() {
    let (stack, addr) = stack_with(|_| {}).await;
    let tenant = stack.tenant().to_string();
    let dave = format!("Dave-{}", stack.world.id);
    imstream::users::add(&stack.pool(), &tenant, 8, &dave, OLD)
        .await
        .unwrap();
    let (ok, out) = users_cli(&stack, &["list", "--tenant", &tenant], None);
    assert!(ok, "{out}");
    let login = login_of(&stack);
    assert!(out.contains(&format!("{login}\t{UID}\tset\t")), "{out}");
    let dave = dave.to_lowercase();
    assert!(out.contains(&format!("{dave}\t8\tset\t")), "{out}");
    assert!(!out.contains("$argon2id$"), "a hash was printed: {out}");

    let token = stack.token(UID, "web");
    assert_eq!(token_status(addr, &token).await, 200);
    // Reset (any spelling of the login): the new password logs in, the
    // user's tokens are refused.
    let (ok, out) = users_cli(
        &stack,
        &[
            "reset",
            "--tenant",
            &tenant,
            "--login",
            &login.to_uppercase(),
        ],
        Some(NEW),
    );
    assert!(ok, "{out}");
    assert!(out.contains("signed out everywhere"), "{out}");
    assert!(imstream::users::verify_password(
        NEW,
        &stored_hash(&stack).await
    ));
    wait_token(addr, &token, 401, "carol's token refused after the reset").await;
    assert_eq!(basic_login(&stack, addr, NEW).await["code"], json!(200));
    let (ok, out) = users_cli(
        &stack,
        &["reset", "--tenant", &tenant, "--login", "nobody"],
        Some(NEW),
    );
    assert!(!ok && out.contains("no login"), "{out}");
    let (ok, out) = users_cli(
        &stack,
        &["reset", "--tenant", &tenant, "--login", &dave],
        Some("short"),
    );
    assert!(!ok && out.contains("shorter"), "{out}");

    // Remove: the login is gone and no longer logs in.
    let (ok, out) = users_cli(
        &stack,
        &["remove", "--tenant", &tenant, "--login", &login],
        None,
    );
    assert!(ok, "{out}");
    assert!(imstream::users::login_of(&stack.pool(), UID)
        .await
        .unwrap()
        .is_none());
    assert_eq!(basic_login(&stack, addr, NEW).await["code"], json!(401));
    let (ok, out) = users_cli(&stack, &["list", "--tenant", &tenant], None);
    assert!(
        ok && !out.contains(&login) && out.contains(&format!("{dave}\t8")),
        "{out}"
    );
}
