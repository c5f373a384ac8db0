//! `imstream legacy` against the real services (seed 000 §9, §12 item 12):
//! 200,000 legacy rows over 4 months in 50 topics; the copy is interrupted
//! twice and resumed, then re-run from the start; verify passes, nothing is
//! duplicated, the mirror and Redis routes match, the seq allocator is
//! raised above the legacy seqs, and history reads are identical before the
//! copy (legacy only, dual read), midway, after it and after the cutover
//! (month tables only).

mod common;

use chrono::Utc;
use imstream::history::{History, PageQuery, StoredMessage};
use imstream::keys::TopicKeys;
use imstream::legacy::bench::{fill_synthetic, Synthetic};
use imstream::legacy::copy::{copy, CopyOptions};
use imstream::legacy::{cutover, plan, state, table, verify};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legacy_table_moves_into_month_tables_with_pauses_and_identical_reads() {
    let stack = Stack::prepared(None).await;
    let tenant = stack.tenant().to_string();
    let pool = stack.pool();
    let mut redis = stack.redis().await;
    let mut first = ShardMonth::of(Utc::now());
    for _ in 0..4 {
        first = first.prev();
    }
    let shape = Synthetic {
        rows: 200_000,
        topics: 50,
        first,
        months: 4,
    };
    fill_synthetic(&pool, &shape).await.expect("legacy rows");
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
    assert_eq!(p.months.keys().next(), Some(&first));
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
    let shutdown = imstream::shutdown::Shutdown::new();
    let paused = CopyOptions {
        max_batches: Some(10),
        ..CopyOptions::default()
    };
    let one = copy(&pool, &mut redis, &tenant, &paused, &shutdown)
        .await
        .expect("copy 1");
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
    let two = copy(&pool, &mut redis, &tenant, &paused, &shutdown)
        .await
        .expect("copy 2");
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
    let rest = copy(
        &pool,
        &mut redis,
        &tenant,
        &CopyOptions::default(),
        &shutdown,
    )
    .await
    .expect("copy 3");
    assert_eq!(
        (rest.rows_read, rest.rows_inserted, rest.finished),
        (100_000, 100_000, true)
    );
    assert_eq!(rest.routes_written, 50);
    println!("legacy copy: {:.0} rows/s (last run)", rest.rows_per_sec());

    // Re-running is safe: from the end nothing, from the start nothing new.
    let again = copy(
        &pool,
        &mut redis,
        &tenant,
        &CopyOptions::default(),
        &shutdown,
    )
    .await
    .unwrap();
    assert_eq!((again.rows_read, again.finished), (0, true));
    let restart = CopyOptions {
        restart: true,
        ..CopyOptions::default()
    };
    let redo = copy(&pool, &mut redis, &tenant, &restart, &shutdown)
        .await
        .unwrap();
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
            .find(|t| t.verdict != imstream::replay::digest::Verdict::Identical)
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
