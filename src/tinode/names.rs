//! Tinode's naming rules: user ids, group and one-to-one topic names, and
//! the name a client uses for a stored topic.

/// Tinode user id of a numeric uid: `usr<uid>`.
pub fn user_id(uid: i64) -> String {
    format!("usr{uid}")
}

/// Parses `usr<uid>`.
pub fn parse_user_id(s: &str) -> Option<i64> {
    s.strip_prefix("usr")?.parse().ok().filter(|u| *u > 0)
}

/// Group topic names: `grp` then 1–61 of `[A-Za-z0-9_-]`.
pub fn is_group_topic(topic: &str) -> bool {
    topic.len() > 3
        && topic.len() <= 64
        && topic.starts_with("grp")
        && topic[3..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The one topic of a pair of users (Tinode's naming): `p2p` and the
/// unpadded base64url of both ids as 8 little-endian bytes, smaller first.
/// The same for both sides; clients address it as `usr<peer>`.
pub fn p2p_topic(a: i64, b: i64) -> String {
    use base64::Engine;
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&(lo as u64).to_le_bytes());
    bytes[8..].copy_from_slice(&(hi as u64).to_le_bytes());
    format!(
        "p2p{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// The two users of a p2p topic name, if it is one.
pub fn parse_p2p_topic(topic: &str) -> Option<(i64, i64)> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(topic.strip_prefix("p2p")?)
        .ok()?;
    let bytes: [u8; 16] = bytes.try_into().ok()?;
    let lo = u64::from_le_bytes(bytes[..8].try_into().ok()?) as i64;
    let hi = u64::from_le_bytes(bytes[8..].try_into().ok()?) as i64;
    (lo > 0 && hi > lo && p2p_topic(lo, hi) == topic).then_some((lo, hi))
}

/// Whether a name is a p2p topic.
pub fn is_p2p_topic(topic: &str) -> bool {
    parse_p2p_topic(topic).is_some()
}

/// A conversation topic imstream stores: a group or a p2p topic.
pub fn is_conversation_topic(topic: &str) -> bool {
    is_group_topic(topic) || is_p2p_topic(topic)
}

/// The other user of p2p `topic` as seen by `me`.
pub fn p2p_peer(topic: &str, me: i64) -> Option<i64> {
    match parse_p2p_topic(topic)? {
        (a, b) if a == me => Some(b),
        (a, b) if b == me => Some(a),
        _ => None,
    }
}

/// The stored topic a client means: `usr<peer>` is the p2p topic of the
/// pair; a `p2p…` name must include the caller; group names are as is.
pub fn resolve_topic(client: &str, me: i64) -> Option<String> {
    if let Some(peer) = parse_user_id(client) {
        return (peer != me).then(|| p2p_topic(me, peer));
    }
    if client.starts_with("p2p") {
        return p2p_peer(client, me).map(|_| client.to_string());
    }
    Some(client.to_string())
}

/// The name a client sees for a stored topic: `usr<peer>` for p2p.
pub fn client_topic(topic: &str, me: i64) -> String {
    match p2p_peer(topic, me) {
        Some(peer) => user_id(peer),
        None => topic.to_string(),
    }
}
