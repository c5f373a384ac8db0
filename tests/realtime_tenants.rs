//! Tenant isolation on the realtime bus (ARCHITECTURE.md §8): two tenants
//! with their own databases share the gateways, a topic name and even the
//! uids, and a session of one tenant never gets anything of the other —
//! neither through the pipelines nor from an envelope published straight to
//! the gateway's node channel.

mod common;
mod realtime_support;

use std::time::Duration;

use serde_json::{json, Value};

use common::{wait_for, Stack};
use realtime_support::{node_of, publish_envelope, token_for, usr, Client, DELIVERY};

use imstream::realtime::{Envelope, Kind, TargetType};

const TOPIC: &str = "grpSharedName";
const OWNER: i64 = 81;
const MEMBER: i64 = 82;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_never_gets_another_tenants_realtime_traffic() {
    // The stack of Stack::realtime(2), with a second tenant configured
    // before anything starts.
    let mut stack = Stack::prepared(None).await;
    let tenant_a = stack.tenant().to_string();
    let tenant_b = format!("{tenant_a}b");
    let tenant_b_config = imstream::config::TenantConfig {
        id: tenant_b.clone(),
        database: format!("imt_{}_b", stack.world.id),
        signing_keys: Vec::new(),
        ..Default::default()
    };
    stack.world.config.tenants.push(tenant_b_config.clone());
    imstream::tenant::migrate(stack.config(), Some(&tenant_b))
        .await
        .expect("migrate tenant b");
    imstream::send::establish_generations(stack.config())
        .await
        .expect("generations");
    stack.shard_pass(None).await;
    stack.world.config.gateway.heartbeat_secs = 1;
    for p in imstream::pipeline::PIPELINES {
        stack.start_pipeline(p).await;
    }
    stack.start_gateway("gw0").await;
    stack.start_gateway("gw1").await;

    // The same topic name, the same uids, in both tenants.
    stack.create_group(TOPIC, OWNER, &[MEMBER]).await;
    let pool_b =
        imstream::tenant::database_pool(&stack.config().mysql, &tenant_b_config.database).unwrap();
    create_group_via_http(&stack, &tenant_b, &pool_b).await;

    let config = stack.config().clone();
    let tok = |tenant: &str, uid: i64, dev: &str| token_for(&config, tenant, uid, dev, 0);
    // Both tenants' members on gateway 0, their owners sending from gateway 1.
    let a_member = Client::open_sub(
        stack.gateway_addr(0),
        &tok(&tenant_a, MEMBER, "d"),
        TOPIC,
        "A-member@gw0",
    )
    .await;
    let b_member = Client::open_sub(
        stack.gateway_addr(0),
        &tok(&tenant_b, MEMBER, "d"),
        TOPIC,
        "B-member@gw0",
    )
    .await;
    let mut a_owner = Client::open_sub(
        stack.gateway_addr(1),
        &tok(&tenant_a, OWNER, "d"),
        TOPIC,
        "A-owner@gw1",
    )
    .await;
    let mut b_owner = Client::open_sub(
        stack.gateway_addr(1),
        &tok(&tenant_b, OWNER, "d"),
        TOPIC,
        "B-owner@gw1",
    )
    .await;

    // Messages through the pipelines: both tenants' first message has seq 1.
    let sa = a_owner.send_text(TOPIC, "for tenant A").await;
    let da = a_member.expect_data(TOPIC, sa).await;
    assert_eq!(da["content"], json!({"txt": "for tenant A"}));
    // Gateway 0 has dispatched A's message; B's message, sent now, reaches
    // B's member after anything gateway 0 could have queued for it before.
    let sb = b_owner.send_text(TOPIC, "for tenant B").await;
    assert_eq!((sa, sb), (1, 1), "each tenant has its own seqs");
    b_member
        .expect("B's message", DELIVERY, |f| {
            f["data"]["content"] == json!({"txt": "for tenant B"})
        })
        .await;
    // And once more the other way round.
    let sa2 = a_owner.send_text(TOPIC, "for tenant A again").await;
    a_member.expect_data(TOPIC, sa2).await;
    let mentions = |c: &Client, text: &str| c.count(|f| f.to_string().contains(text));
    assert_eq!(
        mentions(&b_member, "for tenant A"),
        0,
        "B's member: {:?}",
        b_member.frames()
    );
    assert_eq!(
        mentions(&a_member, "for tenant B"),
        0,
        "A's member: {:?}",
        a_member.frames()
    );

    // Receipts: B's member reads on one device; B's owner and B's member's
    // other device hear of it, tenant A's sessions (same uids) do not.
    let mut b_member = b_member;
    let b_member2 = Client::open_sub(
        stack.gateway_addr(0),
        &tok(&tenant_b, MEMBER, "d2"),
        TOPIC,
        "B-member2@gw0",
    )
    .await;
    b_member.note(TOPIC, "read", Some(sb)).await;
    let read_of_b_member =
        |f: &Value| f["info"]["what"] == json!("read") && f["info"]["from"] == json!(usr(MEMBER));
    b_owner
        .expect("B's read at B's owner", DELIVERY, read_of_b_member)
        .await;
    b_member2
        .expect("B's read at B's member's other device", DELIVERY, |f| {
            f["pres"]["topic"] == json!("me") && f["pres"]["what"] == json!("read")
        })
        .await;
    // Both gateways have dispatched the receipts; one more message each way
    // reaches tenant A's sessions after anything queued for them before.
    let mut a_member = a_member;
    let x = a_member.send_text(TOPIC, "A marker to the owner").await;
    a_owner.expect_data(TOPIC, x).await;
    let y = a_owner.send_text(TOPIC, "A marker to the member").await;
    a_member.expect_data(TOPIC, y).await;
    for c in [&a_owner, &a_member] {
        assert_eq!(
            c.count(|f| f.get("info").is_some()),
            0,
            "[{}] never hears of B's read: {:?}",
            c.label,
            c.frames()
        );
    }

    // Envelopes published straight to gateway 0's node channel: one of an
    // unknown tenant and one of tenant A, both for the shared topic name,
    // then a marker for tenant B on the same channel (Pub/Sub keeps the
    // order of one channel).
    let mut redis = stack.redis().await;
    let channel = format!("im:rt:node:{}", node_of(&stack, 0));
    let envelope = |tenant: &str, target_type: TargetType, target: &str, payload: Value| Envelope {
        event_id: uuid::Uuid::new_v4().to_string(),
        tenant_id: tenant.to_string(),
        kind: Kind::Deliver,
        target_type,
        target: target.to_string(),
        skip_sid: String::new(),
        dedup_key: String::new(),
        occurred_at: imstream::events::now_ms(),
        payload: payload.to_string(),
        exclude: Vec::new(),
    };
    let forged = |who: &str| json!({"data": {"topic": TOPIC, "from": usr(OWNER), "seq": 999, "content": {"txt": who}}});
    publish_envelope(
        &mut redis,
        &channel,
        &envelope(
            "nosuchtenant",
            TargetType::Topic,
            TOPIC,
            forged("forged-unknown"),
        ),
    )
    .await;
    publish_envelope(
        &mut redis,
        &channel,
        &envelope(
            &tenant_a,
            TargetType::Topic,
            TOPIC,
            forged("forged-A-topic"),
        ),
    )
    .await;
    publish_envelope(
        &mut redis,
        &channel,
        &envelope(
            &tenant_a,
            TargetType::User,
            &MEMBER.to_string(),
            forged("forged-A-user"),
        ),
    )
    .await;
    publish_envelope(
        &mut redis,
        &channel,
        &envelope(
            &tenant_a,
            TargetType::Device,
            &format!("{MEMBER}/d"),
            forged("forged-A-device"),
        ),
    )
    .await;
    publish_envelope(
        &mut redis,
        &channel,
        &envelope(
            &tenant_b,
            TargetType::User,
            &MEMBER.to_string(),
            forged("marker-B"),
        ),
    )
    .await;
    // A close for tenant A's member must not close tenant B's.
    let mut close = envelope(
        &tenant_a,
        TargetType::User,
        &MEMBER.to_string(),
        json!("signed out"),
    );
    close.kind = Kind::Close;
    close.payload = "signed out".into();
    publish_envelope(&mut redis, &channel, &close).await;

    b_member
        .expect("the marker for tenant B", DELIVERY, |f| {
            f.to_string().contains("marker-B")
        })
        .await;
    a_member
        .expect("tenant A's own envelopes", DELIVERY, |f| {
            f.to_string().contains("forged-A-device")
        })
        .await;
    assert_eq!(
        a_member.count(|f| f.to_string().contains("forged-A-")),
        3,
        "{:?}",
        a_member.frames()
    );
    for text in ["forged-unknown", "forged-A-"] {
        assert_eq!(
            mentions(&b_member, text),
            0,
            "B's member got {text:?}: {:?}",
            b_member.frames()
        );
    }
    assert_eq!(mentions(&a_member, "forged-unknown"), 0);
    assert_eq!(mentions(&a_member, "marker-B"), 0);
    let frames = a_member.expect_closed(DELIVERY).await;
    assert_eq!(
        realtime_support::closing_reason(&frames).as_deref(),
        Some("signed out")
    );
    // B's member (same uid, same device name, same gateway) stays.
    b_member.assert_alive(TOPIC).await;
    let sb2 = b_owner.send_text(TOPIC, "B still here").await;
    b_member.expect_data(TOPIC, sb2).await;
}

/// Creates TOPIC in `tenant` through the HTTP API and waits until its
/// members are projected.
async fn create_group_via_http(stack: &Stack, tenant: &str, pool: &sqlx::MySqlPool) {
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/groups", stack.gateway_addr(1)))
        .bearer_auth(token_for(stack.config(), tenant, OWNER, "d", 0))
        .json(&json!({"topic": TOPIC, "name": "tenant B's group", "members": [MEMBER]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201, "{:?}", resp.text().await);
    wait_for(
        "tenant B's group projected",
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            async move {
                let n: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM im_group_members WHERE topic = ?")
                        .bind(TOPIC)
                        .fetch_one(&pool)
                        .await
                        .map_err(|e| e.to_string())?;
                if n == 2 {
                    Ok(())
                } else {
                    Err(format!("{n} members"))
                }
            }
        },
    )
    .await;
}
