//! What every user-given field may hold, in one place (issue 38): the
//! limits of the columns the projections store it in. A command is checked
//! against them at the door, so nothing is acknowledged that a projection
//! would refuse (a record a projection refuses is a dead letter: an
//! acknowledged change the read models never show). The migrations' column
//! sizes are these; a unit test keeps them the same.

/// A group's name (`im_groups.name VARCHAR(128)`), in characters.
pub const GROUP_NAME_CHARS: usize = 128;
/// A user's full name (`im_user_profiles.full_name VARCHAR(128)`).
pub const FULL_NAME_CHARS: usize = 128;
/// A photo: a reference or a small inline `data:image/…;base64,` URI
/// (`photo VARCHAR(8192)`, users and groups).
pub const PHOTO_CHARS: usize = 8192;
/// A user's note (`im_user_profiles.note VARCHAR(512)`).
pub const NOTE_CHARS: usize = 512;
/// A group's description (`im_groups.description VARCHAR(1024)`).
pub const DESCRIPTION_CHARS: usize = 1024;
/// A user's `private` of one chat, as JSON text
/// (`im_chat_settings.private VARCHAR(2048)`).
pub const CHAT_PRIVATE_CHARS: usize = 2048;
/// A report's reason and an operator's resolution note (`VARCHAR(500)`).
pub const REASON_CHARS: usize = 500;
/// A client message id (`client_msg_id`), in bytes.
pub const CLIENT_MSG_ID_BYTES: usize = 64;

/// The highest seq a request may name: 2^53 - 1, the largest integer a
/// web client's JSON numbers hold exactly. A seq is counted from 1 per
/// topic, so no message ever has one above it; a request naming one past
/// it is malformed (and `seq + 1` never overflows).
pub const SEQ_MAX: i64 = (1 << 53) - 1;

/// A seq as a request names it in text (a path segment, `":<seq>"`):
/// decimal digits without a sign or leading zero (one spelling per seq),
/// `1..=SEQ_MAX`, else `None`.
pub fn seq_text(text: &str) -> Option<i64> {
    if text.starts_with('0') || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>()
        .ok()
        .filter(|s| (1..=SEQ_MAX).contains(s))
}

/// The latest instant a `DATETIME(3)` column holds (9999-12-31T23:59:59.999Z):
/// a mute until later than this could not be stored.
pub const LATEST_MS: i64 = 253_402_300_799_999;
/// The earliest (1000-01-01T00:00:00Z).
pub const EARLIEST_MS: i64 = -30_610_224_000_000;

/// Why a field was refused: the field's name and what it may hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {why}")]
pub struct FieldError {
    pub field: &'static str,
    pub why: String,
}

/// `value` is at most `max` characters.
pub fn chars(field: &'static str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.chars().count() > max {
        return Err(FieldError {
            field,
            why: format!("must be at most {max} characters"),
        });
    }
    Ok(())
}

/// An instant a `DATETIME(3)` column can hold.
pub fn instant_ms(field: &'static str, ms: i64) -> Result<(), FieldError> {
    if !(EARLIEST_MS..=LATEST_MS).contains(&ms) {
        return Err(FieldError {
            field,
            why: "must be between the years 1000 and 9999".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn seqs_in_text_stop_at_the_largest_exact_json_integer() {
        assert_eq!(super::seq_text("1"), Some(1));
        assert_eq!(super::seq_text("9007199254740991"), Some(super::SEQ_MAX));
        for bad in [
            "0",
            "-1",
            "9007199254740992",
            "9223372036854775807",
            "99999999999999999999",
            "",
            "1e3",
            " 1",
            "+5",
            "05",
            "5 ",
        ] {
            assert_eq!(super::seq_text(bad), None, "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn the_limits_are_the_columns() {
        let sql = [
            include_str!("../migrations/tenant/0003_groups_members_subscriptions.sql"),
            include_str!("../migrations/tenant/0008_conversations_and_profiles.sql"),
            include_str!("../migrations/tenant/0019_message_references.sql"),
            include_str!("../migrations/tenant/0062_inline_photos.sql"),
            include_str!("../migrations/tenant/0063_chat_settings.sql"),
        ]
        .concat();
        for (column, n) in [
            ("name VARCHAR", GROUP_NAME_CHARS),
            ("full_name VARCHAR", FULL_NAME_CHARS),
            ("photo VARCHAR", PHOTO_CHARS),
            ("note VARCHAR", NOTE_CHARS),
            ("description VARCHAR", DESCRIPTION_CHARS),
            ("reason VARCHAR", REASON_CHARS),
            ("private VARCHAR", CHAT_PRIVATE_CHARS),
        ] {
            assert!(
                sql.contains(&format!("{column}({n})")),
                "{column}({n}) is not what the migrations make"
            );
        }
        assert_eq!(
            chrono::DateTime::from_timestamp_millis(LATEST_MS)
                .unwrap()
                .to_rfc3339(),
            "9999-12-31T23:59:59.999+00:00"
        );
        assert_eq!(
            chrono::DateTime::from_timestamp_millis(EARLIEST_MS)
                .unwrap()
                .to_rfc3339(),
            "1000-01-01T00:00:00+00:00"
        );
    }

    #[test]
    fn at_the_limit_is_fine_and_one_past_is_not() {
        let at = "名".repeat(GROUP_NAME_CHARS);
        assert!(chars("name", &at, GROUP_NAME_CHARS).is_ok());
        let past = format!("{at}x");
        assert_eq!(
            chars("name", &past, GROUP_NAME_CHARS)
                .unwrap_err()
                .to_string(),
            "name must be at most 128 characters"
        );
        assert!(instant_ms("until", LATEST_MS).is_ok());
        assert!(instant_ms("until", LATEST_MS + 1).is_err());
        assert!(instant_ms("until", i64::MAX).is_err());
        assert!(instant_ms("until", EARLIEST_MS - 1).is_err());
    }
}
