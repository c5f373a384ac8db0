//! The Tinode web app, served by the gateway, used by people in a real
//! browser (Debian's headless chromium driven by playwright-core, see
//! tests/browser/webapp.js): two people log in through the login form in
//! two browser contexts, both reach the main screen, one opens the demo
//! group and sends, the other (with it open) sees it live; every request
//! the app sent with an id was answered within 5 s, the console shows no
//! error and no request left the page's origin. Screenshots of each step go
//! to target/webapp-artifacts/.
//!
//! With the `me` topic: both see the group by its name in their chat list,
//! A pages back through 30 seeded messages, B sees A typing, C (group not
//! open) sees an unread badge that clears when C opens the group, and a
//! one-to-one chat B starts (new chat, search A by name, pick, write)
//! appears in A's list under B's name and opens with B's message.
//! The people's names and Alice's picture come from the config
//! (`auth.dev_users`, as `docker/local/run` has them), never from the test:
//! B sees Alice's name and picture under her messages (never "Not found",
//! the app's text for an author it has no `public` for), and the one-to-one
//! chat is titled with the peer's name (never "Unnamed").
//! C, who lets nobody add them directly, is invited to a second group: it
//! shows in C's list, opening it shows Tinode's invitation panel, and after
//! Accept C reads the group's message.
//! IMSTREAM_WEBAPP_CHAT_LIST=0 skips those steps (to tell a chat-list
//! failure from a basic one).
//!
//! Also, without a browser: how the gateway serves the app (content types,
//! caching, no CDN reference left in the page, files outside the app
//! refused), the WebSocket origin check and the polite refusal of uploads.

mod common;

use std::time::Duration;

use common::{repo_root, wait_for, Stack};

const GROUP: &str = "grpWebDemo";
const GROUP_NAME: &str = "Web Demo";
const INVITE_GROUP: &str = "grpWebInvite";
const INVITE_NAME: &str = "Invite Only";
const INVITE_TEXT: &str = "welcome, carol";
const ALICE: i64 = 1001;
const BOB: i64 = 1002;
const CAROL: i64 = 1003;
/// More than the app's first page (24 messages).
const SEEDED: usize = 30;

fn webapp_dir() -> std::path::PathBuf {
    let dir = repo_root().join("webapp");
    assert!(
        dir.join("node_modules/tinode-webapp/index.html").is_file(),
        "the web app is not installed: run `npm ci --prefix webapp` (docker/local/test does)"
    );
    dir
}

/// Alice's picture, from the config: a small SVG as a base64 `data:` URI
/// (the app shows `data:image/…;base64,` pictures; its policy allows them).
const ALICE_PHOTO: &str = "data:image/svg+xml;base64,PHN2ZyB4bWxucz0naHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmcnIHZpZXdCb3g9JzAgMCA2NCA2NCc+PHJlY3Qgd2lkdGg9JzY0JyBoZWlnaHQ9JzY0JyByeD0nMTInIGZpbGw9JyNjMjE4NWInLz48L3N2Zz4=";

