//! The attack table: every HTTP route the gateway's router serves and every
//! WebSocket message kind the session dispatches, with what it names (a
//! topic, a user, a message, a report, a tenant, a login, a file, or
//! nothing) and how to build an attack request from (attacker, target
//! name). `check_complete` compares it with the router's own list, so an
//! endpoint added without an entry here fails the suite, by name.

use serde_json::{json, Value};

use super::names::Variant;

/// What a route or message kind names.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Names {
    /// Nothing of anyone else: answered for the caller alone. Still called
    /// by every attacker (its answer is scanned for the victims' secrets).
    Nothing,
    Topic,
    User,
    /// A topic and a message seq in it.
    Message,
    Report,
    /// An operator route naming a tenant (and through it, its data).
    Tenant,
    /// A password login (WebSocket `{login}`).
    Login,
    /// The user search (`fnd`): names users by id or name.
    Fnd,
    /// A file of the web app install.
    File,
    /// A file a victim uploaded and sent, by its id.
    StoredFile,
}

/// One request (or WebSocket message) of an attack.
#[derive(Debug, Clone)]
pub enum Step {
    Http {
        method: &'static str,
        path: String,
        body: Option<Value>,
        /// Whether its answer is judged (a setup or cleanup step is only
        /// scanned for leaks).
        judged: bool,
    },
    Ws {
        msg: Value,
        judged: bool,
    },
    /// A WebSocket message that gets no reply (`{note}`).
    WsNote(Value),
}

/// What a builder gets: the attacker and the target name (one variant).
pub struct Ask<'a> {
    pub name: &'a Variant,
    /// A message seq of the target conversation (message targets).
    pub seq: i64,
    pub me: i64,
    /// The `?tenant=` of an operator route (path-encoded).
    pub tenant_param: String,
    /// Another user of the target (a victim member, the owner, or the
    /// attacker itself), for routes naming a topic and a user.
    pub other_uid: i64,
    /// A victim's `client_msg_id`, for sends that try to collide with one.
    pub victim_cmid: String,
    /// A number unique to this attack.
    pub n: u64,
    /// A seeded choice for builders with options.
    pub pick: u64,
    pub run: &'a str,
}

impl Ask<'_> {
    fn text(&self) -> String {
        format!("attack-{}-{}", self.run, self.n)
    }
    fn cmid(&self) -> String {
        if self.pick % 3 == 0 {
            self.victim_cmid.clone()
        } else {
            format!("atk-{}-{}", self.run, self.n)
        }
    }
    /// The target name as a JSON number when it is one (uid fields).
    fn uid_json(&self) -> Value {
        match self.name.name.parse::<i64>() {
            Ok(n) => json!(n),
            Err(_) => match self.name.name.parse::<u64>() {
                Ok(n) => json!(n),
                Err(_) => json!(self.name.name),
            },
        }
    }
}

#[derive(Clone, Copy)]
pub struct Entry {
    /// (method, path) as the router lists it.
    pub http: Option<(&'static str, &'static str)>,
    /// The WebSocket message kind.
    pub ws: Option<&'static str>,
    pub names: Names,
    /// What the entry does (or why it names nothing).
    pub about: &'static str,
    /// Takes an admin token (`?tenant=`).
    pub admin: bool,
    /// A 2xx is about the caller's own data whatever the name (its own
    /// settings or references), so only leaks and the victims' checksum
    /// judge it.
    pub always_own: bool,
    /// A user blocked by the named user must be refused even here.
    pub blocked_refused: bool,
    /// A 2xx creates the named topic, owned by the caller from then on.
    pub creates: bool,
    /// The answer may show users' profiles: notes are secrets here too.
    pub notes_secret: bool,
    /// Runs after the others: it hides or removes what an attacker could
    /// still read (its own view cleared, its own group dissolved).
    pub late: bool,
    pub build: fn(&Ask) -> Vec<Step>,
}

impl Entry {
    pub fn label(&self) -> String {
        match (self.http, self.ws) {
            (Some((m, p)), _) => format!("{m} {p}"),
            (None, Some(k)) => format!("ws {{{k}}} ({})", self.about),
            _ => "?".into(),
        }
    }

