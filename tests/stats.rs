//! Admin statistics (issue 17, part 4; seed 000 §6.6) against the real
//! services: after a run with messages, edits, a recall, a delete for
//! everyone and a one-to-one message, `GET /v1/admin/stats` (which reads
//! only the stats pipeline's summary tables) equals a direct count over the
//! month tables, per day, per topic and in total; replaying the pipeline
//! over its own output, and rebuilding it from nothing, leaves it equal.

mod common;

use std::time::Duration;

use imstream::replay::{replay, ReplayArgs};
use imstream::store::month::ShardMonth;
use serde_json::{json, Value};

use common::{call, send_http, wait_for, Stack, Ws};

const TOPIC: &str = "grpStatsTeam";
const A: i64 = 1701;
const B: i64 = 1702;

/// The report as the admin API serves it (`query` after `tenant=`).
async fn report(stack: &Stack, query: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/admin/stats?tenant={}{query}",
            stack.admin_addr(0),
            stack.tenant()
        ))
        .bearer_auth(&stack.config().auth.admin_token)
        .send()
        .await
        .expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Per topic: (messages, edits, recalls, deletes, senders) counted straight
/// from this month's tables (both families), as the summaries must say.
async fn direct_count(stack: &Stack, topic: &str) -> Value {
    let month = ShardMonth::of(chrono::Utc::now());
    let mut total = [0i64; 5];
    for prefix in ["im_group_messages_", "im_p2p_messages_"] {
        let row: (i64, i64, i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT COUNT(*), CAST(COALESCE(SUM(JSON_EXTRACT(head, '$.replace') IS NOT NULL), 0) AS SIGNED), \
               CAST(COALESCE(SUM(recalled_at IS NOT NULL), 0) AS SIGNED), \
               CAST(COALESCE(SUM(deleted_at IS NOT NULL), 0) AS SIGNED), COUNT(DISTINCT from_user) \
             FROM {prefix}{month} WHERE topic = ?"
        ))
        .bind(topic)
        .fetch_one(&stack.pool())
        .await
        .unwrap();
        for (t, v) in total.iter_mut().zip([row.0, row.1, row.2, row.3, row.4]) {
            *t += v;
        }
    }
    json!({
        "messages": total[0],
        "edits": total[1],
        "recalls": total[2],
        "deletes": total[3],
        "active_senders": total[4],
        // Nothing is reported in this run (tests/references.rs counts reports).
        "reports": 0,
    })
}

/// Ok with the report once the topic's totals equal the direct count.
async fn settled(stack: &Stack, topic: &str) -> Result<Value, String> {
    let (status, r) = report(stack, &format!("&topic={topic}")).await;
    let direct = direct_count(stack, topic).await;
    if status == 200 && r["total"] == direct {
        Ok(r)
    } else {
        Err(format!("{status} {r}\ndirect {direct}"))
    }
}

