//! What a scanner says about an upload's bytes (issue 41, seed 002 §2.2):
//! the `scan` pipeline asks the scanner `files.scanner` names for each
//! `FileUploaded` and makes a flagged file unavailable to everyone.

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::store::{ByteStream, FileStore};

/// The EICAR anti-malware test string: every scanner flags it, and
/// nothing else carries it by accident.
pub const EICAR: &[u8] = br"X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*";

/// A scanner, as `files.scanner` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scanner {
    /// Everything is clean (the local stack's default).
    Clean,
    /// The test scanner: flags a file holding [`EICAR`] anywhere.
    Eicar,
    /// A program given the file on stdin: exit 0 clean, 1 flagged (its
    /// first line of output the reason), anything else an error.
    Exec(Vec<String>),
    /// A webhook POSTed the file's [`Subject`] as JSON, answering
    /// `{"verdict": "clean"|"flagged", "reason"?}`.
    Webhook(String),
}

/// What a scanner says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Clean,
    Flagged(String),
    /// The store has no such object (swept or lost): nothing to scan.
    Missing,
}

/// A plain, clean text the scanner is asked about when it could not
/// decide on a file: whether the file or the scanner is at fault.
pub const CHECK_SAMPLE: &[u8] =
    b"imstream scanner check: a plain text file with nothing in it to flag.\n";

/// Why a scan did not decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// The store or the scanner did not answer (unreadable, unreachable,
    /// overloaded: 429 or 5xx, or no answer within
    /// `files.scan_timeout_secs`): nothing is known about the file, and
    /// no file is failed for it: the scan waits (retried, in order).
    Down(String),
    /// The scanner answered about this file without a verdict (another
    /// exit code, killed by a signal, a 4xx, no verdict in the answer).
    /// Whether the file or the scanner is at fault, [`Scanner::check`]
    /// tells.
    NoVerdict(String),
}

impl std::fmt::Display for ScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanError::Down(why) => write!(f, "no answer: {why}"),
            ScanError::NoVerdict(why) => write!(f, "no verdict: {why}"),
        }
    }
}

/// The file a webhook is asked about (it reads the bytes from the store
/// itself).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Subject<'a> {
    pub tenant: &'a str,
    pub file_id: &'a str,
    pub object_key: &'a str,
    pub size: i64,
    pub mime: &'a str,
}

impl Scanner {
    /// `files.scanner`; an error names what is wrong.
    pub fn parse(spec: &str) -> Result<Scanner, String> {
        let spec = spec.trim();
        if spec == "clean" {
            Ok(Scanner::Clean)
        } else if spec == "eicar" {
            Ok(Scanner::Eicar)
        } else if let Some(cmd) = spec.strip_prefix("exec:") {
            let argv: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
            if argv.is_empty() {
                return Err("files.scanner exec: names no program".into());
            }
            Ok(Scanner::Exec(argv))
        } else if spec.starts_with("http://") || spec.starts_with("https://") {
            url::Url::parse(spec).map_err(|e| format!("files.scanner {spec:?}: {e}"))?;
            Ok(Scanner::Webhook(spec.to_string()))
        } else {
            Err(format!(
                "files.scanner {spec:?}: expected clean, eicar, exec:<program> <args…> or an http(s):// webhook"
            ))
        }
    }

    /// Scans `subject`, whose bytes are `key` in `store`, within
    /// `timeout`.
    pub async fn scan(
        &self,
        store: &FileStore,
        key: &Path,
        subject: &Subject<'_>,
        timeout: Duration,
    ) -> Result<Outcome, ScanError> {
        let scanning = async {
            let bytes = || async {
                match store.read(key, None).await {
                    Ok(bytes) => Ok(Ok(bytes)),
                    Err(object_store::Error::NotFound { .. }) => Ok(Err(Outcome::Missing)),
                    Err(e) => Err(ScanError::Down(e.to_string())),
                }
            };
            match self {
                Scanner::Clean => Ok(Outcome::Clean),
                Scanner::Eicar => match bytes().await? {
                    Ok(bytes) => eicar(bytes).await,
                    Err(missing) => Ok(missing),
                },
                Scanner::Exec(argv) => match bytes().await? {
                    Ok(bytes) => exec(argv, bytes).await,
                    Err(missing) => Ok(missing),
                },
                Scanner::Webhook(url) => webhook(url, subject, timeout).await,
            }
        };
        within(timeout, scanning).await
    }

