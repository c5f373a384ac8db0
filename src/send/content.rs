//! What the send path accepts as message content and head: only JSON that
//! every supported database stores as it is. Whatever passes here, the store
//! pipeline can write (MariaDB's `json_valid` CHECK, MySQL 8's JSON type).

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
}
