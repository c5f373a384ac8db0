//! The pipelines' failure classifiers for broker, codec and cache errors;
//! the [`FailureKind`] itself and the Redis classifier live in
//! [`crate::failure`], below the stores that use them.

pub use crate::failure::{redis_failure, FailureKind};

/// Producing from a handler (push tasks, admin results, session control):
/// the broker not acknowledging is an outage; an event that does not fit
/// its schema is poison (a registry outage while encoding is an outage).
pub fn produce_failure(e: &crate::kafka::producer::ProduceError) -> FailureKind {
    FailureKind::from_transient(e.is_retryable())
}

/// Decoding: the registry unreachable is an outage; an undecodable record
/// is poison.
pub fn codec_failure(e: &crate::events::CodecError) -> FailureKind {
    FailureKind::from_transient(e.is_retryable())
}

/// Group facts: the database and Redis by their own classifiers; a group
/// or tenant that does not exist is poison; a coalesced load that failed
/// (its cause is only a message by then) is taken for an outage.
pub fn group_failure(e: &crate::groups::GroupError) -> FailureKind {
    use crate::groups::GroupError;
    match e {
        GroupError::NotFound(_) => FailureKind::Poison,
        GroupError::Db(e) => crate::tenant::db_failure(e),
        GroupError::Redis(e) => redis_failure(e),
        GroupError::Load(_) => FailureKind::Outage,
    }
}

/// Friend and block edges: the database and Redis by their classifiers.
pub fn relation_failure(e: &crate::relations::RelationError) -> FailureKind {
    use crate::relations::RelationError;
    match e {
        RelationError::Db(e) => crate::tenant::db_failure(e),
        RelationError::Redis(e) => redis_failure(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_connection_trouble_is_an_outage_and_a_refused_command_is_poison() {
        let io = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        ));
        assert_eq!(redis_failure(&io), FailureKind::Outage);
        let reset = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset",
        ));
        assert_eq!(redis_failure(&reset), FailureKind::Outage);
        for kind in [
            redis::ErrorKind::BusyLoadingError,
            redis::ErrorKind::TryAgain,
            redis::ErrorKind::ClusterDown,
            redis::ErrorKind::MasterDown,
            redis::ErrorKind::ReadOnly,
        ] {
            let e = redis::RedisError::from((kind, "server says"));
            assert_eq!(redis_failure(&e), FailureKind::Outage, "{kind:?}");
        }
        // Shaped as the client parses server errors it has no kind for.
        let wrongtype = redis::make_extension_error(
            "WRONGTYPE".into(),
            Some("Operation against a key holding the wrong kind of value".into()),
        );
        assert_eq!(redis_failure(&wrongtype), FailureKind::Poison);
        let oom = redis::make_extension_error(
            "OOM".into(),
            Some("command not allowed when used memory > 'maxmemory'".into()),
        );
        assert_eq!(redis_failure(&oom), FailureKind::Outage);
        let script = redis::RedisError::from((
            redis::ErrorKind::ResponseError,
            "Error running script (call to f_...): user_script:1: bad argument",
        ));
        assert_eq!(redis_failure(&script), FailureKind::Poison);
        let shape = redis::RedisError::from((redis::ErrorKind::TypeError, "not an integer"));
        assert_eq!(redis_failure(&shape), FailureKind::Poison);
    }
}
