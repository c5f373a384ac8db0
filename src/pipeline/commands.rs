//! The command pipeline's handler (seed 002 §7.2): admin commands from
//! `im.admin.commands.v1` executed once per `command_id` by producing the
//! domain events (group events through [`crate::governance`], session
//! control for users), with one `AdminResult` per command on
//! `im.admin.results.v1` (key `command_id`).
//!
//! Exactly once per command id: a row in the tenant's `im_admin_commands`
//! claims the id before executing and records the result after. A command
//! delivered again after it finished is skipped (no second result). One
//! that crashed mid-way (`running`) is executed again: its events have ids
//! derived from the command id, so projections see the same events. Only a
//! crash between producing the result and recording it can repeat a
//! result; consumers key results by command id.

use chrono::{TimeZone, Utc};
use serde_json::json;

use crate::events::{
    now_ms, AdminCommand, AdminCommandBody, AdminResult, AuthVersion, DeviceRevoked, Empty,
    EventCodec, FileAuditUpdated, FileAvailabilityChanged, GroupEvent, GroupEventBody,
    MessageReportResolved, SeqRange, SessionControlBody, SessionControlEvent, UserEvent,
    UserEventBody,
};
use crate::governance::exec::{derived_event_id, CommandScope, Origin};
use crate::governance::{Action, Actor, Executor, Refused};
use crate::kafka::producer::{EventProducer, ProduceError};
use crate::kafka::topics::TopicKind;
use crate::metrics as m;
use crate::tenant::{db_failure, TenantPools};

use super::failure::produce_failure;
use super::records::{decode_all, Handler, KeyGate, Record, RecordFailure};

pub struct CommandsHandler {
    codec: EventCodec,
    pools: TenantPools,
    producer: EventProducer,
    governance: Executor,
}

impl CommandsHandler {
    pub fn new(
        codec: EventCodec,
        pools: TenantPools,
        model: crate::group_model::GroupModel,
        producer: EventProducer,
        node: String,
    ) -> Self {
        let governance = Executor::new(model, producer.clone(), node);
        Self {
            codec,
            pools,
            producer,
            governance,
        }
    }
}

/// Whether a session-control command takes a new auth version (signing
/// every session out) or keeps the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    Same,
    Next,
}

/// The seed's name of a command kind (`group.admin.set`, …).
pub fn kind_name(body: &AdminCommandBody) -> &'static str {
    match body {
        AdminCommandBody::UserDisable(_) => "user.disable",
        AdminCommandBody::UserEnable(_) => "user.enable",
        AdminCommandBody::UserPasswordReset(_) => "user.password.reset",
        AdminCommandBody::UserDeviceRevoke(_) => "user.device.revoke",
        AdminCommandBody::GroupDelete(_) => "group.delete",
        AdminCommandBody::GroupMemberRemove(_) => "group.member.remove",
        AdminCommandBody::GroupAdminSet(_) => "group.admin.set",
        AdminCommandBody::GroupAdminRemove(_) => "group.admin.remove",
        AdminCommandBody::GroupMemberMute(_) => "group.member.mute",
        AdminCommandBody::MessageModerate(_) => "message.moderate",
        AdminCommandBody::GroupMemberAdd(_) => "group.member.add",
        AdminCommandBody::FileAuditUpdate(_) => "file.audit.update",
        AdminCommandBody::AbuseReportResolve(_) => "abuse.report.resolve",
    }
}

/// How a command ended.
struct Verdict {
    status: &'static str,
    message: String,
    event_ids: Vec<String>,
}

fn at(ms: i64) -> chrono::NaiveDateTime {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
        .naive_utc()
}

impl Handler for CommandsHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        let mut failures = Vec::new();
        let commands = decode_all::<AdminCommand>(&self.codec, records, &mut failures).await;
        // Commands of one key run in log order: after a failed one, wait.
        let mut gate = KeyGate::new(records, failures);
        for (i, cmd) in commands {
            if !gate.admit(i) {
                continue;
            }
            if let Err(f) = self.run(i, &cmd).await {
                gate.fail(f);
            }
        }
        gate.outcome()
    }
}

