//! The one way tests start the `imstream` binary cargo built for them:
//! `imstream --config FILE ARGS…`, with a configuration the test wrote
//! (`Stack::config_file`, `write_config_file`).
//!
//! - a command an operator types (`users add`, `routes rebuild`, `dlq
//!   replay`) runs to its end: [`command`] builds it, [`run`] (blocking) or
//!   [`run_async`] (with input on stdin) run it and hand back what it printed;
//! - a service (a gateway, a pipeline, a unit) keeps running as a [`Proc`]
//!   that the test kills with SIGKILL and starts again with the same
//!   arguments, each incarnation logging to its own file so a failure can
//!   say what the process said.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `imstream --config <config_file> <args…>`, nothing else set.
pub fn command(config_file: &Path, args: &[&str]) -> std::process::Command {
    command_of(Path::new(env!("CARGO_BIN_EXE_imstream")), config_file, args)
}

fn command_of(binary: &Path, config_file: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(binary);
    cmd.arg("--config").arg(config_file).args(args);
    cmd
}

/// The release build of `imstream` (`IMSTREAM_RELEASE_BIN`, which
/// `docker/local/test` builds and sets): what production runs, for the
/// tests whose promise is a time bound at scale (the 20,000-conversation
/// recovery faults). The test build's own binary is unoptimized.
pub fn release_binary() -> PathBuf {
    let path = std::env::var("IMSTREAM_RELEASE_BIN").unwrap_or_else(|_| {
        panic!(
            "IMSTREAM_RELEASE_BIN is not set: this test measures the release build \
             (`cargo build --release --bin imstream`, then \
             IMSTREAM_RELEASE_BIN=target/release/imstream; docker/local/test does both)"
        )
    });
    let path = PathBuf::from(path);
    assert!(
        path.exists(),
        "IMSTREAM_RELEASE_BIN {path:?} does not exist"
    );
    path
}

