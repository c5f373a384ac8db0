//! Files (issue 41) against the real services, the bytes in the stack's
//! S3-compatible store: an upload as Tinode's clients make it (multipart,
//! `X-Tinode-Auth`), answered with a relative address; the type taken from
//! the bytes, not the client; a download only for whoever may read it (its
//! uploader until a message refers to it, then the message's readers, by
//! header or by the address's `auth`/`secret` as an `<img>` sends it), by
//! byte range; a message may refer only to files its sender may share;
//! limits and malformed uploads refused with a Tinode `{ctrl}`.

mod common;

use std::net::SocketAddr;

use serde_json::{json, Value};

use common::{call, upload, upload_form as form, Stack};

const A: i64 = 4101;
const B: i64 = 4102;
const C: i64 = 4103;
const GROUP: &str = "grpFilesRoom";

struct Got {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

/// `GET url` with the token in Tinode's header, or in the address as an
/// `<img>` carries it (`query`), and an optional `Range`.
async fn download(
    addr: SocketAddr,
    token: &str,
    url: &str,
    query: bool,
    range: Option<&str>,
) -> Got {
    let mut req = if query {
        reqwest::Client::new().get(format!(
            "http://{addr}{url}?apikey=x&auth=token&secret={token}"
        ))
    } else {
        reqwest::Client::new()
            .get(format!("http://{addr}{url}"))
            .header("X-Tinode-Auth", format!("Token {token}"))
    };
    if let Some(r) = range {
        req = req.header("Range", r);
    }
    let resp = req.send().await.unwrap();
    Got {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp.bytes().await.unwrap().to_vec(),
    }
}

/// A picture's bytes: PNG's signature, then `len` pseudo-random bytes
/// (the benchmark's).
fn png(len: usize, seed: u64) -> Vec<u8> {
    imstream::bench::files::picture(len as u64 + 8, seed)
}

/// A message of `uid` in `topic` (`grp…`, or a peer's uid for one to one)
/// whose picture is `url`.
async fn send_picture(
    stack: &Stack,
    addr: SocketAddr,
    uid: i64,
    to: &str,
    url: &str,
    cmid: &str,
) -> (u16, Value) {
    let path = match to.strip_prefix("usr") {
        Some(peer) => format!("/v1/users/{peer}/messages"),
        None => format!("/v1/groups/{to}/messages"),
    };
    let content = json!({
        "txt": " ", "fmt": [{"at": 0, "len": 1, "key": 0}],
        "ent": [{"tp": "IM", "data": {"mime": "image/png", "ref": url, "name": "photo.png",
                 "width": 64, "height": 64, "size": 2_000_000}}]
    });
    call(
        stack,
        addr,
        uid,
        "POST",
        &path,
        json!({"content": content, "client_msg_id": cmid}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_reaches_its_messages_readers_and_nobody_else() {
    let mut stack = Stack::prepared(None).await;
    let bucket = format!("imstream-files-{}", stack.world.id);
    stack.world.config.files.store_options = common::s3_bucket(&bucket).await;
    stack.world.config.files.store_url = format!("s3://{bucket}/files");
    for p in ["store", "conversations", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    stack.create_group(GROUP, A, &[B]).await;
    let token = |uid: i64| stack.token(uid, "web");

    // Clients are told the limit.
    let mut ws = common::Ws::connect(gw, &token(C)).await;
    let (_, hi) = ws.request(json!({"hi": {"ver": "0.25.3"}})).await;
    assert_eq!(
        hi["ctrl"]["params"]["maxFileUploadSize"],
        json!(8 * 1024 * 1024),
        "{hi}"
    );

    // A uploads a 2 MB picture, claimed as HTML: kept as what its bytes are.
    let picture = png(2_000_000, 41);
    let (status, ctrl) = upload(gw, &token(A), "photo.png", "text/html", &picture).await;
    assert_eq!(status, 200, "{ctrl}");
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let url = ctrl["ctrl"]["params"]["url"]
        .as_str()
        .expect("url")
        .to_string();
    assert!(url.starts_with("/v0/file/s/"), "relative: {url}");

    // Nothing refers to it yet: its uploader only.
    let own = download(gw, &token(A), &url, false, None).await;
    assert_eq!(own.status, 200);
    assert_eq!(own.body, picture, "the bytes as uploaded");
    assert_eq!(own.headers["content-type"], "image/png");
    assert_eq!(own.headers["x-content-type-options"], "nosniff");
    assert!(own.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("sandbox"));
    assert!(own.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("inline"));
    for uid in [B, C] {
        let other = download(gw, &token(uid), &url, false, None).await;
        assert_eq!(
            other.status, 404,
            "user {uid} before any message refers to it"
        );
        assert!(!other.body.windows(8).any(|w| w == &picture[8..16]));
    }

    // C may not put A's file in a message of his own.
    let (status, body) = send_picture(&stack, gw, C, &format!("usr{A}"), &url, "c-steal").await;
    assert_eq!(status, 403, "{body}");

    // A sends it to the group: B reads it, by header and as an <img> does;
    // C, no member, still gets nothing.
    let (status, body) = send_picture(&stack, gw, A, GROUP, &url, "a-pic").await;
    assert_eq!(status, 202, "{body}");
    let by_header = download(gw, &token(B), &url, false, None).await;
    assert_eq!(by_header.status, 200);
    assert_eq!(by_header.body, picture);
    let as_img = download(gw, &token(B), &url, true, None).await;
    assert_eq!(as_img.status, 200);
    assert_eq!(as_img.body.len(), picture.len());
    assert_eq!(download(gw, &token(C), &url, true, None).await.status, 404);

    // Byte ranges, as players and resumed downloads ask.
    let part = download(gw, &token(B), &url, false, Some("bytes=100-199")).await;
    assert_eq!(part.status, 206);
    assert_eq!(part.body, picture[100..200]);
    assert_eq!(
        part.headers["content-range"],
        format!("bytes 100-199/{}", picture.len()).as_str()
    );
    let past = download(gw, &token(B), &url, false, Some("bytes=99999999-")).await;
    assert_eq!(past.status, 416);
    let attachment = download(gw, &token(B), &format!("{url}?asatt=1"), false, None).await;
    assert!(attachment.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));

    // B forwards it to C: C may read it there.
    let (status, body) = send_picture(&stack, gw, B, &format!("usr{C}"), &url, "b-fwd").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(download(gw, &token(C), &url, false, None).await.status, 200);

    // B is removed from the group: a file A sends there afterwards is not
    // B's to read (the one sent while B was a member still is).
    let (status, body) = call(
        &stack,
        gw,
        A,
        "DELETE",
        &format!("/v1/groups/{GROUP}/members/{B}"),
        json!({}),
    )
    .await;
    assert!(status < 300, "{status} {body}");
    let later = png(50_000, 77);
    let (status, ctrl) = upload(gw, &token(A), "later.png", "image/png", &later).await;
    assert_eq!(status, 200, "{ctrl}");
    let later_url = ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string();
    let (status, body) = send_picture(&stack, gw, A, GROUP, &later_url, "a-later").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        download(gw, &token(B), &later_url, false, None)
            .await
            .status,
        404,
        "a removed member, a file sent after the removal"
    );

    // Another spelling of the address names nothing.
    let upper = url.replace(
        &url["/v0/file/s/".len()..],
        &url["/v0/file/s/".len()..].to_uppercase(),
    );
    assert_eq!(
        download(gw, &token(A), &upper, false, None).await.status,
        404
    );

    // A PDF is served as an attachment.
    let mut pdf = b"%PDF-1.7\n".to_vec();
    pdf.extend(png(5_000_000, 7));
    let (status, ctrl) = upload(gw, &token(A), "report.pdf", "image/png", &pdf).await;
    assert_eq!(status, 200, "{ctrl}");
    let pdf_url = ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string();
    let got = download(gw, &token(A), &pdf_url, false, None).await;
    assert_eq!(got.headers["content-type"], "application/pdf");
    assert_eq!(
        got.headers["content-disposition"],
        "attachment; filename*=UTF-8''report.pdf"
    );
    assert_eq!(got.body, pdf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_past_the_limit_or_malformed_are_refused_and_leave_nothing() {
    let mut stack = Stack::prepared(None).await;
    let dir = std::path::PathBuf::from(&stack.world.config.files.store_url);
    stack.world.config.files.max_upload_bytes = 1024 * 1024;
    let gw = stack.start_gateway("gw").await;
    let token = stack.token(A, "web");

    let (status, ctrl) = upload(
        gw,
        &token,
        "big.bin",
        "application/octet-stream",
        &png(1024 * 1024, 3),
    )
    .await;
    assert_eq!(status, 413, "{ctrl}");
    assert_eq!(ctrl["ctrl"]["code"], json!(413), "{ctrl}");
    assert!(
        ctrl["ctrl"]["text"]
            .as_str()
            .unwrap()
            .contains("larger than"),
        "{ctrl}"
    );
    let (status, ctrl) = upload(gw, &token, "empty.bin", "application/octet-stream", b"").await;
    assert_eq!(status, 400, "{ctrl}");

    // Not a form, and no session: refused before anything is kept.
    let resp = reqwest::Client::new()
        .post(format!("http://{gw}/v0/file/u/"))
        .header("X-Tinode-Auth", format!("Token {token}"))
        .body("plain")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let (content_type, body) = form("x.txt", "text/plain", b"hello");
    let resp = reqwest::Client::new()
        .post(format!("http://{gw}/v0/file/u/"))
        .header("Content-Type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);

    let kept: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_files")
        .fetch_one(&stack.pool())
        .await
        .unwrap();
    assert_eq!(kept, 0, "no record of a refused upload");
    let objects = common::files_below(&dir);
    assert!(
        objects.is_empty(),
        "no object of a refused upload: {objects:?}"
    );

    // Within the limit: kept, as text (what its bytes are).
    let (status, ctrl) = upload(gw, &token, "notes.html", "text/html", b"<b>hi</b>").await;
    assert_eq!(status, 200, "{ctrl}");
    let url = ctrl["ctrl"]["params"]["url"].as_str().unwrap();
    let got = download(gw, &token, url, false, None).await;
    assert_eq!(got.headers["content-type"], "text/plain; charset=utf-8");
    assert!(got.headers["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment"));
    assert_eq!(common::files_below(&dir).len(), 1);
}

/// The first `{pres topic="me" what="upd"}` of `event` about `url` that
/// `ws` gets (within 20 s a frame): its params.
async fn notice(ws: &mut common::Ws, event: &str, url: &str) -> Value {
    loop {
        let f = ws.next_frame().await;
        let pres = &f["pres"];
        if pres["what"] == "upd" && pres["event"] == event && pres["params"]["url"] == url {
            return pres["params"].clone();
        }
    }
}

/// The scan's outcome recorded for the file at `url`, once it is decided.
async fn scanned(stack: &Stack, url: &str) -> String {
    let id = url.trim_start_matches("/v0/file/s/");
    for _ in 0..200 {
        let scan: Option<String> =
            sqlx::query_scalar("SELECT scan FROM im_files WHERE file_id = ?")
                .bind(id)
                .fetch_optional(&stack.pool())
                .await
                .unwrap();
        match scan.as_deref() {
            Some("pending") | None => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await
            }
            Some(s) => return s.to_string(),
        }
    }
    panic!("{url} not scanned within 20 s");
}

/// A, B and C's web session tokens (taken before the stack is borrowed
/// mutably again).
fn web_tokens(stack: &Stack) -> std::collections::HashMap<i64, String> {
    [A, B, C]
        .map(|u| (u, stack.token(u, "web")))
        .into_iter()
        .collect()
}

/// The seq of the message of `GROUP` that refers to the file at `url`.
async fn file_seq(stack: &Stack, url: &str) -> i64 {
    sqlx::query_scalar("SELECT seq FROM im_file_refs WHERE file_id = ? AND topic = ?")
        .bind(url.trim_start_matches("/v0/file/s/"))
        .bind(GROUP)
        .fetch_one(&stack.pool())
        .await
        .unwrap()
}

/// An operator's `file.audit.update` of message `seq` of `GROUP`.
async fn audit(stack: &Stack, gw: SocketAddr, id: &str, seq: i64, status: &str) {
    let resp = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/admin/commands",
            stack.admin_addr_of(gw)
        ))
        .bearer_auth(&stack.config().auth.admin_token)
        .json(
            &json!({"kind": "file.audit.update", "command_id": id, "tenant": stack.tenant(),
                      "topic": GROUP, "seq": seq, "status": status}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flagged_or_blocked_file_is_gone_for_everyone_at_once_and_told_live() {
    let mut stack = Stack::prepared(None).await;
    stack.world.config.files.scanner = "eicar".into();
    for p in [
        "store",
        "conversations",
        "members",
        "notify",
        "commands",
        "references",
    ] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    stack.create_group(GROUP, A, &[B]).await;
    let tokens = web_tokens(&stack);
    let token = |uid: i64| tokens[&uid].clone();
    // B reads the group; C has a one-to-one chat with A.
    let mut b = common::Ws::connect(gw, &token(B)).await;
    let (_, sub) = b.request(json!({"sub": {"topic": GROUP}})).await;
    assert_eq!(sub["ctrl"]["code"], json!(200), "{sub}");
    let mut c = common::Ws::connect(gw, &token(C)).await;

    // A sends a file holding the EICAR test string to the group and to C.
    let mut text = b"minutes of the meeting\n".to_vec();
    text.extend_from_slice(imstream::files::scan::EICAR);
    let (status, ctrl) = upload(gw, &token(A), "minutes.txt", "text/plain", &text).await;
    assert_eq!(status, 200, "{ctrl}");
    let bad = ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string();
    for (to, cmid) in [(GROUP.to_string(), "bad-g"), (format!("usr{C}"), "bad-c")] {
        let (status, body) = send_picture(&stack, gw, A, &to, &bad, cmid).await;
        assert_eq!(status, 202, "{to} {body}");
    }
    // The scan runs (started now, so both messages refer to the file).
    stack.start_pipeline("scan").await;
    assert_eq!(scanned(&stack, &bad).await, "flagged");
    // Everyone who could see it is told live, and nobody gets it.
    let told_b = notice(&mut b, "file.unavailable", &bad).await;
    assert_eq!(told_b["topic"], json!(GROUP), "{told_b}");
    assert_eq!(told_b["by"], json!("scan"), "{told_b}");
    let told_c = notice(&mut c, "file.unavailable", &bad).await;
    assert_eq!(told_c["topic"], json!(format!("usr{A}")), "{told_c}");
    for uid in [A, B, C] {
        let got = download(gw, &token(uid), &bad, false, None).await;
        assert_eq!(got.status, 410, "user {uid}");
        assert!(!got.body.windows(8).any(|w| w == b"minutes "));
    }
    let (status, body) = send_picture(&stack, gw, B, &format!("usr{C}"), &bad, "fwd-bad").await;
    assert_eq!(status, 410, "a flagged file is not forwarded: {body}");

    // A clean picture in the group; an operator blocks its message: gone
    // for everyone, told live; an `ok` audit brings it back.
    let picture = png(300_000, 9);
    let (status, ctrl) = upload(gw, &token(A), "p.png", "image/png", &picture).await;
    assert_eq!(status, 200, "{ctrl}");
    let good = ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string();
    let (status, body) = send_picture(&stack, gw, A, GROUP, &good, "good-g").await;
    assert_eq!(status, 202, "{body}");
    let seq = body["seq"].as_i64().expect("seq");
    assert_eq!(scanned(&stack, &good).await, "clean");
    assert_eq!(
        download(gw, &token(B), &good, false, None).await.status,
        200
    );
    audit(&stack, gw, "audit-block-1", seq, "blocked").await;
    let told = notice(&mut b, "file.unavailable", &good).await;
    assert_eq!(told["by"], json!("audit"), "{told}");
    for uid in [A, B] {
        assert_eq!(
            download(gw, &token(uid), &good, false, None).await.status,
            410
        );
    }
    audit(&stack, gw, "audit-ok-1", seq, "ok").await;
    notice(&mut b, "file.available", &good).await;
    let back = download(gw, &token(B), &good, false, None).await;
    assert_eq!(back.status, 200);
    assert_eq!(back.body, picture);
    // An `ok` audit never brings back what the scan flagged: neither when
    // the scan came first, nor when an operator's block did (the scan's
    // verdict takes over). Commands run in order: a later block, told
    // live, says the `ok`s before it are done.
    stack.stop_pipeline("scan").await;
    let (status, ctrl) = upload(gw, &token(A), "again.txt", "text/plain", &text).await;
    assert_eq!(status, 200, "{ctrl}");
    let blocked_first = ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string();
    let (status, body) = send_picture(&stack, gw, A, GROUP, &blocked_first, "bad-2").await;
    assert_eq!(status, 202, "{body}");
    audit(
        &stack,
        gw,
        "audit-block-2",
        file_seq(&stack, &blocked_first).await,
        "blocked",
    )
    .await;
    let told = notice(&mut b, "file.unavailable", &blocked_first).await;
    assert_eq!(told["by"], json!("audit"), "{told}");
    stack.start_pipeline("scan").await;
    assert_eq!(scanned(&stack, &blocked_first).await, "flagged");
    audit(&stack, gw, "audit-ok-2", file_seq(&stack, &bad).await, "ok").await;
    audit(
        &stack,
        gw,
        "audit-ok-3",
        file_seq(&stack, &blocked_first).await,
        "ok",
    )
    .await;
    audit(&stack, gw, "audit-block-3", seq, "blocked").await;
    notice(&mut b, "file.unavailable", &good).await;
    for flagged in [&bad, &blocked_first] {
        assert_eq!(
            download(gw, &token(B), flagged, false, None).await.status,
            410
        );
    }
}

/// A scanner failing on one file (a file crafted to make it fail): asked
/// twice, then about a clean check sample, which it decides, so the file
/// is held unavailable to everyone (`410`, told live, outcome `failed`),
/// and the uploads after it are still scanned, in order. A scanner that
/// cannot be reached at all fails nothing (its check fails too): its
/// files wait, and are scanned once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_file_the_scanner_fails_on_is_held_and_the_uploads_after_it_are_scanned() {
    let mut stack = Stack::prepared(None).await;
    let script = common::repo_root().join(format!("target/tmp/scan-fails-{}.sh", stack.world.id));
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::write(
        &script,
        "t=$(mktemp); cat > \"$t\"\n\
         if grep -q 'MAKES-THE-SCANNER-FAIL' \"$t\"; then rm -f \"$t\"; echo 'no idea' >&2; exit 3; fi\n\
         if grep -q 'EICAR-STANDARD-ANTIVIRUS-TEST-FILE' \"$t\"; then rm -f \"$t\"; echo 'EICAR'; exit 1; fi\n\
         rm -f \"$t\"; exit 0\n",
    )
    .unwrap();
    // First no scanner at all (the program is missing).
    stack.world.config.files.scanner = "exec:/nonexistent/scanner".into();
    stack.start_pipeline("notify").await;
    stack.start_pipeline("scan").await;
    let gw = stack.start_gateway("gw").await;
    let token = stack.token(A, "web");
    let mut a = common::Ws::connect(gw, &token).await;
    let up = |name: &'static str, bytes: Vec<u8>| {
        let token = token.clone();
        async move {
            let (status, ctrl) = upload(gw, &token, name, "text/plain", &bytes).await;
            assert_eq!(status, 200, "{ctrl}");
            ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string()
        }
    };
    let waiting = up("waits.txt", b"an ordinary note".to_vec()).await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let id = waiting.trim_start_matches("/v0/file/s/");
    let scan: String = sqlx::query_scalar("SELECT scan FROM im_files WHERE file_id = ?")
        .bind(id)
        .fetch_one(&stack.pool())
        .await
        .unwrap();
    assert_eq!(scan, "pending", "an unreachable scanner decides nothing");
    assert_eq!(
        download(gw, &token, &waiting, false, None).await.status,
        200
    );

    // The scanner back; a file it fails on, then a flagged and a clean one.
    stack.stop_pipeline("scan").await;
    stack.world.config.files.scanner = format!("exec:/bin/sh {}", script.display());
    let failing = up("odd.txt", b"this MAKES-THE-SCANNER-FAIL, always".to_vec()).await;
    let mut eicar = b"after it: ".to_vec();
    eicar.extend_from_slice(imstream::files::scan::EICAR);
    let flagged = up("bad.txt", eicar).await;
    let clean = up("fine.txt", b"a clean note".to_vec()).await;
    stack.start_pipeline("scan").await;
    assert_eq!(scanned(&stack, &waiting).await, "clean");
    assert_eq!(scanned(&stack, &failing).await, "failed");
    assert_eq!(scanned(&stack, &flagged).await, "flagged");
    assert_eq!(scanned(&stack, &clean).await, "clean");
    let told = notice(&mut a, "file.unavailable", &failing).await;
    assert_eq!(told["by"], json!("scan"), "{told}");
    for (url, status) in [
        (&failing, 410),
        (&flagged, 410),
        (&clean, 200),
        (&waiting, 200),
    ] {
        assert_eq!(
            download(gw, &token, url, false, None).await.status,
            status,
            "{url}"
        );
    }
}

/// A recalls message `seq` of `GROUP`; then B is refused `url` (as soon
/// as the recall is applied: the read path decides on the message as
/// stored).
async fn recall_then_refused(stack: &Stack, gw: SocketAddr, seq: i64, token_b: &str, url: &str) {
    let path = format!("/v1/groups/{GROUP}/messages/{seq}");
    let (status, body) = call(stack, gw, A, "DELETE", &path, json!({})).await;
    assert!(status < 300, "{status} {body}");
    common::wait_for(
        "B refused the recalled file",
        std::time::Duration::from_secs(10),
        || async move {
            match download(gw, token_b, url, false, None).await.status {
                404 => Ok(()),
                other => Err(other.to_string()),
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_nobody_refers_to_and_uploads_never_finished_are_swept() {
    let mut stack = Stack::prepared(None).await;
    let dir = std::path::PathBuf::from(&stack.world.config.files.store_url);
    stack.world.config.files.unreferenced_ttl_secs = 2;
    stack.world.config.files.upload_timeout_secs = 1;
    stack.world.config.files.deleted_retention_secs = 1;
    for p in ["store", "members", "references"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    stack.create_group(GROUP, A, &[B]).await;
    let token = stack.token(A, "web");
    let mut urls = Vec::new();
    for seed in [1, 2, 3, 4] {
        let (status, ctrl) = upload(gw, &token, "p.png", "image/png", &png(10_000, seed)).await;
        assert_eq!(status, 200, "{ctrl}");
        urls.push(ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string());
    }
    let (kept, dropped, recalled, edited) = (&urls[0], &urls[1], &urls[2], &urls[3]);
    let (status, body) = send_picture(&stack, gw, A, GROUP, kept, "kept").await;
    assert_eq!(status, 202, "{body}");
    // A recalls a message with a picture: B loses it at once, and it goes
    // after the retention (the references projection queues it).
    let (status, body) = send_picture(&stack, gw, A, GROUP, recalled, "recalled").await;
    assert_eq!(status, 202, "{body}");
    let seq = body["seq"].as_i64().unwrap();
    let token_b = stack.token(B, "web");
    assert_eq!(
        download(gw, &token_b, recalled, false, None).await.status,
        200
    );
    recall_then_refused(&stack, gw, seq, &token_b, recalled).await;
    // A message edited to carry a picture, then recalled: the picture goes
    // with it (its reference is the message's, not the edit's).
    let (status, body) = call(
        &stack,
        gw,
        A,
        "POST",
        &format!("/v1/groups/{GROUP}/messages"),
        json!({"content": "see below", "client_msg_id": "plain"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let plain = body["seq"].as_i64().unwrap();
    let content = json!({
        "txt": " ", "fmt": [{"at": 0, "len": 1, "key": 0}],
        "ent": [{"tp": "IM", "data": {"mime": "image/png", "ref": edited, "name": "e.png"}}]
    });
    let (status, body) = call(
        &stack,
        gw,
        A,
        "PATCH",
        &format!("/v1/groups/{GROUP}/messages/{plain}"),
        json!({"content": content, "client_msg_id": "edit"}),
    )
    .await;
    assert!(status < 300, "{status} {body}");
    assert_eq!(
        download(gw, &token_b, edited, false, None).await.status,
        200
    );
    recall_then_refused(&stack, gw, plain, &token_b, edited).await;
    let ids: Vec<String> = [recalled, edited]
        .map(|u| u.trim_start_matches("/v0/file/s/").to_string())
        .to_vec();
    common::wait_for(
        "the recalled pictures queued to go",
        std::time::Duration::from_secs(20),
        || {
            let (pool, ids) = (stack.pool(), ids.clone());
            async move {
                let queued: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM im_files WHERE file_id IN (?, ?) AND delete_after IS NOT NULL",
                )
                .bind(&ids[0])
                .bind(&ids[1])
                .fetch_one(&pool)
                .await
                .unwrap();
                if queued == 2 {
                    Ok(())
                } else {
                    Err(format!("{queued} of 2 queued"))
                }
            }
        },
    )
    .await;
    // What a gateway killed half way through an upload leaves: a record
    // still `uploading`, an hour old.
    sqlx::query(
        "INSERT INTO im_files (file_id, uploader_uid, object_key, state, created_at) \
         VALUES ('killedmidupload2345abcdefg', ?, 'x', 'uploading', NOW(3) - INTERVAL 1 HOUR)",
    )
    .bind(A)
    .execute(&stack.pool())
    .await
    .unwrap();
    assert_eq!(common::files_below(&dir).len(), 4);
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    stack.shard_pass(None).await;

    let left: Vec<(String, String)> =
        sqlx::query_as("SELECT CAST(file_id AS CHAR), state FROM im_files ORDER BY file_id")
            .fetch_all(&stack.pool())
            .await
            .unwrap();
    assert_eq!(
        left,
        vec![(
            kept.trim_start_matches("/v0/file/s/").to_string(),
            "stored".to_string()
        )],
        "only the file a message refers to is kept"
    );
    assert_eq!(
        common::files_below(&dir).len(),
        1,
        "the unreferenced upload's object is gone"
    );
    assert_eq!(download(gw, &token, dropped, false, None).await.status, 404);
    assert_eq!(
        download(gw, &stack.token(B, "web"), kept, false, None)
            .await
            .status,
        200
    );
}

/// `PUT /v1/me/profile` of `uid` with `photo`.
async fn set_photo(stack: &Stack, gw: SocketAddr, uid: i64, photo: &str) -> (u16, Value) {
    call(
        stack,
        gw,
        uid,
        "PUT",
        "/v1/me/profile",
        json!({ "photo": photo }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uploaded_picture_is_served_to_every_user_of_the_tenant() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "relations", "references"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    stack.create_group(GROUP, A, &[B]).await;
    let tokens = web_tokens(&stack);
    let token = |uid: i64| tokens[&uid].clone();
    let mut urls = Vec::new();
    for seed in [1, 2, 3] {
        let (status, ctrl) =
            upload(gw, &token(A), "me.png", "image/png", &png(200_000, seed)).await;
        assert_eq!(status, 200, "{ctrl}");
        urls.push(ctrl["ctrl"]["params"]["url"].as_str().unwrap().to_string());
    }
    assert_eq!(
        download(gw, &token(C), &urls[0], true, None).await.status,
        404
    );

    // Nobody makes someone else's upload their picture (it would show the
    // file to the whole tenant): the same answer as for no file at all.
    let (status, body) = set_photo(&stack, gw, B, &urls[0]).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = set_photo(&stack, gw, B, "/v0/file/s/abcdefghijklmnopqrstuvwxyz").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        download(gw, &token(C), &urls[0], true, None).await.status,
        404
    );

    // A's own picture, over HTTP: everyone loads it, as an <img> does.
    let (status, body) = set_photo(&stack, gw, A, &urls[0]).await;
    assert_eq!(status, 202, "{body}");
    for uid in [B, C] {
        let got = download(gw, &token(uid), &urls[0], true, None).await;
        assert_eq!(got.status, 200, "user {uid}");
        assert_eq!(got.body, png(200_000, 1));
    }
    // Over the web app's `{set desc public photo}` (`data` the delete
    // marker, `ref` the upload).
    let mut ws = common::Ws::connect(gw, &token(A)).await;
    ws.request(json!({"sub": {"topic": "me"}})).await;
    let (_, set) = ws
        .request(json!({"set": {"topic": "me", "desc": {"public": {"fn": "A",
            "photo": {"data": "\u{2421}", "ref": urls[1]}}}}}))
        .await;
    assert_eq!(set["ctrl"]["code"], json!(200), "{set}");
    assert_eq!(
        download(gw, &token(C), &urls[1], true, None).await.status,
        200
    );
    // The picture it replaced is no longer anyone's to load (its uploader
    // keeps it until it is swept, after the retention).
    until_status(gw, &token(C), &urls[0], 404).await;
    assert_eq!(
        download(gw, &token(A), &urls[0], true, None).await.status,
        200
    );
    assert!(queued_to_go(&stack, &urls[0]).await);
    // A group's picture, by its owner: shown to whoever sees the group.
    let (status, body) = call(
        &stack,
        gw,
        A,
        "PUT",
        &format!("/v1/groups/{GROUP}/profile"),
        json!({"photo": urls[2]}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        download(gw, &token(C), &urls[2], true, None).await.status,
        200
    );
    // The group's picture becomes A's own picture: the one it replaced
    // goes; the one now shown by both stays while either shows it.
    let (status, body) = call(
        &stack,
        gw,
        A,
        "PUT",
        &format!("/v1/groups/{GROUP}/profile"),
        json!({"photo": urls[1]}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    until_status(gw, &token(C), &urls[2], 404).await;
    assert!(queued_to_go(&stack, &urls[2]).await);
    assert!(!queued_to_go(&stack, &urls[1]).await);
    assert_eq!(
        download(gw, &token(C), &urls[1], true, None).await.status,
        200
    );
}

/// Waits (10 s at most) until `uid`'s download of `url` answers `status`.
async fn until_status(gw: SocketAddr, token: &str, url: &str, status: u16) {
    for _ in 0..100 {
        if download(gw, token, url, true, None).await.status == status {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{url} never answered {status}");
}

/// Whether the file at `url` is queued for removal (`delete_after`).
async fn queued_to_go(stack: &Stack, url: &str) -> bool {
    sqlx::query_scalar::<_, Option<chrono::NaiveDateTime>>(
        "SELECT delete_after FROM im_files WHERE file_id = ?",
    )
    .bind(url.trim_start_matches("/v0/file/s/"))
    .fetch_one(&stack.pool())
    .await
    .unwrap()
    .is_some()
}
