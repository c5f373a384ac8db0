//! The month archive's format (v2): one Avro object container file of the
//! month's rows sorted by `(topic, seq)` and written in blocks of
//! [`BLOCK_ROWS`] rows (deflate), a small per-topic seq index saying which
//! blocks hold which seqs of a topic and where each block lies in the file
//! (so a history page fetches only its blocks by range GET), and the
//! manifest: counts, per-topic seq ranges and the SHA-256 of every object.
//!
//! Objects under `<root>/<tenant>/<YYYYMM>/`: `messages.avro`, `index.json`,
//! `manifest.json` (written last: a month with a manifest is complete).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::OnceLock;

use apache_avro::types::Value;
use apache_avro::{Codec, DeflateSettings, Schema};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Manifest format tag of this layout.
pub const FORMAT: &str = "imstream.month-archive.v2";
/// The first layout (JSON lines, one SHA-256 for the file): not read any more.
pub const FORMAT_V1: &str = "imstream.month-archive.v1";
pub const DATA_OBJECT: &str = "messages.avro";
pub const INDEX_OBJECT: &str = "index.json";
pub const MANIFEST_OBJECT: &str = "manifest.json";
/// Rows per Avro block: a 100-message page touches one or two blocks.
pub const BLOCK_ROWS: usize = 128;
/// Codec of the blocks, as the manifest names it.
pub const CODEC: &str = "deflate";

/// The Avro schema of one archived row: every column of the month table,
/// text as stored (JSON columns and times as MySQL hands them back as
/// text), plus `created_ms`, the read path's timestamp, computed by MySQL
/// at export exactly as a history read computes it.
const SCHEMA_JSON: &str = r#"{
  "type": "record", "name": "ArchivedMessage", "namespace": "imstream.archive",
  "fields": [
    {"name": "message_id", "type": "long"},
    {"name": "topic", "type": "string"},
    {"name": "group_id", "type": "long"},
    {"name": "seqid", "type": "long"},
    {"name": "from_user", "type": "long"},
    {"name": "client_msg_id", "type": ["null", "string"]},
    {"name": "msg_type", "type": "string"},
    {"name": "status", "type": "string"},
    {"name": "content", "type": ["null", "string"]},
    {"name": "head", "type": ["null", "string"]},
    {"name": "mentioned_user_ids", "type": ["null", "string"]},
    {"name": "mention_all", "type": "long"},
    {"name": "reply_seqid", "type": ["null", "long"]},
    {"name": "root_seqid", "type": ["null", "long"]},
    {"name": "file_count", "type": "long"},
    {"name": "content_size", "type": "long"},
    {"name": "has_risk", "type": "long"},
    {"name": "audit_status", "type": "string"},
    {"name": "version", "type": "long"},
    {"name": "recalled_at", "type": ["null", "string"]},
    {"name": "recalled_by", "type": ["null", "long"]},
    {"name": "deleted_at", "type": ["null", "string"]},
    {"name": "expires_at", "type": ["null", "string"]},
    {"name": "created_at", "type": "string"},
    {"name": "updated_at", "type": "string"},
    {"name": "created_ms", "type": "long"}
  ]
}"#;

/// The parsed row schema (parsed once per process).
pub fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| Schema::parse_str(SCHEMA_JSON).expect("the archive schema parses"))
}

/// One row of a month table as archived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedRow {
    pub message_id: i64,
    pub topic: String,
    pub group_id: i64,
    pub seqid: i64,
    pub from_user: i64,
    pub client_msg_id: Option<String>,
    pub msg_type: String,
    pub status: String,
    pub content: Option<String>,
    pub head: Option<String>,
    pub mentioned_user_ids: Option<String>,
    pub mention_all: i64,
    pub reply_seqid: Option<i64>,
    pub root_seqid: Option<i64>,
    pub file_count: i64,
    pub content_size: i64,
    pub has_risk: i64,
    pub audit_status: String,
    pub version: i64,
    pub recalled_at: Option<String>,
    pub recalled_by: Option<i64>,
    pub deleted_at: Option<String>,
    pub expires_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub created_ms: i64,
}

fn opt_str(v: &Option<String>) -> Value {
    match v {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(s) => Value::Union(1, Box::new(Value::String(s.clone()))),
    }
}