/// What a command run to its end printed.
pub struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    fn of(out: std::process::Output) -> Ran {
        Ran {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Stdout then stderr, as the operator's terminal shows them.
    pub fn printed(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `cmd` to its end with stdin closed, blocking the calling thread.
pub fn run(mut cmd: std::process::Command) -> Ran {
    Ran::of(cmd.output().expect("run imstream"))
}

/// Runs `cmd` to its end; `input` (a password, say) is written to its stdin,
/// which is closed otherwise. Killed if the test drops it before the end (a
/// timeout).
pub async fn run_async(cmd: std::process::Command, input: Option<&str>) -> Ran {
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let Some(input) = input else {
        return Ran::of(cmd.output().await.expect("run imstream"));
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run imstream");
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, input.as_bytes())
        .await
        .unwrap();
    // Closed, so that the child sees the end of its input.
    drop(stdin);
    Ran::of(child.wait_with_output().await.unwrap())
}

/// One `imstream` child process that keeps running (a gateway, a pipeline,
/// a unit), restartable with the same arguments. Incarnation N logs its
/// stderr to `target/tmp/<name>-N.log`. Killed when dropped.
pub struct Proc {
    recipe: Recipe,
    child: tokio::process::Child,
    incarnation: u32,
}

/// What every incarnation of a [`Proc`] is started with.
struct Recipe {
    name: String,
    config_file: PathBuf,
    args: Vec<String>,
    /// `RUST_LOG`; the test's own when `None`.
    log_filter: Option<String>,
    /// The binary; the test build's when `None`.
    binary: Option<PathBuf>,
}

impl Recipe {
    fn log(&self, incarnation: u32) -> PathBuf {
        let name = format!("target/tmp/{}-{incarnation}.log", self.name);
        crate::common::repo_root().join(name)
    }

    fn spawn(&self, incarnation: u32) -> tokio::process::Child {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let mut cmd = match &self.binary {
            Some(binary) => command_of(binary, &self.config_file, &args),
            None => command(&self.config_file, &args),
        };
        if let Some(filter) = &self.log_filter {
            cmd.env("RUST_LOG", filter);
        }
        let log = std::fs::File::create(self.log(incarnation)).expect("log file");
        tokio::process::Command::from(cmd)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn imstream {:?}: {e}", self.args))
    }
}

impl Proc {
    /// Starts incarnation 1 with the test's `RUST_LOG`.
    pub fn spawn(name: &str, config_file: &Path, args: &[&str]) -> Proc {
        Proc::start(name, config_file, args, None)
    }

    /// [`Proc::spawn`] with `RUST_LOG=<filter>` in every incarnation.
    pub fn spawn_logging(name: &str, config_file: &Path, args: &[&str], filter: &str) -> Proc {
        Proc::start(name, config_file, args, Some(filter.to_string()))
    }

    /// [`Proc::spawn_logging`] of the release build ([`release_binary`]).
    pub fn spawn_release(name: &str, config_file: &Path, args: &[&str], filter: &str) -> Proc {
        let mut recipe = Proc::recipe(name, config_file, args, Some(filter.to_string()));
        recipe.binary = Some(release_binary());
        Proc {
            child: recipe.spawn(1),
            recipe,
            incarnation: 1,
        }
    }

    fn recipe(name: &str, config_file: &Path, args: &[&str], log_filter: Option<String>) -> Recipe {
        Recipe {
            name: name.to_string(),
            config_file: config_file.to_path_buf(),
            args: args.iter().map(|s| s.to_string()).collect(),
            log_filter,
            binary: None,
        }
    }

    fn start(name: &str, config_file: &Path, args: &[&str], log_filter: Option<String>) -> Proc {
        let recipe = Proc::recipe(name, config_file, args, log_filter);
        Proc {
            child: recipe.spawn(1),
            recipe,
            incarnation: 1,
        }
    }

    pub fn name(&self) -> &str {
        &self.recipe.name
    }

    /// The log file of the current incarnation.
    pub fn log(&self) -> PathBuf {
        self.recipe.log(self.incarnation)
    }

    /// What the current incarnation has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// Starts the next incarnation (same config, same arguments).
    pub fn respawn(&mut self) {
        self.incarnation += 1;
        self.child = self.recipe.spawn(self.incarnation);
    }

    /// SIGKILL, no chance to commit, flush or release anything; asserts it
    /// was the signal that ended it.
    pub async fn kill_9(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        let status = self.child.wait().await.expect("reaped");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "{} killed by SIGKILL ({:?})",
            self.name(),
            self.log()
        );
    }

    /// SIGKILL unless it already ended; how it ended.
    pub async fn kill(&mut self) -> ExitStatus {
        let _ = self.child.start_kill();
        self.child.wait().await.expect("reaped")
    }

    /// Waits until it exits.
    pub async fn wait(&mut self) -> ExitStatus {
        self.child.wait().await.expect("reaped")
    }

    /// Its exit status, if it exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until it answers `GET /healthz` on `addr`; starts it again
    /// whenever it exits, as a supervisor would. Returns the time until it
    /// served and the exits seen; panics after 90 s.
    pub async fn supervise_until_serving(&mut self, addr: SocketAddr) -> (Duration, Vec<String>) {
        let http = reqwest::Client::new();
        let started = Instant::now();
        let mut exits = Vec::new();
        loop {
            if answers(&http, addr).await {
                return (started.elapsed(), exits);
            }
            if let Some(status) = self.exited() {
                let log = self.log_text();
                let last = log.lines().last().unwrap_or("").to_string();
                exits.push(format!(
                    "{} exited {status} after {:.1}s: {last}",
                    self.name(),
                    started.elapsed().as_secs_f64()
                ));
                tokio::time::sleep(Duration::from_millis(500)).await;
                self.respawn();
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "{} did not serve on {addr} within 90 s (exits: {exits:?})",
                self.name()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether `GET http://<addr>/healthz` succeeds within a second.
async fn answers(http: &reqwest::Client, addr: SocketAddr) -> bool {
    matches!(
        http.get(format!("http://{addr}/healthz"))
            .timeout(Duration::from_secs(1))
            .send()
            .await,
        Ok(r) if r.status().is_success()
    )
}

/// A loopback address with a port free now, for a child told where to
/// listen (it cannot report a port the system picked).
///
/// The port comes from below the kernel's ephemeral range (32768–60999),
/// not from `bind(0)`: a port the system handed out and the test released
/// could be picked again by any `bind(0)` before the child binds it (every
/// child's telemetry listens on port 0 and answers `/healthz`; a gateway
/// once "served" with another process's listener, and its WebSocket
/// answered 404). Below the range, only this function hands ports out:
/// one after another within the test process, from an offset of its pid
/// across processes, each checked free. The local stack's fixed ports lie
/// outside 20000–26999: 13306–19900, Kafka's 29092+, and the Redis
/// clusters' bus ports (their ports + 10000: 27001–27016), which a
/// cluster a test starts later must still find free.
pub fn free_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 7_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(397) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + SPAN)
}
