//! Attacks from inside the rules (issue 39): ordinary accounts acting
//! within their rights, probing what the answers tell and what the edges
//! of every field do.
//!
//! - A stranger cannot tell whether someone else's message exists: an edit
//!   of a message in a group they are not in, of one that does not exist,
//!   of one in another pair's one-to-one chat and of one in a group that
//!   does not exist all get the same code and body (before: `403 only the
//!   sender may edit` for a message that exists, `404` otherwise).
//! - One `Idempotency-Key` used by two users, or by a user and an
//!   operator's `command_id`, in different conversations: both commands
//!   take effect (before: event ids derived from the key alone, so the
//!   second recall or moderation answered "ok" and the store dropped its
//!   event as a duplicate; the message stayed).
//! - Every change that becomes an event draws on a per-user bucket
//!   (`limits.changes`), and removing a "friend" who is none is refused
//!   (before: 30 of 30 `DELETE /v1/friends/<stranger>` accepted, each a
//!   `{pres friend.removed}` at a stranger; blocks, mutes, profiles
//!   unthrottled).
//! - An invitation is only as good as its inviter's right to add members
//!   at acceptance, and whoever may add members withdraws one by removing
//!   the invitee (before: accepted after the inviting admin was removed,
//!   and the owner's removal answered 404, a new add 409).
//! - A block is in effect when it is acknowledged, with no projection
//!   running: the blocked user's next one-to-one send and group add are
//!   refused (before: both went through until the relations pipeline had
//!   projected the block).
//! - The chat list's catch-up gives a removed member nothing while the
//!   projections have not seen the removal (it asks the write model, as
//!   the history route does).
//! - Operator sign-outs take their auth versions atomically too.
//! - A stranger's first message, or adding someone to one's group, shows
//!   nothing private of them: note and exact presence come with their own
//!   participation (a message there, a group they created or joined
//!   themselves) or a friendship (before: the first message, whoever sent
//!   it, unlocked both).
//! - A done command's claim keeps its answer (event ids, the group's id),
//!   not its events: a create at every field's limit leaves a claim of a
//!   few hundred bytes for its 24 h (before: the whole command with its
//!   name and members, in `noeviction` Redis).
//! - Invitations expire (`gateway.invitation_ttl_secs`): an old one is no
//!   longer listed, accepting it answers `410`, and the group may invite
//!   again (before: accepted at any age, and a second invitation `409`
//!   forever).
//! - Seqs at the i64 edges, on every route that names one, are refused as
//!   malformed, and the gateway goes on serving (before: `DELETE
//!   …/messages/9223372036854775807` overflowed `seq + 1` in the handler).

mod common;

use reqwest::Method;
use serde_json::{json, Value};

use common::{send_http, wait_for, Stack};
use imstream::tinode::p2p_topic;

