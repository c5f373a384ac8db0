//! Client messages as types (what a Tinode client sends).

use serde::Deserialize;
use serde_json::{Map, Value};

/// One client message; exactly one field is set.
#[derive(Debug, Default, Deserialize)]
pub struct ClientMsg {
    pub hi: Option<MsgHi>,
    pub login: Option<MsgLogin>,
    pub sub: Option<MsgSub>,
    #[serde(rename = "pub")]
    pub publish: Option<MsgPub>,
    pub get: Option<MsgGet>,
    pub leave: Option<MsgLeave>,
    pub note: Option<MsgNote>,
    pub del: Option<MsgDel>,
    pub set: Option<Value>,
    pub acc: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct MsgHi {
    pub id: Option<String>,
    pub ver: Option<String>,
    pub ua: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct MsgLogin {
    pub id: Option<String>,
    pub scheme: String,
    #[serde(default)]
    pub secret: String,
}

#[derive(Debug, Deserialize)]
pub struct MsgSub {
    pub id: Option<String>,
    pub topic: String,
    pub get: Option<GetQuery>,
}

#[derive(Debug, Deserialize)]
pub struct MsgPub {
    pub id: Option<String>,
    pub topic: String,
    #[serde(default)]
    pub noecho: bool,
    pub head: Option<Map<String, Value>>,
    pub content: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct GetQuery {
    #[serde(default)]
    pub what: String,
    pub data: Option<DataQuery>,
    pub del: Option<DataQuery>,
}

#[derive(Debug, Deserialize)]
pub struct MsgGet {
    pub id: Option<String>,
    pub topic: String,
    #[serde(flatten)]
    pub query: GetQuery,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct DataQuery {
    pub since: Option<i64>,
    pub before: Option<i64>,
    pub limit: Option<i64>,
    pub ranges: Option<Vec<SeqRangeMsg>>,
}

/// `[low, hi)`; a missing `hi` means one message.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct SeqRangeMsg {
    pub low: i64,
    pub hi: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct MsgLeave {
    pub id: Option<String>,
    pub topic: String,
    #[serde(default)]
    pub unsub: bool,
}

#[derive(Debug, Deserialize)]
pub struct MsgNote {
    pub topic: String,
    pub what: String,
    pub seq: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct MsgDel {
    pub id: Option<String>,
    pub topic: String,
    pub what: String,
    pub delseq: Option<Vec<SeqRangeMsg>>,
    #[serde(default)]
    pub hard: bool,
}
