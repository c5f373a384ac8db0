//! Group governance (seed 002 §5 and §7): who may do what to whom, and the
//! past-tense events each action becomes. The rules here are pure; the
//! [`exec`] half reads the facts from the group write model
//! ([`crate::group_model`]), asks the rules, applies the change there
//! atomically and produces the events; [`consent`] says whether an added
//! user is added or invited. The gateway's HTTP API, its WebSocket paths
//! and the admin-command pipeline all go through it, so a rule holds however
//! an action arrives.

pub mod consent;
pub mod exec;

pub use exec::{Executor, Outcome};

use crate::events::{
    GroupDissolved, GroupEventBody, GroupMuteChanged, MemberJoined, MemberLeft, MemberMuted,
    MemberRoleChanged,
};
use crate::groups::{Role, Standing};

/// Who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// A user, with their standing in the group.
    User(i64, Standing),
    /// An operator through an admin command: any action a group owner may
    /// take, on any group.
    Operator,
}

/// What is asked. Targets are uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    AddMember(i64),
    Leave,
    Kick(i64),
    SetAdmin(i64),
    RemoveAdmin(i64),
    TransferOwner(i64),
    /// Mute until epoch ms; `None` lifts the mute.
    Mute(i64, Option<i64>),
    MuteAll(bool),
    Dissolve,
    /// Delete any member's messages for everyone (moderation).
    Moderate,
    /// Change the group's public profile (name, photo, description).
    EditProfile,
}

impl Action {
    /// The user the action is about, when it is about one.
    pub fn target(self) -> Option<i64> {
        match self {
            Action::AddMember(u)
            | Action::Kick(u)
            | Action::SetAdmin(u)
            | Action::RemoveAdmin(u)
            | Action::TransferOwner(u)
            | Action::Mute(u, _) => Some(u),
            Action::Leave
            | Action::MuteAll(_)
            | Action::Dissolve
            | Action::Moderate
            | Action::EditProfile => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Action::AddMember(_) => "add member",
            Action::Leave => "leave",
            Action::Kick(_) => "remove member",
            Action::SetAdmin(_) => "set admin",
            Action::RemoveAdmin(_) => "remove admin",
            Action::TransferOwner(_) => "transfer ownership",
            Action::Mute(..) => "mute member",
            Action::MuteAll(_) => "mute all",
            Action::Dissolve => "dissolve",
            Action::Moderate => "moderate messages",
            Action::EditProfile => "edit the group's profile",
        }
    }
}

/// Why an action was refused: an HTTP/Tinode code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{1}")]
pub struct Refused(pub u16, pub String);

fn refuse(code: u16, text: impl Into<String>) -> Result<(), Refused> {
    Err(Refused(code, text.into()))
}

/// The role an actor acts with: an operator counts as the owner.
fn acting_role(actor: Actor) -> Result<Role, Refused> {
    match actor {
        Actor::Operator => Ok(Role::Owner),
        Actor::User(_, Standing::Member { role, .. }) => Ok(role),
        Actor::User(_, Standing::NotMember) => {
            Err(Refused(403, "not a member of this group".into()))
        }
        Actor::User(_, Standing::NoGroup) => Err(Refused(404, "group not found".into())),
    }
}

fn target_role(target: Standing) -> Result<Role, Refused> {
    match target {
        Standing::Member { role, .. } => Ok(role),
        Standing::NotMember => Err(Refused(
            404,
            "the user is not a member of this group".into(),
        )),
        Standing::NoGroup => Err(Refused(404, "group not found".into())),
    }
}