fn opt_long(v: Option<i64>) -> Value {
    match v {
        None => Value::Union(0, Box::new(Value::Null)),
        Some(n) => Value::Union(1, Box::new(Value::Long(n))),
    }
}

impl ArchivedRow {
    /// The row as an Avro record of [`schema`].
    pub fn to_value(&self) -> Value {
        let f = |name: &str, v: Value| (name.to_string(), v);
        Value::Record(vec![
            f("message_id", Value::Long(self.message_id)),
            f("topic", Value::String(self.topic.clone())),
            f("group_id", Value::Long(self.group_id)),
            f("seqid", Value::Long(self.seqid)),
            f("from_user", Value::Long(self.from_user)),
            f("client_msg_id", opt_str(&self.client_msg_id)),
            f("msg_type", Value::String(self.msg_type.clone())),
            f("status", Value::String(self.status.clone())),
            f("content", opt_str(&self.content)),
            f("head", opt_str(&self.head)),
            f("mentioned_user_ids", opt_str(&self.mentioned_user_ids)),
            f("mention_all", Value::Long(self.mention_all)),
            f("reply_seqid", opt_long(self.reply_seqid)),
            f("root_seqid", opt_long(self.root_seqid)),
            f("file_count", Value::Long(self.file_count)),
            f("content_size", Value::Long(self.content_size)),
            f("has_risk", Value::Long(self.has_risk)),
            f("audit_status", Value::String(self.audit_status.clone())),
            f("version", Value::Long(self.version)),
            f("recalled_at", opt_str(&self.recalled_at)),
            f("recalled_by", opt_long(self.recalled_by)),
            f("deleted_at", opt_str(&self.deleted_at)),
            f("expires_at", opt_str(&self.expires_at)),
            f("created_at", Value::String(self.created_at.clone())),
            f("updated_at", Value::String(self.updated_at.clone())),
            f("created_ms", Value::Long(self.created_ms)),
        ])
    }

    /// A record read back; `Err` names what did not fit the schema.
    pub fn from_value(value: Value) -> Result<Self, String> {
        let Value::Record(fields) = value else {
            return Err("not a record".into());
        };
        let mut map: BTreeMap<String, Value> = fields.into_iter().collect();
        let mut take = |name: &str| {
            map.remove(name)
                .ok_or_else(|| format!("field {name} is missing"))
        };
        fn long(name: &str, v: Value) -> Result<i64, String> {
            match v {
                Value::Long(n) => Ok(n),
                Value::Int(n) => Ok(n as i64),
                other => Err(format!("{name}: expected a long, got {other:?}")),
            }
        }
        fn string(name: &str, v: Value) -> Result<String, String> {
            match v {
                Value::String(s) => Ok(s),
                other => Err(format!("{name}: expected a string, got {other:?}")),
            }
        }
        fn nullable(v: Value) -> Option<Value> {
            match v {
                Value::Union(_, inner) => match *inner {
                    Value::Null => None,
                    other => Some(other),
                },
                Value::Null => None,
                other => Some(other),
            }
        }
        let ostr = |name: &str, v: Value| nullable(v).map(|v| string(name, v)).transpose();
        let olong = |name: &str, v: Value| nullable(v).map(|v| long(name, v)).transpose();
        Ok(ArchivedRow {
            message_id: long("message_id", take("message_id")?)?,
            topic: string("topic", take("topic")?)?,
            group_id: long("group_id", take("group_id")?)?,
            seqid: long("seqid", take("seqid")?)?,
            from_user: long("from_user", take("from_user")?)?,
            client_msg_id: ostr("client_msg_id", take("client_msg_id")?)?,
            msg_type: string("msg_type", take("msg_type")?)?,
            status: string("status", take("status")?)?,
            content: ostr("content", take("content")?)?,
            head: ostr("head", take("head")?)?,
            mentioned_user_ids: ostr("mentioned_user_ids", take("mentioned_user_ids")?)?,
            mention_all: long("mention_all", take("mention_all")?)?,
            reply_seqid: olong("reply_seqid", take("reply_seqid")?)?,
            root_seqid: olong("root_seqid", take("root_seqid")?)?,
            file_count: long("file_count", take("file_count")?)?,
            content_size: long("content_size", take("content_size")?)?,
            has_risk: long("has_risk", take("has_risk")?)?,
            audit_status: string("audit_status", take("audit_status")?)?,
            version: long("version", take("version")?)?,
            recalled_at: ostr("recalled_at", take("recalled_at")?)?,
            recalled_by: olong("recalled_by", take("recalled_by")?)?,
            deleted_at: ostr("deleted_at", take("deleted_at")?)?,
            expires_at: ostr("expires_at", take("expires_at")?)?,
            created_at: string("created_at", take("created_at")?)?,
            updated_at: string("updated_at", take("updated_at")?)?,
            created_ms: long("created_ms", take("created_ms")?)?,
        })
    }

