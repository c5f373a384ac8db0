//! Tinode's file endpoints (issue 41): `POST /v0/file/u/` takes one file
//! of a multipart form (field `file`), streams it to the files' object
//! store ([`crate::files::store`]) and answers `{ctrl params={url}}` with
//! its relative address; `GET /v0/file/s/<id>` serves it, by byte range,
//! to whoever may read it: its uploader until a message or a profile
//! refers to it, then whoever can read such a message (through the read
//! path: membership, deletes, recalls), or anyone of the tenant for a
//! profile picture. Both take the session token as Tinode's clients send
//! it (`X-Tinode-Auth: Token …`, or `auth=token&secret=…` in the address
//! of an `<img>`), or as a bearer token; both answer errors as Tinode
//! `{ctrl}` objects, which the web app shows. A file nobody may read, or
//! none at all, is the same `404`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use serde_json::json;

use crate::auth::Claims;
use crate::events::{FileUploaded, UserEvent, UserEventBody};
use crate::files::range::{self, Ranged};
use crate::files::{self, sniff, FileId, FileRecord};
use crate::kafka::topics::TopicKind;
use crate::tinode;

use super::http::{authenticate, authenticate_token, rate};
use super::limits::Action;
use super::refusal::{error, unavailable, ApiError, Refusal};
use super::Gateway;

/// The upload path.
pub const UPLOAD_PATH: &str = "/v0/file/u/";

/// What a download's answer says of itself: shown in a sandbox, never
/// sniffed, revalidated on each use (a reader removed or a file made
/// unavailable is refused at once).
const DOWNLOAD_CSP: &str = "default-src 'none'; sandbox";

/// `POST /v0/file/u/`.
pub async fn upload(
    State(gw): State<Arc<Gateway>>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match receive(&gw, &query, &headers, body).await {
        Ok(id) => tinode_answer(
            StatusCode::OK,
            tinode::ctrl(None, None, 200, "ok", Some(json!({"url": id.url()}))),
        ),
        Err(e) => refused(e),
    }
}

/// `GET /v0/file/s/<id>`.
pub async fn download(
    State(gw): State<Arc<Gateway>>,
    Path(tail): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    match serve(&gw, &tail, &query, &headers).await {
        Ok(response) => response,
        Err(e) => refused(e),
    }
}

/// The caller, from Tinode's header, a bearer token or the address.
async fn caller(
    gw: &Gateway,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Claims, ApiError> {
    let tinode_header = headers
        .get("x-tinode-auth")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Token "));
    if let Some(token) = tinode_header {
        return authenticate_token(gw, token).await;
    }
    if headers.contains_key(header::AUTHORIZATION) {
        return authenticate(gw, headers).await;
    }
    match (query.get("auth").map(String::as_str), query.get("secret")) {
        (Some("token"), Some(token)) => authenticate_token(gw, token).await,
        _ => Err(error(401, "authentication required")),
    }
}

async fn receive(
    gw: &Gateway,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Body,
) -> Result<FileId, ApiError> {
    // Who and how often before a byte of the body is read.
    let claims = caller(gw, query, headers).await?;
    rate(gw, &claims, Action::Upload).await?;
    let boundary = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| multer::parse_boundary(t).ok())
        .ok_or_else(|| error(400, "malformed: a multipart/form-data body is expected"))?;
    let mut form = multer::Multipart::new(body.into_data_stream(), boundary);
    let limit = gw.config.files.max_upload_bytes;
    let timeout = std::time::Duration::from_secs(gw.config.files.upload_timeout_secs.max(1));
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let field = tokio::time::timeout_at(deadline, form.next_field())
            .await
            .map_err(|_| error(408, "the upload took too long"))?
            .map_err(|e| error(400, format!("malformed: {e}")))?;
        let Some(field) = field else {
            return Err(error(400, "malformed: the form has no field named file"));
        };
        if field.name() == Some("file") {
            return keep(gw, &claims, field, limit, deadline).await;
        }
    }
}

