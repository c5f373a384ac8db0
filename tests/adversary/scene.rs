//! The victims: a group with members, messages, a file, a report and a
//! favorite, a member who was removed (the members pipeline applied it),
//! a one-to-one pair with messages whose topic name has case twins among
//! small uids, a user they blocked, profiles with private notes and a
//! password login. And what "the victims' data" is: their history, chat
//! list entries, member list, favorites, files and the report queue, as the
//! victims read them through the API, each with a sha256.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::client::{http, HttpAnswer};
use super::names::{p2p_case_pairs, p2p_topic};
use super::rng::Rng;
use crate::common::{process, wait_for, Stack};

/// How long a pipeline may take to apply a change.
pub const APPLIED: Duration = Duration::from_secs(60);

/// The pipelines running under the gateway: everything a victim's data is
/// made of (the hot-message cache is left out, so history reads go to
/// MySQL, the record every other read is checked against).
pub const PIPELINES: &[&str] = &[
    "store",
    "members",
    "conversations",
    "relations",
    "references",
    "receipts",
    "control",
];

pub struct Scene {
    pub stack: Stack,
    /// The gateway's public address (the WebSocket's too).
    pub addr: SocketAddr,
    /// Each listener of the gateway by name (`public`, ...).
    pub listeners: BTreeMap<String, SocketAddr>,
    pub http: reqwest::Client,
    pub tenant: String,
    /// A second tenant, with the same uids as the victims'.
    pub tenant_b: String,
    /// An operator's admin token for tenant B only.
    pub admin_b: String,
    /// The run's marker: every secret below contains it.
    pub run: String,
    pub group: String,
    pub owner: i64,
    pub admin: i64,
    pub member: i64,
    pub removed: i64,
    pub blocked: i64,
    pub p: i64,
    pub q: i64,
    pub pq: String,
    pub group_seqs: Vec<i64>,
    pub pq_seqs: Vec<i64>,
    pub report_id: String,
    /// Ids of files the victims uploaded and sent (each holds a secret).
    pub stored_files: Vec<String>,
    /// Text only a victim (or the tenant's operator) may ever see: message
    /// contents, the file's name, the report's reason.
    pub secrets: Vec<String>,
    /// The victims' profile notes (what `fnd` must not show a stranger).
    pub notes: Vec<String>,
    /// Victim P's password login (`auth.basic`).
    pub login: String,
    /// Uids pairs (attacker, peer) whose p2p name differs from `pq` only in
    /// letter case.
    pub case_pairs: Vec<(i64, i64)>,
    /// Uids handed out so far (victims, attackers), never reused.
    pub used: std::collections::BTreeSet<i64>,
}

pub const PASSWORD: &str = "the victims' long passphrase";

impl Scene {
    pub fn token(&self, uid: i64) -> String {
        self.stack.token(uid, "adversary")
    }

    pub fn token_in(&self, tenant: &str, uid: i64, device: &str) -> String {
        imstream::auth::Tokens::new(self.stack.config())
            .issue(tenant, uid, device, 0, 0)
            .token
    }

