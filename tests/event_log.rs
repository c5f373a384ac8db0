//! Topics, tenant databases and the event log end to end: `topics ensure`
//! creates every topic with its partitions and retention, `migrate` creates
//! the tenant schema, and an event produced with acks=all comes back from
//! Kafka decoded.

mod common;

use std::time::Duration;

use rdkafka::admin::{AdminOptions, ResourceSpecifier};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use sqlx::Row;

use imstream::events::*;
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::{self, Ensured, TopicKind, TopicNames};
use imstream::registry::client;

use common::World;

/// On a production configuration (not `kafka.single_broker`) a replication
/// that can lose an acknowledged message is refused, saying why, and
/// nothing is created.
#[tokio::test]
async fn topics_ensure_refuses_a_losable_replication() {
    let mut world = World::config_only();
    world.config.kafka.single_broker = false;
    let err = topics::ensure(&world.config)
        .await
        .expect_err("replication factor 1 outside a single-broker stack");
    let text = err.to_string();
    assert!(text.contains("replication_factor = 1"), "{text}");
    assert!(text.contains("single_broker"), "{text}");
    // The one broker still holds none of this world's topics.
    world.config.kafka.single_broker = true;
    let created = topics::ensure(&world.config).await.expect("ensure");
    assert!(
        created.iter().all(|(_, e)| *e == Ensured::Created),
        "{created:?}"
    );
}

#[tokio::test]
async fn topics_ensure_creates_every_topic_once() {
    let world = World::config_only();
    let first = topics::ensure(&world.config).await.expect("ensure");
    let wanted = topics::desired_topics(&world.config.kafka);
    assert_eq!(first.len(), wanted.len());
    assert!(
        first.iter().all(|(_, e)| *e == Ensured::Created),
        "{first:?}"
    );
    let second = topics::ensure(&world.config).await.expect("ensure again");
    assert!(
        second.iter().all(|(_, e)| *e == Ensured::Existed),
        "{second:?}"
    );

    let admin = topics::admin_client(&world.config.kafka).unwrap();
    let names = TopicNames::new(&world.config.kafka);
    let consumer: StreamConsumer = imstream::kafka::client_config(&world.config.kafka)
        .set("group.id", "metadata-probe")
        .create()
        .unwrap();
    // Created topics reach the broker's metadata cache shortly after the
    // admin call returns: wait until every one is listed.
    let metadata = common::wait_for(
        "every topic in the metadata",
        Duration::from_secs(30),
        || {
            let result = consumer.fetch_metadata(None, Duration::from_secs(10));
            let wanted = &wanted;
            async move {
                let metadata = result.map_err(|e| e.to_string())?;
                let missing: Vec<&String> = wanted
                    .iter()
                    .map(|(n, _)| n)
                    .filter(|n| !metadata.topics().iter().any(|t| t.name() == *n))
                    .collect();
                if missing.is_empty() {
                    Ok(metadata)
                } else {
                    Err(format!("missing {missing:?}"))
                }
            }
        },
    )
    .await;
    for (name, spec) in &wanted {
        let t = metadata
            .topics()
            .iter()
            .find(|t| t.name() == name)
            .unwrap_or_else(|| panic!("topic {name} missing"));
        assert_eq!(t.partitions().len() as i32, spec.partitions, "{name}");
    }
    assert!(wanted
        .iter()
        .any(|(n, _)| n == &names.dlq(TopicKind::GroupEvents, "store")));

    // The event store keeps events without a time limit.
    let events = names.name(TopicKind::GroupEvents);
    let configs = admin
        .describe_configs(&[ResourceSpecifier::Topic(&events)], &AdminOptions::new())
        .await
        .unwrap();
    let resource = configs.into_iter().next().unwrap().unwrap();
    let retention = resource.get("retention.ms").and_then(|e| e.value.clone());
    assert_eq!(retention.as_deref(), Some("-1"));
}

#[tokio::test]
async fn migrate_creates_tenant_tables_and_is_repeatable() {
    let world = World::config_only();
    let first = imstream::tenant::migrate(&world.config, None)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let every: Vec<i64> = imstream::tenant::TENANT_MIGRATOR
        .iter()
        .map(|m| m.version)
        .collect();
    let applied: Vec<i64> = first[0].1.applied.iter().map(|(v, _)| *v).collect();
    assert_eq!(applied, every, "a new database gets every migration");
    // Again: nothing left to apply or convert.
    let again = imstream::tenant::migrate(&world.config, None)
        .await
        .unwrap();
    assert_eq!(again.len(), 1);
    assert!(again[0].1.applied.is_empty(), "{:?}", again[0].1.applied);
    assert!(
        again[0].1.converted.is_empty(),
        "{:?}",
        again[0].1.converted
    );
    let pool =
        imstream::tenant::database_pool(&world.config.mysql, &world.config.tenants[0].database)
            .unwrap();
    let rows = sqlx::query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let tables: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
    for t in [
        "im_group_message_shards",
        "im_group_message_topic_shards",
        "im_group_message_dedup",
        "im_dellog",
        "im_message_revisions",
        "im_groups",
        "im_group_members",
        "im_subscriptions",
        "im_group_messages",
    ] {
        assert!(
            tables.iter().any(|x| x == t),
            "table {t} missing from {tables:?}"
        );
    }
    let shard_month_col: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() \
         AND table_name = 'im_message_revisions' AND column_name = 'shard_month'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(shard_month_col, 1);
    let err = imstream::tenant::migrate(&world.config, Some("nobody"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nobody"), "{err}");
}

#[tokio::test]
async fn an_acked_event_comes_back_from_kafka_decoded() {
    let world = World::with_registry().await;
    topics::ensure(&world.config).await.unwrap();
    let names = TopicNames::new(&world.config.kafka);
    client::register_all(world.registry_url(), &names)
        .await
        .unwrap();
    let codec = EventCodec::new(world.registry_url()).unwrap();
    let producer = EventProducer::new(&world.config.kafka, codec.clone()).unwrap();

    let event = GroupEvent {
        event_id: new_event_id(),
        tenant_id: world.tenant().to_string(),
        topic: "grpLog".into(),
        occurred_at: now_ms(),
        actor_uid: 1,
        actor_device: String::new(),
        source_sid: String::new(),
        source_node: String::new(),
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        body: GroupEventBody::GroupMuteChanged(GroupMuteChanged { mute_all: true }),
    };
    let key = format!("{}:grpLog", world.tenant());
    let acked = producer
        .send(
            TopicKind::GroupEvents,
            &key,
            &event,
            Some(&event.traceparent),
        )
        .await
        .expect("acked");
    assert!(acked.offset >= 0);

    let consumer: StreamConsumer = imstream::kafka::client_config(&world.config.kafka)
        .set("group.id", format!("t{}-probe", world.id))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer
        .subscribe(&[&names.name(TopicKind::GroupEvents)])
        .unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
        .await
        .expect("a record within 30 s")
        .unwrap();
    assert_eq!(msg.key(), Some(key.as_bytes()));
    assert_eq!(
        (msg.partition(), msg.offset()),
        (acked.partition, acked.offset)
    );
    let decoded: GroupEvent = codec.decode(msg.payload()).await.unwrap();
    assert_eq!(decoded, event);
    use rdkafka::message::Headers;
    let header = msg
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == "traceparent"));
    assert_eq!(
        header.and_then(|h| h.value),
        Some(event.traceparent.as_bytes())
    );
}
