//! What the write side must not forget when Redis does (issue 38), against
//! the real services. Each case failed on main 7daa308:
//!
//! - a group whose name the members projection could not store was
//!   acknowledged, dead-lettered, then forgotten by the next rebuild: its
//!   name free for anyone, its history readable by the new owner. Now the
//!   name is refused at the door, and a stored group is never forgotten;
//! - a made-up name cost a log-tail scan per lookup, unthrottled: now a
//!   lookup of a name Redis holds no model of costs one MySQL read, counted
//!   per user, and "no such group" is kept in Redis for every gateway;
//! - a part of a group's model lost on its own (an evicted `mutes` or
//!   `roles` key) silently changed decisions: now it is restored;
//! - a Redis that could evict the write side was accepted: now refused at
//!   start;
//! - a retry of a message acknowledged before the loss took a new seq (the
//!   claim went with Redis): now it gets its seq, also when the message is
//!   only in the log's unstored tail;
//! - delete transaction ids started again at 1.
//!
//! "Redis forgets" here is every key of the test's tenant deleted at once
//! (the server is shared by the tests running beside this one): for the
//! tenant, what a `FLUSHALL` or an empty failover does.

mod common;
mod groups_support;
mod realtime_support;

use std::time::Duration;

use imstream::keys::TopicKeys;

use serde_json::{json, Value};

use common::process::{free_addr, Proc};
use common::{call, send_http, wait_for, write_config_file, Stack};
use groups_support::*;

/// Deletes every key of the tenant (per-topic, per-user and tenant-wide).
async fn forget_tenant(stack: &Stack) {
    let mut redis = stack.redis().await;
    let tenant = stack.tenant();
    let mut deleted = 0;
    for pattern in [format!("im:{{{tenant}:*"), format!("im:{{{tenant}}}*")] {
        let keys = imstream::redis_util::scan_keys(&mut redis, &pattern)
            .await
            .unwrap();
        for chunk in keys.chunks(500) {
            let n: usize = redis::cmd("DEL")
                .arg(chunk)
                .query_async(&mut redis)
                .await
                .unwrap();
            deleted += n;
        }
    }
    assert!(deleted > 0, "the tenant had keys");
}

/// An HTTP call as `uid` through gateway 0 that is not answered 503.
async fn settled(stack: &Stack, uid: i64, method: &str, path: &str, body: Value) -> (u16, Value) {
    let gw = stack.gateway_addr(0);
    wait_for(
        &format!("{method} {path} settled"),
        Duration::from_secs(60),
        || {
            let body = body.clone();
            async move {
                match call(stack, gw, uid, method, path, body).await {
                    (503, b) => Err(format!("503 {b}")),
                    other => Ok(other),
                }
            }
        },
    )
    .await
}

