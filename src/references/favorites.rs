//! A user's favorites: saved `(topic, seq)` references, newest saved
//! first. The relations pipeline applies `FavoriteAdded` / `FavoriteRemoved`
//! (user events, in order per user, so replay ends where live did); the
//! gateway lists them and resolves each message for the user.

use sqlx::mysql::MySqlPool;

/// Largest page of favorites a client may ask for.
pub const MAX_LIMIT: i64 = 50;

/// One saved reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Favorite {
    pub topic: String,
    pub seq: i64,
    /// Epoch ms, when it was saved.
    pub saved_at: i64,
}

/// Where a page of favorites ends: the last entry's `(saved_at, topic,
/// seq)`, written `ms.seq.topic` (topics hold no dots).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub saved_at: i64,
    pub seq: i64,
    pub topic: String,
}

impl Cursor {
    pub fn of(f: &Favorite) -> Self {
        Self {
            saved_at: f.saved_at,
            seq: f.seq,
            topic: f.topic.clone(),
        }
    }

    pub fn text(&self) -> String {
        format!("{}.{}.{}", self.saved_at, self.seq, self.topic)
    }

    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '.');
        let saved_at = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        let topic = parts.next()?.to_string();
        crate::tinode::is_conversation_topic(&topic).then_some(Self {
            saved_at,
            seq,
            topic,
        })
    }
}

/// Saves a reference (saving it again keeps the first time).
pub async fn add(pool: &MySqlPool, uid: i64, topic: &str, seq: i64, at: i64) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO im_favorites (uid, topic, seq, created_at) VALUES (?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE seq = seq",
    )
    .bind(uid)
    .bind(topic)
    .bind(seq)
    .bind(crate::store::writer::naive(at))
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn remove(pool: &MySqlPool, uid: i64, topic: &str, seq: i64) -> sqlx::Result<()> {
    sqlx::query("DELETE FROM im_favorites WHERE uid = ? AND topic = ? AND seq = ?")
        .bind(uid)
        .bind(topic)
        .bind(seq)
        .execute(pool)
        .await?;
    Ok(())
}

/// How many references the user has saved.
pub async fn count(pool: &MySqlPool, uid: i64) -> sqlx::Result<i64> {
    sqlx::query_scalar("SELECT COUNT(*) FROM im_favorites WHERE uid = ?")
        .bind(uid)
        .fetch_one(pool)
        .await
}

/// Newest saved first, after `after`, at most `limit`.
pub async fn list(
    pool: &MySqlPool,
    uid: i64,
    after: Option<&Cursor>,
    limit: i64,
) -> sqlx::Result<Vec<Favorite>> {
    let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
        "SELECT topic, seq, created_at FROM im_favorites WHERE uid = ",
    );
    q.push_bind(uid);
    if let Some(c) = after {
        let at = crate::store::writer::naive(c.saved_at);
        q.push(" AND (created_at < ")
            .push_bind(at)
            .push(" OR (created_at = ")
            .push_bind(at)
            .push(" AND (topic < ")
            .push_bind(c.topic.as_str())
            .push(" OR (topic = ")
            .push_bind(c.topic.as_str())
            .push(" AND seq < ")
            .push_bind(c.seq)
            .push("))))");
    }
    q.push(" ORDER BY created_at DESC, topic DESC, seq DESC LIMIT ")
        .push_bind(limit);
    let rows: Vec<(crate::exact::Exact, i64, chrono::NaiveDateTime)> =
        q.build_query_as().fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|(topic, seq, at)| Favorite {
            topic: topic.into(),
            seq,
            saved_at: at.and_utc().timestamp_millis(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote_and_refuses_anything_else() {
        let c = Cursor {
            saved_at: 1_790_000_000_123,
            seq: 42,
            topic: "grpTeam".into(),
        };
        assert_eq!(Cursor::parse(&c.text()), Some(c));
        assert_eq!(Cursor::parse("1.2"), None);
        assert_eq!(Cursor::parse("x.2.grpTeam"), None);
        assert_eq!(Cursor::parse("1.2.me"), None);
    }
}
