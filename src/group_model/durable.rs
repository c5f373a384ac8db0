//! The durable copy of a group's write model (issue 38): `im_group_models`
//! and `im_group_model_members` hold the model exactly as some version of
//! Redis had it, and `im_group_commands` the claims of the commands that
//! made it. A command writes here after its change is applied in Redis and
//! before it produces its events or answers, so every fact a command was
//! acknowledged on survives whatever Redis forgets, and a restore is one
//! transaction per group (or per page of groups), never a log scan.
//!
//! Writers are fenced by the `epoch`: a restore of the model into Redis
//! raises it here (under the row's lock) before it reads, and a change is
//! written only under the epoch it was applied in. So a change applied to
//! a Redis model that a restore has since replaced (an older incarnation,
//! a partial model) is never written, and its command answers "retry";
//! one written before the restore read is in what the restore installs.
//!
//! Within an epoch the versions are written in order: Redis applies no
//! change on top of one that is not durable yet (`unsynced`), and a write
//! that finds MySQL behind (a database failover lost writes, a command
//! that never finished) writes the whole model instead ([`sync_whole`]).

use sqlx::{MySql, MySqlPool, Transaction};

use crate::exact::Exact;
use crate::store::marks::placeholders;

/// Rows per statement (a statement holds at most 65,535 placeholders).
const ROWS_PER_STATEMENT: usize = 1_000;

/// A group's model apart from its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub group_id: i64,
    /// `active` | `dissolved`.
    pub status: String,
    pub owner: i64,
    pub prev_owner: i64,
    pub mute_all: bool,
}

/// One user's place in the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub uid: i64,
    /// `owner` | `admin` | `member` | `invited` | `out`.
    pub place: String,
    pub muted_until: Option<i64>,
    pub inviter: Option<i64>,
    /// Left after this seq (and back from `back_seq`), see `TopicKeys::left`.
    pub left_seq: Option<i64>,
    pub back_seq: Option<i64>,
}

impl Row {
    /// A row as `lua/group_apply.lua` and `lua/group_dump.lua` name its
    /// parts (`left` as `from|back`, '' for none).
    pub fn from_parts(uid: i64, place: &str, muted: &str, inviter: &str, left: &str) -> Row {
        let (left_seq, back_seq) = match left.split_once('|') {
            Some((from, back)) => (from.parse().ok(), back.parse().ok()),
            None => (None, None),
        };
        Row {
            uid,
            place: match place {
                "owner" | "admin" | "member" | "invited" => place.to_string(),
                _ => "out".to_string(),
            },
            muted_until: muted.parse().ok(),
            inviter: inviter.parse().ok(),
            left_seq,
            back_seq,
        }
    }

    /// Whether the row says anything (an `out` user who never left holds
    /// nothing worth keeping).
    fn is_empty(&self) -> bool {
        self.place == "out" && self.left_seq.is_none()
    }

    /// `from|back` as the `left` hash holds it, when the user ever left.
    pub fn left_text(&self) -> Option<String> {
        self.left_seq.map(|from| {
            format!(
                "{from}|{}",
                self.back_seq.map(|b| b.to_string()).unwrap_or_default()
            )
        })
    }
}

/// A whole model: what a restore installs and a whole write stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub meta: Meta,
    pub version: i64,
    pub epoch: i64,
    pub rows: Vec<Row>,
}

/// What a write found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Stored.
    Done,
    /// MySQL already holds this version (a whole write of a later state
    /// included it).
    AlreadyDurable,
    /// A restore raised the epoch after the change was applied: the change
    /// is not in the model any more and must not be stored.
    Fenced,
    /// MySQL is behind (a lost write, a command that never finished, a
    /// group from before durable models): write the whole model instead.
    Behind,
    /// A create found another group under the name.
    Exists,
}

/// One command's change, as `lua/group_apply.lua` answered it.
#[derive(Debug, Clone)]
pub struct Applied {
    pub version: i64,
    pub epoch: i64,
    pub meta: Meta,
    pub rows: Vec<Row>,
}

/// A command's claim to keep with its change: its key and its text.
pub type CommandClaim<'a> = Option<(&'a str, &'a str)>;

