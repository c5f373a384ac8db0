//! Session control against the real services: revocations live in MySQL
//! and survive the loss of their Redis keys (a revoked device's token, and
//! the token a login re-issued it, stay refused; a disabled user stays
//! disabled), and a login is refused (503), not admitted, when neither
//! Redis nor MySQL can say whether the user may enter.

mod common;
mod realtime_support;

use std::time::Duration;

use serde_json::json;

use common::{wait_for, Stack};
use realtime_support::{admin, token_for, Client};

/// Deletes `uid`'s Redis control keys (of this test's tenant only; the
/// server is shared): what a Redis flush or restart leaves of them.
async fn lose_control_keys(stack: &Stack, uid: i64) {
    let keys = control_keys(stack, uid).await;
    if keys.is_empty() {
        return;
    }
    let mut redis = stack.redis().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// An HTTP call that authenticates (listing a group's messages); its status.
async fn http_status(addr: std::net::SocketAddr, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("http://{addr}/v1/groups/grpNobody/messages"))
        .bearer_auth(token)
        .send()
        .await
        .expect("gateway reachable")
        .status()
        .as_u16()
}

async fn login(addr: std::net::SocketAddr, token: &str, label: &str) -> serde_json::Value {
    let mut c = Client::connect(addr, label).await;
    c.login(token).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revocations_outlive_the_loss_of_their_redis_keys() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("control").await;
    let addr = stack.start_gateway("node-a").await;
    let admin_token = stack.config().auth.admin_token.clone();
    let tenant = stack.tenant().to_string();
    let pool = stack.pool();
    const A: i64 = 41;
    const B: i64 = 42;

    // A logs in on its phone with a token; the login re-issues one.
    let stolen = stack.token(A, "phone");
    let ctrl = login(addr, &stolen, "a-phone").await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
    let reissued = ctrl["params"]["token"].as_str().unwrap().to_string();
    let laptop = stack.token(A, "laptop");

    // The phone is revoked; B is disabled.
    assert_eq!(
        admin(
            stack.admin_addr(0),
            &admin_token,
            &format!("{A}/devices/phone/revoke"),
            &tenant
        )
        .await,
        202
    );
    assert_eq!(
        admin(
            stack.admin_addr(0),
            &admin_token,
            &format!("{B}/disable"),
            &tenant
        )
        .await,
        202
    );
    wait_for("the revocations applied", Duration::from_secs(30), || {
        let addr = addr;
        let (stolen, b) = (stolen.clone(), stack.token(B, "web"));
        async move {
            match (
                http_status(addr, &stolen).await,
                http_status(addr, &b).await,
            ) {
                (401, 401) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    // Redis loses the users' control keys.
    lose_control_keys(&stack, A).await;
    lose_control_keys(&stack, B).await;

    for (label, token) in [("stolen", &stolen), ("re-issued", &reissued)] {
        let ctrl = login(addr, token, label).await;
        assert_eq!(
            (ctrl["code"].clone(), ctrl["params"]["reason"].clone()),
            (json!(401), json!("device revoked")),
            "{label}: {ctrl}"
        );
        assert_eq!(http_status(addr, token).await, 401, "{label} over HTTP");
    }
    // A's other device is not concerned.
    let ctrl = login(addr, &laptop, "a-laptop").await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");

    lose_control_keys(&stack, B).await;
    let ctrl = login(addr, &stack.token(B, "web"), "b").await;
    assert_eq!(
        (ctrl["code"].clone(), ctrl["params"]["reason"].clone()),
        (json!(401), json!("user disabled")),
        "{ctrl}"
    );
    lose_control_keys(&stack, B).await;
    assert_eq!(http_status(addr, &stack.token(B, "web")).await, 401);

    // The ground truth is in the tenant's database.
    let (generation,): (i64,) = sqlx::query_as(
        "SELECT generation FROM im_session_control_devices WHERE uid = ? AND device = 'phone'",
    )
    .bind(A)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(generation >= 1, "{generation}");
    let (disabled,): (bool,) =
        sqlx::query_as("SELECT disabled FROM im_session_control_users WHERE uid = ?")
            .bind(B)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(disabled);

    // Enabling B lets it in again (with a token of its new auth version:
    // disabling signed it out), also after another loss.
    let (av,): (i64,) =
        sqlx::query_as("SELECT auth_version FROM im_session_control_users WHERE uid = ?")
            .bind(B)
            .fetch_one(&pool)
            .await
            .unwrap();
    let fresh = token_for(stack.config(), &tenant, B, "web", av);
    assert_eq!(
        admin(
            stack.admin_addr(0),
            &admin_token,
            &format!("{B}/enable"),
            &tenant
        )
        .await,
        202
    );
    wait_for("B enabled", Duration::from_secs(30), || {
        let fresh = fresh.clone();
        async move {
            match http_status(addr, &fresh).await {
                401 => Err("still refused".to_string()),
                _ => Ok(()),
            }
        }
    })
    .await;
    lose_control_keys(&stack, B).await;
    let ctrl = login(addr, &fresh, "b-enabled").await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
    // The token it was issued before being disabled stays refused.
    let ctrl = login(addr, &stack.token(B, "web"), "b-old").await;
    assert_eq!(ctrl["code"], json!(401), "{ctrl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_login_nobody_can_check_is_refused() {
    let mut stack = Stack::prepared(None).await;
    // A tenant whose database does not exist, and no control keys in
    // Redis for its user: nothing can say whether the user may enter.
    let broken = format!("{}x", stack.tenant());
    let missing = format!("imt_missing_{}", stack.world.id);
    stack.add_tenant(&broken, missing, Vec::new());
    let addr = stack.start_gateway("node-a").await;
    let token = imstream::auth::Tokens::new(stack.config())
        .issue(&broken, 7, "web", 0, 0)
        .token;
    let ctrl = login(addr, &token, "unknowable").await;
    assert_eq!(ctrl["code"], json!(503), "{ctrl}");
    assert_eq!(http_status(addr, &token).await, 503);
    // A user of the healthy tenant gets in.
    let ctrl = login(addr, &stack.token(5, "web"), "healthy").await;
    assert_eq!(ctrl["code"], json!(200), "{ctrl}");
}

/// Every Redis key holding `uid`'s control state (of this test's tenant).
async fn control_keys(stack: &Stack, uid: i64) -> Vec<String> {
    // The user's whole control state is one hash under the user's hash tag
    // (a SCAN would see one node of a Redis Cluster only).
    let key = imstream::keys::TenantKeys::new(stack.tenant()).control(uid);
    let mut redis = stack.redis().await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    if exists {
        vec![key]
    } else {
        Vec::new()
    }
}

/// Redis evicts keys one by one (an LRU policy takes the coldest first, and
/// a revoked device's key is cold): whichever one of a user's control keys
/// is lost, a revoked device and a disabled user stay refused on WebSocket
/// login and over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revocations_survive_the_eviction_of_any_one_control_key() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("control").await;
    let addr = stack.start_gateway("node-a").await;
    let admin_token = stack.config().auth.admin_token.clone();
    let tenant = stack.tenant().to_string();
    const A: i64 = 51;
    const B: i64 = 52;
    let revoked = stack.token(A, "phone");
    let disabled = stack.token(B, "web");
    // A uses its laptop, which stays allowed.
    let laptop = stack.token(A, "laptop");
    assert_eq!(login(addr, &laptop, "a-laptop").await["code"], json!(200));
    assert_eq!(
        admin(
            stack.admin_addr(0),
            &admin_token,
            &format!("{A}/devices/phone/revoke"),
            &tenant
        )
        .await,
        202
    );
    assert_eq!(
        admin(
            stack.admin_addr(0),
            &admin_token,
            &format!("{B}/disable"),
            &tenant
        )
        .await,
        202
    );
    wait_for("the revocations applied", Duration::from_secs(30), || {
        let (revoked, disabled) = (revoked.clone(), disabled.clone());
        async move {
            match (
                http_status(addr, &revoked).await,
                http_status(addr, &disabled).await,
            ) {
                (401, 401) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    // A token of B's current auth version: only the disabled flag refuses it.
    let (av,): (i64,) =
        sqlx::query_as("SELECT auth_version FROM im_session_control_users WHERE uid = ?")
            .bind(B)
            .fetch_one(&stack.pool())
            .await
            .unwrap();
    let disabled = token_for(stack.config(), &tenant, B, "web", av);

    let mut tried = 0;
    for (uid, token, why) in [
        (A, &revoked, "device revoked"),
        (B, &disabled, "user disabled"),
    ] {
        let keys = control_keys(&stack, uid).await;
        assert!(!keys.is_empty(), "uid {uid} has its control state cached");
        for key in keys {
            // Each check below re-caches what it had to read from MySQL,
            // so every round starts from a complete cache.
            let mut redis = stack.redis().await;
            let _: i64 = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .unwrap();
            let ctrl = login(addr, token, "evicted").await;
            assert_eq!(
                (ctrl["code"].clone(), ctrl["params"]["reason"].clone()),
                (json!(401), json!(why)),
                "uid {uid} let in over WebSocket once {key} was evicted: {ctrl}"
            );
            let _: i64 = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut redis)
                .await
                .unwrap();
            assert_eq!(
                http_status(addr, token).await,
                401,
                "uid {uid} let in over HTTP once {key} was evicted"
            );
            tried += 1;
        }
    }
    assert!(tried >= 2, "{tried} keys tried");
    // The laptop was never concerned.
    assert_eq!(login(addr, &laptop, "a-laptop-2").await["code"], json!(200));
}