    /// Whether it can change anything (a read is checked without waiting
    /// for the pipelines).
    pub fn mutating(&self) -> bool {
        match (self.http, self.ws) {
            (Some((m, _)), _) => m != "GET",
            (None, Some(k)) => !matches!(k, "get" | "hi" | "acc"),
            _ => true,
        }
    }
}

fn fill(path: &str, with: &[(&str, &str)]) -> String {
    let mut out = path.to_string();
    for (k, v) in with {
        out = out.replace(k, v);
    }
    out
}

fn http(method: &'static str, path: String, body: Option<Value>) -> Vec<Step> {
    vec![Step::Http {
        method,
        path,
        body,
        judged: true,
    }]
}

fn ws(msg: Value) -> Step {
    Step::Ws { msg, judged: true }
}

fn ws_setup(msg: Value) -> Step {
    Step::Ws { msg, judged: false }
}

const E: Entry = Entry {
    http: None,
    ws: None,
    names: Names::Nothing,
    about: "",
    admin: false,
    always_own: false,
    blocked_refused: false,
    creates: false,
    notes_secret: false,
    late: false,
    build: |_| Vec::new(),
};

macro_rules! route {
    ($m:literal, $p:literal) => {
        Some(($m, $p))
    };
}

fn topic_path(a: &Ask, path: &str) -> String {
    let uid = a.other_uid.to_string();
    let seq = a.seq.to_string();
    fill(
        path,
        &[("{topic}", &a.name.path), ("{uid}", &uid), ("{seq}", &seq)],
    )
}

fn user_path(a: &Ask, path: &str) -> String {
    fill(
        path,
        &[
            ("{uid}", &a.name.path),
            ("{peer}", &a.name.path),
            ("{device}", "adversary"),
        ],
    )
}

fn admin_query(a: &Ask) -> String {
    format!("?tenant={}", a.tenant_param)
}

fn since_month_ago() -> (i64, i64) {
    let now = chrono::Utc::now().timestamp_millis();
    (now - 30 * 86_400_000, now + 86_400_000)
}

