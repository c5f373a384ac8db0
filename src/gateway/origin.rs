//! Which web pages may open the WebSocket. A browser sends `Origin` with
//! every WebSocket handshake and lets any page open a socket to any host,
//! so without this check any site a logged-in user visits could talk to
//! the gateway as that user's browser. Clients that send no `Origin` (SDKs,
//! bots, other servers) are not browsers running someone else's page, and
//! are let through.

/// Whether a handshake with `origin` (the header, if sent) to `host` (the
/// `Host` header) is allowed: the gateway's own origin (the page it
/// serves) always, plus `allowed` (`gateway.allowed_origins`; `*`: any).
/// Behind a proxy that rewrites `Host`, list the public origin.
pub fn allowed(origin: Option<&str>, host: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    let origin = origin.trim_end_matches('/');
    let same = origin
        .split_once("://")
        .is_some_and(|(_, o)| host.is_some_and(|h| h.eq_ignore_ascii_case(o)));
    same || allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_origin_by_default() {
        let none: Vec<String> = Vec::new();
        assert!(allowed(None, Some("gw:6060"), &none), "non-browser client");
        assert!(allowed(Some("http://gw:6060"), Some("gw:6060"), &none));
        assert!(allowed(
            Some("https://chat.example.com"),
            Some("chat.example.com"),
            &none
        ));
        assert!(!allowed(
            Some("http://evil.example"),
            Some("gw:6060"),
            &none
        ));
        assert!(!allowed(Some("http://gw:6061"), Some("gw:6060"), &none));
        assert!(!allowed(Some("null"), Some("gw:6060"), &none));
    }

    #[test]
    fn configured_list() {
        let list = vec!["https://chat.example.com".to_string()];
        assert!(allowed(
            Some("https://chat.example.com"),
            Some("gw:6060"),
            &list
        ));
        assert!(allowed(Some("http://gw:6060"), Some("gw:6060"), &list));
        assert!(!allowed(
            Some("http://evil.example"),
            Some("gw:6060"),
            &list
        ));
        assert!(allowed(Some("http://anything"), None, &["*".to_string()]));
    }
}
