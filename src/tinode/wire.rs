//! Server-side wire basics: the protocol version, timestamps (RFC 3339 with
//! milliseconds and `Z`) and the `{ctrl}` builder.

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{json, Map, Value};

/// Protocol version the server speaks.
pub const VERSION: &str = "0.25";
/// Oldest client version accepted.
pub const MIN_VERSION: (u32, u32) = (0, 20);

/// Parses a client version like `0.25.3` into (major, minor).
pub fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor = parts.next().unwrap_or("0").trim().parse().ok()?;
    Some((major, minor))
}

/// `2026-07-04T10:00:00.123Z`
pub fn timestamp(t: DateTime<Utc>) -> String {
    // Not `format("%Y-…")`: that parses the pattern on every call, and a
    // chat list formats two per conversation.
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
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
    let mut params = params;
    if code >= 500 {
        // A server-side failure names its request (the detail is logged
        // under it, never shown).
        let p = params.get_or_insert_with(|| json!({}));
        if let Some(map) = p.as_object_mut() {
            map.entry("request_id")
                .or_insert_with(|| json!(crate::request_id::current()));
        }
    }
    if let Some(p) = params {
        c.insert("params".into(), p);
    }
    c.insert("code".into(), json!(code));
    c.insert("text".into(), json!(text));
    c.insert("ts".into(), json!(now()));
    json!({ "ctrl": c }).to_string()
}

/// Parses a client timestamp (`ims`: RFC 3339) into epoch ms.
pub fn parse_timestamp_ms(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// The seq a message's `head.replace` (`":123"`) names: the message it
/// replaces (an edit). `Err` for a `replace` of another shape.
pub fn replaced_seq(head: Option<&str>) -> Result<Option<i64>, ()> {
    let Some(head) = head else { return Ok(None) };
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(head) else {
        return Ok(None);
    };
    match map.get("replace") {
        None => Ok(None),
        Some(Value::String(r)) => r
            .strip_prefix(':')
            .and_then(crate::fields::seq_text)
            .map(Some)
            .ok_or(()),
        Some(_) => Err(()),
    }
}
