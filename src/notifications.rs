//! System notifications kept per user with a read state (seed 002 §5
//! "系统消息", §7.2 report outcomes, §10 item 6): what the user is told
//! about, derived from the event log —
//!
//! - user events: an operator's `SystemNotification`, a friend request
//!   (`FriendRequestCreated`, to its recipient) and its acceptance
//!   (`FriendRequestAccepted`, to the requester);
//! - group events addressed to one user: an invitation to a group
//!   (`MemberInvited`), being added to a group by someone
//!   else (`MemberJoined`, `GroupCreated` of at most
//!   [`MAX_CREATION_NOTICES`] members), removed (`MemberLeft` kicked), given
//!   a role (`MemberRoleChanged`), muted or unmuted (`MemberMuted`), and the
//!   outcome of one's report (`MessageReportResolved`, to the reporter).
//!
//! Each is one row of `im_user_notifications` keyed by `(uid,
//! notification_id)` — the event id, or the operator's notification id —
//! so redelivery and replay write nothing twice and never reset a read
//! state. Reading is an event too (`NotificationsRead`, by ids or everything
//! up to a time), projected here and delivered to every device of the user
//! by the notify pipeline, so a notification read on one device clears on
//! the others, live. A user keeps the newest [`MAX_PER_USER`] caused by
//! users and as many of the system's and operators', and of those one
//! user caused, the newest [`MAX_PER_ACTOR`].

use serde_json::{json, Value};
use sqlx::mysql::MySqlPool;
use sqlx::Row;

use crate::events::{GroupEvent, GroupEventBody, UserEvent, UserEventBody};
use crate::tinode;

/// Notifications kept per user (older ones are dropped as new ones come),
/// counted apart for those other users caused and for the system's and
/// operators' (actor 0): no number of users' notices pushes an
/// operator's out.
pub const MAX_PER_USER: i64 = 500;
/// Notifications one user may have caused to another that are kept (the
/// newest): one account's spam replaces its own notices, not everyone
/// else's (issue 39).
pub const MAX_PER_ACTOR: i64 = 20;
/// Largest page a client may ask for.
pub const MAX_PAGE: i64 = 100;
/// Page size when the client names none.
pub const DEFAULT_PAGE: i64 = 30;
/// Most ids one read may name.
pub const MAX_READ_IDS: usize = 100;
/// Longest notification id (the column's width).
pub const MAX_ID_BYTES: usize = 64;
/// Longest title and text kept, in characters (the columns' widths).
pub const MAX_TITLE_CHARS: usize = 256;
pub const MAX_TEXT_CHARS: usize = 2048;
/// A group created with more members than this tells none of them: one
/// event never writes more notification rows (each member finds the group
/// in their chat list anyway).
pub const MAX_CREATION_NOTICES: usize = 500;

/// One notification of one user.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    pub uid: i64,
    pub id: String,
    /// `system`, `friend.request`, `friend.accepted`, `group.invited`,
    /// `group.added`, `group.removed`, `group.role`, `group.muted`, `report.resolved`.
    pub kind: String,
    /// Who caused it; 0 for the system or an operator.
    pub actor: i64,
    /// The group it is about, if any.
    pub topic: Option<String>,
    pub title: String,
    pub text: String,
    /// What else the kind carries (a role, a mute's end, a resolution).
    pub params: Value,
    /// Epoch ms.
    pub created_at: i64,
    pub read: bool,
}

impl Notification {
    fn new(uid: i64, id: &str, kind: &str, actor: i64, at: i64) -> Self {
        Notification {
            uid,
            id: id.to_string(),
            kind: kind.to_string(),
            actor,
            topic: None,
            title: String::new(),
            text: String::new(),
            params: json!({}),
            created_at: at,
            read: false,
        }
    }

    fn about(mut self, topic: &str, title: &str, params: Value) -> Self {
        self.topic = Some(topic.to_string());
        self.title = title.to_string();
        self.params = params;
        self
    }

    /// As clients get it (the HTTP list and the live frame).
    pub fn json(&self) -> Value {
        json!({
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "text": self.text,
            "from": (self.actor > 0).then(|| tinode::user_id(self.actor)),
            "topic": self.topic,
            "params": self.params,
            "ts": tinode::timestamp_ms(self.created_at),
            "read": self.read,
        })
    }

