//! Consent to membership (issue 30): nobody is put into a group by someone
//! they blocked, and each user says who may add them directly — anyone,
//! only their contacts (friends), or nobody. Whoever may not add a user
//! directly invites them instead (Tinode's `given` access without `want`):
//! the user accepts (and joins) or declines. Operators add through admin
//! commands and are not asked (bulk membership).

use std::collections::{HashMap, HashSet};

use sqlx::MySqlPool;

use super::Refused;
use crate::tinode;

/// Who may add a user to a group directly (`im_user_settings.add_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddPolicy {
    Anyone,
    Contacts,
    Nobody,
}

impl AddPolicy {
    pub fn parse(s: &str) -> Option<AddPolicy> {
        match s {
            "anyone" => Some(AddPolicy::Anyone),
            "contacts" => Some(AddPolicy::Contacts),
            "nobody" => Some(AddPolicy::Nobody),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AddPolicy::Anyone => "anyone",
            AddPolicy::Contacts => "contacts",
            AddPolicy::Nobody => "nobody",
        }
    }
}

/// How one user comes into a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Added now.
    Direct,
    /// Invited: a member once they accept.
    Invite,
}

/// The rule, on facts already read: a blocked adder is refused; the
/// target's policy says whether the adder adds or invites.
pub fn admission(policy: AddPolicy, blocked_adder: bool, contact: bool) -> Option<Admission> {
    if blocked_adder {
        return None;
    }
    Some(match policy {
        AddPolicy::Anyone => Admission::Direct,
        AddPolicy::Contacts if contact => Admission::Direct,
        AddPolicy::Contacts | AddPolicy::Nobody => Admission::Invite,
    })
}

fn unavailable(e: sqlx::Error) -> Refused {
    let request_id = crate::request_id::current();
    tracing::warn!(%request_id, error = %e, "consent: database failed");
    Refused(503, tinode::UNAVAILABLE.into())
}

/// How each of `targets` comes in when `adder` adds them; refused (403,
/// naming them) when any of them blocked the adder. Reads the relations
/// and settings the user made (one query each, whatever the count).
pub async fn admissions(
    pool: &MySqlPool,
    adder: i64,
    targets: &[i64],
) -> Result<HashMap<i64, Admission>, Refused> {
    let mut out = HashMap::new();
    let others: Vec<i64> = targets
        .iter()
        .copied()
        .filter(|t| *t != adder)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if others.is_empty() {
        return Ok(out);
    }
    let blockers = uids_where(
        pool,
        "SELECT uid FROM im_blocks WHERE blocked_uid = ",
        adder,
        &others,
    )
    .await?;
    if !blockers.is_empty() {
        let mut named: Vec<i64> = blockers.into_iter().collect();
        named.sort_unstable();
        let names: Vec<String> = named.iter().map(|u| format!("usr{u}")).collect();
        return Err(Refused(
            403,
            format!("{} cannot be added by you (blocked)", names.join(", ")),
        ));
    }
    let contacts = uids_where(
        pool,
        "SELECT uid FROM im_friends WHERE friend_uid = ",
        adder,
        &others,
    )
    .await?;
    let mut policies: HashMap<i64, AddPolicy> = HashMap::new();
    for chunk in others.chunks(1000) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT uid, add_policy FROM im_user_settings WHERE uid IN (",
        );
        let mut list = q.separated(", ");
        for uid in chunk {
            list.push_bind(*uid);
        }
        q.push(")");
        let rows: Vec<(i64, String)> = q
            .build_query_as()
            .fetch_all(pool)
            .await
            .map_err(unavailable)?;
        for (uid, policy) in rows {
            policies.insert(uid, AddPolicy::parse(&policy).unwrap_or(AddPolicy::Anyone));
        }
    }
    for uid in others {
        let policy = policies.get(&uid).copied().unwrap_or(AddPolicy::Anyone);
        let how = admission(policy, false, contacts.contains(&uid))
            .expect("a user who did not block the adder is admitted somehow");
        out.insert(uid, how);
    }
    Ok(out)
}

async fn uids_where(
    pool: &MySqlPool,
    sql: &str,
    adder: i64,
    uids: &[i64],
) -> Result<HashSet<i64>, Refused> {
    let mut out = HashSet::new();
    for chunk in uids.chunks(1000) {
        // `sql` ends where the adder's uid goes; the list follows it.
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(sql);
        q.push_bind(adder);
        q.push(" AND uid IN (");
        let mut list = q.separated(", ");
        for uid in chunk {
            list.push_bind(*uid);
        }
        q.push(")");
        let rows: Vec<(i64,)> = q
            .build_query_as()
            .fetch_all(pool)
            .await
            .map_err(unavailable)?;
        out.extend(rows.into_iter().map(|r| r.0));
    }
    Ok(out)
}

/// A user's own policy (`anyone` when never set).
pub async fn policy(pool: &MySqlPool, uid: i64) -> Result<AddPolicy, Refused> {
    let p: Option<String> =
        sqlx::query_scalar("SELECT add_policy FROM im_user_settings WHERE uid = ?")
            .bind(uid)
            .fetch_optional(pool)
            .await
            .map_err(unavailable)?;
    Ok(p.as_deref()
        .and_then(AddPolicy::parse)
        .unwrap_or(AddPolicy::Anyone))
}

