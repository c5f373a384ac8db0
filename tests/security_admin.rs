//! Operator endpoints live on their own listener (`gateway.admin_addr`,
//! loopback by default): the public port answers 404 for every
//! `/v1/admin/…` route, the operator port serves nothing else, and failed
//! admin tokens are throttled per client address (401, then 429 with a
//! Retry-After for every wrong token from that address; the right token
//! still passes).

mod common;

use reqwest::Method;
use serde_json::json;

use common::Stack;

/// Every operator route, as (method, path).
fn admin_routes(tenant: &str) -> Vec<(Method, String)> {
    vec![
        (
            Method::POST,
            format!("/v1/admin/users/5/devices/web/revoke?tenant={tenant}"),
        ),
        (
            Method::POST,
            format!("/v1/admin/users/5/signout?tenant={tenant}"),
        ),
        (
            Method::POST,
            format!("/v1/admin/users/5/disable?tenant={tenant}"),
        ),
        (
            Method::POST,
            format!("/v1/admin/users/5/enable?tenant={tenant}"),
        ),
        (Method::POST, "/v1/admin/commands".to_string()),
        (Method::GET, format!("/v1/admin/stats?tenant={tenant}")),
        (Method::POST, "/v1/admin/notifications".to_string()),
        (Method::POST, "/v1/admin/badges".to_string()),
        (Method::GET, format!("/v1/admin/reports?tenant={tenant}")),
        (
            Method::POST,
            format!("/v1/admin/reports/r1/resolve?tenant={tenant}"),
        ),
    ]
}

async fn call(
    addr: std::net::SocketAddr,
    method: Method,
    path: &str,
    token: &str,
) -> reqwest::Response {
    reqwest::Client::new()
        .request(method, format!("http://{addr}{path}"))
        .bearer_auth(token)
        .json(&json!({}))
        .send()
        .await
        .expect("gateway reachable")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_routes_are_not_on_the_public_port() {
    let mut stack = Stack::prepared(None).await;
    let public = stack.start_gateway("node-a").await;
    let admin = stack.admin_addr(0);
    assert_ne!(public, admin);
    assert!(admin.ip().is_loopback(), "{admin}");
    let token = stack.config().auth.admin_token.clone();
    let tenant = stack.tenant().to_string();
    for (method, path) in admin_routes(&tenant) {
        let resp = call(public, method.clone(), &path, &token).await;
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        assert_eq!(status, 404, "{method} {path} on the public port: {body}");
        assert!(
            body.is_empty(),
            "{method} {path}: no handler answers: {body}"
        );
        // On the operator port a handler answers (whatever it makes of this
        // empty body: JSON, never "no such route"), past the admin check.
        let resp = call(admin, method.clone(), &path, &token).await;
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        assert!(
            body.is_object() && status != 401,
            "{method} {path} on the operator port: {status} {body}"
        );
    }
    // The operator port serves nothing else.
    let status = call(
        admin,
        Method::GET,
        "/v1/groups/grpX/messages",
        &stack.token(5, "web"),
    )
    .await
    .status();
    assert_eq!(status.as_u16(), 404);
    let status = call(
        public,
        Method::GET,
        "/v1/groups/grpX/messages",
        &stack.token(5, "web"),
    )
    .await
    .status();
    assert_ne!(status.as_u16(), 404, "the public API is on the public port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_admin_tokens_are_throttled_per_address() {
    const FREE: u32 = 4;
    let mut stack = Stack::prepared(None).await;
    stack.world.config.limits.admin_failures = FREE;
    stack.world.config.limits.login_lockout_ms = 60_000;
    stack.start_gateway("node-a").await;
    let admin = stack.admin_addr(0);
    let token = stack.config().auth.admin_token.clone();
    let path = format!("/v1/admin/stats?tenant={}", stack.tenant());
    // The right token is never counted.
    for _ in 0..(FREE + 2) {
        assert_eq!(
            call(admin, Method::GET, &path, &token)
                .await
                .status()
                .as_u16(),
            200
        );
    }
    let mut statuses = Vec::new();
    for i in 0..(FREE + 3) {
        let resp = call(admin, Method::GET, &path, &format!("{token}-guess{i}")).await;
        let status = resp.status().as_u16();
        if status == 429 {
            let retry: u64 = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("a Retry-After header");
            assert!(retry > 1 && retry <= 60, "retry after {retry}s");
        }
        statuses.push(status);
    }
    let expected: Vec<u16> = (0..FREE + 3)
        .map(|i| if i < FREE { 401 } else { 429 })
        .collect();
    assert_eq!(statuses, expected);
    // While the address is locked out, the right token still works (the
    // operator shares the address with whoever guessed: on loopback, every
    // local caller; issue 39), and guesses stay refused.
    assert_eq!(
        call(admin, Method::GET, &path, &token)
            .await
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        call(admin, Method::GET, &path, &format!("{token}-again"))
            .await
            .status()
            .as_u16(),
        429
    );
}