    /// Asks the scanner about [`CHECK_SAMPLE`] (for a webhook, written to
    /// the store first, as `_scanner/check.txt` under the files' root):
    /// `Clean` when the scanner works, so a file it did not decide on is
    /// at fault itself.
    pub async fn check(&self, store: &FileStore, timeout: Duration) -> Result<Outcome, ScanError> {
        let sample = || -> ByteStream {
            futures::stream::once(async { Ok(bytes::Bytes::from_static(CHECK_SAMPLE)) }).boxed()
        };
        let checking = async {
            match self {
                Scanner::Clean => Ok(Outcome::Clean),
                Scanner::Eicar => eicar(sample()).await,
                Scanner::Exec(argv) => exec(argv, sample()).await,
                Scanner::Webhook(url) => {
                    let key = store.check_key();
                    store
                        .put_small(&key, CHECK_SAMPLE)
                        .await
                        .map_err(|e| ScanError::Down(e.to_string()))?;
                    let subject = Subject {
                        tenant: "",
                        file_id: "scanner-check",
                        object_key: key.as_ref(),
                        size: CHECK_SAMPLE.len() as i64,
                        mime: "text/plain",
                    };
                    webhook(url, &subject, timeout).await
                }
            }
        };
        within(timeout, checking).await
    }
}

/// `scanning`, or the scanner's failure once `timeout` has passed.
async fn within(
    timeout: Duration,
    scanning: impl std::future::Future<Output = Result<Outcome, ScanError>>,
) -> Result<Outcome, ScanError> {
    tokio::time::timeout(timeout, scanning)
        .await
        .map_err(|_| ScanError::Down(format!("no answer within {} s", timeout.as_secs())))?
}

/// Finds [`EICAR`] anywhere in a stream of chunks (across their borders).
#[derive(Default)]
pub struct EicarFinder {
    tail: Vec<u8>,
}

impl EicarFinder {
    /// True once the string has been seen.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        self.tail.extend_from_slice(chunk);
        let found = self.tail.windows(EICAR.len()).any(|w| w == EICAR);
        let keep = EICAR.len() - 1;
        if self.tail.len() > keep {
            self.tail.drain(..self.tail.len() - keep);
        }
        found
    }
}

/// A chunk of the file, or the store's failure half way.
fn chunk_of(chunk: Result<bytes::Bytes, object_store::Error>) -> Result<bytes::Bytes, ScanError> {
    chunk.map_err(|e| ScanError::Down(e.to_string()))
}

async fn eicar(mut bytes: ByteStream) -> Result<Outcome, ScanError> {
    let mut finder = EicarFinder::default();
    while let Some(chunk) = bytes.next().await {
        if finder.feed(&chunk_of(chunk)?) {
            return Ok(Outcome::Flagged("EICAR test file".into()));
        }
    }
    Ok(Outcome::Clean)
}

