//! The events, as Rust types. Each envelope mirrors one `schemas/*.avsc`
//! record field for field; each body enum lists the union's branches in the
//! schema's order (the codec maps branches by name on decode, so a writer
//! with more branches is still read correctly).
//!
//! Times are UTC epoch milliseconds (`timestamp-millis` in the schemas).

use serde::{Deserialize, Serialize};

/// An envelope type bound to its schema file and Kafka topic kind.
pub trait Event: Serialize + serde::de::DeserializeOwned + Clone + Send + Sync + 'static {
    /// The `.avsc` text the code was built with.
    const SCHEMA: &'static str;
    /// Short name for metrics and errors.
    const KIND: &'static str;
    /// Name of the body record (the event kind), for logs and metrics.
    fn body_name(&self) -> &'static str;
}

// ---------------------------------------------------------------- group events

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupEvent {
    pub event_id: String,
    pub tenant_id: String,
    pub topic: String,
    pub occurred_at: i64,
    pub actor_uid: i64,
    #[serde(default)]
    pub actor_device: String,
    #[serde(default)]
    pub source_sid: String,
    #[serde(default)]
    pub source_node: String,
    #[serde(default)]
    pub traceparent: String,
    pub body: GroupEventBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum GroupEventBody {
    MessageSent(MessageSent),
    MessageEdited(MessageEdited),
    MessageRecalled(MessageRecalled),
    MessageDeleted(MessageDeleted),
    HistoryCleared(HistoryCleared),
    MemberJoined(MemberJoined),
    MemberLeft(MemberLeft),
    MemberRoleChanged(MemberRoleChanged),
    MemberMuted(MemberMuted),
    GroupMuteChanged(GroupMuteChanged),
    GroupCreated(GroupCreated),
    GroupDissolved(GroupDissolved),
    GroupProfileChanged(GroupProfileChanged),
    MessageReported(MessageReported),
    MessageReportResolved(MessageReportResolved),
    MemberInvited(MemberInvited),
    MemberInviteDeclined(MemberInviteDeclined),
    FileAuditUpdated(FileAuditUpdated),
    PinsChanged(Pins),
}

impl GroupEventBody {
    pub fn name(&self) -> &'static str {
        match self {
            GroupEventBody::MessageSent(_) => "MessageSent",
            GroupEventBody::MessageEdited(_) => "MessageEdited",
            GroupEventBody::MessageRecalled(_) => "MessageRecalled",
            GroupEventBody::MessageDeleted(_) => "MessageDeleted",
            GroupEventBody::HistoryCleared(_) => "HistoryCleared",
            GroupEventBody::MemberJoined(_) => "MemberJoined",
            GroupEventBody::MemberLeft(_) => "MemberLeft",
            GroupEventBody::MemberRoleChanged(_) => "MemberRoleChanged",
            GroupEventBody::MemberMuted(_) => "MemberMuted",
            GroupEventBody::GroupMuteChanged(_) => "GroupMuteChanged",
            GroupEventBody::GroupCreated(_) => "GroupCreated",
            GroupEventBody::GroupDissolved(_) => "GroupDissolved",
            GroupEventBody::GroupProfileChanged(_) => "GroupProfileChanged",
            GroupEventBody::MessageReported(_) => "MessageReported",
            GroupEventBody::MessageReportResolved(_) => "MessageReportResolved",
            GroupEventBody::MemberInvited(_) => "MemberInvited",
            GroupEventBody::MemberInviteDeclined(_) => "MemberInviteDeclined",
            GroupEventBody::FileAuditUpdated(_) => "FileAuditUpdated",
            GroupEventBody::PinsChanged(_) => "PinsChanged",
        }
    }
}

impl GroupEvent {
    /// A new event of `topic` caused by `actor_uid`, now, with a fresh id;
    /// device, session, node and trace context are filled in by the caller
    /// where known.
    pub fn new(tenant: &str, topic: &str, actor_uid: i64, body: GroupEventBody) -> Self {
        Self {
            event_id: super::new_event_id(),
            tenant_id: tenant.to_string(),
            topic: topic.to_string(),
            occurred_at: super::now_ms(),
            actor_uid,
            actor_device: String::new(),
            source_sid: String::new(),
            source_node: String::new(),
            traceparent: String::new(),
            body,
        }
    }

