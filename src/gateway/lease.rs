//! Who holds a node id lease: its token names the host and process, so a
//! gateway restarted after a crash can tell its predecessor's stale lease
//! from a live gateway's.

use std::collections::HashSet;
use std::sync::Mutex;

/// Tokens of the leases this process holds.
static HELD: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Who holds a lease, judged from its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A gateway in this process: two gateways share one id.
    ThisProcess,
    /// A process on this host that no longer runs (a crash, or the previous
    /// run of a restarted container, which may have had our very pid).
    Gone,
    /// Possibly alive: another host, or a live process here.
    Elsewhere,
}

/// A fresh token: `host|pid|random`.
pub fn token() -> String {
    format!(
        "{}|{}|{}",
        hostname(),
        std::process::id(),
        crate::events::new_event_id()
    )
}

pub fn hold(token: &str) {
    HELD.lock()
        .expect("lock")
        .get_or_insert_with(HashSet::new)
        .insert(token.to_string());
}

pub fn release(token: &str) {
    if let Some(held) = HELD.lock().expect("lock").as_mut() {
        held.remove(token);
    }
}

pub fn judge(token: &str) -> Holder {
    let held = HELD
        .lock()
        .expect("lock")
        .as_ref()
        .is_some_and(|h| h.contains(token));
    judge_with(token, held, &hostname(), std::process::id(), |pid| {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    })
}

fn judge_with(
    token: &str,
    held_here: bool,
    host: &str,
    own_pid: u32,
    alive: impl Fn(u32) -> bool,
) -> Holder {
    if held_here {
        return Holder::ThisProcess;
    }
    let mut parts = token.split('|');
    let (Some(their_host), Some(pid)) = (parts.next(), parts.next()) else {
        return Holder::Elsewhere;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return Holder::Elsewhere;
    };
    if their_host != host {
        return Holder::Elsewhere;
    }
    // Our own pid with a token we do not hold: an earlier run of this
    // process's container. Any other pid counts while it runs.
    if pid == own_pid || !alive(pid) {
        Holder::Gone
    } else {
        Holder::Elsewhere
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crashed_predecessor_on_this_host_is_gone_and_others_are_waited_for() {
        let alive = |pid: u32| pid == 42;
        assert_eq!(
            judge_with("h|42|x", true, "h", 7, alive),
            Holder::ThisProcess
        );
        assert_eq!(judge_with("h|41|x", false, "h", 7, alive), Holder::Gone);
        assert_eq!(judge_with("h|7|x", false, "h", 7, alive), Holder::Gone);
        assert_eq!(
            judge_with("h|42|x", false, "h", 7, alive),
            Holder::Elsewhere
        );
        assert_eq!(
            judge_with("g|41|x", false, "h", 7, alive),
            Holder::Elsewhere
        );
        assert_eq!(
            judge_with("another-process", false, "h", 7, alive),
            Holder::Elsewhere
        );
    }
}
