//! References that keep finding old messages (issue 17 part 3; seed 000 §12
//! item 8) against the real services: reports (the moderation queue read
//! and closed by an operator), favorites and a conversation's files keep
//! only `(topic, seq)` and resolve the message when read — across a month
//! switch, after the old month is archived and dropped, and showing a
//! recalled message as such. Bad input gets clear errors; non-members get
//! nothing; members' sessions never see a report; replaying the references
//! pipeline rebuilds the same queue and file index.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use imstream::replay::{replay, ReplayArgs};
use serde_json::{json, Value};

use common::{call, wait_for, Stack, Ws};

/// Within August's sealing period: the first pass seals nothing.
const SEPTEMBER: &str = "2026-09-05T12:00:00Z";
/// Past September's sealing period: the pass seals it.
const MID_OCTOBER: &str = "2026-10-09T00:00:00Z";

const TOPIC: &str = "grpRefsTeam";
const A: i64 = 2101;
const B: i64 = 2102;
const C: i64 = 2103;
/// Not a member.
const D: i64 = 2104;

async fn get(stack: &Stack, addr: SocketAddr, uid: i64, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .bearer_auth(stack.token(uid, "http"))
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// An admin call (`GET` without a body, else `POST` with `body`).
async fn admin(stack: &Stack, addr: SocketAddr, path: &str, body: Option<Value>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let url = format!("http://{}{path}", stack.admin_addr_of(addr));
    let req = match body {
        None => client.get(url),
        Some(b) => client.post(url).json(&b),
    };
    let resp = req
        .bearer_auth(&stack.config().auth.admin_token)
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn drafty_file(tp: &str, name: &str, mime: &str) -> Value {
    json!({
        "txt": " ",
        "fmt": [{"at": -1, "len": 0, "key": 0}],
        "ent": [{"tp": tp, "data": {"mime": mime, "name": name, "ref": format!("https://files.example/{name}"), "size": 1234}}],
    })
}

async fn send(stack: &Stack, addr: SocketAddr, uid: i64, id: &str, content: Value) -> i64 {
    let (status, body) = call(
        stack,
        addr,
        uid,
        "POST",
        &format!("/v1/groups/{TOPIC}/messages"),
        json!({"content": content, "client_msg_id": id}),
    )
    .await;
    assert_eq!(status, 202, "send {id}: {body}");
    body["seq"].as_i64().expect("seq")
}

async fn rows_in(stack: &Stack, month: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ?"
    ))
    .bind(TOPIC)
    .fetch_one(&stack.pool())
    .await
    .unwrap_or(0)
}

async fn wait_rows(stack: &Stack, month: &str, n: i64) {
    wait_for(
        &format!("{n} rows in {month}"),
        Duration::from_secs(60),
        || async {
            match rows_in(stack, month).await {
                got if got == n => Ok(()),
                got => Err(format!("{got} rows")),
            }
        },
    )
    .await;
}

