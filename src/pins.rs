//! A chat's pinned messages (issue 40: Tinode 0.25's `aux.pins`): a short
//! list of seqs, newest pin first, kept whole per topic in
//! `im_topic_pins`. Written by the store pipeline from `PinsChanged`
//! events and, before it answers, by the gateway that produced one; read
//! by `{get what="aux"}`.

use sqlx::mysql::MySqlPool;

/// Most messages a chat keeps pinned (the web app's own limit).
pub const MAX_PINS: usize = 5;

/// Stores `pins` as the chat's whole list (none: the row goes).
/// Idempotent: the last event's list stands.
pub async fn write(pool: &MySqlPool, topic: &str, pins: &[i64]) -> sqlx::Result<()> {
    if pins.is_empty() {
        sqlx::query("DELETE FROM im_topic_pins WHERE topic = ?")
            .bind(topic)
            .execute(pool)
            .await?;
        return Ok(());
    }
    let text = serde_json::to_string(pins).expect("seqs serialize");
    sqlx::query(
        "INSERT INTO im_topic_pins (topic, pins) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE pins = VALUES(pins)",
    )
    .bind(topic)
    .bind(text)
    .execute(pool)
    .await?;
    Ok(())
}

/// The chat's pinned seqs (empty when none).
pub async fn read(pool: &MySqlPool, topic: &str) -> sqlx::Result<Vec<i64>> {
    let text: Option<String> = sqlx::query_scalar("SELECT pins FROM im_topic_pins WHERE topic = ?")
        .bind(topic)
        .fetch_optional(pool)
        .await?;
    Ok(text
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default())
}

/// Tinode's `aux.pins` as a client sends it: an array of at most
/// [`MAX_PINS`] seqs in `1..=last` (duplicates dropped, order kept), or the
/// delete marker for none. `Err` names what is wrong.
pub fn parse(value: &serde_json::Value, last: i64) -> Result<Vec<i64>, String> {
    if value.as_str() == Some(crate::tinode::DEL_CHAR) || value.is_null() {
        return Ok(Vec::new());
    }
    let Some(items) = value.as_array() else {
        return Err("pins is an array of seqs".into());
    };
    let mut pins = Vec::with_capacity(items.len());
    for item in items {
        let seq = item
            .as_i64()
            .filter(|s| (1..=last).contains(s))
            .ok_or_else(|| format!("pins names a message that does not exist: {item}"))?;
        if !pins.contains(&seq) {
            pins.push(seq);
        }
    }
    if pins.len() > MAX_PINS {
        return Err(format!("at most {MAX_PINS} pinned messages"));
    }
    Ok(pins)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pins_are_existing_seqs_at_most_five() {
        assert_eq!(parse(&json!([3, 1, 3]), 10), Ok(vec![3, 1]));
        assert_eq!(parse(&json!("\u{2421}"), 10), Ok(vec![]));
        assert_eq!(parse(&json!([]), 10), Ok(vec![]));
        assert!(parse(&json!([11]), 10).is_err());
        assert!(parse(&json!([0]), 10).is_err());
        assert!(parse(&json!([1.5]), 10).is_err());
        assert!(parse(&json!("3"), 10).is_err());
        assert!(parse(&json!([1, 2, 3, 4, 5, 6]), 10).is_err());
        assert_eq!(parse(&json!([1, 2, 3, 4, 5]), 10).unwrap().len(), 5);
    }
}
