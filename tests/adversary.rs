//! The adversarial suite: generated attackers against victims with real
//! content, over every HTTP route the gateway's router serves and every
//! WebSocket message kind its session dispatches.
//!
//! - The attack table (tests/adversary/table.rs) must cover the router's
//!   own route list (`RunningGateway::routes`) and the session's
//!   `CLIENT_MESSAGE_KINDS`: a route or kind missing from it fails the
//!   suite by name, so a new endpoint cannot skip it.
//! - Victims (tests/adversary/scene.rs): a group with members, messages, a
//!   file, a report, favorites and a removed member; a one-to-one pair
//!   whose topic name has case twins among small uids; a user they
//!   blocked; private profile notes; a password login.
//! - Attackers: a stranger, the removed member, the blocked user, users of
//!   another tenant with the victims' very uids, users whose own
//!   one-to-one topic differs from the victims' only in letter case (found
//!   by search), a user who owns a case variant of the group's name, and
//!   another tenant's operator on the admin routes. Each tries every table
//!   entry with the target's real name and generated variants of it
//!   (letter case, Unicode look-alikes, invisible characters, padding,
//!   percent-encodings; uid spellings).
//! - Every answer must refuse (4xx) or touch only the attacker's own
//!   conversation; no answer may contain a victim's secret; after each
//!   entry the victims' data (history, chat list entries, members, files,
//!   favorites, the report queue: sha256 of each as the victims read it)
//!   must be unchanged, the victims' live sessions must have heard nothing
//!   from an attacker, and refused names must leave no sequence state.
//!   At the end the victims' next messages must be stored as theirs.
//!
//! Beside the table: the group write model's races and consent cases
//! (tests/adversary/governance.rs): two concurrent ownership transfers,
//! adds past a block, an oversized create, invitations instead of adds.
//!
//! Then the insiders (tests/adversary/insiders.rs): ordinary accounts and
//! operators within their rights — every entry with its fields at their
//! edges, one key shared by two users and an operator, a stranger's
//! answers for what exists against what does not, the cost of each
//! refused request, revocations followed in the same millisecond with the
//! projections stopped — and a Redis restart halfway through the table.
//!
//! `ADVERSARY_SEED=<n>` replays a run; `ADVERSARY_CASES=<n>` (default 3)
//! is the number of generated variants per attacker, entry and target;
//! `ADVERSARY_TRACE=<text>` prints every answer of the entries whose label
//! contains the text; `ADVERSARY_INSIDERS_ONLY=1` skips the table (and its
//! Redis restart) while working on the insiders.

#[path = "adversary/client.rs"]
mod client;
mod common;
#[path = "adversary/governance.rs"]
mod governance;
mod groups_support;
#[path = "adversary/insiders.rs"]
mod insiders;
#[path = "adversary/names.rs"]
mod names;
mod realtime_support;
#[path = "adversary/rng.rs"]
mod rng;
#[path = "adversary/scene.rs"]
mod scene;
#[path = "adversary/settle.rs"]
mod settle;
#[path = "adversary/table.rs"]
mod table;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use client::{WsAnswer, WsSession};
use imstream::tinode;
use names::Variant;
use rng::Rng;
use scene::Scene;
use table::{Ask, Entry, Names, Step};

const DEFAULT_CASES: usize = 3;

/// Held (read) by every test of this binary while it uses Redis, and
/// (write) by the main run's Redis restart: the restart waits for the
/// others, and they never see it.
pub static REDIS_IN_USE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Stranger,
    Removed,
    Blocked,
    OtherTenant,
    /// Its own one-to-one topic with `peer` differs from the victims' only
    /// in letter case.
    CaseTwin {
        peer: i64,
    },
    /// Owns (or tried to create) a group named like the victims' but for
    /// letter case.
    VariantOwner {
        group: String,
    },
    /// Another tenant's operator (admin routes only).
    Operator,
    /// Shares no conversation with the victims (the user search only).
    Searcher,
}

struct Attacker {
    label: String,
    kind: Kind,
    tenant: String,
    uid: i64,
    /// Its bearer: a user token, or the operator's admin token.
    bearer: String,
    ws: Option<WsSession>,
}

/// One target an attacker names, before variants.
#[derive(Clone)]
enum Base {
    Topic {
        name: String,
        own: bool,
    },
    /// A user, by uid (in paths and bodies: the number).
    User(i64),
    /// A user as a WebSocket topic: `usr<uid>`.
    UserTopic(i64),
    Message {
        topic: String,
        seq: i64,
        own: bool,
    },
    Report(String),
    Tenant(String),
    Query(String),
    File(String),
    /// A victim's uploaded file, by id.
    StoredFile(String),
    Nothing,
}

impl Base {
    fn label(&self) -> String {
        match self {
            Base::Topic { name, own } => format!("topic {name}{}", own_tag(*own)),
            Base::User(u) => format!("user {u}"),
            Base::UserTopic(u) => format!("topic usr{u}"),
            Base::Message { topic, seq, own } => format!("message {topic}/{seq}{}", own_tag(*own)),
            Base::Report(r) => format!("report {r}"),
            Base::Tenant(t) => format!("tenant {t}"),
            Base::Query(q) => format!("fnd {q:?}"),
            Base::File(f) => format!("file {f}"),
            Base::StoredFile(id) => format!("stored file {id}"),
            Base::Nothing => "-".into(),
        }
    }
}

fn own_tag(own: bool) -> &'static str {
    if own {
        " (the attacker's own)"
    } else {
        ""
    }
}

#[derive(Debug)]
struct Violation {
    entry: String,
    attacker: String,
    target: String,
    what: String,
}

#[derive(Default)]
struct Tally {
    routes: BTreeSet<String>,
    ws_kinds: BTreeSet<String>,
    attackers: BTreeSet<String>,
    variants: BTreeSet<String>,
    attacks: u64,
    requests: u64,
    codes: BTreeMap<i64, u64>,
    violations: Vec<Violation>,
    not_served: Vec<String>,
    /// The insiders' generators (tests/adversary/insiders.rs).
    redis_restart: Option<Duration>,
    refused_costs: usize,
    shared_keys: usize,
    edges: u64,
}

/// Makes the variants of one name.
type MakeVariants = Box<dyn FnOnce(&mut Rng) -> Vec<Variant>>;

