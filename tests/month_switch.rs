//! Seed 000 §12 acceptance tests around a month switch, against the real
//! services, with the shard manager's clock driven across
//! 2026-09-30 → 2026-10-01:
//!
//! - (1) messages just before and just after the switch land in their own
//!   month tables and their seqs stay consecutive;
//! - (2) an event the store pipeline consumes only after the switch still
//!   lands in the month fixed in the event;
//! - (3) the same client_msg_id retried across the switch is stored once and
//!   answered with the same seq;
//! - (15) two gateways across the switch: one active month, no seq reused,
//!   month segments that never overlap.
//!
//! The shard pass at the September clock creates 202608..202611; the one at
//! the October clock moves the active month to 202610. Gateways cache the
//! active month for up to a second, so "after the switch" is established by
//! sending until a message is stored in 202610, never by sleeping.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::MySqlPool;

use common::{send_http, wait_for, Stack};

const SEPTEMBER_CLOCK: &str = "2026-09-30T23:59:00Z";
const OCTOBER_CLOCK: &str = "2026-10-01T00:00:05Z";
const SEP: &str = "202609";
const OCT: &str = "202610";

/// A stack at 2026-09-30 23:59 with the store and members pipelines and
/// `gateways` gateways.
async fn september_stack(gateways: usize) -> Stack {
    let mut stack = Stack::prepared(Some(SEPTEMBER_CLOCK)).await;
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    for i in 0..gateways {
        stack.start_gateway(&format!("node-{i}")).await;
    }
    stack
}

/// Sends one message, retrying a retryable refusal (503) with the same
/// client_msg_id as a client would; returns the acked seq.
async fn send_acked(
    client: &reqwest::Client,
    addr: SocketAddr,
    token: &str,
    topic: &str,
    cmid: &str,
) -> (i64, bool) {
    wait_for(
        &format!("{cmid} acked on {topic}"),
        Duration::from_secs(60),
        || async move {
            let (status, body) = send_http(client, addr, token, topic, cmid, cmid).await;
            match status {
                202 => Ok((
                    body["seq"].as_i64().expect("seq"),
                    body["duplicate"].as_bool().unwrap_or(false),
                )),
                503 if body["params"]["retry"] == serde_json::json!(true) => {
                    Err(format!("503 {body}"))
                }
                other => panic!("send {cmid} refused: {other} {body}"),
            }
        },
    )
    .await
}

/// `(seq, client_msg_id)` of a topic's rows in one month table.
async fn rows(pool: &MySqlPool, month: &str, topic: &str) -> Vec<(i64, String)> {
    sqlx::query_as(&format!(
        "SELECT seqid, CAST(client_msg_id AS CHAR) FROM im_group_messages_{month} WHERE topic = ? ORDER BY seqid"
    ))
    .bind(topic)
    .fetch_all(pool)
    .await
    .expect("month table readable")
}

/// The mirror rows of a topic: month → (min_seq, max_seq, count).
async fn mirror(pool: &MySqlPool, topic: &str) -> BTreeMap<String, (i64, i64, i64)> {
    let rows: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT shard_month, min_seq, max_seq, message_count FROM im_group_message_topic_shards \
         WHERE topic = ? ORDER BY shard_month",
    )
    .bind(topic)
    .fetch_all(pool)
    .await
    .expect("mirror readable");
    rows.into_iter()
        .map(|(m, lo, hi, n)| (m, (lo, hi, n)))
        .collect()
}

/// Waits until `seq` of `topic` is stored and returns the month it is in.
async fn stored_month(pool: &MySqlPool, topic: &str, seq: i64) -> String {
    wait_for(
        &format!("{topic} seq {seq} stored"),
        Duration::from_secs(30),
        || async move {
            for month in [SEP, OCT] {
                let n: i64 = sqlx::query_scalar(&format!(
                    "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ? AND seqid = ?"
                ))
                .bind(topic)
                .bind(seq)
                .fetch_one(pool)
                .await
                .map_err(|e| e.to_string())?;
                if n > 0 {
                    return Ok(month.to_string());
                }
            }
            Err("not stored yet".into())
        },
    )
    .await
}

/// Sends probe messages through `addr` until one is stored in October (the
/// gateway's cached active month has caught up); returns the probes as
/// `(seq, cmid, month)`.
async fn send_until_october(
    pool: &MySqlPool,
    client: &reqwest::Client,
    addr: SocketAddr,
    token: &str,
    topic: &str,
    prefix: &str,
) -> Vec<(i64, String, String)> {
    let mut probes = Vec::new();
    for i in 0.. {
        let cmid = format!("{prefix}-{i}");
        let (seq, _) = send_acked(client, addr, token, topic, &cmid).await;
        let month = stored_month(pool, topic, seq).await;
        probes.push((seq, cmid, month.clone()));
        if month == OCT {
            return probes;
        }
        assert!(i < 200, "gateway {addr} never moved to {OCT}: {probes:?}");
    }
    unreachable!()
}