    /// The live `{pres topic="me" what="upd" event="notification"}` frame.
    pub fn frame(&self) -> String {
        let src = if self.actor > 0 {
            tinode::user_id(self.actor)
        } else {
            "sys".to_string()
        };
        json!({"pres": {"topic": "me", "src": src, "what": "upd", "event": "notification", "params": self.json()}})
            .to_string()
    }
}

/// The notifications a user event makes (none for most).
pub fn of_user_event(e: &UserEvent) -> Vec<Notification> {
    let at = e.occurred_at;
    match &e.body {
        UserEventBody::SystemNotification(n) => {
            let mut out = Notification::new(e.uid, &n.notification_id, "system", 0, at);
            out.title = n.title.clone();
            out.text = n.text.clone();
            vec![out]
        }
        UserEventBody::FriendRequestCreated(r) => {
            let mut out = Notification::new(e.uid, &e.event_id, "friend.request", r.from_uid, at);
            out.title = "Friend request".into();
            out.text = r.message.clone();
            vec![out]
        }
        UserEventBody::FriendRequestAccepted(a) => {
            let mut out = Notification::new(e.uid, &e.event_id, "friend.accepted", a.by_uid, at);
            out.title = "Friend request accepted".into();
            vec![out]
        }
        _ => Vec::new(),
    }
}

