//! The id of the request being answered (issue 28): every HTTP answer
//! carries it (`X-Request-Id`, and `request_id` in error bodies), every
//! WebSocket `{ctrl}` of 500 or more carries it as `params.request_id`, and
//! an internal failure is logged under it, so an operator finds the detail
//! a client was not shown.
//!
//! HTTP takes a sane client-supplied id (1–64 of `[A-Za-z0-9._-]`) or makes
//! one; a WebSocket message gets one only when something needs it (ids are
//! cheap: a per-process random prefix and a counter).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

/// Longest client-supplied id accepted.
pub const MAX_LEN: usize = 64;

/// The response and request header.
pub const HEADER: &str = "x-request-id";

tokio::task_local! {
    static CURRENT: RefCell<Option<String>>;
}

static PREFIX: LazyLock<String> =
    LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string()[..16].to_string());
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A new id, unique in this process and (by its random prefix) across
/// processes.
pub fn generate() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n:x}", *PREFIX)
}

/// Whether a client-supplied id may be used as it is.
pub fn acceptable(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The client's id when acceptable, else a new one.
pub fn accept(client: Option<&str>) -> String {
    match client {
        Some(id) if acceptable(id) => id.to_string(),
        _ => generate(),
    }
}

/// Runs `f` as one request: `id` is its id (`None`: made on first use).
pub async fn scope<F: std::future::Future>(id: Option<String>, f: F) -> F::Output {
    CURRENT.scope(RefCell::new(id), f).await
}

/// The current request's id (made now if it has none yet); outside any
/// request, a fresh one.
pub fn current() -> String {
    CURRENT
        .try_with(|cell| cell.borrow_mut().get_or_insert_with(generate).to_string())
        .unwrap_or_else(|_| generate())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_plain_client_ids_are_taken() {
        assert_eq!(accept(Some("abc-1.2_Z")), "abc-1.2_Z");
        for bad in ["", "a b", "x\r\nSet-Cookie: a", "ü", &"a".repeat(65)] {
            let got = accept(Some(bad));
            assert_ne!(got, bad);
            assert!(acceptable(&got), "{got}");
        }
        assert_ne!(generate(), generate());
    }

    #[tokio::test]
    async fn one_request_keeps_one_id() {
        let (a, b) = scope(None, async { (current(), current()) }).await;
        assert_eq!(a, b);
        let given = scope(Some("given".into()), async { current() }).await;
        assert_eq!(given, "given");
        assert_ne!(current(), current(), "outside a request every call is new");
    }
}
