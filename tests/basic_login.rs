//! A person logs in with a password in a real deployment: `imstream users
//! add` (the binary, password on stdin) puts a login into the tenant's
//! logins table; `{login scheme="basic"}` with base64("login:password")
//! then works over the WebSocket, a wrong password or unknown login is
//! refused, the row keeps only an Argon2id hash, and a second row for the
//! same login is refused.

mod common;
mod realtime_support;

use base64::Engine;
use serde_json::json;

use common::{process, Stack};
use realtime_support::{usr, Client};

const UID: i64 = 4242;
const LOGIN: &str = "carol@example.com";
const PASSWORD: &str = "a long passphrase, not in argv";

/// Runs `imstream users add` with the password on stdin; (success, output).
async fn users_add(
    config: &std::path::Path,
    tenant: &str,
    uid: i64,
    password: &str,
) -> (bool, String) {
    let uid = uid.to_string();
    let args = [
        "users", "add", "--tenant", tenant, "--uid", &uid, "--login", LOGIN,
    ];
    let mut cmd = process::command(config, &args);
    cmd.env_remove("IMSTREAM_PASSWORD");
    let ran = process::run_async(cmd, Some(&format!("{password}\n"))).await;
    (ran.ok, ran.printed())
}

fn basic(login: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{login}:{password}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_added_with_the_cli_logs_in_with_a_password() {
    let mut stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    stack.world.config.auth.basic.tenants = vec![tenant.clone()];
    let config_file = stack.config_file("basic");

    let (ok, out) = users_add(&config_file, &tenant, UID, PASSWORD).await;
    assert!(ok, "imstream users add failed: {out}");

    let addr = stack.start_gateway("node-a").await;
    let mut c = Client::connect(addr, "person").await;
    let ctrl = c
        .request(json!({"login": {"scheme": "basic", "secret": basic(LOGIN, PASSWORD)}}))
        .await;
    assert_eq!(ctrl["code"], json!(200), "basic login: {ctrl}");
    assert_eq!(ctrl["params"]["user"], json!(usr(UID)), "{ctrl}");
    let token = ctrl["params"]["token"]
        .as_str()
        .expect("a token")
        .to_string();
    // The token it got logs in too (the web app's "stay logged in").
    let mut again = Client::connect(addr, "token").await;
    assert_eq!(again.login(&token).await["code"], json!(200));

    for (login, password) in [
        (LOGIN, "a long passphrase, not in argV"),
        ("nobody", PASSWORD),
    ] {
        let mut c = Client::connect(addr, "wrong").await;
        let ctrl = c
            .request(json!({"login": {"scheme": "basic", "secret": basic(login, password)}}))
            .await;
        assert_eq!(ctrl["code"], json!(401), "{login}/{password}: {ctrl}");
    }

    let hash: String =
        sqlx::query_scalar("SELECT password_hash FROM im_basic_logins WHERE login = ?")
            .bind(LOGIN)
            .fetch_one(&stack.pool())
            .await
            .unwrap();
    assert!(hash.starts_with("$argon2id$"), "stored: {hash}");
    assert!(
        !hash.contains(PASSWORD) && !hash.contains("passphrase"),
        "stored: {hash}"
    );

    let (ok, out) = users_add(&config_file, &tenant, UID + 1, "another password").await;
    assert!(
        !ok && out.contains("already exists"),
        "second add of {LOGIN}: {out}"
    );
}

/// A stack whose tenant takes password logins; the gateway not started.
async fn basic_stack(tweak: impl FnOnce(&mut imstream::config::Config)) -> Stack {
    let mut stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    stack.world.config.auth.basic.tenants = vec![tenant];
    tweak(&mut stack.world.config);
    stack
}

/// The stored login of `uid`, as bytes.
async fn stored_login(stack: &Stack, uid: i64) -> Option<Vec<u8>> {
    sqlx::query_scalar("SELECT CAST(login AS BINARY) FROM im_basic_logins WHERE uid = ?")
        .bind(uid)
        .fetch_optional(&stack.pool())
        .await
        .unwrap()
}

async fn basic_login(addr: std::net::SocketAddr, login: &str, password: &str) -> serde_json::Value {
    let mut c = Client::connect(addr, "basic").await;
    c.request(json!({"login": {"scheme": "basic", "secret": basic(login, password)}}))
        .await
}

/// One login however it is spelled in letter case or compatibility forms:
/// stored once normalized (NFKC + case folding), found from any spelling,
/// refused with a trailing space, and an accented spelling is another login.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_is_one_normalized_form() {
    let mut stack = basic_stack(|_| {}).await;
    let pool = stack.pool();
    imstream::users::add(&pool, stack.tenant(), 501, "Dana@Example.COM", PASSWORD)
        .await
        .unwrap();
    assert_eq!(
        stored_login(&stack, 501).await.as_deref(),
        Some(b"dana@example.com".as_slice()),
        "stored normalized"
    );
    let taken = imstream::users::add(&pool, stack.tenant(), 502, "DANA@example.com", PASSWORD)
        .await
        .unwrap_err();
    assert!(taken.to_string().contains("already exists"), "{taken}");
    let addr = stack.start_gateway("node-a").await;
    for spelling in [
        "dana@example.com",
        "DANA@EXAMPLE.COM",
        "Ｄａｎａ@example.com",
    ] {
        let ctrl = basic_login(addr, spelling, PASSWORD).await;
        assert_eq!(ctrl["code"], json!(200), "{spelling}: {ctrl}");
        assert_eq!(
            ctrl["params"]["user"],
            json!(usr(501)),
            "{spelling}: {ctrl}"
        );
    }
    for other in ["dana@example.com ", "dána@example.com"] {
        let ctrl = basic_login(addr, other, PASSWORD).await;
        assert_eq!(ctrl["code"], json!(401), "{other:?}: {ctrl}");
    }
}

