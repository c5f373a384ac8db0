//! Tenants spread over MySQL servers, with a read replica (issue 16; seed
//! 003 §11.1) against real MariaDB servers the local stack starts: tenant A
//! on the main server, tenant B on server B with server B's replica
//! (MariaDB replication) for history reads. B's database, month tables and
//! rows live on server B only; B's history is read from the replica while
//! it keeps up, and from the primary once it lags past the bound (its
//! replication stopped), so a message sent meanwhile is still readable; the
//! replica is used again once it caught up.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use imstream::config::TenantConfig;
use imstream::store::month::ShardMonth;

use common::{wait_for, Stack};

const TOPIC: &str = "grpServers";
const OWNER: i64 = 3101;
const MEMBER: i64 = 3102;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}
fn server_b_url() -> String {
    env_or(
        "IMSTREAM_MYSQL_B_URL",
        "mysql://imstream:imstream@127.0.0.1:13307",
    )
}
fn replica_url() -> String {
    env_or(
        "IMSTREAM_MYSQL_REPLICA_URL",
        "mysql://imstream:imstream@127.0.0.1:13308",
    )
}

fn server_pool(url: &str) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .connect_lazy(url)
        .expect("server pool")
}

async fn database_exists(server: &sqlx::MySqlPool, db: &str) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?",
    )
    .bind(db)
    .fetch_one(server)
    .await
    .unwrap();
    n > 0
}

fn token(stack: &Stack, tenant: &str, uid: i64) -> String {
    imstream::auth::Tokens::new(stack.config())
        .issue(tenant, uid, "web", 0, 0)
        .token
}

async fn request(
    method: reqwest::Method,
    addr: SocketAddr,
    token: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("http://{addr}{path}"))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("gateway reachable");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Rows of the topic in this month's table of `pool`'s database.
async fn rows(pool: &sqlx::MySqlPool) -> i64 {
    let month = ShardMonth::of(chrono::Utc::now());
    sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM im_group_messages_{month} WHERE topic = ?"
    ))
    .bind(TOPIC)
    .fetch_one(pool)
    .await
    .unwrap_or(-1)
}

