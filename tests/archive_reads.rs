//! Archived months stay readable (seed 000 §10: "archived: moved to object
//! storage; online queries go through the archive service"): after
//! `archive` + `drop`, history pages, exact messages, context and search
//! that reach the month are served from its archive with the same results
//! as from its table (status, version, edits, the reader's deletes), through
//! the S3 API (the stack's local S3-compatible store) and the local
//! filesystem; a damaged or missing archive object is an error naming the
//! month (HTTP 5xx), never wrong data.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use chrono::TimeZone;
use imstream::events::{
    now_ms, EventCodec, GroupEvent, GroupEventBody, HistoryCleared, MessageEdited, MessageRecalled,
    MessageSent, SeqRange,
};
use imstream::history::{History, HistoryError, PageQuery};
use imstream::kafka::producer::EventProducer;
use imstream::kafka::topics::TopicKind;
use imstream::store::archive::reader::{ArchiveReadError, Archives};
use imstream::store::archive::{self, format, ArchiveIndex, ArchiveLocation};
use imstream::store::catalog::{self, ShardStatus};
use imstream::store::month::ShardMonth;

use common::{wait_for, Stack};

const SEPTEMBER: &str = "2026-09-05T12:00:00Z";
/// September messages: two blocks of the archive (128 rows each at most).
const SEPT: i64 = 140;
/// October messages after them (a live month).
const OCT: i64 = 5;
const READER: i64 = 4242;
const OWNER: i64 = 4241;

fn september() -> ShardMonth {
    ShardMonth::parse("202609").unwrap()
}

fn at(y: i32, m: u32, d: u32) -> i64 {
    chrono::Utc
        .with_ymd_and_hms(y, m, d, 8, 0, 0)
        .unwrap()
        .timestamp_millis()
}