/// Writes one change (version `v` on top of `v - 1`) with its command's
/// claim, in one transaction.
pub async fn write_change(
    pool: &MySqlPool,
    topic: &str,
    change: &Applied,
    create: bool,
    command: CommandClaim<'_>,
) -> Result<Written, sqlx::Error> {
    let mut tx = pool.begin().await?;
    // A create inserts first: a locking read of the absent row would take
    // a gap lock, and two creates of new names in one gap would deadlock
    // on their inserts. Only when the name is taken is the row read.
    let inserted = if create {
        match insert_meta(&mut tx, topic, &change.meta, change.version, change.epoch).await {
            Ok(()) => true,
            Err(e) if is_duplicate_key(&e) => false,
            Err(e) => return Err(e),
        }
    } else {
        false
    };
    let found: Option<(i64, i64, i64)> = if inserted {
        None
    } else {
        sqlx::query_as(
            "SELECT version, epoch, group_id FROM im_group_models WHERE topic = ? FOR UPDATE",
        )
        .bind(topic)
        .fetch_optional(&mut *tx)
        .await?
    };
    let outcome = match found {
        None if inserted => Written::Done,
        None => Written::Behind,
        Some((version, _, group_id)) if create => {
            if group_id == change.meta.group_id && version >= change.version {
                Written::AlreadyDurable
            } else {
                Written::Exists
            }
        }
        Some((_, epoch, _)) if epoch > change.epoch => Written::Fenced,
        Some((_, epoch, _)) if epoch < change.epoch => Written::Behind,
        Some((version, _, _)) if version >= change.version => Written::AlreadyDurable,
        Some((version, _, _)) if version < change.version - 1 => Written::Behind,
        Some(_) => {
            update_meta(&mut tx, topic, &change.meta, change.version, change.epoch).await?;
            Written::Done
        }
    };
    if outcome != Written::Done {
        tx.rollback().await?;
        return Ok(outcome);
    }
    let (keep, gone): (Vec<&Row>, Vec<&Row>) = change.rows.iter().partition(|r| !r.is_empty());
    for chunk in keep.chunks(ROWS_PER_STATEMENT) {
        upsert_rows(&mut tx, topic, chunk).await?;
    }
    for chunk in gone.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "DELETE FROM im_group_model_members WHERE topic = ? AND uid IN ({})",
            placeholders(chunk.len())
        );
        let mut q = sqlx::query(&sql).bind(topic);
        for r in chunk {
            q = q.bind(r.uid);
        }
        q.execute(&mut *tx).await?;
    }
    insert_command(&mut tx, topic, change.version, command).await?;
    tx.commit().await?;
    Ok(Written::Done)
}

/// Writes the whole model as Redis holds it (at `model.version`, under
/// `model.epoch`), with the claim of the command whose change it finishes.
/// Refused ([`Written::Fenced`]) when a restore raised the epoch past it;
/// nothing to do when MySQL holds this version already.
pub async fn sync_whole(
    pool: &MySqlPool,
    topic: &str,
    model: &Model,
    command: CommandClaim<'_>,
) -> Result<Written, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let found: Option<(i64, i64)> =
        sqlx::query_as("SELECT version, epoch FROM im_group_models WHERE topic = ? FOR UPDATE")
            .bind(topic)
            .fetch_optional(&mut *tx)
            .await?;
    match found {
        Some((_, epoch)) if epoch > model.epoch => {
            tx.rollback().await?;
            return Ok(Written::Fenced);
        }
        Some((version, epoch)) if epoch == model.epoch && version >= model.version => {
            insert_command(&mut tx, topic, model.version, command).await?;
            tx.commit().await?;
            return Ok(Written::AlreadyDurable);
        }
        Some(_) => update_meta(&mut tx, topic, &model.meta, model.version, model.epoch).await?,
        None => insert_meta(&mut tx, topic, &model.meta, model.version, model.epoch).await?,
    }
    sqlx::query("DELETE FROM im_group_model_members WHERE topic = ?")
        .bind(topic)
        .execute(&mut *tx)
        .await?;
    let rows: Vec<&Row> = model.rows.iter().filter(|r| !r.is_empty()).collect();
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        upsert_rows(&mut tx, topic, chunk).await?;
    }
    insert_command(&mut tx, topic, model.version, command).await?;
    tx.commit().await?;
    Ok(Written::Done)
}