    /// The row's Avro datum bytes: what the manifest's `rows_sha256`
    /// digests, row after row, on both sides of a verification.
    pub fn datum(&self) -> Vec<u8> {
        apache_avro::writer::datum::GenericDatumWriter::builder(schema())
            .build()
            .and_then(|w| w.write_value_to_vec(self.to_value()))
            .expect("a row fits its schema")
    }

    /// The row as the read path returns it.
    pub fn to_message(&self) -> crate::store::message::StoredMessage {
        crate::store::message::StoredMessage {
            seq: self.seqid,
            from: self.from_user,
            ts: self.created_ms,
            head: self.head.clone(),
            content: self.content.clone(),
            status: self.status.clone(),
            version: self.version as i32,
            edit_seq: None,
            reply_seq: self.reply_seqid,
            root_seq: self.root_seqid,
        }
    }
}

/// One object of an archive, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub name: String,
    pub bytes: u64,
    /// Hex SHA-256 of the object's bytes.
    pub sha256: String,
}

/// A topic's rows in the archived month.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSummary {
    pub topic: String,
    pub count: i64,
    pub min_seq: i64,
    pub max_seq: i64,
}

/// `manifest.json` of one archived month.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub tenant: String,
    pub shard_month: String,
    /// The month's tables (every family) the rows came from.
    pub tables: Vec<String>,
    pub row_count: i64,
    /// Hex SHA-256 over every row's Avro datum in archive order: what a
    /// verification recomputes from the table and from the archive.
    pub rows_sha256: String,
    pub codec: String,
    pub block_rows: usize,
    pub objects: Vec<ObjectRef>,
    pub topics: Vec<TopicSummary>,
    /// RFC 3339, when the export finished.
    pub exported_at: String,
}

impl Manifest {
    pub fn object(&self, name: &str) -> Option<&ObjectRef> {
        self.objects.iter().find(|o| o.name == name)
    }
}

/// Where one block lies in the data object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRef {
    pub offset: u64,
    pub len: u64,
    pub rows: u32,
    /// Hex SHA-256 of the block's bytes (count, size, data, sync marker).
    pub sha256: String,
}

/// One block holding some of a topic's rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicBlock {
    /// Position in [`ArchiveIndex::blocks`].
    pub block: u32,
    pub first_seq: i64,
    pub last_seq: i64,
    pub offset: u64,
    pub len: u64,
}

/// `index.json`: the data object's header and blocks, and per topic the
/// blocks holding its seqs in seq order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveIndex {
    pub format: String,
    /// Bytes of the Avro header (magic, schema, codec, sync marker) at the
    /// start of the data object; a block is decoded behind it.
    pub header_len: u64,
    pub header_sha256: String,
    pub blocks: Vec<BlockRef>,
    pub topics: BTreeMap<String, Vec<TopicBlock>>,
}

/// A `Write` that counts, hashes the whole stream and the current block.
struct Tally<W: Write> {
    inner: W,
    pos: u64,
    whole: Sha256,
    block: Sha256,
}

impl<W: Write> Write for Tally<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write_all(buf)?;
        self.pos += buf.len() as u64;
        self.whole.update(buf);
        self.block.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// What the writer produced besides the data bytes.
pub struct Written<W> {
    pub inner: W,
    pub index: ArchiveIndex,
    pub data: ObjectRef,
    pub row_count: i64,
    pub rows_sha256: String,
}

