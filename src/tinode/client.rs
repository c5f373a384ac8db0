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
    pub set: Option<MsgSet>,
    pub acc: Option<MsgAcc>,
}

/// `{set}`: a topic's description (`public`, `private`), a subscription's
/// mode, tags or aux data.
#[derive(Debug, Deserialize)]
pub struct MsgSet {
    pub id: Option<String>,
    pub topic: String,
    pub desc: Option<SetDesc>,
    pub sub: Option<Value>,
    pub tags: Option<Value>,
    pub cred: Option<Value>,
    pub aux: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct SetDesc {
    pub public: Option<Value>,
    pub private: Option<Value>,
    pub trusted: Option<Value>,
    pub defacs: Option<Value>,
}

/// `{acc}`: account creation (`user="new"`), or a change of one's own
/// password (`scheme="basic"`, `secret` = base64 of `login:password`,
/// proven by `tmpscheme`/`tmpsecret` or the session's fresh login).
#[derive(Debug, Default, Deserialize)]
pub struct MsgAcc {
    pub id: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub secret: Option<String>,
    #[serde(default)]
    pub tmpscheme: Option<String>,
    #[serde(default)]
    pub tmpsecret: Option<String>,
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
    /// What a new topic starts with (`{sub topic="new…" set={desc}}`).
    pub set: Option<SubSet>,
}

/// The `set` of a `{sub}`: the new topic's description.
#[derive(Debug, Default, Deserialize)]
pub struct SubSet {
    pub desc: Option<SetDesc>,
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

#[derive(Debug, Default, Deserialize)]
pub struct GetQuery {
    #[serde(default)]
    pub what: String,
    pub data: Option<DataQuery>,
    pub del: Option<DataQuery>,
    pub sub: Option<SubQuery>,
    pub desc: Option<DescQuery>,
}

/// `get.sub`: only entries changed since `ims`, at most `limit`, or only
/// one `topic` (on `me`) or one `user` (on a group).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct SubQuery {
    pub ims: Option<String>,
    pub limit: Option<i64>,
    pub topic: Option<String>,
    pub user: Option<String>,
}

/// `get.desc`: only if changed since `ims`.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct DescQuery {
    pub ims: Option<String>,
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
    /// `what="sub"`: the member removed (`usr…`).
    pub user: Option<String>,
}
