//! Exact identities (issue 28): names that differ only in case are different
//! names everywhere, against the real MariaDB.
//!
//! - The attack as reported: one-to-one topic names are base64 of the two
//!   uids, so `p2p(1105, 1200)` and `p2p(1105, 1174)` differ only in one
//!   letter's case. User 1174 must neither read the pair's messages nor write
//!   into their conversation by talking to 1105.
//! - `imstream migrate` converts a database made before migration 0023 (its
//!   tenant tables and its month tables, rows kept byte for byte) and says
//!   what it did; two rows that differ only in case then stay two rows.
//! - A database whose identity columns compare inexactly is refused at
//!   start, naming the column.

mod common;

use std::time::Duration;

use serde_json::{json, Value};

use common::{wait_for, Stack};
use imstream::tinode::p2p_topic;

const VICTIM_A: i64 = 1105;
const VICTIM_B: i64 = 1200;
const ATTACKER: i64 = 1174;

async fn get(stack: &Stack, uid: i64, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("http://{}{path}", stack.gateway_addr(0)))
        .bearer_auth(stack.token(uid, "http"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn send_p2p(stack: &Stack, uid: i64, peer: i64, cmid: &str, text: &str) -> (u16, Value) {
    common::call(
        stack,
        stack.gateway_addr(0),
        uid,
        "POST",
        &format!("/v1/users/{peer}/messages"),
        json!({"content": text, "client_msg_id": cmid}),
    )
    .await
}

/// `(seq, from, content)` of every message of a page.
fn messages(page: &Value) -> Vec<(i64, String, Value)> {
    page["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    (
                        m["seq"].as_i64().unwrap_or(0),
                        m["from"].as_str().unwrap_or("").to_string(),
                        m["content"].clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_one_to_one_topic_that_differs_only_in_case_is_another_conversation() {
    let victims = p2p_topic(VICTIM_A, VICTIM_B);
    let attackers = p2p_topic(VICTIM_A, ATTACKER);
    assert_ne!(victims, attackers);
    assert_eq!(
        victims.to_lowercase(),
        attackers.to_lowercase(),
        "the attack needs two pair names that differ only in case"
    );

    let stack = Stack::running().await;
    for i in 1..=3 {
        let (code, body) = send_p2p(
            &stack,
            VICTIM_A,
            VICTIM_B,
            &format!("v{i}"),
            &format!("secret-{i}"),
        )
        .await;
        assert_eq!(code, 202, "{body}");
    }
    // Stored: the victims read their three messages from MySQL.
    let pool = stack.pool();
    wait_for("the victims' messages stored", Duration::from_secs(60), || {
        let pool = pool.clone();
        let topic = victims.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(message_count), 0) AS SIGNED) FROM im_group_message_topic_shards WHERE topic = ?",
            )
            .bind(&topic)
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if n == 3 {
                Ok(())
            } else {
                Err(format!("{n} stored"))
            }
        }
    })
    .await;
    let victims_path = format!("/v1/users/{VICTIM_B}/messages?since=1");
    let (code, before) = get(&stack, VICTIM_A, &victims_path).await;
    assert_eq!(code, 200, "{before}");
    assert_eq!(messages(&before).len(), 3, "{before}");

    // Reading: the attacker's own conversation with 1105 is empty.
    let (code, page) = get(&stack, ATTACKER, &format!("/v1/users/{VICTIM_A}/messages")).await;
    assert_eq!(code, 200, "{page}");
    assert_eq!(
        messages(&page),
        vec![],
        "the attacker read another pair's conversation: {page}"
    );
    // Nor any message of it by seq.
    for seq in 1..=3 {
        let resp = reqwest::Client::new()
            .get(format!(
                "http://{}/v1/groups/{attackers}/messages/{seq}",
                stack.gateway_addr(0)
            ))
            .bearer_auth(stack.token(ATTACKER, "http"))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        assert!(
            !body.contains("secret"),
            "seq {seq} read through the case variant: {status} {body}"
        );
    }

    // Writing: the attacker's message goes into its own conversation, as
    // its first message, on the first try.
    let (code, body) = send_p2p(&stack, ATTACKER, VICTIM_A, "a1", "injected").await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["seq"], 1, "the attacker's own first message: {body}");
    wait_for("the attacker's message stored", Duration::from_secs(60), || {
        let pool = pool.clone();
        let topic = attackers.clone();
        async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(message_count), 0) AS SIGNED) FROM im_group_message_topic_shards WHERE topic = ?",
            )
            .bind(&topic)
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
            if n == 1 {
                Ok(())
            } else {
                Err(format!("{n} stored"))
            }
        }
    })
    .await;
    let (code, after) = get(&stack, VICTIM_A, &victims_path).await;
    assert_eq!(code, 200, "{after}");
    assert_eq!(
        messages(&after),
        messages(&before),
        "the victims' history changed"
    );
    let (_, own) = get(&stack, ATTACKER, &format!("/v1/users/{VICTIM_A}/messages")).await;
    assert_eq!(
        messages(&own),
        vec![(1, "usr1174".to_string(), json!("injected"))],
        "{own}"
    );
    // The month table holds both conversations' seq 1, under their own names.
    let month = chrono::Utc::now().format("%Y%m").to_string();
    let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT CAST(topic AS CHAR), seqid FROM im_p2p_messages_{month} \
         WHERE topic IN (?, ?) AND seqid = 1 ORDER BY topic"
    ))
    .bind(&victims)
    .bind(&attackers)
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected = vec![(victims.clone(), 1), (attackers.clone(), 1)];
    expected.sort();
    assert_eq!(rows, expected);
}