/// A stack with every pipeline, dev users alice, bob, carol — their names
/// (and Alice's picture) in the config, as docker/local/imstream.toml
/// gives them — and a gateway serving the web app.
async fn stack_with_webapp() -> Stack {
    let mut stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    stack.world.config.gateway.webapp_dir = webapp_dir().display().to_string();
    stack.world.config.gateway.heartbeat_secs = 1;
    for (uid, login, name) in [
        (ALICE, "alice", "Alice Liddell"),
        (BOB, "bob", "Bob Builder"),
        (CAROL, "carol", "Carol Danvers"),
    ] {
        stack
            .world
            .config
            .auth
            .dev_users
            .push(imstream::config::DevUser {
                tenant: tenant.clone(),
                uid,
                login: login.into(),
                password: format!("{login}-pass"),
                name: Some(name.into()),
                photo: (uid == ALICE).then(|| ALICE_PHOTO.into()),
            });
    }
    // Dave is a person the operator added with `imstream users add` (a
    // password login of the tenant, which he can change from the app).
    stack.world.config.auth.basic.tenants = vec![tenant.clone()];
    let config_file = stack.config_file("webapp");
    let args = [
        "users", "add", "--tenant", &tenant, "--uid", DAVE_UID, "--login", DAVE_LOGIN,
    ];
    let mut cmd = common::process::command(&config_file, &args);
    cmd.env_remove("IMSTREAM_PASSWORD");
    let ran = common::process::run_async(cmd, Some(&format!("{DAVE_PASSWORD}\n"))).await;
    assert!(ran.ok, "imstream users add: {}", ran.printed());
    // A scanner program (`exec:`): a file holding the EICAR test string is
    // flagged, a moment after the upload (as a real scanner takes), so the
    // app's message referring to it is sent first.
    let scanner = common::repo_root().join(format!("target/tmp/scan-{}.sh", stack.world.id));
    std::fs::write(
        &scanner,
        "sleep 2\nif grep -q 'EICAR-STANDARD-ANTIVIRUS-TEST-FILE'; then echo 'EICAR test file'; exit 1; fi\nexit 0\n",
    )
    .expect("scanner script");
    stack.world.config.files.scanner = format!("exec:/bin/sh {}", scanner.display());
    for p in imstream::pipeline::PIPELINES {
        stack.start_pipeline(p).await;
    }
    stack.start_gateway("web").await;
    stack
}