async fn answer(
    http: &reqwest::Client,
    method: Method,
    url: String,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = http.request(method, url).bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.expect("the gateway answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_learns_nothing_about_other_peoples_messages_from_an_edit() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const GROUP: &str = "grpInsiderOracle";
    const STRANGER: i64 = 9;
    stack.create_group(GROUP, 1, &[2]).await;
    let http = reqwest::Client::new();
    let (code, sent) = send_http(&http, gw, &stack.token(2, "d"), GROUP, "o1", "here").await;
    assert_eq!(code, 202, "{sent}");
    let seq = sent["seq"].as_i64().unwrap();
    let pair = p2p_topic(1, 2);
    let (code, sent) = send_http(&http, gw, &stack.token(1, "d"), &pair, "o2", "hi").await;
    assert_eq!(code, 202, "{sent}");
    let p2p_seq = sent["seq"].as_i64().unwrap();
    // Stored, so "exists" is true everywhere it is read from: its members
    // read both.
    for (topic, s) in [(GROUP, seq), (pair.as_str(), p2p_seq)] {
        let http = &http;
        let token = stack.token(1, "d");
        wait_for(
            &format!("{topic}#{s} readable"),
            std::time::Duration::from_secs(30),
            || {
                let token = token.clone();
                async move {
                    match answer(
                        http,
                        Method::GET,
                        format!("http://{gw}/v1/groups/{topic}/messages/{s}"),
                        &token,
                        None,
                    )
                    .await
                    {
                        (200, _) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            },
        )
        .await;
    }

    let stranger = stack.token(STRANGER, "d");
    let edit = |topic: &str, seq: i64| {
        answer(
            &http,
            Method::PATCH,
            format!("http://{gw}/v1/groups/{topic}/messages/{seq}"),
            &stranger,
            Some(json!({"content": "mine now"})),
        )
    };
    // The same seq everywhere, so the text cannot differ by the number.
    let probes = [
        ("a message that exists, in a group", GROUP, seq),
        ("one that does not, in that group", GROUP, seq + 1000),
        ("one in another pair's chat", pair.as_str(), p2p_seq),
        (
            "one in a group that does not exist",
            "grpInsiderNoSuch",
            seq,
        ),
    ];
    let mut answers = Vec::new();
    for (what, topic, s) in probes {
        let (code, body) = edit(topic, s).await;
        // Normalize the seq the text names.
        let text = body["error"]
            .as_str()
            .unwrap_or("")
            .replace(&s.to_string(), "N");
        answers.push((what, code, text));
    }
    let first = (answers[0].1, answers[0].2.clone());
    for (what, code, text) in &answers {
        assert_eq!(
            (*code, text.clone()),
            first,
            "a stranger's edit of {what} is answered differently: {answers:?}"
        );
    }
    assert_eq!(first.0, 404, "{answers:?}");
    // Probing a pair that never spoke leaves nothing behind: refused from
    // the name, no model installed for it.
    let untouched = p2p_topic(7, 8);
    let (code, body) = edit(&untouched, 1).await;
    assert_eq!(code, 404, "{body}");
    let mut redis = stack.redis().await;
    for key in [
        imstream::keys::TopicKeys::new(stack.tenant(), &untouched).meta(),
        imstream::keys::TopicKeys::new(stack.tenant(), &untouched).seq(),
    ] {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(!exists, "a stranger's probe left {key}");
    }
    // The member still learns what a member may: it is not theirs.
    let (code, body) = answer(
        &http,
        Method::PATCH,
        format!("http://{gw}/v1/groups/{GROUP}/messages/{seq}"),
        &stack.token(1, "d"),
        Some(json!({"content": "the owner's edit"})),
    )
    .await;
    assert_eq!(code, 403, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqs_at_the_integer_edges_are_malformed_on_every_route() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    const GROUP: &str = "grpInsiderEdges";
    stack.create_group(GROUP, 1, &[2]).await;
    let http = reqwest::Client::new();
    let owner = stack.token(1, "d");
    let (code, sent) = send_http(&http, gw, &owner, GROUP, "e1", "edge").await;
    assert_eq!(code, 202, "{sent}");

    let edges = [
        "0",
        "-1",
        "9007199254740992",
        "9223372036854775807",
        "-9223372036854775808",
        "9223372036854775808",
    ];
    for edge in edges {
        let base = format!("http://{gw}/v1/groups/{GROUP}/messages/{edge}");
        let routes = [
            (Method::GET, base.clone(), None),
            (Method::GET, format!("{base}/context"), None),
            (Method::DELETE, base.clone(), None),
            (Method::PATCH, base.clone(), Some(json!({"content": "x"}))),
            (
                Method::POST,
                format!("{base}/report"),
                Some(json!({"reason": "spam"})),
            ),
        ];
        for (method, url, body) in routes {
            let (code, answer) = answer(&http, method.clone(), url, &owner, body).await;
            assert_eq!(code, 400, "{method} seq {edge}: {answer}");
        }
        // An edit named in the head, as the web app sends it.
        let (code, answer) = answer(
            &http,
            Method::POST,
            format!("http://{gw}/v1/groups/{GROUP}/messages"),
            &owner,
            Some(json!({"content": "x", "head": {"replace": format!(":{edge}")}})),
        )
        .await;
        assert_eq!(code, 400, "head.replace :{edge}: {answer}");
    }
    // The gateway goes on serving.
    let (code, sent) = send_http(&http, gw, &owner, GROUP, "e2", "still here").await;
    assert_eq!(code, 202, "{sent}");
}

/// The stored status of one message of this month (`normal`, `recalled`,
/// `deleted`).
async fn status(stack: &Stack, topic: &str, seq: i64) -> Option<String> {
    let month = chrono::Utc::now().format("%Y%m").to_string();
    sqlx::query_scalar(&format!(
        "SELECT status FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
    ))
    .bind(topic)
    .bind(seq)
    .fetch_optional(&stack.pool())
    .await
    .unwrap()
}

async fn wait_status(stack: &Stack, topic: &str, seq: i64, want: &str) {
    wait_for(
        &format!("{topic}#{seq} {want}"),
        std::time::Duration::from_secs(30),
        || async move {
            match status(stack, topic, seq).await {
                Some(s) if s == want => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_used_by_two_users_and_an_operator_acts_three_times() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "commands"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const KEY: &str = "shared-key-39";
    // Three groups, each with one message of the one who acts there.
    let groups = [
        ("grpInsiderKeyA", 1),
        ("grpInsiderKeyB", 2),
        ("grpInsiderKeyC", 3),
    ];
    let mut seqs = Vec::new();
    for (n, (topic, owner)) in groups.iter().enumerate() {
        stack.create_group(topic, *owner, &[4]).await;
        let (code, sent) = send_http(
            &http,
            gw,
            &stack.token(*owner, "d"),
            topic,
            &format!("k{n}"),
            "take me back",
        )
        .await;
        assert_eq!(code, 202, "{sent}");
        let seq = sent["seq"].as_i64().unwrap();
        wait_status(&stack, topic, seq, "normal").await;
        seqs.push(seq);
    }
    // Users 1 and 2 each recall their own message with the same key.
    for (n, (topic, owner)) in groups.iter().take(2).enumerate() {
        let resp = http
            .delete(format!(
                "http://{gw}/v1/groups/{topic}/messages/{}",
                seqs[n]
            ))
            .bearer_auth(stack.token(*owner, "d"))
            .header("Idempotency-Key", KEY)
            .send()
            .await
            .unwrap();
        let code = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(code, 202, "{topic}: {body}");
        assert_eq!(body["action"], json!("recalled"), "{body}");
    }
    // An operator's moderation whose command id is the same key.
    let resp = http
        .post(format!(
            "http://{}/v1/admin/commands",
            stack.admin_addr_of(gw)
        ))
        .bearer_auth(&stack.config().auth.admin_token)
        .json(&json!({
            "command_id": KEY,
            "tenant": stack.tenant(),
            "kind": "message.moderate",
            "topic": groups[2].0,
            "seq": seqs[2],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status().as_u16(),
        202,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    // Each took effect where it acted.
    wait_status(&stack, groups[0].0, seqs[0], "recalled").await;
    wait_status(&stack, groups[1].0, seqs[1], "recalled").await;
    wait_status(&stack, groups[2].0, seqs[2], "deleted").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_draw_on_a_per_user_bucket_and_strangers_are_no_friends_to_remove() {
    const BURST: u32 = 5;
    let mut stack = Stack::prepared(None).await;
    stack.world.config.limits.changes = imstream::config::BucketConfig::new(BURST, 1);
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    let me = stack.token(11, "d");
    // A stranger is no friend to remove: refused, nothing produced.
    let (code, body) = answer(
        &http,
        Method::DELETE,
        format!("http://{gw}/v1/friends/usr12"),
        &me,
        None,
    )
    .await;
    assert_eq!(code, 404, "{body}");
    // Blocks, unblocks, push settings, topic mutes: one bucket, per user.
    let mut codes = Vec::new();
    for n in 0..(BURST + 3) {
        let (method, path, body) = match n % 4 {
            0 => (
                Method::POST,
                "/v1/blocks".to_string(),
                Some(json!({"uid": 13})),
            ),
            1 => (Method::DELETE, "/v1/blocks/usr13".to_string(), None),
            2 => (
                Method::PUT,
                "/v1/me/push".to_string(),
                Some(json!({"dnd": n % 2 == 0})),
            ),
            _ => (
                Method::PUT,
                "/v1/me/push/topics/grpInsiderMadeUp".to_string(),
                Some(json!({"muted": true})),
            ),
        };
        let (code, answer) = answer(&http, method, format!("http://{gw}{path}"), &me, body).await;
        assert!(code == 202 || code == 429, "{path}: {code} {answer}");
        codes.push(code);
    }
    // The stranger probe above took a token too (it is a change asked for).
    let accepted = codes.iter().filter(|c| **c == 202).count() as u32;
    assert!(
        accepted <= BURST && codes.ends_with(&[429, 429, 429]),
        "a bucket of {BURST}: {codes:?}"
    );
    // Another user's bucket is their own.
    let (code, body) = answer(
        &http,
        Method::PUT,
        format!("http://{gw}/v1/me/push"),
        &stack.token(14, "d"),
        Some(json!({"dnd": true})),
    )
    .await;
    assert_eq!(code, 202, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invitations_end_with_their_inviters_rights_and_can_be_withdrawn() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const GROUP: &str = "grpInsiderInvites";
    const OWNER: i64 = 21;
    const ADMIN: i64 = 22;
    const GUEST: i64 = 23;
    stack.create_group(GROUP, OWNER, &[ADMIN]).await;
    let url = |path: &str| format!("http://{gw}/v1{path}");
    let (owner, admin, guest) = (
        stack.token(OWNER, "d"),
        stack.token(ADMIN, "d"),
        stack.token(GUEST, "d"),
    );
    // The guest is added only by invitation.
    let (code, body) = answer(
        &http,
        Method::PUT,
        url("/me/settings"),
        &guest,
        Some(json!({"add_policy": "contacts"})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = answer(
        &http,
        Method::PUT,
        url(&format!("/groups/{GROUP}/members/{ADMIN}/role")),
        &owner,
        Some(json!({"role": "admin"})),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let invite = |token: String| {
        let http = http.clone();
        let url = url(&format!("/groups/{GROUP}/members"));
        async move {
            answer(
                &http,
                Method::POST,
                url,
                &token,
                Some(json!({"uid": GUEST})),
            )
            .await
        }
    };
    let (code, body) = invite(admin.clone()).await;
    assert_eq!(
        (code, body["invited"].clone()),
        (202, json!([GUEST])),
        "{body}"
    );
    // The admin is removed; their invitation goes with their rights.
    let (code, body) = answer(
        &http,
        Method::DELETE,
        url(&format!("/groups/{GROUP}/members/{ADMIN}")),
        &owner,
        None,
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let accept = || {
        answer(
            &http,
            Method::POST,
            url(&format!("/groups/{GROUP}/invitation")),
            &guest,
            None,
        )
    };
    let (code, body) = accept().await;
    assert_eq!(
        code, 410,
        "accepted an invitation of a removed admin: {body}"
    );
    // The owner withdraws it by removing the invitee, and may invite again.
    let (code, body) = answer(
        &http,
        Method::DELETE,
        url(&format!("/groups/{GROUP}/members/{GUEST}")),
        &owner,
        None,
    )
    .await;
    assert_eq!(code, 202, "withdrawing an invitation: {body}");
    let (code, body) = accept().await;
    assert_eq!(code, 404, "a withdrawn invitation accepted: {body}");
    let (code, body) = invite(owner.clone()).await;
    assert_eq!(
        (code, body["invited"].clone()),
        (202, json!([GUEST])),
        "{body}"
    );
    let (code, body) = accept().await;
    assert_eq!(code, 202, "the owner's invitation: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_holds_from_its_acknowledgement_with_no_projection_running() {
    let mut stack = Stack::prepared(None).await;
    // No pipeline at all: what holds is what the command itself wrote.
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const VICTIM: i64 = 31;
    const PEST: i64 = 32;
    let (victim, pest) = (stack.token(VICTIM, "d"), stack.token(PEST, "d"));
    let (code, body) = answer(
        &http,
        Method::POST,
        format!("http://{gw}/v1/blocks"),
        &victim,
        Some(json!({"uid": PEST})),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    // At once, in the same millisecond as far as any projection knows.
    let (code, body) = answer(
        &http,
        Method::POST,
        format!("http://{gw}/v1/users/usr{VICTIM}/messages"),
        &pest,
        Some(json!({"content": "you cannot block me", "client_msg_id": "b1"})),
    )
    .await;
    assert_eq!(
        (code, body["params"]["code"].clone()),
        (403, json!("BLOCKED")),
        "{body}"
    );
    let (code, body) = answer(
        &http,
        Method::POST,
        format!("http://{gw}/v1/groups"),
        &pest,
        Some(json!({"topic": "grpInsiderPest", "name": "pest", "members": [VICTIM]})),
    )
    .await;
    assert_eq!(code, 403, "added by someone they blocked: {body}");
    // An unblock holds as soon, too.
    let (code, body) = answer(
        &http,
        Method::DELETE,
        format!("http://{gw}/v1/blocks/usr{PEST}"),
        &victim,
        None,
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let (code, body) = answer(
        &http,
        Method::POST,
        format!("http://{gw}/v1/users/usr{VICTIM}/messages"),
        &pest,
        Some(json!({"content": "sorry", "client_msg_id": "b2"})),
    )
    .await;
    assert_eq!(code, 202, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_removed_member_catches_up_on_nothing_while_the_projections_lag() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "conversations", "hot"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const GROUP: &str = "grpInsiderCatchup";
    const OWNER: i64 = 41;
    const GONE: i64 = 42;
    stack.create_group(GROUP, OWNER, &[GONE]).await;
    let (owner, gone) = (stack.token(OWNER, "d"), stack.token(GONE, "d"));
    let (code, body) = send_http(&http, gw, &owner, GROUP, "c1", "before").await;
    assert_eq!(code, 202, "{body}");
    let list_url = format!("http://{gw}/v1/me/conversations?catchup=10");
    let caught_up = |list: &Value| -> Option<Vec<String>> {
        let entry = list["conversations"]
            .as_array()?
            .iter()
            .find(|c| c["topic"] == json!(GROUP))?;
        Some(
            entry["catchup"]["messages"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .map(|m| m["content"]["txt"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default(),
        )
    };
    {
        let (http, gone, list_url) = (&http, &gone, &list_url);
        wait_for(
            "the member's list shows the message",
            std::time::Duration::from_secs(30),
            || async move {
                let (_, list) = answer(http, Method::GET, list_url.clone(), gone, None).await;
                match caught_up(&list) {
                    Some(m) if m == ["before"] => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    // The projections stop; the member is removed and the group goes on.
    stack.stop_pipeline("conversations").await;
    stack.stop_pipeline("members").await;
    let (code, body) = answer(
        &http,
        Method::DELETE,
        format!("http://{gw}/v1/groups/{GROUP}/members/{GONE}"),
        &owner,
        None,
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let (code, body) =
        send_http(&http, gw, &owner, GROUP, "c2", "after: not for the removed").await;
    assert_eq!(code, 202, "{body}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (code, list) = answer(&http, Method::GET, list_url.clone(), &gone, None).await;
    assert_eq!(code, 200, "{list}");
    let leaked: Vec<String> = caught_up(&list)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.starts_with("after"))
        .collect();
    assert!(
        leaked.is_empty(),
        "a removed member caught up on {leaked:?}: {list}"
    );
    // The history route refuses them too.
    let (code, body) = answer(
        &http,
        Method::GET,
        format!("http://{gw}/v1/groups/{GROUP}/messages"),
        &gone,
        None,
    )
    .await;
    assert_eq!(code, 403, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quick_operator_sign_outs_take_two_auth_versions() {
    let mut stack = Stack::prepared(None).await;
    // No control projection: what holds is what the calls themselves took.
    let gw = stack.start_gateway("gw").await;
    const UID: i64 = 51;
    let http = reqwest::Client::new();
    for _ in 0..2 {
        let resp = http
            .post(format!(
                "http://{}/v1/admin/users/{UID}/signout?tenant={}",
                stack.admin_addr_of(gw),
                stack.tenant()
            ))
            .bearer_auth(&stack.config().auth.admin_token)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 202);
    }
    let taken: Option<i64> =
        sqlx::query_scalar("SELECT auth_version FROM im_session_control_users WHERE uid = ?")
            .bind(UID)
            .fetch_optional(&stack.pool())
            .await
            .unwrap();
    assert_eq!(taken, Some(2), "each sign-out takes its own auth version");
}

/// What `viewer` sees of `peer` through their one-to-one topic:
/// (note shown, online shown).
async fn peer_view(ws: &mut common::Ws, peer: i64) -> (bool, bool) {
    let topic = format!("usr{peer}");
    let (_, desc) = ws
        .request(json!({"get": {"topic": topic, "what": "desc"}}))
        .await;
    let public = &desc["meta"]["desc"]["public"];
    assert!(public["fn"].is_string(), "{desc}");
    let (_, subs) = ws
        .request(json!({"get": {"topic": topic, "what": "sub"}}))
        .await;
    let entry = subs["meta"]["sub"]
        .as_array()
        .and_then(|s| s.iter().find(|e| e["user"] == json!(topic)))
        .unwrap_or_else(|| panic!("{topic} in {subs}"))
        .clone();
    (public.get("note").is_some(), entry["online"] == json!(true))
}

/// What `token`'s holder sees of `member` in `group`'s member list:
/// (note shown, online shown).
async fn member_view(
    http: &reqwest::Client,
    gw: std::net::SocketAddr,
    token: &str,
    group: &str,
    member: i64,
) -> (bool, bool) {
    let (code, body) = answer(
        http,
        Method::GET,
        format!("http://{gw}/v1/groups/{group}/subscribers"),
        token,
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let entry = body["subscribers"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .find(|e| e["user"] == json!(format!("usr{member}")))
        })
        .unwrap_or_else(|| panic!("usr{member} in {body}"))
        .clone();
    (
        entry["public"].get("note").is_some(),
        entry["online"] == json!(true),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unsolicited_message_or_group_add_unlocks_no_note_and_no_presence() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "relations", "conversations"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const STRANGER: i64 = 41;
    const VICTIM: i64 = 42;
    const GROUP: &str = "grpInsiderNosy";
    let (stranger, victim) = (stack.token(STRANGER, "d"), stack.token(VICTIM, "d"));
    let (code, body) = answer(
        &http,
        Method::PUT,
        format!("http://{gw}/v1/me/profile"),
        &victim,
        Some(json!({"fn": "Vic", "note": "my private note"})),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    // The stranger writes first and adds the victim to a group of theirs.
    let dm = |from: String, to: i64, text: &'static str| {
        let http = http.clone();
        async move {
            answer(
                &http,
                Method::POST,
                format!("http://{gw}/v1/users/usr{to}/messages"),
                &from,
                Some(json!({"content": text})),
            )
            .await
        }
    };
    let (code, body) = dm(stranger.clone(), VICTIM, "hi, who are you?").await;
    assert_eq!(code, 202, "{body}");
    stack.create_group(GROUP, STRANGER, &[VICTIM]).await;
    let pool = stack.pool();
    wait_for(
        "the profile and both conversations projected",
        std::time::Duration::from_secs(60),
        || {
            let pool = pool.clone();
            async move {
                let seen: (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT COUNT(*) FROM im_user_profiles WHERE uid = 42), \
                            (SELECT COUNT(*) FROM im_conversations WHERE uid = 42)",
                )
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())?;
                if seen == (1, 2) {
                    Ok(())
                } else {
                    Err(format!("(profiles, conversations) = {seen:?}"))
                }
            }
        },
    )
    .await;
    // The stranger watches `me` while the victim comes online and opens
    // the group.
    let mut s = common::Ws::connect(gw, &stranger).await;
    let (_, ctrl) = s.request(json!({"sub": {"topic": "me"}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    let mut v = common::Ws::connect(gw, &victim).await;
    let (_, ctrl) = v.request(json!({"sub": {"topic": GROUP}})).await;
    assert_eq!(ctrl["ctrl"]["code"], json!(200), "{ctrl}");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let (frames, _) = s
        .request(json!({"get": {"topic": "me", "what": "desc"}}))
        .await;
    assert!(
        !frames
            .iter()
            .any(|f| f["pres"]["src"] == json!(format!("usr{VICTIM}"))),
        "the stranger was told the victim came online: {frames:?}"
    );
    assert_eq!(
        peer_view(&mut s, VICTIM).await,
        (false, false),
        "note and presence after one unsolicited message"
    );
    assert_eq!(
        member_view(&http, gw, &stranger, GROUP, VICTIM).await,
        (false, false),
        "note and presence of someone added to a stranger's group"
    );
    // The victim answers in both: now they took part, and both show.
    let (code, body) = dm(victim.clone(), STRANGER, "hello").await;
    assert_eq!(code, 202, "{body}");
    let (code, body) = answer(
        &http,
        Method::POST,
        format!("http://{gw}/v1/groups/{GROUP}/messages"),
        &victim,
        Some(json!({"content": "hi all"})),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let views = (
            peer_view(&mut s, VICTIM).await,
            member_view(&http, gw, &stranger, GROUP, VICTIM).await,
        );
        if views == ((true, true), (true, true)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after the victim wrote, (one-to-one, group) views are {views:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    // And going offline and online again is told to the stranger now.
    drop(v);
    let pres = |frame: &Value, what: &str| {
        frame["pres"]["src"] == json!(format!("usr{VICTIM}"))
            && frame["pres"]["what"] == json!(what)
    };
    while !pres(&s.next_frame().await, "off") {}
    let _v = common::Ws::connect(gw, &victim).await;
    while !pres(&s.next_frame().await, "on") {}
}

/// Whether `token`'s holder sees an invitation to `group` in their chat
/// list (`{get me sub}`: an entry with access given, not wanted yet).
async fn sees_invitation(gw: std::net::SocketAddr, token: &str, group: &str) -> bool {
    let mut ws = common::Ws::connect(gw, token).await;
    let (_, list) = ws
        .request(json!({"get": {"topic": "me", "what": "sub"}}))
        .await;
    list["meta"]["sub"]
        .as_array()
        .is_some_and(|s| s.iter().any(|e| e["topic"] == json!(group)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invitation_expires_and_the_group_may_invite_again() {
    let mut stack = Stack::prepared_with(None, |c| c.gateway.invitation_ttl_secs = 5).await;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const GROUP: &str = "grpInsiderStale";
    const OWNER: i64 = 51;
    const GUEST: i64 = 52;
    stack.create_group(GROUP, OWNER, &[]).await;
    let (owner, guest) = (stack.token(OWNER, "d"), stack.token(GUEST, "d"));
    let url = |path: &str| format!("http://{gw}/v1{path}");
    let (code, body) = answer(
        &http,
        Method::PUT,
        url("/me/settings"),
        &guest,
        Some(json!({"add_policy": "contacts"})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let invite = || {
        answer(
            &http,
            Method::POST,
            url(&format!("/groups/{GROUP}/members")),
            &owner,
            Some(json!({"uid": GUEST})),
        )
    };
    let (code, body) = invite().await;
    assert_eq!(
        (code, body["invited"].clone()),
        (202, json!([GUEST])),
        "{body}"
    );
    let listed = |what: &'static str| {
        let guest = guest.clone();
        async move {
            wait_for(what, std::time::Duration::from_secs(30), || async {
                if sees_invitation(gw, &guest, GROUP).await {
                    Ok(())
                } else {
                    Err("not listed".to_string())
                }
            })
            .await
        }
    };
    listed("the invitation listed").await;
    // While it is fresh, a second invitation is refused.
    let (code, body) = invite().await;
    assert_eq!(code, 409, "{body}");
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert!(
        !sees_invitation(gw, &guest, GROUP).await,
        "an expired invitation is still listed"
    );
    let accept = || {
        answer(
            &http,
            Method::POST,
            url(&format!("/groups/{GROUP}/invitation")),
            &guest,
            None,
        )
    };
    let (code, body) = accept().await;
    assert_eq!(code, 410, "an expired invitation accepted: {body}");
    // The group invites again; the fresh invitation is listed and holds.
    let (code, body) = invite().await;
    assert_eq!(
        (code, body["invited"].clone()),
        (202, json!([GUEST])),
        "{body}"
    );
    listed("the renewed invitation listed").await;
    let (code, body) = accept().await;
    assert_eq!(code, 202, "the renewed invitation: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_done_command_keeps_its_answer_not_its_events() {
    let mut stack = Stack::prepared(None).await;
    stack.start_pipeline("members").await;
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const OWNER: i64 = 61;
    const KEY: &str = "create-61";
    // A create at every field's limit: the longest name, many members.
    let name: String = "名".repeat(imstream::fields::GROUP_NAME_CHARS);
    let members: Vec<i64> = (100..120).collect();
    let create = || {
        http.post(format!("http://{gw}/v1/groups"))
            .bearer_auth(stack.token(OWNER, "d"))
            .header("Idempotency-Key", KEY)
            .json(&json!({"topic": "grpInsiderClaim", "name": name, "members": members}))
            .send()
    };
    let first = create().await.unwrap();
    assert_eq!(first.status().as_u16(), 201);
    let first: Value = first.json().await.unwrap();
    // The claim the retry is answered from holds the answer only.
    let mut redis = stack.redis().await;
    let claim: String = redis::cmd("GET")
        .arg(imstream::keys::TopicKeys::new(stack.tenant(), "grpInsiderClaim").command(OWNER, KEY))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(
        claim.len() < 400 && !claim.contains('名'),
        "a done claim of {} bytes keeps the command: {claim}",
        claim.len()
    );
    // And the retry gets the same answer from it.
    let again = create().await.unwrap();
    assert_eq!(again.status().as_u16(), 201);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(first["events"].as_array().map(Vec::len), Some(1), "{first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stranger_cannot_bury_someones_invitations_or_notices() {
    let mut stack = Stack::prepared_with(None, |c| {
        c.limits.group_creates = imstream::config::BucketConfig::new(20, 20);
    })
    .await;
    stack.start_pipeline("members").await;
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const PEST: i64 = 71;
    const FRIEND: i64 = 72;
    const VICTIM: i64 = 73;
    let victim = stack.token(VICTIM, "d");
    let (code, body) = answer(
        &http,
        Method::PUT,
        format!("http://{gw}/v1/me/settings"),
        &victim,
        Some(json!({"add_policy": "contacts"})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let create = |owner: i64, n: usize| {
        let http = http.clone();
        let token = stack.token(owner, "d");
        async move {
            answer(
                &http,
                Method::POST,
                format!("http://{gw}/v1/groups"),
                &token,
                Some(json!({"topic": format!("grpBury{owner}x{n}"), "name": "join us", "members": [VICTIM]})),
            )
            .await
        }
    };
    let max = imstream::governance::consent::MAX_PENDING_PER_INVITER as usize;
    for n in 0..max {
        let (code, body) = create(PEST, n).await;
        assert_eq!(
            (code, body["invited"].clone()),
            (201, json!([VICTIM])),
            "{body}"
        );
    }
    let pool = stack.pool();
    wait_for(
        "the invitations projected",
        std::time::Duration::from_secs(30),
        || {
            let pool = pool.clone();
            async move {
                let n: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM im_group_invites WHERE uid = 73")
                        .fetch_one(&pool)
                        .await
                        .map_err(|e| e.to_string())?;
                if n as usize == max {
                    Ok(())
                } else {
                    Err(format!("{n}"))
                }
            }
        },
    )
    .await;
    let (code, body) = create(PEST, max).await;
    assert_eq!(
        code,
        429,
        "invitation {} from one stranger: {body}",
        max + 1
    );
    let (code, body) = create(FRIEND, 0).await;
    assert_eq!(
        (code, body["invited"].clone()),
        (201, json!([VICTIM])),
        "{body}"
    );

    // Notices: one user's many keep only their newest; an operator's and
    // another user's stay.
    use imstream::notifications::{record, Notification, MAX_PER_ACTOR};
    let notice = |id: String, actor: i64, at: i64| Notification {
        uid: VICTIM,
        id,
        kind: if actor == 0 { "system" } else { "group.added" }.to_string(),
        actor,
        topic: None,
        title: String::new(),
        text: String::new(),
        params: json!({}),
        created_at: at,
        read: false,
    };
    let t0 = imstream::events::now_ms();
    let mut all = vec![
        notice("op-1".into(), 0, t0),
        notice("friend-1".into(), FRIEND, t0),
    ];
    all.extend((0..MAX_PER_ACTOR + 30).map(|n| notice(format!("pest-{n}"), PEST, t0 + n)));
    for n in &all {
        record(&pool, std::slice::from_ref(n)).await.unwrap();
    }
    let kept: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT actor_uid, COUNT(*) FROM im_user_notifications WHERE uid = 73 \
         AND notification_id IN ('op-1', 'friend-1') OR (uid = 73 AND notification_id LIKE 'pest-%') \
         GROUP BY actor_uid ORDER BY actor_uid",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(kept, vec![(0, 1), (PEST, MAX_PER_ACTOR), (FRIEND, 1)]);
    let newest: Option<String> = sqlx::query_scalar(
        "SELECT CAST(notification_id AS CHAR) FROM im_user_notifications \
         WHERE uid = 73 AND actor_uid = 71 AND notification_id LIKE 'pest-%' ORDER BY id DESC LIMIT 1",
    )
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert_eq!(newest, Some(format!("pest-{}", MAX_PER_ACTOR + 29)));
}

/// An answer as a stranger compares it: the code and the body, without
/// the request id and the seq asked for (its field, and `message N` in an
/// error's text).
fn comparable(code: u16, body: &Value, seq: i64) -> (u16, String) {
    let mut body = body.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("request_id");
        o.remove("seq");
        if let Some(Value::String(e)) = o.get_mut("error") {
            *e = e.replace(&format!("message {seq} "), "message N ");
        }
    }
    (code, body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_message_route_tells_a_stranger_whether_a_message_exists_generated() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("INSIDER_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("INSIDER_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("gw").await;
    let http = reqwest::Client::new();
    const OWNER: i64 = 81;
    const MEMBER: i64 = 82;
    const STRANGER: i64 = 83;
    const GROUP: &str = "grpInsiderOracle";
    stack.create_group(GROUP, OWNER, &[MEMBER]).await;
    let pair = p2p_topic(OWNER, MEMBER);
    let owner = stack.token(OWNER, "d");
    let mut last = 0;
    for n in 0..3 {
        let (code, sent) = send_http(&http, gw, &owner, GROUP, &format!("o{n}"), "mine").await;
        assert_eq!(code, 202, "{sent}");
        last = sent["seq"].as_i64().unwrap();
        let (code, sent) = answer(
            &http,
            Method::POST,
            format!("http://{gw}/v1/users/usr{MEMBER}/messages"),
            &owner,
            Some(json!({"content": "hi", "client_msg_id": format!("p{n}")})),
        )
        .await;
        assert_eq!(code, 202, "{sent}");
    }
    wait_status(&stack, GROUP, last, "normal").await;
    let stranger = stack.token(STRANGER, "d");
    // Every route that names a message, as the stranger may call it.
    let routes: [(Method, &str, Option<Value>); 7] = [
        (Method::GET, "", None),
        (Method::PATCH, "", Some(json!({"content": {"txt": "x"}}))),
        (Method::DELETE, "", None),
        (Method::GET, "/context", None),
        (Method::POST, "/report", Some(json!({"reason": "spam"}))),
        (Method::PUT, "fav", None),
        (Method::DELETE, "fav", None),
    ];
    let url = |topic: &str, seq: i64, tail: &str| {
        if tail == "fav" {
            format!("http://{gw}/v1/me/favorites/{topic}/{seq}")
        } else {
            format!("http://{gw}/v1/groups/{topic}/messages/{seq}{tail}")
        }
    };
    let mut cases = 0;
    for _ in 0..24 {
        let (method, tail, body) = routes[rng.gen_range(0..routes.len())].clone();
        let topic = if rng.gen_bool(0.5) {
            GROUP.to_string()
        } else {
            pair.clone()
        };
        let existing = rng.gen_range(1..=3);
        let missing = rng.gen_range(1_000..1_000_000);
        let (a, body_a) = answer(
            &http,
            method.clone(),
            url(&topic, existing, tail),
            &stranger,
            body.clone(),
        )
        .await;
        let (b, body_b) = answer(
            &http,
            method.clone(),
            url(&topic, missing, tail),
            &stranger,
            body.clone(),
        )
        .await;
        // Another pair's one-to-one chat against a pair that never spoke
        // (a group's name is told apart by a create anyway: `409`).
        let unknown = if topic == pair {
            p2p_topic(9001, 9002)
        } else {
            topic.clone()
        };
        let (c, body_c) = answer(
            &http,
            method.clone(),
            url(&unknown, existing, tail),
            &stranger,
            body.clone(),
        )
        .await;
        let exists = comparable(a, &body_a, existing);
        let mut body_c = body_c;
        if let Some(t) = body_c.get_mut("topic") {
            *t = json!(topic);
        }
        // Removing a favorite one does not have is the caller's own no-op.
        let own_no_op = method == Method::DELETE && tail == "fav";
        assert!(
            a >= 400 || own_no_op,
            "seed {seed}: {method} {tail} on {topic} served a stranger: {body_a}"
        );
        assert_eq!(
            exists,
            comparable(b, &body_b, missing),
            "seed {seed}: {method} {tail} on {topic}: a message that exists and one that does not answer apart"
        );
        assert_eq!(
            exists,
            comparable(c, &body_c, existing),
            "seed {seed}: {method} {tail}: {topic} and a chat that does not exist answer apart"
        );
        cases += 1;
    }
    println!("{cases} generated oracle cases, seed {seed}");
}
