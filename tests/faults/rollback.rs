//! Engines that come back with less than they acknowledged (issue 29): a
//! Redis restored from a copy of its AOF taken seconds earlier, a Redis
//! Cluster replica promoted while it lagged, the tenant's MariaDB replaced by
//! its lagging replica. Each under the suite's load of sends with client ids,
//! checked by [`System::verify`]: every acknowledged id stored once at its
//! acknowledged seq, no seq acknowledged twice, once in history and live,
//! nothing in a DLQ.

use std::path::Path;

use super::*;

/// The stack script's state folder (where Redis keeps its AOF).
fn stack_dir() -> PathBuf {
    std::env::var("IMSTREAM_STACK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| common::repo_root().join(".stack"))
}

/// `docker/local/stack ARGS…`'s standard output (a URL), or a panic.
pub(super) fn stack_output(args: &[&str]) -> String {
    let out = std::process::Command::new("bash")
        .arg(stack_script())
        .args(args)
        .output()
        .expect("docker/local/stack");
    assert!(out.status.success(), "docker/local/stack {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restored_from_an_aof_copy_taken_seconds_earlier() {
    let _serial = SERIAL.lock().await;
    let sys = System::start("redis-restore").await;
    let load = sys.load(RATE);
    load.wait_acked(BEFORE).await;
    // The copy a host crash or a restore from backup would bring back.
    let aof = stack_dir().join("redis/appendonlydir");
    let copy = std::env::temp_dir().join(format!("imstream-aof-{}", sys.stack.world.id));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&aof, &copy);
    let at_copy = load.acked_now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let at_kill = load.acked_now();
    {
        let mut redis = ServiceDown::kill("redis").await;
        std::fs::remove_dir_all(&aof).unwrap();
        copy_dir(&copy, &aof);
        redis.start().await;
    }
    let _ = std::fs::remove_dir_all(&copy);
    eprintln!(
        "[faults] redis-restore: {} acked after the copy, before the kill",
        at_kill - at_copy
    );
    // The fenced re-seed waits out the in-flight window before sends go on.
    let outcome = load.finish_after(3 * AFTER).await;
    // The hot set went back with the rest of Redis.
    let mut report = sys
        .verify(
            &outcome,
            Expect {
                hot_complete: false,
            },
        )
        .await;
    report.failures.extend(outcome.failures());
    report.assert();
}

/// The primary of the Redis Cluster that owns `key`, and its replica:
/// their ports.
pub(super) fn primary_and_replica(url: &str, key: &str) -> (u16, u16) {
    let first = url
        .trim_start_matches("redis+cluster://")
        .split(',')
        .next()
        .unwrap()
        .to_string();
    let port: u16 = first.rsplit(':').next().unwrap().parse().unwrap();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let slot: u16 = cli(&["cluster", "keyslot", key]).parse().unwrap();
    let nodes = cli(&["cluster", "nodes"]);
    let port_of = |line: &str| -> u16 {
        let addr = line.split(' ').nth(1).unwrap();
        addr.split(['@', ':']).nth(1).unwrap().parse().unwrap()
    };
    let primary = nodes
        .lines()
        .find(|l| {
            l.contains("master")
                && l.split(' ').skip(8).any(|range| {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
                })
        })
        .unwrap_or_else(|| panic!("no primary holds slot {slot}: {nodes}"));
    let id = primary.split(' ').next().unwrap();
    let replica = nodes
        .lines()
        .find(|l| l.contains("slave") && l.split(' ').nth(3) == Some(id))
        .unwrap_or_else(|| panic!("the primary of slot {slot} has no replica: {nodes}"));
    (port_of(primary), port_of(replica))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster_replica_promoted_while_it_lagged() {
    let _serial = SERIAL.lock().await;
    assert!(
        stack_cmd(&["redis-ha", "up"]),
        "docker/local/stack redis-ha up"
    );
    let url = stack_output(&["redis-ha", "url"]);
    let sys = System::start_with("redis-failover", |c| c.redis.url = url.clone()).await;
    let seq_key = TopicKeys::new(sys.stack.tenant(), &sys.topic).seq();
    let (primary, replica) = primary_and_replica(&url, &seq_key);
    let load = sys.load(RATE);
    load.wait_acked(BEFORE / 2).await;
    // The replica falls behind (paused), sends go on, the primary dies,
    // and the cluster promotes what the replica had.
    assert!(stack_cmd(&[
        "redis-ha",
        "signal",
        &replica.to_string(),
        "STOP"
    ]));
    // The primary drops its link to the paused replica: what the replica's
    // socket already holds is all it will have (otherwise it would catch up
    // from its receive buffer on resuming, and not lag at all).
    let dropped = std::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &primary.to_string()])
        .args(["CLIENT", "KILL", "TYPE", "replica"])
        .output()
        .expect("redis-cli");
    assert!(dropped.status.success(), "CLIENT KILL TYPE replica");
    let at_pause = load.acked_now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let at_kill = load.acked_now();
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
    eprintln!(
        "[faults] redis-failover: {} acked while the replica of :{primary} (:{replica}) was paused",
        at_kill - at_pause
    );
    let outcome = load.finish_after(3 * AFTER).await;
    let mut report = sys
        .verify(
            &outcome,
            Expect {
                hot_complete: false,
            },
        )
        .await;
    report.failures.extend(outcome.failures());
    drop(sys);
    stack_cmd(&["redis-ha", "down"]);
    report.assert();
}