async fn wait_rows(pool: &MySqlPool, month: &str, topic: &str, expected: usize) {
    wait_for(
        &format!("{expected} rows of {topic} in {month}"),
        Duration::from_secs(30),
        || async move {
            let got = rows(pool, month, topic).await;
            if got.len() == expected {
                Ok(())
            } else {
                Err(format!("{} rows: {got:?}", got.len()))
            }
        },
    )
    .await
}

/// (1) Seed example: `2026-09-30 23:59:59 seq=10086 -> 202609`,
/// `2026-10-01 00:00:00 seq=10087 -> 202610`.
#[tokio::test]
async fn messages_around_the_switch_land_in_their_month_with_consecutive_seqs() {
    let stack = september_stack(1).await;
    let topic = "grpSwitch";
    stack.create_group(topic, 1, &[2, 3]).await;
    let pool = stack.pool();
    let client = reqwest::Client::new();
    let addr = stack.gateway_addr(0);
    let token = stack.token(2, "web");

    let mut before = Vec::new();
    for i in 0..5 {
        let cmid = format!("sep-{i}");
        let (seq, dup) = send_acked(&client, addr, &token, topic, &cmid).await;
        assert!(!dup);
        before.push((seq, cmid));
    }
    assert_eq!(
        before.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );

    stack.shard_pass(Some(OCTOBER_CLOCK)).await;
    let mut redis = stack.redis().await;
    let active: String = redis::cmd("GET")
        .arg(imstream::keys::TenantKeys::new(stack.tenant()).active_month())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(active, OCT);

    // Until the gateway's cached month expires, sends still go to September;
    // the first one stored in October marks the switch for this topic.
    let probes = send_until_october(&pool, &client, addr, &token, topic, "probe").await;
    let mut after = Vec::new();
    for i in 0..5 {
        let cmid = format!("oct-{i}");
        let (seq, _) = send_acked(&client, addr, &token, topic, &cmid).await;
        after.push((seq, cmid));
    }

    let mut expected_sep = before.clone();
    let mut expected_oct = Vec::new();
    for (seq, cmid, month) in &probes {
        if month == SEP {
            expected_sep.push((*seq, cmid.clone()));
        } else {
            expected_oct.push((*seq, cmid.clone()));
        }
    }
    expected_oct.extend(after.iter().cloned());
    wait_rows(&pool, OCT, topic, expected_oct.len()).await;

    let sep_rows = rows(&pool, SEP, topic).await;
    let oct_rows = rows(&pool, OCT, topic).await;
    assert_eq!(sep_rows, expected_sep, "September table");
    assert_eq!(oct_rows, expected_oct, "October table");
    // Consecutive across the switch: 1..=n with no gap and no overlap.
    let all: Vec<i64> = sep_rows.iter().chain(&oct_rows).map(|r| r.0).collect();
    let n = all.len() as i64;
    assert_eq!(all, (1..=n).collect::<Vec<_>>());
    let last_sep = sep_rows.last().unwrap().0;
    assert_eq!(oct_rows.first().unwrap().0, last_sep + 1);

    // The route mirror and the Redis route agree with the tables.
    let m = mirror(&pool, topic).await;
    assert_eq!(
        m,
        BTreeMap::from([
            (SEP.to_string(), (1, last_sep, last_sep)),
            (OCT.to_string(), (last_sep + 1, n, n - last_sep)),
        ])
    );
    let keys = imstream::keys::TopicKeys::new(stack.tenant(), topic);
    let route: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(keys.route())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        route,
        vec![(SEP.to_string(), 1), (OCT.to_string(), last_sep + 1)]
    );
}