/// `(seq, state)` of each entry of a list.
fn states(list: &Value) -> Vec<(i64, String)> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    let seq = e["seq"].as_i64().unwrap_or(-1);
                    (seq, e["state"].as_str().unwrap_or("?").to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `user`'s favorites once they are `(seq, state)` in this order.
async fn favorites_become(
    stack: &Stack,
    addr: SocketAddr,
    user: i64,
    want: &[(i64, &str)],
) -> Value {
    let want: Vec<(i64, String)> = want.iter().map(|(s, st)| (*s, st.to_string())).collect();
    wait_for(
        &format!("favorites of {user}: {want:?}"),
        Duration::from_secs(30),
        || async {
            let (status, body) = get(stack, addr, user, "/v1/me/favorites").await;
            if status == 200 && states(&body["favorites"]) == want {
                Ok(body)
            } else {
                Err(format!("{status} {body}"))
            }
        },
    )
    .await
}

/// The tenant's reports in `status`, once there are `n`.
async fn reports_become(stack: &Stack, addr: SocketAddr, status: &str, n: usize) -> Value {
    let path = format!(
        "/v1/admin/reports?tenant={}&status={status}",
        stack.tenant()
    );
    wait_for(
        &format!("{n} {status} reports"),
        Duration::from_secs(30),
        || async {
            let (code, body) = admin(stack, addr, &path, None).await;
            match body["reports"].as_array() {
                Some(r) if code == 200 && r.len() == n => Ok(body),
                _ => Err(format!("{code} {body}")),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_favorites_and_files_find_their_messages_across_months_and_archive() {
    let mut stack = Stack::prepared(Some(SEPTEMBER)).await;
    // Where `shards archive` writes and the gateways read archived months.
    let root: PathBuf = common::repo_root()
        .join("target/tmp")
        .join(format!("refs-archive-{}", stack.world.id));
    let root = root.display().to_string();
    stack.world.config.shards.archive_dir = root.clone();
    for p in ["store", "members", "relations", "references", "fanout"] {
        stack.start_pipeline(p).await;
    }
    let sep = stack.start_gateway("node-sep").await;
    stack.create_group(TOPIC, A, &[B, C]).await;

    // September: text, a file, the message that will be reported, an image.
    let s1 = send(&stack, sep, A, "s1", json!("the September plan")).await;
    let s2 = send(
        &stack,
        sep,
        A,
        "s2",
        drafty_file("EX", "plan.pdf", "application/pdf"),
    )
    .await;
    let s3 = send(&stack, sep, A, "s3", json!("buy cheap watches here")).await;
    let s4 = send(
        &stack,
        sep,
        B,
        "s4",
        drafty_file("IM", "team.png", "image/png"),
    )
    .await;
    assert_eq!(vec![s1, s2, s3, s4], vec![1, 2, 3, 4]);
    wait_rows(&stack, "202609", 4).await;

    // October: the pass seals September once the store caught up; a
    // gateway started now writes to 202610.
    wait_for("September sealed", Duration::from_secs(60), || async {
        stack.shard_pass(Some(MID_OCTOBER)).await;
        let status: String = sqlx::query_scalar(
            "SELECT status FROM im_group_message_shards WHERE shard_month = '202609'",
        )
        .fetch_one(&stack.pool())
        .await
        .unwrap();
        if status == "sealed" {
            Ok(())
        } else {
            Err(status)
        }
    })
    .await;
    let gw = stack.start_gateway("node-oct").await;
    let o5 = send(&stack, gw, A, "o5", json!("October kickoff")).await;
    let o6 = send(
        &stack,
        gw,
        A,
        "o6",
        drafty_file("EX", "budget.xlsx", "application/vnd.ms-excel"),
    )
    .await;
    assert_eq!((o5, o6), (5, 6));
    wait_rows(&stack, "202610", 2).await;

    // ---- reports
    // A, whose message is reported, watches the group live.
    let mut watcher = Ws::connect(gw, &stack.token(A, "web")).await;
    let (_, sub) = watcher.request(json!({"sub": {"topic": TOPIC}})).await;
    assert_eq!(sub["ctrl"]["code"], json!(200), "{sub}");
    let report_path = |seq: i64| format!("/v1/groups/{TOPIC}/messages/{seq}/report");
    let (status, body) = call(
        &stack,
        gw,
        B,
        "POST",
        &report_path(s3),
        json!({"reason": "spam"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let spam_report = body["report_id"].as_str().expect("report id").to_string();
    assert_eq!(body["status"], "open");
    for (uid, seq, reason, code, what) in [
        (B, s4, json!({"reason": "mine"}), 400, "own message"),
        (D, s3, json!({"reason": "spam"}), 403, "not a member"),
        (C, s3, json!({"reason": "  "}), 400, "empty reason"),
        (
            C,
            s3,
            json!({"reason": "x".repeat(501)}),
            400,
            "reason too long",
        ),
        (C, s3, json!({"why": "spam"}), 400, "unknown field"),
        (C, 999, json!({"reason": "spam"}), 404, "no such message"),
    ] {
        let (status, body) = call(&stack, gw, uid, "POST", &report_path(seq), reason).await;
        assert_eq!(status, code, "{what}: {body}");
    }
    let (status, body) = call(
        &stack,
        gw,
        C,
        "POST",
        &report_path(o5),
        json!({"reason": "off topic"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    // Reports go to the moderators only: the members' sessions get the
    // next message and nothing before it (the fan-out keeps log order).
    let o7 = send(&stack, gw, B, "o7", json!("after the reports")).await;
    loop {
        let frame = watcher.next_frame().await;
        if frame["data"]["seq"] == json!(o7) {
            break;
        }
        let text = frame.to_string();
        assert!(
            !text.contains("spam") && !text.contains("report") && !text.contains("off topic"),
            "a member's session got a report: {text}"
        );
    }
    let queue = reports_become(&stack, gw, "open", 2).await;
    let first = &queue["reports"][0];
    assert_eq!(first["report_id"], json!(spam_report));
    assert_eq!(first["seq"], json!(s3));
    assert_eq!(first["reporter"], json!(format!("usr{B}")));
    assert_eq!(first["reason"], "spam");
    assert_eq!(first["message"]["state"], "ok");
    assert_eq!(
        first["message"]["message"]["content"],
        json!("buy cheap watches here")
    );
    assert_eq!(queue["reports"][1]["seq"], json!(o5));
    // Reporting again changes nothing: the same report, still one.
    let (status, body) = call(
        &stack,
        gw,
        B,
        "POST",
        &report_path(s3),
        json!({"reason": "spam!"}),
    )
    .await;
    assert_eq!(
        (status, body["report_id"].as_str()),
        (200, Some(spam_report.as_str())),
        "{body}"
    );
    // Paging through the queue, one at a time.
    let (_, page) = admin(
        &stack,
        gw,
        &format!("/v1/admin/reports?tenant={}&limit=1", stack.tenant()),
        None,
    )
    .await;
    assert_eq!(page["reports"][0]["seq"], json!(s3), "{page}");
    let next = page["next"].as_str().expect("a next page").to_string();
    let (_, page) = admin(
        &stack,
        gw,
        &format!(
            "/v1/admin/reports?tenant={}&limit=1&cursor={next}",
            stack.tenant()
        ),
        None,
    )
    .await;
    assert_eq!(page["reports"][0]["seq"], json!(o5), "{page}");
    // Only operators read the queue.
    let (status, _) = get(
        &stack,
        stack.admin_addr_of(gw),
        B,
        &format!("/v1/admin/reports?tenant={}", stack.tenant()),
    )
    .await;
    assert_eq!(status, 401);
    // Closing a report: it leaves the open queue, once.
    let resolve = format!(
        "/v1/admin/reports/{spam_report}/resolve?tenant={}",
        stack.tenant()
    );
    let (status, body) = admin(&stack, gw, &resolve, Some(json!({"resolution": "maybe"}))).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = admin(
        &stack,
        gw,
        &format!("/v1/admin/reports/nope/resolve?tenant={}", stack.tenant()),
        Some(json!({"resolution": "dismissed"})),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = admin(
        &stack,
        gw,
        &resolve,
        Some(json!({"resolution": "actioned", "note": "sender warned"})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let closed = reports_become(&stack, gw, "actioned", 1).await;
    assert_eq!(closed["reports"][0]["resolved_by"], "admin");
    assert_eq!(closed["reports"][0]["note"], "sender warned");
    reports_become(&stack, gw, "open", 1).await;
    let (status, body) = admin(
        &stack,
        gw,
        &resolve,
        Some(json!({"resolution": "dismissed"})),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    // The admin statistics count the reports by the day they were made.
    let (status, stats) = admin(
        &stack,
        gw,
        &format!("/v1/admin/stats?tenant={}&topic={TOPIC}", stack.tenant()),
        None,
    )
    .await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["total"]["reports"], json!(2), "{stats}");

    // ---- favorites
    let fav = |seq: i64| format!("/v1/me/favorites/{TOPIC}/{seq}");
    let mut saved: Vec<(i64, &str)> = Vec::new();
    for seq in [s1, s2, o6] {
        let (status, body) = call(&stack, gw, B, "PUT", &fav(seq), json!({})).await;
        assert_eq!(status, 202, "{body}");
        // Saved one after the other: the list's order is the saving order.
        saved.insert(0, (seq, "ok"));
        favorites_become(&stack, gw, B, &saved).await;
    }
    // Saving again changes nothing.
    let (status, _) = call(&stack, gw, B, "PUT", &fav(s2), json!({})).await;
    assert_eq!(status, 202);
    let (status, _) = call(&stack, gw, B, "PUT", &fav(999), json!({})).await;
    assert_eq!(status, 404, "an unknown message is not saved");
    let (status, _) = call(&stack, gw, D, "PUT", &fav(s1), json!({})).await;
    assert_eq!(status, 403, "a non-member saves nothing");
    let list = favorites_become(&stack, gw, B, &[(o6, "ok"), (s2, "ok"), (s1, "ok")]).await;
    assert_eq!(
        list["favorites"][2]["message"]["content"],
        json!("the September plan")
    );
    assert_eq!(
        list["favorites"][0]["message"]["content"]["ent"][0]["data"]["name"],
        "budget.xlsx"
    );
    let (_, page) = get(&stack, gw, B, "/v1/me/favorites?limit=2").await;
    assert_eq!(
        states(&page["favorites"]),
        vec![(o6, "ok".into()), (s2, "ok".into())]
    );
    let next = page["next"].as_str().expect("a next page");
    let (_, page) = get(
        &stack,
        gw,
        B,
        &format!("/v1/me/favorites?limit=2&cursor={next}"),
    )
    .await;
    assert_eq!(
        states(&page["favorites"]),
        vec![(s1, "ok".into())],
        "{page}"
    );
    let (status, _) = get(&stack, gw, B, "/v1/me/favorites?cursor=garbage").await;
    assert_eq!(status, 400);

    // A one-to-one message is saved under the name clients use, usr<peer>.
    let (status, body) = call(
        &stack,
        gw,
        B,
        "POST",
        &format!("/v1/users/{A}/messages"),
        json!({"content": "just us"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let p2p_seq = body["seq"].as_i64().expect("seq");
    let (status, body) = call(
        &stack,
        gw,
        A,
        "PUT",
        &format!("/v1/me/favorites/usr{B}/{p2p_seq}"),
        json!({}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let list = favorites_become(&stack, gw, A, &[(p2p_seq, "ok")]).await;
    assert_eq!(list["favorites"][0]["topic"], json!(format!("usr{B}")));
    assert_eq!(list["favorites"][0]["message"]["content"], json!("just us"));
    let (status, _) = call(
        &stack,
        gw,
        D,
        "PUT",
        &format!("/v1/me/favorites/usr{B}/{p2p_seq}"),
        json!({}),
    )
    .await;
    assert!(
        matches!(status, 403 | 404),
        "D's conversation with B holds no such message: {status}"
    );

    // ---- files
    let files = |query: &str| format!("/v1/groups/{TOPIC}/files{query}");
    let (status, body) = get(&stack, gw, C, &files("")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        states(&body["files"]),
        vec![(o6, "ok".into()), (s4, "ok".into()), (s2, "ok".into())]
    );
    let names: Vec<&str> = body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["file"]["data"]["name"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(names, vec!["budget.xlsx", "team.png", "plan.pdf"]);
    assert_eq!(body["files"][1]["kind"], "image");
    assert_eq!(body["files"][1]["from"], json!(format!("usr{B}")));
    let (_, page) = get(&stack, gw, C, &files("?limit=2")).await;
    assert_eq!(page["next_before"], json!(s4));
    let (_, page) = get(&stack, gw, C, &files(&format!("?limit=2&before={s4}"))).await;
    assert_eq!(states(&page["files"]), vec![(s2, "ok".into())]);
    let (status, _) = get(&stack, gw, D, &files("")).await;
    assert_eq!(status, 403, "a non-member lists no files");
    let (status, _) = get(&stack, gw, C, &files("?limit=500")).await;
    assert_eq!(status, 400);

    // ---- a recalled file shows as recalled, in favorites and files alike
    let (status, body) = call(
        &stack,
        gw,
        A,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/messages/{o6}"),
        json!({}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let list = favorites_become(&stack, gw, B, &[(o6, "recalled"), (s2, "ok"), (s1, "ok")]).await;
    assert_eq!(list["favorites"][0]["message"]["content"], Value::Null);
    let (_, body) = get(&stack, gw, C, &files("")).await;
    assert_eq!(states(&body["files"])[0], (o6, "recalled".into()));
    assert_eq!(
        body["files"][0]["file"],
        Value::Null,
        "no file of a recalled message"
    );

    // ---- a member who left keeps the reference but reads nothing
    let (status, _) = call(&stack, gw, C, "PUT", &fav(s1), json!({})).await;
    assert_eq!(status, 202);
    favorites_become(&stack, gw, C, &[(s1, "ok")]).await;
    let (status, body) = call(
        &stack,
        gw,
        C,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/{C}"),
        json!({}),
    )
    .await;
    assert!(status == 200 || status == 202, "leave: {status} {body}");
    let list = favorites_become(&stack, gw, C, &[(s1, "no_access")]).await;
    assert_eq!(list["favorites"][0]["message"], Value::Null);
    // Removing one's own favorite needs no membership.
    let (status, _) = call(&stack, gw, C, "DELETE", &fav(s1), json!({})).await;
    assert_eq!(status, 202);
    favorites_become(&stack, gw, C, &[]).await;

    // ---- replay rebuilds the same queue and file index
    stack.stop_pipeline("references").await;
    let args = ReplayArgs {
        pipeline: "references".into(),
        from: "earliest".into(),
        tenant: None,
        into: None,
        wait_inactive_secs: 30,
    };
    let report = replay(stack.config(), &args, stack.world.shutdown.child())
        .await
        .expect("replay");
    let mine: Vec<_> = report
        .verifications
        .iter()
        .filter(|v| v.tenant == stack.tenant())
        .flat_map(|v| &v.topics)
        .collect();
    assert!(
        mine.iter().any(|t| t.topic == TOPIC)
            && mine
                .iter()
                .all(|t| t.verdict == imstream::digest::Verdict::Identical),
        "replay verified identical: {report:?}"
    );
    stack.start_pipeline("references").await;

    // ---- September archived and dropped: every reference still resolves
    let before_favorites = get(&stack, gw, B, "/v1/me/favorites").await.1;
    let before_files = get(&stack, gw, A, &files("")).await.1;
    let before_reports = reports_become(&stack, gw, "actioned", 1).await;
    let tenant = stack.tenant().to_string();
    let (ok, out) = stack.imstream(&["shards", "archive", &tenant, "202609", "--to", &root]);
    assert!(ok, "archive: {out}");
    let (ok, out) = stack.imstream(&[
        "shards",
        "drop",
        &tenant,
        "202609",
        "--from",
        &root,
        "--confirm",
    ]);
    assert!(ok, "drop: {out}");
    assert_eq!(
        get(&stack, gw, B, "/v1/me/favorites").await.1,
        before_favorites
    );
    assert_eq!(get(&stack, gw, A, &files("")).await.1, before_files);
    assert_eq!(
        reports_become(&stack, gw, "actioned", 1).await,
        before_reports
    );
}

/// A message is acknowledged before the store pipeline has it: a client
/// can see it delivered and save it at once. Its favorite waits for the
/// store a little and then says "retry" (503), never "not found"; a seq
/// nobody was given is not found at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_favorite_of_an_acknowledged_message_not_yet_stored_is_retryable_not_missing() {
    let mut stack = Stack::prepared(None).await;
    for p in ["members", "relations", "references"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("node-unstored").await;
    stack.create_group(TOPIC, A, &[B]).await;
    // No store pipeline yet: the message is acknowledged, not stored.
    let seq = send(&stack, gw, A, "early", json!("save me")).await;
    let path = format!("/v1/me/favorites/{TOPIC}/{seq}");
    let asked = std::time::Instant::now();
    let (status, body) = call(&stack, gw, B, "PUT", &path, json!({})).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("not stored yet"),
        "{body}"
    );
    assert!(
        body["params"]["retry_after_ms"].as_u64().is_some(),
        "{body}"
    );
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "waited for the store first"
    );
    let (status, body) = call(
        &stack,
        gw,
        B,
        "PUT",
        &format!("/v1/me/favorites/{TOPIC}/{}", seq + 50),
        json!({}),
    )
    .await;
    assert_eq!(status, 404, "never allocated: {body}");

    // The store catches up: the same request, retried, is taken.
    stack.start_pipeline("store").await;
    wait_for("the favorite taken", Duration::from_secs(60), || async {
        match call(&stack, gw, B, "PUT", &path, json!({})).await {
            (202, _) => Ok(()),
            (503, body) => Err(format!("still retryable: {body}")),
            (status, body) => panic!("{status}: {body}"),
        }
    })
    .await;
    favorites_become(&stack, gw, B, &[(seq, "ok")]).await;
}
