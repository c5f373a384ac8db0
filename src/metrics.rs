//! Metric names, in one place. Names of seed 000 §11 are kept verbatim;
//! labels are bounded (months, statuses, pipelines, sources — never topic or
//! user ids).

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Histogram buckets shared by every latency metric (seconds).
pub const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

// Seed 000 §11.
pub const PERSIST_TOTAL: &str = "group_message_persist_total";
pub const PERSIST_LATENCY: &str = "group_message_persist_latency";
pub const SHARD_MISSING_TOTAL: &str = "group_message_shard_missing_total";
pub const QUERY_TABLES: &str = "group_message_query_tables";
pub const QUERY_LATENCY: &str = "group_message_query_latency";
pub const DEDUP_HIT_TOTAL: &str = "group_message_dedup_hit_total";
/// Messages the store found with their `(topic, seq)` held by another
/// message (a seq handed out twice): kept in `im_seq_collisions`. Any
/// increase is data loss in the making (alert `SeqCollision`).
pub const SEQ_COLLISIONS_TOTAL: &str = "imstream_store_seq_collisions_total";
/// Topics whose seq state was found written by another incarnation of Redis
/// (a restart or a failover) and re-derived from the log.
pub const SEQ_FENCES_TOTAL: &str = "imstream_send_seq_fences_total";
/// Group write models rebuilt from MySQL and the log (`why`: missing,
/// lost, fenced).
pub const GROUP_REBUILDS_TOTAL: &str = "imstream_group_rebuilds_total";
/// Group changes applied in Redis to a model that was restored (or lost)
/// before they were stored: not stored, their commands decided again.
pub const GROUP_CHANGES_LOST_TOTAL: &str = "imstream_group_changes_lost_total";
/// Blocks of seqs reserved in the durable marks (`why`: first, used_up,
/// prefetch, month, restore).
pub const SEQ_BLOCKS_TOTAL: &str = "imstream_seq_blocks_reserved_total";
/// Write-side state put back into Redis from durable state (`what`: seq,
/// group; `how`: lazy — a request found it missing —, bulk — the
/// tenant's restore after Redis forgot).
pub const WRITE_RESTORES_TOTAL: &str = "imstream_write_restores_total";
/// Client message ids of restored topics looked up in the durable claims
/// (`found`: yes, no).
pub const CLAIM_CHECKS_TOTAL: &str = "imstream_send_claim_checks_total";
/// A message's claim found held by another message of the same client id
/// after its produce (a retry that raced it across a Redis loss).
pub const CLAIM_RACES_TOTAL: &str = "imstream_send_claim_races_total";
/// Seconds one tenant's restore after Redis forgot took (seq marks, group
/// models, claims of the log tail).
pub const RECOVERY_SECONDS: &str = "imstream_recovery_seconds";
/// Governance commands by outcome (`ok`, `replayed`, `refused`,
/// `conflict_retried`, `unavailable`).
pub const GOVERNANCE_COMMANDS_TOTAL: &str = "imstream_governance_commands_total";
/// Partitions a pipeline handled again because a tenant database held less
/// than its checkpoint said (a restore, a lagging replica promoted).
pub const PIPELINE_REWINDS_TOTAL: &str = "imstream_pipeline_rewinds_total";
pub const ROUTE_MISS_TOTAL: &str = "group_message_route_miss_total";
pub const ROUTE_REBUILD_TOTAL: &str = "group_message_route_rebuild_total";
pub const ROUTE_REPAIR_BACKLOG: &str = "group_message_route_repair_backlog";
pub const DEAD_LETTER_TOTAL: &str = "group_message_dead_letter_total";