/// Writes rows (in `(topic, seq)` order) as the data object, block by
/// block, and builds the index as it goes.
pub struct ArchiveWriter<W: Write> {
    avro: apache_avro::Writer<'static, Tally<W>>,
    index: ArchiveIndex,
    /// Per topic of the open block: first seq, last seq.
    open: Vec<(String, i64, i64)>,
    open_rows: usize,
    block_start: u64,
    rows: i64,
    rows_hash: Sha256,
}

impl<W: Write> ArchiveWriter<W> {
    pub fn new(inner: W) -> apache_avro::AvroResult<Self> {
        let tally = Tally {
            inner,
            pos: 0,
            whole: Sha256::new(),
            block: Sha256::new(),
        };
        let mut avro = apache_avro::Writer::builder()
            .schema(schema())
            .writer(tally)
            .codec(Codec::Deflate(DeflateSettings::default()))
            // Blocks are cut by `append` every BLOCK_ROWS rows; the
            // library cuts one early only past this many bytes (`append`
            // notices and records it).
            .block_size(4 << 20)
            .build()?;
        // The header alone, so its length and hash are known.
        avro.flush()?;
        let tally = avro.get_mut();
        let header_len = tally.pos;
        let header_sha256 =
            hex::encode(std::mem::replace(&mut tally.block, Sha256::new()).finalize());
        Ok(Self {
            avro,
            index: ArchiveIndex {
                format: FORMAT.to_string(),
                header_len,
                header_sha256,
                blocks: Vec::new(),
                topics: BTreeMap::new(),
            },
            open: Vec::new(),
            open_rows: 0,
            block_start: header_len,
            rows: 0,
            rows_hash: Sha256::new(),
        })
    }

    pub fn append(&mut self, row: &ArchivedRow) -> apache_avro::AvroResult<()> {
        self.rows_hash.update(row.datum());
        self.avro.append_value(row.to_value())?;
        match self.open.last_mut() {
            Some((topic, _, last)) if *topic == row.topic => *last = row.seqid,
            _ => self.open.push((row.topic.clone(), row.seqid, row.seqid)),
        }
        self.open_rows += 1;
        self.rows += 1;
        if self.avro.get_ref().pos != self.block_start {
            // The library wrote the open block (a large one) itself.
            self.record();
        } else if self.open_rows >= BLOCK_ROWS {
            self.cut()?;
        }
        Ok(())
    }

    /// Closes the open block.
    fn cut(&mut self) -> apache_avro::AvroResult<()> {
        if self.open_rows == 0 {
            return Ok(());
        }
        self.avro.flush()?;
        self.record();
        Ok(())
    }

    /// Records the block just written (everything since `block_start`).
    fn record(&mut self) {
        let tally = self.avro.get_mut();
        let (offset, len) = (self.block_start, tally.pos - self.block_start);
        let sha256 = hex::encode(std::mem::replace(&mut tally.block, Sha256::new()).finalize());
        let block = self.index.blocks.len() as u32;
        self.index.blocks.push(BlockRef {
            offset,
            len,
            rows: self.open_rows as u32,
            sha256,
        });
        for (topic, first_seq, last_seq) in self.open.drain(..) {
            self.index
                .topics
                .entry(topic)
                .or_default()
                .push(TopicBlock {
                    block,
                    first_seq,
                    last_seq,
                    offset,
                    len,
                });
        }
        self.block_start += len;
        self.open_rows = 0;
    }

    pub fn finish(mut self) -> apache_avro::AvroResult<Written<W>> {
        self.cut()?;
        let index = std::mem::replace(
            &mut self.index,
            ArchiveIndex {
                format: String::new(),
                header_len: 0,
                header_sha256: String::new(),
                blocks: Vec::new(),
                topics: BTreeMap::new(),
            },
        );
        let (rows, rows_sha256) = (self.rows, hex::encode(self.rows_hash.finalize()));
        let tally = self.avro.into_inner()?;
        Ok(Written {
            data: ObjectRef {
                name: DATA_OBJECT.to_string(),
                bytes: tally.pos,
                sha256: hex::encode(tally.whole.finalize()),
            },
            inner: tally.inner,
            index,
            row_count: rows,
            rows_sha256,
        })
    }
}

