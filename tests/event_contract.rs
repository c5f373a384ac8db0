//! The event contract: every event kind round-trips through the running
//! registry in the Confluent wire format, and incompatible schema changes
//! are refused with 409 naming the problem.

mod common;

use imstream::events::*;
use imstream::kafka::topics::{TopicKind, TopicNames};
use imstream::registry::client::{self, RegistryClient};

use common::World;

fn envelope(body: GroupEventBody) -> GroupEvent {
    GroupEvent {
        event_id: new_event_id(),
        tenant_id: "acme".into(),
        topic: "grpRoundTrip".into(),
        occurred_at: 1_790_000_000_123,
        actor_uid: 42,
        actor_device: "ios-1".into(),
        source_sid: "sid-1".into(),
        source_node: "node-a".into(),
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        body,
    }
}

fn every_group_event() -> Vec<GroupEvent> {
    let range = SeqRange { low: 3, hi: 9 };
    vec![
        envelope(GroupEventBody::MessageSent(MessageSent {
            message_id: 7_000_000_000_001,
            group_id: 10086,
            seq: 10087,
            shard_month: "202610".into(),
            client_msg_id: Some("cmid-1".into()),
            from_user: 42,
            msg_type: "text".into(),
            head: Some(r#"{"mime":"text/x-drafty"}"#.into()),
            content: Some(r#"{"txt":"héllo 你好"}"#.into()),
            mentioned_user_ids: vec![1, 2, 3],
            mention_all: true,
            reply_seq: Some(10000),
            root_seq: None,
            file_count: 1,
            content_size: 27,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: 1_790_000_000_100,
            expires_at: Some(1_800_000_000_000),
        })),
        envelope(GroupEventBody::MessageEdited(MessageEdited {
            seq: 5,
            edit_seq: Some(12),
            head: None,
            content: Some(r#""edited""#.into()),
            edited_at: 1_790_000_000_200,
        })),
        envelope(GroupEventBody::MessageRecalled(MessageRecalled {
            seq: 5,
            recalled_at: 1,
            del_id: 3,
        })),
        envelope(GroupEventBody::MessageDeleted(MessageDeleted {
            ranges: vec![range, SeqRange { low: 20, hi: 21 }],
            del_id: 4,
            moderation: true,
            reason: "spam".into(),
            deleted_at: 2,
        })),
        envelope(GroupEventBody::HistoryCleared(HistoryCleared {
            uid: 9,
            ranges: vec![range],
            del_id: 5,
        })),
        envelope(GroupEventBody::MemberJoined(MemberJoined {
            uid: 9,
            role: "member".into(),
            invited_by: 42,
        })),
        envelope(GroupEventBody::MemberLeft(MemberLeft {
            uid: 9,
            kicked: true,
        })),
        envelope(GroupEventBody::MemberRoleChanged(MemberRoleChanged {
            uid: 9,
            role: "admin".into(),
        })),
        envelope(GroupEventBody::MemberMuted(MemberMuted {
            uid: 9,
            muted_until: Some(3),
        })),
        envelope(GroupEventBody::MemberMuted(MemberMuted {
            uid: 9,
            muted_until: None,
        })),
        envelope(GroupEventBody::GroupMuteChanged(GroupMuteChanged {
            mute_all: true,
        })),
        envelope(GroupEventBody::GroupCreated(GroupCreated {
            group_id: 10086,
            name: "Team".into(),
            owner_uid: 42,
            members: vec![42, 9],
        })),
        envelope(GroupEventBody::GroupDissolved(GroupDissolved {
            reason: "done".into(),
        })),
    ]
}

#[tokio::test]
async fn every_event_kind_round_trips_through_the_registry() {
    let world = World::with_registry().await;
    let names = TopicNames::new(&world.config.kafka);
    client::register_all(world.registry_url(), &names)
        .await
        .expect("register schemas");
    let codec = EventCodec::new(world.registry_url()).unwrap();
    // A second codec with empty caches proves ids resolve through the registry.
    let reader = EventCodec::new(world.registry_url()).unwrap();

    let topic = names.name(TopicKind::GroupEvents);
    let events = every_group_event();
    let kinds: std::collections::BTreeSet<_> = events.iter().map(|e| e.body.name()).collect();
    assert_eq!(kinds.len(), 12, "every group event kind is covered");
    for event in &events {
        let bytes = codec.encode(&topic, event).await.expect("encode");
        assert_eq!(bytes[0], 0, "Confluent magic byte");
        let decoded: GroupEvent = reader.decode(Some(&bytes)).await.expect("decode");
        assert_eq!(&decoded, event, "{} round trip", event.body.name());
    }

    let receipts = names.name(TopicKind::Receipts);
    for body in [
        ReceiptBody::ReadReceipt(SeqCursor { seq: 9 }),
        ReceiptBody::RecvReceipt(SeqCursor { seq: 10 }),
    ] {
        let event = ReceiptEvent {
            event_id: new_event_id(),
            tenant_id: "acme".into(),
            topic: "grpX".into(),
            occurred_at: 5,
            uid: 9,
            device: "web".into(),
            source_sid: "s".into(),
            source_node: "n".into(),
            body,
        };
        let bytes = codec.encode(&receipts, &event).await.unwrap();
        assert_eq!(
            reader.decode::<ReceiptEvent>(Some(&bytes)).await.unwrap(),
            event
        );
    }

    let control = names.name(TopicKind::SessionControl);
    for body in [
        SessionControlBody::DeviceRevoked(DeviceRevoked {
            device: "d1".into(),
            device_version: 2,
        }),
        SessionControlBody::SignedOutEverywhere(AuthVersion { auth_version: 3 }),
        SessionControlBody::UserDisabled(AuthVersion { auth_version: 4 }),
        SessionControlBody::UserEnabled(Empty {}),
        SessionControlBody::PasswordReset(AuthVersion { auth_version: 5 }),
    ] {
        let event = SessionControlEvent {
            event_id: new_event_id(),
            tenant_id: "acme".into(),
            uid: 9,
            occurred_at: 5,
            actor_uid: 1,
            reason: "test".into(),
            body,
        };
        let bytes = codec.encode(&control, &event).await.unwrap();
        assert_eq!(
            reader
                .decode::<SessionControlEvent>(Some(&bytes))
                .await
                .unwrap(),
            event
        );
    }

    let commands = names.name(TopicKind::AdminCommands);
    for body in [
        AdminCommandBody::UserDisable(UserRef { uid: 1 }),
        AdminCommandBody::UserEnable(UserRef { uid: 1 }),
        AdminCommandBody::UserPasswordReset(UserPasswordReset {
            uid: 1,
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into(),
        }),
        AdminCommandBody::UserDeviceRevoke(UserDevice {
            uid: 1,
            device: "d".into(),
        }),
        AdminCommandBody::GroupDelete(TopicRef {
            topic: "grpX".into(),
        }),
        AdminCommandBody::GroupMemberRemove(TopicMember {
            topic: "grpX".into(),
            uid: 2,
        }),
        AdminCommandBody::GroupAdminSet(TopicMember {
            topic: "grpX".into(),
            uid: 2,
        }),
        AdminCommandBody::GroupAdminRemove(TopicMember {
            topic: "grpX".into(),
            uid: 2,
        }),
        AdminCommandBody::GroupMemberMute(TopicMemberMute {
            topic: "grpX".into(),
            uid: 2,
            until: Some(9),
        }),
        AdminCommandBody::MessageModerate(TopicSeq {
            topic: "grpX".into(),
            seq: 3,
        }),
        AdminCommandBody::FileAuditUpdate(FileAuditUpdate {
            topic: "grpX".into(),
            seq: 3,
            status: "blocked".into(),
        }),
        AdminCommandBody::AbuseReportResolve(AbuseReportResolve {
            report_id: "grpX.3.2".into(),
            resolution: "actioned".into(),
            note: "spam".into(),
        }),
    ] {
        let event = AdminCommand {
            command_id: new_event_id(),
            tenant_id: "acme".into(),
            issued_at: 5,
            operator: "ops".into(),
            reason: String::new(),
            body,
        };
        let bytes = codec.encode(&commands, &event).await.unwrap();
        assert_eq!(
            reader.decode::<AdminCommand>(Some(&bytes)).await.unwrap(),
            event
        );
    }

    let results = names.name(TopicKind::AdminResults);
    let result = AdminResult {
        command_id: "c1".into(),
        tenant_id: "acme".into(),
        completed_at: 5,
        status: "ok".into(),
        message: String::new(),
        event_ids: vec!["e1".into()],
    };
    let bytes = codec.encode(&results, &result).await.unwrap();
    assert_eq!(
        reader.decode::<AdminResult>(Some(&bytes)).await.unwrap(),
        result
    );
}

/// The group-events schema with `edit` applied to its JSON.
fn edited_group_schema(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut schema: serde_json::Value = serde_json::from_str(GroupEvent::SCHEMA).unwrap();
    edit(&mut schema);
    schema.to_string()
}

fn message_sent_fields(schema: &mut serde_json::Value) -> &mut Vec<serde_json::Value> {
    let body = schema["fields"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["name"] == "body")
        .unwrap();
    body["type"][0]["fields"].as_array_mut().unwrap()
}

#[tokio::test]
async fn incompatible_changes_are_refused_with_409_naming_the_problem() {
    let world = World::with_registry().await;
    let names = TopicNames::new(&world.config.kafka);
    client::register_all(world.registry_url(), &names)
        .await
        .unwrap();
    let client = RegistryClient::new(world.registry_url());
    let subject = format!("{}-value", names.name(TopicKind::GroupEvents));

    // A field added without a default: old events cannot be read.
    let added = edited_group_schema(|s| {
        message_sent_fields(s).push(serde_json::json!({"name": "priority", "type": "int"}));
    });
    let err = client
        .register(&subject, &added)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("409"), "{err}");
    assert!(
        err.contains("priority"),
        "the refusal names the field: {err}"
    );
    let (ok, messages) = client.check(&subject, &added).await.unwrap();
    assert!(!ok);
    assert!(
        messages.iter().any(|m| m.contains("priority")),
        "{messages:?}"
    );

    // A field renamed (removed, and re-added under a new name without a default).
    let renamed = edited_group_schema(|s| {
        let fields = message_sent_fields(s);
        let f = fields
            .iter_mut()
            .find(|f| f["name"] == "from_user")
            .unwrap();
        f["name"] = "sender_uid".into();
    });
    let err = client
        .register(&subject, &renamed)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("409") && err.contains("sender_uid"), "{err}");

    // An event kind removed from the body union: old events of that kind unreadable.
    let removed_kind = edited_group_schema(|s| {
        let body = s["fields"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|f| f["name"] == "body")
            .unwrap();
        body["type"]
            .as_array_mut()
            .unwrap()
            .retain(|b| b["name"] != "GroupDissolved");
    });
    let err = client
        .register(&subject, &removed_kind)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("409"), "{err}");

    // A compatible evolution (new field with a default, new event kind at the
    // end) is accepted.
    let before = client::register_all(world.registry_url(), &names)
        .await
        .unwrap();
    let evolved = edited_group_schema(|s| {
        message_sent_fields(s)
            .push(serde_json::json!({"name": "priority", "type": "int", "default": 0}));
        let body = s["fields"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|f| f["name"] == "body")
            .unwrap();
        body["type"].as_array_mut().unwrap().push(serde_json::json!({
            "type": "record", "name": "PinnedMessage", "fields": [{"name": "seq", "type": "long"}]
        }));
    });
    client
        .register(&subject, &evolved)
        .await
        .expect("compatible evolution registers");

    // During a rolling deploy this (older) build still finds its own schema
    // id, so its producers keep working...
    let after = client::register_all(world.registry_url(), &names)
        .await
        .unwrap();
    assert_eq!(before[0].id, after[0].id);
    // ...while `schemas check` says it could not read the newer kind.
    let reports = client::check_all(world.registry_url(), &names)
        .await
        .unwrap();
    let group = reports.iter().find(|r| r.subject == subject).unwrap();
    assert!(!group.compatible);
    assert!(
        group.messages.iter().any(|m| m.contains("PinnedMessage")),
        "{:?}",
        group.messages
    );
    assert!(
        reports
            .iter()
            .filter(|r| r.subject != subject)
            .all(|r| r.compatible),
        "{reports:?}"
    );
}