impl CommandsHandler {
    async fn run(&self, i: usize, cmd: &AdminCommand) -> Result<(), RecordFailure> {
        let kind = kind_name(&cmd.body);
        let db = |e: sqlx::Error| RecordFailure::new(i, db_failure(&e), format!("mysql: {e}"));
        let produce = |e: ProduceError| RecordFailure::new(i, produce_failure(&e), e.to_string());
        if cmd.command_id.is_empty() || cmd.command_id.len() > 64 {
            let verdict = Verdict {
                status: "rejected",
                message: "command_id must be 1-64 characters".into(),
                event_ids: Vec::new(),
            };
            return self.publish(cmd, &verdict).await.map_err(produce);
        }
        let Ok(pool) = self.pools.get(&cmd.tenant_id) else {
            let verdict = Verdict {
                status: "rejected",
                message: format!("unknown tenant {}", cmd.tenant_id),
                event_ids: Vec::new(),
            };
            return self.publish(cmd, &verdict).await.map_err(produce);
        };
        // Claim the command id; a finished command is not run again.
        sqlx::query(
            "INSERT INTO im_admin_commands (command_id, kind, operator, status, issued_at) \
             VALUES (?, ?, ?, 'running', ?) ON DUPLICATE KEY UPDATE command_id = command_id",
        )
        .bind(&cmd.command_id)
        .bind(kind)
        .bind(&cmd.operator)
        .bind(at(cmd.issued_at))
        .execute(pool)
        .await
        .map_err(db)?;
        let status: String =
            sqlx::query_scalar("SELECT status FROM im_admin_commands WHERE command_id = ?")
                .bind(&cmd.command_id)
                .fetch_one(pool)
                .await
                .map_err(db)?;
        if status != "running" {
            metrics::counter!(m::ADMIN_COMMANDS_TOTAL, "kind" => kind, "status" => "duplicate")
                .increment(1);
            tracing::info!(command_id = %cmd.command_id, %status, "admin command already executed; skipped");
            return Ok(());
        }
        let verdict = match self.execute(cmd).await {
            Ok(event_ids) => Verdict {
                status: "ok",
                message: String::new(),
                event_ids,
            },
            Err(Refused(503, why)) => return Err(RecordFailure::outage(i, why)),
            Err(Refused(409, why)) => Verdict {
                status: "ok",
                message: format!("no change: {why}"),
                event_ids: Vec::new(),
            },
            Err(Refused(_, why)) => Verdict {
                status: "rejected",
                message: why,
                event_ids: Vec::new(),
            },
        };
        self.publish(cmd, &verdict).await.map_err(produce)?;
        sqlx::query(
            "UPDATE im_admin_commands SET status = ?, message = ?, event_ids = ?, completed_at = ? \
             WHERE command_id = ?",
        )
        .bind(verdict.status)
        .bind(verdict.message.chars().take(512).collect::<String>())
        .bind(json!(verdict.event_ids).to_string())
        .bind(at(now_ms()))
        .bind(&cmd.command_id)
        .execute(pool)
        .await
        .map_err(db)?;
        metrics::counter!(m::ADMIN_COMMANDS_TOTAL, "kind" => kind, "status" => verdict.status)
            .increment(1);
        tracing::info!(command_id = %cmd.command_id, kind, status = verdict.status, message = %verdict.message, "admin command executed");
        Ok(())
    }

    async fn publish(&self, cmd: &AdminCommand, verdict: &Verdict) -> Result<(), ProduceError> {
        let result = AdminResult {
            command_id: cmd.command_id.clone(),
            tenant_id: cmd.tenant_id.clone(),
            completed_at: now_ms(),
            status: verdict.status.into(),
            message: verdict.message.clone(),
            event_ids: verdict.event_ids.clone(),
        };
        self.producer
            .send(TopicKind::AdminResults, &cmd.command_id, &result, None)
            .await
            .map(|_| ())
    }

