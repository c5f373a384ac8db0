//! Outage or poison: the one question the runner asks of every failure.
//!
//! An *outage* is the world, not the record: a database, Redis, the schema
//! registry or the broker unreachable, a pool timeout, a deadlock, a lock
//! wait, a month table the shard manager has not made yet, a read-only
//! server during a failover. Trying the same record again later succeeds,
//! so the runner retries it without a limit and never sends it to the DLQ.
//!
//! *Poison* is the record: undecodable, refused by a constraint, a bug. It
//! can never be applied, so the runner isolates it and, after
//! `max_attempts` attempts alone, sends it (alone) to the DLQ.
//!
//! Database errors are classified by [`crate::tenant::db_failure`], Redis
//! errors here; broker, codec and cache errors by `pipeline::failure`.

/// Whether a failed record can succeed later without anyone changing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// A service is unavailable: retry without a limit, never the DLQ.
    Outage,
    /// The record itself is refused: the DLQ, alone, after `max_attempts`.
    Poison,
}

impl FailureKind {
    /// `Outage` when `transient`, else `Poison`.
    pub fn from_transient(transient: bool) -> FailureKind {
        if transient {
            FailureKind::Outage
        } else {
            FailureKind::Poison
        }
    }

    pub fn is_outage(self) -> bool {
        self == FailureKind::Outage
    }
}

/// Redis: a lost or refused connection, a timeout, a server loading its
/// data, a cluster or replica without a master, a read-only replica, an
/// out-of-memory or flushed script cache are outages; so is a pipeline the
/// cluster client reports as crossing slots, which happens while the slot
/// map changes during a failover (imstream's pipelines keep to one slot or
/// are split per slot, so outside a failover it cannot happen; were it a
/// bug, the pipeline would show degraded rather than fill its DLQ). A script
/// error, `WRONGTYPE` or a reply of an unexpected type is poison.
pub fn redis_failure(e: &redis::RedisError) -> FailureKind {
    use redis::ErrorKind as K;
    if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
    {
        return FailureKind::Outage;
    }
    let transient_kind = matches!(
        e.kind(),
        K::IoError
            | K::BusyLoadingError
            | K::TryAgain
            | K::ClusterDown
            | K::MasterDown
            | K::ReadOnly
            | K::NoScriptError
            | K::AuthenticationFailed
            | K::Moved
            | K::Ask
            | K::CrossSlot
            | K::ClusterConnectionNotFound
            | K::MasterNameNotFoundBySentinel
            | K::NoValidReplicasFoundBySentinel
            | K::EmptySentinelList
    );
    let transient_code = matches!(
        e.code(),
        Some(
            "LOADING"
                | "BUSY"
                | "OOM"
                | "MISCONF"
                | "NOREPLICAS"
                | "TRYAGAIN"
                | "CLUSTERDOWN"
                | "MASTERDOWN"
                | "READONLY"
                | "NOSCRIPT"
        )
    );
    FailureKind::from_transient(transient_kind || transient_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_map_in_flux_is_an_outage_a_wrong_type_is_poison() {
        use redis::ErrorKind as K;
        for kind in [
            K::CrossSlot,
            K::ClusterDown,
            K::TryAgain,
            K::Moved,
            K::MasterDown,
        ] {
            let e = redis::RedisError::from((kind, "during a failover"));
            assert_eq!(redis_failure(&e), FailureKind::Outage, "{kind:?}");
        }
        let e = redis::RedisError::from((K::TypeError, "WRONGTYPE"));
        assert_eq!(redis_failure(&e), FailureKind::Poison);
    }
}