    pub async fn call(
        &self,
        uid: i64,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> HttpAnswer {
        http(
            &self.http,
            self.addr,
            method,
            path,
            &self.token(uid),
            body.as_ref(),
        )
        .await
    }

    /// `uid` sends the group a message with the file `name` at `link`;
    /// its seq is one of the group's.
    async fn send_file(&mut self, uid: i64, name: &str, link: &str, cmid: &str) {
        let content = json!({
            "txt": " ", "fmt": [{"at": -1, "len": 0, "key": 0}],
            "ent": [{"tp": "EX", "data": {"mime": "text/plain", "name": name, "ref": link, "size": 42}}]
        });
        let path = format!("/v1/groups/{}/messages", self.group);
        let sent = self
            .ok(
                uid,
                "POST",
                &path,
                Some(json!({"content": content, "client_msg_id": cmid})),
            )
            .await;
        self.group_seqs.push(sent["seq"].as_i64().expect("seq"));
    }

    /// Uploads `text` as `uid`'s file (`POST /v0/file/u/`, as Tinode's
    /// clients do); its id.
    pub async fn upload(&self, uid: i64, text: &str) -> String {
        let boundary = "adversary-scene-boundary";
        let body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n\
             Content-Type: text/plain\r\n\r\n{text}\r\n--{boundary}--\r\n"
        );
        let resp = self
            .http
            .post(format!("http://{}/v0/file/u/", self.addr))
            .header("X-Tinode-Auth", format!("Token {}", self.token(uid)))
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .send()
            .await
            .expect("gateway reachable");
        let answer: Value = resp.json().await.expect("a {ctrl}");
        let url = answer["ctrl"]["params"]["url"]
            .as_str()
            .unwrap_or_else(|| panic!("setup: upload as usr{uid}: {answer}"));
        url.trim_start_matches("/v0/file/s/").to_string()
    }

    /// A call that must succeed; its JSON.
    pub async fn ok(&self, uid: i64, method: &str, path: &str, body: Option<Value>) -> Value {
        let a = self.call(uid, method, path, body).await;
        assert!(
            (200..300).contains(&a.status),
            "setup: {method} {path} as usr{uid}: {} {}",
            a.status,
            a.body
        );
        serde_json::from_str(&a.body).unwrap_or(Value::Null)
    }

    /// The address of the listener that serves `method path`, if this
    /// gateway serves it.
    pub fn addr_of(&self, method: &str, path: &str) -> Option<SocketAddr> {
        let route = self.stack.gateways[0]
            .routes
            .iter()
            .find(|r| r.served && r.path == path && r.methods.contains(&method))?;
        Some(*self.listeners.get(route.listener).unwrap_or_else(|| {
            panic!(
                "{method} {path} is on listener {:?}, whose address RunningGateway::listeners does not give",
                route.listener
            )
        }))
    }

    /// A fresh uid in `lo..hi`.
    pub fn fresh_uid(&mut self, rng: &mut Rng, lo: i64, hi: i64) -> i64 {
        loop {
            let u = rng.range(lo as u64, hi as u64) as i64;
            if self.used.insert(u) {
                return u;
            }
        }
    }