#[tokio::test]
async fn events_from_a_newer_writer_still_decode() {
    // A producer on a newer schema (extra field, extra kind at the end of the
    // union) writes; this build reads what it knows and names what it does not.
    let world = World::with_registry().await;
    let names = TopicNames::new(&world.config.kafka);
    client::register_all(world.registry_url(), &names)
        .await
        .unwrap();
    let topic = names.name(TopicKind::GroupEvents);
    let newer = edited_group_schema(|s| {
        let body = s["fields"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|f| f["name"] == "body")
            .unwrap();
        let branches = body["type"].as_array_mut().unwrap();
        branches.insert(0, serde_json::json!({
            "type": "record", "name": "PinnedMessage", "fields": [{"name": "seq", "type": "long"}]
        }));
    });
    // Inserting a branch first is still BACKWARD compatible (names match).
    let client = RegistryClient::new(world.registry_url());
    let id = client
        .register(&format!("{topic}-value"), &newer)
        .await
        .expect("register newer");

    // Write a MessageRecalled with the newer schema, by hand.
    let schema = apache_avro::Schema::parse_str(&newer).unwrap();
    use apache_avro::types::Value;
    let value = Value::Record(vec![
        ("event_id".into(), Value::String("e1".into())),
        ("tenant_id".into(), Value::String("acme".into())),
        ("topic".into(), Value::String("grpX".into())),
        ("occurred_at".into(), Value::TimestampMillis(7)),
        ("actor_uid".into(), Value::Long(1)),
        ("actor_device".into(), Value::String(String::new())),
        ("source_sid".into(), Value::String(String::new())),
        ("source_node".into(), Value::String(String::new())),
        ("traceparent".into(), Value::String(String::new())),
        (
            "body".into(),
            Value::Union(
                3,
                Box::new(Value::Record(vec![
                    ("seq".into(), Value::Long(5)),
                    ("recalled_at".into(), Value::TimestampMillis(8)),
                    ("del_id".into(), Value::Int(0)),
                ])),
            ),
        ),
    ]);
    #[allow(deprecated)]
    let datum = apache_avro::to_avro_datum(&schema, value).unwrap();
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(&(id as u32).to_be_bytes());
    bytes.extend_from_slice(&datum);

    let codec = EventCodec::new(world.registry_url()).unwrap();
    let decoded: GroupEvent = codec
        .decode(Some(&bytes))
        .await
        .expect("decode newer event");
    assert_eq!(
        decoded.body,
        GroupEventBody::MessageRecalled(MessageRecalled {
            seq: 5,
            recalled_at: 8,
            del_id: 0,
        })
    );

    // The unknown kind is reported by name, not misread as another kind.
    let pinned = Value::Record(vec![
        ("event_id".into(), Value::String("e2".into())),
        ("tenant_id".into(), Value::String("acme".into())),
        ("topic".into(), Value::String("grpX".into())),
        ("occurred_at".into(), Value::TimestampMillis(7)),
        ("actor_uid".into(), Value::Long(1)),
        ("actor_device".into(), Value::String(String::new())),
        ("source_sid".into(), Value::String(String::new())),
        ("source_node".into(), Value::String(String::new())),
        ("traceparent".into(), Value::String(String::new())),
        (
            "body".into(),
            Value::Union(
                0,
                Box::new(Value::Record(vec![("seq".into(), Value::Long(5))])),
            ),
        ),
    ]);
    #[allow(deprecated)]
    let datum = apache_avro::to_avro_datum(&schema, pinned).unwrap();
    let mut bytes = vec![0u8];
    bytes.extend_from_slice(&(id as u32).to_be_bytes());
    bytes.extend_from_slice(&datum);
    let err = codec.decode::<GroupEvent>(Some(&bytes)).await.unwrap_err();
    assert!(
        matches!(err, CodecError::UnknownKind { ref name, .. } if name == "PinnedMessage"),
        "{err}"
    );
}
