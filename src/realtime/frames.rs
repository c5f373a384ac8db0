//! Tinode server frames built once per event and shared by every session
//! that receives them (`{data}`, `{info}`, `{pres}`).

use serde_json::{json, Value};

use crate::gateway::proto;
use crate::history::StoredMessage;

/// JSON text as a value; anything unparsable as a string.
pub fn json_value(text: &Option<String>) -> Option<Value> {
    text.as_ref()
        .map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.clone())))
}

/// A message as Tinode's `{data}` body.
pub fn data_body(topic: &str, m: &StoredMessage) -> Value {
    let mut d = json!({
        "topic": topic,
        "from": proto::user_id(m.from),
        "ts": proto::timestamp_ms(m.ts),
        "seq": m.seq,
        "content": json_value(&m.content).unwrap_or(Value::Null),
    });
    if let Some(head) = json_value(&m.head) {
        if head.as_object().is_some_and(|o| !o.is_empty()) {
            d["head"] = head;
        }
    }
    d
}

/// `{"data": …}` as text.
pub fn data_frame(topic: &str, m: &StoredMessage) -> String {
    json!({ "data": data_body(topic, m) }).to_string()
}

/// `{"info": {topic, from, what, seq?}}` as text.
pub fn info_frame(topic: &str, from: i64, what: &str, seq: Option<i64>) -> String {
    let mut info = json!({"topic": topic, "from": proto::user_id(from), "what": what});
    if let Some(seq) = seq {
        info["seq"] = json!(seq);
    }
    json!({ "info": info }).to_string()
}

/// `{"pres": {topic, src, what}}` as text.
pub fn pres_frame(topic: &str, src: &str, what: &str) -> String {
    json!({"pres": {"topic": topic, "src": src, "what": what}}).to_string()
}
