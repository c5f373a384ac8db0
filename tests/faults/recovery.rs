//! When Redis forgets, at scale (issue 38): 20,000 conversations — half
//! groups, half one-to-one chats — each with a message, then Redis is
//! killed and started again (AOF on: the ordinary restart), and later
//! emptied (`FLUSHALL`); after each, every conversation's sender sends one
//! more message, retrying every 0.5 s, as a client does. Printed per
//! round: the time until 25 / 50 / 90 / 99 / 100 % of the conversations
//! accepted a send, and how long each conversation waited from its first
//! attempt to its acceptance. Required: no conversation waits more than
//! 15 s, the round takes at most 15 s longer than the same round before
//! the fault, every acknowledged message stored once at its seq, no seq handed out
//! twice, no good send refused, nothing in a dead-letter queue. The rounds
//! are `imstream bench recovery`'s.

use imstream::bench::recovery::{reused, Round, Scenario};

use super::*;

const CONVERSATIONS: usize = 20_000;
/// No conversation waits longer than this for a send accepted.
const RECOVERED_WITHIN: Duration = Duration::from_secs(15);

/// A world whose gateway and store and members pipelines are processes
/// of the release build (what production runs: the bound is on the
/// service, and unoptimized code sends at a third of the rate): the
/// stack, the gateway's address, and the processes (killed when dropped).
async fn world(name: &str, redis_url: Option<String>) -> (Stack, SocketAddr, Vec<Proc>) {
    assert_same_instance();
    let stack = Stack::prepared_with(None, |c| {
        if let Some(url) = redis_url {
            c.redis.url = url;
        }
        // Every conversation's sender sends at once: the measurement is
        // the restore, not admission control (its own tests:
        // tests/security_limits.rs).
        c.limits.sends_in_flight = 0;
    })
    .await;
    let mut config = stack.config().clone();
    config.node.id = format!("recovery-{name}-{}", stack.world.id);
    let label = format!("recovery-{name}-{}", stack.world.id);
    let file = write_config_file(&config, &label);
    let mut procs: Vec<Proc> = ["store", "members"]
        .iter()
        .map(|p| Proc::spawn_release(&format!("{label}-{p}"), &file, &["project", p], "warn"))
        .collect();
    let addr = free_addr();
    let mut gateway = Proc::spawn_release(
        &label,
        &file,
        &["gateway", "--listen", &addr.to_string()],
        "warn",
    );
    let (_, exits) = gateway.supervise_until_serving(addr).await;
    assert!(exits.is_empty(), "the gateway exited: {exits:?}");
    procs.push(gateway);
    (stack, addr, procs)
}

/// Asserts the round's promise and prints its line. With `baseline` (the
/// same round before the fault): no conversation waited longer than the
/// bound from its first attempt to its acceptance, and the whole round took
/// at most the bound longer than the baseline. The round itself, 20,000
/// sends with 256 in flight, takes this box ~30 s without any fault: that
/// is the sender's pace, not what the fault cost.
fn check_round(label: &str, round: &Round, baseline: Option<&Round>) {
    println!("{}", round.line(label, CONVERSATIONS));
    assert!(
        round.refused.is_empty(),
        "{label}: good sends refused: {:?}",
        &round.refused[..round.refused.len().min(5)]
    );
    assert!(
        round.not_accepted.is_empty(),
        "{label}: {} conversations never accepted a send, e.g. {:?}",
        round.not_accepted.len(),
        round.not_accepted.first()
    );
    if let Some(baseline) = baseline {
        let longest = round.wait_quantile(1.0).expect("accepted sends");
        assert!(
            longest <= RECOVERED_WITHIN,
            "{label}: every conversation must send again within {RECOVERED_WITHIN:?} of its first attempt; one waited {longest:?}"
        );
        let (all, pace) = (
            round.quantile(1.0).expect("accepted sends"),
            baseline.quantile(1.0).expect("baseline sends"),
        );
        assert!(
            all <= pace + RECOVERED_WITHIN,
            "{label}: the round took {all:?}, more than {RECOVERED_WITHIN:?} over the {pace:?} it takes without the fault"
        );
    }
}