/// A TCP forwarder standing for the address a tenant's database is reached
/// at (a virtual IP, a proxy): [`Vip::point_at`] moves it to another server
/// and drops the connections to the old one, as a failover does.
struct Vip {
    addr: SocketAddr,
    upstream: Arc<Mutex<(SocketAddr, u64)>>,
    task: tokio::task::JoinHandle<()>,
}

impl Vip {
    async fn start(upstream: SocketAddr) -> Vip {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new((upstream, 0u64)));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let (target, generation) = *shared.lock().unwrap();
                let shared = shared.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let moved = async {
                        loop {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            if shared.lock().unwrap().1 != generation {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = moved => {}
                    }
                });
            }
        });
        Vip {
            addr,
            upstream: state,
            task,
        }
    }

    fn point_at(&self, upstream: SocketAddr) {
        let mut state = self.upstream.lock().unwrap();
        *state = (upstream, state.1 + 1);
    }
}

impl Drop for Vip {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_primary_replaced_by_its_lagging_replica() {
    let _serial = SERIAL.lock().await;
    assert!(
        stack_cmd(&["mysql-failover", "up"]),
        "docker/local/stack mysql-failover up"
    );
    let urls = stack_output(&["mysql-failover", "urls"]);
    let server = |url: &str| -> SocketAddr { url.rsplit('@').next().unwrap().parse().unwrap() };
    let mut lines = urls.lines();
    let (primary, replica) = (server(lines.next().unwrap()), server(lines.next().unwrap()));
    let vip = Vip::start(primary).await;
    let tenant_url = format!("mysql://imstream:imstream@{}", vip.addr);
    let sys = System::start_with("mysql-failover", |c| {
        c.tenants[0].mysql_url = Some(tenant_url.clone())
    })
    .await;
    let load = sys.load(RATE / 2.0);
    load.wait_acked(BEFORE / 2).await;
    // The replica stops applying; what the store writes from now on is on
    // the primary only. Then the primary dies and the replica takes over.
    assert!(stack_cmd(&["mysql-failover", "lag"]));
    let at_lag = load.acked_now();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let at_kill = load.acked_now();
    assert!(stack_cmd(&["mysql-failover", "kill-primary"]));
    assert!(stack_cmd(&["mysql-failover", "promote"]));
    vip.point_at(replica);
    eprintln!(
        "[faults] mysql-failover: {} acked while the replica lagged",
        at_kill - at_lag
    );
    let outcome = load.finish_after(2 * AFTER).await;
    let mut report = sys.verify(&outcome, Expect::default()).await;
    report.failures.extend(outcome.failures());
    drop(sys);
    stack_cmd(&["mysql-failover", "down"]);
    report.assert();
}