/// Logins stored before normalization are rewritten by `imstream migrate`;
/// two rows that would become one login stop it, naming both, and nothing
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_normalizes_stored_logins_and_refuses_clashes() {
    let stack = basic_stack(|_| {}).await;
    let pool = stack.pool();
    // Rows written before normalization (the column compares bytes: Erin
    // and erin are two rows).
    let hash = imstream::users::hash_password(PASSWORD).unwrap();
    let insert = |login: &'static str, uid: i64| {
        let (pool, hash) = (pool.clone(), hash.clone());
        async move {
            sqlx::query(
                "INSERT INTO im_basic_logins (login, uid, password_hash, created_at, updated_at) \
                 VALUES (?, ?, ?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
            )
            .bind(login)
            .bind(uid)
            .bind(hash)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    insert("Erin", 601).await;
    insert("erin", 602).await;
    insert("Frank", 603).await;
    let tenant = stack.tenant().to_string();
    let (ok, out) = stack.imstream(&["migrate", "--tenant", &tenant]);
    assert!(!ok, "migrate went through a clash: {out}");
    assert!(
        out.contains("\"Erin\"")
            && out.contains("\"erin\"")
            && out.contains("601")
            && out.contains("602"),
        "the clash is named: {out}"
    );
    assert_eq!(
        stored_login(&stack, 603).await.as_deref(),
        Some(b"Frank".as_slice()),
        "nothing changed"
    );
    sqlx::query("DELETE FROM im_basic_logins WHERE uid = 602")
        .execute(&pool)
        .await
        .unwrap();
    let (ok, out) = stack.imstream(&["migrate", "--tenant", &tenant]);
    assert!(ok, "{out}");
    assert_eq!(
        stored_login(&stack, 601).await.as_deref(),
        Some(b"erin".as_slice())
    );
    assert_eq!(
        stored_login(&stack, 603).await.as_deref(),
        Some(b"frank".as_slice())
    );
}

/// 50 wrong passwords for one login at once, in different spellings: at
/// most `limits.login_failures` of them are checked, the rest get the
/// lockout answer; the right password is locked out too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_wrong_logins_check_at_most_the_free_attempts() {
    const FREE: u32 = 3;
    let name = format!("grace{}", common::unique_id());
    let mut stack = basic_stack(|c| {
        c.limits.login_failures = FREE;
        c.limits.login_lockout_ms = 120_000;
    })
    .await;
    imstream::users::add(&stack.pool(), stack.tenant(), 701, &name, PASSWORD)
        .await
        .unwrap();
    let addr = stack.start_gateway("node-a").await;
    let spellings = [
        name.clone(),
        name.to_uppercase(),
        format!("G{}", &name[1..]),
        name.chars()
            .map(|c| {
                char::from_u32(c as u32 + 0xFEE0)
                    .filter(|_| c.is_ascii_alphanumeric())
                    .unwrap_or(c)
            })
            .collect::<String>(),
    ];
    let mut clients = Vec::new();
    for i in 0..50 {
        clients.push(Client::connect(addr, &format!("guess{i}")).await);
    }
    let attempts = clients.into_iter().enumerate().map(|(i, mut c)| {
        let login = spellings[i % spellings.len()].clone();
        tokio::spawn(async move {
            c.request(json!({"login": {"scheme": "basic", "secret": basic(&login, "wrong guess")}}))
                .await
        })
    });
    let answers: Vec<serde_json::Value> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let checked = answers
        .iter()
        .filter(|c| c["code"] == json!(401) && c["text"] == json!("authentication failed"))
        .count();
    let locked = answers.iter().filter(|c| c["code"] == json!(429)).count();
    println!("50 parallel wrong logins: {checked} checked (401), {locked} locked out (429)");
    assert_eq!(checked + locked, 50, "{answers:?}");
    assert!(
        checked >= 1 && checked <= FREE as usize,
        "{checked} passwords checked, at most {FREE} allowed"
    );
    let ctrl = basic_login(addr, &name, PASSWORD).await;
    assert_eq!(ctrl["code"], json!(429), "locked out: {ctrl}");
}