// Send path, pipelines, registry.
pub const SEND_ACK_LATENCY: &str = "imstream_send_ack_latency_seconds";
pub const SEND_TOTAL: &str = "imstream_send_total";
pub const EVENTS_PRODUCED_TOTAL: &str = "imstream_events_produced_total";
pub const PIPELINE_EVENTS_TOTAL: &str = "imstream_pipeline_events_total";
pub const PIPELINE_RETRIES_TOTAL: &str = "imstream_pipeline_retries_total";
pub const PIPELINE_DLQ_TOTAL: &str = "imstream_pipeline_dlq_total";
/// 1 while a pipeline waits out an outage (its records are retried, none
/// goes to the DLQ), else 0.
pub const PIPELINE_DEGRADED: &str = "imstream_pipeline_degraded";
/// Handler attempts that failed for an outage and were retried.
pub const PIPELINE_OUTAGE_RETRIES_TOTAL: &str = "imstream_pipeline_outage_retries_total";
/// Records that failed as poison in a batch and were re-handled alone.
pub const PIPELINE_ISOLATED_TOTAL: &str = "imstream_pipeline_isolated_total";
pub const PIPELINE_LAG: &str = "imstream_pipeline_consumer_lag";
pub const DELIVERY_LATENCY: &str = "imstream_delivery_latency_seconds";
pub const HISTORY_FETCHES_TOTAL: &str = "imstream_history_fetches_total";
/// Blocks of archived months a read needed, by source (cache, store).
pub const ARCHIVE_BLOCKS_TOTAL: &str = "imstream_archive_blocks_total";
/// Bytes fetched from the archive object store by reads.
pub const ARCHIVE_READ_BYTES_TOTAL: &str = "imstream_archive_read_bytes_total";
pub const PROCESS_RESIDENT_BYTES: &str = "imstream_process_resident_bytes";
pub const GATEWAY_SESSIONS: &str = "imstream_gateway_sessions";
pub const DELIVERIES_TOTAL: &str = "imstream_deliveries_total";
pub const DELIVERY_DROPPED_TOTAL: &str = "imstream_delivery_dropped_total";
pub const ENVELOPES_TOTAL: &str = "imstream_realtime_envelopes_total";
pub const REGISTRY_REQUESTS_TOTAL: &str = "imstream_registry_requests_total";
/// Edits, recalls and deletes applied to stored messages (or skipped as
/// already applied), by event kind.
pub const REVISIONS_TOTAL: &str = "imstream_message_revisions_total";
/// Admin commands executed, by kind and status (ok, rejected, failed, duplicate).
pub const ADMIN_COMMANDS_TOTAL: &str = "imstream_admin_commands_total";
/// Offline push tasks produced (or skipped as already produced).
pub const PUSH_TASKS_TOTAL: &str = "imstream_push_tasks_total";
/// Push deliveries by the push sender, by status.
pub const PUSH_SENT_TOTAL: &str = "imstream_push_sent_total";
/// Requests refused by a limit (rate buckets, login lockouts, connection
/// and session caps), by `what`.
pub const RATE_LIMITED_TOTAL: &str = "imstream_rate_limited_total";
/// Sends admitted and not yet answered, per gateway process (bounded by
/// `limits.sends_in_flight`; beyond it sends are refused as overloaded).
pub const SEND_IN_FLIGHT: &str = "imstream_send_in_flight";
/// How far each tenant's read replica is behind its primary (seconds, by
/// tenant: a configured, bounded set); +Inf while it cannot be measured.
pub const MYSQL_REPLICA_LAG: &str = "imstream_mysql_replica_lag_seconds";
/// Index documents written by the search pipeline (a message, an edit's new
/// text, a removal), counted per commit.
pub const SEARCH_INDEXED_TOTAL: &str = "imstream_search_indexed_total";
/// Time of one search-index commit (one pipeline batch of one tenant).
pub const SEARCH_COMMIT_LATENCY: &str = "imstream_search_commit_latency_seconds";
/// `GET /v1/search` latency, by `source` (index, like).
pub const SEARCH_QUERY_LATENCY: &str = "imstream_search_query_latency_seconds";
/// Index hits dropped at query time, by `why` (member, hidden): the index
/// said yes, the read path said no.
pub const SEARCH_HITS_DROPPED_TOTAL: &str = "imstream_search_hits_dropped_total";