/// Streams the form's file to the store and records it.
async fn keep(
    gw: &Gateway,
    claims: &Claims,
    mut field: multer::Field<'static>,
    limit: u64,
    deadline: tokio::time::Instant,
) -> Result<FileId, ApiError> {
    let pool = gw.pools.get(&claims.ten).map_err(unavailable)?;
    let name: String = field
        .file_name()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(255)
        .collect();
    let id = FileId::random();
    let key = gw.files.key(&claims.ten, claims.uid, &id);
    files::begin(pool, &id, claims.uid, key.as_ref(), &name)
        .await
        .map_err(unavailable)?;
    let mut upload = match gw.files.writer(&key).await {
        Ok(u) => u,
        Err(e) => {
            let _ = files::abandon(pool, &id).await;
            return Err(unavailable(e));
        }
    };
    let mut head: Vec<u8> = Vec::with_capacity(sniff::SNIFF_BYTES);
    let written: Result<(), ApiError> = async {
        loop {
            let chunk = tokio::time::timeout_at(deadline, field.chunk())
                .await
                .map_err(|_| error(408, "the upload took too long"))?
                .map_err(|e| error(400, format!("malformed: {e}")))?;
            let Some(chunk) = chunk else {
                return Ok(());
            };
            if upload.written() + chunk.len() as u64 > limit {
                return Err(error(
                    413,
                    format!("the file is larger than {limit} bytes (files.max_upload_bytes)"),
                ));
            }
            if head.len() < sniff::SNIFF_BYTES {
                let take = (sniff::SNIFF_BYTES - head.len()).min(chunk.len());
                head.extend_from_slice(&chunk[..take]);
            }
            upload.write(&chunk).await.map_err(unavailable)?;
        }
    }
    .await;
    let size = upload.written();
    let written = written.and_then(|()| {
        if size == 0 {
            Err(error(400, "malformed: the file is empty"))
        } else {
            Ok(())
        }
    });
    if let Err(e) = written {
        upload.abort().await;
        let _ = files::abandon(pool, &id).await;
        return Err(e);
    }
    if let Err(e) = upload.finish().await {
        // The store may complete the object all the same (its answer lost,
        // or late: a completion cut short by the timeout may still land
        // after a delete now). The record stays `uploading`, never served,
        // and the sweep removes it and whatever the store then holds once
        // the upload could no longer be going on.
        tracing::warn!(file = %id, error = %e, "an upload the store did not complete is left to the sweep");
        return Err(unavailable(e));
    }
    let mime = sniff::content_type(&head);
    files::stored(pool, &id, size as i64, mime)
        .await
        .map_err(unavailable)?;
    // Told to the log (the scan and the user's other devices read it);
    // the file is kept either way: an upload nobody refers to goes after
    // `files.unreferenced_ttl_secs`.
    let body = UserEventBody::FileUploaded(FileUploaded {
        file_id: id.to_string(),
        object_key: key.to_string(),
        size: size as i64,
        mime: mime.to_string(),
        name,
    });
    let event = UserEvent::new(&claims.ten, claims.uid, claims.uid, body);
    gw.sender
        .producer()
        .send(TopicKind::UserEvents, &event.key(), &event, None)
        .await
        .map_err(unavailable)?;
    Ok(id)
}

async fn serve(
    gw: &Gateway,
    tail: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let not_found = || error(404, "file not found");
    let id = FileId::from_path_tail(tail).ok_or_else(not_found)?;
    let claims = caller(gw, query, headers).await?;
    let pool = gw.pools.get(&claims.ten).map_err(unavailable)?;
    let record = files::get(pool, &id)
        .await
        .map_err(unavailable)?
        .filter(|r| matches!(r.state, files::State::Stored | files::State::Unavailable))
        .ok_or_else(not_found)?;
    let may = readable(gw, &claims.ten, claims.uid, &record)
        .await
        .map_err(|Refusal(code, text)| error(code, text))?;
    if !may {
        return Err(not_found());
    }
    if record.state == files::State::Unavailable {
        return Err(error(410, "this file is no longer available"));
    }
    let etag = format!("\"{id}\"");
    let mut answer = Response::builder()
        .header(header::ETAG, &etag)
        .header(header::CACHE_CONTROL, "private, no-cache")
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::CONTENT_SECURITY_POLICY, DOWNLOAD_CSP)
        .header(header::ACCEPT_RANGES, "bytes");
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag))
    {
        return answer
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::empty())
            .map_err(unavailable);
    }
    let len = record.size.max(0) as u64;
    let ranged = range::parse(
        headers.get(header::RANGE).and_then(|v| v.to_str().ok()),
        len,
    );
    let (status, part) = match ranged {
        Ranged::Whole => (StatusCode::OK, None),
        Ranged::Part { start, end } => {
            answer = answer.header(
                header::CONTENT_RANGE,
                format!("bytes {start}-{}/{len}", end - 1),
            );
            (StatusCode::PARTIAL_CONTENT, Some((start, end)))
        }
        Ranged::Unsatisfiable => {
            return answer
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(header::CONTENT_RANGE, format!("bytes */{len}"))
                .body(Body::empty())
                .map_err(unavailable);
        }
    };
    let key = gw.files.key(&claims.ten, record.uploader, &record.id);
    let bytes = gw.files.read(&key, part).await.map_err(|e| match e {
        object_store::Error::NotFound { .. } => not_found(),
        e => unavailable(e),
    })?;
    let length = part.map_or(len, |(s, e)| e - s);
    let attachment =
        query.get("asatt").is_some_and(|v| v == "1") || !sniff::shown_inline(&record.mime);
    answer
        .status(status)
        .header(header::CONTENT_TYPE, &record.mime)
        .header(header::CONTENT_LENGTH, length)
        .header(
            header::CONTENT_DISPOSITION,
            disposition(attachment, &record.name, &id),
        )
        .body(Body::from_stream(bytes.map_err(std::io::Error::other)))
        .map_err(unavailable)
}