    /// The Kafka key: `{tenant}:{topic}` (one partition per topic).
    pub fn key(&self) -> String {
        format!("{}:{}", self.tenant_id, self.topic)
    }
}

impl Event for GroupEvent {
    const SCHEMA: &'static str = include_str!("../../schemas/group_events.avsc");
    const KIND: &'static str = "group_events";
    fn body_name(&self) -> &'static str {
        self.body.name()
    }
}

/// A message was accepted; `seq` and `shard_month` are fixed here for good.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageSent {
    pub message_id: i64,
    pub group_id: i64,
    pub seq: i64,
    pub shard_month: String,
    #[serde(default)]
    pub client_msg_id: Option<String>,
    pub from_user: i64,
    #[serde(default = "default_msg_type")]
    pub msg_type: String,
    #[serde(default)]
    pub head: Option<String>,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub mentioned_user_ids: Vec<i64>,
    #[serde(default)]
    pub mention_all: bool,
    #[serde(default)]
    pub reply_seq: Option<i64>,
    #[serde(default)]
    pub root_seq: Option<i64>,
    #[serde(default)]
    pub file_count: i32,
    #[serde(default)]
    pub content_size: i32,
    #[serde(default)]
    pub has_risk: bool,
    #[serde(default = "default_audit_status")]
    pub audit_status: String,
    pub created_at: i64,
    #[serde(default)]
    pub expires_at: Option<i64>,
}

fn default_msg_type() -> String {
    "text".into()
}

