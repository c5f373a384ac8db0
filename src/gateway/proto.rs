//! The Tinode JSON protocol subset imstream speaks (see
//! shared/design/TINODE-PROTOCOL.md): client messages as types, server
//! messages as builders. Timestamps are RFC 3339 with milliseconds and `Z`.

use chrono::{DateTime, TimeZone, Utc};
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// Protocol version the server speaks.
pub const VERSION: &str = "0.25";
/// Oldest client version accepted.
pub const MIN_VERSION: (u32, u32) = (0, 20);

/// One client message; exactly one field is set.
#[derive(Debug, Default, Deserialize)]
pub struct ClientMsg {
    pub hi: Option<MsgHi>,
    pub login: Option<MsgLogin>,
    pub sub: Option<MsgSub>,
    #[serde(rename = "pub")]
    pub publish: Option<MsgPub>,
    pub get: Option<MsgGet>,
    pub leave: Option<MsgLeave>,
    pub note: Option<MsgNote>,
    pub del: Option<MsgDel>,
    pub set: Option<Value>,
    pub acc: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct MsgHi {
    pub id: Option<String>,
    pub ver: Option<String>,
    pub ua: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct MsgLogin {
    pub id: Option<String>,
    pub scheme: String,
    #[serde(default)]
    pub secret: String,
}

#[derive(Debug, Deserialize)]
pub struct MsgSub {
    pub id: Option<String>,
    pub topic: String,
    pub get: Option<GetQuery>,
}

#[derive(Debug, Deserialize)]
pub struct MsgPub {
    pub id: Option<String>,
    pub topic: String,
    #[serde(default)]
    pub noecho: bool,
    pub head: Option<Map<String, Value>>,
    pub content: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct GetQuery {
    #[serde(default)]
    pub what: String,
    pub data: Option<DataQuery>,
    pub del: Option<DataQuery>,
}

#[derive(Debug, Deserialize)]
pub struct MsgGet {
    pub id: Option<String>,
    pub topic: String,
    #[serde(flatten)]
    pub query: GetQuery,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct DataQuery {
    pub since: Option<i64>,
    pub before: Option<i64>,
    pub limit: Option<i64>,
    pub ranges: Option<Vec<SeqRangeMsg>>,
}

/// `[low, hi)`; a missing `hi` means one message.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct SeqRangeMsg {
    pub low: i64,
    pub hi: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct MsgLeave {
    pub id: Option<String>,
    pub topic: String,
    #[serde(default)]
    pub unsub: bool,
}

#[derive(Debug, Deserialize)]
pub struct MsgNote {
    pub topic: String,
    pub what: String,
    pub seq: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct MsgDel {
    pub id: Option<String>,
    pub topic: String,
    pub what: String,
    pub delseq: Option<Vec<SeqRangeMsg>>,
    #[serde(default)]
    pub hard: bool,
}

/// `2026-07-04T10:00:00.123Z`
pub fn timestamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

pub fn timestamp_ms(ms: i64) -> String {
    timestamp(
        Utc.timestamp_millis_opt(ms)
            .single()
            .unwrap_or_else(Utc::now),
    )
}

pub fn now() -> String {
    timestamp(Utc::now())
}

/// A `{ctrl}` message.
pub fn ctrl(
    id: Option<&str>,
    topic: Option<&str>,
    code: u16,
    text: &str,
    params: Option<Value>,
) -> String {
    let mut c = Map::new();
    if let Some(id) = id {
        c.insert("id".into(), json!(id));
    }
    if let Some(topic) = topic {
        c.insert("topic".into(), json!(topic));
    }
    if let Some(p) = params {
        c.insert("params".into(), p);
    }
    c.insert("code".into(), json!(code));
    c.insert("text".into(), json!(text));
    c.insert("ts".into(), json!(now()));
    json!({ "ctrl": c }).to_string()
}

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

/// Parses a client version like `0.25.3` into (major, minor).
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor = parts.next().unwrap_or("0").trim().parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sdk_messages() {
        let m: ClientMsg = serde_json::from_str(
            r#"{"hi":{"id":"83575","ver":"0.25.3","ua":"gw-test/1.0 (undefined); tinodejs/0.25.3","lang":"xx","platf":"web"}}"#,
        )
        .unwrap();
        assert_eq!(m.hi.unwrap().ver.as_deref(), Some("0.25.3"));
        let m: ClientMsg = serde_json::from_str(
            r#"{"pub":{"id":"4","topic":"grpX","noecho":true,"head":{"mime":"text/x-drafty","client_mid":"c1"},"content":"hi"}}"#,
        )
        .unwrap();
        let p = m.publish.unwrap();
        assert!(p.noecho);
        assert_eq!(p.head.unwrap()["client_mid"], "c1");
        let m: ClientMsg = serde_json::from_str(
            r#"{"get":{"id":"5","topic":"grpX","what":"data","data":{"ranges":[{"low":1,"hi":3}],"limit":3}}}"#,
        )
        .unwrap();
        let g = m.get.unwrap();
        assert_eq!(g.query.what, "data");
        assert_eq!(g.query.data.unwrap().ranges.unwrap()[0].hi, Some(3));
    }

    #[test]
    fn timestamps_have_milliseconds_and_z() {
        let t = timestamp_ms(1_790_000_000_123);
        assert_eq!(t.len(), 24);
        assert!(t.ends_with(".123Z"), "{t}");
    }

    #[test]
    fn names() {
        assert!(is_group_topic("grpAbc_9-x"));
        assert!(!is_group_topic("grp"));
        assert!(!is_group_topic("usrAbc"));
        assert!(!is_group_topic("grp a"));
        assert_eq!(parse_user_id("usr1001"), Some(1001));
        assert_eq!(parse_user_id("usr0"), None);
        assert_eq!(parse_version("0.25.3"), Some((0, 25)));
        assert_eq!(parse_version("x"), None);
    }

    #[test]
    fn p2p_names_are_one_per_pair() {
        let t = p2p_topic(7, 1001);
        assert_eq!(t, p2p_topic(1001, 7));
        assert_eq!(t.len(), 25);
        assert_eq!(parse_p2p_topic(&t), Some((7, 1001)));
        assert_eq!(p2p_peer(&t, 7), Some(1001));
        assert_eq!(p2p_peer(&t, 1001), Some(7));
        assert_eq!(p2p_peer(&t, 8), None);
        assert_eq!(resolve_topic("usr1001", 7).as_deref(), Some(t.as_str()));
        assert_eq!(resolve_topic("usr7", 7), None, "no p2p topic with oneself");
        assert_eq!(resolve_topic(&t, 8), None, "not a party");
        assert_eq!(client_topic(&t, 7), "usr1001");
        assert_eq!(client_topic("grpX", 7), "grpX");
        assert!(parse_p2p_topic("p2pAAAA").is_none());
        assert!(is_conversation_topic(&t) && is_conversation_topic("grpX"));
    }
}

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
mod traceparent_tests {
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