/// (2) The store pipeline is down across the switch: September events
/// consumed in October still go to 202609 (now `sealing`).
#[tokio::test]
async fn an_event_consumed_after_the_switch_lands_in_its_own_month() {
    let mut stack = september_stack(1).await;
    let topic = "grpLate";
    stack.create_group(topic, 1, &[2]).await;
    let pool = stack.pool();
    let client = reqwest::Client::new();
    let addr = stack.gateway_addr(0);
    let token = stack.token(2, "web");

    stack.stop_pipeline("store").await;
    let mut sent = Vec::new();
    for i in 0..3 {
        let cmid = format!("late-{i}");
        let (seq, _) = send_acked(&client, addr, &token, topic, &cmid).await;
        sent.push((seq, cmid));
    }
    assert_eq!(rows(&pool, SEP, topic).await, vec![], "nothing stored yet");

    stack.shard_pass(Some(OCTOBER_CLOCK)).await;
    let status: String =
        sqlx::query_scalar("SELECT status FROM im_group_message_shards WHERE shard_month = ?")
            .bind(SEP)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "sealing");

    stack.start_pipeline("store").await;
    wait_rows(&pool, SEP, topic, 3).await;
    assert_eq!(rows(&pool, SEP, topic).await, sent);
    assert_eq!(rows(&pool, OCT, topic).await, vec![]);
    assert_eq!(
        mirror(&pool, topic).await,
        BTreeMap::from([(SEP.to_string(), (1, 3, 3))])
    );
}

/// (3) A client_msg_id acked in September and retried after the switch is
/// answered with its September seq and stored once; a retry that reached
/// the log with a new seq in October (its Redis claim gone, so the seq is
/// left a hole) is not stored a second time either.
#[tokio::test]
async fn a_client_msg_id_retried_across_the_switch_is_stored_once() {
    let stack = september_stack(1).await;
    let topic = "grpRetry";
    stack.create_group(topic, 1, &[2]).await;
    let pool = stack.pool();
    let client = reqwest::Client::new();
    let addr = stack.gateway_addr(0);
    let token = stack.token(2, "web");

    let (first, dup) = send_acked(&client, addr, &token, topic, "boundary").await;
    assert_eq!((first, dup), (1, false));
    assert_eq!(stored_month(&pool, topic, first).await, SEP);

    stack.shard_pass(Some(OCTOBER_CLOCK)).await;
    let probes = send_until_october(&pool, &client, addr, &token, topic, "probe").await;

    // The retry, now that this gateway writes October.
    let (status, body) = send_http(&client, addr, &token, topic, "boundary", "boundary").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["seq"], serde_json::json!(first));
    assert_eq!(body["duplicate"], serde_json::json!(true));

    // Once its Redis claim is gone (expired, or lost with Redis), a retry
    // is allocated a new seq in the new month and reaches the log again:
    // the cross-month dedup table keeps it out of 202610.
    let claim = imstream::keys::TopicKeys::new(stack.tenant(), topic).uniq(2, "boundary");
    let mut redis = stack.redis().await;
    let removed: i64 = redis::cmd("DEL")
        .arg(&claim)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(removed, 1, "the claim existed");
    let (again, dup) = send_acked(&client, addr, &token, topic, "boundary").await;
    assert!(
        !dup && again > probes.last().unwrap().0,
        "a new seq: {again}"
    );
    // A later message of the same topic (same partition) is stored only
    // after the retried one was handled.
    let (marker, _) = send_acked(&client, addr, &token, topic, "marker").await;
    assert_eq!(marker, again + 1);
    assert_eq!(stored_month(&pool, topic, marker).await, OCT);

    let mut found = Vec::new();
    for month in [SEP, OCT] {
        for (seq, cmid) in rows(&pool, month, topic).await {
            if cmid == "boundary" {
                found.push((month.to_string(), seq));
            }
        }
    }
    assert_eq!(found, vec![(SEP.to_string(), first)], "stored exactly once");
    let dedup: Vec<(i64, String)> = sqlx::query_as(
        "SELECT seqid, shard_month FROM im_group_message_dedup WHERE topic = ? AND client_msg_id = 'boundary'",
    )
    .bind(topic)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dedup, vec![(first, SEP.to_string())]);
    // Mirror counts only real rows: the duplicate added nothing.
    let m = mirror(&pool, topic).await;
    let counted: i64 = m.values().map(|v| v.2).sum();
    let stored = rows(&pool, SEP, topic).await.len() + rows(&pool, OCT, topic).await.len();
    assert_eq!(counted, stored as i64);
}

/// One acked send of the concurrency test.
#[derive(Debug, Clone)]
struct Ack {
    topic: String,
    seq: i64,
    cmid: String,
}

