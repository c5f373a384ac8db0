//! A user's system notifications with their read state (issue 32, seed 002
//! §5 and §10 item 6), against the real services with one user on two
//! devices on two gateways:
//!
//! - a friend request arrives live on both devices and is listed unread
//!   through both gateways; marking it read on one device clears it on the
//!   other live (`notification.read`) and in the listing;
//! - a group invitation (the write model's `MemberInvited`), being added to
//!   a group, and the outcome
//!   of one's report (resolved by an operator) arrive and are listed, the
//!   moderators' note left out;
//! - another user neither lists nor marks them (naming their ids marks
//!   nothing); bad input gets a clear 400.

mod common;
mod realtime_support;

use std::net::SocketAddr;

use serde_json::{json, Value};

use common::{call, wait_for, Stack};
use realtime_support::{usr, Client, DELIVERY};

const A: i64 = 81;
const B: i64 = 82;
const C: i64 = 83;

/// `GET /v1/me/notifications{query}` with `token` through `addr`.
async fn list(addr: SocketAddr, token: &str, query: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("http://{addr}/v1/me/notifications{query}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// `POST /v1/me/notifications/read` with `token` and a raw body.
async fn mark(addr: SocketAddr, token: &str, body: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{addr}/v1/me/notifications/read"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The listed notification `id` of `token`'s user, once its read state is
/// `read`.
async fn listed_as(addr: SocketAddr, token: &str, id: &str, read: bool) -> Value {
    wait_for(&format!("{id} listed read={read}"), DELIVERY, || async {
        let (status, body) = list(addr, token, "").await;
        if status != 200 {
            return Err(format!("{status} {body}"));
        }
        body["notifications"]
            .as_array()
            .and_then(|ns| ns.iter().find(|n| n["id"] == json!(id)).cloned())
            .filter(|n| n["read"] == json!(read))
            .map(|n| json!({"n": n, "unread": body["unread"]}))
            .ok_or_else(|| format!("{body}"))
    })
    .await
}

/// Posts to the operator port of `addr`.
async fn admin(stack: &Stack, addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("http://{}{path}", stack.admin_addr_of(addr)))
        .bearer_auth(&stack.config().auth.admin_token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn notifications_are_read_once_for_every_device_and_only_by_their_owner() {
    let stack = Stack::realtime(2).await;
    let (gw0, gw1) = (stack.gateway_addr(0), stack.gateway_addr(1));
    let (a_phone_token, a_web_token) = (stack.token(A, "phone"), stack.token(A, "web"));
    let a_phone = Client::open(gw0, &a_phone_token, "a-phone").await;
    let a_web = Client::open(gw1, &a_web_token, "a-web").await;
    let b_token = stack.token(B, "phone");

    // ---- a friend request: live on both devices, listed unread on both.
    let (status, body) = call(
        &stack,
        gw0,
        B,
        "POST",
        "/v1/friends/requests",
        json!({"uid": A, "message": "hi"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let mut id = String::new();
    for a in [&a_phone, &a_web] {
        let f = a
            .expect("friend request", DELIVERY, |f| {
                f["pres"]["event"] == json!("friend.request")
            })
            .await;
        id = f["pres"]["params"]["id"]
            .as_str()
            .expect("its id")
            .to_string();
    }
    for (addr, token) in [(gw0, &a_phone_token), (gw1, &a_web_token)] {
        let got = listed_as(addr, token, &id, false).await;
        assert_eq!(got["n"]["kind"], json!("friend.request"), "{got}");
        assert_eq!(got["n"]["from"], json!(usr(B)), "{got}");
        assert_eq!(got["n"]["text"], json!("hi"), "{got}");
        assert_eq!(got["unread"], json!(1), "{got}");
    }

    // ---- another user: lists only their own, marks nothing of A's.
    let (status, body) = admin(
        &stack,
        gw0,
        "/v1/admin/notifications",
        json!({"tenant": stack.tenant(), "uid": B, "title": "For B", "text": "b"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let b_note = wait_for("B's own notification", DELIVERY, || async {
        let (_, body) = list(gw1, &b_token, "").await;
        let ns = body["notifications"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        match ns.first() {
            Some(n) => Ok((ns.clone(), n["id"].as_str().unwrap().to_string())),
            None => Err(format!("{body}")),
        }
    })
    .await;
    assert_eq!(b_note.0.len(), 1, "B lists only their own: {:?}", b_note.0);
    assert!(!format!("{:?}", b_note.0).contains(&id), "B sees A's");
    let (status, body) = mark(
        gw1,
        &b_token,
        &json!({"ids": [id.clone(), b_note.1.clone()]}).to_string(),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    // Once B's read is applied (B's own one is read), A's is still unread.
    listed_as(gw1, &b_token, &b_note.1, true).await;
    let got = listed_as(gw0, &a_phone_token, &id, false).await;
    assert_eq!(got["unread"], json!(1), "{got}");
    assert!(
        a_web
            .frames()
            .iter()
            .all(|f| f["pres"]["event"] != json!("notification.read")),
        "B's read reached A's device"
    );

    // ---- bad input: a clear 400 (or 401 without a token).
    for body in [
        "{}",
        r#"{"ids": []}"#,
        r#"{"ids": ["x"], "all": true}"#,
        r#"{"ids": "x"}"#,
        r#"{"ids": [""]}"#,
        r#"{"nope": 1}"#,
        "not json",
    ] {
        let (status, reply) = mark(gw0, &a_phone_token, body).await;
        assert_eq!(status, 400, "{body}: {reply}");
    }
    let (status, _) = mark(
        gw0,
        &a_phone_token,
        &json!({"ids": ["x".repeat(65)]}).to_string(),
    )
    .await;
    assert_eq!(status, 400);
    let many: Vec<String> = (0..101).map(|i| i.to_string()).collect();
    let (status, _) = mark(gw0, &a_phone_token, &json!({ "ids": many }).to_string()).await;
    assert_eq!(status, 400);
    for query in [
        "?limit=0",
        "?limit=101",
        "?limit=x",
        "?before=-1",
        "?who=82",
    ] {
        let (status, reply) = list(gw0, &a_phone_token, query).await;
        assert_eq!(status, 400, "{query}: {reply}");
    }
    assert_eq!(mark(gw0, "", r#"{"all": true}"#).await.0, 401);
    assert_eq!(list(gw0, "bogus", "").await.0, 401);

    // ---- read on the phone: the web device clears it live, and the list.
    let (status, body) = mark(
        gw0,
        &a_phone_token,
        &json!({"ids": [id.clone()]}).to_string(),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let f = a_web
        .expect("notification.read", DELIVERY, |f| {
            f["pres"]["event"] == json!("notification.read")
        })
        .await;
    assert_eq!(f["pres"]["params"]["ids"], json!([id.clone()]), "{f}");
    for (addr, token) in [(gw1, &a_web_token), (gw0, &a_phone_token)] {
        let got = listed_as(addr, token, &id, true).await;
        assert_eq!(got["unread"], json!(0), "{got}");
    }

    // ---- a group invitation: A lets nobody add them directly.
    let (status, body) = call(
        &stack,
        gw0,
        A,
        "PUT",
        "/v1/me/settings",
        json!({"add_policy": "nobody"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    const INVITE: &str = "grpNoteInvite";
    let (status, body) = call(
        &stack,
        gw1,
        C,
        "POST",
        "/v1/groups",
        json!({"topic": INVITE, "name": "invite", "members": [A, B]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["invited"], json!([A]), "{body}");
    for a in [&a_phone, &a_web] {
        let f = a
            .expect("invitation", DELIVERY, |f| {
                f["pres"]["event"] == json!("notification")
                    && f["pres"]["params"]["kind"] == json!("group.invited")
            })
            .await;
        assert_eq!(f["pres"]["params"]["topic"], json!(INVITE), "{f}");
        assert_eq!(f["pres"]["params"]["from"], json!(usr(C)), "{f}");
        assert_eq!(f["pres"]["params"]["read"], json!(false), "{f}");
    }

    // ---- a report's outcome reaches its reporter (A), not its note.
    let (status, body) = call(
        &stack,
        gw0,
        A,
        "PUT",
        "/v1/me/settings",
        json!({"add_policy": "anyone"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    const TOPIC: &str = "grpNoteReport";
    stack.create_group(TOPIC, C, &[A, B]).await;
    let (status, body) = wait_for("B's message", DELIVERY, || async {
        match call(
            &stack,
            gw1,
            B,
            "POST",
            &format!("/v1/groups/{TOPIC}/messages"),
            json!({"content": {"txt": "buy now"}}),
        )
        .await
        {
            (202, body) => Ok((202, body)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(status, 202);
    let seq = body["seq"].as_i64().expect("seq");
    let (status, body) = call(
        &stack,
        gw0,
        A,
        "POST",
        &format!("/v1/groups/{TOPIC}/messages/{seq}/report"),
        json!({"reason": "spam"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let report_id = body["report_id"].as_str().expect("report id").to_string();
    let resolve = format!(
        "/v1/admin/reports/{report_id}/resolve?tenant={}",
        stack.tenant()
    );
    wait_for("the report resolved", DELIVERY, || async {
        match admin(
            &stack,
            gw1,
            &resolve,
            json!({"resolution": "actioned", "note": "internal: ring #4"}),
        )
        .await
        {
            (202, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    for a in [&a_phone, &a_web] {
        let f = a
            .expect("report outcome", DELIVERY, |f| {
                f["pres"]["event"] == json!("notification")
                    && f["pres"]["params"]["kind"] == json!("report.resolved")
            })
            .await;
        let params = &f["pres"]["params"]["params"];
        assert_eq!(params["report_id"], json!(report_id), "{f}");
        assert_eq!(params["resolution"], json!("actioned"), "{f}");
        assert!(!f.to_string().contains("ring #4"), "the note leaked: {f}");
    }
    let (_, listed) = list(gw1, &a_web_token, "?unread=true").await;
    let kinds: Vec<&str> = listed["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["kind"].as_str().unwrap())
        .collect();
    // (`create_group` added A directly: `group.added`.)
    assert_eq!(
        kinds,
        ["report.resolved", "group.added", "group.invited"],
        "{listed}"
    );
    assert_eq!(listed["unread"], json!(3), "{listed}");
    // B, the reported author, is told nothing of it.
    let (_, b_list) = list(gw1, &b_token, "").await;
    assert!(!b_list.to_string().contains(&report_id), "{b_list}");

    // ---- paging, then "all" read on the web: the phone clears live.
    let (_, page) = list(gw0, &a_phone_token, "?limit=1").await;
    assert_eq!(page["notifications"].as_array().unwrap().len(), 1, "{page}");
    let before = page["next_before"].as_i64().expect("a next page");
    let (_, next) = list(gw0, &a_phone_token, &format!("?limit=1&before={before}")).await;
    assert_eq!(
        next["notifications"][0]["kind"],
        json!("group.added"),
        "{next}"
    );
    let (status, body) = mark(gw1, &a_web_token, r#"{"all": true}"#).await;
    assert_eq!(status, 202, "{body}");
    a_phone
        .expect("everything read", DELIVERY, |f| {
            f["pres"]["event"] == json!("notification.read")
                && f["pres"]["params"]["up_to"].is_string()
        })
        .await;
    wait_for("nothing unread", DELIVERY, || async {
        let (_, body) = list(gw0, &a_phone_token, "?unread=true").await;
        if body["unread"] == json!(0) && body["notifications"] == json!([]) {
            Ok(())
        } else {
            Err(format!("{body}"))
        }
    })
    .await;
}