/// Variants of one name, dealt in a seeded order: every variant is dealt
/// once before any is dealt again.
struct Deck {
    cards: Vec<Variant>,
    next: usize,
}

struct Run {
    scene: Scene,
    rng: Rng,
    cases: usize,
    table: Vec<Entry>,
    attackers: Vec<Attacker>,
    decks: HashMap<String, Deck>,
    /// (tenant, uid) -> groups it created.
    owned: BTreeSet<(String, i64, String)>,
    tally: Tally,
    baseline: BTreeMap<String, Value>,
    listeners: Vec<(String, String, WsSession)>,
    settle: settle::Settle,
    /// Names refused (or failed) so far: (tenant, name) -> the entries
    /// that refused them, for the state check.
    refused_names: BTreeMap<(String, String), BTreeSet<String>>,
    reported_keys: BTreeSet<String>,
    n: u64,
    /// Each entry's listener address (HTTP entries; the WebSocket's else).
    entry_addr: Vec<std::net::SocketAddr>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_attackers_reach_nothing_of_the_victims() {
    let seed = rng::seed_from_env();
    let cases = rng::cases_from_env(DEFAULT_CASES);
    eprintln!("adversary: ADVERSARY_SEED={seed} ADVERSARY_CASES={cases} (set them to replay)");
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let scene = Scene::build(&mut rng).await;
    eprintln!(
        "adversary: victims ready in {:.0?}: group {} (owner usr{}, admin usr{}, member usr{}, removed usr{}), pair usr{}/usr{} = {}, blocked usr{}; case twins {:?}",
        started.elapsed(),
        scene.group,
        scene.owner,
        scene.admin,
        scene.member,
        scene.removed,
        scene.p,
        scene.q,
        scene.pq,
        scene.blocked,
        scene
            .case_pairs
            .iter()
            .map(|(x, y)| format!("usr{x}+usr{y}={}", names::p2p_topic(*x, *y)))
            .collect::<Vec<_>>(),
    );
    let table = table::table();
    let routes = scene.stack.gateways[0].routes.clone();
    let missing = table::check_complete(&routes, &table);
    assert!(
        missing.is_empty(),
        "the attack table and the gateway disagree:\n{}",
        missing.join("\n")
    );
    let settle = settle::Settle::new(scene.stack.config(), scene::PIPELINES);
    let entry_addr = table
        .iter()
        .map(|e| match e.http {
            Some((m, p)) => scene.addr_of(m, p).unwrap_or(scene.addr),
            None => scene.addr,
        })
        .collect();
    let mut run = Run {
        scene,
        rng,
        cases,
        table,
        attackers: Vec::new(),
        decks: HashMap::new(),
        owned: BTreeSet::new(),
        tally: Tally::default(),
        baseline: BTreeMap::new(),
        listeners: Vec::new(),
        settle,
        refused_names: BTreeMap::new(),
        reported_keys: BTreeSet::new(),
        n: 0,
        entry_addr,
    };
    run.enlist().await;
    run.listen().await;
    let dlq_before = settle::dlq_depths(run.scene.stack.config(), scene::PIPELINES).await;
    run.settle_or_note("before the attacks").await;
    run.baseline = run.scene.snapshot().await;
    let again = run.scene.snapshot().await;
    assert_eq!(
        run.baseline, again,
        "the victims' data is not stable without any attack"
    );
    eprintln!(
        "adversary: victims' data: {}",
        run.baseline
            .iter()
            .map(|(k, v)| format!("{k}={}", &scene::sha256(v)[..12]))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let routes_served: BTreeMap<(String, String), bool> = routes
        .iter()
        .flat_map(|r| {
            r.methods
                .iter()
                .map(move |m| ((m.to_string(), r.path.to_string()), r.served))
        })
        .collect();
    // Entries that clear or dissolve what an attacker could read run last.
    let order: Vec<usize> = (0..run.table.len())
        .filter(|i| !run.table[*i].late)
        .chain((0..run.table.len()).filter(|i| run.table[*i].late))
        .collect();
    // A Redis restart (with the tenants' keys lost) halfway through.
    let halfway = order.len() / 2;
    // `ADVERSARY_INSIDERS_ONLY=1` (while working on them) skips the table.
    let table_order = if std::env::var("ADVERSARY_INSIDERS_ONLY").is_ok() {
        Vec::new()
    } else {
        order
    };
    for (k, i) in table_order.into_iter().enumerate() {
        if k == halfway {
            run.restart_redis().await;
        }
        let entry = &run.table[i];
        if let Some((m, p)) = entry.http {
            if !routes_served[&(m.to_string(), p.to_string())] {
                run.tally.not_served.push(entry.label());
                continue;
            }
        }
        run.attack_entry(i).await;
    }
    run.login_attack().await;
    run.oracles_and_cost().await;
    run.shared_keys().await;
    run.field_edges().await;
    run.same_millisecond().await;
    run.victims_carry_on().await;
    let dlq_after = settle::dlq_depths(run.scene.stack.config(), scene::PIPELINES).await;
    for ((p, before), (_, after)) in dlq_before.iter().zip(&dlq_after) {
        if after > before {
            run.tally.violations.push(Violation {
                entry: "(all)".into(),
                attacker: "(all)".into(),
                target: format!("pipeline {p}"),
                what: format!(
                    "attack events went to the {p} pipeline's dead-letter topic: {}",
                    after - before
                ),
            });
        }
    }
    run.print_summary(seed, cases, started.elapsed());
    let violations = &run.tally.violations;
    assert!(
        violations.is_empty(),
        "{} violation(s) (ADVERSARY_SEED={seed} ADVERSARY_CASES={cases} replays this run):\n{}",
        violations.len(),
        violations
            .iter()
            .map(|v| format!("- {} | {} | {} | {}", v.entry, v.attacker, v.target, v.what))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

impl Run {
    async fn settle_or_note(&mut self, when: &str) {
        if let Err(e) = self.settle.wait(scene::APPLIED).await {
            self.tally.violations.push(Violation {
                entry: when.into(),
                attacker: "-".into(),
                target: "-".into(),
                what: e,
            });
        }
    }

    fn attacker(&mut self, label: String, kind: Kind, tenant: &str, uid: i64) {
        let bearer = self.scene.token_in(tenant, uid, "attacker");
        let ws = WsSession::new(self.scene.addr, &bearer, &format!("atk{uid}"));
        self.attackers.push(Attacker {
            label,
            kind,
            tenant: tenant.to_string(),
            uid,
            bearer,
            ws: Some(ws),
        });
    }

    /// The attackers of this run.
    async fn enlist(&mut self) {
        let a = self.scene.tenant.clone();
        let b = self.scene.tenant_b.clone();
        let stranger = self.scene.fresh_uid(&mut self.rng, 3000, 4000);
        self.attacker(
            format!("stranger usr{stranger}"),
            Kind::Stranger,
            &a,
            stranger,
        );
        let r = self.scene.removed;
        self.attacker(format!("removed member usr{r}"), Kind::Removed, &a, r);
        let blocked = self.scene.blocked;
        self.attacker(
            format!("blocked user usr{blocked}"),
            Kind::Blocked,
            &a,
            blocked,
        );
        for uid in [self.scene.owner, self.scene.p] {
            self.attacker(
                format!("tenant-b user usr{uid} (a victim's uid)"),
                Kind::OtherTenant,
                &b,
                uid,
            );
        }
        for (x, y) in self.scene.case_pairs.clone() {
            self.attacker(
                format!(
                    "case twin usr{x} (own topic with usr{y}: {})",
                    names::p2p_topic(x, y)
                ),
                Kind::CaseTwin { peer: y },
                &a,
                x,
            );
        }
        // A user who owns a case variant of the group's name (created
        // before the attacks; refused while names compare without case).
        let owner = self.scene.fresh_uid(&mut self.rng, 3000, 4000);
        let variants: Vec<String> = names::case_variants(&self.scene.group, &mut self.rng, 8, 8)
            .into_iter()
            .filter(|v| v.starts_with("grp"))
            .collect();
        let group = self.rng.pick(&variants).clone();
        let token = self.scene.token_in(&a, owner, "attacker");
        let created = client::http(
            &self.scene.http,
            self.scene.addr,
            "POST",
            "/v1/groups",
            &token,
            Some(&json!({"topic": group, "name": "look-alike", "members": []})),
        )
        .await;
        self.tally.requests += 1;
        eprintln!(
            "adversary: usr{owner} creates {group} (a case variant of {}): {} {}",
            self.scene.group, created.status, created.body
        );
        if created.status == 201 {
            self.owned.insert((a.clone(), owner, group.clone()));
        } else if (500..600).contains(&created.status) || created.status == 0 {
            self.tally.violations.push(Violation {
                entry: "POST /v1/groups".into(),
                attacker: format!("usr{owner}"),
                target: group.clone(),
                what: format!("server error {} {}", created.status, created.body),
            });
        }
        self.attacker(
            format!("owner of look-alike group {group} usr{owner}"),
            Kind::VariantOwner { group },
            &a,
            owner,
        );
        let searcher = self.scene.fresh_uid(&mut self.rng, 3000, 4000);
        self.attacker(
            format!("stranger usr{searcher} who never wrote to them"),
            Kind::Searcher,
            &a,
            searcher,
        );
        let admin_b = self.scene.admin_b.clone();
        self.attackers.push(Attacker {
            label: "tenant-b operator (admin token for tenant b only)".into(),
            kind: Kind::Operator,
            tenant: b,
            uid: 0,
            bearer: admin_b,
            ws: None,
        });
    }

    /// The victims' live sessions, attached to their conversations.
    async fn listen(&mut self) {
        let s = &self.scene;
        for (uid, topic) in [(s.owner, s.group.clone()), (s.p, format!("usr{}", s.q))] {
            let mut ws = WsSession::new(s.addr, &s.token(uid), &format!("victim{uid}"));
            let a = ws.request(json!({"sub": {"topic": topic}})).await;
            assert_eq!(a.code(), Some(200), "victim usr{uid} attaches: {a:?}");
            self.listeners.push((format!("usr{uid}"), topic, ws));
        }
    }

    fn deck(&mut self, key: &str, make: impl FnOnce(&mut Rng) -> Vec<Variant>) -> &mut Deck {
        if !self.decks.contains_key(key) {
            let all = make(&mut self.rng);
            let others: Vec<Variant> = all.into_iter().filter(|v| !v.is_exact()).collect();
            let n = others.len();
            let cards = self.rng.sample(&others, n);
            self.decks.insert(key.to_string(), Deck { cards, next: 0 });
        }
        self.decks.get_mut(key).expect("just made")
    }

    /// The exact name and `cases` variants of it.
    fn deal(&mut self, base: &Base) -> Vec<Variant> {
        let cases = self.cases;
        let (key, exact, make): (String, String, MakeVariants) = match base {
            Base::Topic { name, own }
            | Base::Message {
                topic: name, own, ..
            } => {
                if *own {
                    return vec![Variant::raw("exact", name.clone())];
                }
                let n = name.clone();
                (
                    format!("topic:{name}"),
                    name.clone(),
                    Box::new(move |r| names::topic_variants(&n, r, 7, 32)),
                )
            }
            Base::Report(id) | Base::Tenant(id) => {
                let n = id.clone();
                (
                    format!("name:{id}"),
                    id.clone(),
                    Box::new(move |r| names::topic_variants(&n, r, 6, 16)),
                )
            }
            Base::User(uid) => {
                let u = *uid;
                (
                    format!("user:{uid}"),
                    uid.to_string(),
                    Box::new(move |r| names::uid_variants(u, r)),
                )
            }
            Base::UserTopic(uid) => {
                let u = *uid;
                (
                    format!("usertopic:{uid}"),
                    format!("usr{uid}"),
                    Box::new(move |r| {
                        names::uid_variants(u, r)
                            .into_iter()
                            .filter(|v| v.name != format!("usr{u}"))
                            .collect()
                    }),
                )
            }
            Base::Query(q) => return vec![Variant::raw("exact", q.clone())],
            Base::File(f) => return vec![Variant::encoded("exact", f.clone())],
            Base::StoredFile(id) => {
                let n = id.clone();
                (
                    format!("file:{id}"),
                    id.clone(),
                    Box::new(move |r| {
                        let mut v = names::topic_variants(&n, r, 6, 16);
                        v.push(Variant::raw("with an extension", format!("{n}.png")));
                        v.push(Variant::encoded("dot-dot", format!("..%2Fs%2F{n}")));
                        v
                    }),
                )
            }
            Base::Nothing => return vec![Variant::raw("exact", String::new())],
        };
        let deck = self.deck(&key, make);
        let mut out = vec![Variant::raw("exact", exact)];
        for _ in 0..cases.min(deck.cards.len()) {
            out.push(deck.cards[deck.next % deck.cards.len()].clone());
            deck.next += 1;
        }
        out
    }

    /// What attacker `a` names for `entry`.
    fn bases(&mut self, entry: &Entry, a: usize) -> Vec<Base> {
        let s = &self.scene;
        let attacker = &self.attackers[a];
        let own_topics: Vec<String> = match &attacker.kind {
            Kind::CaseTwin { peer } => vec![names::p2p_topic(attacker.uid, *peer)],
            Kind::VariantOwner { group } => vec![group.clone()],
            _ => Vec::new(),
        };
        let g_seq = *self.rng.pick(&s.group_seqs);
        let pq_seq = *self.rng.pick(&s.pq_seqs);
        let mut out = Vec::new();
        match entry.names {
            Names::Nothing | Names::Login => out.push(Base::Nothing),
            Names::Topic => {
                if entry.admin {
                    out.push(Base::Topic {
                        name: s.group.clone(),
                        own: false,
                    });
                } else {
                    out.push(Base::Topic {
                        name: s.group.clone(),
                        own: false,
                    });
                    out.push(Base::Topic {
                        name: s.pq.clone(),
                        own: false,
                    });
                    for t in own_topics {
                        out.push(Base::Topic { name: t, own: true });
                    }
                    if entry.ws.is_some() {
                        // One-to-one topics as clients name them: usr<peer>.
                        out.push(Base::UserTopic(s.p));
                        if let Kind::CaseTwin { peer } = attacker.kind {
                            out.push(Base::UserTopic(peer));
                        }
                    }
                }
            }
            Names::User => {
                out.push(Base::User(s.p));
                out.push(Base::User(s.owner));
                if let Kind::CaseTwin { peer } = attacker.kind {
                    if !entry.admin {
                        out.push(Base::User(peer));
                    }
                }
            }
            Names::Message => {
                out.push(Base::Message {
                    topic: s.group.clone(),
                    seq: g_seq,
                    own: false,
                });
                out.push(Base::Message {
                    topic: s.pq.clone(),
                    seq: pq_seq,
                    own: false,
                });
                for t in own_topics {
                    let seq = if t.starts_with("p2p") { pq_seq } else { g_seq };
                    out.push(Base::Message {
                        topic: t,
                        seq,
                        own: true,
                    });
                }
            }
            Names::Report => out.push(Base::Report(s.report_id.clone())),
            Names::Tenant => out.push(Base::Tenant(s.tenant.clone())),
            Names::Fnd => {
                out.push(Base::Query(format!("usr{}", s.p)));
                out.push(Base::Query(format!("Victim {}", s.run)));
            }
            Names::StoredFile => {
                for id in &s.stored_files {
                    out.push(Base::StoredFile(id.clone()));
                }
                // Path tricks through the download path too.
                out.push(Base::File("..%2F..%2F..%2FCargo.toml".into()));
            }
            Names::File => {
                for f in [
                    "..%2F..%2F..%2FCargo.toml",
                    "%2E%2E/%2E%2E/%2E%2E/Cargo.toml",
                    "vendor/..%2F..%2F..%2F..%2FCargo.toml",
                    "..%5C..%5C..%5CCargo.toml",
                    "%2Fetc%2Fpasswd",
                ] {
                    out.push(Base::File(f.to_string()));
                }
            }
        }
        out
    }

    /// Whether attacker `a` may have a 2xx on `name` (its own conversation).
    fn owns(&self, a: &Attacker, name: &str) -> bool {
        if let Some(peer) = tinode::parse_user_id(name) {
            return peer != a.uid;
        }
        if let Some((lo, hi)) = tinode::parse_p2p_topic(name) {
            return lo == a.uid || hi == a.uid;
        }
        self.owned
            .contains(&(a.tenant.clone(), a.uid, name.to_string()))
    }

    fn attackers_for(&self, entry: &Entry) -> Vec<usize> {
        (0..self.attackers.len())
            .filter(|i| {
                let k = &self.attackers[*i].kind;
                match entry.names {
                    _ if *k == Kind::Operator => entry.admin,
                    // A user's token on an operator route: one attacker is
                    // enough (each refusal counts against the caller's
                    // address where failed admin tokens are throttled).
                    _ if entry.admin => *k == Kind::Stranger,
                    // The user search is judged for users who share no
                    // conversation with the victims or whom they blocked.
                    Names::Fnd => matches!(k, Kind::Searcher | Kind::Blocked | Kind::OtherTenant),
                    _ if *k == Kind::Searcher => false,
                    Names::File => matches!(k, Kind::Stranger),
                    _ => true,
                }
            })
            .collect()
    }

    async fn attack_entry(&mut self, i: usize) {
        let entry_label = self.table[i].label();
        if self.table[i].names == Names::Login {
            return; // see login_attack
        }
        let attackers = self.attackers_for(&self.table[i]);
        let entry_started = Instant::now();
        let requests_before = self.tally.requests;
        for a in attackers {
            let entry = self.table[i];
            let bases = self.bases(&entry, a);
            for base in bases {
                for variant in self.deal(&base) {
                    self.attack(i, a, &base, &variant).await;
                }
            }
        }
        let entry = &self.table[i];
        match (entry.http, entry.ws) {
            (Some(_), _) => self.tally.routes.insert(entry_label.clone()),
            (None, Some(k)) => self.tally.ws_kinds.insert(k.to_string()),
            _ => false,
        };
        self.after_entry(&entry_label, self.table[i].mutating())
            .await;
        eprintln!(
            "adversary: {entry_label}: {} requests in {:.1?}",
            self.tally.requests - requests_before,
            entry_started.elapsed()
        );
    }

    /// One attack: attacker `a` names `variant` of `base` through entry `i`.
    async fn attack(&mut self, i: usize, a: usize, base: &Base, variant: &Variant) {
        self.n += 1;
        self.tally.attacks += 1;
        let s = &self.scene;
        let attacker = &self.attackers[a];
        self.tally.attackers.insert(attacker.label.clone());
        self.tally
            .variants
            .insert(format!("{}:{}", variant.kind, base_kind(base)));
        let pick = self.rng.next_u64();
        let other_uid = *self
            .rng
            .pick(&[s.owner, s.admin, s.member, attacker.uid.max(1)]);
        let seq = match base {
            Base::Message { seq, .. } => *seq,
            _ => *self.rng.pick(&s.group_seqs),
        };
        let victim_cmid = self
            .rng
            .pick(&["v-g1", "v-pq1", "V-PQ1", "v-Pq3"])
            .to_string();
        // The operator always names the victims' tenant (or a spelling of
        // it): what it may do in its own tenant is not in question here.
        let tenant_param = match base {
            Base::Tenant(_) => variant.path.clone(),
            _ => s.tenant.clone(),
        };
        let entry = &self.table[i];
        let ask = Ask {
            name: variant,
            seq,
            me: attacker.uid,
            tenant_param: tenant_param.clone(),
            other_uid,
            victim_cmid,
            n: self.n,
            pick,
            run: &s.run,
        };
        let steps = (entry.build)(&ask);
        let target = format!("{} as {:?} [{}]", base.label(), variant.name, variant.kind);
        for step in steps {
            self.step(i, a, &target, base, variant, step).await;
        }
        if self.table[i].ws.is_some() {
            // Whatever the attack still caused for the attacker's session.
            let attacker = &mut self.attackers[a];
            if let Some(ws) = attacker.ws.as_mut() {
                let rest = ws.sync().await;
                self.tally.requests += 1;
                let text = rest.text();
                self.scan(i, a, &target, &text);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn step(
        &mut self,
        i: usize,
        a: usize,
        target: &str,
        base: &Base,
        variant: &Variant,
        step: Step,
    ) {
        let mut tries = 0;
        loop {
            tries += 1;
            // The name the server sees: a path is decoded, a message is not.
            let mut seen = variant.name.clone();
            let (code, text, topic, judged, trouble) = match &step {
                Step::Http {
                    method,
                    path,
                    body,
                    judged,
                } => {
                    let attacker = &self.attackers[a];
                    let ans = client::http(
                        &self.scene.http,
                        self.entry_addr[i],
                        method,
                        path,
                        &attacker.bearer,
                        body.as_ref(),
                    )
                    .await;
                    self.tally.requests += 1;
                    let v: Value = serde_json::from_str(&ans.body).unwrap_or(Value::Null);
                    let topic = v["topic"].as_str().map(String::from);
                    let trouble = (ans.status == 0).then(|| ans.body.clone());
                    seen = table::percent_decode(&variant.path);
                    (ans.status as i64, ans.body, topic, *judged, trouble)
                }
                Step::Ws { msg, judged } => {
                    let attacker = &mut self.attackers[a];
                    let ws = attacker.ws.as_mut().expect("a user attacker");
                    let ans: WsAnswer = ws.request(msg.clone()).await;
                    self.tally.requests += 1;
                    let reply = ans.reply.clone().unwrap_or(Value::Null);
                    let topic = reply["ctrl"]["topic"]
                        .as_str()
                        .or(reply["meta"]["topic"].as_str())
                        .map(String::from);
                    (
                        ans.code().unwrap_or(0),
                        ans.text(),
                        topic,
                        *judged,
                        ans.trouble.clone(),
                    )
                }
                Step::WsNote(msg) => {
                    let attacker = &mut self.attackers[a];
                    let ws = attacker.ws.as_mut().expect("a user attacker");
                    let sent = ws.send_only(msg.clone()).await;
                    self.tally.requests += 1;
                    (0, String::new(), None, false, sent.err())
                }
            };
            self.scan(i, a, target, &text);
            if let Ok(filter) = std::env::var("ADVERSARY_TRACE") {
                let label = self.table[i].label();
                if label.contains(&filter) {
                    eprintln!(
                        "trace: {label} | {} | {target} | {code} {} {}",
                        self.attackers[a].label,
                        clip(&text),
                        trouble.as_deref().unwrap_or("")
                    );
                }
            }
            if !judged {
                return;
            }
            *self.tally.codes.entry(code).or_default() += 1;
            if server_error(code) && tries < 3 {
                continue; // a client retries a server error
            }
            self.judge(
                i, a, target, base, variant, &seen, code, &text, topic, trouble, tries,
            );
            return;
        }
    }

    /// Leaks: a victim's secret in anything an attacker received.
    fn scan(&mut self, i: usize, a: usize, target: &str, text: &str) {
        let entry = &self.table[i];
        let mut found: Vec<&String> = self
            .scene
            .secrets
            .iter()
            .filter(|s| text.contains(s.as_str()))
            .collect();
        if entry.notes_secret {
            found.extend(
                self.scene
                    .notes
                    .iter()
                    .filter(|s| text.contains(s.as_str())),
            );
        }
        if matches!(entry.names, Names::File | Names::StoredFile)
            && (text.contains("[package]") || text.contains("root:x:"))
        {
            self.tally.violations.push(Violation {
                entry: entry.label(),
                attacker: self.attackers[a].label.clone(),
                target: target.into(),
                what: format!("served a file outside the web app: {}", clip(text)),
            });
        }
        let lower = text.to_lowercase();
        if let Some(m) = INTERNAL.iter().find(|m| lower.contains(*m)) {
            self.tally.violations.push(Violation {
                entry: entry.label(),
                attacker: self.attackers[a].label.clone(),
                target: target.into(),
                what: format!("internal detail ({m:?}) in the answer: {}", clip(text)),
            });
        }
        if !found.is_empty() {
            let what = format!("leaked {:?}: {}", found, clip(text));
            self.tally.violations.push(Violation {
                entry: entry.label(),
                attacker: self.attackers[a].label.clone(),
                target: target.into(),
                what,
            });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn judge(
        &mut self,
        i: usize,
        a: usize,
        target: &str,
        base: &Base,
        variant: &Variant,
        seen: &str,
        code: i64,
        text: &str,
        topic: Option<String>,
        trouble: Option<String>,
        tries: u32,
    ) {
        let entry = &self.table[i];
        let attacker = &self.attackers[a];
        let retried = if tries > 1 {
            format!(" (after {} server errors)", tries - 1)
        } else {
            String::new()
        };
        let mut problem: Option<String> = None;
        if let Some(t) = trouble {
            problem = Some(format!("no answer: {t}"));
        } else if server_error(code) {
            problem = Some(format!("server error {code} on every try: {}", clip(text)));
        } else if (200..300).contains(&code) {
            let acted_on = topic.clone().unwrap_or_else(|| seen.to_string());
            if entry.admin {
                problem = Some(format!("operator route accepted: {code} {}", clip(text)));
            } else if entry.creates {
                let victims = [self.scene.group.as_str(), self.scene.pq.as_str()];
                if attacker.tenant == self.scene.tenant && victims.contains(&acted_on.as_str()) {
                    problem = Some(format!(
                        "created a group under a victim's name {acted_on}: {code}"
                    ));
                } else {
                    self.owned
                        .insert((attacker.tenant.clone(), attacker.uid, acted_on.clone()));
                }
            } else if (entry.blocked_refused || entry.ws == Some("pub"))
                && attacker.kind == Kind::Blocked
                && self.reaches_blocker(attacker, &acted_on, variant)
            {
                problem = Some(format!(
                    "a blocked user reached the user who blocked them ({acted_on}): {code} {}",
                    clip(text)
                ));
            } else if !entry.always_own
                && entry.names != Names::Nothing
                && entry.names != Names::File
                && !self.owns(attacker, &acted_on)
            {
                let twin = self
                    .owned
                    .iter()
                    .find(|(t, u, g)| {
                        *t == attacker.tenant
                            && *u == attacker.uid
                            && g.eq_ignore_ascii_case(&acted_on)
                    })
                    .map(|(_, _, g)| {
                        format!(
                            " (the attacker owns {g:?}: a name that differs in case reached it)"
                        )
                    })
                    .unwrap_or_default();
                problem = Some(format!(
                    "accepted ({code}) on {acted_on:?}, not the attacker's conversation{twin}: {}",
                    clip(text)
                ));
            }
        }
        if !(200..300).contains(&code)
            && !matches!(base, Base::Nothing | Base::Query(_) | Base::File(_))
            && !entry.admin
            && attacker.kind != Kind::Operator
        {
            // Refused (or failed): it must leave nothing behind.
            self.refused_names
                .entry((attacker.tenant.clone(), variant.name.clone()))
                .or_default()
                .insert(entry.label());
        }
        if let Some(what) = problem {
            self.tally.violations.push(Violation {
                entry: entry.label(),
                attacker: attacker.label.clone(),
                target: target.into(),
                what: what + &retried,
            });
        }
    }

    /// Whether a request that `acted_on` a conversation reached one of the
    /// users who blocked the attacker.
    fn reaches_blocker(&self, attacker: &Attacker, acted_on: &str, variant: &Variant) -> bool {
        let blockers = [self.scene.owner, self.scene.p];
        let peer = tinode::p2p_peer(acted_on, attacker.uid)
            .or_else(|| tinode::parse_user_id(acted_on))
            .or_else(|| variant.name.parse::<i64>().ok());
        peer.is_some_and(|p| blockers.contains(&p))
    }

    /// After an entry: the victims' data unchanged, their sessions quiet,
    /// and no sequence state for names that were refused.
    async fn after_entry(&mut self, label: &str, mutating: bool) {
        if mutating {
            self.settle_or_note(label).await;
        }
        let now = self.scene.snapshot().await;
        for (part, before) in self.baseline.clone() {
            let after = now.get(&part).cloned().unwrap_or(Value::Null);
            if scene::sha256(&before) != scene::sha256(&after) {
                self.tally.violations.push(Violation {
                    entry: label.into(),
                    attacker: "(this entry's attackers)".into(),
                    target: part.clone(),
                    what: format!("the victims' data changed: {}", diff(&before, &after)),
                });
            }
        }
        self.baseline = now;
        let victims: BTreeSet<String> = [
            self.scene.owner,
            self.scene.admin,
            self.scene.member,
            self.scene.p,
            self.scene.q,
        ]
        .iter()
        .map(|u| format!("usr{u}"))
        .collect();
        for (who, topic, ws) in self.listeners.iter_mut() {
            // A request of its own keeps the session active (not idle) and
            // flushes what the server still had for it.
            let mut heard = ws.drain();
            let trouble = if ws.is_open() {
                let sync = ws.sync().await;
                heard.extend(sync.frames);
                sync.trouble
            } else {
                Some("closed by the server".into())
            };
            if let Some(e) = trouble {
                self.tally.violations.push(Violation {
                    entry: label.into(),
                    attacker: "(this entry's attackers)".into(),
                    target: format!("{who}'s live session"),
                    what: format!("the victim's session was closed: {e}"),
                });
                let _ = ws.request(json!({"sub": {"topic": topic.as_str()}})).await;
            }
            for f in heard {
                let about = ["data", "info", "pres", "ctrl", "meta"]
                    .iter()
                    .find_map(|k| f.get(*k).map(|b| (*k, b.clone())));
                let Some((kind, body)) = about else { continue };
                let on_topic = body["topic"].as_str() == Some(topic.as_str())
                    || (kind == "ctrl" && body["topic"].is_null());
                let from = body["from"]
                    .as_str()
                    .or(body["src"].as_str())
                    .unwrap_or("")
                    .to_string();
                if on_topic && !victims.contains(&from) {
                    self.tally.violations.push(Violation {
                        entry: label.into(),
                        attacker: if from.is_empty() {
                            "(this entry's attackers)".into()
                        } else {
                            from
                        },
                        target: format!("{who}'s live session on {topic}"),
                        what: format!("the victim heard it: {}", clip(&f.to_string())),
                    });
                }
            }
        }
        // Refused names leave no sequence state behind (checked for every
        // name refused so far: state may be written after the answer).
        let names: Vec<(String, String)> = self
            .refused_names
            .keys()
            .filter(|(t, n)| {
                !(*t == self.scene.tenant && (*n == self.scene.group || *n == self.scene.pq))
            })
            .filter(|(t, n)| {
                !self
                    .reported_keys
                    .contains(&imstream::keys::TopicKeys::new(t, n).seq())
            })
            .cloned()
            .collect();
        if !names.is_empty() {
            let mut redis = self.scene.stack.redis().await;
            let mut pipe = redis::pipe();
            for (tenant, name) in &names {
                pipe.exists(imstream::keys::TopicKeys::new(tenant, name).seq());
            }
            let exists: Vec<bool> = pipe.query_async(&mut redis).await.unwrap_or_default();
            for ((tenant, name), e) in names.iter().zip(exists) {
                let key = imstream::keys::TopicKeys::new(tenant, name).seq();
                let anyones = self
                    .attackers
                    .iter()
                    .any(|x| &x.tenant == tenant && self.owns(x, name));
                if e && !anyones && self.reported_keys.insert(key.clone()) {
                    let by: Vec<String> = self.refused_names[&(tenant.clone(), name.clone())]
                        .iter()
                        .cloned()
                        .collect();
                    // The entry after which it showed, if it refused the name.
                    let entry = if by.iter().any(|e| e == label) {
                        label.to_string()
                    } else {
                        by[0].clone()
                    };
                    self.tally.violations.push(Violation {
                        entry,
                        attacker: "(that entry's attackers)".into(),
                        target: format!("{name:?}"),
                        what: format!(
                            "refused or failed, yet it left sequence state {key} (seen after {label}; refused by {} entries: {})",
                            by.len(),
                            by.join(", ")
                        ),
                    });
                }
            }
        }
    }

    /// Password logins with spellings of victim P's login and a wrong
    /// password: none may succeed, and the spellings that are the same
    /// login (letter case, fullwidth forms) share one lockout.
    async fn login_attack(&mut self) {
        let limit = self.scene.stack.config().limits.login_failures as usize;
        let login = self.scene.login.clone();
        let mut same: Vec<Variant> = vec![Variant::raw("exact", login.clone())];
        for v in names::case_variants(&login, &mut self.rng, 0, limit * 2) {
            same.push(Variant::raw("case", v));
        }
        let wide: String = login
            .chars()
            .map(|c| char::from_u32(c as u32 - 0x21 + 0xFF01).unwrap_or(c))
            .collect();
        same.push(Variant::raw("fullwidth", wide));
        let other: Vec<Variant> = names::spelling_variants(&login, &mut self.rng)
            .into_iter()
            .filter(|v| {
                v.kind != "fullwidth"
                    && !v.kind.starts_with("percent")
                    && !v.kind.contains("encoded")
            })
            .collect();
        let mut ws = WsSession::anonymous(self.scene.addr, "login-attacker");
        let mut checked = 0;
        let entry = "ws {login} (password login with spellings of a victim's login)".to_string();
        for (group, variants) in [("same login", &same), ("other spelling", &other)] {
            for v in variants.iter() {
                let secret = base64::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    format!("{}:wrong-{}", v.name, self.n),
                );
                self.n += 1;
                self.tally.attacks += 1;
                let ans = ws
                    .request(json!({"login": {"scheme": "basic", "secret": secret}}))
                    .await;
                self.tally.requests += 1;
                let code = ans.code().unwrap_or(0);
                *self.tally.codes.entry(code).or_default() += 1;
                if code == 401 && group == "same login" {
                    checked += 1;
                }
                if (200..300).contains(&code) || code == 0 || code >= 500 {
                    self.tally.violations.push(Violation {
                        entry: entry.clone(),
                        attacker: "an anonymous client".into(),
                        target: format!("login {:?} [{}]", v.name, v.kind),
                        what: format!("answered {code}: {:?} {:?}", ans.reply, ans.trouble),
                    });
                }
            }
        }
        // The failure past the free ones is checked and sets the lock
        // (limits.login_failures + 1); the suite's lock lasts the run.
        if checked > limit + 1 {
            self.tally.violations.push(Violation {
                entry: entry.clone(),
                attacker: "an anonymous client".into(),
                target: format!(
                    "login {login:?} in {} spellings (case, fullwidth)",
                    same.len()
                ),
                what: format!(
                    "wrong passwords were checked {checked} times for one login; the lockout allows {} ({limit} free, one that locks)",
                    limit + 1
                ),
            });
        }
        // After that many wrong passwords, the right one is locked out too.
        let secret = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{login}:{}", scene::PASSWORD),
        );
        let ans = ws
            .request(json!({"login": {"scheme": "basic", "secret": secret}}))
            .await;
        self.tally.requests += 1;
        if ans.code().is_some_and(|c| (200..300).contains(&c)) {
            self.tally.violations.push(Violation {
                entry: entry.clone(),
                attacker: "an anonymous client".into(),
                target: format!("login {login:?} with its right password"),
                what: format!(
                    "wrong passwords were checked in {} spellings of one login, yet the right password was not locked out: {:?}",
                    same.len(),
                    ans.reply
                ),
            });
        }
        self.tally.ws_kinds.insert("login".into());
        self.tally
            .attackers
            .insert("an anonymous client (password login)".into());
    }

    /// The victims send once more: each message must be stored as theirs,
    /// right after what they had (a planted row of the same seq would take
    /// its place otherwise).
    async fn victims_carry_on(&mut self) {
        let s = &self.scene;
        let before = s.snapshot().await;
        let mut expected: Vec<(String, String, String)> = Vec::new();
        for (uid, path, part, text) in [
            (
                s.owner,
                format!("/v1/groups/{}/messages", s.group),
                "history of the group (owner)",
                format!("after-{}-group", s.run),
            ),
            (
                s.p,
                format!("/v1/users/{}/messages", s.q),
                "history of P-Q (P)",
                format!("after-{}-pq", s.run),
            ),
        ] {
            let a = s
                .call(
                    uid,
                    "POST",
                    &path,
                    Some(json!({"content": {"txt": text}, "client_msg_id": format!("after-{}", self.n)})),
                )
                .await;
            if a.status != 202 {
                self.tally.violations.push(Violation {
                    entry: "victims carry on".into(),
                    attacker: "-".into(),
                    target: part.into(),
                    what: format!("the victim's own send answered {} {}", a.status, a.body),
                });
                continue;
            }
            expected.push((part.to_string(), format!("usr{uid}"), text));
        }
        self.settle_or_note("victims carry on").await;
        let after = self.scene.snapshot().await;
        for (part, from, text) in expected {
            let old = before[&part].as_array().cloned().unwrap_or_default();
            let new = after[&part].as_array().cloned().unwrap_or_default();
            let newest = new.first();
            let ok = new.len() == old.len() + 1
                && newest.is_some_and(|m| {
                    m["from"] == json!(from) && m["content"]["txt"] == json!(text)
                })
                && new[1..] == old[..];
            if !ok {
                self.tally.violations.push(Violation {
                    entry: "victims carry on".into(),
                    attacker: "-".into(),
                    target: part.clone(),
                    what: format!(
                        "the victim's next message is not stored as theirs after what they had: {}",
                        diff(&Value::Array(old), &Value::Array(new))
                    ),
                });
            }
        }
    }

    fn print_summary(&self, seed: u64, cases: usize, took: Duration) {
        let t = &self.tally;
        let mut by_entry: BTreeMap<&str, usize> = BTreeMap::new();
        let mut by_class: BTreeMap<&str, usize> = BTreeMap::new();
        for v in &t.violations {
            *by_entry.entry(v.entry.as_str()).or_default() += 1;
            *by_class.entry(class_of(&v.what)).or_default() += 1;
        }
        eprintln!(
            "adversary: seed {seed}, cases {cases}, {:.0?}\n  routes covered: {} of {} in the router ({} not served here: {})\n  WebSocket kinds covered: {} ({})\n  attackers: {} ({})\n  variant kinds: {}\n  attacks: {}, requests sent: {}\n  answers by code: {:?}\n  insiders: Redis restarted mid-run in {:.1?}; {} refused requests metered; {} commands with shared keys; {} field-edge requests\n  violations: {}{}{}",
            took,
            t.routes.len(),
            self.table.iter().filter(|e| e.http.is_some()).count(),
            t.not_served.len(),
            t.not_served.join(", "),
            t.ws_kinds.len(),
            t.ws_kinds.iter().cloned().collect::<Vec<_>>().join(" "),
            t.attackers.len(),
            t.attackers.iter().cloned().collect::<Vec<_>>().join("; "),
            t.variants.len(),
            t.attacks,
            t.requests,
            t.codes,
            t.redis_restart.unwrap_or_default(),
            t.refused_costs,
            t.shared_keys,
            t.edges,
            t.violations.len(),
            if by_class.is_empty() {
                String::new()
            } else {
                format!(
                    "\n    by kind: {}",
                    by_class
                        .iter()
                        .map(|(c, n)| format!("{c}: {n}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            },
            if by_entry.is_empty() {
                String::new()
            } else {
                format!(
                    "\n    by entry: {}",
                    by_entry
                        .iter()
                        .map(|(e, n)| format!("{e}: {n}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            }
        );
    }
}

/// Text of an internal failure that must never reach a client (lower case).
const INTERNAL: &[&str] = &[
    "sqlx",
    "sqlstate",
    "mysql",
    "mariadb",
    "rdkafka",
    "kafkaerror",
    "broker",
    "redis",
    "panicked",
    "backtrace",
    "/work/",
    "/root/",
    "/home/",
    "s3://",
    "object store",
];

/// The kind of a violation, for the summary.
fn class_of(what: &str) -> &'static str {
    const KINDS: &[(&str, &str)] = &[
        ("leaked", "a victim's secret in an answer"),
        ("accepted", "accepted on someone else's conversation"),
        (
            "created a group under",
            "accepted on someone else's conversation",
        ),
        ("operator route accepted", "operator route accepted"),
        (
            "a blocked user reached",
            "a blocked user reached the blocker",
        ),
        ("server error", "server error instead of a refusal"),
        ("no answer", "no answer"),
        ("the victims' data changed", "the victims' data changed"),
        (
            "the victim heard it",
            "the victims' live session heard an attacker",
        ),
        (
            "the victim's session was closed",
            "the victims' live session closed",
        ),
        (
            "refused or failed, yet it left",
            "a refused name left sequence state",
        ),
        ("internal detail", "internal detail in an answer"),
        ("served a file", "a file outside the web app served"),
        ("wrong passwords were checked", "login lockout per spelling"),
        ("answered", "password login not refused"),
        (
            "the victim's",
            "the victims' next message not stored as theirs",
        ),
        ("attack event", "dead letters"),
        ("pipelines still behind", "pipelines did not catch up"),
    ];
    KINDS
        .iter()
        .find(|(prefix, _)| what.starts_with(prefix))
        .map_or("other", |(_, kind)| kind)
}

/// A server error (not a refusal: 501 and 505 say "not supported").
fn server_error(code: i64) -> bool {
    code >= 500 && code != 501 && code != 505
}

fn base_kind(b: &Base) -> &'static str {
    match b {
        Base::Topic { .. } => "topic",
        Base::User(_) | Base::UserTopic(_) => "user",
        Base::Message { .. } => "message",
        Base::Report(_) => "report",
        Base::Tenant(_) => "tenant",
        Base::Query(_) => "fnd",
        Base::File(_) => "file",
        Base::StoredFile(_) => "stored file",
        Base::Nothing => "-",
    }
}

fn clip(s: &str) -> String {
    let s = s.replace('\n', " ");
    if s.chars().count() > 300 {
        format!("{}…", s.chars().take(300).collect::<String>())
    } else {
        s
    }
}

/// What differs between two snapshots of one part: items only in one.
fn diff(before: &Value, after: &Value) -> String {
    match (before, after) {
        (Value::Array(b), Value::Array(a)) => {
            let bs: Vec<String> = b.iter().map(scene::canonical).collect();
            let as_: Vec<String> = a.iter().map(scene::canonical).collect();
            let gone: Vec<&String> = bs.iter().filter(|x| !as_.contains(x)).collect();
            let new: Vec<&String> = as_.iter().filter(|x| !bs.contains(x)).collect();
            format!(
                "{} item(s) gone {}; {} new {}",
                gone.len(),
                clip(&format!("{gone:?}")),
                new.len(),
                clip(&format!("{new:?}"))
            )
        }
        _ => format!(
            "was {} now {}",
            clip(&scene::canonical(before)),
            clip(&scene::canonical(after))
        ),
    }
}
