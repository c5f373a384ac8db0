//! The references pipeline's handler: group events → the references that
//! must keep finding their messages (seed 000 §12 item 8): which messages
//! carry a file (`im_group_files`, with its audit verdict) and the
//! moderation queue (`im_message_reports`), and a group's picture (its
//! `@<group>` file reference). Records apply in log order per conversation
//! (a report before its resolution); every write is an insert-if-absent, an
//! update to fixed values, or (a recall, a delete, a replaced picture) the
//! removal of references the event names, so redelivery changes nothing
//! and a replay ends where the log does.

use crate::events::{EventCodec, GroupEvent, GroupEventBody};
use crate::failure::FailureKind;
use crate::references::{files, reports};
use crate::tenant::{db_failure, TenantPools};
use crate::tinode;

use super::records::{apply_in_order, Handler, Record, RecordFailure};

pub struct ReferencesHandler {
    codec: EventCodec,
    pools: TenantPools,
    /// How long a file whose last message went is kept
    /// (`files.deleted_retention_secs`).
    retention_secs: u64,
}

impl ReferencesHandler {
    pub fn new(codec: EventCodec, pools: TenantPools, retention_secs: u64) -> Self {
        Self {
            codec,
            pools,
            retention_secs,
        }
    }

    async fn apply(&self, e: &GroupEvent) -> Result<(), (FailureKind, String)> {
        let db = |err: sqlx::Error| (db_failure(&err), format!("mysql: {err}"));
        let pool = || {
            self.pools
                .get(&e.tenant_id)
                .map_err(|err| (FailureKind::Poison, err.to_string()))
        };
        match &e.body {
            GroupEventBody::MessageSent(m) => {
                // An edit (a replacement message) is not a file of its own:
                // its uploads go with the message it replaces.
                let replaced = tinode::replaced_seq(m.head.as_deref()).ok().flatten();
                let edit = replaced.is_some();
                if let Some(kind) = files::file_kind(m.content.as_deref()).filter(|_| !edit) {
                    files::record(pool()?, &[(e.topic.clone(), m.seq, kind, m.created_at)])
                        .await
                        .map_err(db)?;
                }
                // Its uploads, as the send path recorded them (a replay
                // writes them again).
                let content = m
                    .content
                    .as_deref()
                    .and_then(|c| serde_json::from_str(c).ok())
                    .unwrap_or_default();
                // (A file swept since is not referred to again.)
                for id in crate::files::referenced(&content) {
                    crate::files::refer(pool()?, &id, &e.topic, replaced.unwrap_or(m.seq))
                        .await
                        .map_err(db)?;
                }
            }
            // The group's picture: the new one recorded, the old released.
            GroupEventBody::GroupProfileChanged(p) => {
                if let Some(photo) = &p.photo {
                    crate::files::set_picture(pool()?, &e.topic, photo, self.retention_secs)
                        .await
                        .map_err(db)?;
                }
            }
            // The message's uploads: unreachable for readers already (the
            // read path), now queued to go once nothing else refers to them.
            GroupEventBody::MessageRecalled(r) => {
                crate::files::unrefer(pool()?, &e.topic, r.seq, r.seq + 1, self.retention_secs)
                    .await
                    .map_err(db)?;
            }
            GroupEventBody::MessageDeleted(d) => {
                for range in &d.ranges {
                    crate::files::unrefer(
                        pool()?,
                        &e.topic,
                        range.low,
                        range.hi,
                        self.retention_secs,
                    )
                    .await
                    .map_err(db)?;
                }
            }
            GroupEventBody::MessageReported(r) => {
                reports::record(
                    pool()?,
                    &r.report_id,
                    &e.topic,
                    r.seq,
                    e.actor_uid,
                    &r.reason,
                    e.occurred_at,
                )
                .await
                .map_err(db)?;
            }
            GroupEventBody::MessageReportResolved(r) => {
                let status = reports::Status::parse(&r.resolution)
                    .filter(|s| *s != reports::Status::Open)
                    .ok_or_else(|| {
                        (
                            FailureKind::Poison,
                            format!("unknown resolution {:?}", r.resolution),
                        )
                    })?;
                reports::resolve(
                    pool()?,
                    &r.report_id,
                    status,
                    &e.actor_device,
                    &r.note,
                    e.occurred_at,
                )
                .await
                .map_err(db)?;
            }
            GroupEventBody::FileAuditUpdated(a) => {
                let audit = files::Audit::parse(&a.status).ok_or_else(|| {
                    (
                        FailureKind::Poison,
                        format!("unknown file audit status {:?}", a.status),
                    )
                })?;
                // A file message not recorded (yet) is left alone: the
                // command checked it was recorded before producing this.
                files::set_audit(
                    pool()?,
                    &e.topic,
                    a.seq,
                    audit,
                    &e.actor_device,
                    e.occurred_at,
                )
                .await
                .map_err(db)?;
            }
            _ => {}
        }
        Ok(())
    }
}

impl Handler for ReferencesHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        apply_in_order(&self.codec, records, |event: GroupEvent| async move {
            self.apply(&event).await
        })
        .await
    }
}
