//! What the send path accepts as message content and head: only JSON that
//! every supported database stores as it is. Whatever passes here, the store
//! pipeline can write (MariaDB's `json_valid` CHECK, MySQL 8's JSON type).
//!
//! And what the send path reads out of them for the month table's columns
//! (seed 000 §3.1) — the message type, the users it mentions, whether it
//! mentions everyone, the message it replies to and how many files it
//! carries — from what Tinode clients send ([`derive`]): Drafty entities
//! (`MN` mentions, `IM`/`AU`/`VD`/`EX` attachments, `VC` calls) and the
//! head's `reply`, `forwarded`, `mime` and `webrtc`.

use serde_json::Value;

use crate::references::files::FileKind;

/// Deepest nesting of arrays and objects accepted in a content or head.
/// MariaDB's `json_valid` refuses 32 levels and MySQL 8 refuses 101, so 24
/// leaves room below both; Tinode drafty content needs 4 or 5.
pub const MAX_JSON_DEPTH: usize = 24;

/// Why a content or head is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContentError {
    #[error("{what} is not valid JSON: {why}")]
    Invalid { what: &'static str, why: String },
    #[error("{what} nests deeper than {MAX_JSON_DEPTH} levels")]
    TooDeep { what: &'static str },
    #[error("{what} must be a JSON object")]
    NotAnObject { what: &'static str },
    #[error("head.{field} {why}")]
    BadHead {
        field: &'static str,
        why: &'static str,
    },
    #[error("a message mentions at most {MAX_MENTIONS} users")]
    TooManyMentions,
}

/// Most distinct users one message may mention (`@all` aside).
pub const MAX_MENTIONS: usize = 100;

/// The Drafty mime type (Tinode's `head.mime` of formatted content).
const DRAFTY_MIME: &str = "text/x-drafty";

/// What a message's content and head say about it (seed 000 §3.1 columns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    /// `text`; `image`, `audio`, `video` or `file` after its first
    /// attachment; `call` for a video call (`head.webrtc`, a `VC` entity).
    pub msg_type: &'static str,
    /// Users named by `MN` entities (`val` a user id, `usr<uid>`), each once,
    /// in order, never the sender; none in a forwarded message (its entities
    /// are the original's).
    pub mentioned: Vec<i64>,
    /// An `MN` entity with `val` `all` (`@all`, as Tinode's Drafty parser
    /// makes it from typed text). Only asked for: the send path grants it
    /// to owners and admins of a group.
    pub mentions_all: bool,
    /// `head.reply`: the seq of the message this one answers.
    pub reply_seq: Option<i64>,
    /// Attachment entities (`IM`, `AU`, `VD`, `EX`).
    pub file_count: i32,
}

/// Reads [`Derived`] from a message's content (JSON text) and head (a JSON
/// object's text, already [`check`]ed). A malformed `head.reply`,
/// `head.forwarded` or `head.mime`, or more than [`MAX_MENTIONS`] mentioned
/// users, is refused; content that is not Drafty (a plain string, another
/// `head.mime`) is plain text.
pub fn derive(content: &str, head: Option<&str>, sender: i64) -> Result<Derived, ContentError> {
    let head: serde_json::Map<String, Value> = match head {
        Some(h) => serde_json::from_str(h).map_err(|e| ContentError::Invalid {
            what: "head",
            why: e.to_string(),
        })?,
        None => serde_json::Map::new(),
    };
    let reply_seq = reply_of(&head)?;
    let forwarded = match head.get("forwarded") {
        None | Some(Value::Null) => false,
        Some(Value::String(_)) => true,
        Some(_) => {
            return Err(ContentError::BadHead {
                field: "forwarded",
                why: "must be text (\"topic:seq\")",
            })
        }
    };
    let drafty = match head.get("mime") {
        None | Some(Value::Null) => true,
        Some(Value::String(m)) => m == DRAFTY_MIME,
        Some(_) => {
            return Err(ContentError::BadHead {
                field: "mime",
                why: "must be text",
            })
        }
    };
    let mut derived = Derived {
        msg_type: "text",
        mentioned: Vec::new(),
        mentions_all: false,
        reply_seq,
        file_count: 0,
    };
    let mut call = head.get("webrtc").is_some_and(|v| !v.is_null());
    let mut first_file: Option<FileKind> = None;
    let entities = if drafty {
        serde_json::from_str::<Value>(content)
            .ok()
            .and_then(|c| c.get("ent").and_then(Value::as_array).cloned())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    for entity in &entities {
        let Some(tp) = entity.get("tp").and_then(Value::as_str) else {
            continue;
        };
        if let Some(kind) = FileKind::of_entity(tp) {
            derived.file_count = derived.file_count.saturating_add(1);
            first_file.get_or_insert(kind);
            continue;
        }
        match tp {
            "VC" => call = true,
            "MN" if !forwarded => {
                let val = entity
                    .get("data")
                    .and_then(|d| d.get("val"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if val == "all" {
                    derived.mentions_all = true;
                } else if let Some(uid) = crate::tinode::parse_user_id(val) {
                    if uid != sender && !derived.mentioned.contains(&uid) {
                        if derived.mentioned.len() == MAX_MENTIONS {
                            return Err(ContentError::TooManyMentions);
                        }
                        derived.mentioned.push(uid);
                    }
                }
                // Anything else (`@alice` typed as text) names no user id.
            }
            _ => {}
        }
    }
    derived.msg_type = match (call, first_file) {
        (true, _) => "call",
        (false, Some(kind)) => kind.as_str(),
        (false, None) => "text",
    };
    Ok(derived)
}

/// The seq `head.reply` names, if any (a malformed one refused as in
/// [`derive`]).
pub fn replied_seq(head: Option<&str>) -> Result<Option<i64>, ContentError> {
    let Some(head) = head else { return Ok(None) };
    let head: serde_json::Map<String, Value> =
        serde_json::from_str(head).map_err(|_| ContentError::NotAnObject { what: "head" })?;
    reply_of(&head)
}

fn reply_of(head: &serde_json::Map<String, Value>) -> Result<Option<i64>, ContentError> {
    match head.get("reply") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => seq_of(v).map(Some).ok_or(ContentError::BadHead {
            field: "reply",
            why: "must be the seq of a message of this topic (\"123\")",
        }),
    }
}

/// A positive seq given as Tinode does (`"123"`) or as a number.
fn seq_of(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
    .filter(|seq| *seq > 0)
}

/// Checks a message's content (any JSON value) and head (a JSON object).
pub fn check(content: &str, head: Option<&str>) -> Result<(), ContentError> {
    check_json("content", content)?;
    if let Some(head) = head {
        check_json("head", head)?;
        if !head.trim_start().starts_with('{') {
            return Err(ContentError::NotAnObject { what: "head" });
        }
    }
    Ok(())
}

/// `text` must parse as JSON (serde_json refuses unpaired surrogates and
/// numbers out of range) and nest at most [`MAX_JSON_DEPTH`] levels.
fn check_json(what: &'static str, text: &str) -> Result<(), ContentError> {
    // Depth first: serde_json's own recursion limit (128) would otherwise
    // answer for very deep input with a less helpful message.
    if depth(text) > MAX_JSON_DEPTH {
        return Err(ContentError::TooDeep { what });
    }
    serde_json::from_str::<serde_json::Value>(text).map_err(|e| ContentError::Invalid {
        what,
        why: e.to_string(),
    })?;
    Ok(())
}

/// The deepest nesting of `[`/`{` outside strings (JSON text assumed; a
/// malformed text is refused by the parse that follows).
fn depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Takes `client_mid` out of a pub head (it is an idempotency key, never
/// stored or delivered); returns it and the remaining head as JSON text.
pub fn split_head(
    head: Option<serde_json::Map<String, Value>>,
) -> (Option<String>, Option<String>) {
    let Some(mut head) = head else {
        return (None, None);
    };
    let cmid = head.remove("client_mid").and_then(|v| match v {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    });
    let rest = (!head.is_empty()).then(|| serde_json::Value::Object(head).to_string());
    (cmid, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn nesting_up_to_the_limit_is_accepted_and_one_more_is_refused() {
        assert_eq!(check(&nested(MAX_JSON_DEPTH), None), Ok(()));
        assert_eq!(
            check(&nested(MAX_JSON_DEPTH + 1), None),
            Err(ContentError::TooDeep { what: "content" })
        );
        assert!(check(&nested(40), None).is_err());
        assert!(check(&nested(200), None).is_err());
    }

    #[test]
    fn brackets_inside_strings_do_not_count() {
        let text = format!("{{\"txt\":\"{}\"}}", "[{".repeat(100));
        assert_eq!(check(&text, None), Ok(()));
        assert_eq!(depth(r#"["a\"[[[", {"b": [1]}]"#), 3);
    }

    #[test]
    fn unpaired_surrogates_and_out_of_range_numbers_are_refused() {
        assert!(matches!(
            check(r#""\ud800""#, None),
            Err(ContentError::Invalid { .. })
        ));
        assert!(matches!(
            check(r#"{"txt":"a\udc00b"}"#, None),
            Err(ContentError::Invalid { .. })
        ));
        assert!(matches!(
            check("[1e400]", None),
            Err(ContentError::Invalid { .. })
        ));
        assert_eq!(check(r#""\ud83d\ude00 ok""#, None), Ok(()));
    }

    #[test]
    fn a_head_must_be_a_valid_object() {
        assert_eq!(check("\"hi\"", Some(r#"{"mime":"text/x-drafty"}"#)), Ok(()));
        assert_eq!(
            check("\"hi\"", Some("[1]")),
            Err(ContentError::NotAnObject { what: "head" })
        );
        assert_eq!(
            check(
                "\"hi\"",
                Some(&format!("{{\"a\":{}}}", nested(MAX_JSON_DEPTH)))
            ),
            Err(ContentError::TooDeep { what: "head" })
        );
        assert!(check("not json", None).is_err());
    }

    /// A Drafty text with `ents` as its entities.
    fn drafty(ents: &[Value]) -> String {
        serde_json::json!({"txt": "x", "fmt": [], "ent": ents}).to_string()
    }

    fn mention(val: &str) -> Value {
        serde_json::json!({"tp": "MN", "data": {"val": val}})
    }

    #[test]
    fn mentions_are_user_ids_of_mn_entities_once_each_never_the_sender() {
        let content = drafty(&[
            mention("usr7"),
            mention("usr9"),
            mention("usr7"),
            mention("usr1"),
            mention("alice"),
            mention("usr0"),
            mention("usrx"),
            serde_json::json!({"tp": "LN", "data": {"url": "http://a"}}),
        ]);
        let d = derive(&content, Some(r#"{"mime":"text/x-drafty"}"#), 1).unwrap();
        assert_eq!(d.mentioned, vec![7, 9]);
        assert!(!d.mentions_all);
        assert_eq!((d.msg_type, d.file_count, d.reply_seq), ("text", 0, None));
        // Plain text and other mime types carry no entities.
        assert_eq!(
            derive("\"@usr7\"", None, 1).unwrap().mentioned,
            Vec::<i64>::new()
        );
        let other = derive(&content, Some(r#"{"mime":"text/plain"}"#), 1).unwrap();
        assert!(other.mentioned.is_empty());
    }

    #[test]
    fn at_all_is_asked_for_and_a_forward_mentions_nobody() {
        let content = drafty(&[mention("all"), mention("usr5")]);
        let d = derive(&content, None, 1).unwrap();
        assert!(d.mentions_all);
        assert_eq!(d.mentioned, vec![5]);
        let fwd = derive(&content, Some(r#"{"forwarded":"grpX:3"}"#), 1).unwrap();
        assert!(!fwd.mentions_all && fwd.mentioned.is_empty());
        assert_eq!(
            derive(&content, Some(r#"{"forwarded":3}"#), 1),
            Err(ContentError::BadHead {
                field: "forwarded",
                why: "must be text (\"topic:seq\")"
            })
        );
    }

    #[test]
    fn too_many_mentions_are_refused() {
        let ents: Vec<Value> = (2..=(MAX_MENTIONS as i64 + 1))
            .map(|u| mention(&format!("usr{u}")))
            .collect();
        assert_eq!(
            derive(&drafty(&ents), None, 1).unwrap().mentioned.len(),
            MAX_MENTIONS
        );
        let mut more = ents.clone();
        more.push(mention("usr100000"));
        assert_eq!(
            derive(&drafty(&more), None, 1),
            Err(ContentError::TooManyMentions)
        );
        // The sender and repeats do not count.
        more.pop();
        more.push(mention("usr1"));
        more.push(mention("usr2"));
        assert!(derive(&drafty(&more), None, 1).is_ok());
    }

    #[test]
    fn a_reply_names_a_positive_seq() {
        for (head, seq) in [(r#"{"reply":"12"}"#, 12), (r#"{"reply":12}"#, 12)] {
            assert_eq!(
                derive("\"hi\"", Some(head), 1).unwrap().reply_seq,
                Some(seq)
            );
        }
        for head in [
            r#"{"reply":"0"}"#,
            r#"{"reply":"-3"}"#,
            r#"{"reply":"12a"}"#,
            r#"{"reply":""}"#,
            r#"{"reply":1.5}"#,
            r#"{"reply":[1]}"#,
            r#"{"reply":"99999999999999999999"}"#,
        ] {
            assert!(
                matches!(
                    derive("\"hi\"", Some(head), 1),
                    Err(ContentError::BadHead { field: "reply", .. })
                ),
                "{head}"
            );
        }
        assert_eq!(
            derive("\"hi\"", Some(r#"{"reply":null}"#), 1)
                .unwrap()
                .reply_seq,
            None
        );
    }

    #[test]
    fn the_type_is_the_first_attachment_or_a_call() {
        let image = serde_json::json!({"tp": "IM", "data": {"mime": "image/png"}});
        let file = serde_json::json!({"tp": "EX", "data": {"name": "a.pdf"}});
        let d = derive(
            &drafty(&[image.clone(), file.clone(), mention("usr3")]),
            None,
            1,
        )
        .unwrap();
        assert_eq!((d.msg_type, d.file_count), ("image", 2));
        let d = derive(&drafty(&[file]), None, 1).unwrap();
        assert_eq!((d.msg_type, d.file_count), ("file", 1));
        let call = serde_json::json!({"tp": "VC", "data": {}});
        assert_eq!(derive(&drafty(&[call]), None, 1).unwrap().msg_type, "call");
        assert_eq!(
            derive("\"\"", Some(r#"{"webrtc":"started"}"#), 1)
                .unwrap()
                .msg_type,
            "call"
        );
        assert_eq!(
            derive("\"x\"", Some(r#"{"mime":5}"#), 1),
            Err(ContentError::BadHead {
                field: "mime",
                why: "must be text"
            })
        );
    }
}
