//! The Confluent wire format (magic byte, schema id, Avro datum), through
//! schema_registry_converter: events are written with the schema this build
//! carries (registered under TopicNameStrategy, `<topic>-value`) and read
//! with whatever writer schema the record names.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::Schema;
use schema_registry_converter::async_impl::avro::{AvroDecoder, AvroEncoder};
use schema_registry_converter::async_impl::schema_registry::SrSettings;
use schema_registry_converter::avro_common::get_supplied_schema;
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::SubjectNameStrategy;

use super::model::Event;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("schema registry: {0}")]
    Registry(#[from] SRCError),
    #[error("{kind}: the schema this build carries does not parse: {source}")]
    BadSchema {
        kind: &'static str,
        source: apache_avro::Error,
    },
    #[error("{kind}: record does not fit the schema: {source}")]
    Shape {
        kind: &'static str,
        source: apache_avro::Error,
    },
    #[error("{kind}: unknown event kind {name:?} (written by a newer producer?)")]
    UnknownKind { kind: &'static str, name: String },
    #[error("empty record (tombstone)")]
    Empty,
}

impl CodecError {
    /// Registry outages are worth retrying; malformed records are not.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CodecError::Registry(e) if e.retriable)
    }
}

/// Encodes and decodes every event envelope of [`super::model`].
#[derive(Clone)]
pub struct EventCodec {
    encoder: Arc<AvroEncoder>,
    decoder: Arc<AvroDecoder>,
    /// Subject strategy per Kafka topic (carries this build's schema text).
    strategies: Arc<Mutex<HashMap<String, Arc<SubjectNameStrategy>>>>,
    /// Writer schema id → this build's index of each body union branch
    /// (`None` for a branch this build does not know).
    branch_maps: Arc<Mutex<HashMap<u32, Arc<BranchMap>>>>,
    /// The registry's URL: with a schema id, the key of [`READERS`].
    registry: Arc<str>,
}

/// A decoder per writer schema, by (registry URL, schema id), for the
/// process's life. `AvroDecoder::decode_with_schema` resolves the writer
/// schema's named types again for every record (a map of cloned names: the
/// largest single cost of a pipeline in the profile); a reader built once
/// keeps them. The schemas are leaked on purpose: one per registered schema
/// version seen, never freed, bounded by the registry's contents.
static READERS: LazyLock<Mutex<HashMap<(Arc<str>, u32), Arc<WriterReader>>>> =
    LazyLock::new(Mutex::default);

/// A writer schema and its reader.
struct WriterReader {
    schema: &'static Schema,
    reader: GenericDatumReader<'static>,
}

/// The schema id of a Confluent-framed record (magic byte 0, then a
/// big-endian u32) and its Avro payload.
fn framed(bytes: &[u8]) -> Option<(u32, &[u8])> {
    match bytes {
        [0, a, b, c, d, payload @ ..] => Some((u32::from_be_bytes([*a, *b, *c, *d]), payload)),
        _ => None,
    }
}

/// How a writer schema's body branches map onto this build's.
#[derive(Debug)]
struct BranchMap {
    to_reader: Vec<Option<u32>>,
    writer_names: Vec<String>,
}

impl EventCodec {
    pub fn new(registry_url: &str) -> Result<Self, CodecError> {
        let settings = SrSettings::new_builder(registry_url.trim_end_matches('/').to_string())
            .no_proxy()
            .set_timeout(std::time::Duration::from_secs(10))
            .build()?;
        Ok(Self {
            encoder: Arc::new(AvroEncoder::new(settings.clone())),
            decoder: Arc::new(AvroDecoder::new(settings)),
            strategies: Arc::default(),
            branch_maps: Arc::default(),
            registry: Arc::from(registry_url.trim_end_matches('/')),
        })
    }

    fn strategy<E: Event>(&self, topic: &str) -> Result<Arc<SubjectNameStrategy>, CodecError> {
        if let Some(s) = self.strategies.lock().expect("codec lock").get(topic) {
            return Ok(s.clone());
        }
        let schema = parse_schema::<E>()?;
        let strategy = Arc::new(SubjectNameStrategy::TopicNameStrategyWithSchema(
            topic.to_string(),
            false,
            get_supplied_schema(&schema),
        ));
        self.strategies
            .lock()
            .expect("codec lock")
            .insert(topic.to_string(), strategy.clone());
        Ok(strategy)
    }