/// The notifications a group event makes for the users it addresses.
pub fn of_group_event(e: &GroupEvent) -> Vec<Notification> {
    let (topic, at, id) = (e.topic.as_str(), e.occurred_at, e.event_id.as_str());
    let one = |uid: i64, kind: &str, actor: i64| Notification::new(uid, id, kind, actor, at);
    match &e.body {
        GroupEventBody::GroupCreated(g) if g.members.len() <= MAX_CREATION_NOTICES => g
            .members
            .iter()
            .filter(|u| **u > 0 && **u != g.owner_uid)
            .map(|u| {
                one(*u, "group.added", g.owner_uid).about(
                    topic,
                    "Added to a group",
                    json!({"role": "member", "name": g.name}),
                )
            })
            .collect(),
        // An invitation waiting for the user's answer (the write model's
        // `MemberInvited`; accepting it is their own `MemberJoined`).
        GroupEventBody::MemberInvited(i) if i.uid > 0 && i.uid != i.invited_by => {
            let by = if i.invited_by != 0 {
                i.invited_by
            } else {
                e.actor_uid
            };
            vec![one(i.uid, "group.invited", by).about(topic, "Invited to a group", json!({}))]
        }
        GroupEventBody::MemberJoined(j) => {
            let by = if j.invited_by != 0 {
                j.invited_by
            } else {
                e.actor_uid
            };
            if by == j.uid {
                return Vec::new();
            }
            vec![one(j.uid, "group.added", by).about(
                topic,
                "Added to a group",
                json!({"role": if j.role.is_empty() { "member" } else { &j.role }}),
            )]
        }
        GroupEventBody::MemberLeft(l) if l.kicked && e.actor_uid != l.uid => {
            vec![one(l.uid, "group.removed", e.actor_uid).about(
                topic,
                "Removed from a group",
                json!({}),
            )]
        }
        GroupEventBody::MemberRoleChanged(c) if e.actor_uid != c.uid => {
            vec![one(c.uid, "group.role", e.actor_uid).about(
                topic,
                "Your role in a group changed",
                json!({"role": c.role}),
            )]
        }
        GroupEventBody::MemberMuted(m) if e.actor_uid != m.uid => {
            let title = if m.muted_until.is_some() {
                "Muted in a group"
            } else {
                "No longer muted in a group"
            };
            vec![one(m.uid, "group.muted", e.actor_uid).about(
                topic,
                title,
                json!({"until": m.muted_until.map(tinode::timestamp_ms)}),
            )]
        }
        // The operator's note stays with the moderators.
        GroupEventBody::MessageReportResolved(r) => {
            match crate::references::reports::reporter_of(&r.report_id) {
                Some(reporter) => vec![one(reporter, "report.resolved", 0).about(
                    topic,
                    "Your report was resolved",
                    json!({"report_id": r.report_id, "resolution": r.resolution}),
                )],
                None => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

/// `text` cut to at most `max` characters.
fn cut(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

/// Records notifications; one recorded before is kept as it is (its read
/// state too). Then each user's oldest beyond [`MAX_PER_USER`] go.
pub async fn record(pool: &MySqlPool, all: &[Notification]) -> sqlx::Result<()> {
    let all: Vec<&Notification> = all
        .iter()
        .filter(|n| !n.id.is_empty() && n.id.len() <= MAX_ID_BYTES)
        .collect();
    for chunk in all.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "INSERT INTO im_user_notifications \
             (uid, notification_id, kind, actor_uid, topic, title, body, params, created_at) ",
        );
        q.push_values(chunk, |mut r, n| {
            r.push_bind(n.uid)
                .push_bind(n.id.as_bytes())
                .push_bind(n.kind.as_str())
                .push_bind(n.actor)
                .push_bind(n.topic.as_deref().map(str::as_bytes))
                .push_bind(cut(&n.title, MAX_TITLE_CHARS))
                .push_bind(cut(&n.text, MAX_TEXT_CHARS))
                .push_bind(n.params.to_string())
                .push_bind(crate::store::writer::naive(n.created_at));
        });
        q.push(" ON DUPLICATE KEY UPDATE uid = uid");
        q.build().execute(pool).await?;
    }
    let mut pairs: Vec<(i64, i64)> = all.iter().map(|n| (n.uid, n.actor)).collect();
    pairs.sort_unstable();
    pairs.dedup();
    for (uid, actor) in &pairs {
        if *actor != 0 && *actor != *uid {
            trim(pool, *uid, Kept::From(*actor), MAX_PER_ACTOR).await?;
        }
    }
    let mut users: Vec<(i64, bool)> = pairs
        .iter()
        .map(|(uid, actor)| (*uid, *actor == 0))
        .collect();
    users.sort_unstable();
    users.dedup();
    for (uid, system) in users {
        let kept = if system { Kept::System } else { Kept::Users };
        trim(pool, uid, kept, MAX_PER_USER).await?;
    }
    Ok(())
}

/// Which of a user's notifications a trim counts.
#[derive(Clone, Copy)]
enum Kept {
    /// Caused by the system or an operator (actor 0).
    System,
    /// Caused by users.
    Users,
    /// Caused by this user.
    From(i64),
}

/// Drops `uid`'s notifications of `kept` beyond the newest `max`.
async fn trim(pool: &MySqlPool, uid: i64, kept: Kept, max: i64) -> sqlx::Result<()> {
    let (filter, actor) = match kept {
        Kept::System => ("actor_uid = ?", 0),
        Kept::Users => ("actor_uid <> ?", 0),
        Kept::From(actor) => ("actor_uid = ?", actor),
    };
    let oldest_kept: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT id FROM im_user_notifications WHERE uid = ? AND {filter} \
         ORDER BY id DESC LIMIT 1 OFFSET ?"
    ))
    .bind(uid)
    .bind(actor)
    .bind(max - 1)
    .fetch_optional(pool)
    .await?;
    if let Some(id) = oldest_kept {
        sqlx::query(&format!(
            "DELETE FROM im_user_notifications WHERE uid = ? AND {filter} AND id < ?"
        ))
        .bind(uid)
        .bind(actor)
        .bind(id)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// Marks `uid`'s notifications `ids`, and every one created up to `up_to`
/// (epoch ms, when positive), read at `at`; ones read before keep their
/// time.
pub async fn mark_read(
    pool: &MySqlPool,
    uid: i64,
    ids: &[String],
    up_to: i64,
    at: i64,
) -> sqlx::Result<()> {
    let at = crate::store::writer::naive(at);
    for chunk in ids.chunks(MAX_READ_IDS) {
        let mut q =
            sqlx::QueryBuilder::<sqlx::MySql>::new("UPDATE im_user_notifications SET read_at = ");
        q.push_bind(at)
            .push(" WHERE uid = ")
            .push_bind(uid)
            .push(" AND read_at IS NULL AND notification_id IN (");
        let mut list = q.separated(", ");
        for id in chunk {
            list.push_bind(id.as_bytes());
        }
        q.push(")");
        q.build().execute(pool).await?;
    }
    if up_to > 0 {
        sqlx::query(
            "UPDATE im_user_notifications SET read_at = ? \
             WHERE uid = ? AND read_at IS NULL AND created_at <= ?",
        )
        .bind(at)
        .bind(uid)
        .bind(crate::store::writer::naive(up_to))
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// One page of a user's notifications, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub notifications: Vec<Notification>,
    /// Where the next (older) page starts, if there is one.
    pub next_before: Option<i64>,
    /// The user's unread notifications, all pages.
    pub unread: i64,
}

/// `uid`'s notifications older than cursor `before` (all when `None`),
/// newest first, at most `limit`; only unread ones with `unread_only`.
pub async fn list(
    pool: &MySqlPool,
    uid: i64,
    before: Option<i64>,
    limit: i64,
    unread_only: bool,
) -> sqlx::Result<Page> {
    let rows = sqlx::query(&format!(
        "SELECT id, CAST(notification_id AS CHAR), kind, actor_uid, CAST(topic AS CHAR), title, body, \
         CAST(params AS CHAR), CAST(UNIX_TIMESTAMP(created_at) * 1000 AS SIGNED), read_at IS NOT NULL \
         FROM im_user_notifications WHERE uid = ? AND id < ? {} ORDER BY id DESC LIMIT ?",
        if unread_only { "AND read_at IS NULL" } else { "" }
    ))
    .bind(uid)
    .bind(before.unwrap_or(i64::MAX))
    .bind(limit + 1)
    .fetch_all(pool)
    .await?;
    let mut notifications = Vec::with_capacity(rows.len());
    let mut cursors = Vec::with_capacity(rows.len());
    for r in &rows {
        cursors.push(r.try_get::<i64, _>(0)?);
        let params: Option<String> = r.try_get(7)?;
        notifications.push(Notification {
            uid,
            id: r.try_get(1)?,
            kind: r.try_get(2)?,
            actor: r.try_get(3)?,
            topic: r.try_get(4)?,
            title: r.try_get(5)?,
            text: r.try_get(6)?,
            params: params
                .and_then(|p| serde_json::from_str(&p).ok())
                .unwrap_or_else(|| json!({})),
            created_at: r.try_get(8)?,
            read: r.try_get::<i64, _>(9)? != 0,
        });
    }
    let next_before = if notifications.len() as i64 > limit {
        notifications.truncate(limit as usize);
        cursors.get(limit as usize - 1).copied()
    } else {
        None
    };
    let unread: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM im_user_notifications WHERE uid = ? AND read_at IS NULL",
    )
    .bind(uid)
    .fetch_one(pool)
    .await?;
    Ok(Page {
        notifications,
        next_before,
        unread,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::*;

    fn group(actor: i64, body: GroupEventBody) -> GroupEvent {
        GroupEvent::new("t", "grpX", actor, body)
    }

    fn kinds(ns: &[Notification]) -> Vec<(i64, &str, i64)> {
        ns.iter()
            .map(|n| (n.uid, n.kind.as_str(), n.actor))
            .collect()
    }

    #[test]
    fn group_events_notify_the_user_they_address_unless_it_acted_itself() {
        let joined = |uid, invited_by| {
            GroupEventBody::MemberJoined(MemberJoined {
                uid,
                role: String::new(),
                invited_by,
            })
        };
        assert_eq!(
            kinds(&of_group_event(&group(1, joined(7, 1)))),
            vec![(7, "group.added", 1)]
        );
        let invited = GroupEventBody::MemberInvited(MemberInvited {
            uid: 7,
            invited_by: 1,
        });
        assert_eq!(
            kinds(&of_group_event(&group(1, invited))),
            vec![(7, "group.invited", 1)]
        );
        assert!(
            of_group_event(&group(7, joined(7, 0))).is_empty(),
            "joined by itself"
        );
        // An operator's command acts as nobody in particular.
        assert_eq!(
            kinds(&of_group_event(&group(0, joined(7, 0)))),
            vec![(7, "group.added", 0)]
        );
        let left = |kicked| GroupEventBody::MemberLeft(MemberLeft { uid: 7, kicked });
        assert_eq!(
            kinds(&of_group_event(&group(1, left(true)))),
            vec![(7, "group.removed", 1)]
        );
        assert!(
            of_group_event(&group(7, left(false))).is_empty(),
            "left by itself"
        );
        let role = GroupEventBody::MemberRoleChanged(MemberRoleChanged {
            uid: 7,
            role: "admin".into(),
        });
        let n = of_group_event(&group(1, role));
        assert_eq!(
            (n[0].kind.as_str(), n[0].params.clone()),
            ("group.role", json!({"role": "admin"}))
        );
        let muted = GroupEventBody::MemberMuted(MemberMuted {
            uid: 7,
            muted_until: None,
        });
        assert_eq!(
            of_group_event(&group(1, muted))[0].params,
            json!({"until": null})
        );
        // Messages and the rest address nobody in particular.
        let dissolved = GroupEventBody::GroupDissolved(GroupDissolved {
            reason: String::new(),
        });
        assert!(of_group_event(&group(1, dissolved)).is_empty());
    }

    #[test]
    fn a_creation_tells_its_members_unless_there_are_too_many() {
        let created = |n: i64| {
            GroupEventBody::GroupCreated(GroupCreated {
                group_id: 1,
                name: "G".into(),
                owner_uid: 1,
                members: (1..=n).collect(),
            })
        };
        let n = of_group_event(&group(1, created(4)));
        assert_eq!(
            kinds(&n),
            vec![
                (2, "group.added", 1),
                (3, "group.added", 1),
                (4, "group.added", 1)
            ]
        );
        // One event, one id: the key is (uid, notification_id).
        assert!(n.iter().all(|x| x.id == n[0].id));
        let big = MAX_CREATION_NOTICES as i64 + 2;
        assert!(of_group_event(&group(1, created(big))).is_empty());
    }

    #[test]
    fn a_resolved_report_tells_its_reporter_without_the_note() {
        let report_id = crate::references::reports::report_id("grpX", 5, 42);
        let body = GroupEventBody::MessageReportResolved(MessageReportResolved {
            report_id: report_id.clone(),
            resolution: "actioned".into(),
            note: "internal: spam ring #4".into(),
        });
        let n = of_group_event(&group(0, body));
        assert_eq!(kinds(&n), vec![(42, "report.resolved", 0)]);
        assert_eq!(
            n[0].params,
            json!({"report_id": report_id, "resolution": "actioned"})
        );
        assert!(!n[0].json().to_string().contains("spam ring"));
    }

    #[test]
    fn user_events_notify_friend_requests_and_operator_notices() {
        let e = UserEvent::new(
            "t",
            7,
            3,
            UserEventBody::FriendRequestCreated(FriendRequestCreated {
                from_uid: 3,
                message: "hi".into(),
            }),
        );
        let n = of_user_event(&e);
        assert_eq!(kinds(&n), vec![(7, "friend.request", 3)]);
        assert_eq!(
            (n[0].id.as_str(), n[0].text.as_str()),
            (e.event_id.as_str(), "hi")
        );
        let e = UserEvent::new(
            "t",
            7,
            0,
            UserEventBody::SystemNotification(SystemNotification {
                notification_id: "n1".into(),
                title: "Hello".into(),
                text: "world".into(),
            }),
        );
        let n = of_user_event(&e);
        assert_eq!((n[0].id.as_str(), n[0].kind.as_str()), ("n1", "system"));
        let frame: Value = serde_json::from_str(&n[0].frame()).unwrap();
        assert_eq!(frame["pres"]["event"], json!("notification"));
        assert_eq!(frame["pres"]["params"]["title"], json!("Hello"));
        assert_eq!(frame["pres"]["params"]["from"], Value::Null);
    }

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("héllo", 2), "hé");
        assert_eq!(cut("hé", 5), "hé");
    }
}