/// Sets a user's own policy.
pub async fn set_policy(pool: &MySqlPool, uid: i64, policy: AddPolicy) -> Result<(), Refused> {
    sqlx::query(
        "INSERT INTO im_user_settings (uid, add_policy) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE add_policy = VALUES(add_policy)",
    )
    .bind(uid)
    .bind(policy.as_str())
    .execute(pool)
    .await
    .map_err(unavailable)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_adder_never_adds_and_policies_decide_between_add_and_invite() {
        for policy in [AddPolicy::Anyone, AddPolicy::Contacts, AddPolicy::Nobody] {
            for contact in [false, true] {
                assert_eq!(admission(policy, true, contact), None);
            }
        }
        assert_eq!(
            admission(AddPolicy::Anyone, false, false),
            Some(Admission::Direct)
        );
        assert_eq!(
            admission(AddPolicy::Contacts, false, true),
            Some(Admission::Direct)
        );
        assert_eq!(
            admission(AddPolicy::Contacts, false, false),
            Some(Admission::Invite)
        );
        assert_eq!(
            admission(AddPolicy::Nobody, false, true),
            Some(Admission::Invite)
        );
        assert_eq!(AddPolicy::parse("contacts"), Some(AddPolicy::Contacts));
        assert_eq!(AddPolicy::parse("everyone"), None);
    }
}

/// The oldest `invited_at` an invitation may have and still hold, for a
/// time to live of `ttl_secs`: never before DATETIME's first day (any
/// value, however large, keeps every invitation; none panics).
pub fn invitation_cutoff(ttl_secs: u64) -> chrono::NaiveDateTime {
    let floor = chrono::NaiveDate::from_ymd_opt(1000, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("a valid date");
    i64::try_from(ttl_secs)
        .ok()
        .and_then(chrono::Duration::try_seconds)
        .and_then(|ttl| chrono::Utc::now().naive_utc().checked_sub_signed(ttl))
        .map_or(floor, |cutoff| cutoff.max(floor))
}

/// Which of `uids` hold an invitation to `topic` older than `ttl_secs`
/// (the members projection's `invited_at`; a lagging projection only
/// makes an invitation look newer, never older). Such an invitation is
/// gone: accepting it is refused and the group may invite again.
pub async fn expired_invitations(
    pool: &MySqlPool,
    topic: &str,
    uids: &[i64],
    ttl_secs: u64,
) -> Result<HashSet<i64>, Refused> {
    let mut out = HashSet::new();
    if uids.is_empty() {
        return Ok(out);
    }
    let cutoff = invitation_cutoff(ttl_secs);
    for chunk in uids.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT uid FROM im_group_invites WHERE topic = ",
        );
        q.push_bind(topic).push(" AND invited_at < ");
        q.push_bind(cutoff).push(" AND uid IN (");
        let mut sep = q.separated(", ");
        for uid in chunk {
            sep.push_bind(*uid);
        }
        q.push(")");
        let rows: Vec<i64> = q
            .build_query_scalar()
            .fetch_all(pool)
            .await
            .map_err(|e| Refused(503, format!("invitations unreadable: {e}")))?;
        out.extend(rows);
    }
    Ok(out)
}

/// Pending invitations one user may have sent to another (across groups):
/// a stranger cannot bury someone's real invitations under their own
/// (issue 39; expiry ends each, the per-user bucket slows them).
pub const MAX_PENDING_PER_INVITER: i64 = 5;

/// Refuses (429) when `inviter` already has [`MAX_PENDING_PER_INVITER`]
/// unexpired invitations pending with any of those `admissions` would
/// invite (the members projection; it may lag by the invitations just
/// sent, which the per-user bucket bounds).
pub async fn check_pending_invitations(
    pool: &MySqlPool,
    inviter: i64,
    admissions: &HashMap<i64, Admission>,
    ttl_secs: u64,
) -> Result<(), Refused> {
    let invitees: Vec<i64> = admissions
        .iter()
        .filter(|(_, a)| **a == Admission::Invite)
        .map(|(uid, _)| *uid)
        .collect();
    if invitees.is_empty() {
        return Ok(());
    }
    let cutoff = invitation_cutoff(ttl_secs);
    for chunk in invitees.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "SELECT uid FROM im_group_invites WHERE invited_by = ",
        );
        q.push_bind(inviter).push(" AND invited_at >= ");
        q.push_bind(cutoff).push(" AND uid IN (");
        let mut sep = q.separated(", ");
        for uid in chunk {
            sep.push_bind(*uid);
        }
        q.push(") GROUP BY uid HAVING COUNT(*) >= ")
            .push_bind(MAX_PENDING_PER_INVITER)
            .push(" ORDER BY uid LIMIT 1");
        let over: Option<i64> = q
            .build_query_scalar()
            .fetch_optional(pool)
            .await
            .map_err(|e| Refused(503, format!("invitations unreadable: {e}")))?;
        if let Some(uid) = over {
            return Err(Refused(
                429,
                format!(
                    "usr{uid} has {MAX_PENDING_PER_INVITER} invitations from you pending; \
                     wait for an answer"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod cutoff_tests {
    #[test]
    fn any_time_to_live_gives_a_cutoff() {
        let now = chrono::Utc::now().naive_utc();
        let day = super::invitation_cutoff(86_400);
        assert!(day < now && now - day >= chrono::Duration::seconds(86_399));
        let floor = chrono::NaiveDate::from_ymd_opt(1000, 1, 1)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap();
        assert_eq!(super::invitation_cutoff(u64::MAX), floor);
        assert_eq!(super::invitation_cutoff(i64::MAX as u64), floor);
        assert_eq!(super::invitation_cutoff(40_000 * 365 * 86_400), floor);
    }
}
