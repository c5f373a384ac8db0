//! Trace context a client may hand in.

/// A client's W3C `traceparent` header, if it is one
/// (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, ids not all
/// zero); anything else is dropped rather than copied into events.
pub fn traceparent(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = matches!(parts[..], [version, trace, parent, flags]
        if hex(version, 2) && version != "ff" && hex(trace, 32) && hex(parent, 16) && hex(flags, 2)
            && trace.bytes().any(|b| b != b'0') && parent.bytes().any(|b| b != b'0'));
    valid.then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::traceparent;

    fn of(value: &str) -> Option<String> {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("traceparent", value.parse().unwrap());
        traceparent(&headers)
    }

    #[test]
    fn only_w3c_traceparents_are_kept() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(of(ok).as_deref(), Some(ok));
        for bad in [
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "'; DROP TABLE x; --",
            &format!("00-{}-00f067aa0ba902b7-01", "a".repeat(5000)),
        ] {
            assert_eq!(of(bad), None, "{bad}");
        }
    }
}
