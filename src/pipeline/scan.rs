//! The scan pipeline's handler (issue 41, seed 002 §2.2): every
//! `FileUploaded` is put to the scanner `files.scanner` names. A flagged
//! file is unavailable to everyone at once: its state written first (every
//! download and send checks it: `410`), then a `FileAvailabilityChanged`
//! user event that the notify pipeline tells live to its uploader and to
//! every conversation with a message referring to it. The scan's outcome
//! is recorded last, so a crash in between scans the file again (the event
//! may then be told twice; never not at all). A file the scanner answers
//! about without a verdict (twice), while it decides a clean check sample,
//! is held unavailable the same way, its outcome `failed`; a scanner that
//! does not answer, or decides nothing, is waited for.

use std::time::Duration;

use crate::events::{EventCodec, FileAvailabilityChanged, UserEvent, UserEventBody};
use crate::files::scan::{Outcome, ScanError, Scanner, Subject};
use crate::files::store::FileStore;
use crate::files::{self, FileId, State, Verdict};
use crate::kafka::producer::EventProducer;
use crate::kafka::topics::TopicKind;
use crate::tenant::{db_failure, TenantPools};

use super::failure::{produce_failure, FailureKind};
use super::records::{apply_in_order, Handler, Record, RecordFailure};

/// Times the scanner is asked about a file it answers without a verdict
/// on (a second apart) before its check sample tells whose fault it is.
const SCANNER_ATTEMPTS: u32 = 2;

pub struct ScanHandler {
    codec: EventCodec,
    pools: TenantPools,
    producer: EventProducer,
    store: FileStore,
    scanner: Scanner,
    timeout: Duration,
}

impl ScanHandler {
    pub fn new(
        codec: EventCodec,
        pools: TenantPools,
        producer: EventProducer,
        store: FileStore,
        scanner: Scanner,
        timeout: Duration,
    ) -> Self {
        Self {
            codec,
            pools,
            producer,
            store,
            scanner,
            timeout,
        }
    }

    async fn apply(&self, e: &UserEvent) -> Result<(), (FailureKind, String)> {
        let UserEventBody::FileUploaded(f) = &e.body else {
            return Ok(());
        };
        let pool = self
            .pools
            .get(&e.tenant_id)
            .map_err(|err| (FailureKind::Poison, err.to_string()))?;
        let db = |err: sqlx::Error| (db_failure(&err), format!("mysql: {err}"));
        let id = FileId::parse(&f.file_id)
            .ok_or_else(|| (FailureKind::Poison, format!("bad file id {:?}", f.file_id)))?;
        // Scanned already (a redelivery), or gone: nothing to decide.
        let Some(record) = files::get(pool, &id).await.map_err(db)? else {
            return Ok(());
        };
        if record.state == State::Deleted || record.scan != "pending" {
            return Ok(());
        }
        let subject = Subject {
            tenant: &e.tenant_id,
            file_id: id.as_str(),
            object_key: &record.object_key,
            size: record.size,
            mime: &record.mime,
        };
        let key = self.store.key(&e.tenant_id, record.uploader, &id);
        let started = std::time::Instant::now();
        // No answer (the store or the scanner down, overloaded, too
        // slow): retried, in order, never skipped, no file failed for it.
        // An answer without a verdict on this file: asked once more; then
        // the check sample tells whose fault it is. The scanner decides
        // the sample: this file is at fault, held unavailable, fail-closed
        // (a file crafted to make the scanner fail neither passes nor
        // holds every later upload unscanned). It does not: the scanner
        // is broken, waited for like a down one.
        let (mut attempt, mut undecided) = (1, false);
        let outcome = loop {
            match self
                .scanner
                .scan(&self.store, &key, &subject, self.timeout)
                .await
            {
                Ok(outcome) => break outcome,
                Err(ScanError::Down(why)) => {
                    return Err((
                        FailureKind::Outage,
                        format!("scan of {id}: no answer: {why}"),
                    ))
                }
                Err(ScanError::NoVerdict(why)) if attempt < SCANNER_ATTEMPTS => {
                    tracing::warn!(tenant = %e.tenant_id, file = %id, attempt, %why, "the scanner gave no verdict; asked again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    attempt += 1;
                }
                Err(ScanError::NoVerdict(why)) => {
                    match self.scanner.check(&self.store, self.timeout).await {
                        Ok(Outcome::Clean) => {
                            undecided = true;
                            break Outcome::Flagged(format!("could not be scanned: {why}"));
                        }
                        Ok(other) => {
                            return Err((
                                FailureKind::Outage,
                                format!("scan of {id}: {why}; the scanner judged its clean check sample {other:?}"),
                            ))
                        }
                        Err(down) => {
                            return Err((
                                FailureKind::Outage,
                                format!("scan of {id}: {why}; its check failed too: {down}"),
                            ))
                        }
                    }
                }
            }
        };
        metrics::histogram!(crate::metrics::FILE_SCAN_SECONDS)
            .record(started.elapsed().as_secs_f64());
        let outcome = match outcome {
            Outcome::Clean => "clean",
            Outcome::Missing => "missing",
            Outcome::Flagged(reason) => {
                tracing::warn!(tenant = %e.tenant_id, file = %id, uploader = e.uid, %reason, "an upload was flagged by the scan");
                files::make_unavailable(pool, &id, Verdict::Scan)
                    .await
                    .map_err(db)?;
                let topics = files::topics_of(pool, &id).await.map_err(db)?;
                let body = UserEventBody::FileAvailabilityChanged(FileAvailabilityChanged {
                    file_id: id.to_string(),
                    available: false,
                    by: Verdict::Scan.as_str().into(),
                    topics,
                });
                let event = UserEvent::new(&e.tenant_id, e.uid, 0, body);
                self.producer
                    .send(TopicKind::UserEvents, &event.key(), &event, None)
                    .await
                    .map_err(|err| (produce_failure(&err), err.to_string()))?;
                if undecided {
                    "failed"
                } else {
                    "flagged"
                }
            }
        };
        metrics::counter!(crate::metrics::FILE_SCANS_TOTAL, "outcome" => outcome).increment(1);
        files::scanned(pool, &id, outcome).await.map_err(db)
    }
}

impl Handler for ScanHandler {
    async fn handle(&self, records: &[&Record]) -> Result<(), Vec<RecordFailure>> {
        apply_in_order(&self.codec, records, |event: UserEvent| async move {
            self.apply(&event).await
        })
        .await
    }
}