fn sent(stack: &Stack, topic: &str, seq: i64) -> GroupEvent {
    let (month, created) = if seq <= SEPT {
        ("202609", at(2026, 9, 10) + seq * 1000)
    } else {
        ("202610", at(2026, 10, 10) + seq * 1000)
    };
    GroupEvent::new(
        stack.tenant(),
        topic,
        OWNER,
        GroupEventBody::MessageSent(MessageSent {
            message_id: (rand::random::<u32>() as i64) << 20 | seq,
            group_id: 42,
            seq,
            shard_month: month.to_string(),
            client_msg_id: Some(format!("{topic}-{seq}")),
            from_user: if seq % 3 == 0 { READER } else { OWNER },
            msg_type: "text".into(),
            head: (seq % 7 == 0).then(|| r#"{"mime": "text/x-drafty"}"#.to_string()),
            content: Some(format!(r#"{{"txt": "message {seq} 消息 Ünïcode"}}"#)),
            mentioned_user_ids: vec![],
            mention_all: false,
            reply_seq: (seq > 1).then_some(seq - 1),
            root_seq: None,
            file_count: 0,
            content_size: 24,
            has_risk: false,
            audit_status: "pass".into(),
            created_at: created,
            expires_at: None,
        }),
    )
}

/// September and October messages, an edit, a recall and the reader's own
/// clear of 30..36, straight into the log; waits until the store applied
/// them all.
async fn seed(stack: &Stack, topic: &str) {
    let codec = EventCodec::new(&stack.config().registry.url).unwrap();
    let producer = EventProducer::new(&stack.config().kafka, codec).unwrap();
    let key = format!("{}:{topic}", stack.tenant());
    let mut events: Vec<GroupEvent> = (1..=SEPT + OCT).map(|s| sent(stack, topic, s)).collect();
    let body = |b| GroupEvent::new(stack.tenant(), topic, OWNER, b);
    events.push(body(GroupEventBody::MessageEdited(MessageEdited {
        seq: 20,
        edit_seq: None,
        head: None,
        content: Some(r#"{"txt": "message 20, edited"}"#.into()),
        edited_at: now_ms(),
    })));
    events.push(body(GroupEventBody::MessageRecalled(MessageRecalled {
        seq: 10,
        recalled_at: now_ms(),
        del_id: 1,
    })));
    events.push(body(GroupEventBody::HistoryCleared(HistoryCleared {
        uid: READER,
        ranges: vec![SeqRange { low: 30, hi: 36 }],
        del_id: 2,
    })));
    for e in &events {
        producer
            .send(TopicKind::GroupEvents, &key, e, None)
            .await
            .expect("produce");
    }
    let pool = stack.pool();
    let pool = &pool;
    wait_for("the store to apply every event", Duration::from_secs(60), || async move {
        let q = |sql: &'static str| async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(topic)
                .fetch_one(pool)
                .await
                .map_err(|e| e.to_string())
        };
        let seen = (
            q("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ?").await?,
            q("SELECT COUNT(*) FROM im_group_messages_202610 WHERE topic = ?").await?,
            q("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ? AND seqid = 20 AND version = 2").await?,
            q("SELECT COUNT(*) FROM im_group_messages_202609 WHERE topic = ? AND seqid = 10 AND status <> 'normal'").await?,
            q("SELECT COUNT(*) FROM im_dellog WHERE topic = ?").await?,
        );
        if seen.0 == SEPT && seen.1 == OCT && seen.2 == 1 && seen.3 == 1 && seen.4 >= 2 {
            Ok(())
        } else {
            Err(format!("(sept, oct, edited, recalled, dellog) = {seen:?}"))
        }
    })
    .await;
}

/// Every read a client can make that reaches the months, as text:
/// newest-first pages from several cursors, oldest-first catch-up pages,
/// exact messages, context and search, for the reader (who cleared 30..36)
/// and the owner.
async fn reads(history: &History, tenant: &str, topic: &str) -> Vec<String> {
    let mut out = Vec::new();
    for reader in [READER, OWNER] {
        for (before, limit) in [
            (None, 10),
            (None, 100),
            (Some(143), 10),
            (Some(142), 20),
            (Some(130), 5),
            (Some(129), 1),
            (Some(40), 10),
            (Some(12), 5),
            (Some(3), 10),
        ] {
            let q = PageQuery::new(None, before, Some(limit), false).unwrap();
            let p = history.page(tenant, topic, reader, q).await.expect("page");
            out.push(format!(
                "{reader} before {before:?} limit {limit}: next {:?} {:?}",
                p.next, p.messages
            ));
        }
        for (since, limit) in [
            (1, 10),
            (9, 5),
            (25, 15),
            (120, 30),
            (128, 2),
            (139, 5),
            (141, 3),
        ] {
            let q = PageQuery::new(Some(since), None, Some(limit), true).unwrap();
            let p = history.page(tenant, topic, reader, q).await.expect("page");
            out.push(format!(
                "{reader} since {since} limit {limit}: next {:?} {:?}",
                p.next, p.messages
            ));
        }
        for seq in [1, 10, 20, 30, 35, 36, 128, 129, 140, 141, 145] {
            let m = history
                .exact(tenant, topic, reader, seq)
                .await
                .expect("exact");
            out.push(format!("{reader} exact {seq}: {m:?}"));
        }
        for (seq, n) in [(20, 3), (129, 2), (140, 3), (33, 4)] {
            let c = history
                .context(tenant, topic, reader, seq, n)
                .await
                .expect("context");
            out.push(format!("{reader} context {seq}±{n}: {c:?}"));
        }
        for text in ["message 1", "EDITED", "消息", "nothing like this"] {
            let hits = history
                .search(
                    tenant,
                    topic,
                    reader,
                    text,
                    at(2026, 9, 1),
                    at(2026, 10, 31),
                    50,
                )
                .await
                .expect("search");
            out.push(format!("{reader} search {text:?}: {hits:?}"));
        }
    }
    out
}

fn assert_same(before: &[String], after: &[String], what: &str) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        assert_eq!(b, a, "{what}: a read differs after archiving");
    }
}

async fn history_for(stack: &Stack) -> History {
    let redis = imstream::redis_util::connect(&stack.config().redis.url)
        .await
        .expect("redis");
    History::new(
        imstream::tenant::TenantPools::connect_lazy(stack.config()).unwrap(),
        redis,
    )
    .with_archives(Archives::from_config(&stack.config().shards))
}

/// Seals September, archives it to `location`, captures every read, drops
/// the table; returns the reads captured while the table was there.
async fn archive_and_drop(stack: &Stack, topic: &str, location: &ArchiveLocation) -> Vec<String> {
    let pool = stack.pool();
    catalog::set_status(&pool, september(), ShardStatus::Sealed)
        .await
        .unwrap();
    let manifest = archive::export(&pool, stack.tenant(), september(), location)
        .await
        .expect("archive");
    assert_eq!(manifest.row_count, SEPT);
    assert_eq!(manifest.format, archive::FORMAT);
    let before = reads(&history_for(stack).await, stack.tenant(), topic).await;
    archive::drop_month(&pool, stack.tenant(), september(), location, true)
        .await
        .expect("drop");
    assert!(!catalog::table_exists(&pool, september()).await.unwrap());
    before
}

/// Through the S3 API: a bucket on the stack's S3-compatible store holds
/// the archive; after the drop every read is what it was, from fresh
/// caches and from warm ones, and pages reaching September say they came
/// from the archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_archive_in_s3_serves_the_month_as_the_table_did() {
    let mut stack = Stack::prepared(Some(SEPTEMBER)).await;
    let bucket = format!("imstream-{}", stack.world.id);
    stack.world.config.shards.archive_options = common::s3_bucket(&bucket).await;
    stack.world.config.shards.archive_url = format!("s3://{bucket}/archives");
    stack.start_pipeline("store").await;
    let topic = "grpArchS3";
    seed(&stack, topic).await;
    let location = ArchiveLocation::from_config(&stack.config().shards).unwrap();

    let before = archive_and_drop(&stack, topic, &location).await;
    let history = history_for(&stack).await;
    let after = reads(&history, stack.tenant(), topic).await;
    assert_same(&before, &after, "s3, fresh caches");
    let again = reads(&history, stack.tenant(), topic).await;
    assert_same(&before, &again, "s3, warm caches");

    let q = PageQuery::new(None, Some(130), Some(5), false).unwrap();
    let page = history.page(stack.tenant(), topic, OWNER, q).await.unwrap();
    assert_eq!(page.source, "archive");
    assert_eq!(
        page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![129, 128, 127, 126, 125]
    );
    // The objects are in the bucket, under the URL's prefix.
    let listed: Vec<String> = {
        use futures::TryStreamExt;
        let prefix = object_store::path::Path::from(format!("archives/{}/202609", stack.tenant()));
        location
            .store()
            .list(Some(&prefix))
            .map_ok(|o| o.location.filename().unwrap_or_default().to_string())
            .try_collect()
            .await
            .unwrap()
    };
    let mut listed = listed;
    listed.sort();
    assert_eq!(listed, vec!["index.json", "manifest.json", "messages.avro"]);
}