    pub async fn build(rng: &mut Rng) -> Scene {
        // The victims' pair first: small dense uids whose topic name has a
        // case twin that includes one of them (the real attack).
        let (p, q, case_pairs) = loop {
            let p = rng.range(1000, 1400) as i64;
            let q = rng.range(1000, 1400) as i64;
            if p == q {
                continue;
            }
            let pq = p2p_topic(p, q);
            let pairs = p2p_case_pairs(&pq, 3, i64::from(i32::MAX));
            let mut with_victim: Vec<(i64, i64)> = pairs
                .iter()
                .filter_map(|&(lo, hi)| match (lo, hi) {
                    (v, x) | (x, v) if v == p || v == q => Some((x, v)),
                    _ => None,
                })
                .filter(|(x, _)| *x != p && *x != q)
                .collect();
            if with_victim.is_empty() {
                continue;
            }
            with_victim.sort_by_key(|(x, _)| *x);
            // Up to two twins with a victim, and one of two strangers.
            let mut chosen: Vec<(i64, i64)> = with_victim.into_iter().take(2).collect();
            if let Some(&(lo, hi)) = pairs
                .iter()
                .filter(|(lo, hi)| ![*lo, *hi].iter().any(|u| *u == p || *u == q))
                .min_by_key(|(_, hi)| *hi)
            {
                chosen.push((lo, hi));
            }
            break (p, q, chosen);
        };
        let run = rng.alnum(8);
        let mut used: std::collections::BTreeSet<i64> = [p, q].into_iter().collect();
        for (x, y) in &case_pairs {
            used.insert(*x);
            used.insert(*y);
        }
        let tenant_b_id = std::cell::RefCell::new(String::new());
        let admin_b = format!("ops-b-{}", uuid::Uuid::new_v4().simple());
        let login = format!("victim.{}@example.com", run.to_ascii_lowercase());
        let mut stack = Stack::prepared_with(None, |c| {
            let a = c.tenants[0].clone();
            let b = imstream::config::TenantConfig {
                id: format!("{}_b", a.id),
                database: format!("{}_b", a.database),
                signing_keys: Vec::new(),
                ..Default::default()
            };
            *tenant_b_id.borrow_mut() = b.id.clone();
            c.auth.admin_tokens.push(imstream::config::AdminToken {
                name: "ops-b".into(),
                token: admin_b.clone(),
                tenant: Some(b.id.clone()),
            });
            c.auth.basic.tenants = vec![a.id.clone()];
            // A lockout that outlasts the run (the login attack checks it).
            c.limits.login_lockout_ms = 600_000;
            c.limits.login_lockout_max_ms = 600_000;
            // The operator listener's throttle of failed admin tokens (per
            // address, loopback too) shares that lockout: out of the way,
            // or the victims' report queue could not be read after the
            // first attacks (tests/security_admin.rs tests the throttle).
            c.limits.admin_failures = 1_000_000;
            // Likewise the per-user bucket of changes: an attack must be
            // refused by what it attempts, not because the attacker ran out
            // of tokens (tests/insider.rs tests the bucket).
            // The other per-user buckets too: the insiders' generators
            // (field edges, oracles, cost) must reach the check they aim
            // at, not the bucket (tests/security_limits.rs tests those).
            let plenty = imstream::config::BucketConfig::new(1_000_000, 1_000_000);
            let l = &mut c.limits;
            for bucket in [
                &mut l.changes,
                &mut l.sends,
                &mut l.receipts,
                &mut l.clears,
                &mut l.searches,
                &mut l.finds,
                &mut l.group_creates,
                &mut l.member_adds,
                &mut l.friend_requests,
                &mut l.reports,
            ] {
                *bucket = plenty;
            }
            c.tenants.push(b);
            // The web app's routes too, where it is installed (`npm ci
            // --prefix webapp`, as docker/local/test does).
            let webapp = crate::common::repo_root().join("webapp");
            if webapp
                .join("node_modules/tinode-webapp/index.html")
                .is_file()
            {
                c.gateway.webapp_dir = webapp.display().to_string();
            }
        })
        .await;
        for p in PIPELINES {
            stack.start_pipeline(p).await;
        }
        let addr = stack.start_gateway("adversary").await;
        let listeners = stack.gateways[0]
            .listeners
            .iter()
            .map(|(name, addr)| (name.to_string(), *addr))
            .collect();
        let tenant = stack.tenant().to_string();
        let mut scene = Scene {
            stack,
            addr,
            listeners,
            http: reqwest::Client::new(),
            tenant,
            tenant_b: tenant_b_id.into_inner(),
            admin_b,
            group: String::new(),
            owner: 0,
            admin: 0,
            member: 0,
            removed: 0,
            blocked: 0,
            p,
            q,
            pq: p2p_topic(p, q),
            group_seqs: Vec::new(),
            pq_seqs: Vec::new(),
            report_id: String::new(),
            secrets: Vec::new(),
            stored_files: Vec::new(),
            notes: Vec::new(),
            login,
            case_pairs,
            used,
            run,
        };
        scene.owner = scene.fresh_uid(rng, 2000, 3000);
        scene.admin = scene.fresh_uid(rng, 2000, 3000);
        scene.member = scene.fresh_uid(rng, 2000, 3000);
        scene.removed = scene.fresh_uid(rng, 2000, 3000);
        scene.blocked = scene.fresh_uid(rng, 2000, 3000);
        // A short group name with letters in both cases: every case
        // variant of it is tried.
        scene.group = loop {
            let g = format!("grp{}", rng.alnum(4));
            let upper = g.chars().filter(|c| c.is_ascii_uppercase()).count();
            let lower = g[3..].chars().filter(|c| c.is_ascii_lowercase()).count();
            if upper >= 1 && lower >= 1 {
                break g;
            }
        };
        scene.populate().await;
        scene
    }