/// The tenant migrations up to `last` only (a database as an older release
/// left it).
fn migrator_up_to(last: i64) -> sqlx::migrate::Migrator {
    let all = &imstream::tenant::TENANT_MIGRATOR;
    sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            all.migrations
                .iter()
                .filter(|m| m.version <= last)
                .cloned()
                .collect(),
        ),
        ignore_missing: all.ignore_missing,
        locking: all.locking,
        no_tx: all.no_tx,
    }
}

/// `(DATA_TYPE, COLLATION_NAME)` of one column.
async fn column_type(pool: &sqlx::MySqlPool, table: &str, column: &str) -> (String, String) {
    let (t, c): (Vec<u8>, Option<Vec<u8>>) = sqlx::query_as(
        "SELECT DATA_TYPE, COLLATION_NAME FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
    )
    .bind(table)
    .bind(column)
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("{table}.{column}: {e}"));
    (
        String::from_utf8(t).unwrap(),
        c.map(|c| String::from_utf8(c).unwrap()).unwrap_or_default(),
    )
}

#[tokio::test]
async fn migrate_makes_an_older_database_exact_and_keeps_its_rows() {
    let world = common::World::config_only();
    let config = &world.config;
    let tenant = &config.tenants[0];
    let mysql = tenant.mysql(&config.mysql);
    imstream::tenant::create_database(&mysql, &tenant.database)
        .await
        .unwrap();
    let pool = imstream::tenant::unverified_pool(&mysql, &tenant.database).unwrap();
    migrator_up_to(22).run(&pool).await.unwrap();
    assert_eq!(
        column_type(&pool, "im_group_members", "topic").await,
        ("varchar".into(), "utf8mb4_unicode_ci".into()),
        "the database starts as an older release left it"
    );
    // A month table from the old template, with rows.
    sqlx::query("CREATE TABLE im_group_messages_202001 LIKE im_group_messages")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO im_group_messages_202001 (topic, group_id, seqid, from_user, client_msg_id, \
         content, created_at, updated_at) VALUES \
         ('grpOld', 1, 1, 7, 'Ümlaut-1', JSON_QUOTE('x'), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3)), \
         ('grpOld', 1, 2, 7, 'plain', JSON_QUOTE('y'), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO im_group_members (topic, uid, role, joined_at, updated_at) \
         VALUES ('grpCase', 1, 'owner', UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Under the old collation a case variant is the same key.
    let dup = sqlx::query(
        "INSERT INTO im_group_members (topic, uid, role, joined_at, updated_at) \
         VALUES ('grpcase', 1, 'member', UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
    )
    .execute(&pool)
    .await;
    assert!(dup.is_err(), "the old collation folds case");

    // Refused before the migration, naming a column.
    let err = imstream::exact::verify(&pool, &tenant.database)
        .await
        .expect_err("an inexact database is refused");
    let text = err.to_string();
    assert!(
        text.contains(&tenant.database)
            && text.contains("identity column im_")
            && text.contains("imstream migrate"),
        "{text}"
    );

    let done = imstream::tenant::migrate(config, None).await.unwrap();
    let report = &done[0].1;
    assert!(
        report.applied.iter().any(|(v, _)| *v == 23),
        "{:?}",
        report.applied
    );
    let mut converted: Vec<(&str, &str)> = report
        .converted
        .iter()
        .map(|(t, c, _)| (t.as_str(), c.as_str()))
        .collect();
    converted.sort();
    assert_eq!(
        converted,
        vec![
            ("im_group_messages_202001", "client_msg_id"),
            ("im_group_messages_202001", "topic")
        ]
    );
    for (table, column, _) in imstream::exact::IDENTITY_COLUMNS {
        assert_eq!(
            column_type(&pool, table, column).await.0,
            "varbinary",
            "{table}.{column}"
        );
    }
    for (column, _) in imstream::exact::MONTH_IDENTITY_COLUMNS {
        assert_eq!(
            column_type(&pool, "im_group_messages_202001", column)
                .await
                .0,
            "varbinary"
        );
    }
    imstream::exact::verify(&pool, &tenant.database)
        .await
        .expect("exact after migrate");
    // Rows kept byte for byte.
    let rows: Vec<(Vec<u8>, i64, Vec<u8>)> = sqlx::query_as(
        "SELECT topic, seqid, client_msg_id FROM im_group_messages_202001 ORDER BY seqid",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (b"grpOld".to_vec(), 1, "Ümlaut-1".as_bytes().to_vec()),
            (b"grpOld".to_vec(), 2, b"plain".to_vec())
        ]
    );
    // Now two names that differ only in case are two rows, and each
    // reads back alone.
    sqlx::query(
        "INSERT INTO im_group_members (topic, uid, role, joined_at, updated_at) \
         VALUES ('grpcase', 1, 'member', UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
    )
    .execute(&pool)
    .await
    .expect("a case variant is another key");
    for (topic, role) in [("grpCase", "owner"), ("grpcase", "member")] {
        let roles: Vec<String> =
            sqlx::query_scalar("SELECT role FROM im_group_members WHERE topic = ?")
                .bind(topic)
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(roles, vec![role.to_string()], "{topic}");
    }
    // Trailing spaces are not padded away.
    let padded: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM im_group_members WHERE topic = 'grpCase '")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(padded, 0);
    // A second run has nothing left to do.
    let again = imstream::tenant::migrate(config, None).await.unwrap();
    assert!(again[0].1.applied.is_empty() && again[0].1.converted.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_with_an_inexact_identity_column_is_refused_at_start() {
    let stack = Stack::prepared(None).await;
    let pool = stack.pool();
    sqlx::query(
        "ALTER TABLE im_favorites MODIFY COLUMN topic VARCHAR(64) \
         CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci NOT NULL",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let gateway = imstream::gateway::start(
        stack.config(),
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        stack.world.shutdown.child(),
    )
    .await;
    let err = match gateway {
        Ok(_) => panic!("a gateway started on an inexact database"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("im_favorites.topic"), "{err}");
    // A pipeline refuses it too.
    let (ok, out) = stack.imstream(&["project", "store"]);
    assert!(!ok, "{out}");
    assert!(out.contains("im_favorites.topic"), "{out}");
    // The pools every process uses refuse their connections as well.
    let refused = sqlx::query("SELECT 1").execute(&stack.pool()).await;
    assert!(refused.is_err(), "a query ran on an inexact database");
    // `imstream migrate` puts the column back, and says so; then the
    // database is used again.
    let (ok, out) = stack.imstream(&["migrate"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("im_favorites.topic converted from varchar(64) utf8mb4_unicode_ci"),
        "{out}"
    );
    sqlx::query("SELECT 1")
        .execute(&stack.pool())
        .await
        .expect("exact again");
    imstream::gateway::start(
        stack.config(),
        "127.0.0.1:0".parse().unwrap(),
        imstream::telemetry::Readiness::default(),
        stack.world.shutdown.child(),
    )
    .await
    .expect("a gateway starts on the migrated database");
}