fn default_audit_status() -> String {
    "pass".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageEdited {
    pub seq: i64,
    #[serde(default)]
    pub edit_seq: Option<i64>,
    #[serde(default)]
    pub head: Option<String>,
    #[serde(default)]
    pub content: Option<String>,
    pub edited_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageRecalled {
    pub seq: i64,
    pub recalled_at: i64,
    #[serde(default)]
    pub del_id: i32,
}

/// A seq range `[low, hi)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqRange {
    pub low: i64,
    pub hi: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageDeleted {
    pub ranges: Vec<SeqRange>,
    pub del_id: i32,
    #[serde(default)]
    pub moderation: bool,
    #[serde(default)]
    pub reason: String,
    pub deleted_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryCleared {
    pub uid: i64,
    pub ranges: Vec<SeqRange>,
    pub del_id: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberJoined {
    pub uid: i64,
    #[serde(default)]
    pub role: String,
    #[serde(default)]
    pub invited_by: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberLeft {
    pub uid: i64,
    #[serde(default)]
    pub kicked: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRoleChanged {
    pub uid: i64,
    pub role: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberMuted {
    pub uid: i64,
    #[serde(default)]
    pub muted_until: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupMuteChanged {
    pub mute_all: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupCreated {
    pub group_id: i64,
    #[serde(default)]
    pub name: String,
    pub owner_uid: i64,
    #[serde(default)]
    pub members: Vec<i64>,
}

/// A pending invitation of `uid` (who may not be added directly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberInvited {
    pub uid: i64,
    pub invited_by: i64,
}

/// `uid`'s pending invitation is gone without their joining.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberInviteDeclined {
    pub uid: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupDissolved {
    #[serde(default)]
    pub reason: String,
}

/// A group's public profile changed; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupProfileChanged {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub photo: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// A member reported message `seq` to the tenant's moderators (the
/// reporter is the envelope's actor). Private: never delivered to members.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageReported {
    pub report_id: String,
    pub seq: i64,
    pub reason: String,
}

/// An operator closed a report: `dismissed` or `actioned`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageReportResolved {
    pub report_id: String,
    pub resolution: String,
    #[serde(default)]
    pub note: String,
}

/// An operator audited the file message `seq` (admin command
/// `file.audit.update`): `ok` or `blocked`. Private: never delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileAuditUpdated {
    pub seq: i64,
    pub status: String,
}

/// A chat's pinned messages (Tinode's `aux.pins`), whole; empty: none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pins {
    #[serde(default)]
    pub pins: Vec<i64>,
}

// ---------------------------------------------------------------- receipts

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReceiptEvent {
    pub event_id: String,
    pub tenant_id: String,
    pub topic: String,
    pub occurred_at: i64,
    pub uid: i64,
    #[serde(default)]
    pub device: String,
    #[serde(default)]
    pub source_sid: String,
    #[serde(default)]
    pub source_node: String,
    pub body: ReceiptBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReceiptBody {
    ReadReceipt(SeqCursor),
    RecvReceipt(SeqCursor),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeqCursor {
    pub seq: i64,
}

impl Event for ReceiptEvent {
    const SCHEMA: &'static str = include_str!("../../schemas/receipts.avsc");
    const KIND: &'static str = "receipts";
    fn body_name(&self) -> &'static str {
        match self.body {
            ReceiptBody::ReadReceipt(_) => "ReadReceipt",
            ReceiptBody::RecvReceipt(_) => "RecvReceipt",
        }
    }
}

// ---------------------------------------------------------------- session control

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionControlEvent {
    pub event_id: String,
    pub tenant_id: String,
    pub uid: i64,
    pub occurred_at: i64,
    #[serde(default)]
    pub actor_uid: i64,
    #[serde(default)]
    pub reason: String,
    pub body: SessionControlBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SessionControlBody {
    DeviceRevoked(DeviceRevoked),
    SignedOutEverywhere(AuthVersion),
    UserDisabled(AuthVersion),
    UserEnabled(Empty),
    PasswordReset(AuthVersion),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceRevoked {
    pub device: String,
    pub device_version: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuthVersion {
    pub auth_version: i64,
}

/// A record with no fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Empty {}

impl Event for SessionControlEvent {
    const SCHEMA: &'static str = include_str!("../../schemas/session_control.avsc");
    const KIND: &'static str = "session_control";
    fn body_name(&self) -> &'static str {
        match self.body {
            SessionControlBody::DeviceRevoked(_) => "DeviceRevoked",
            SessionControlBody::SignedOutEverywhere(_) => "SignedOutEverywhere",
            SessionControlBody::UserDisabled(_) => "UserDisabled",
            SessionControlBody::UserEnabled(_) => "UserEnabled",
            SessionControlBody::PasswordReset(_) => "PasswordReset",
        }
    }
}

// ---------------------------------------------------------------- admin

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdminCommand {
    pub command_id: String,
    pub tenant_id: String,
    pub issued_at: i64,
    pub operator: String,
    #[serde(default)]
    pub reason: String,
    pub body: AdminCommandBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminCommandBody {
    UserDisable(UserRef),
    UserEnable(UserRef),
    UserPasswordReset(UserPasswordReset),
    UserDeviceRevoke(UserDevice),
    GroupDelete(TopicRef),
    GroupMemberRemove(TopicMember),
    GroupAdminSet(TopicMember),
    GroupAdminRemove(TopicMember),
    GroupMemberMute(TopicMemberMute),
    MessageModerate(TopicSeq),
    GroupMemberAdd(TopicMembers),
    FileAuditUpdate(FileAuditUpdate),
    AbuseReportResolve(AbuseReportResolve),
}

/// `user.password.reset`: the new password's Argon2id PHC string, made by
/// whoever issued the command (the password itself never travels); empty:
/// the old password stops working and none logs in until one is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserPasswordReset {
    pub uid: i64,
    #[serde(default)]
    pub password_hash: String,
}

/// `file.audit.update`: the audit outcome (`ok`, `blocked`) of a file
/// message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileAuditUpdate {
    pub topic: String,
    pub seq: i64,
    pub status: String,
}

/// `abuse.report.resolve`: closes an open report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbuseReportResolve {
    pub report_id: String,
    pub resolution: String,
    #[serde(default)]
    pub note: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserRef {
    pub uid: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserDevice {
    pub uid: i64,
    pub device: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicRef {
    pub topic: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMember {
    pub topic: String,
    pub uid: i64,
}

/// Many users of one group (an operator's bulk add).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMembers {
    pub topic: String,
    pub uids: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicMemberMute {
    pub topic: String,
    pub uid: i64,
    #[serde(default)]
    pub until: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicSeq {
    pub topic: String,
    pub seq: i64,
}

impl Event for AdminCommand {
    const SCHEMA: &'static str = include_str!("../../schemas/admin_commands.avsc");
    const KIND: &'static str = "admin_commands";
    fn body_name(&self) -> &'static str {
        match self.body {
            AdminCommandBody::UserDisable(_) => "UserDisable",
            AdminCommandBody::UserEnable(_) => "UserEnable",
            AdminCommandBody::UserPasswordReset(_) => "UserPasswordReset",
            AdminCommandBody::UserDeviceRevoke(_) => "UserDeviceRevoke",
            AdminCommandBody::GroupDelete(_) => "GroupDelete",
            AdminCommandBody::GroupMemberRemove(_) => "GroupMemberRemove",
            AdminCommandBody::GroupAdminSet(_) => "GroupAdminSet",
            AdminCommandBody::GroupAdminRemove(_) => "GroupAdminRemove",
            AdminCommandBody::GroupMemberMute(_) => "GroupMemberMute",
            AdminCommandBody::MessageModerate(_) => "MessageModerate",
            AdminCommandBody::GroupMemberAdd(_) => "GroupMemberAdd",
            AdminCommandBody::FileAuditUpdate(_) => "FileAuditUpdate",
            AdminCommandBody::AbuseReportResolve(_) => "AbuseReportResolve",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdminResult {
    pub command_id: String,
    pub tenant_id: String,
    pub completed_at: i64,
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub event_ids: Vec<String>,
}

impl Event for AdminResult {
    const SCHEMA: &'static str = include_str!("../../schemas/admin_results.avsc");
    const KIND: &'static str = "admin_results";
    fn body_name(&self) -> &'static str {
        "AdminResult"
    }
}

// ---------------------------------------------------------------- user events

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserEvent {
    pub event_id: String,
    pub tenant_id: String,
    pub uid: i64,
    pub occurred_at: i64,
    #[serde(default)]
    pub actor_uid: i64,
    pub body: UserEventBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum UserEventBody {
    FriendRequestCreated(FriendRequestCreated),
    FriendRequestAccepted(FriendRequestAccepted),
    FriendAdded(FriendRef),
    FriendRemoved(FriendRef),
    UserBlocked(BlockRef),
    UserUnblocked(BlockRef),
    SystemNotification(SystemNotification),
    BadgeRefresh(BadgeRefresh),
    PushSettingsChanged(PushSettingsChanged),
    ProfileChanged(ProfileChanged),
    FavoriteAdded(FavoriteRef),
    FavoriteRemoved(FavoriteRef),
    NotificationsRead(NotificationsRead),
    ChatSettingsChanged(ChatSettings),
    IncognitoChanged(IncognitoChanged),
    FileUploaded(FileUploaded),
    FileAvailabilityChanged(FileAvailabilityChanged),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FriendRequestCreated {
    pub from_uid: i64,
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FriendRequestAccepted {
    pub by_uid: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FriendRef {
    pub friend_uid: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRef {
    pub blocked_uid: i64,
    /// Orders the changes of one block (0: from before versions).
    #[serde(default)]
    pub version: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemNotification {
    pub notification_id: String,
    pub title: String,
    #[serde(default)]
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BadgeRefresh {
    #[serde(default)]
    pub unread: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushSettingsChanged {
    #[serde(default)]
    pub dnd: Option<bool>,
    #[serde(default)]
    pub topic: Option<String>,
    #[serde(default)]
    pub topic_muted: bool,
    /// Orders the changes of one topic's mute (0: from before versions).
    #[serde(default)]
    pub version: i64,
}

/// A user's public profile changed; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfileChanged {
    #[serde(default, rename = "fn")]
    pub full_name: Option<String>,
    #[serde(default)]
    pub photo: Option<String>,
    #[serde(default)]
    pub note: Option<String>,
}

/// The user read notifications: these ids, and every one created up to
/// `up_to` (epoch ms; 0: none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationsRead {
    #[serde(default)]
    pub ids: Vec<String>,
    #[serde(default)]
    pub up_to: i64,
}

/// A message of a conversation, saved by reference only: `(topic, seq)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FavoriteRef {
    pub topic: String,
    pub seq: i64,
}

/// A user's own settings of one chat, whole: hidden from their list up to
/// a seq (0: shown), and Tinode's `private` (JSON object text).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatSettings {
    pub topic: String,
    #[serde(default)]
    pub hidden_until_seq: i64,
    #[serde(default)]
    pub private: Option<String>,
    /// One more than the settings it replaces (a newer stored row stays).
    #[serde(default)]
    pub version: i64,
}

/// The user hides (or shows again) when they are online: Tinode's
/// incognito, a `me` want without `P`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncognitoChanged {
    pub incognito: bool,
    /// Orders the user's changes of it, as a block's version.
    #[serde(default)]
    pub version: i64,
}

/// A user uploaded a file: where its bytes are, never the bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileUploaded {
    pub file_id: String,
    pub object_key: String,
    pub size: i64,
    /// Sniffed from the bytes.
    pub mime: String,
    #[serde(default)]
    pub name: String,
}

/// A file became unavailable to everyone (the scan flagged it, or an
/// operator's audit blocked a message carrying it), or available again
/// (an `ok` audit). Keyed by its uploader; `topics` are the conversations
/// with a message referring to it then, told live.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAvailabilityChanged {
    pub file_id: String,
    pub available: bool,
    /// `scan` or `audit`.
    pub by: String,
    #[serde(default)]
    pub topics: Vec<String>,
}

impl UserEventBody {
    pub fn name(&self) -> &'static str {
        match self {
            UserEventBody::FriendRequestCreated(_) => "FriendRequestCreated",
            UserEventBody::FriendRequestAccepted(_) => "FriendRequestAccepted",
            UserEventBody::FriendAdded(_) => "FriendAdded",
            UserEventBody::FriendRemoved(_) => "FriendRemoved",
            UserEventBody::UserBlocked(_) => "UserBlocked",
            UserEventBody::UserUnblocked(_) => "UserUnblocked",
            UserEventBody::SystemNotification(_) => "SystemNotification",
            UserEventBody::BadgeRefresh(_) => "BadgeRefresh",
            UserEventBody::PushSettingsChanged(_) => "PushSettingsChanged",
            UserEventBody::ProfileChanged(_) => "ProfileChanged",
            UserEventBody::FavoriteAdded(_) => "FavoriteAdded",
            UserEventBody::FavoriteRemoved(_) => "FavoriteRemoved",
            UserEventBody::NotificationsRead(_) => "NotificationsRead",
            UserEventBody::ChatSettingsChanged(_) => "ChatSettingsChanged",
            UserEventBody::IncognitoChanged(_) => "IncognitoChanged",
            UserEventBody::FileUploaded(_) => "FileUploaded",
            UserEventBody::FileAvailabilityChanged(_) => "FileAvailabilityChanged",
        }
    }
}

impl UserEvent {
    pub fn new(tenant: &str, uid: i64, actor_uid: i64, body: UserEventBody) -> Self {
        Self {
            event_id: super::new_event_id(),
            tenant_id: tenant.to_string(),
            uid,
            occurred_at: super::now_ms(),
            actor_uid,
            body,
        }
    }

    /// The partition key: `{tenant}:{uid}`.
    pub fn key(&self) -> String {
        format!("{}:{}", self.tenant_id, self.uid)
    }
}

impl Event for UserEvent {
    const SCHEMA: &'static str = include_str!("../../schemas/user_events.avsc");
    const KIND: &'static str = "user_events";
    fn body_name(&self) -> &'static str {
        self.body.name()
    }
}

// ---------------------------------------------------------------- push tasks

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushTask {
    pub task_id: String,
    pub tenant_id: String,
    pub topic: String,
    pub seq: i64,
    pub sender_uid: i64,
    pub recipient_uid: i64,
    pub created_at: i64,
}

impl Event for PushTask {
    const SCHEMA: &'static str = include_str!("../../schemas/push_tasks.avsc");
    const KIND: &'static str = "push_tasks";
    fn body_name(&self) -> &'static str {
        "PushTask"
    }
}