    fn secret(&mut self, what: &str) -> String {
        let s = format!("secret-{}-{}-{}", self.run, what, self.secrets.len());
        self.secrets.push(s.clone());
        s
    }

    async fn populate(&mut self) {
        let (g, o, a, m, r) = (
            self.group.clone(),
            self.owner,
            self.admin,
            self.member,
            self.removed,
        );
        // Profiles with private notes.
        for uid in [o, a, m, r, self.p, self.q] {
            let note = format!("note-{}-{uid}", self.run);
            self.notes.push(note.clone());
            self.ok(
                uid,
                "PUT",
                "/v1/me/profile",
                Some(json!({"fn": format!("Victim {uid} {}", self.run), "note": note})),
            )
            .await;
        }
        self.ok(
            o,
            "POST",
            "/v1/groups",
            Some(json!({"topic": g, "name": "the victims' room", "members": [a, m, r]})),
        )
        .await;
        self.wait_members(&[o, a, m, r]).await;
        self.ok(
            o,
            "PUT",
            &format!("/v1/groups/{g}/members/{a}/role"),
            Some(json!({"role": "admin"})),
        )
        .await;
        for (uid, what) in [(o, "g1"), (a, "g2"), (m, "g3"), (o, "g4")] {
            let text = self.secret(what);
            let sent = self
                .ok(
                    uid,
                    "POST",
                    &format!("/v1/groups/{g}/messages"),
                    Some(json!({"content": {"txt": text}, "client_msg_id": format!("v-{what}")})),
                )
                .await;
            self.group_seqs.push(sent["seq"].as_i64().expect("seq"));
        }
        let file = self.secret("file");
        let (name, link) = (
            format!("{file}.txt"),
            format!("https://files.example/{file}"),
        );
        self.send_file(m, &name, &link, "v-file").await;
        // A file the member uploads (its bytes a secret) and sends to the
        // group, while the removed member is still in it.
        let stored_text = self.secret("stored-file");
        let stored = self.upload(m, &stored_text).await;
        let link = format!("/v0/file/s/{stored}");
        self.send_file(m, "notes.txt", &link, "v-stored-file").await;
        self.stored_files.push(stored);
        // The removed member read the group while a member, then was removed.
        self.ok(r, "GET", &format!("/v1/groups/{g}/messages"), None)
            .await;
        self.ok(o, "DELETE", &format!("/v1/groups/{g}/members/{r}"), None)
            .await;
        self.wait_members(&[o, a, m]).await;
        wait_for("the removed member refused", APPLIED, || async {
            let a = self
                .call(r, "GET", &format!("/v1/groups/{g}/messages"), None)
                .await;
            if a.status == 403 {
                Ok(())
            } else {
                Err(format!("{} {}", a.status, a.body))
            }
        })
        .await;
        // The one-to-one pair.
        let (p, q) = (self.p, self.q);
        for (from, to, what) in [(p, q, "pq1"), (q, p, "pq2"), (p, q, "pq3")] {
            let text = self.secret(what);
            let sent = self
                .ok(
                    from,
                    "POST",
                    &format!("/v1/users/{to}/messages"),
                    Some(json!({"content": {"txt": text}, "client_msg_id": format!("v-{what}")})),
                )
                .await;
            self.pq_seqs.push(sent["seq"].as_i64().expect("seq"));
        }
        // A report of the owner's message (by the admin), and favorites.
        let reason = self.secret("report");
        let reported = self
            .ok(
                a,
                "POST",
                &format!("/v1/groups/{g}/messages/{}/report", self.group_seqs[0]),
                Some(json!({"reason": reason})),
            )
            .await;
        self.report_id = reported["report_id"].as_str().expect("report_id").into();
        self.ok(
            o,
            "PUT",
            &format!("/v1/me/favorites/{g}/{}", self.group_seqs[1]),
            None,
        )
        .await;
        self.ok(
            p,
            "PUT",
            &format!("/v1/me/favorites/usr{q}/{}", self.pq_seqs[1]),
            None,
        )
        .await;
        // Blocks: the owner and P block one user.
        let b = self.blocked;
        for uid in [o, p] {
            self.ok(uid, "POST", "/v1/blocks", Some(json!({"uid": b})))
                .await;
        }
        for victim in [o, p] {
            wait_for("the block applied", APPLIED, || async {
                let a = self
                    .call(
                        b,
                        "POST",
                        "/v1/friends/requests",
                        Some(json!({"uid": victim})),
                    )
                    .await;
                if a.status == 403 {
                    Ok(())
                } else {
                    Err(format!("{} {}", a.status, a.body))
                }
            })
            .await;
        }
        self.add_login().await;
        // Everything above applied: the report queued, the favorites saved.
        wait_for("the report and favorites applied", APPLIED, || async {
            let s = self.snapshot().await;
            let reports = s.get("reports").cloned().unwrap_or_default();
            let favs = s.get("favorites of P").cloned().unwrap_or_default();
            let favo = s.get("favorites of owner").cloned().unwrap_or_default();
            let has = |v: &Value, key: &str| v.to_string().contains(key);
            let queue_served = self.addr_of("GET", "/v1/admin/reports").is_some();
            if (!queue_served || has(&reports, &self.report_id))
                && has(&favs, &format!("usr{q}"))
                && has(&favo, &self.group)
                && has(&s["files"], "secret")
            {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        })
        .await;
    }

    async fn wait_members(&self, expected: &[i64]) {
        let mut expected: Vec<String> = expected.iter().map(|u| format!("usr{u}")).collect();
        expected.sort();
        let g = self.group.clone();
        wait_for("the group's members applied", APPLIED, || async {
            let a = self
                .call(
                    self.owner,
                    "GET",
                    &format!("/v1/groups/{g}/subscribers"),
                    None,
                )
                .await;
            let v: Value = serde_json::from_str(&a.body).unwrap_or(Value::Null);
            let mut got: Vec<String> = v["subscribers"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .filter_map(|m| m["user"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            got.sort();
            if got == expected {
                Ok(())
            } else {
                Err(format!("{} {}", a.status, a.body))
            }
        })
        .await;
    }

    /// `imstream users add` for P, password on stdin.
    async fn add_login(&self) {
        let uid = self.p.to_string();
        let args = [
            "users",
            "add",
            "--tenant",
            &self.tenant,
            "--uid",
            &uid,
            "--login",
            &self.login,
        ];
        let mut cmd = process::command(&self.stack.config_file("adversary"), &args);
        cmd.env_remove("IMSTREAM_PASSWORD").env("RUST_LOG", "error");
        let ran = process::run_async(cmd, Some(&format!("{PASSWORD}\n"))).await;
        assert!(ran.ok, "imstream users add: {}", ran.printed());
    }

    /// The victims' data as they read it, by part.
    pub async fn snapshot(&self) -> BTreeMap<String, Value> {
        let (g, o, p, q) = (self.group.as_str(), self.owner, self.p, self.q);
        let reads: Vec<(String, i64, String, Option<&str>)> = vec![
            (
                "history of the group (owner)".into(),
                o,
                format!("/v1/groups/{g}/messages?limit=100"),
                Some("messages"),
            ),
            (
                "history of the group (member)".into(),
                self.member,
                format!("/v1/groups/{g}/messages?limit=100"),
                Some("messages"),
            ),
            (
                "history of P-Q (P)".into(),
                p,
                format!("/v1/users/{q}/messages?limit=100"),
                Some("messages"),
            ),
            (
                "history of P-Q (Q)".into(),
                q,
                format!("/v1/users/{p}/messages?limit=100"),
                Some("messages"),
            ),
            (
                "members of the group".into(),
                o,
                format!("/v1/groups/{g}/subscribers"),
                Some("subscribers"),
            ),
            (
                "files".into(),
                o,
                format!("/v1/groups/{g}/files"),
                Some("files"),
            ),
            (
                "favorites of owner".into(),
                o,
                "/v1/me/favorites".into(),
                Some("favorites"),
            ),
            (
                "favorites of P".into(),
                p,
                "/v1/me/favorites".into(),
                Some("favorites"),
            ),
        ];
        let mut out = BTreeMap::new();
        for (name, uid, path, field) in reads {
            let a = self.call(uid, "GET", &path, None).await;
            out.insert(name, part(&a, field));
        }
        // Chat list entries of the victims' conversations.
        for (name, uid, topic) in [
            ("chat list of owner: the group", o, g.to_string()),
            ("chat list of member: the group", self.member, g.to_string()),
            ("chat list of P: Q", p, format!("usr{q}")),
            ("chat list of Q: P", q, format!("usr{p}")),
        ] {
            let a = self
                .call(uid, "GET", "/v1/me/conversations?limit=100", None)
                .await;
            let v = part(&a, Some("conversations"));
            let entry = v
                .as_array()
                .and_then(|l| l.iter().find(|c| c["topic"] == json!(topic)).cloned())
                .unwrap_or_else(|| json!({"missing": topic, "answer": v}));
            out.insert(name.to_string(), entry);
        }
        // The operators' queue, where this gateway serves it.
        let Some(admin) = self.addr_of("GET", "/v1/admin/reports") else {
            return out;
        };
        let reports = http(
            &self.http,
            admin,
            "GET",
            &format!("/v1/admin/reports?tenant={}&limit=100", self.tenant),
            &self.stack.config().auth.admin_token,
            None,
        )
        .await;
        // The queue is the tenant's: the victims' part of it is the reports
        // of their conversations, and any report showing their messages.
        let victims = [self.group.as_str(), self.pq.as_str()];
        let mine = |r: &Value| {
            r["topic"].as_str().is_some_and(|t| victims.contains(&t))
                || self
                    .secrets
                    .iter()
                    .any(|s| r.to_string().contains(s.as_str()))
        };
        let queue = match part(&reports, Some("reports")) {
            Value::Array(list) => Value::Array(list.into_iter().filter(mine).collect()),
            other => other,
        };
        out.insert("reports".into(), queue);
        out
    }
}

/// One part of an answer, without presence (`online`), or the failure.
fn part(a: &HttpAnswer, field: Option<&str>) -> Value {
    let v: Value = match serde_json::from_str(&a.body) {
        Ok(v) if (200..300).contains(&a.status) => v,
        _ => return json!({"status": a.status, "body": a.body}),
    };
    let mut v = match field {
        Some(f) => v.get(f).cloned().unwrap_or(Value::Null),
        None => v,
    };
    strip_presence(&mut v);
    v
}

fn strip_presence(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("online");
            for x in m.values_mut() {
                strip_presence(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_presence),
        _ => {}
    }
}

/// JSON with object keys sorted, so equal data hashes equal.
pub fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, String> =
                m.iter().map(|(k, x)| (k, canonical(x))).collect();
            let inner: Vec<String> = sorted
                .iter()
                .map(|(k, x)| format!("{}:{x}", Value::String((*k).clone())))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

pub fn sha256(v: &Value) -> String {
    hex::encode(Sha256::digest(canonical(v).as_bytes()))
}