/// (15) Two gateways keep sending to shared topics while the month
/// switches: Lua hands out one month per topic at a time, no seq twice,
/// and month segments do not overlap (months grow with seqs).
#[tokio::test]
async fn two_gateways_across_the_switch_share_one_month_and_never_reuse_a_seq() {
    let stack = september_stack(2).await;
    let shared = ["grpMultiA", "grpMultiB", "grpMultiC"];
    let members: Vec<i64> = (2..=9).collect();
    for topic in shared {
        stack.create_group(topic, 1, &members).await;
    }
    // A private probe topic per gateway proves each one picked up October.
    let probe_topics = ["grpProbe0", "grpProbe1"];
    for topic in probe_topics {
        stack.create_group(topic, 1, &members).await;
    }
    let pool = stack.pool();
    let client = reqwest::Client::new();
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));

    // Two senders per (topic, gateway), users 2..=9.
    let mut tasks = Vec::new();
    for topic in shared {
        for gw in 0..2 {
            for _ in 0..2 {
                let (client, acks, stop) = (client.clone(), acks.clone(), stop.clone());
                let addr = stack.gateway_addr(gw);
                let me = 2 + (tasks.len() as i64 % 8);
                let token = stack.token(me, "web");
                let topic = topic.to_string();
                let tag = tasks.len();
                tasks.push(tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let cmid = format!("s{tag}-u{me}-{i}");
                        let (seq, dup) = send_acked(&client, addr, &token, &topic, &cmid).await;
                        assert!(!dup, "{cmid} is new");
                        acks.lock().unwrap().push(Ack {
                            topic: topic.clone(),
                            seq,
                            cmid,
                        });
                        i += 1;
                    }
                }));
            }
        }
    }

    let acked = |n: usize| {
        let acks = acks.clone();
        async move {
            let got = acks.lock().unwrap().len();
            if got >= n {
                Ok(got)
            } else {
                Err(format!("{got} acks"))
            }
        }
    };
    let before_switch = wait_for("sends before the switch", Duration::from_secs(60), || {
        acked(60)
    })
    .await;

    stack.shard_pass(Some(OCTOBER_CLOCK)).await;
    let mut probes = Vec::new();
    for (gw, topic) in probe_topics.iter().enumerate() {
        let token = stack.token(1, "probe");
        probes.push(
            send_until_october(
                &pool,
                &client,
                stack.gateway_addr(gw),
                &token,
                topic,
                &format!("probe{gw}"),
            )
            .await,
        );
    }
    // Both gateways write October now; let the senders go on for a while.
    let _ = wait_for("sends after the switch", Duration::from_secs(60), || {
        acked(before_switch + 120)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("sender");
    }
    let acks = acks.lock().unwrap().clone();

    let mut by_topic: HashMap<&str, Vec<&Ack>> = HashMap::new();
    for a in &acks {
        by_topic.entry(a.topic.as_str()).or_default().push(a);
    }
    for topic in shared {
        let topic_acks = &by_topic[topic];
        // No seq handed out twice, across both gateways.
        let mut holders: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
        for a in topic_acks {
            holders.entry(a.seq).or_default().push(&a.cmid);
        }
        let reused: Vec<_> = holders.iter().filter(|(_, c)| c.len() > 1).collect();
        assert!(
            reused.is_empty(),
            "{topic}: seqs acked more than once: {reused:?}"
        );

        let expected = topic_acks.len();
        wait_for(
            &format!("{topic}: all acked stored"),
            Duration::from_secs(60),
            || {
                let pool = pool.clone();
                async move {
                    let n =
                        rows(&pool, SEP, topic).await.len() + rows(&pool, OCT, topic).await.len();
                    if n == expected {
                        Ok(())
                    } else {
                        Err(format!("{n} of {expected}"))
                    }
                }
            },
        )
        .await;
        let sep = rows(&pool, SEP, topic).await;
        let oct = rows(&pool, OCT, topic).await;
        assert!(
            !sep.is_empty() && !oct.is_empty(),
            "{topic} spans both months"
        );
        // Every acked message stored once, under its acked seq.
        let stored: HashMap<String, i64> = sep
            .iter()
            .chain(&oct)
            .map(|(s, c)| (c.clone(), *s))
            .collect();
        assert_eq!(stored.len(), expected);
        for a in topic_acks {
            assert_eq!(stored.get(&a.cmid), Some(&a.seq), "{topic}: {}", a.cmid);
        }
        // Month segments never overlap and never go back.
        let sep_max = sep.iter().map(|r| r.0).max().unwrap();
        let oct_min = oct.iter().map(|r| r.0).min().unwrap();
        assert!(
            sep_max < oct_min,
            "{topic}: September reaches {sep_max}, October starts at {oct_min}"
        );
        let m = mirror(&pool, topic).await;
        let segments: Vec<(&String, &(i64, i64, i64))> = m.iter().collect();
        assert_eq!(segments.len(), 2, "{topic}: {m:?}");
        assert_eq!(*segments[0].1, (1, sep_max, sep.len() as i64), "{topic}");
        assert_eq!(
            *segments[1].1,
            (
                oct_min,
                oct.iter().map(|r| r.0).max().unwrap(),
                oct.len() as i64
            ),
            "{topic}"
        );
    }
    // The probe topics too: one switch each, September strictly below October.
    for (gw, topic) in probe_topics.iter().enumerate() {
        let p = &probes[gw];
        let oct_seq = p.last().unwrap().0;
        assert!(p[..p.len() - 1]
            .iter()
            .all(|(s, _, m)| m == SEP && *s < oct_seq));
        let m = mirror(&pool, topic).await;
        if let (Some(sep), Some(oct)) = (m.get(SEP), m.get(OCT)) {
            assert!(sep.1 < oct.0, "{topic}: {m:?}");
        }
    }
    // One active month for the tenant.
    let mut redis = stack.redis().await;
    let active: String = redis::cmd("GET")
        .arg(imstream::keys::TenantKeys::new(stack.tenant()).active_month())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(active, OCT);
}