    /// Produces the command's domain events; their ids.
    async fn execute(&self, cmd: &AdminCommand) -> Result<Vec<String>, Refused> {
        let tenant = cmd.tenant_id.as_str();
        let origin = Origin {
            device: format!("admin:{}", cmd.operator),
            command_id: Some(cmd.command_id.clone()),
            ..Default::default()
        };
        let gov = &self.governance;
        let reason = cmd.reason.as_str();
        let (topic, action): (&String, Action) = match &cmd.body {
            AdminCommandBody::UserDisable(u) => {
                return self
                    .control(cmd, u.uid, Auth::Next, |_, auth_version| {
                        SessionControlBody::UserDisabled(AuthVersion { auth_version })
                    })
                    .await
            }
            AdminCommandBody::UserEnable(u) => {
                return self
                    .control(cmd, u.uid, Auth::Same, |_, _| {
                        SessionControlBody::UserEnabled(Empty {})
                    })
                    .await
            }
            AdminCommandBody::UserPasswordReset(u) => {
                // The stored password first (the same hash again when the
                // command runs twice), then every session is refused.
                let hash = if u.password_hash.is_empty() {
                    crate::users::LOCKED_HASH
                } else if crate::users::is_argon2id_hash(&u.password_hash) {
                    u.password_hash.as_str()
                } else {
                    return Err(Refused(
                        400,
                        "password_hash must be an Argon2id PHC string".into(),
                    ));
                };
                if u.uid <= 0 {
                    return Err(Refused(400, "uid must be positive".into()));
                }
                let pool = self
                    .pools
                    .get(tenant)
                    .map_err(|e| Refused(404, e.to_string()))?;
                let found = crate::users::set_password_hash(pool, u.uid, hash)
                    .await
                    .map_err(|e| Refused(503, e.to_string()))?;
                if !found {
                    return Err(Refused(404, format!("uid {} has no password login", u.uid)));
                }
                return self
                    .control(cmd, u.uid, Auth::Next, |_, auth_version| {
                        SessionControlBody::PasswordReset(AuthVersion { auth_version })
                    })
                    .await;
            }
            AdminCommandBody::FileAuditUpdate(f) => {
                let audit = crate::references::files::Audit::parse(&f.status)
                    .ok_or_else(|| Refused(400, "status must be ok or blocked".into()))?;
                let pool = self
                    .pools
                    .get(tenant)
                    .map_err(|e| Refused(404, e.to_string()))?;
                let unavailable = |e: sqlx::Error| Refused(503, e.to_string());
                // Its uploaded files as the send path recorded them (never
                // lagging), or the file index's entry (a file inline).
                let uploaded = crate::files::of_message(pool, &f.topic, f.seq)
                    .await
                    .map_err(unavailable)?;
                let recorded = !uploaded.is_empty()
                    || crate::references::files::exists(pool, &f.topic, f.seq)
                        .await
                        .map_err(unavailable)?;
                if !recorded {
                    return Err(Refused(
                        404,
                        format!("no file message {} in {}", f.seq, f.topic),
                    ));
                }
                let blocked = audit == crate::references::files::Audit::Blocked;
                let mut event_ids = Vec::new();
                for id in &uploaded {
                    event_ids.extend(self.audit_file(cmd, pool, id, blocked).await?);
                }
                let body = GroupEventBody::FileAuditUpdated(FileAuditUpdated {
                    seq: f.seq,
                    status: audit.as_str().into(),
                });
                event_ids.extend(self.group_event(cmd, &f.topic, body).await?);
                return Ok(event_ids);
            }
            AdminCommandBody::AbuseReportResolve(r) => {
                let resolution = crate::references::reports::Status::parse(&r.resolution)
                    .filter(|s| *s != crate::references::reports::Status::Open)
                    .ok_or_else(|| {
                        Refused(400, "resolution must be dismissed or actioned".into())
                    })?;
                if r.note.chars().count() > crate::references::reports::MAX_REASON {
                    return Err(Refused(400, "note is at most 500 characters".into()));
                }
                let pool = self
                    .pools
                    .get(tenant)
                    .map_err(|e| Refused(404, e.to_string()))?;
                let report = crate::references::reports::get(pool, &r.report_id)
                    .await
                    .map_err(|e| Refused(503, e.to_string()))?
                    .ok_or_else(|| Refused(404, format!("no report {}", r.report_id)))?;
                if report.status != crate::references::reports::Status::Open.as_str() {
                    return Err(Refused(
                        409,
                        format!("the report is already {}", report.status),
                    ));
                }
                let body = GroupEventBody::MessageReportResolved(MessageReportResolved {
                    report_id: report.report_id.clone(),
                    resolution: resolution.as_str().into(),
                    note: r.note.clone(),
                });
                return self.group_event(cmd, &report.topic, body).await;
            }
            AdminCommandBody::UserDeviceRevoke(d) => {
                let device = d.device.clone();
                if device.is_empty() || device.len() > crate::session_control::MAX_DEVICE_LEN {
                    return Err(Refused(400, "device must be 1-191 bytes".into()));
                }
                return self
                    .control(cmd, d.uid, Auth::Same, move |c, _| {
                        // Every token of the device issued so far is below.
                        let device_version = c.generation(&device) + 1;
                        SessionControlBody::DeviceRevoked(DeviceRevoked {
                            device,
                            device_version,
                        })
                    })
                    .await;
            }
            AdminCommandBody::GroupDelete(t) => (&t.topic, Action::Dissolve),
            AdminCommandBody::GroupMemberRemove(t) => (&t.topic, Action::Kick(t.uid)),
            AdminCommandBody::GroupAdminSet(t) => (&t.topic, Action::SetAdmin(t.uid)),
            AdminCommandBody::GroupAdminRemove(t) => (&t.topic, Action::RemoveAdmin(t.uid)),
            AdminCommandBody::GroupMemberMute(t) => (&t.topic, Action::Mute(t.uid, t.until)),
            AdminCommandBody::GroupMemberAdd(t) => {
                // Bulk membership: no add policy, no limit; in slices so
                // one script never carries an unbounded list.
                let mut ids = Vec::new();
                for (n, chunk) in t.uids.chunks(1_000).enumerate() {
                    let origin = Origin {
                        command_id: Some(format!("{}#{n}", cmd.command_id)),
                        ..origin.clone()
                    };
                    match gov
                        .add_members(tenant, &t.topic, Actor::Operator, chunk, &origin)
                        .await
                    {
                        Ok(outcome) => ids.extend(outcome.event_ids),
                        // Members already there stay; the rest go on.
                        Err(Refused(409, _)) if chunk.len() == 1 => {}
                        Err(Refused(409, _)) => {
                            for uid in chunk {
                                let origin = Origin {
                                    command_id: Some(format!("{}#{n}:{uid}", cmd.command_id)),
                                    ..origin.clone()
                                };
                                match gov
                                    .add_members(
                                        tenant,
                                        &t.topic,
                                        Actor::Operator,
                                        &[*uid],
                                        &origin,
                                    )
                                    .await
                                {
                                    Ok(outcome) => ids.extend(outcome.event_ids),
                                    Err(Refused(409, _)) => {}
                                    Err(e) => return Err(e),
                                }
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
                return Ok(ids);
            }
            AdminCommandBody::MessageModerate(t) => {
                let range = [SeqRange {
                    low: t.seq,
                    hi: t.seq.saturating_add(1),
                }];
                let outcome = gov
                    .moderate(tenant, &t.topic, Actor::Operator, &range, &origin, reason)
                    .await?;
                return Ok(outcome.event_ids);
            }
        };
        let outcome = gov
            .act(tenant, topic, Actor::Operator, action, &origin, reason)
            .await?;
        Ok(outcome.event_ids)
    }

    /// Produces one group event on `topic` (key `{tenant}:{topic}`, so it
    /// applies in order with the conversation's other events) with an id
    /// derived from the command; the actor is the operator.
    /// An audit of an uploaded file: `blocked` makes it unavailable to
    /// everyone (written first: every download and send checks it), `ok`
    /// serves again one an audit made unavailable (never one the scan
    /// flagged). Either is told live (`FileAvailabilityChanged`, keyed by
    /// its uploader); a blocked file is told again when the command runs
    /// again after a crash, so nobody misses it.
    async fn audit_file(
        &self,
        cmd: &AdminCommand,
        pool: &sqlx::MySqlPool,
        id: &crate::files::FileId,
        blocked: bool,
    ) -> Result<Vec<String>, Refused> {
        use crate::files::{self, State, Verdict};
        let unavailable = |e: sqlx::Error| Refused(503, e.to_string());
        let tell = if blocked {
            files::make_unavailable(pool, id, Verdict::Audit)
                .await
                .map_err(unavailable)?;
            true
        } else {
            files::restore_audited(pool, id)
                .await
                .map_err(unavailable)?
        };
        let Some(record) = files::get(pool, id).await.map_err(unavailable)? else {
            return Ok(Vec::new());
        };
        if !tell || (record.state == State::Unavailable) != blocked {
            return Ok(Vec::new());
        }
        let topics = files::topics_of(pool, id).await.map_err(unavailable)?;
        let body = UserEventBody::FileAvailabilityChanged(FileAvailabilityChanged {
            file_id: id.to_string(),
            available: !blocked,
            by: Verdict::Audit.as_str().into(),
            topics,
        });
        let event = UserEvent::new(&cmd.tenant_id, record.uploader, 0, body);
        self.producer
            .send(TopicKind::UserEvents, &event.key(), &event, None)
            .await
            .map_err(|e| Refused(503, e.to_string()))?;
        Ok(vec![event.event_id])
    }

    async fn group_event(
        &self,
        cmd: &AdminCommand,
        topic: &str,
        body: GroupEventBody,
    ) -> Result<Vec<String>, Refused> {
        let event = GroupEvent {
            event_id: derived_event_id(
                &CommandScope {
                    tenant: &cmd.tenant_id,
                    topic,
                    actor: 0,
                    command_id: &cmd.command_id,
                },
                kind_name(&cmd.body),
                0,
            ),
            actor_device: cmd.operator.clone(),
            ..GroupEvent::new(&cmd.tenant_id, topic, 0, body)
        };
        self.producer
            .send(
                TopicKind::GroupEvents,
                &format!("{}:{topic}", cmd.tenant_id),
                &event,
                None,
            )
            .await
            .map_err(|e| Refused(503, e.to_string()))?;
        Ok(vec![event.event_id])
    }

    /// Produces one session-control event for `uid` (versions bumped past
    /// the user's current state in MySQL, the ground truth), with an id
    /// derived from the command. `body` gets the state and the auth version
    /// the event carries: with [`Auth::Next`] one taken atomically
    /// ([`crate::session_control::next_auth_version`]), else the current.
    async fn control(
        &self,
        cmd: &AdminCommand,
        uid: i64,
        auth: Auth,
        body: impl FnOnce(&crate::session_control::UserControl, i64) -> SessionControlBody,
    ) -> Result<Vec<String>, Refused> {
        if uid <= 0 {
            return Err(Refused(400, "uid must be positive".into()));
        }
        let unavailable = |e: &dyn std::fmt::Display| Refused(503, e.to_string());
        let pool = self
            .pools
            .get(&cmd.tenant_id)
            .map_err(|e| Refused(404, e.to_string()))?;
        let current = crate::session_control::load(pool, uid)
            .await
            .map_err(|e| unavailable(&e))?;
        let auth_version = match auth {
            Auth::Same => current.auth_version,
            Auth::Next => crate::session_control::next_auth_version(pool, uid)
                .await
                .map_err(|e| unavailable(&e))?,
        };
        let event = SessionControlEvent {
            event_id: derived_event_id(
                &CommandScope {
                    tenant: &cmd.tenant_id,
                    topic: &crate::tinode::user_id(uid),
                    actor: 0,
                    command_id: &cmd.command_id,
                },
                kind_name(&cmd.body),
                0,
            ),
            tenant_id: cmd.tenant_id.clone(),
            uid,
            occurred_at: now_ms(),
            actor_uid: 0,
            reason: if cmd.reason.is_empty() {
                format!("admin {}", kind_name(&cmd.body))
            } else {
                cmd.reason.clone()
            },
            body: body(&current, auth_version),
        };
        self.producer
            .send(
                TopicKind::SessionControl,
                &format!("{}:{uid}", cmd.tenant_id),
                &event,
                None,
            )
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(vec![event.event_id])
    }
}