async fn wait_rows(what: &str, pool: &sqlx::MySqlPool, n: i64) {
    wait_for(what, Duration::from_secs(60), || async {
        match rows(pool).await {
            got if got == n => Ok(()),
            got => Err(format!("{got} rows")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_on_its_own_server_reads_history_from_its_replica_unless_it_lags() {
    let mut stack = Stack::prepared(None).await;
    let tenant_a = stack.tenant().to_string();
    let tenant_b = format!("{tenant_a}b");
    let db_b = format!("imt_{}_b", stack.world.id);
    stack.world.config.tenants.push(TenantConfig {
        id: tenant_b.clone(),
        database: db_b.clone(),
        mysql_url: Some(server_b_url()),
        mysql_read_url: Some(replica_url()),
        ..Default::default()
    });
    stack.world.config.mysql.replica_max_lag_ms = 300;
    stack.world.config.mysql.replica_heartbeat_ms = 100;
    imstream::tenant::migrate(stack.config(), Some(&tenant_b))
        .await
        .expect("migrate tenant b on server b");
    imstream::send::establish_generations(stack.config())
        .await
        .expect("generations");
    stack.shard_pass(None).await;
    for p in ["store", "members"] {
        stack.start_pipeline(p).await;
    }
    let gw = stack.start_gateway("servers").await;

    // B's database is on server B, not on the main server.
    let main = server_pool(&common::mysql_url());
    let server_b = server_pool(&server_b_url());
    let replica_server = server_pool(&replica_url());
    assert!(database_exists(&server_b, &db_b).await);
    assert!(
        !database_exists(&main, &db_b).await,
        "tenant B's database on the main server"
    );
    let pool_b = server_pool(&format!("{}/{db_b}", server_b_url()));
    let replica = server_pool(&format!("{}/{db_b}", replica_url()));

    // The same group in both tenants, created and sent to over HTTP.
    let (a_owner, b_owner) = (
        token(&stack, &tenant_a, OWNER),
        token(&stack, &tenant_b, OWNER),
    );
    for t in [&a_owner, &b_owner] {
        let (status, body) = request(
            reqwest::Method::POST,
            gw,
            t,
            "/v1/groups",
            Some(json!({"topic": TOPIC, "name": "servers", "members": [MEMBER]})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let send = |t: &str, id: &str, text: &str| {
        let (t, id, text) = (t.to_string(), id.to_string(), text.to_string());
        async move {
            let mut last = (0, Value::Null);
            // The group may still be being projected.
            for _ in 0..100 {
                last = request(
                    reqwest::Method::POST,
                    gw,
                    &t,
                    &format!("/v1/groups/{TOPIC}/messages"),
                    Some(json!({"content": text, "client_msg_id": id})),
                )
                .await;
                if last.0 == 202 {
                    return last.1["seq"].as_i64().expect("seq");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("send {id}: {last:?}");
        }
    };
    for i in 1..=3 {
        assert_eq!(
            send(&a_owner, &format!("a{i}"), &format!("tenant A {i}")).await,
            i
        );
        assert_eq!(
            send(&b_owner, &format!("b{i}"), &format!("tenant B {i}")).await,
            i
        );
    }
    wait_rows("tenant A's rows on the main server", &stack.pool(), 3).await;
    wait_rows("tenant B's rows on server B", &pool_b, 3).await;
    wait_rows("tenant B's rows replicated", &replica, 3).await;

    // Mark the replica's copy of B's first message, so a read shows where
    // it came from (the primary never changes this row again).
    let month = ShardMonth::of(chrono::Utc::now());
    sqlx::query(&format!(
        "UPDATE im_group_messages_{month} SET content = '\"from the replica\"' WHERE topic = ? AND seqid = 1"
    ))
    .bind(TOPIC)
    .execute(&replica)
    .await
    .unwrap();
    let first = |token: String| async move {
        let (status, body) = request(
            reqwest::Method::GET,
            gw,
            &token,
            &format!("/v1/groups/{TOPIC}/messages/1"),
            None,
        )
        .await;
        (status, body["content"].clone())
    };
    let b_member = token(&stack, &tenant_b, MEMBER);
    wait_for(
        "B's history read from the replica",
        Duration::from_secs(30),
        || async {
            match first(b_member.clone()).await {
                (200, c) if c == json!("from the replica") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // Tenant A, on the main server without a replica, is unaffected.
    assert_eq!(
        first(token(&stack, &tenant_a, MEMBER)).await,
        (200, json!("tenant A 1"))
    );

    // The replica stops applying: past the lag bound, reads go to the
    // primary, and a message sent meanwhile is readable.
    sqlx::query("STOP SLAVE SQL_THREAD")
        .execute(&replica_server)
        .await
        .expect("stop the replica's SQL thread");
    wait_for(
        "B's history read from the primary",
        Duration::from_secs(30),
        || async {
            match first(b_member.clone()).await {
                (200, c) if c == json!("tenant B 1") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(send(&b_owner, "b4", "sent while the replica lags").await, 4);
    wait_rows("B's fourth row on server B", &pool_b, 4).await;
    let (status, body) = request(
        reqwest::Method::GET,
        gw,
        &b_member,
        &format!("/v1/groups/{TOPIC}/messages?limit=10"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let seqs: Vec<i64> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, vec![4, 3, 2, 1], "{body}");
    assert_eq!(
        rows(&replica).await,
        3,
        "the replica did not apply the fourth"
    );

    // Caught up again: the replica serves reads again.
    sqlx::query("START SLAVE")
        .execute(&replica_server)
        .await
        .expect("start the replica");
    wait_rows("the fourth row replicated", &replica, 4).await;
    wait_for(
        "B's history read from the replica again",
        Duration::from_secs(30),
        || async {
            match first(b_member.clone()).await {
                (200, c) if c == json!("from the replica") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}