/// Whether `uid` may read `record`: its uploader while nothing refers to
/// it; anyone of the tenant when a profile shows it; else who can read a
/// message that refers to it, as the history route decides.
async fn readable(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    record: &FileRecord,
) -> Result<bool, Refusal> {
    let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
    let refs = files::refs(pool, &record.id)
        .await
        .map_err(Refusal::unavailable)?;
    if refs.is_empty() {
        return Ok(record.uploader == uid);
    }
    for r in refs {
        if files::is_picture_ref(&r.topic) {
            return Ok(true);
        }
        match super::reads::ensure_member(gw, tenant, &r.topic, uid).await {
            Ok(()) => {}
            Err(Refusal(code, _)) if code < 500 => continue,
            Err(e) => return Err(e),
        }
        if message_readable(gw, tenant, uid, &r).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How long a message recorded a moment ago may take to be stored (the
/// reference is written before the message is produced; the reader may
/// have it from the fan-out before the store pipeline wrote it).
const FRESH_REF_MS: i64 = 5_000;

/// Whether `uid` can read the message `r` names, as the history route
/// answers; a message referenced a moment ago that is not stored yet is
/// asked for again for a little while.
async fn message_readable(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    r: &files::FileRef,
) -> Result<bool, Refusal> {
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis((FRESH_REF_MS - r.age_ms).max(0) as u64);
    loop {
        let resolved = crate::references::resolve(&gw.history, tenant, uid, &r.topic, r.seq)
            .await
            .map_err(Refusal::unavailable)?;
        match resolved.state {
            crate::references::State::Ok => return Ok(true),
            crate::references::State::Gone if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            _ => return Ok(false),
        }
    }
}

/// The files `uid`'s message `content` refers to (this server's download
/// addresses in its entities' `ref` and `preref`), each one the sender
/// may share (seed 002 §6.2 step 3, the file ACL): their own upload, or
/// a file they can read (a forward). Refused before a seq is taken: a
/// file unknown or not theirs to share is `403` (the same answer for
/// both), one made unavailable `410`.
pub async fn shared_in(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    content: &serde_json::Value,
) -> Result<Vec<FileId>, Refusal> {
    let ids = files::referenced(content);
    if ids.len() > files::MAX_FILES_PER_MESSAGE {
        return Err(Refusal(
            400,
            format!(
                "a message refers to at most {} files",
                files::MAX_FILES_PER_MESSAGE
            ),
        ));
    }
    if ids.is_empty() {
        return Ok(ids);
    }
    let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
    for id in &ids {
        let record = files::get(pool, id).await.map_err(Refusal::unavailable)?;
        let mine = match &record {
            Some(r) if matches!(r.state, files::State::Stored | files::State::Unavailable) => {
                r.uploader == uid || readable(gw, tenant, uid, r).await?
            }
            _ => false,
        };
        if !mine {
            return Err(Refusal(403, format!("file {id} is not yours to share")));
        }
        if record.is_some_and(|r| r.state == files::State::Unavailable) {
            return Err(Refusal(410, format!("file {id} is no longer available")));
        }
    }
    Ok(ids)
}

/// A profile picture (a user's or a group's `photo`, as its profile
/// change carries it) that is an upload of this server: only the caller's
/// own upload may be one (`403` otherwise, the same for a file that does
/// not exist; `410` for an unavailable one), since every user of the
/// tenant may then load it. Recorded as a picture (`topic` empty, `seq`
/// the caller) before the change is made, so its readers never find it
/// refused; a change refused after this leaves the caller's own file
/// readable as a picture, nothing more. Anything else (none, an inline
/// `data:` picture, another address) is no upload: nothing to do.
pub async fn picture(
    gw: &Gateway,
    tenant: &str,
    uid: i64,
    photo: Option<&str>,
) -> Result<(), Refusal> {
    let Some(id) = photo.and_then(FileId::from_reference) else {
        return Ok(());
    };
    let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
    let record = files::get(pool, &id).await.map_err(Refusal::unavailable)?;
    let gone = || Refusal(410, format!("file {id} is no longer available"));
    match record {
        Some(r) if r.uploader == uid && r.state == files::State::Stored => {
            match files::refer(pool, &id, "", uid).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(gone()),
                Err(e) => Err(Refusal::unavailable(e)),
            }
        }
        Some(r) if r.uploader == uid && r.state == files::State::Unavailable => Err(gone()),
        // A profile's picture already (a client sending a group's current
        // photo again with a new name): readable by all, nothing to add.
        // Only one a profile shows: the gateway's record of a picture it
        // accepted may be released by its owner's next change.
        Some(r)
            if r.state == files::State::Stored
                && files::is_shown_picture(pool, &id)
                    .await
                    .map_err(Refusal::unavailable)? =>
        {
            Ok(())
        }
        _ => Err(Refusal(
            403,
            format!("file {id} is not yours: a picture must be your own upload"),
        )),
    }
}

/// Records that message `seq` of `topic` refers to `ids`, before the
/// message is produced: its readers may fetch the files as soon as they
/// have it. A failure here refuses the send (nothing was produced yet).
pub async fn record_refs(
    gw: &Gateway,
    tenant: &str,
    topic: &str,
    seq: i64,
    ids: &[FileId],
) -> Result<(), Refusal> {
    let pool = gw.pools.get(tenant).map_err(Refusal::internal)?;
    for id in ids {
        // Swept since it was checked (nothing referred to it for a day).
        if !files::refer(pool, id, topic, seq)
            .await
            .map_err(Refusal::unavailable)?
        {
            return Err(Refusal(410, format!("file {id} is no longer available")));
        }
    }
    Ok(())
}

/// `Content-Disposition` with the uploader's name (RFC 6266/5987: only
/// unreserved characters as they are), or the id when it has none.
fn disposition(attachment: bool, name: &str, id: &FileId) -> String {
    let kind = if attachment { "attachment" } else { "inline" };
    let name = if name.is_empty() { id.as_str() } else { name };
    let mut encoded = String::with_capacity(name.len() * 3);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{kind}; filename*=UTF-8''{encoded}")
}

/// A Tinode `{ctrl}` answer, never cached.
fn tinode_answer(status: StatusCode, ctrl: String) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        ctrl,
    )
        .into_response()
}

/// A refusal as Tinode's clients read it: `{ctrl{code, text, params}}`.
fn refused(e: ApiError) -> Response {
    let ApiError(status, text, params) = e;
    tinode_answer(
        status,
        tinode::ctrl(None, None, status.as_u16(), &text, params),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_percent_encoded_and_never_break_the_header() {
        let id = FileId::random();
        assert_eq!(
            disposition(true, "report 2026.pdf", &id),
            "attachment; filename*=UTF-8''report%202026.pdf"
        );
        assert_eq!(
            disposition(false, "a\"b;c\r\nSet-Cookie: x", &id),
            "inline; filename*=UTF-8''a%22b%3Bc%0D%0ASet-Cookie%3A%20x"
        );
        assert_eq!(
            disposition(false, "", &id),
            format!("inline; filename*=UTF-8''{id}")
        );
        assert!(disposition(true, "фото.jpg", &id).ends_with("%D1%84%D0%BE%D1%82%D0%BE.jpg"));
    }
}