async fn exec(argv: &[String], mut bytes: ByteStream) -> Result<Outcome, ScanError> {
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ScanError::Down(format!("{}: {e}", argv[0])))?;
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(ScanError::Down(format!("{}: no pipes", argv[0])));
    };
    // Read its answer while it is fed, so neither side waits on a full
    // pipe: all of it (a scanner that talks must not die of SIGPIPE), the
    // first 4 KiB kept.
    let answer = tokio::spawn(async move {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let room = 4096usize.saturating_sub(out.len());
            out.extend_from_slice(&buf[..n.min(room)]);
        }
        out
    });
    while let Some(chunk) = bytes.next().await {
        let chunk = chunk_of(chunk)?;
        // A scanner may stop reading once it has decided.
        if stdin.write_all(&chunk).await.is_err() {
            break;
        }
    }
    drop(stdin);
    let status = child
        .wait()
        .await
        .map_err(|e| ScanError::Down(format!("{}: {e}", argv[0])))?;
    let out = answer.await.unwrap_or_default();
    match status.code() {
        Some(0) => Ok(Outcome::Clean),
        Some(1) => {
            let reason = String::from_utf8_lossy(&out)
                .lines()
                .next()
                .unwrap_or("flagged")
                .chars()
                .take(200)
                .collect();
            Ok(Outcome::Flagged(reason))
        }
        _ => Err(ScanError::NoVerdict(format!("{} ended {status}", argv[0]))),
    }
}

#[derive(Deserialize)]
struct Verdict {
    verdict: String,
    #[serde(default)]
    reason: String,
}

async fn webhook(
    url: &str,
    subject: &Subject<'_>,
    timeout: Duration,
) -> Result<Outcome, ScanError> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .build()
        .map_err(|e| ScanError::Down(e.to_string()))?;
    let answer = client
        .post(url)
        .json(subject)
        .send()
        .await
        .map_err(|e| ScanError::Down(format!("{url}: {e}")))?;
    let status = answer.status();
    if !status.is_success() {
        // Overloaded or down (a proxy in front of it answering for it):
        // for every file alike. Any other refusal is about this file.
        let why = format!("{url} answered {status}");
        return Err(if status.as_u16() == 429 || status.is_server_error() {
            ScanError::Down(why)
        } else {
            ScanError::NoVerdict(why)
        });
    }
    let verdict: Verdict = answer
        .json()
        .await
        .map_err(|e| ScanError::NoVerdict(format!("{url}: {e}")))?;
    match verdict.verdict.as_str() {
        "clean" => Ok(Outcome::Clean),
        "flagged" => Ok(Outcome::Flagged(if verdict.reason.is_empty() {
            "flagged".into()
        } else {
            verdict.reason.chars().take(200).collect()
        })),
        other => Err(ScanError::NoVerdict(format!(
            "{url}: unknown verdict {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scanners_are_named() {
        assert_eq!(Scanner::parse("clean"), Ok(Scanner::Clean));
        assert_eq!(Scanner::parse(" eicar "), Ok(Scanner::Eicar));
        assert_eq!(
            Scanner::parse("exec:/usr/bin/clamdscan --no-summary -"),
            Ok(Scanner::Exec(vec![
                "/usr/bin/clamdscan".into(),
                "--no-summary".into(),
                "-".into()
            ]))
        );
        assert!(matches!(
            Scanner::parse("https://scan.example/v1"),
            Ok(Scanner::Webhook(_))
        ));
        for bad in ["", "exec:", "clamav", "ftp://x"] {
            assert!(Scanner::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// The string is found wherever chunks cut it (a seeded generator:
    /// the seed is printed).
    #[test]
    fn eicar_is_found_across_any_chunk_borders() {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
        for _ in 0..200 {
            let before = rand::Rng::gen_range(&mut rng, 0..300);
            let after = rand::Rng::gen_range(&mut rng, 0..300);
            let mut file = vec![b'a'; before];
            file.extend_from_slice(EICAR);
            file.extend(std::iter::repeat_n(b'z', after));
            let mut clean = file.clone();
            clean[before + 10] = b'#';
            for (bytes, expected) in [(&file, true), (&clean, false)] {
                let mut finder = EicarFinder::default();
                let mut found = false;
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    let n = rand::Rng::gen_range(&mut rng, 1..=rest.len().min(50));
                    found |= finder.feed(&rest[..n]);
                    rest = &rest[n..];
                }
                assert_eq!(found, expected, "seed {seed}");
            }
        }
    }
}