/// (15) One month for every topic at once: a gateway that has just read
/// the active month (and keeps it for up to a second) sends to two topics
/// of the tenant right after the shard manager switched to October; both
/// land in October at once, no message of either after the switch in
/// September. On one Redis server the allocation script reads the active
/// month itself; on a Redis Cluster it decides by the switch the manager
/// announced ahead (`lua/allocate_seq.lua`).
#[tokio::test]
async fn right_after_the_switch_every_topic_of_the_tenant_gets_the_new_month() {
    let stack = september_stack(1).await;
    let (first, second) = ("grpFirst", "grpSecond");
    stack.create_group(first, 1, &[2]).await;
    stack.create_group(second, 1, &[2]).await;
    let pool = stack.pool();
    let client = reqwest::Client::new();
    let addr = stack.gateway_addr(0);
    let token = stack.token(2, "web");

    // The gateway reads (and caches) September just before the switch.
    let (seq, _) = send_acked(&client, addr, &token, first, "warm").await;
    assert_eq!(stored_month(&pool, first, seq).await, SEP);
    stack.shard_pass(Some(OCTOBER_CLOCK)).await;

    // The very next sends, to the topic already sent to and to another
    // one, are October's: no second of September left on any node.
    for (topic, cmid) in [(second, "after-1"), (first, "after-2"), (second, "after-3")] {
        let (seq, _) = send_acked(&client, addr, &token, topic, cmid).await;
        assert_eq!(
            stored_month(&pool, topic, seq).await,
            OCT,
            "{cmid} to {topic} (seq {seq}) right after the switch"
        );
    }
    // The announcement is gone once the switch is done.
    let mut redis = stack.redis().await;
    let announced: Option<String> = redis::cmd("GET")
        .arg(imstream::keys::TenantKeys::new(stack.tenant()).month_switch())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(announced, None);
}

/// A switch announced for an instant still ahead: sends before it keep the
/// active month, sends from it on get the announced one, whatever the
/// gateway cached (what a Redis Cluster relies on, tested here on whichever
/// Redis the suite runs against).
#[tokio::test]
async fn an_announced_switch_takes_effect_at_its_instant_of_the_redis_clock() {
    let stack = september_stack(1).await;
    let topic = "grpAnnounced";
    stack.create_group(topic, 1, &[2]).await;
    let pool = stack.pool();
    let client = reqwest::Client::new();
    let addr = stack.gateway_addr(0);
    let token = stack.token(2, "web");
    let mut redis = stack.redis().await;
    let now = imstream::redis_util::redis_now_ms(&mut redis)
        .await
        .unwrap();
    let at_ms = now + 3_000;
    imstream::store::clock::announce_switch(
        &mut redis,
        stack.tenant(),
        imstream::store::clock::MonthSwitch {
            month: imstream::store::month::ShardMonth::parse(OCT).unwrap(),
            at_ms,
        },
    )
    .await
    .unwrap();
    let (before, _) = send_acked(&client, addr, &token, topic, "before").await;
    let sent_at = imstream::redis_util::redis_now_ms(&mut redis)
        .await
        .unwrap();
    assert!(sent_at < at_ms, "the first send took too long to test this");
    assert_eq!(stored_month(&pool, topic, before).await, SEP);
    while imstream::redis_util::redis_now_ms(&mut redis)
        .await
        .unwrap()
        < at_ms
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (after, _) = send_acked(&client, addr, &token, topic, "after").await;
    assert_eq!(stored_month(&pool, topic, after).await, OCT);
    // The active month itself has not moved: only the announcement says
    // October, and a shard pass finishes it.
    let active: String = redis::cmd("GET")
        .arg(imstream::keys::TenantKeys::new(stack.tenant()).active_month())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(active, SEP);
}