    /// Encodes `event` for Kafka topic `topic`. The first call per topic
    /// registers (or finds) this build's schema and caches its id.
    pub async fn encode<E: Event>(&self, topic: &str, event: &E) -> Result<Vec<u8>, CodecError> {
        let strategy = self.strategy::<E>(topic)?;
        Ok(self.encoder.encode_struct(event, &strategy).await?)
    }

    /// Decodes a record value written with any registered version of `E`'s
    /// schema.
    pub async fn decode<E: Event>(&self, bytes: Option<&[u8]>) -> Result<E, CodecError> {
        if let Some(event) = bytes.and_then(super::decoded::get::<E>) {
            return Ok(event);
        }
        let event = self.decode_anew::<E>(bytes).await?;
        if let Some(bytes) = bytes {
            super::decoded::put(bytes, &event);
        }
        Ok(event)
    }

    async fn decode_anew<E: Event>(&self, bytes: Option<&[u8]>) -> Result<E, CodecError> {
        let Some((id, payload)) = bytes.and_then(framed) else {
            // Not a framed record: the registry client's own errors.
            self.decoder.decode_with_schema(bytes).await?;
            return Err(CodecError::Empty);
        };
        let key = (self.registry.clone(), id);
        let known = READERS.lock().expect("codec lock").get(&key).cloned();
        let reader = match known {
            Some(reader) => reader,
            None => {
                // First record of this schema id: fetch it (the registry
                // client caches it) and build its reader.
                let decoded = self
                    .decoder
                    .decode_with_schema(bytes)
                    .await?
                    .ok_or(CodecError::Empty)?;
                let schema: &'static Schema = Box::leak(Box::new(decoded.schema.parsed.clone()));
                let reader = GenericDatumReader::builder(schema)
                    .build()
                    .map_err(|source| CodecError::Shape {
                        kind: E::KIND,
                        source,
                    })?;
                let reader = Arc::new(WriterReader { schema, reader });
                READERS
                    .lock()
                    .expect("codec lock")
                    .entry(key)
                    .or_insert(reader)
                    .clone()
            }
        };
        let value = reader
            .reader
            .read_value(&mut &payload[..])
            .map_err(|source| CodecError::Shape {
                kind: E::KIND,
                source,
            })?;
        let map = self.branch_map::<E>(id, reader.schema)?;
        let value = apply_branch_map::<E>(value, &map)?;
        apache_avro::from_value(&value).map_err(|source| CodecError::Shape {
            kind: E::KIND,
            source,
        })
    }
}

impl EventCodec {
    fn branch_map<E: Event>(
        &self,
        writer_id: u32,
        writer: &Schema,
    ) -> Result<Arc<BranchMap>, CodecError> {
        if let Some(m) = self.branch_maps.lock().expect("codec lock").get(&writer_id) {
            return Ok(m.clone());
        }
        let reader = parse_schema::<E>()?;
        let map = Arc::new(branch_map_between(writer, &reader));
        self.branch_maps
            .lock()
            .expect("codec lock")
            .insert(writer_id, map.clone());
        Ok(map)
    }
}

/// Parsed schemas of this build, by event kind (parsed once).
static PARSED: LazyLock<Mutex<HashMap<&'static str, Schema>>> = LazyLock::new(Mutex::default);

/// The schema of `E` this build carries.
fn parse_schema<E: Event>() -> Result<Schema, CodecError> {
    if let Some(s) = PARSED.lock().expect("schema cache").get(E::KIND) {
        return Ok(s.clone());
    }
    let schema = Schema::parse_str(E::SCHEMA).map_err(|source| CodecError::BadSchema {
        kind: E::KIND,
        source,
    })?;
    PARSED
        .lock()
        .expect("schema cache")
        .insert(E::KIND, schema.clone());
    Ok(schema)
}

/// Rewrites the `body` branch index with a cached [`BranchMap`].
fn apply_branch_map<E: Event>(value: Value, map: &BranchMap) -> Result<Value, CodecError> {
    let Value::Record(mut fields) = value else {
        return Ok(value);
    };
    for (name, field) in fields.iter_mut() {
        if name != "body" {
            continue;
        }
        if let Value::Union(index, inner) = field {
            let Some(Some(mine)) = map.to_reader.get(*index as usize) else {
                return Err(CodecError::UnknownKind {
                    kind: E::KIND,
                    name: map
                        .writer_names
                        .get(*index as usize)
                        .cloned()
                        .unwrap_or_default(),
                });
            };
            *field = Value::Union(*mine, std::mem::replace(inner, Box::new(Value::Null)));
        }
    }
    Ok(Value::Record(fields))
}