/// Decodes the rows of one block: the data object's header followed by
/// the block's bytes is a small container file of its own.
pub fn decode_block(header: &[u8], block: &[u8]) -> Result<Vec<ArchivedRow>, String> {
    let mut bytes = Vec::with_capacity(header.len() + block.len());
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(block);
    decode_rows(&bytes[..])
}

/// Every row of a container file.
pub fn decode_rows<R: std::io::Read>(reader: R) -> Result<Vec<ArchivedRow>, String> {
    let reader = apache_avro::Reader::new(reader).map_err(|e| format!("avro header: {e}"))?;
    let mut out = Vec::new();
    for value in reader {
        let value = value.map_err(|e| format!("avro block: {e}"))?;
        out.push(ArchivedRow::from_value(value)?);
    }
    Ok(out)
}

/// Hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(topic: &str, seq: i64) -> ArchivedRow {
        ArchivedRow {
            message_id: seq * 10,
            topic: topic.into(),
            group_id: 1,
            seqid: seq,
            from_user: 7,
            client_msg_id: (seq % 2 == 0).then(|| format!("c{seq}")),
            msg_type: "text".into(),
            status: "normal".into(),
            content: Some(format!("{{\"txt\": \"消息 {seq}\"}}")),
            head: None,
            mentioned_user_ids: None,
            mention_all: 0,
            reply_seqid: None,
            root_seqid: Some(1),
            file_count: 0,
            content_size: 10,
            has_risk: 0,
            audit_status: "pass".into(),
            version: 1,
            recalled_at: None,
            recalled_by: None,
            deleted_at: None,
            expires_at: None,
            created_at: "2026-09-05 12:00:00.123".into(),
            updated_at: "2026-09-05 12:00:00.123".into(),
            created_ms: 1_788_609_600_123 + seq,
        }
    }

    #[test]
    fn blocks_decode_alone_and_the_index_locates_them() {
        let mut w = ArchiveWriter::new(Vec::new()).unwrap();
        let rows: Vec<ArchivedRow> = (1..=300)
            .map(|s| row("grpA", s))
            .chain((1..=5).map(|s| row("grpB", s)))
            .collect();
        for r in &rows {
            w.append(r).unwrap();
        }
        let out = w.finish().unwrap();
        let data = out.inner;
        assert_eq!(out.row_count, 305);
        assert_eq!(out.data.bytes, data.len() as u64);
        assert_eq!(out.data.sha256, sha256_hex(&data));
        assert_eq!(decode_rows(&data[..]).unwrap(), rows);
        let index = out.index;
        assert_eq!(index.blocks.len(), 3);
        let a = &index.topics["grpA"];
        assert_eq!(
            a.iter()
                .map(|b| (b.block, b.first_seq, b.last_seq))
                .collect::<Vec<_>>(),
            vec![(0, 1, 128), (1, 129, 256), (2, 257, 300)]
        );
        assert_eq!(
            index.topics["grpB"]
                .iter()
                .map(|b| (b.block, b.first_seq, b.last_seq))
                .collect::<Vec<_>>(),
            vec![(2, 1, 5)]
        );
        let header = &data[..index.header_len as usize];
        assert_eq!(sha256_hex(header), index.header_sha256);
        for (i, b) in index.blocks.iter().enumerate() {
            let bytes = &data[b.offset as usize..(b.offset + b.len) as usize];
            assert_eq!(sha256_hex(bytes), b.sha256);
            let decoded = decode_block(header, bytes).unwrap();
            assert_eq!(decoded.len(), b.rows as usize);
            assert_eq!(decoded[0], rows[i * BLOCK_ROWS]);
        }
        // Deflate keeps it compact: well under the rows' text size.
        let text: usize = rows
            .iter()
            .map(|r| r.content.as_ref().unwrap().len() + 80)
            .sum();
        assert!((data.len()) < text, "{} bytes for {text}", data.len());
    }

    #[test]
    fn an_empty_month_is_a_header_and_no_blocks() {
        let w = ArchiveWriter::new(Vec::new()).unwrap();
        let out = w.finish().unwrap();
        assert!(out.index.blocks.is_empty());
        assert_eq!(out.index.header_len, out.data.bytes);
        assert!(decode_rows(&out.inner[..]).unwrap().is_empty());
    }
}
