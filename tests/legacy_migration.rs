//! `imstream legacy` against the real services (seed 000 §9, §12 item 12):
//! 200,000 legacy rows over 4 months in 50 topics; the copy is interrupted
//! twice and resumed, then re-run from the start; verify passes, nothing is
//! duplicated, the mirror and Redis routes match, the seq allocator is
//! raised above the legacy seqs, and history reads are identical before the
//! copy (legacy only, dual read), midway, after it and after the cutover
//! (month tables only).

mod common;

use chrono::Utc;
use imstream::bench::legacy::{fill_synthetic, Synthetic};
use imstream::history::{History, PageQuery};
use imstream::keys::TopicKeys;
use imstream::legacy::copy::{copy, CopyOptions, CopyOutcome};
use imstream::legacy::{cutover, plan, state, verify};
use imstream::store::legacy::table;
use imstream::store::message::StoredMessage;
use imstream::store::month::ShardMonth;
use imstream::tenant::TenantPools;

use common::Stack;

const READER: i64 = 1001;

/// What a user sees of three topics: one walked back from the newest page,
/// one walked forward with `since`, and a context across a month boundary.
async fn reads(stack: &Stack, shape: &Synthetic) -> Vec<Vec<StoredMessage>> {
    // A fresh reader each time: no cached switch or coalesced page.
    let history = History::new(
        TenantPools::connect_lazy(stack.config()).unwrap(),
        stack.redis().await,
    );
    let tenant = stack.tenant();
    let mut out = Vec::new();
    let topic = Synthetic::topic(0);
    let mut back = Vec::new();
    let mut before = None;
    loop {
        let page = history
            .page(
                tenant,
                &topic,
                READER,
                PageQuery::new(None, before, Some(100), false).unwrap(),
            )
            .await
            .expect("page");
        if page.messages.is_empty() {
            break;
        }
        before = page.next;
        back.extend(page.messages);
    }
    out.push(back);
    let topic = Synthetic::topic(17);
    let mut forward = Vec::new();
    let mut since = Some(1);
    loop {
        let page = history
            .page(
                tenant,
                &topic,
                READER,
                PageQuery::new(since, None, Some(100), true).unwrap(),
            )
            .await
            .expect("page");
        let Some(last) = page.messages.last().map(|m| m.seq) else {
            break;
        };
        since = Some(last + 1);
        forward.extend(page.messages);
    }
    out.push(forward);
    let mid = shape.per_topic() / shape.months as i64;
    out.push(
        history
            .context(tenant, &Synthetic::topic(49), READER, mid, 20)
            .await
            .expect("context"),
    );
    out
}