/// `imstream replay stats` from the start; with `same`, every topic must
/// verify identical to the summaries it replaced.
async fn replay_stats(stack: &Stack, same: bool) {
    let args = ReplayArgs {
        pipeline: "stats".into(),
        from: "earliest".into(),
        tenant: None,
        into: None,
        wait_inactive_secs: 30,
    };
    let report = replay(stack.config(), &args, stack.world.shutdown.child())
        .await
        .expect("replay");
    let identical = report
        .verifications
        .iter()
        .flat_map(|v| &v.topics)
        .all(|t| t.verdict == imstream::digest::Verdict::Identical);
    assert!(
        !same || identical,
        "replay verified against the summaries it replaced: {report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stats_equal_a_direct_count_and_survive_replay() {
    let mut stack = Stack::prepared(None).await;
    for p in ["store", "members", "relations", "stats"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("stats").await;
    stack.create_group(TOPIC, A, &[B]).await;
    let client = reqwest::Client::new();
    let mut seqs = Vec::new();
    for (i, uid) in [A, A, A, B, B, A].into_iter().enumerate() {
        let (status, body) = send_http(
            &client,
            gw,
            &stack.token(uid, "http"),
            TOPIC,
            &format!("s{i}"),
            &format!("message {i}"),
        )
        .await;
        assert_eq!(status, 202, "{body}");
        seqs.push(body["seq"].as_i64().unwrap());
    }
    let month = ShardMonth::of(chrono::Utc::now());
    wait_for(
        "the six messages stored",
        Duration::from_secs(60),
        || async {
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ?"
            ))
            .bind(TOPIC)
            .fetch_one(&stack.pool())
            .await
            .unwrap();
            if n == 6 {
                Ok(())
            } else {
                Err(format!("{n} stored"))
            }
        },
    )
    .await;
    // An edit (a replacement message), a recall (by the sender), a delete
    // for everyone (the owner, of B's message: a moderation).
    let (status, body) = call(
        &stack,
        gw,
        B,
        "PATCH",
        &format!("/v1/groups/{TOPIC}/messages/{}", seqs[3]),
        json!({"content": {"txt": "edited"}, "client_msg_id": "s3-edit"}),
    )
    .await;
    assert_eq!(status, 202, "edit: {body}");
    let (status, body) = call(
        &stack,
        gw,
        A,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/messages/{}", seqs[0]),
        json!({}),
    )
    .await;
    assert!(status == 200 || status == 202, "recall: {status} {body}");
    let mut owner = Ws::connect(gw, &stack.token(A, "ws")).await;
    owner.request(json!({"sub": {"topic": TOPIC}})).await;
    let (_, del) = owner
        .request(json!({"del": {"topic": TOPIC, "what": "msg", "hard": true, "delseq": [{"low": seqs[4], "hi": seqs[4] + 1}]}}))
        .await;
    assert_eq!(del["ctrl"]["code"], json!(200), "{del}");
    // A one-to-one message.
    let (status, body) = call(
        &stack,
        gw,
        A,
        "POST",
        &format!("/v1/users/{B}/messages"),
        json!({"content": {"txt": "hi B"}}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let pair = imstream::tinode::p2p_topic(A, B);

    let group = wait_for("the group's summary", Duration::from_secs(60), || {
        settled(&stack, TOPIC)
    })
    .await;
    assert_eq!(
        group["total"],
        json!({"messages": 7, "edits": 1, "recalls": 1, "deletes": 1, "active_senders": 2, "reports": 0}),
        "six messages and an edit, by two people; one recalled, one deleted"
    );
    let today = chrono::Utc::now().date_naive();
    assert_eq!(
        group["days"][today.to_string()],
        group["total"],
        "all of it today (UTC)"
    );
    assert_eq!(
        group["months"][today.format("%Y-%m").to_string()],
        group["total"]
    );
    wait_for("the one-to-one summary", Duration::from_secs(60), || {
        settled(&stack, &pair)
    })
    .await;
    let (_, all) = report(&stack, "").await;
    assert_eq!(
        all["total"]["messages"],
        json!(8),
        "the tenant: both topics"
    );
    assert_eq!(
        all["total"]["active_senders"],
        json!(2),
        "distinct over the tenant"
    );

    // Bad input gets a clear error; only admins read it.
    let (status, body) = report(&stack, "&from=yesterday").await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = report(&stack, "&from=2026-12-02&to=2026-12-01").await;
    assert_eq!(status, 400);
    let (status, _) = report(&stack, "&from=2020-01-01&to=2026-01-01").await;
    assert_eq!(status, 400, "more than 366 days");
    let status = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/admin/stats?tenant={}",
            stack.admin_addr_of(gw),
            stack.tenant()
        ))
        .bearer_auth(stack.token(A, "http"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(status, 401, "a user token is no admin token");

    // Replayed over its own output (every event delivered again): equal.
    let before = report(&stack, "").await.1;
    stack.stop_pipeline("stats").await;
    replay_stats(&stack, true).await;
    assert_eq!(report(&stack, "").await.1, before, "redelivered: unchanged");
    // Rebuilt from nothing: equal.
    for table in ["im_stats_daily", "im_stats_senders"] {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(&stack.pool())
            .await
            .unwrap();
    }
    assert_eq!(
        report(&stack, "").await.1["total"]["messages"],
        json!(0),
        "wiped"
    );
    replay_stats(&stack, false).await;
    assert_eq!(report(&stack, "").await.1, before, "rebuilt from the log");
    settled(&stack, TOPIC)
        .await
        .expect("still the direct count");
}