// Alerts (docker/prometheus/alerts.yml): what the seeds' thresholds need.
/// Round trip of one Redis command or pipeline, by `kind` (command,
/// pipeline), measured in `redis_util::Redis` (alert: p99 > 20 ms, seed 003
/// §11.2).
pub const REDIS_COMMAND_LATENCY: &str = "imstream_redis_command_latency_seconds";
/// Times a Redis Cluster connection was rebuilt from the seed nodes after
/// every command failed for 3 s (`redis_util::cluster`).
pub const REDIS_RECONNECTS_TOTAL: &str = "imstream_redis_reconnects_total";
/// Statements a tenant's MySQL server has executed (`Questions` of `SHOW
/// GLOBAL STATUS`), sampled by the shard manager each pass, by tenant.
pub const MYSQL_QUERIES_TOTAL: &str = "imstream_mysql_queries_total";
/// Statements the server counted as slow (`Slow_queries`: longer than its
/// `long_query_time`), by tenant (alert: more than 5 % of the queries).
pub const MYSQL_SLOW_QUERIES_TOTAL: &str = "imstream_mysql_slow_queries_total";
/// `mysql.replica_max_lag_ms` in seconds, beside each tenant's replica lag
/// (alert: the lag over its bound).
pub const MYSQL_REPLICA_MAX_LAG: &str = "imstream_mysql_replica_max_lag_seconds";
/// Dead letters of a pipeline's DLQ that no replay has handled yet (the
/// replay group's backlog on `<topic>.<pipeline>.dlq`), by pipeline and
/// source (alert: any).
pub const PIPELINE_DLQ_PENDING: &str = "imstream_pipeline_dlq_pending";
/// The tenant's `active_month` in Redis after a shard pass, as the number
/// YYYYMM; 0 when it is missing (alert).
pub const SHARD_ACTIVE_MONTH: &str = "imstream_shard_active_month";
/// 1 when next month's table exists (created and registered), else 0.
pub const SHARD_NEXT_MONTH_READY: &str = "imstream_shard_next_month_ready";
/// 1 when the current month's table exists and is `writable`, else 0.
pub const SHARD_CURRENT_MONTH_WRITABLE: &str = "imstream_shard_current_month_writable";
/// Unix time of the shard manager's last completed pass.
pub const SHARD_LAST_PASS: &str = "imstream_shard_last_pass_timestamp_seconds";
/// Topics the consistency checker compared (Redis route, MySQL mirror,
/// month tables).
pub const CONSISTENCY_TOPICS_TOTAL: &str = "imstream_consistency_topics_checked_total";
/// Differences the checker found, by `kind` (see `store::consistency`).
pub const CONSISTENCY_MISMATCHES_TOTAL: &str = "imstream_consistency_mismatches_total";
/// Repairs the checker made and recorded in `im_consistency_repairs`, by `kind`.
pub const CONSISTENCY_REPAIRS_TOTAL: &str = "imstream_consistency_repairs_total";
/// Expired rows of the cross-month dedup table the checker deleted.
pub const DEDUP_PURGED_TOTAL: &str = "imstream_dedup_purged_total";

/// The names of seed 000 §11, verbatim.
pub const SEED_000: &[&str] = &[
    PERSIST_TOTAL,
    PERSIST_LATENCY,
    SHARD_MISSING_TOTAL,
    QUERY_TABLES,
    QUERY_LATENCY,
    DEDUP_HIT_TOTAL,
    ROUTE_MISS_TOTAL,
    ROUTE_REBUILD_TOTAL,
    ROUTE_REPAIR_BACKLOG,
    DEAD_LETTER_TOTAL,
];