/// Union branches are chosen by index on the wire: maps the writer
/// schema's body branches to this build's by record name, so a reordered or
/// extended union still decodes right.
fn branch_map_between(writer: &Schema, reader: &Schema) -> BranchMap {
    let writer_names = body_branches(writer).unwrap_or_default();
    let reader_names = body_branches(reader).unwrap_or_default();
    let to_reader = writer_names
        .iter()
        .map(|w| reader_names.iter().position(|r| r == w).map(|p| p as u32))
        .collect();
    BranchMap {
        to_reader,
        writer_names,
    }
}

/// Record names of the `body` union of an envelope schema.
fn body_branches(schema: &Schema) -> Option<Vec<String>> {
    let Schema::Record(record) = schema else {
        return None;
    };
    let field = record.fields.iter().find(|f| f.name == "body")?;
    let Schema::Union(union) = &field.schema else {
        return None;
    };
    Some(
        union
            .variants()
            .iter()
            .map(|v| match v {
                Schema::Record(r) => r.name.name().to_string(),
                other => format!("{other:?}"),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::model::*;

    /// Every body enum lists the schema's union branches in order.
    fn assert_branches_match<E: Event>(names: &[&str]) {
        let schema = parse_schema::<E>().unwrap();
        let branches = body_branches(&schema).unwrap();
        assert_eq!(
            branches,
            names,
            "{} body enum and schema union differ",
            E::KIND
        );
    }

    #[test]
    fn enums_follow_schema_union_order() {
        assert_branches_match::<GroupEvent>(&[
            "MessageSent",
            "MessageEdited",
            "MessageRecalled",
            "MessageDeleted",
            "HistoryCleared",
            "MemberJoined",
            "MemberLeft",
            "MemberRoleChanged",
            "MemberMuted",
            "GroupMuteChanged",
            "GroupCreated",
            "GroupDissolved",
            "GroupProfileChanged",
            "MessageReported",
            "MessageReportResolved",
            "MemberInvited",
            "MemberInviteDeclined",
            "FileAuditUpdated",
            "PinsChanged",
        ]);
        assert_branches_match::<UserEvent>(&[
            "FriendRequestCreated",
            "FriendRequestAccepted",
            "FriendAdded",
            "FriendRemoved",
            "UserBlocked",
            "UserUnblocked",
            "SystemNotification",
            "BadgeRefresh",
            "PushSettingsChanged",
            "ProfileChanged",
            "FavoriteAdded",
            "FavoriteRemoved",
            "NotificationsRead",
            "ChatSettingsChanged",
            "IncognitoChanged",
            "FileUploaded",
            "FileAvailabilityChanged",
        ]);
        assert_branches_match::<ReceiptEvent>(&["ReadReceipt", "RecvReceipt"]);
        assert_branches_match::<SessionControlEvent>(&[
            "DeviceRevoked",
            "SignedOutEverywhere",
            "UserDisabled",
            "UserEnabled",
            "PasswordReset",
        ]);
    }

    #[test]
    fn every_schema_parses() {
        parse_schema::<GroupEvent>().unwrap();
        parse_schema::<ReceiptEvent>().unwrap();
        parse_schema::<SessionControlEvent>().unwrap();
        parse_schema::<AdminCommand>().unwrap();
        parse_schema::<AdminResult>().unwrap();
    }

    #[test]
    fn branch_remap_follows_names() {
        let writer = Schema::parse_str(
            r#"{"type":"record","name":"E","fields":[{"name":"body","type":[
                {"type":"record","name":"B","fields":[]},
                {"type":"record","name":"A","fields":[]}]}]}"#,
        )
        .unwrap();
        let reader = Schema::parse_str(
            r#"{"type":"record","name":"E","fields":[{"name":"body","type":[
                {"type":"record","name":"A","fields":[]},
                {"type":"record","name":"B","fields":[]}]}]}"#,
        )
        .unwrap();
        let value = Value::Record(vec![(
            "body".into(),
            Value::Union(0, Box::new(Value::Record(vec![]))),
        )]);
        let map = branch_map_between(&writer, &reader);
        let remapped = apply_branch_map::<GroupEvent>(value, &map).unwrap();
        assert_eq!(
            remapped,
            Value::Record(vec![(
                "body".into(),
                Value::Union(1, Box::new(Value::Record(vec![])))
            )])
        );
    }
}