/// Whether `actor` may take `action`; `target` is the standing of
/// `action.target()` (ignored for actions without one).
pub fn authorize(actor: Actor, action: Action, target: Standing) -> Result<(), Refused> {
    if matches!(target, Standing::NoGroup) && action.target().is_some() {
        return refuse(404, "group not found");
    }
    let role = acting_role(actor)?;
    let privileged = matches!(role, Role::Owner | Role::Admin);
    let is_owner = role == Role::Owner;
    match action {
        Action::AddMember(_) => {
            if !privileged {
                return refuse(403, "only the owner or an admin may add members");
            }
            if matches!(target, Standing::Member { .. }) {
                return refuse(409, "already a member");
            }
            Ok(())
        }
        Action::Leave => {
            if actor == Actor::Operator {
                return refuse(
                    400,
                    "an operator is not a member; remove the member instead",
                );
            }
            if is_owner {
                return refuse(
                    403,
                    "the owner cannot leave; transfer ownership or dissolve the group",
                );
            }
            Ok(())
        }
        Action::Kick(uid) => {
            let t = target_role(target)?;
            if matches!(actor, Actor::User(me, _) if me == uid) {
                return refuse(400, "use leave to leave a group");
            }
            match (role, t) {
                (_, Role::Owner) => refuse(403, "the owner cannot be removed"),
                (Role::Owner, _) => Ok(()),
                (Role::Admin, Role::Member) => Ok(()),
                (Role::Admin, Role::Admin) => refuse(403, "only the owner may remove an admin"),
                (Role::Member, _) => refuse(403, "only the owner or an admin may remove members"),
            }
        }
        Action::SetAdmin(_) | Action::RemoveAdmin(_) => {
            let t = target_role(target)?;
            if !is_owner {
                return refuse(403, "only the owner may change admins");
            }
            if t == Role::Owner {
                return refuse(
                    403,
                    "the owner's role cannot be changed; transfer ownership instead",
                );
            }
            let wanted = matches!(action, Action::SetAdmin(_));
            if (t == Role::Admin) == wanted {
                return refuse(
                    409,
                    if wanted {
                        "already an admin"
                    } else {
                        "not an admin"
                    },
                );
            }
            Ok(())
        }
        Action::TransferOwner(_) => {
            let t = target_role(target)?;
            if !is_owner {
                return refuse(403, "only the owner may transfer ownership");
            }
            if t == Role::Owner {
                return refuse(409, "already the owner");
            }
            Ok(())
        }
        Action::Mute(..) => {
            let t = target_role(target)?;
            if !privileged {
                return refuse(403, "only the owner or an admin may mute members");
            }
            if t != Role::Member {
                return refuse(403, "owners and admins cannot be muted");
            }
            Ok(())
        }
        Action::MuteAll(_) => {
            if !privileged {
                return refuse(403, "only the owner or an admin may mute the group");
            }
            Ok(())
        }
        Action::Dissolve => {
            if !is_owner {
                return refuse(403, "only the owner may dissolve the group");
            }
            Ok(())
        }
        Action::Moderate => {
            if !privileged {
                return refuse(
                    403,
                    "only the owner or an admin may delete others' messages",
                );
            }
            Ok(())
        }
        Action::EditProfile => {
            if !privileged {
                return refuse(
                    403,
                    "only the owner or an admin may change the group's profile",
                );
            }
            Ok(())
        }
    }
}

/// The events an authorized action becomes. `owner` is the current owner
/// (needed by a transfer); `actor_uid` 0 for an operator.
pub fn events(
    action: Action,
    actor_uid: i64,
    owner: Option<i64>,
    reason: &str,
) -> Vec<GroupEventBody> {
    match action {
        Action::AddMember(uid) => vec![GroupEventBody::MemberJoined(MemberJoined {
            uid,
            role: Role::Member.as_str().into(),
            invited_by: actor_uid,
        })],
        Action::Leave => vec![GroupEventBody::MemberLeft(MemberLeft {
            uid: actor_uid,
            kicked: false,
        })],
        Action::Kick(uid) => vec![GroupEventBody::MemberLeft(MemberLeft { uid, kicked: true })],
        Action::SetAdmin(uid) => vec![role_changed(uid, Role::Admin)],
        Action::RemoveAdmin(uid) => vec![role_changed(uid, Role::Member)],
        Action::TransferOwner(uid) => {
            let mut out = vec![role_changed(uid, Role::Owner)];
            if let Some(old) = owner.filter(|o| *o != uid) {
                out.push(role_changed(old, Role::Admin));
            }
            out
        }
        Action::Mute(uid, until) => vec![GroupEventBody::MemberMuted(MemberMuted {
            uid,
            muted_until: until,
        })],
        Action::MuteAll(on) => vec![GroupEventBody::GroupMuteChanged(GroupMuteChanged {
            mute_all: on,
        })],
        Action::Dissolve => vec![GroupEventBody::GroupDissolved(GroupDissolved {
            reason: reason.to_string(),
        })],
        // Moderation needs the ranges and a delete id: see `exec`.
        // Both carry more than the action (ranges, a profile): see
        // `Executor::moderate` and `Executor::set_profile`.
        Action::Moderate | Action::EditProfile => Vec::new(),
    }
}

