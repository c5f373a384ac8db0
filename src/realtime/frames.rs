//! Tinode server frames built once per event and shared by every session
//! that receives them (`{data}`, `{info}`, `{pres}`).

use serde_json::{json, Value};

use crate::store::message::StoredMessage;
use crate::tinode;

/// JSON text as a value; anything unparsable as a string.
pub fn json_value(text: &Option<String>) -> Option<Value> {
    text.as_ref()
        .map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.clone())))
}

/// A message as Tinode's `{data}` body.
pub fn data_body(topic: &str, m: &StoredMessage) -> Value {
    let mut d = json!({
        "topic": topic,
        "from": tinode::user_id(m.from),
        "ts": tinode::timestamp_ms(m.ts),
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
    let mut info = json!({"topic": topic, "from": tinode::user_id(from), "what": what});
    if let Some(seq) = seq {
        info["seq"] = json!(seq);
    }
    json!({ "info": info }).to_string()
}

/// `{"pres": {topic, src, what}}` as text.
pub fn pres_frame(topic: &str, src: &str, what: &str) -> String {
    json!({"pres": {"topic": topic, "src": src, "what": what}}).to_string()
}

/// `{ctrl 205 evicted}` for a session removed from a topic.
pub fn evicted_frame(topic: &str) -> String {
    json!({"ctrl": {"topic": topic, "code": 205, "text": "evicted", "ts": tinode::now()}})
        .to_string()
}

/// `{"pres": {"topic": "me", "src": src, "what": what, "seq": seq}}` as text
/// (the user's own read/recv cursor in conversation `src`).
pub fn pres_me_seq_frame(src: &str, what: &str, seq: i64) -> String {
    json!({"pres": {"topic": "me", "src": src, "what": what, "seq": seq}}).to_string()
}

/// `{"pres": {"topic": "me", "src": src, "what": "msg", "seq": seq, "act":
/// sender}}`: a new message in conversation `src` (clients count it unread
/// unless `act` is the user themself).
pub fn pres_me_msg_frame(src: &str, seq: i64, from: i64) -> String {
    json!({"pres": {"topic": "me", "src": src, "what": "msg", "seq": seq, "act": tinode::user_id(from)}})
        .to_string()
}

/// `{pres topic="me" what="msg"}` with no seq, about a chat the user's
/// clients may not know yet (added to a group, invited): Tinode clients
/// fetch its entry of the chat list (`{get me sub topic}`), as for the
/// first message of a new chat.
pub fn pres_me_new_chat_frame(src: &str, actor: &str) -> String {
    json!({"pres": {"topic": "me", "src": src, "what": "msg", "act": actor}}).to_string()
}

/// `{"pres": {"topic": "me", "src": topic, "what": what}}` as text.
pub fn pres_me_frame(topic: &str, what: &str) -> String {
    json!({"pres": {"topic": "me", "src": topic, "what": what}}).to_string()
}

/// `{pres what="del"}` for messages deleted for everyone: the delete id
/// (`clear`) and the ranges (`hi` left out for a single message).
pub fn pres_del_frame(topic: &str, src: &str, clear: i32, ranges: &[(i64, i64)]) -> String {
    let delseq: Vec<Value> = ranges
        .iter()
        .map(|(low, hi)| {
            if *hi == low + 1 {
                json!({"low": low})
            } else {
                json!({"low": low, "hi": hi})
            }
        })
        .collect();
    json!({"pres": {"topic": topic, "src": src, "what": "del", "clear": clear, "delseq": delseq}})
        .to_string()
}

/// Tinode access mode of a group member: owners `JRWPASDO`, admins
/// `JRWPASD`, members `JRWPS`; a muted member lacks `W`; `N` is none.
pub fn access_mode(role: Option<crate::groups::Role>, muted: bool) -> String {
    use crate::groups::Role;
    let mode = match role {
        None => return "N".into(),
        Some(Role::Owner) => "JRWPASDO",
        Some(Role::Admin) => "JRWPASD",
        Some(Role::Member) => "JRWPS",
    };
    if muted {
        mode.replace('W', "")
    } else {
        mode.to_string()
    }
}

/// `{pres what="acs"}` about `uid` in `topic` (seen by the topic's
/// sessions), with the new mode as Tinode's `dacs` and imstream's `role`.
pub fn pres_acs_frame(topic: &str, uid: i64, mode: &str, role: Option<&str>) -> String {
    let mut pres = json!({"topic": topic, "src": tinode::user_id(uid), "what": "acs",
        "dacs": {"want": mode, "given": mode}});
    if let Some(role) = role {
        pres["role"] = json!(role);
    }
    json!({ "pres": pres }).to_string()
}

/// What an invitation gives (a member's access once wanted).
pub const INVITED_GIVEN: &str = "JRWPS";
/// What an invited user wants until they answer, as Tinode keeps it: join
/// and presence only, so their mode (want ∩ given) reads nothing, and the
/// app lists the group and offers Accept / Ignore / Block.
pub const INVITED_WANT: &str = "JP";

/// `{pres topic="me" what="acs"}` telling a user their mode in `topic` changed.
pub fn pres_me_acs_frame(topic: &str, mode: &str, role: Option<&str>) -> String {
    let mut pres = json!({"topic": "me", "src": topic, "what": "acs",
        "dacs": {"want": mode, "given": mode}});
    if let Some(role) = role {
        pres["role"] = json!(role);
    }
    json!({ "pres": pres }).to_string()
}