/// Every password login gets a device of its own: revoking the device of
/// one session leaves the user's other password session open and usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoking_one_password_login_leaves_the_other() {
    let mut stack = basic_stack(|_| {}).await;
    stack.start_pipeline("control").await;
    imstream::users::add(&stack.pool(), stack.tenant(), 801, "heidi", PASSWORD)
        .await
        .unwrap();
    let addr = stack.start_gateway("node-a").await;
    let admin_addr = stack.admin_addr(0);
    let device_of = |ctrl: &serde_json::Value| -> String {
        let token = ctrl["params"]["token"].as_str().expect("a token");
        imstream::auth::Tokens::new(stack.config())
            .verify(token)
            .expect("a valid token")
            .dev
    };
    let mut first = Client::connect(addr, "first").await;
    let one = first
        .request(json!({"login": {"scheme": "basic", "secret": basic("heidi", PASSWORD)}}))
        .await;
    let mut second = Client::connect(addr, "second").await;
    let two = second
        .request(json!({"login": {"scheme": "basic", "secret": basic("heidi", PASSWORD)}}))
        .await;
    assert_eq!(
        (one["code"].clone(), two["code"].clone()),
        (json!(200), json!(200))
    );
    let (d1, d2) = (device_of(&one), device_of(&two));
    assert_ne!(d1, d2, "two password logins share a device");
    let status = realtime_support::admin(
        admin_addr,
        &stack.config().auth.admin_token,
        &format!("801/devices/{d1}/revoke"),
        stack.tenant(),
    )
    .await;
    assert_eq!(status, 202);
    first.expect_closed(realtime_support::DELIVERY).await;
    // The second is open and usable.
    assert!(!second.is_closed(), "{:?}", second.frames());
    let me = second.request(json!({"sub": {"topic": "me"}})).await;
    assert_eq!(me["code"], json!(200), "{me}");
    assert!(!second.is_closed());
    // Its token still logs in.
    let mut again = Client::connect(addr, "again").await;
    let token = two["params"]["token"].as_str().unwrap().to_string();
    assert_eq!(again.login(&token).await["code"], json!(200));
}