fn role_changed(uid: i64, role: Role) -> GroupEventBody {
    GroupEventBody::MemberRoleChanged(MemberRoleChanged {
        uid,
        role: role.as_str().into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(role: Role) -> Standing {
        Standing::Member {
            role,
            muted_until: None,
        }
    }
    fn user(uid: i64, role: Role) -> Actor {
        Actor::User(uid, member(role))
    }

    #[test]
    fn members_cannot_govern() {
        let m = user(1, Role::Member);
        for action in [
            Action::AddMember(2),
            Action::Kick(2),
            Action::SetAdmin(2),
            Action::Mute(2, Some(1)),
            Action::MuteAll(true),
            Action::Dissolve,
            Action::Moderate,
            Action::TransferOwner(2),
        ] {
            let target = if matches!(action, Action::AddMember(_)) {
                Standing::NotMember
            } else {
                member(Role::Member)
            };
            let refused = authorize(m, action, target).unwrap_err();
            assert_eq!(refused.0, 403, "{action:?}");
        }
        assert!(authorize(m, Action::Leave, Standing::NotMember).is_ok());
    }

    #[test]
    fn admins_govern_members_but_not_admins_or_the_owner() {
        let a = user(1, Role::Admin);
        assert!(authorize(a, Action::Kick(2), member(Role::Member)).is_ok());
        assert!(authorize(a, Action::Mute(2, Some(5)), member(Role::Member)).is_ok());
        assert!(authorize(a, Action::Moderate, Standing::NotMember).is_ok());
        assert!(authorize(a, Action::MuteAll(true), Standing::NotMember).is_ok());
        assert_eq!(
            authorize(a, Action::Kick(3), member(Role::Admin))
                .unwrap_err()
                .0,
            403
        );
        assert_eq!(
            authorize(a, Action::Kick(3), member(Role::Owner))
                .unwrap_err()
                .0,
            403
        );
        assert_eq!(
            authorize(a, Action::Mute(3, None), member(Role::Admin))
                .unwrap_err()
                .0,
            403
        );
        assert_eq!(
            authorize(a, Action::SetAdmin(2), member(Role::Member))
                .unwrap_err()
                .0,
            403
        );
        assert_eq!(
            authorize(a, Action::Dissolve, Standing::NotMember)
                .unwrap_err()
                .0,
            403
        );
    }

    #[test]
    fn the_owner_governs_everyone_but_cannot_leave() {
        let o = user(1, Role::Owner);
        assert!(authorize(o, Action::Kick(2), member(Role::Admin)).is_ok());
        assert!(authorize(o, Action::SetAdmin(2), member(Role::Member)).is_ok());
        assert!(authorize(o, Action::RemoveAdmin(2), member(Role::Admin)).is_ok());
        assert!(authorize(o, Action::TransferOwner(2), member(Role::Member)).is_ok());
        assert!(authorize(o, Action::Dissolve, Standing::NotMember).is_ok());
        assert_eq!(
            authorize(o, Action::Leave, Standing::NotMember)
                .unwrap_err()
                .0,
            403
        );
        assert_eq!(
            authorize(o, Action::Kick(1), member(Role::Owner))
                .unwrap_err()
                .0,
            400
        );
    }

    #[test]
    fn targets_must_be_members_and_changes_must_change_something() {
        let o = user(1, Role::Owner);
        assert_eq!(
            authorize(o, Action::Kick(9), Standing::NotMember)
                .unwrap_err()
                .0,
            404
        );
        assert_eq!(
            authorize(o, Action::AddMember(2), member(Role::Member))
                .unwrap_err()
                .0,
            409
        );
        assert_eq!(
            authorize(o, Action::SetAdmin(2), member(Role::Admin))
                .unwrap_err()
                .0,
            409
        );
        assert_eq!(
            authorize(o, Action::RemoveAdmin(2), member(Role::Member))
                .unwrap_err()
                .0,
            409
        );
        assert_eq!(
            authorize(o, Action::Kick(2), Standing::NoGroup)
                .unwrap_err()
                .0,
            404
        );
        assert_eq!(
            authorize(
                Actor::User(5, Standing::NotMember),
                Action::Leave,
                Standing::NotMember
            )
            .unwrap_err()
            .0,
            403
        );
    }

    #[test]
    fn operators_act_as_owners() {
        let op = Actor::Operator;
        assert!(authorize(op, Action::Kick(2), member(Role::Admin)).is_ok());
        assert!(authorize(op, Action::SetAdmin(2), member(Role::Member)).is_ok());
        assert!(authorize(op, Action::Dissolve, Standing::NotMember).is_ok());
        assert_eq!(
            authorize(op, Action::Kick(1), member(Role::Owner))
                .unwrap_err()
                .0,
            403
        );
        assert_eq!(
            authorize(op, Action::Leave, Standing::NotMember)
                .unwrap_err()
                .0,
            400
        );
    }

    #[test]
    fn a_transfer_demotes_the_old_owner_to_admin() {
        let out = events(Action::TransferOwner(2), 1, Some(1), "");
        assert_eq!(
            out,
            vec![role_changed(2, Role::Owner), role_changed(1, Role::Admin)]
        );
        let kicked = events(Action::Kick(3), 1, None, "");
        assert_eq!(
            kicked,
            vec![GroupEventBody::MemberLeft(MemberLeft {
                uid: 3,
                kicked: true
            })]
        );
    }
}