/// A send with a client id through gateway 0, retried on 503: (status,
/// body).
async fn send_as(stack: &Stack, uid: i64, topic: &str, cmid: &str) -> (u16, Value) {
    let client = reqwest::Client::new();
    let token = stack.token(uid, "http");
    let gw = stack.gateway_addr(0);
    wait_for(&format!("{cmid} settled"), Duration::from_secs(60), || {
        let (client, token) = (client.clone(), token.clone());
        async move {
            match send_http(&client, gw, &token, topic, cmid, cmid).await {
                (503, b) => Err(format!("503 {b}")),
                other => Ok(other),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stored_group_is_never_forgotten_and_a_name_it_could_not_store_is_refused() {
    let stack = everything(1).await;
    const TOPIC: &str = "grpKept";
    // One past the column: refused before anything is decided.
    let (status, body) = settled(
        &stack,
        1,
        "POST",
        "/v1/groups",
        json!({"topic": "grpTooLong", "name": "n".repeat(129), "members": [2]}),
    )
    .await;
    assert_eq!(status, 400, "a 129-character name: {body}");
    assert!(body.to_string().contains("128"), "{body}");
    // At the column's limit: created, and the members projection stores it.
    let (status, body) = settled(
        &stack,
        1,
        "POST",
        "/v1/groups",
        json!({"topic": TOPIC, "name": "名".repeat(128), "members": [2]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = send_as(&stack, 1, TOPIC, "secret-1").await;
    assert_eq!(status, 202, "{body}");
    members_become(&stack, TOPIC, vec![(1, "owner"), (2, "member")]).await;

    forget_tenant(&stack).await;
    // The name is still taken: nobody else creates it, nor reads its history.
    let (status, body) = settled(
        &stack,
        9,
        "POST",
        "/v1/groups",
        json!({"topic": TOPIC, "name": "mine now", "members": []}),
    )
    .await;
    assert_eq!(status, 409, "the name of a group Redis forgot: {body}");
    let resp = reqwest::Client::new()
        .get(format!(
            "http://{}/v1/groups/{TOPIC}/messages",
            stack.gateway_addr(0)
        ))
        .bearer_auth(stack.token(9, "http"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403, "a stranger reads the history");
    // Its members still are.
    let (status, body) = send_as(&stack, 2, TOPIC, "member-after").await;
    assert_eq!(status, 202, "a member after the loss: {body}");
    assert_eq!(common::store_dlq_depth(stack.config()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lookups_of_unknown_names_are_counted_and_answered_for_every_gateway() {
    let mut stack = Stack::prepared(None).await;
    stack.world.config.limits.unknown_names = imstream::config::BucketConfig::new(20, 1);
    let (gw0, gw1) = (
        stack.start_gateway("gw0").await,
        stack.start_gateway("gw1").await,
    );
    let http = reqwest::Client::new();
    let read = |gw: std::net::SocketAddr, uid: i64, topic: String| {
        let http = http.clone();
        let token = stack.token(uid, "http");
        async move {
            http.get(format!("http://{gw}/v1/groups/{topic}/messages"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let mut answers = Vec::new();
    for i in 0..30 {
        answers.push(read(gw0, 5, format!("grpNoSuch{i}")).await);
    }
    let refused = answers.iter().filter(|s| **s == 403 || **s == 404).count();
    let limited = answers.iter().filter(|s| **s == 429).count();
    assert_eq!(
        (refused, limited),
        (20, 10),
        "20 lookups of made-up names, then 429: {answers:?}"
    );
    // A name found to be no group is known on every gateway, without a
    // lookup counted against anyone.
    let keys = imstream::keys::TopicKeys::new(stack.tenant(), "grpNoSuch0");
    let mut redis = stack.redis().await;
    let marked: bool = redis::cmd("EXISTS")
        .arg(keys.absent())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(marked, "the name's \"no such group\" marker");
    for _ in 0..30 {
        let status = read(gw1, 6, "grpNoSuch0".into()).await;
        assert!(status == 403 || status == 404, "{status}");
    }
    // Sends to made-up names count too.
    let token = stack.token(7, "http");
    let mut statuses = Vec::new();
    for i in 0..25 {
        let cmid = format!("c{i}");
        statuses.push(
            send_http(&http, gw0, &token, &format!("grpMadeUp{i}"), &cmid, "x")
                .await
                .0,
        );
    }
    assert!(
        statuses.iter().filter(|s| **s == 429).count() == 5,
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_part_of_a_group_model_lost_on_its_own_is_restored_not_decided_on() {
    let stack = everything(1).await;
    const TOPIC: &str = "grpPartial";
    stack.create_group(TOPIC, 1, &[2, 3]).await;
    let (status, body) = settled(
        &stack,
        1,
        "PUT",
        &format!("/v1/groups/{TOPIC}/members/2/mute"),
        json!({"until": "2999-01-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let (status, _) = send_as(&stack, 2, TOPIC, "muted-1").await;
    assert_eq!(status, 403, "a muted member");
    let keys = imstream::keys::TopicKeys::new(stack.tenant(), TOPIC);
    let mut redis = stack.redis().await;
    // Evicted alone: the mute is still in force.
    let _: () = redis::cmd("DEL")
        .arg(keys.mutes())
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, body) = send_as(&stack, 2, TOPIC, "muted-2").await;
    assert_eq!(status, 403, "a muted member once `mutes` was lost: {body}");
    // The owner's role lost alone: the owner still governs.
    let _: () = redis::cmd("DEL")
        .arg(keys.roles())
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, body) = settled(
        &stack,
        1,
        "DELETE",
        &format!("/v1/groups/{TOPIC}/members/3"),
        json!(null),
    )
    .await;
    assert_eq!(status, 202, "the owner kicks once `roles` was lost: {body}");
    let (status, _) = send_as(&stack, 3, TOPIC, "kicked").await;
    assert_eq!(status, 403, "the kicked member");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_that_could_evict_the_write_side_is_refused_at_start() {
    let stack = Stack::prepared(None).await;
    // A Redis of this test's own, with an eviction policy.
    let port = free_addr().port();
    let dir = std::env::temp_dir().join(format!("imstream-evicting-{}", stack.world.id));
    std::fs::create_dir_all(&dir).unwrap();
    let mut server = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(&dir)
        .args(["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server");
    let url = format!("redis://127.0.0.1:{port}");
    wait_for("the evicting Redis", Duration::from_secs(20), || {
        let url = url.clone();
        async move {
            imstream::redis_util::connect(&url)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let mut config = stack.config().clone();
    config.redis.url = url;
    let file = write_config_file(&config, &format!("evicting-{}", stack.world.id));
    for args in [
        vec!["gateway", "--listen", "127.0.0.1:0"],
        vec!["project", "store"],
    ] {
        let mut proc = Proc::spawn(&format!("evicting-{}", args[0]), &file, &args);
        let status = tokio::time::timeout(Duration::from_secs(60), proc.wait())
            .await
            .unwrap_or_else(|_| panic!("`imstream {}` started on an evicting Redis", args[0]));
        assert!(
            !status.success(),
            "`imstream {}` exited successfully",
            args[0]
        );
        let log = proc.log_text();
        assert!(
            log.contains("maxmemory-policy allkeys-lru") && log.contains("noeviction"),
            "`imstream {}` says why: {log}",
            args[0]
        );
    }
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_of_a_message_acknowledged_before_redis_forgot_gets_its_seq() {
    let mut stack = everything(1).await;
    const TOPIC: &str = "grpRetried";
    stack.create_group(TOPIC, 1, &[2]).await;
    // Stored: its claim is in the store's dedup rows.
    let (status, body) = send_as(&stack, 2, TOPIC, "stored-1").await;
    assert_eq!(status, 202, "{body}");
    let stored_seq = body["seq"].as_i64().unwrap();
    wait_for("stored-1 stored", Duration::from_secs(60), || {
        let pool = stack.pool();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM im_group_message_dedup WHERE client_msg_id = 'stored-1'",
            )
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if n == 1 {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        }
    })
    .await;
    // Acknowledged but only in the log: the store is stopped.
    stack.stop_pipeline("store").await;
    let (status, body) = send_as(&stack, 2, TOPIC, "in-log-1").await;
    assert_eq!(status, 202, "{body}");
    let in_log_seq = body["seq"].as_i64().unwrap();

    forget_tenant(&stack).await;
    for (cmid, seq) in [("in-log-1", in_log_seq), ("stored-1", stored_seq)] {
        let (status, body) = send_as(&stack, 2, TOPIC, cmid).await;
        assert_eq!(status, 202, "{body}");
        assert_eq!(
            (body["seq"].as_i64(), body["duplicate"].as_bool()),
            (Some(seq), Some(true)),
            "a retry of {cmid} after Redis forgot: {body}"
        );
    }
    // A new message goes on above every seq handed out.
    let (status, body) = send_as(&stack, 2, TOPIC, "new-1").await;
    assert_eq!(status, 202, "{body}");
    assert!(body["seq"].as_i64().unwrap() > in_log_seq, "{body}");
    stack.start_pipeline("store").await;
    wait_for("every message stored once", Duration::from_secs(60), || {
        let pool = stack.pool();
        async move {
            let rows: Vec<(imstream::exact::Exact, i64)> = sqlx::query_as(
                "SELECT client_msg_id, seqid FROM im_group_message_dedup WHERE topic = ? ORDER BY seqid",
            )
            .bind(TOPIC)
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
            let rows: Vec<(String, i64)> = rows.into_iter().map(|(c, s)| (c.into_string(), s)).collect();
            if rows.len() == 3 {
                Ok(rows)
            } else {
                Err(format!("{rows:?}"))
            }
        }
    })
    .await;
    let collisions: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_seq_collisions WHERE topic = ?")
            .bind(TOPIC)
            .fetch_one(&stack.pool())
            .await
            .unwrap();
    assert_eq!(collisions, 0);
}

/// One conversation's keys lost on their own (an operator's `DEL`, a slot
/// moved badly) while the tenant's restore marker stands: the marker's
/// pass began before the loss and did not put this claim back, so the
/// retry must wait for a pass begun after it, and get its seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_one_conversation_alone_lost_its_keys_gets_its_seq() {
    let mut stack = everything(1).await;
    const TOPIC: &str = "grpAlone";
    stack.create_group(TOPIC, 1, &[2]).await;
    let tenant = stack.tenant().to_string();
    let marker = imstream::keys::TenantKeys::new(&tenant).restore_done();
    wait_for(
        "the tenant's restore marker",
        Duration::from_secs(60),
        || {
            let marker = marker.clone();
            let stack = &stack;
            async move {
                let mut redis = stack.redis().await;
                let m: Option<String> = redis::cmd("GET")
                    .arg(&marker)
                    .query_async(&mut redis)
                    .await
                    .map_err(|e| e.to_string())?;
                m.ok_or_else(|| "no marker yet".to_string())
            }
        },
    )
    .await;
    stack.stop_pipeline("store").await;
    let (status, body) = send_as(&stack, 2, TOPIC, "alone-1").await;
    assert_eq!(status, 202, "{body}");
    let seq = body["seq"].as_i64().unwrap();
    // Only this conversation's allocator and the claim go; the marker
    // stays.
    let keys = TopicKeys::new(&tenant, TOPIC);
    let mut redis = stack.redis().await;
    let n: i64 = redis::cmd("DEL")
        .arg(keys.seq())
        .arg(keys.uniq(2, "alone-1"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(n, 2, "the allocator and the claim were there");
    let (status, body) = send_as(&stack, 2, TOPIC, "alone-1").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        (body["seq"].as_i64(), body["duplicate"].as_bool()),
        (Some(seq), Some(true)),
        "a retry after the conversation alone lost its keys: {body}"
    );
    stack.start_pipeline("store").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_ids_go_on_after_redis_forgot() {
    let stack = everything(1).await;
    const TOPIC: &str = "grpDelIds";
    stack.create_group(TOPIC, 1, &[2]).await;
    for i in 0..3 {
        let (status, _) = send_as(&stack, 1, TOPIC, &format!("m{i}")).await;
        assert_eq!(status, 202);
    }
    let clear = |low: i64| {
        let stack = &stack;
        async move {
            let (status, body) = settled(
                stack,
                2,
                "POST",
                &format!("/v1/groups/{TOPIC}/history/clear"),
                json!({"ranges": [{"low": low}]}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            body["del"].as_i64().expect("a delete id")
        }
    };
    let first = clear(1).await;
    forget_tenant(&stack).await;
    let second = clear(2).await;
    assert!(
        second > first,
        "delete ids after Redis forgot: {first} then {second}"
    );
}