/// Issue 40: the web app's account screens. A person who just signed in
/// with their password changes it with `{acc}` sending only the new one
/// (and no login, as the app does after a token login): answered 200,
/// then this session and every other one are signed out; the new password
/// logs in, the old one no longer. A session signed in by token must give
/// the current password (`tmpscheme="basic"`), checked like a login.
/// Sign-up and reset by email are refused with a text that says what to
/// do, and someone else's login cannot be put in the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_apps_password_change_signs_everyone_out() {
    let mut stack = basic_stack(|_| {}).await;
    let tenant = stack.tenant().to_string();
    let config_file = stack.config_file("basic");
    let (ok, out) = users_add(&config_file, &tenant, UID, PASSWORD).await;
    assert!(ok, "{out}");
    let addr = stack.start_gateway("node-a").await;

    // Before any login: sign-up and the two reset steps.
    let mut stranger = Client::connect(addr, "stranger").await;
    let signup = stranger
        .request(json!({"acc": {"user": "new", "scheme": "basic",
            "secret": basic("mallory", "pass word 1"), "login": true,
            "desc": {"public": {"fn": "Mallory"}}}}))
        .await;
    assert_eq!(signup["code"], json!(403), "{signup}");
    assert!(
        signup["text"].as_str().unwrap().contains("administrator"),
        "{signup}"
    );
    let reset = stranger
        .request(json!({"login": {"scheme": "reset", "secret": basic("basic:email", "carol@example.com")}}))
        .await;
    assert_eq!(reset["code"], json!(403), "{reset}");
    let code = stranger
        .request(
            json!({"acc": {"scheme": "basic", "secret": basic("", "new one 1234"),
            "tmpscheme": "code", "tmpsecret": basic("123456:email", "carol@example.com")}}),
        )
        .await;
    assert_eq!(code["code"], json!(403), "{code}");
    assert!(code["text"].as_str().unwrap().contains("reset"), "{code}");

    // A session by token (a reload): the current password is asked for.
    let mut first = Client::connect(addr, "first").await;
    let login = first
        .request(json!({"login": {"scheme": "basic", "secret": basic(LOGIN, PASSWORD)}}))
        .await;
    let token = login["params"]["token"].as_str().unwrap().to_string();
    let mut by_token = Client::connect(addr, "by-token").await;
    assert_eq!(by_token.login(&token).await["code"], json!(200));
    let bare = by_token
        .request(json!({"acc": {"scheme": "basic", "secret": basic("", "new one 1234")}}))
        .await;
    assert_eq!(bare["code"], json!(403), "{bare}");
    assert!(
        bare["text"].as_str().unwrap().contains("sign in again"),
        "{bare}"
    );
    let wrong = by_token
        .request(
            json!({"acc": {"scheme": "basic", "secret": basic("", "new one 1234"),
            "tmpscheme": "basic", "tmpsecret": basic("", "not the password")}}),
        )
        .await;
    assert_eq!(wrong["code"], json!(403), "{wrong}");
    // Someone else's login in the secret is not a rename.
    let rename = first
        .request(json!({"acc": {"scheme": "basic", "secret": basic("heidi", "new one 1234")}}))
        .await;
    assert_eq!(rename["code"], json!(403), "{rename}");

    // The fresh password session changes it with the new one alone.
    const NEW: &str = "the new passphrase, 2026";
    let changed = first
        .request(json!({"acc": {"scheme": "basic", "secret": basic("", NEW)}}))
        .await;
    assert_eq!(changed["code"], json!(200), "{changed}");
    first.expect_closed(realtime_support::DELIVERY).await;
    by_token.expect_closed(realtime_support::DELIVERY).await;
    let mut again = Client::connect(addr, "old token").await;
    assert_eq!(again.login(&token).await["code"], json!(401));
    assert_eq!(basic_login(addr, LOGIN, PASSWORD).await["code"], json!(401));
    assert_eq!(basic_login(addr, LOGIN, NEW).await["code"], json!(200));
}