/// Every acknowledged message stored once, at its acknowledged seq (the
/// store's dedup rows are written with the month row), no `(topic, seq)`
/// held twice, nothing in a dead-letter queue.
async fn verify_stored(stack: &Stack, rounds: &[&Round]) {
    let twice = reused(rounds);
    assert!(
        twice.is_empty(),
        "seqs handed out twice: {:?}",
        &twice[..twice.len().min(5)]
    );
    let pool = stack.pool();
    let acked: HashMap<(String, String), i64> = rounds
        .iter()
        .flat_map(|r| r.acked.iter())
        .map(|(t, c, s)| ((t.clone(), c.clone()), *s))
        .collect();
    let rows = wait_for(
        "every acknowledged message stored",
        Duration::from_secs(300),
        || {
            let pool = pool.clone();
            let acked = &acked;
            async move {
                let rows: Vec<(imstream::exact::Exact, imstream::exact::Exact, i64)> =
                    sqlx::query_as(
                        "SELECT topic, client_msg_id, seqid FROM im_group_message_dedup",
                    )
                    .fetch_all(&pool)
                    .await
                    .map_err(|e| e.to_string())?;
                let stored: HashMap<(String, String), i64> = rows
                    .into_iter()
                    .map(|(t, c, s)| ((t.into_string(), c.into_string()), s))
                    .collect();
                let missing = acked.keys().filter(|k| !stored.contains_key(*k)).count();
                if missing == 0 {
                    Ok(stored)
                } else {
                    Err(format!("{missing} of {} not stored yet", acked.len()))
                }
            }
        },
    )
    .await;
    let wrong: Vec<_> = acked
        .iter()
        .filter(|(k, seq)| rows.get(*k) != Some(seq))
        .take(5)
        .collect();
    assert!(
        wrong.is_empty(),
        "stored at another seq than acknowledged: {wrong:?}"
    );
    let collisions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM im_seq_collisions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(collisions, 0, "a (topic, seq) held by two messages");
    let dlq = common::store_dlq_depth(stack.config()).await;
    assert_eq!(dlq, 0, "records in the store's dead-letter queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restart_with_20000_conversations() {
    let _serial = SERIAL.lock().await;
    let (stack, addr, procs) = world("restart", None).await;
    let started = Instant::now();
    let scenario = Scenario::prepare(
        stack.config(),
        &format!("http://{addr}"),
        stack.tenant(),
        CONVERSATIONS,
        256,
    )
    .await
    .expect("conversations");
    let before = scenario.round("before", Duration::from_secs(600)).await;
    eprintln!(
        "[faults] {CONVERSATIONS} conversations created and filled in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    check_round("fault=redis_restart before", &before, None);

    {
        let mut redis = ServiceDown::kill("redis").await;
        redis.start().await;
    }
    let restarted = scenario.round("restart", Duration::from_secs(120)).await;
    check_round(
        "fault=redis_restart_with_20000_conversations",
        &restarted,
        Some(&before),
    );

    let mut redis = stack.redis().await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut redis)
        .await
        .unwrap();
    let flushed = scenario.round("flush", Duration::from_secs(120)).await;
    check_round(
        "fault=redis_flushall_with_20000_conversations",
        &flushed,
        Some(&before),
    );
    // Each later message took a higher seq than the one before it.
    let seq_of = |round: &Round| -> HashMap<String, i64> {
        round
            .acked
            .iter()
            .map(|(t, _, s)| (t.clone(), *s))
            .collect()
    };
    let (b, r, f) = (seq_of(&before), seq_of(&restarted), seq_of(&flushed));
    let backwards: Vec<_> = b
        .iter()
        .filter(|(t, s)| r.get(*t).is_none_or(|r| r <= s) || f.get(*t).is_none_or(|f| f <= &r[*t]))
        .take(5)
        .collect();
    assert!(
        backwards.is_empty(),
        "a later message got a seq not above the earlier one: {backwards:?}"
    );
    verify_stored(&stack, &[&before, &restarted, &flushed]).await;
    drop(procs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_replica_promoted_with_20000_conversations() {
    let _serial = SERIAL.lock().await;
    assert!(
        stack_cmd(&["redis-ha", "up"]),
        "docker/local/stack redis-ha up"
    );
    let url = rollback::stack_output(&["redis-ha", "url"]);
    let (stack, addr, procs) = world("cluster", Some(url.clone())).await;
    let scenario = Scenario::prepare(
        stack.config(),
        &format!("http://{addr}"),
        stack.tenant(),
        CONVERSATIONS,
        256,
    )
    .await
    .expect("conversations");
    let before = scenario.round("before", Duration::from_secs(600)).await;
    check_round("fault=redis_cluster_promoted before", &before, None);
    // A primary's replica falls behind (paused, its link dropped), then
    // the primary dies and the cluster promotes what the replica had.
    let seq_key = TopicKeys::new(stack.tenant(), &scenario.conversations[0].topic).seq();
    let (primary, replica) = rollback::primary_and_replica(&url, &seq_key);
    assert!(stack_cmd(&[
        "redis-ha",
        "signal",
        &replica.to_string(),
        "STOP"
    ]));
    let dropped = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &primary.to_string()])
        .args(["CLIENT", "KILL", "TYPE", "replica"])
        .output()
        .expect("redis-cli");
    assert!(dropped.status.success(), "CLIENT KILL TYPE replica");
    // What the lagging replica will not have: a round of sends.
    let lagged = scenario.round("lagged", Duration::from_secs(600)).await;
    check_round("fault=redis_cluster_promoted while lagging", &lagged, None);
    assert!(stack_cmd(&[
        "redis-ha",
        "signal",
        &primary.to_string(),
        "KILL"
    ]));
    assert!(stack_cmd(&[
        "redis-ha",
        "signal",
        &replica.to_string(),
        "CONT"
    ]));
    // The cluster notices and promotes (its node timeout); from when the
    // promoted replica answers as a primary, every conversation must send
    // again within the bound.
    wait_for(
        "the replica promoted",
        Duration::from_secs(60),
        || async move {
            let out = std::process::Command::new("redis-cli")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &replica.to_string(),
                    "INFO",
                    "replication",
                ])
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if text.contains("role:master") {
                Ok(())
            } else {
                Err(text
                    .lines()
                    .find(|l| l.starts_with("role:"))
                    .unwrap_or("")
                    .to_string())
            }
        },
    )
    .await;
    let promoted = scenario.round("promoted", Duration::from_secs(180)).await;
    check_round(
        "fault=redis_cluster_replica_promoted_with_20000_conversations",
        &promoted,
        Some(&before),
    );
    verify_stored(&stack, &[&before, &lagged, &promoted]).await;
    drop(procs);
    drop(stack);
    stack_cmd(&["redis-ha", "down"]);
}