/// Every entry. Keep one per (method, path) of the router, and at least
/// one per WebSocket message kind.
pub fn table() -> Vec<Entry> {
    vec![
        Entry {
            http: route!("GET", "/v0/channels"),
            about: "the WebSocket upgrade: each message kind has its own entries below",
            build: |_| Vec::new(),
            ..E
        },
        Entry {
            http: route!("GET", "/healthz"),
            about: "liveness, names nothing",
            build: |_| http("GET", "/healthz".into(), None),
            ..E
        },
        Entry {
            http: route!("GET", "/readyz"),
            about: "readiness, names nothing",
            build: |_| http("GET", "/readyz".into(), None),
            ..E
        },
        Entry {
            http: route!("POST", "/v1/groups"),
            names: Names::Topic,
            about: "create a group under the target's name",
            creates: true,
            build: |a| {
                http(
                    "POST",
                    "/v1/groups".into(),
                    Some(json!({"topic": a.name.name, "name": a.text(), "members": []})),
                )
            },
            ..E
        },
        Entry {
            http: route!("DELETE", "/v1/groups/{topic}"),
            late: true,
            names: Names::Topic,
            about: "dissolve",
            build: |a| http("DELETE", topic_path(a, "/v1/groups/{topic}"), None),
            ..E
        },
        Entry {
            http: route!("POST", "/v1/groups/{topic}/members"),
            names: Names::Topic,
            about: "add oneself as a member",
            build: |a| {
                http(
                    "POST",
                    topic_path(a, "/v1/groups/{topic}/members"),
                    Some(json!({"uid": a.me})),
                )
            },
            ..E
        },
        Entry {
            http: route!("DELETE", "/v1/groups/{topic}/members/{uid}"),
            late: true,
            names: Names::Topic,
            about: "kick a member",
            build: |a| {
                http(
                    "DELETE",
                    topic_path(a, "/v1/groups/{topic}/members/{uid}"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/groups/{topic}/members/{uid}/role"),
            names: Names::Topic,
            about: "make someone (oneself) an admin",
            build: |a| {
                http(
                    "PUT",
                    topic_path(a, "/v1/groups/{topic}/members/{uid}/role"),
                    Some(json!({"role": "admin"})),
                )
            },
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/groups/{topic}/members/{uid}/mute"),
            names: Names::Topic,
            about: "mute a member",
            build: |a| {
                http(
                    "PUT",
                    topic_path(a, "/v1/groups/{topic}/members/{uid}/mute"),
                    Some(json!({"until": "2099-01-01T00:00:00Z"})),
                )
            },
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/groups/{topic}/owner"),
            names: Names::Topic,
            about: "take ownership",
            build: |a| {
                http(
                    "PUT",
                    topic_path(a, "/v1/groups/{topic}/owner"),
                    Some(json!({"uid": a.me})),
                )
            },
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/groups/{topic}/mute"),
            names: Names::Topic,
            about: "mute everyone",
            build: |a| {
                http(
                    "PUT",
                    topic_path(a, "/v1/groups/{topic}/mute"),
                    Some(json!({"mute_all": true})),
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/groups/{topic}/messages"),
            names: Names::Topic,
            about: "send (sometimes with a victim's client_msg_id)",
            build: |a| {
                http(
                    "POST",
                    topic_path(a, "/v1/groups/{topic}/messages"),
                    Some(json!({"content": {"txt": a.text()}, "client_msg_id": a.cmid()})),
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/groups/{topic}/messages"),
            names: Names::Topic,
            about: "read history",
            build: |a| {
                let q = if a.pick % 2 == 0 {
                    "?limit=100"
                } else {
                    "?since=1&limit=100"
                };
                http(
                    "GET",
                    topic_path(a, "/v1/groups/{topic}/messages") + q,
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/groups/{topic}/messages/{seq}"),
            names: Names::Message,
            about: "read one message",
            build: |a| {
                http(
                    "GET",
                    topic_path(a, "/v1/groups/{topic}/messages/{seq}"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("PATCH", "/v1/groups/{topic}/messages/{seq}"),
            names: Names::Message,
            about: "edit a message",
            build: |a| {
                http(
                    "PATCH",
                    topic_path(a, "/v1/groups/{topic}/messages/{seq}"),
                    Some(json!({"content": {"txt": a.text()}})),
                )
            },
            ..E
        },
        Entry {
            http: route!("DELETE", "/v1/groups/{topic}/messages/{seq}"),
            late: true,
            names: Names::Message,
            about: "recall or delete a message for everyone",
            build: |a| {
                http(
                    "DELETE",
                    topic_path(a, "/v1/groups/{topic}/messages/{seq}"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/groups/{topic}/messages/{seq}/context"),
            names: Names::Message,
            about: "read around a message",
            build: |a| {
                http(
                    "GET",
                    topic_path(a, "/v1/groups/{topic}/messages/{seq}/context?n=50"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/groups/{topic}/messages/{seq}/report"),
            names: Names::Message,
            about: "report a message",
            build: |a| {
                http(
                    "POST",
                    topic_path(a, "/v1/groups/{topic}/messages/{seq}/report"),
                    Some(json!({"reason": a.text()})),
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/groups/{topic}/files"),
            names: Names::Topic,
            about: "list the conversation's files",
            build: |a| http("GET", topic_path(a, "/v1/groups/{topic}/files"), None),
            ..E
        },
        Entry {
            http: route!("GET", "/v1/me/favorites"),
            about: "the caller's own favorites (read after the favorite attacks too)",
            build: |_| http("GET", "/v1/me/favorites?limit=50".into(), None),
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/me/favorites/{topic}/{seq}"),
            names: Names::Message,
            about: "save a message as a favorite",
            build: |a| http("PUT", topic_path(a, "/v1/me/favorites/{topic}/{seq}"), None),
            ..E
        },
        Entry {
            http: route!("DELETE", "/v1/me/favorites/{topic}/{seq}"),
            names: Names::Message,
            about: "drop a favorite (one's own reference, member or not)",
            always_own: true,
            build: |a| {
                http(
                    "DELETE",
                    topic_path(a, "/v1/me/favorites/{topic}/{seq}"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/admin/reports"),
            names: Names::Tenant,
            about: "the moderation queue",
            admin: true,
            build: |a| {
                http(
                    "GET",
                    format!("/v1/admin/reports{}&limit=100", admin_query(a)),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/reports/{report_id}/resolve"),
            names: Names::Report,
            about: "close a report",
            admin: true,
            build: |a| {
                http(
                    "POST",
                    format!(
                        "/v1/admin/reports/{}/resolve{}",
                        a.name.path,
                        admin_query(a)
                    ),
                    Some(json!({"resolution": "dismissed", "note": a.text()})),
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/groups/{topic}/search"),
            names: Names::Topic,
            about: "search one conversation",
            build: |a| {
                let (from, to) = since_month_ago();
                http(
                    "GET",
                    topic_path(a, "/v1/groups/{topic}/search")
                        + &format!("?q=secret&from={from}&to={to}&limit=50"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/users/{peer}/messages"),
            names: Names::User,
            about: "send one-to-one (the caller's own conversation with the peer)",
            always_own: true,
            blocked_refused: true,
            build: |a| {
                http(
                    "POST",
                    user_path(a, "/v1/users/{peer}/messages"),
                    Some(json!({"content": {"txt": a.text()}, "client_msg_id": a.cmid()})),
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/users/{peer}/messages"),
            names: Names::User,
            about: "read one-to-one history (the caller's own conversation)",
            always_own: true,
            build: |a| {
                http(
                    "GET",
                    user_path(a, "/v1/users/{peer}/messages") + "?limit=100",
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/groups/{topic}/history/clear"),
            late: true,
            names: Names::Topic,
            about: "clear history from one's view",
            build: |a| {
                http(
                    "POST",
                    topic_path(a, "/v1/groups/{topic}/history/clear"),
                    Some(json!({"ranges": [{"low": 1, "hi": 1_000_000}]})),
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/users/{uid}/devices/{device}/revoke"),
            names: Names::User,
            about: "revoke a victim's device",
            admin: true,
            build: |a| {
                http(
                    "POST",
                    user_path(a, "/v1/admin/users/{uid}/devices/{device}/revoke") + &admin_query(a),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/users/{uid}/signout"),
            names: Names::User,
            about: "sign a victim out everywhere",
            admin: true,
            build: |a| {
                http(
                    "POST",
                    user_path(a, "/v1/admin/users/{uid}/signout") + &admin_query(a),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/users/{uid}/disable"),
            names: Names::User,
            about: "disable a victim",
            admin: true,
            build: |a| {
                http(
                    "POST",
                    user_path(a, "/v1/admin/users/{uid}/disable") + &admin_query(a),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/users/{uid}/enable"),
            names: Names::User,
            about: "enable a user",
            admin: true,
            build: |a| {
                http(
                    "POST",
                    user_path(a, "/v1/admin/users/{uid}/enable") + &admin_query(a),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/commands"),
            names: Names::Topic,
            about: "an operator command on the victims' group or users",
            admin: true,
            build: |a| {
                let tenant = percent_decode(&a.tenant_param);
                let mut body = json!({
                    "command_id": format!("atk-{}-{}", a.run, a.n),
                    "tenant": tenant,
                    "reason": a.text(),
                });
                match a.pick % 4 {
                    0 => {
                        body["kind"] = json!("group.delete");
                        body["topic"] = json!(a.name.name);
                    }
                    1 => {
                        body["kind"] = json!("group.member.remove");
                        body["topic"] = json!(a.name.name);
                        body["uid"] = json!(a.other_uid);
                    }
                    2 => {
                        body["kind"] = json!("message.moderate");
                        body["topic"] = json!(a.name.name);
                        body["seq"] = json!(a.seq.max(1));
                    }
                    _ => {
                        body["kind"] = json!("user.disable");
                        body["uid"] = json!(a.other_uid);
                    }
                }
                http("POST", "/v1/admin/commands".into(), Some(body))
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/admin/stats"),
            names: Names::Tenant,
            about: "a tenant's statistics (and one topic's)",
            admin: true,
            build: |a| http("GET", format!("/v1/admin/stats{}", admin_query(a)), None),
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/notifications"),
            names: Names::User,
            about: "notify a victim",
            admin: true,
            build: |a| {
                http(
                    "POST",
                    "/v1/admin/notifications".into(),
                    Some(
                        json!({"tenant": percent_decode(&a.tenant_param), "uid": a.uid_json(),
                                "title": a.text(), "text": a.text()}),
                    ),
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/admin/badges"),
            names: Names::User,
            about: "set a victim's badge",
            admin: true,
            build: |a| {
                http(
                    "POST",
                    "/v1/admin/badges".into(),
                    Some(
                        json!({"tenant": percent_decode(&a.tenant_param), "uid": a.uid_json(),
                                "unread": 99}),
                    ),
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/friends/requests"),
            names: Names::User,
            about: "ask a victim for friendship",
            always_own: true,
            blocked_refused: true,
            build: |a| {
                http(
                    "POST",
                    "/v1/friends/requests".into(),
                    Some(json!({"uid": a.uid_json(), "message": a.text()})),
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/friends/requests/{uid}/accept"),
            names: Names::User,
            about: "accept a request (only one addressed to the caller)",
            always_own: true,
            build: |a| {
                http(
                    "POST",
                    user_path(a, "/v1/friends/requests/{uid}/accept"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("DELETE", "/v1/friends/{uid}"),
            names: Names::User,
            about: "end a friendship (the caller's own)",
            always_own: true,
            build: |a| http("DELETE", user_path(a, "/v1/friends/{uid}"), None),
            ..E
        },
        Entry {
            http: route!("POST", "/v1/blocks"),
            names: Names::User,
            about: "block a victim (the caller's own list)",
            always_own: true,
            build: |a| {
                http(
                    "POST",
                    "/v1/blocks".into(),
                    Some(json!({"uid": a.uid_json()})),
                )
            },
            ..E
        },
        Entry {
            http: route!("DELETE", "/v1/blocks/{uid}"),
            names: Names::User,
            about: "unblock (the caller's own list; never a victim's block of the caller)",
            always_own: true,
            build: |a| http("DELETE", user_path(a, "/v1/blocks/{uid}"), None),
            ..E
        },
        Entry {
            http: route!("GET", "/v1/me/conversations"),
            about: "the caller's own chat list (read after every attack: previews must not leak)",
            build: |_| {
                http(
                    "GET",
                    "/v1/me/conversations?limit=100&catchup=50".into(),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/me/unread"),
            about: "the caller's own badge",
            build: |_| http("GET", "/v1/me/unread".into(), None),
            ..E
        },
        Entry {
            http: route!("GET", "/v1/me/settings"),
            about: "the caller's own add policy",
            build: |_| http("GET", "/v1/me/settings".into(), None),
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/me/settings"),
            about: "set the caller's own add policy",
            always_own: true,
            build: |_| {
                http(
                    "PUT",
                    "/v1/me/settings".into(),
                    Some(json!({"add_policy": "contacts"})),
                )
            },
            ..E
        },
        Entry {
            http: route!("POST", "/v1/groups/{topic}/invitation"),
            names: Names::Topic,
            about: "accept an invitation one was never given (join uninvited)",
            build: |a| http("POST", topic_path(a, "/v1/groups/{topic}/invitation"), None),
            ..E
        },
        Entry {
            http: route!("DELETE", "/v1/groups/{topic}/invitation"),
            names: Names::Topic,
            about: "decline an invitation one was never given",
            build: |a| {
                http(
                    "DELETE",
                    topic_path(a, "/v1/groups/{topic}/invitation"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/search"),
            names: Names::Topic,
            about: "search the caller's conversations, or one named",
            build: |a| {
                let (from, to) = since_month_ago();
                let scope = if a.pick % 4 == 0 {
                    String::new()
                } else {
                    format!("&topic={}", a.name.path)
                };
                http(
                    "GET",
                    format!("/v1/search?q=secret&from={from}&to={to}{scope}"),
                    None,
                )
            },
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/me/profile"),
            about: "the caller's own profile",
            build: |a| {
                http(
                    "PUT",
                    "/v1/me/profile".into(),
                    Some(json!({"fn": format!("attacker {}", a.me)})),
                )
            },
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/me/password"),
            about: "the caller's own password (the old one guessed)",
            build: |a| {
                http(
                    "PUT",
                    "/v1/me/password".into(),
                    Some(
                        json!({"old_password": a.text(), "new_password": format!("{}-new", a.text())}),
                    ),
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/me/notifications"),
            about: "the caller's own notifications (scanned for the victims')",
            build: |_| http("GET", "/v1/me/notifications?limit=100".into(), None),
            ..E
        },
        Entry {
            http: route!("POST", "/v1/me/notifications/read"),
            about:
                "mark the caller's own notifications read (an id of anyone else's marks nothing)",
            always_own: true,
            build: |a| {
                http(
                    "POST",
                    "/v1/me/notifications/read".into(),
                    Some(json!({"ids": [a.text()]})),
                )
            },
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/groups/{topic}/profile"),
            names: Names::Topic,
            about: "rename the group",
            build: |a| {
                http(
                    "PUT",
                    topic_path(a, "/v1/groups/{topic}/profile"),
                    Some(json!({"fn": a.text(), "description": a.text()})),
                )
            },
            ..E
        },
        Entry {
            http: route!("GET", "/v1/groups/{topic}/subscribers"),
            names: Names::Topic,
            about: "list the members",
            build: |a| http("GET", topic_path(a, "/v1/groups/{topic}/subscribers"), None),
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/me/push"),
            about: "the caller's own do-not-disturb",
            build: |_| http("PUT", "/v1/me/push".into(), Some(json!({"dnd": false}))),
            ..E
        },
        Entry {
            http: route!("PUT", "/v1/me/push/topics/{topic}"),
            names: Names::Topic,
            about: "mute a conversation's pushes (the caller's own setting)",
            always_own: true,
            build: |a| {
                http(
                    "PUT",
                    topic_path(a, "/v1/me/push/topics/{topic}"),
                    Some(json!({"muted": true})),
                )
            },
            ..E
        },
        // The web app (served with gateway.webapp_dir only).
        Entry {
            http: route!("POST", "/v0/file/u/"),
            names: Names::File,
            about: "file upload (the attacker's own file, never a victim's)",
            build: |_| http("POST", "/v0/file/u/".into(), Some(json!({}))),
            ..E
        },
        Entry {
            http: route!("GET", "/v0/file/s/{*path}"),
            names: Names::StoredFile,
            about: "file download: a victim's file by its id, guessed and tricked spellings",
            build: |a| http("GET", format!("/v0/file/s/{}", a.name.path), None),
            ..E
        },
        Entry {
            http: route!("ANY", "{fallback}"),
            names: Names::File,
            about: "the web app's files",
            build: |a| http("GET", format!("/{}", a.name.path), None),
            ..E
        },
        // WebSocket message kinds.
        Entry {
            ws: Some("hi"),
            about: "the greeting, names nothing",
            build: |_| vec![ws(json!({"hi": {"ver": "0.25.3"}}))],
            always_own: true,
            ..E
        },
        Entry {
            ws: Some("acc"),
            about: "sign-up (refused), and a password change naming a victim's account",
            build: |a| {
                vec![
                    ws(json!({"acc": {"user": "new", "scheme": "basic",
                        "secret": "bWFsbG9yeTpwYXNzd29yZCAx"}})),
                    ws(
                        json!({"acc": {"user": format!("usr{}", a.other_uid), "scheme": "basic",
                        "secret": "OnRha2VuIG92ZXIgMTIz"}}),
                    ),
                ]
            },
            ..E
        },
        Entry {
            ws: Some("login"),
            names: Names::Login,
            about: "password login with spellings of a victim's login",
            build: |_| Vec::new(),
            ..E
        },
        Entry {
            ws: Some("sub"),
            names: Names::Topic,
            about: "attach",
            build: |a| {
                vec![
                    ws(json!({"sub": {"topic": a.name.name,
                        "get": {"what": "desc sub data del", "data": {"limit": 100}}}})),
                    ws_setup(json!({"leave": {"topic": a.name.name}})),
                ]
            },
            ..E
        },
        Entry {
            ws: Some("pub"),
            names: Names::Topic,
            about: "publish",
            build: |a| {
                vec![
                    ws_setup(json!({"sub": {"topic": a.name.name}})),
                    ws(
                        json!({"pub": {"topic": a.name.name, "content": {"txt": a.text()},
                        "head": {"client_mid": a.cmid()}}}),
                    ),
                    ws_setup(json!({"leave": {"topic": a.name.name}})),
                ]
            },
            ..E
        },
        Entry {
            ws: Some("get"),
            names: Names::Topic,
            about: "read desc, members, history and deletes",
            build: |a| {
                ["desc", "sub", "data", "del"]
                    .iter()
                    .map(|what| {
                        ws(json!({"get": {"topic": a.name.name, "what": what,
                            "data": {"since": 1, "limit": 100}}}))
                    })
                    .collect()
            },
            ..E
        },
        Entry {
            ws: Some("leave"),
            late: true,
            names: Names::Topic,
            about: "leave for good (unsub)",
            build: |a| {
                vec![
                    ws_setup(json!({"sub": {"topic": a.name.name}})),
                    ws(json!({"leave": {"topic": a.name.name, "unsub": true}})),
                ]
            },
            ..E
        },
        Entry {
            ws: Some("note"),
            names: Names::Topic,
            about: "read and typing notes",
            build: |a| {
                vec![
                    ws_setup(json!({"sub": {"topic": a.name.name}})),
                    Step::WsNote(
                        json!({"note": {"topic": a.name.name, "what": "read", "seq": a.seq.max(1)}}),
                    ),
                    Step::WsNote(
                        json!({"note": {"topic": a.name.name, "what": "recv", "seq": a.seq.max(1)}}),
                    ),
                    Step::WsNote(json!({"note": {"topic": a.name.name, "what": "kp"}})),
                    ws_setup(json!({"leave": {"topic": a.name.name}})),
                ]
            },
            ..E
        },
        Entry {
            ws: Some("del"),
            late: true,
            names: Names::Topic,
            about: "delete messages (own view, then for everyone)",
            build: |a| {
                vec![
                    ws(json!({"del": {"topic": a.name.name, "what": "msg",
                        "delseq": [{"low": 1, "hi": 1_000_000}]}})),
                    ws(
                        json!({"del": {"topic": a.name.name, "what": "msg", "hard": true,
                        "delseq": [{"low": a.seq.max(1)}]}}),
                    ),
                ]
            },
            ..E
        },
        Entry {
            ws: Some("set"),
            names: Names::Topic,
            about: "set the group's profile",
            build: |a| {
                vec![ws(json!({"set": {"topic": a.name.name,
                    "desc": {"public": {"fn": a.text()}}}}))]
            },
            ..E
        },
        Entry {
            ws: Some("set"),
            names: Names::Topic,
            about: "mute, then block and unblock the chat ({set sub mode}): the caller's own",
            always_own: true,
            build: |a| {
                ["JRWS", "RWA", "JRWPA"]
                    .iter()
                    .map(|mode| ws(json!({"set": {"topic": a.name.name, "sub": {"mode": mode}}})))
                    .collect()
            },
            ..E
        },
        Entry {
            ws: Some("set"),
            names: Names::Topic,
            about: "archive, then restore the chat ({set desc private}): the caller's own",
            always_own: true,
            build: |a| {
                [json!({"arch": true}), json!({"arch": "\u{2421}"})]
                    .into_iter()
                    .map(|p| ws(json!({"set": {"topic": a.name.name, "desc": {"private": p}}})))
                    .collect()
            },
            ..E
        },
        Entry {
            ws: Some("set"),
            names: Names::Topic,
            about: "pin the chat's first message, then unpin ({set aux pins})",
            build: |a| {
                vec![
                    ws(json!({"set": {"topic": a.name.name, "aux": {"pins": [1]}}})),
                    ws(json!({"set": {"topic": a.name.name, "aux": {"pins": "\u{2421}"}}})),
                ]
            },
            ..E
        },
        Entry {
            ws: Some("set"),
            names: Names::Topic,
            about: "add someone to the group ({set sub user})",
            build: |a| {
                vec![ws(json!({"set": {"topic": a.name.name,
                    "sub": {"user": format!("usr{}", a.other_uid), "mode": null}}}))]
            },
            ..E
        },
        Entry {
            ws: Some("del"),
            late: true,
            names: Names::Topic,
            about: "remove a member ({del what=sub})",
            build: |a| {
                vec![ws(json!({"del": {"topic": a.name.name, "what": "sub",
                    "user": format!("usr{}", a.other_uid)}}))]
            },
            ..E
        },
        Entry {
            ws: Some("del"),
            late: true,
            names: Names::Topic,
            about: "delete the chat ({del what=topic}: dissolve or leave)",
            build: |a| {
                vec![ws(
                    json!({"del": {"topic": a.name.name, "what": "topic", "hard": true}}),
                )]
            },
            ..E
        },
        Entry {
            ws: Some("sub"),
            names: Names::Nothing,
            about: "create a group ({sub topic=new…}): the caller's own",
            always_own: true,
            build: |a| {
                vec![ws(json!({"sub": {"topic": format!("new{}", a.n),
                    "set": {"desc": {"public": {"fn": a.text()}}}}}))]
            },
            ..E
        },
        Entry {
            ws: Some("set"),
            names: Names::Fnd,
            about: "fnd: find a victim by id and name",
            always_own: true,
            notes_secret: true,
            build: |a| {
                vec![
                    ws(json!({"set": {"topic": "fnd", "desc": {"public": a.name.name}}})),
                    ws(json!({"get": {"topic": "fnd", "what": "sub"}})),
                ]
            },
            ..E
        },
    ]
}

/// Percent-encoded text back to what a server decodes it to.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Differences between the router's routes and the table: routes with no
/// entry, and entries for routes the router does not have.
pub fn check_complete(routes: &[imstream::routes::RouteInfo], table: &[Entry]) -> Vec<String> {
    use std::collections::BTreeSet;
    let served: BTreeSet<(String, String)> = routes
        .iter()
        .flat_map(|r| {
            r.methods
                .iter()
                .map(move |m| (m.to_string(), r.path.to_string()))
        })
        .collect();
    let listed: BTreeSet<(String, String)> = table
        .iter()
        .filter_map(|e| e.http)
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let mut problems = Vec::new();
    for (m, p) in served.difference(&listed) {
        problems.push(format!(
            "the router serves {m} {p}, which has no entry in the attack table (tests/adversary/table.rs)"
        ));
    }
    for (m, p) in listed.difference(&served) {
        problems.push(format!(
            "the attack table lists {m} {p}, which the router no longer has"
        ));
    }
    let kinds: BTreeSet<&str> = table.iter().filter_map(|e| e.ws).collect();
    for k in imstream::gateway::session::CLIENT_MESSAGE_KINDS {
        if !kinds.contains(k) {
            problems.push(format!(
                "the WebSocket session dispatches {{{k}}}, which has no entry in the attack table"
            ));
        }
    }
    for k in &kinds {
        if !imstream::gateway::session::CLIENT_MESSAGE_KINDS.contains(k) {
            problems.push(format!(
                "the attack table lists {{{k}}}, which the session no longer dispatches"
            ));
        }
    }
    problems
}