async fn insert_meta(
    tx: &mut Transaction<'_, MySql>,
    topic: &str,
    meta: &Meta,
    version: i64,
    epoch: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO im_group_models \
         (topic, group_id, status, owner_uid, prev_owner_uid, mute_all, version, epoch) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(topic)
    .bind(meta.group_id)
    .bind(&meta.status)
    .bind(meta.owner)
    .bind(meta.prev_owner)
    .bind(meta.mute_all)
    .bind(version)
    .bind(epoch)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn update_meta(
    tx: &mut Transaction<'_, MySql>,
    topic: &str,
    meta: &Meta,
    version: i64,
    epoch: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE im_group_models SET group_id = ?, status = ?, owner_uid = ?, \
         prev_owner_uid = ?, mute_all = ?, version = ?, epoch = ? WHERE topic = ?",
    )
    .bind(meta.group_id)
    .bind(&meta.status)
    .bind(meta.owner)
    .bind(meta.prev_owner)
    .bind(meta.mute_all)
    .bind(version)
    .bind(epoch)
    .bind(topic)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn upsert_rows(
    tx: &mut Transaction<'_, MySql>,
    topic: &str,
    rows: &[&Row],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let values = vec!["(?, ?, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
    let q_sql = format!(
        "INSERT INTO im_group_model_members \
         (topic, uid, place, muted_until, inviter, left_seq, back_seq) VALUES {values} \
         ON DUPLICATE KEY UPDATE place = VALUES(place), muted_until = VALUES(muted_until), \
         inviter = VALUES(inviter), left_seq = VALUES(left_seq), back_seq = VALUES(back_seq)"
    );
    let mut q = sqlx::query(&q_sql);
    for r in rows {
        q = q
            .bind(topic)
            .bind(r.uid)
            .bind(&r.place)
            .bind(r.muted_until)
            .bind(r.inviter)
            .bind(r.left_seq)
            .bind(r.back_seq);
    }
    q.execute(&mut **tx).await?;
    Ok(())
}

async fn insert_command(
    tx: &mut Transaction<'_, MySql>,
    topic: &str,
    version: i64,
    command: CommandClaim<'_>,
) -> Result<(), sqlx::Error> {
    let Some((key, claim)) = command else {
        return Ok(());
    };
    sqlx::query(
        "INSERT IGNORE INTO im_group_commands (claim_key, topic, version, claim, done, created_at) \
         VALUES (?, ?, ?, ?, 0, CURRENT_TIMESTAMP(3))",
    )
    .bind(key)
    .bind(topic)
    .bind(version)
    .bind(claim)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The stored model of `topic` without its members, with its epoch raised
/// first (under the row's lock): a restore's read. Every write applied in
/// an earlier epoch is either in what this returns or is refused from now
/// on. `None`: no group has the name (durably).
pub async fn load_for_restore(pool: &MySqlPool, topic: &str) -> Result<Option<Model>, sqlx::Error> {
    Ok(load_many_for_restore(pool, &[topic.to_string()])
        .await?
        .into_iter()
        .next()
        .map(|(_, m)| m))
}

/// [`load_for_restore`] of many groups in one transaction (a bulk
/// restore's page): `(topic, model)` for those that exist.
pub async fn load_many_for_restore(
    pool: &MySqlPool,
    topics: &[String],
) -> Result<Vec<(String, Model)>, sqlx::Error> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    // Which exist, by a plain read: a locking read of an absent key would
    // take a gap lock, and concurrent creates inserting into the gap would
    // deadlock against it. A group created meanwhile is installed by its
    // creator.
    let marks = placeholders(topics.len());
    let exists_sql = format!("SELECT topic FROM im_group_models WHERE topic IN ({marks})");
    let mut exists = sqlx::query_scalar::<_, Exact>(&exists_sql);
    for t in topics {
        exists = exists.bind(t);
    }
    let found = exists.fetch_all(pool).await?;
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = pool.begin().await?;
    // The bump locks the rows (in key order, as every bump does); the read
    // after it is a locking read, so it sees the latest rows.
    let marks = placeholders(found.len());
    let bump_sql = format!("UPDATE im_group_models SET epoch = epoch + 1 WHERE topic IN ({marks})");
    let mut bump = sqlx::query(&bump_sql);
    for t in &found {
        bump = bump.bind(t.as_ref() as &str);
    }
    bump.execute(&mut *tx).await?;
    let select_sql = format!(
        "SELECT topic, group_id, status, owner_uid, prev_owner_uid, mute_all, version, epoch \
         FROM im_group_models WHERE topic IN ({marks}) FOR UPDATE"
    );
    let mut select =
        sqlx::query_as::<_, (Exact, i64, String, i64, i64, bool, i64, i64)>(&select_sql);
    for t in &found {
        select = select.bind(t.as_ref() as &str);
    }
    let rows = select.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows
        .into_iter()
        .map(
            |(topic, group_id, status, owner, prev_owner, mute_all, version, epoch)| {
                (
                    topic.into_string(),
                    Model {
                        meta: Meta {
                            group_id,
                            status,
                            owner,
                            prev_owner,
                            mute_all,
                        },
                        version,
                        epoch,
                        rows: Vec::new(),
                    },
                )
            },
        )
        .collect())
}

/// The stored places of `topics`' users, per topic.
pub async fn rows_of(
    pool: &MySqlPool,
    topics: &[String],
) -> Result<std::collections::HashMap<String, Vec<Row>>, sqlx::Error> {
    let mut out: std::collections::HashMap<String, Vec<Row>> = Default::default();
    if topics.is_empty() {
        return Ok(out);
    }
    let marks = placeholders(topics.len());
    let sql = format!(
        "SELECT topic, uid, place, muted_until, inviter, left_seq, back_seq \
         FROM im_group_model_members WHERE topic IN ({marks})"
    );
    type Stored = (
        Exact,
        i64,
        String,
        Option<i64>,
        Option<i64>,
        Option<i64>,
        Option<i64>,
    );
    let mut q = sqlx::query_as::<_, Stored>(&sql);
    for t in topics {
        q = q.bind(t);
    }
    for (topic, uid, place, muted_until, inviter, left_seq, back_seq) in q.fetch_all(pool).await? {
        out.entry(topic.into_string()).or_default().push(Row {
            uid,
            place,
            muted_until,
            inviter,
            left_seq,
            back_seq,
        });
    }
    Ok(out)
}

/// Topics with a stored model after `after` (byte order), at most `limit`.
pub async fn topics_after(
    pool: &MySqlPool,
    after: &str,
    limit: usize,
) -> Result<Vec<String>, sqlx::Error> {
    let rows: Vec<Exact> = sqlx::query_scalar(
        "SELECT topic FROM im_group_models WHERE topic > ? ORDER BY topic LIMIT ?",
    )
    .bind(after)
    .bind(limit as i64)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(Exact::into_string).collect())
}