/// Every metric name the crate exports (dashboards and alerts may use only these).
pub const ALL: &[&str] = &[
    PERSIST_TOTAL,
    PERSIST_LATENCY,
    SHARD_MISSING_TOTAL,
    QUERY_TABLES,
    QUERY_LATENCY,
    DEDUP_HIT_TOTAL,
    ROUTE_MISS_TOTAL,
    ROUTE_REBUILD_TOTAL,
    ROUTE_REPAIR_BACKLOG,
    DEAD_LETTER_TOTAL,
    SEQ_COLLISIONS_TOTAL,
    SEQ_FENCES_TOTAL,
    GROUP_REBUILDS_TOTAL,
    GROUP_CHANGES_LOST_TOTAL,
    SEQ_BLOCKS_TOTAL,
    WRITE_RESTORES_TOTAL,
    CLAIM_CHECKS_TOTAL,
    CLAIM_RACES_TOTAL,
    RECOVERY_SECONDS,
    GOVERNANCE_COMMANDS_TOTAL,
    PIPELINE_REWINDS_TOTAL,
    SEND_ACK_LATENCY,
    SEND_TOTAL,
    EVENTS_PRODUCED_TOTAL,
    PIPELINE_EVENTS_TOTAL,
    PIPELINE_RETRIES_TOTAL,
    PIPELINE_DLQ_TOTAL,
    PIPELINE_DEGRADED,
    PIPELINE_OUTAGE_RETRIES_TOTAL,
    PIPELINE_ISOLATED_TOTAL,
    PIPELINE_LAG,
    DELIVERY_LATENCY,
    HISTORY_FETCHES_TOTAL,
    ARCHIVE_BLOCKS_TOTAL,
    ARCHIVE_READ_BYTES_TOTAL,
    PROCESS_RESIDENT_BYTES,
    GATEWAY_SESSIONS,
    DELIVERIES_TOTAL,
    DELIVERY_DROPPED_TOTAL,
    ENVELOPES_TOTAL,
    REGISTRY_REQUESTS_TOTAL,
    REVISIONS_TOTAL,
    ADMIN_COMMANDS_TOTAL,
    PUSH_TASKS_TOTAL,
    PUSH_SENT_TOTAL,
    RATE_LIMITED_TOTAL,
    SEND_IN_FLIGHT,
    MYSQL_REPLICA_LAG,
    SEARCH_INDEXED_TOTAL,
    SEARCH_COMMIT_LATENCY,
    SEARCH_QUERY_LATENCY,
    SEARCH_HITS_DROPPED_TOTAL,
    REDIS_COMMAND_LATENCY,
    REDIS_RECONNECTS_TOTAL,
    MYSQL_QUERIES_TOTAL,
    MYSQL_SLOW_QUERIES_TOTAL,
    MYSQL_REPLICA_MAX_LAG,
    PIPELINE_DLQ_PENDING,
    SHARD_ACTIVE_MONTH,
    SHARD_NEXT_MONTH_READY,
    SHARD_CURRENT_MONTH_WRITABLE,
    SHARD_LAST_PASS,
    CONSISTENCY_TOPICS_TOTAL,
    CONSISTENCY_MISMATCHES_TOTAL,
    CONSISTENCY_REPAIRS_TOTAL,
    DEDUP_PURGED_TOTAL,
];

/// Buckets of [`QUERY_TABLES`] (tables per request): the alert on a
/// request scanning more than 3 tables (seed 000 §11) reads `le="3"`.
pub const QUERY_TABLES_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 6.0, 12.0, 24.0];

/// Uploads the scan pipeline decided about, by `outcome` (clean, flagged).
pub const FILE_SCANS_TOTAL: &str = "imstream_file_scans_total";
/// Time one scan took (`files.scanner`).
pub const FILE_SCAN_SECONDS: &str = "imstream_file_scan_seconds";
/// Objects the file sweep removed, by `why` (unreferenced, abandoned,
/// retention).
pub const FILES_SWEPT_TOTAL: &str = "imstream_files_swept_total";