fn flip(path: &PathBuf, at: u64) -> Vec<u8> {
    let original = std::fs::read(path).unwrap();
    let mut bytes = original.clone();
    bytes[at as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
    original
}

fn archive_error(r: Result<impl std::fmt::Debug, HistoryError>) -> ArchiveReadError {
    match r {
        Err(HistoryError::Archive(e)) => e,
        other => panic!("expected an archive error, got {other:?}"),
    }
}

/// On the local filesystem: reads are the same after the drop; then a
/// flipped byte in block 1 of the data object is detected (a page needing
/// that block fails naming the month and the block; pages of block 0 and of
/// the live month still answer as before); a damaged index, a missing data
/// object, index or manifest are each a clear error naming the month; over
/// HTTP the gateway answers 500 with the month, never messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_damaged_or_missing_archive_object_is_an_error_never_wrong_data() {
    let mut stack = Stack::prepared(Some(SEPTEMBER)).await;
    let root = common::repo_root()
        .join("target/tmp")
        .join(format!("archive-{}", stack.world.id));
    stack.world.config.shards.archive_url = format!("file://{}", root.display());
    stack.start_pipeline("store").await;
    stack.start_pipeline("members").await;
    let topic = "grpArchBad";
    stack.create_group(topic, OWNER, &[READER]).await;
    seed(&stack, topic).await;
    let location = ArchiveLocation::from_config(&stack.config().shards).unwrap();
    let before = archive_and_drop(&stack, topic, &location).await;
    let tenant = stack.tenant().to_string();
    assert_same(
        &before,
        &reads(&history_for(&stack).await, &tenant, topic).await,
        "local",
    );

    let dir = root.join(&tenant).join("202609");
    let (data, index_path) = (dir.join("messages.avro"), dir.join("index.json"));
    let index: ArchiveIndex = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    assert_eq!(index.blocks.len(), 2, "{index:?}");
    let block1 = &index.blocks[1];
    let page = |h: History, since: i64| {
        let tenant = tenant.clone();
        async move {
            let q = PageQuery::new(Some(since), None, Some(5), true).unwrap();
            h.page(&tenant, topic, OWNER, q).await.map(|p| p.messages)
        }
    };
    let good_block1 = page(history_for(&stack).await, 130).await.unwrap();

    // A flipped bit inside block 1 that still decodes — to other text (raw
    // deflate has no checksum): only the block's SHA-256 in the index tells.
    let original = std::fs::read(&data).unwrap();
    let header = &original[..index.header_len as usize];
    let span = block1.offset as usize..(block1.offset + block1.len) as usize;
    let rows = format::decode_block(header, &original[span.clone()]).unwrap();
    let silent = (span.start + 8..span.end - 16)
        .flat_map(|at| (0..8).map(move |bit| (at, bit)))
        .find(|&(at, bit)| {
            let mut block = original[span.clone()].to_vec();
            block[at - span.start] ^= 1 << bit;
            format::decode_block(header, &block).is_ok_and(|r| r.len() == rows.len() && r != rows)
        })
        .expect("a bit flip that still decodes");
    let mut corrupted = original.clone();
    corrupted[silent.0] ^= 1 << silent.1;
    std::fs::write(&data, &corrupted).unwrap();
    let e = archive_error(page(history_for(&stack).await, 130).await);
    assert!(matches!(e, ArchiveReadError::Damaged { .. }), "{e}");
    assert_eq!(e.month(), september());
    let text = e.to_string();
    assert!(
        text.contains("202609") && text.contains("block 1"),
        "{text}"
    );
    // And a flipped byte that breaks the block.
    std::fs::write(&data, &original).unwrap();
    flip(&data, block1.offset + block1.len / 2);
    let e = archive_error(page(history_for(&stack).await, 130).await);
    assert!(matches!(e, ArchiveReadError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("block 1"), "{e}");
    // Block 0 and the live month still read as before.
    let h = history_for(&stack).await;
    let block0 = page(h.clone(), 100).await.expect("block 0 is intact");
    assert_eq!(
        block0.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![100, 101, 102, 103, 104]
    );
    let live = page(h, 141).await.expect("the live month");
    assert_eq!(
        live.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![141, 142, 143, 144, 145]
    );

    // Over HTTP and with a fresh gateway: a 500 naming the month.
    let gw = stack.start_gateway("node-bad").await;
    let client = reqwest::Client::new();
    let resp = client
        .get(format!(
            "http://{gw}/v1/groups/{topic}/messages?since=130&limit=5"
        ))
        .bearer_auth(stack.token(OWNER, "web"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("archive of month 202609 is damaged"),
        "{body}"
    );
    assert!(!body.contains("\"messages\""), "{body}");
    std::fs::write(&data, &original).unwrap();
    assert_eq!(
        page(history_for(&stack).await, 130).await.unwrap(),
        good_block1
    );

    // A damaged index (its hash is in the manifest).
    let original_index = flip(&index_path, 10);
    let e = archive_error(page(history_for(&stack).await, 1).await);
    assert!(matches!(e, ArchiveReadError::Damaged { .. }), "{e}");
    assert!(e.to_string().contains("index.json"), "{e}");
    std::fs::write(&index_path, &original_index).unwrap();

    // Missing objects: the data object, the index, the manifest.
    for name in ["messages.avro", "index.json", "manifest.json"] {
        let path = dir.join(name);
        let kept = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let e = archive_error(page(history_for(&stack).await, 1).await);
        assert!(matches!(e, ArchiveReadError::Missing { .. }), "{name}: {e}");
        assert!(
            e.to_string().contains("202609") && e.to_string().contains(name),
            "{e}"
        );
        std::fs::write(&path, kept).unwrap();
    }
    assert_same(
        &before,
        &reads(&history_for(&stack).await, &tenant, topic).await,
        "restored",
    );
}