const DAVE_UID: &str = "1004";
const DAVE_LOGIN: &str = "dave";
const DAVE_PASSWORD: &str = "dave's first passphrase";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn people_chat_in_the_web_app_in_a_real_browser() {
    let browser_dir = repo_root().join("tests/browser");
    assert!(
        browser_dir.join("node_modules/playwright-core").exists(),
        "playwright-core missing: run `npm ci --prefix tests/browser` (docker/local/test does)"
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "{chromium} missing: apt-get install -y chromium (docker/local/test does)"
    );
    let stack = stack_with_webapp().await;
    stack.create_group(GROUP, ALICE, &[BOB, CAROL]).await;
    let addr = stack.gateway_addr(0);
    // The group's name, as its owner sets it.
    let (status, body) = common::call(
        &stack,
        addr,
        ALICE,
        "PUT",
        &format!("/v1/groups/{GROUP}/profile"),
        serde_json::json!({"fn": GROUP_NAME}),
    )
    .await;
    assert_eq!(status, 202, "group name: {body}");
    // The people's names come from the config (the gateway gives them at
    // start): nobody sets one here.
    let client = reqwest::Client::new();
    let token = stack.token(ALICE, "seed");
    wait_for(
        "the dev users' profiles from the config",
        Duration::from_secs(60),
        || {
            let (client, token) = (&client, &token);
            async move {
                let body: serde_json::Value = client
                    .get(format!("http://{addr}/v1/groups/{GROUP}/subscribers"))
                    .bearer_auth(token)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?
                    .json()
                    .await
                    .map_err(|e| e.to_string())?;
                let publics: Vec<serde_json::Value> = body["subscribers"]
                    .as_array()
                    .map(|a| a.iter().map(|s| s["public"].clone()).collect())
                    .unwrap_or_default();
                let names: Vec<&str> = publics.iter().filter_map(|p| p["fn"].as_str()).collect();
                let photo = publics.iter().any(|p| p["photo"]["ref"] == ALICE_PHOTO);
                if names.len() == 3 && photo {
                    Ok(())
                } else {
                    Err(format!("{body}"))
                }
            }
        },
    )
    .await;

    // History to page back through, sent over HTTP and stored.
    // Plain text as Tinode clients send it (a bare string): the app shows
    // `{"txt": …}` without `fmt` as "invalid content".
    for i in 1..=SEEDED {
        let resp = client
            .post(format!("http://{addr}/v1/groups/{GROUP}/messages"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"content": format!("seeded {i}"), "client_msg_id": format!("seed-{i}")}))
            .send()
            .await
            .expect("gateway reachable");
        assert_eq!(resp.status().as_u16(), 202, "seeding message {i}");
    }
    let pool = stack.pool();
    let month = imstream::store::month::ShardMonth::of(chrono::Utc::now()).to_string();
    wait_for(
        "the seeded messages stored",
        Duration::from_secs(60),
        || {
            let (pool, month) = (pool.clone(), month.clone());
            async move {
                let n: i64 = sqlx::query_scalar(&format!(
                    "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ?"
                ))
                .bind(GROUP)
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())?;
                if n as usize == SEEDED {
                    Ok(())
                } else {
                    Err(format!("{n} stored"))
                }
            }
        },
    )
    .await;

    // Carol lets nobody add her directly: Alice's new group invites her.
    let (status, body) = common::call(
        &stack,
        addr,
        CAROL,
        "PUT",
        "/v1/me/settings",
        serde_json::json!({"add_policy": "nobody"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = common::call(
        &stack,
        addr,
        ALICE,
        "POST",
        "/v1/groups",
        serde_json::json!({"topic": INVITE_GROUP, "name": INVITE_NAME, "members": [CAROL]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["invited"], serde_json::json!([CAROL]), "{body}");
    let resp = client
        .post(format!("http://{addr}/v1/groups/{INVITE_GROUP}/messages"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"content": INVITE_TEXT, "client_msg_id": "invite-1"}))
        .send()
        .await
        .expect("gateway reachable");
    assert_eq!(resp.status().as_u16(), 202);
    wait_for("the invitation projected", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM im_group_invites i JOIN im_groups g ON g.topic = i.topic \
                 WHERE i.topic = ? AND i.uid = ?",
            )
            .bind(INVITE_GROUP)
            .bind(CAROL)
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

    let artifacts = repo_root().join("target/webapp-artifacts");
    let _ = std::fs::remove_dir_all(&artifacts);
    let chat_list = std::env::var("IMSTREAM_WEBAPP_CHAT_LIST").unwrap_or_default();
    let output = tokio::process::Command::new("node")
        .arg("webapp.js")
        .current_dir(&browser_dir)
        .env("BASE_URL", format!("http://{addr}"))
        .env("USER_A", "alice:alice-pass")
        .env("USER_B", "bob:bob-pass")
        .env("USER_C", "carol:carol-pass")
        .env("USER_D", format!("{DAVE_LOGIN}:{DAVE_PASSWORD}"))
        .env("GROUP", GROUP)
        .env("GROUP_NAME", GROUP_NAME)
        .env("SEEDED", SEEDED.to_string())
        .env("ARTIFACTS", &artifacts)
        .env("CHAT_LIST", if chat_list == "0" { "0" } else { "1" })
        .env("NAME_A", "Alice Liddell")
        .env("NAME_B", "Bob Builder")
        .env("PHOTO_A", ALICE_PHOTO)
        .env("INVITE_NAME", INVITE_NAME)
        .env("INVITE_TEXT", INVITE_TEXT)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), output)
        .await
        .expect("the browser run did not finish within 300 s")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "browser run failed ({}); screenshots in {}:\nstdout: {stdout}\nstderr: {stderr}",
        output.status,
        artifacts.display()
    );
    let shots = std::fs::read_dir(&artifacts)
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(
        shots >= 7,
        "only {shots} screenshots in {}",
        artifacts.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_serves_the_web_app_from_its_own_origin() {
    let mut stack = Stack::prepared(None).await;
    stack.world.config.gateway.webapp_dir = webapp_dir().display().to_string();
    let addr = stack.start_gateway("web").await;
    let http = reqwest::Client::new();
    let get = |path: &str| http.get(format!("http://{addr}{path}")).send();

    let page = get("/").await.unwrap();
    assert_eq!(page.status(), 200);
    let header = |r: &reqwest::Response, h: &str| {
        r.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(header(&page, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&page, "cache-control"), "no-cache");
    let etag = header(&page, "etag");
    let html = page.text().await.unwrap();
    // Nothing the page loads comes from another origin.
    for attr in ["src=\"http", "href=\"http", "src=\"//", "href=\"//"] {
        assert!(
            !html.contains(attr),
            "index.html still loads {attr}…:\n{html}"
        );
    }
    let not_modified = http
        .get(format!("http://{addr}/"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(not_modified.status(), 304);

    // Every script and stylesheet the page names is served, vendored ones
    // immutable, the app's own revalidated.
    let mut refs = Vec::new();
    for attr in ["src=\"", "href=\""] {
        for part in html.split(attr).skip(1) {
            refs.push(part.split('"').next().unwrap().to_string());
        }
    }
    assert!(
        refs.iter().any(|r| r.starts_with("/vendor/react@18.3.1/")),
        "{refs:?}"
    );
    for r in &refs {
        let path = if r.starts_with('/') {
            r.clone()
        } else {
            format!("/{r}")
        };
        let resp = get(&path).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let (ct, cache) = (
            header(&resp, "content-type"),
            header(&resp, "cache-control"),
        );
        if path.ends_with(".js") {
            assert!(ct.starts_with("text/javascript"), "{path}: {ct}");
        } else if path.ends_with(".css") {
            assert!(ct.starts_with("text/css"), "{path}: {ct}");
        }
        if path.starts_with("/vendor/") {
            assert!(cache.contains("immutable"), "{path}: {cache}");
        } else {
            assert_eq!(cache, "no-cache", "{path}");
        }
    }
    // The fonts the vendored CSS points at.
    let font = get("/vendor/material-icons@1.13.14/iconfont/material-icons.woff2")
        .await
        .unwrap();
    assert_eq!(font.status(), 200);
    assert_eq!(header(&font, "content-type"), "font/woff2");
    let chunk = get("/umd/index.prod.js").await.unwrap();
    assert_eq!(chunk.status(), 200);

    for outside in [
        "/vendor/left-pad@1.0.0/index.js",
        "/node_modules/react/package.json",
    ] {
        let resp = get(outside).await.unwrap();
        assert_eq!(resp.status(), 404, "{outside}");
    }
    // Raw request targets, as a client that does not normalize paths sends them.
    for target in [
        "/../../Cargo.toml",
        "/vendor/react@18.3.1/../../../../Cargo.toml",
    ] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(
            format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut reply = String::new();
        tcp.read_to_string(&mut reply).await.unwrap();
        assert!(
            !reply.starts_with("HTTP/1.1 200") && !reply.contains("[package]"),
            "{target}: {reply}"
        );
    }

    // An upload without a session is refused the way Tinode's file server
    // reports errors (a `{ctrl}` the app shows), before its body is read.
    let upload = http
        .post(format!("http://{addr}/v0/file/u/"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 401);
    let body: serde_json::Value = upload.json().await.unwrap();
    assert_eq!(body["ctrl"]["code"], 401, "{body}");

    // The WebSocket: this origin and clients without one are let in,
    // another site's page is not.
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("ws://{addr}/v0/channels?apikey=x");
    let with_origin = |origin: &str| {
        let mut req = url.clone().into_client_request().unwrap();
        req.headers_mut().insert("origin", origin.parse().unwrap());
        req
    };
    assert!(tokio_tungstenite::connect_async(url.clone()).await.is_ok());
    assert!(
        tokio_tungstenite::connect_async(with_origin(&format!("http://{addr}")))
            .await
            .is_ok()
    );
    match tokio_tungstenite::connect_async(with_origin("http://evil.example")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 403)
        }
        other => panic!("another origin's page was let in: {other:?}"),
    }
}
