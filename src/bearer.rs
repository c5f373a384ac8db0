//! Bearer tokens of operator endpoints (the gateway's admin API, the
//! embedded registry's writes): read from `Authorization`, compared in time
//! that does not depend on where they differ.

use axum::http::HeaderMap;

/// The bearer token of an `Authorization` header.
pub fn token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Whether `presented` is `expected` (never true for an empty `expected`).
/// Both are hashed to one length first, then compared without branching.
pub fn matches(presented: &str, expected: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (
        Sha256::digest(presented.as_bytes()),
        Sha256::digest(expected.as_bytes()),
    );
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0 && !expected.is_empty()
}

/// Whether `headers` carry `expected` as their bearer token.
pub fn presented(headers: &HeaderMap, expected: &str) -> bool {
    token(headers).is_some_and(|t| matches(t, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_token_matches() {
        assert!(matches("abc", "abc"));
        assert!(!matches("abd", "abc"));
        assert!(!matches("", ""));
        assert!(!matches("abc", ""));
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer abc".parse().unwrap());
        assert!(presented(&h, "abc"));
        assert!(!presented(&h, "abcd"));
    }
}