async fn month_rows(stack: &Stack) -> (i64, i64) {
    let pool = stack.pool();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() \
         AND table_name REGEXP '^im_group_messages_[0-9]{6}$'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let union = tables
        .iter()
        .map(|t| format!("SELECT topic, seqid FROM `{t}`"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    sqlx::query_as(&format!(
        "SELECT COUNT(*), COUNT(DISTINCT topic, seqid) FROM ({union}) x"
    ))
    .fetch_one(&pool)
    .await
    .unwrap()
}

/// `rows` legacy rows over 50 topics and the four months before this one.
async fn legacy_rows(pool: &sqlx::MySqlPool, rows: i64) -> Synthetic {
    let mut first = ShardMonth::of(Utc::now());
    for _ in 0..4 {
        first = first.prev();
    }
    let shape = Synthetic {
        rows,
        topics: 50,
        first,
        months: 4,
    };
    fill_synthetic(pool, &shape).await.expect("legacy rows");
    shape
}

/// One `legacy copy` run to its end (or its `max_batches`).
async fn run_copy(
    pool: &sqlx::MySqlPool,
    redis: &mut imstream::redis_util::Redis,
    tenant: &str,
    options: &CopyOptions,
) -> CopyOutcome {
    let shutdown = imstream::shutdown::Shutdown::new();
    copy(pool, redis, tenant, options, &shutdown)
        .await
        .expect("legacy copy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legacy_table_moves_into_month_tables_with_pauses_and_identical_reads() {
    let stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    let pool = stack.pool();
    let mut redis = stack.redis().await;
    let shape = legacy_rows(&pool, 200_000).await;
    // A live allocator of a legacy topic that is behind the legacy seqs.
    let seq_key = TopicKeys::new(&tenant, &Synthetic::topic(3)).seq();
    let _: () = redis::cmd("HSET")
        .arg(&seq_key)
        .arg("last_seq")
        .arg(5)
        .query_async(&mut redis)
        .await
        .unwrap();

    let p = plan::plan(&pool, &mut redis, &tenant).await.expect("plan");
    assert_eq!(
        (p.rows, p.topics, p.months.len()),
        (200_000, 50, 4),
        "{p:?}"
    );
    assert_eq!(p.months.keys().next(), Some(&shape.first));
    let last_seq: i64 = redis::cmd("HGET")
        .arg(&seq_key)
        .arg("last_seq")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(last_seq, 4000, "allocator raised above the legacy seqs");
    assert!(state::load(&pool).await.unwrap().unwrap().dual_read);

    // Before the copy: dual read serves the legacy table alone.
    let before = reads(&stack, &shape).await;
    let seqs = |i: usize| before[i].iter().map(|m| m.seq).collect::<Vec<_>>();
    assert_eq!(seqs(0), (1..=4000).rev().collect::<Vec<_>>());
    assert_eq!(seqs(1), (1..=4000).collect::<Vec<_>>());
    assert_eq!(seqs(2), (980..=1020).collect::<Vec<_>>());
    assert_eq!(
        before[0][0].content.as_deref(),
        Some(Synthetic::content(0, 4000).as_str())
    );
    assert_eq!(month_rows(&stack).await, (0, 0));

    // Interrupted twice, resumed.
    let paused = CopyOptions {
        max_batches: Some(10),
        ..CopyOptions::default()
    };
    let one = run_copy(&pool, &mut redis, &tenant, &paused).await;
    assert_eq!(
        (one.batches, one.rows_read, one.rows_inserted, one.finished),
        (10, 50_000, 50_000, false)
    );
    assert_eq!(month_rows(&stack).await, (50_000, 50_000));
    assert_eq!(
        reads(&stack, &shape).await,
        before,
        "reads midway (dual read)"
    );
    let two = run_copy(&pool, &mut redis, &tenant, &paused).await;
    assert_eq!((two.rows_read, two.finished), (50_000, false));
    let st = state::load(&pool).await.unwrap().unwrap();
    assert_eq!(
        (st.rows_copied, st.batches, st.status.as_str()),
        (100_000, 20, state::COPYING)
    );
    let not_done = verify::verify(&pool, &mut redis, &tenant).await.unwrap();
    assert!(
        !not_done.ok() && not_done.remaining == 100_000,
        "{}",
        not_done.remaining
    );
    let rest = run_copy(&pool, &mut redis, &tenant, &CopyOptions::default()).await;
    assert_eq!(
        (rest.rows_read, rest.rows_inserted, rest.finished),
        (100_000, 100_000, true)
    );
    assert_eq!(rest.routes_written, 50);
    println!("legacy copy: {:.0} rows/s (last run)", rest.rows_per_sec());

    // Re-running is safe: from the end nothing, from the start nothing new.
    let again = run_copy(&pool, &mut redis, &tenant, &CopyOptions::default()).await;
    assert_eq!((again.rows_read, again.finished), (0, true));
    let restart = CopyOptions {
        restart: true,
        ..CopyOptions::default()
    };
    let redo = run_copy(&pool, &mut redis, &tenant, &restart).await;
    assert_eq!((redo.rows_read, redo.rows_inserted), (200_000, 0));
    assert_eq!(
        month_rows(&stack).await,
        (200_000, 200_000),
        "no duplicates"
    );

    let report = verify::verify(&pool, &mut redis, &tenant).await.unwrap();
    assert!(
        report.ok(),
        "{:?} {:?} {:?}",
        report.mirror,
        report.routes,
        report
            .topics
            .iter()
            .find(|t| t.verdict != imstream::digest::Verdict::Identical)
    );
    assert_eq!(
        (
            report.legacy_rows(),
            report.copied_rows(),
            report.topics.len()
        ),
        (200_000, 200_000, 50)
    );
    let mirrored: i64 = sqlx::query_scalar(
        "SELECT CAST(SUM(message_count) AS SIGNED) FROM im_group_message_topic_shards",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(mirrored, 200_000);
    let months: i64 = redis::cmd("ZCARD")
        .arg(TopicKeys::new(&tenant, &Synthetic::topic(0)).route())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(months, 4, "Redis route of every copied month");
    assert_eq!(
        reads(&stack, &shape).await,
        before,
        "reads after the copy (dual read)"
    );

    cutover(&pool, &mut redis, &tenant).await.expect("cutover");
    assert!(!table::exists(&pool).await.unwrap());
    let renamed: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", table::RENAMED))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        renamed, 200_000,
        "legacy rows kept, read-only, under the new name"
    );
    let st = state::load(&pool).await.unwrap().unwrap();
    assert_eq!((st.status.as_str(), st.dual_read), (state::CUT_OVER, false));
    assert_eq!(
        reads(&stack, &shape).await,
        before,
        "reads after the cutover (month tables only)"
    );
}

/// The catalog status of every month, oldest first.
async fn statuses(pool: &sqlx::MySqlPool) -> Vec<(String, String)> {
    sqlx::query_as("SELECT shard_month, status FROM im_group_message_shards ORDER BY shard_month")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The secondary indexes of a month's group table, sorted.
async fn indexes(pool: &sqlx::MySqlPool, month: &str) -> Vec<String> {
    let mut names: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = DATABASE() \
         AND table_name = ? AND index_name <> 'PRIMARY'",
    )
    .bind(format!("im_group_messages_{month}"))
    .fetch_all(pool)
    .await
    .unwrap();
    names.sort();
    names
}

const ALL_INDEXES: [&str; 7] = [
    "idx_audit_created",
    "idx_expires",
    "idx_group_seq",
    "idx_topic_created",
    "idx_topic_from_seq",
    "uk_topic_sender_client_mid",
    "uk_topic_seq",
];

/// Past months are bulk-loaded (status `loading`, secondary indexes built
/// after their last row); a copy stopped mid-month, and one stopped after a
/// month's rows but before its indexes, both end, when run again, with every
/// index there, every status put back and verify passing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulk_loaded_months_resume_with_indexes_and_status_back() {
    let stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    let pool = stack.pool();
    let mut redis = stack.redis().await;
    let now = ShardMonth::of(Utc::now());
    let shape = legacy_rows(&pool, 30_000).await;
    plan::plan(&pool, &mut redis, &tenant).await.expect("plan");
    let planned = statuses(&pool).await;
    let past: Vec<String> = planned
        .iter()
        .filter(|(m, _)| m.as_str() < now.prev().to_string().as_str())
        .map(|(m, _)| m.clone())
        .collect();
    assert_eq!(past.len(), 3, "{planned:?}");
    for (month, status) in &planned {
        // The live months are as the shard manager left them.
        if past.contains(month) {
            assert_eq!(status, "sealed", "month {month} after plan");
        } else {
            assert_ne!(status, "sealed", "month {month} after plan");
        }
    }
    let before = reads(&stack, &shape).await;
    assert_eq!(before[0].len(), 600);

    // Stopped mid-month: the two months in progress are loading, without indexes.
    let paused = CopyOptions {
        batch_size: 1000,
        max_batches: Some(3),
        jobs: 2,
        ..CopyOptions::default()
    };
    let one = run_copy(&pool, &mut redis, &tenant, &paused).await;
    assert_eq!((one.rows_read, one.finished), (3000, false));
    let loading: Vec<String> = statuses(&pool)
        .await
        .into_iter()
        .filter(|(_, s)| s == "loading")
        .map(|(m, _)| m)
        .collect();
    // The oldest month, and the next one if the second job got a batch.
    assert!(
        loading.first() == Some(&past[0]) && loading.iter().all(|m| past[..2].contains(m)),
        "months loading: {loading:?}"
    );
    for month in &loading {
        assert_eq!(
            indexes(&pool, month).await,
            Vec::<String>::new(),
            "{month} mid-load"
        );
    }
    assert_eq!(
        indexes(&pool, &now.prev().to_string()).await,
        ALL_INDEXES,
        "the live month keeps its indexes"
    );
    let midway = verify::verify(&pool, &mut redis, &tenant).await.unwrap();
    assert!(!midway.ok());
    assert_eq!(
        (midway.remaining, midway.loading.len()),
        (27_000, loading.len())
    );
    assert_eq!(
        reads(&stack, &shape).await,
        before,
        "reads while months load (dual read)"
    );

    // Run again: everything copied, indexes built, statuses back.
    let rest = run_copy(&pool, &mut redis, &tenant, &CopyOptions::default()).await;
    assert_eq!(
        (rest.rows_read, rest.rows_inserted, rest.finished),
        (27_000, 27_000, true)
    );
    assert_eq!(rest.months_indexed, 3);
    assert_eq!(statuses(&pool).await, planned, "statuses put back");
    for (month, _) in &planned {
        assert_eq!(indexes(&pool, month).await, ALL_INDEXES, "{month}");
    }
    assert_eq!(month_rows(&stack).await, (30_000, 30_000));
    let report = verify::verify(&pool, &mut redis, &tenant).await.unwrap();
    assert!(
        report.ok(),
        "{:?} {:?} {:?}",
        report.mirror,
        report.routes,
        report.loading
    );

    // Stopped after a month's rows, before its indexes: as a crash there leaves it.
    let month = &past[0];
    sqlx::query("UPDATE im_group_message_shards SET status = 'loading' WHERE shard_month = ?")
        .bind(month)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE im_legacy_migration_months SET loading_from = 'sealed', done = 0 WHERE shard_month = ?",
    )
    .bind(month)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "ALTER TABLE im_group_messages_{month} DROP INDEX uk_topic_seq, DROP INDEX idx_topic_created"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let not_yet = verify::verify(&pool, &mut redis, &tenant).await.unwrap();
    assert!(
        !not_yet.ok() && not_yet.remaining == 0,
        "{:?}",
        not_yet.loading
    );
    let again = run_copy(&pool, &mut redis, &tenant, &CopyOptions::default()).await;
    assert_eq!(
        (again.rows_read, again.months_indexed, again.finished),
        (0, 1, true)
    );
    assert_eq!(indexes(&pool, month).await, ALL_INDEXES);
    assert_eq!(statuses(&pool).await, planned);
    let report = verify::verify(&pool, &mut redis, &tenant).await.unwrap();
    assert!(
        report.ok(),
        "{:?} {:?} {:?}",
        report.mirror,
        report.routes,
        report.loading
    );

    // From the start again: nothing new, nothing dropped, nothing doubled.
    let restart = CopyOptions {
        restart: true,
        ..CopyOptions::default()
    };
    let redo = run_copy(&pool, &mut redis, &tenant, &restart).await;
    assert_eq!(
        (redo.rows_read, redo.rows_inserted, redo.months_indexed),
        (30_000, 0, 0)
    );
    assert_eq!(statuses(&pool).await, planned);
    assert_eq!(month_rows(&stack).await, (30_000, 30_000), "no duplicates");
    assert!(verify::verify(&pool, &mut redis, &tenant)
        .await
        .unwrap()
        .ok());
    assert_eq!(
        reads(&stack, &shape).await,
        before,
        "reads after the copy (dual read)"
    );
}