/// Registers descriptions so `/metrics` explains each series.
pub fn describe_all() {
    describe_counter!(
        PERSIST_TOTAL,
        "Group messages persisted, by month and status"
    );
    describe_histogram!(
        PERSIST_LATENCY,
        Unit::Seconds,
        "From event time to MySQL commit"
    );
    describe_counter!(
        SHARD_MISSING_TOTAL,
        "Events whose month table did not exist"
    );
    describe_counter!(FILE_SCANS_TOTAL, "Uploads scanned, by outcome");
    describe_histogram!(FILE_SCAN_SECONDS, Unit::Seconds, "Time of one file scan");
    describe_counter!(
        FILES_SWEPT_TOTAL,
        "Uploaded files removed by the sweep, by why"
    );
    describe_histogram!(QUERY_TABLES, "Month tables scanned per history request");
    describe_histogram!(
        QUERY_LATENCY,
        Unit::Seconds,
        "History query latency by source"
    );
    describe_counter!(
        DEDUP_HIT_TOTAL,
        "Sends answered from the idempotency record"
    );
    describe_counter!(
        SEQ_COLLISIONS_TOTAL,
        "Messages whose (topic, seq) another message already held: kept in im_seq_collisions; any increase is data loss in the making"
    );
    describe_counter!(
        SEQ_FENCES_TOTAL,
        "Topics whose seq state another incarnation of Redis wrote (a restart or failover), re-derived from the log"
    );
    describe_counter!(
        GROUP_REBUILDS_TOTAL,
        "Group write models rebuilt from MySQL and the log tail (why: missing, lost, fenced)"
    );
    describe_counter!(
        GROUP_CHANGES_LOST_TOTAL,
        "Group changes applied to a model that was restored before they were stored (decided again)"
    );
    describe_counter!(
        SEQ_BLOCKS_TOTAL,
        "Blocks of seqs reserved in the durable seq marks, by why"
    );
    describe_counter!(
        WRITE_RESTORES_TOTAL,
        "Write-side state put back into Redis from durable state, by what and how"
    );
    describe_counter!(
        CLAIM_CHECKS_TOTAL,
        "Client message ids of restored topics looked up in the durable claims, by found"
    );
    describe_counter!(
        CLAIM_RACES_TOTAL,
        "Messages whose claim another message of the same client id held after the produce"
    );
    describe_histogram!(
        RECOVERY_SECONDS,
        Unit::Seconds,
        "One tenant's restore of write-side state after Redis forgot"
    );
    describe_counter!(
        GOVERNANCE_COMMANDS_TOTAL,
        "Governance commands checked against the group write model, by outcome"
    );
    describe_counter!(
        PIPELINE_REWINDS_TOTAL,
        "Partitions handled again because a tenant database held less than its checkpoint"
    );
    describe_counter!(ROUTE_MISS_TOTAL, "Reads that found no Redis route");
    describe_counter!(
        ROUTE_REBUILD_TOTAL,
        "Redis routes rebuilt from the MySQL mirror"
    );
    describe_gauge!(ROUTE_REPAIR_BACKLOG, "Route repairs waiting to be retried");
    describe_counter!(DEAD_LETTER_TOTAL, "Group message events sent to a DLQ");
    describe_histogram!(
        SEND_ACK_LATENCY,
        Unit::Seconds,
        "From pub received to ctrl 202"
    );
    describe_counter!(SEND_TOTAL, "Send attempts by outcome");
    describe_counter!(
        EVENTS_PRODUCED_TOTAL,
        "Events produced to Kafka by topic kind"
    );
    describe_counter!(
        PIPELINE_EVENTS_TOTAL,
        "Events handled by a pipeline, by outcome"
    );
    describe_counter!(PIPELINE_RETRIES_TOTAL, "Retried pipeline batches");
    describe_counter!(PIPELINE_DLQ_TOTAL, "Events a pipeline sent to its DLQ");
    describe_gauge!(
        PIPELINE_DEGRADED,
        "1 while a pipeline waits out an outage (database, Redis, registry or broker unreachable)"
    );
    describe_counter!(
        PIPELINE_OUTAGE_RETRIES_TOTAL,
        "Handler attempts that failed for an outage and were retried"
    );
    describe_counter!(
        PIPELINE_ISOLATED_TOTAL,
        "Records refused in a batch and re-handled alone"
    );
    describe_gauge!(
        PIPELINE_LAG,
        "Records of a source partition a pipeline has not committed"
    );
    describe_histogram!(
        DELIVERY_LATENCY,
        Unit::Seconds,
        "From event time to realtime delivery"
    );
    describe_counter!(
        REGISTRY_REQUESTS_TOTAL,
        "Schema registry requests by route and status"
    );
    describe_counter!(
        SEARCH_INDEXED_TOTAL,
        "Search index documents written (messages, edits, removals)"
    );
    describe_histogram!(
        SEARCH_COMMIT_LATENCY,
        Unit::Seconds,
        "One search index commit (a pipeline batch of one tenant)"
    );
    describe_histogram!(
        SEARCH_QUERY_LATENCY,
        Unit::Seconds,
        "GET /v1/search latency by source (index, like)"
    );
    describe_counter!(
        SEARCH_HITS_DROPPED_TOTAL,
        "Index hits the read path refused at query time, by why"
    );
    describe_counter!(
        REVISIONS_TOTAL,
        "Edits, recalls and deletes applied to stored messages (or skipped), by kind"
    );
    describe_counter!(
        ADMIN_COMMANDS_TOTAL,
        "Admin commands executed, by kind and status"
    );
    describe_counter!(
        PUSH_TASKS_TOTAL,
        "Offline push tasks produced, or skipped as already produced"
    );
    describe_counter!(
        PUSH_SENT_TOTAL,
        "Push deliveries by the push sender, by status"
    );
    describe_counter!(
        RATE_LIMITED_TOTAL,
        "Requests refused by a limit (rate, login lockout, connections, sessions), by what"
    );
    describe_counter!(
        ARCHIVE_BLOCKS_TOTAL,
        "Blocks of archived months read, by source (cache, store)"
    );
    describe_counter!(
        ARCHIVE_READ_BYTES_TOTAL,
        "Bytes read from the archive object store by history reads"
    );
    describe_gauge!(
        SEND_IN_FLIGHT,
        "Sends admitted and not yet answered in this process (refused as overloaded beyond limits.sends_in_flight)"
    );
    describe_gauge!(
        MYSQL_REPLICA_LAG,
        Unit::Seconds,
        "How far each tenant's read replica is behind its primary (+Inf: unreachable); beyond mysql.replica_max_lag_ms history reads go to the primary"
    );
    describe_histogram!(
        REDIS_COMMAND_LATENCY,
        Unit::Seconds,
        "Round trip of one Redis command or pipeline, by kind"
    );
    describe_counter!(
        REDIS_RECONNECTS_TOTAL,
        "Redis Cluster connections rebuilt from the seed nodes after every command failed for 3 s"
    );
    describe_counter!(
        MYSQL_QUERIES_TOTAL,
        "Statements the tenant's MySQL server executed (Questions), sampled each shard pass"
    );
    describe_counter!(
        MYSQL_SLOW_QUERIES_TOTAL,
        "Statements the tenant's MySQL server counted as slow (Slow_queries, over long_query_time)"
    );
    describe_gauge!(
        MYSQL_REPLICA_MAX_LAG,
        Unit::Seconds,
        "mysql.replica_max_lag_ms: the replica lag beyond which reads go to the primary"
    );
    describe_gauge!(
        PIPELINE_DLQ_PENDING,
        "Dead letters of the pipeline's DLQ not handled by a replay yet"
    );
    describe_gauge!(
        SHARD_ACTIVE_MONTH,
        "The tenant's active_month in Redis (YYYYMM) after the last shard pass; 0 when missing"
    );
    describe_gauge!(
        SHARD_NEXT_MONTH_READY,
        "1 when next month's table exists, else 0"
    );
    describe_gauge!(
        SHARD_CURRENT_MONTH_WRITABLE,
        "1 when the current month's table exists and is writable, else 0"
    );
    describe_gauge!(
        SHARD_LAST_PASS,
        Unit::Seconds,
        "Unix time of the shard manager's last completed pass"
    );
    describe_counter!(
        CONSISTENCY_TOPICS_TOTAL,
        "Topics the consistency checker compared (Redis route, MySQL mirror, month tables)"
    );
    describe_counter!(
        CONSISTENCY_MISMATCHES_TOTAL,
        "Differences the consistency checker found, by kind"
    );
    describe_counter!(
        CONSISTENCY_REPAIRS_TOTAL,
        "Repairs the consistency checker made (each recorded in im_consistency_repairs), by kind"
    );
    describe_counter!(
        DEDUP_PURGED_TOTAL,
        "Expired rows of im_group_message_dedup deleted"
    );
}

/// Resident set size of this process (Linux), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