/// A command's stored claim and whether its events are in the log.
pub async fn command(
    pool: &MySqlPool,
    claim_key: &str,
) -> Result<Option<(String, bool)>, sqlx::Error> {
    sqlx::query_as("SELECT claim, done FROM im_group_commands WHERE claim_key = ?")
        .bind(claim_key)
        .fetch_optional(pool)
        .await
}

/// The command's events are in the log.
pub async fn mark_done(pool: &MySqlPool, claim_key: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE im_group_commands SET done = 1 WHERE claim_key = ?")
        .bind(claim_key)
        .execute(pool)
        .await?;
    Ok(())
}

/// Commands whose events may not be in the log, written more than
/// `older_than_ms` ago: `(claim key, topic, claim)`, oldest first.
pub async fn pending(
    pool: &MySqlPool,
    older_than_ms: i64,
    limit: usize,
) -> Result<Vec<(String, String, String)>, sqlx::Error> {
    let rows: Vec<(Exact, Exact, String)> = sqlx::query_as(
        "SELECT claim_key, topic, claim FROM im_group_commands \
         WHERE done = 0 AND created_at < CURRENT_TIMESTAMP(3) - INTERVAL ? MICROSECOND \
         ORDER BY created_at LIMIT ?",
    )
    .bind(older_than_ms * 1000)
    .bind(limit as i64)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(k, t, c)| (k.into_string(), t.into_string(), c))
        .collect())
}

/// Drops claims older than `ttl_ms` whose events are in the log (a retry
/// after that long is a new command, as with the Redis claim's TTL).
pub async fn purge(pool: &MySqlPool, ttl_ms: i64) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM im_group_commands WHERE done = 1 \
         AND created_at < CURRENT_TIMESTAMP(3) - INTERVAL ? MICROSECOND LIMIT 10000",
    )
    .bind(ttl_ms * 1000)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Whether a statement failed on a duplicate key (1062).
fn is_duplicate_key(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().map(|m| m.number()) == Some(1062))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_reads_the_scripts_parts() {
        let r = Row::from_parts(7, "admin", "1700", "", "12|");
        assert_eq!(
            (r.place.as_str(), r.muted_until, r.left_seq, r.back_seq),
            ("admin", Some(1700), Some(12), None)
        );
        assert_eq!(r.left_text().as_deref(), Some("12|"));
        let back = Row::from_parts(8, "member", "", "", "12|30");
        assert_eq!(back.left_text().as_deref(), Some("12|30"));
        let invited = Row::from_parts(9, "invited", "", "3", "");
        assert_eq!(invited.inviter, Some(3));
        assert!(!invited.is_empty());
        assert!(Row::from_parts(10, "-", "", "", "").is_empty());
        assert!(!Row::from_parts(11, "-", "", "", "5|").is_empty());
    }
}
