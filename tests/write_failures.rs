//! No write hides a failure (issue 28): the references writers (reports,
//! favorites, a group's files) and the stats pipeline's sender rows used
//! `INSERT IGNORE`, which turns a value that does not fit into a warning
//! and a truncated (or missing) row. Now a repeated row is still a no-op
//! (`ON DUPLICATE KEY UPDATE` of nothing), and anything else is an error
//! the pipeline sees (a retry or a DLQ record), against a real database.

mod common;

use imstream::references::{favorites, files, reports};

use common::World;

async fn count(pool: &sqlx::MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn a_value_that_does_not_fit_fails_and_a_repeat_changes_nothing() {
    let world = World::config_only();
    imstream::tenant::migrate(&world.config, None)
        .await
        .expect("migrate");
    let pool =
        imstream::tenant::database_pool(&world.config.mysql, &world.config.tenants[0].database)
            .expect("pool");
    let now = imstream::events::now_ms();
    let topic = "grpWriteFailures";
    let too_long_topic = format!("grp{}", "x".repeat(70));

    // A report whose reason is longer than its column (500).
    let result = reports::record(&pool, "r-long", topic, 1, 5, &"r".repeat(600), now).await;
    assert!(
        result.is_err(),
        "a 600-character reason was accepted: {result:?}"
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM im_message_reports").await,
        0,
        "no truncated report row"
    );
    // The same report twice: one row, the first reason kept.
    reports::record(&pool, "r-ok", topic, 1, 5, "spam", now)
        .await
        .unwrap();
    reports::record(&pool, "r-ok", topic, 1, 5, "other", now)
        .await
        .unwrap();
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM im_message_reports WHERE report_id = 'r-ok'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(reason, "spam");

    // A favorite and a file of a topic name longer than the column (64).
    let result = favorites::add(&pool, 5, &too_long_topic, 1, now).await;
    assert!(
        result.is_err(),
        "a favorite of a 73-character topic was accepted: {result:?}"
    );
    let result = files::record(
        &pool,
        &[(too_long_topic.clone(), 1, files::FileKind::Image, now)],
    )
    .await;
    assert!(
        result.is_err(),
        "a file of a 73-character topic was accepted: {result:?}"
    );
    assert_eq!(
        count(&pool, "SELECT COUNT(*) FROM im_favorites").await
            + count(&pool, "SELECT COUNT(*) FROM im_group_files").await,
        0,
        "no truncated favorite or file row"
    );
    // Repeats stay no-ops.
    for _ in 0..2 {
        favorites::add(&pool, 5, topic, 1, now).await.unwrap();
        files::record(
            &pool,
            &[(topic.to_string(), 1, files::FileKind::Image, now)],
        )
        .await
        .unwrap();
    }
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM im_favorites").await, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM im_group_files").await, 1);
}
