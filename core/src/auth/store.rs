//! The replicated auth store, as etcd 3.4 keeps it (etcd/auth/store.go): users with bcrypt
//! password hashes and granted roles, roles with key permissions, the enabled flag and the auth
//! revision. It changes only by applying auth entries from the raft log (so every member holds
//! the same store at the same index), is written into every checkpoint, and is published to the
//! shards as an immutable snapshot (`Arc<AuthState>`) that permission checks read without locks.
//!
//! Every operation answers etcd's errors, in etcd's order of checks. The auth revision goes up
//! by one with each change that etcd commits a revision for (not on enable, nor on a grant that
//! changes nothing), so a token resolved before a change is refused at apply as "old".

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use keel_grpc::EtcdError;
use keel_proto::authpb;
use serde::{Deserialize, Serialize};

use super::perms::{PermType, RangePerms};
use super::{AuthInfo, ROOT_ROLE, ROOT_USER};

/// One user as stored (etcd's `authpb.User`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub name: String,
    /// The bcrypt hash of the password; empty for a user added with `no_password`.
    pub password_hash: String,
    /// Granted roles, sorted (etcd keeps them sorted for its binary search).
    pub roles: Vec<String>,
    pub no_password: bool,
}

/// One key permission as stored (etcd's `authpb.Permission`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermRecord {
    pub perm_type: i32,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

impl PermRecord {
    pub fn to_pb(&self) -> authpb::Permission {
        authpb::Permission {
            perm_type: self.perm_type,
            key: Bytes::copy_from_slice(&self.key),
            range_end: Bytes::copy_from_slice(&self.range_end),
        }
    }
}

/// The store's durable form: what a checkpoint carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthImage {
    pub enabled: bool,
    pub revision: u64,
    pub users: Vec<UserRecord>,
    /// Roles by name, each with its permissions sorted by key (etcd's order).
    pub roles: Vec<(String, Vec<PermRecord>)>,
}

impl Default for AuthImage {
    /// A new store: etcd commits revision 1 when it creates its auth buckets, so a resolved
    /// token's revision is never 0 (0 means "no user").
    fn default() -> AuthImage {
        AuthImage {
            enabled: false,
            revision: 1,
            users: Vec::new(),
            roles: Vec::new(),
        }
    }
}

/// What a successfully applied auth request answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthReply {
    /// Enable, disable, adds, deletes, grants, revokes, password changes.
    Done,
    /// Authenticate: the simple token assigned.
    Token(String),
    /// Authenticate without a simple-token prefix (JWT or no-op provider): the user may log in
    /// at this auth revision, and the proposing shard makes the token (nothing is kept here).
    Authenticated { user: String, revision: u64 },
    /// UserGet: the user's roles.
    UserRoles(Vec<String>),
    /// RoleGet: the role's permissions.
    RolePerms(Vec<authpb::Permission>),
    /// UserList or RoleList: names, ascending.
    Names(Vec<String>),
}

/// The auth store and its derived permission cache.
#[derive(Debug, Clone, Default)]
pub struct AuthState {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, UserRecord>,
    roles: BTreeMap<String, Vec<PermRecord>>,
    /// Each user's merged permissions, rebuilt after every change (etcd's rangePermCache).
    perms: BTreeMap<String, Arc<RangePerms>>,
}

type R<T> = Result<T, EtcdError>;

impl AuthState {
    pub fn from_image(image: &AuthImage) -> AuthState {
        let mut state = AuthState {
            enabled: image.enabled,
            revision: image.revision.max(1),
            users: image
                .users
                .iter()
                .map(|u| (u.name.clone(), u.clone()))
                .collect(),
            roles: image.roles.iter().cloned().collect(),
            perms: BTreeMap::new(),
        };
        state.refresh_perms();
        state
    }

    pub fn image(&self) -> AuthImage {
        AuthImage {
            enabled: self.enabled,
            revision: self.revision,
            users: self.users.values().cloned().collect(),
            roles: self
                .roles
                .iter()
                .map(|(n, p)| (n.clone(), p.clone()))
                .collect(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn user(&self, name: &str) -> Option<&UserRecord> {
        self.users.get(name)
    }

    fn commit_revision(&mut self) {
        self.revision += 1;
    }

    fn refresh_perms(&mut self) {
        let mut perms = BTreeMap::new();
        for user in self.users.values() {
            let granted = user
                .roles
                .iter()
                .filter_map(|r| self.roles.get(r))
                .flatten()
                .map(PermRecord::to_pb)
                .collect::<Vec<_>>();
            perms.insert(
                user.name.clone(),
                Arc::new(RangePerms::from_perms(&granted)),
            );
        }
        self.perms = perms;
    }

    /// The user exists and holds the root role.
    pub fn is_root(&self, name: &str) -> bool {
        self.users.get(name).is_some_and(|u| {
            u.roles
                .binary_search_by(|r| r.as_str().cmp(ROOT_ROLE))
                .is_ok()
        })
    }

    // ---- Checks (etcd's isOpPermitted / IsAdminPermitted) ----

    /// Whether `who` may touch `[key, range_end)` for `perm`: always when auth is disabled;
    /// otherwise "user name is empty" without credentials, "revision of auth store is old" for
    /// credentials resolved before the last change, and root may do everything.
    pub fn check_op(&self, who: &AuthInfo, key: &[u8], range_end: &[u8], perm: PermType) -> R<()> {
        if !self.enabled {
            return Ok(());
        }
        if who.revision == 0 {
            return Err(EtcdError::UserEmpty);
        }
        if who.revision < self.revision {
            return Err(EtcdError::AuthOldRevision);
        }
        if !self.users.contains_key(&who.user) {
            return Err(EtcdError::PermissionDenied);
        }
        if self.is_root(&who.user) {
            return Ok(());
        }
        match self.perms.get(&who.user) {
            Some(p) if p.permits(key, range_end, perm) => Ok(()),
            _ => Err(EtcdError::PermissionDenied),
        }
    }

    /// Whether `who` may administer (root role), as etcd's IsAdminPermitted.
    pub fn check_admin(&self, who: &AuthInfo) -> R<()> {
        if !self.enabled {
            return Ok(());
        }
        if who.user.is_empty() {
            return Err(EtcdError::UserEmpty);
        }
        if !self.users.contains_key(&who.user) {
            return Err(EtcdError::UserNotFound);
        }
        if !self.is_root(&who.user) {
            return Err(EtcdError::PermissionDenied);
        }
        Ok(())
    }

    /// The password check before an Authenticate is proposed: the hash to verify against and
    /// the revision it was read at, or etcd's refusal.
    pub fn password_hash(&self, name: &str) -> R<(String, u64)> {
        if !self.enabled {
            return Err(EtcdError::AuthNotEnabled);
        }
        let user = self.users.get(name).ok_or(EtcdError::AuthFailed)?;
        if user.no_password {
            // etcd's CheckPassword: its own error, which reaches the client unmapped.
            return Err(EtcdError::AuthRawNoPasswordUser);
        }
        Ok((user.password_hash.clone(), self.revision))
    }

    // ---- Changes, applied from the log ----

    pub fn enable(&mut self) -> R<AuthReply> {
        if self.enabled {
            return Ok(AuthReply::Done);
        }
        if !self.users.contains_key(ROOT_USER) {
            return Err(EtcdError::RootUserNotExist);
        }
        if !self.is_root(ROOT_USER) {
            return Err(EtcdError::RootRoleNotExist);
        }
        self.enabled = true;
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn disable(&mut self) -> R<AuthReply> {
        if self.enabled {
            self.enabled = false;
            self.commit_revision();
        }
        Ok(AuthReply::Done)
    }

    /// The checks of etcd's Authenticate at apply (the password was checked before proposing).
    pub fn check_authenticate(&self, name: &str) -> R<()> {
        if !self.enabled {
            return Err(EtcdError::AuthNotEnabled);
        }
        match self.users.get(name) {
            Some(u) if !u.no_password => Ok(()),
            _ => Err(EtcdError::AuthFailed),
        }
    }

    pub fn user_add(&mut self, name: &str, password_hash: &str, no_password: bool) -> R<AuthReply> {
        if name.is_empty() {
            return Err(EtcdError::UserEmpty);
        }
        if self.users.contains_key(name) {
            return Err(EtcdError::UserAlreadyExist);
        }
        self.users.insert(
            name.to_string(),
            UserRecord {
                name: name.to_string(),
                password_hash: if no_password {
                    String::new()
                } else {
                    password_hash.to_string()
                },
                roles: Vec::new(),
                no_password,
            },
        );
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn user_delete(&mut self, name: &str) -> R<AuthReply> {
        if self.enabled && name == ROOT_USER {
            return Err(EtcdError::InvalidAuthMgmt);
        }
        if self.users.remove(name).is_none() {
            return Err(EtcdError::UserNotFound);
        }
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn user_change_password(&mut self, name: &str, password_hash: &str) -> R<AuthReply> {
        let user = self.users.get_mut(name).ok_or(EtcdError::UserNotFound)?;
        user.password_hash = password_hash.to_string();
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn user_grant_role(&mut self, name: &str, role: &str) -> R<AuthReply> {
        if !self.users.contains_key(name) {
            return Err(EtcdError::UserNotFound);
        }
        // The root role need not exist as a role to be granted (etcd's special case).
        if role != ROOT_ROLE && !self.roles.contains_key(role) {
            return Err(EtcdError::RoleNotFound);
        }
        let user = self.users.get_mut(name).expect("checked above");
        match user.roles.binary_search_by(|r| r.as_str().cmp(role)) {
            // Already granted: etcd answers success and commits nothing.
            Ok(_) => return Ok(AuthReply::Done),
            Err(at) => user.roles.insert(at, role.to_string()),
        }
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn user_get(&self, name: &str) -> R<AuthReply> {
        let user = self.users.get(name).ok_or(EtcdError::UserNotFound)?;
        Ok(AuthReply::UserRoles(user.roles.clone()))
    }

    pub fn user_list(&self) -> R<AuthReply> {
        Ok(AuthReply::Names(self.users.keys().cloned().collect()))
    }

    pub fn user_revoke_role(&mut self, name: &str, role: &str) -> R<AuthReply> {
        if self.enabled && name == ROOT_USER && role == ROOT_ROLE {
            return Err(EtcdError::InvalidAuthMgmt);
        }
        let user = self.users.get_mut(name).ok_or(EtcdError::UserNotFound)?;
        let before = user.roles.len();
        user.roles.retain(|r| r != role);
        if user.roles.len() == before {
            return Err(EtcdError::RoleNotGranted);
        }
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn role_add(&mut self, name: &str) -> R<AuthReply> {
        if name.is_empty() {
            return Err(EtcdError::RoleEmpty);
        }
        if self.roles.contains_key(name) {
            return Err(EtcdError::RoleAlreadyExist);
        }
        self.roles.insert(name.to_string(), Vec::new());
        self.commit_revision();
        Ok(AuthReply::Done)
    }

    pub fn role_get(&self, name: &str) -> R<AuthReply> {
        let perms = self.roles.get(name).ok_or(EtcdError::RoleNotFound)?;
        Ok(AuthReply::RolePerms(
            perms.iter().map(PermRecord::to_pb).collect(),
        ))
    }

    pub fn role_list(&self) -> R<AuthReply> {
        Ok(AuthReply::Names(self.roles.keys().cloned().collect()))
    }

    pub fn role_delete(&mut self, name: &str) -> R<AuthReply> {
        if self.enabled && name == ROOT_ROLE {
            return Err(EtcdError::InvalidAuthMgmt);
        }
        if self.roles.remove(name).is_none() {
            return Err(EtcdError::RoleNotFound);
        }
        for user in self.users.values_mut() {
            user.roles.retain(|r| r != name);
        }
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn role_grant_permission(&mut self, name: &str, perm: &authpb::Permission) -> R<AuthReply> {
        let perms = self.roles.get_mut(name).ok_or(EtcdError::RoleNotFound)?;
        // etcd looks at the first permission whose key is not below the new one: the same key
        // and range end update its type, anything else adds a permission (sorted by key).
        let at = perms.partition_point(|p| p.key.as_slice() < perm.key.as_ref());
        match perms.get_mut(at) {
            Some(p) if p.key == perm.key.as_ref() && p.range_end == perm.range_end.as_ref() => {
                p.perm_type = perm.perm_type;
            }
            _ => {
                perms.push(PermRecord {
                    perm_type: perm.perm_type,
                    key: perm.key.to_vec(),
                    range_end: perm.range_end.to_vec(),
                });
                // A stable sort, as Go's sort.Sort on a nearly sorted slice keeps equal keys
                // in insertion order for the sizes roles have.
                perms.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }

    pub fn role_revoke_permission(
        &mut self,
        name: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> R<AuthReply> {
        let perms = self.roles.get_mut(name).ok_or(EtcdError::RoleNotFound)?;
        let before = perms.len();
        perms.retain(|p| p.key != key || p.range_end != range_end);
        if perms.len() == before {
            return Err(EtcdError::PermissionNotGranted);
        }
        self.commit_revision();
        self.refresh_perms();
        Ok(AuthReply::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use authpb::permission::Type;

    fn who(user: &str, revision: u64) -> AuthInfo {
        AuthInfo {
            user: user.into(),
            revision,
        }
    }

    fn perm(t: Type, key: &str, end: &str) -> authpb::Permission {
        authpb::Permission {
            perm_type: t as i32,
            key: key.as_bytes().to_vec().into(),
            range_end: end.as_bytes().to_vec().into(),
        }
    }

    #[test]
    fn enable_needs_a_root_user_with_the_root_role() {
        let mut s = AuthState::from_image(&AuthImage::default());
        assert_eq!(s.enable(), Err(EtcdError::RootUserNotExist));
        s.user_add("root", "h", false).expect("new user");
        assert_eq!(s.enable(), Err(EtcdError::RootRoleNotExist));
        s.user_grant_role("root", "root")
            .expect("root may be granted without a root role");
        let rev = s.revision();
        assert_eq!(s.enable(), Ok(AuthReply::Done));
        assert_eq!(s.revision(), rev, "enable commits no revision");
        assert_eq!(s.user_delete("root"), Err(EtcdError::InvalidAuthMgmt));
        assert_eq!(
            s.user_revoke_role("root", "root"),
            Err(EtcdError::InvalidAuthMgmt)
        );
        s.disable().expect("disable");
        assert_eq!(s.revision(), rev + 1);
        assert!(!s.enabled());
    }

    #[test]
    fn permission_checks_follow_roles_and_the_revision() {
        let mut s = AuthState::from_image(&AuthImage::default());
        s.user_add("root", "h", false).expect("add");
        s.user_grant_role("root", "root").expect("grant");
        s.user_add("u", "h", false).expect("add");
        s.role_add("r").expect("role");
        s.role_grant_permission("r", &perm(Type::Readwrite, "foo", "fop"))
            .expect("grant perm");
        s.user_grant_role("u", "r").expect("grant");
        // Disabled: everything goes.
        assert_eq!(s.check_op(&who("", 0), b"x", b"", PermType::Write), Ok(()));
        s.enable().expect("enable");
        let rev = s.revision();
        assert_eq!(
            s.check_op(&who("", 0), b"foo", b"", PermType::Read),
            Err(EtcdError::UserEmpty)
        );
        assert_eq!(
            s.check_op(&who("u", rev), b"foo1", b"", PermType::Write),
            Ok(())
        );
        assert_eq!(
            s.check_op(&who("u", rev), b"bar", b"", PermType::Read),
            Err(EtcdError::PermissionDenied)
        );
        assert_eq!(
            s.check_op(&who("root", rev), b"bar", b"\0", PermType::Write),
            Ok(())
        );
        assert_eq!(
            s.check_admin(&who("u", rev)),
            Err(EtcdError::PermissionDenied)
        );
        assert_eq!(
            s.check_admin(&who("ghost", rev)),
            Err(EtcdError::UserNotFound)
        );
        assert_eq!(s.check_admin(&who("", 0)), Err(EtcdError::UserEmpty));
        // A change after the token was resolved makes it old.
        s.role_revoke_permission("r", b"foo", b"fop")
            .expect("revoke");
        assert_eq!(
            s.check_op(&who("u", rev), b"foo1", b"", PermType::Write),
            Err(EtcdError::AuthOldRevision)
        );
        assert_eq!(
            s.check_op(&who("u", s.revision()), b"foo1", b"", PermType::Write),
            Err(EtcdError::PermissionDenied)
        );
        assert_eq!(
            s.role_revoke_permission("r", b"foo", b"fop"),
            Err(EtcdError::PermissionNotGranted)
        );
    }

    #[test]
    fn errors_come_in_etcds_order() {
        let mut s = AuthState::from_image(&AuthImage::default());
        assert_eq!(s.user_add("", "h", false), Err(EtcdError::UserEmpty));
        assert_eq!(s.role_add(""), Err(EtcdError::RoleEmpty));
        s.user_add("a", "h", false).expect("add");
        assert_eq!(
            s.user_add("a", "h", false),
            Err(EtcdError::UserAlreadyExist)
        );
        assert_eq!(s.user_grant_role("b", "r"), Err(EtcdError::UserNotFound));
        assert_eq!(s.user_grant_role("a", "r"), Err(EtcdError::RoleNotFound));
        assert_eq!(s.user_revoke_role("a", "r"), Err(EtcdError::RoleNotGranted));
        s.role_add("r").expect("role");
        assert_eq!(s.role_add("r"), Err(EtcdError::RoleAlreadyExist));
        s.user_grant_role("a", "r").expect("grant");
        let rev = s.revision();
        s.user_grant_role("a", "r")
            .expect("granting again succeeds");
        assert_eq!(s.revision(), rev, "and commits nothing");
        s.role_delete("r").expect("delete");
        assert_eq!(s.user_get("a"), Ok(AuthReply::UserRoles(vec![])));
        assert_eq!(s.role_get("r"), Err(EtcdError::RoleNotFound));
        assert_eq!(s.password_hash("a"), Err(EtcdError::AuthNotEnabled));
    }

    #[test]
    fn the_image_round_trips() {
        let mut s = AuthState::from_image(&AuthImage::default());
        s.user_add("root", "hash", false).expect("add");
        s.user_add("np", "", true).expect("add");
        s.user_grant_role("root", "root").expect("grant");
        s.role_add("r").expect("role");
        s.role_grant_permission("r", &perm(Type::Read, "b", ""))
            .expect("perm");
        s.role_grant_permission("r", &perm(Type::Write, "a", "\0"))
            .expect("perm");
        s.role_grant_permission("r", &perm(Type::Readwrite, "b", ""))
            .expect("same key and end update the type");
        s.enable().expect("enable");
        let image = s.image();
        assert_eq!(image.roles[0].1.len(), 2);
        assert_eq!(image.roles[0].1[0].key, b"a");
        assert_eq!(image.roles[0].1[1].perm_type, Type::Readwrite as i32);
        let json = serde_json::to_vec(&image).expect("serializes");
        let back: AuthImage = serde_json::from_slice(&json).expect("deserializes");
        assert_eq!(back, image);
        assert_eq!(AuthState::from_image(&back).image(), image);
        assert_eq!(
            AuthState::from_image(&back).check_authenticate("np"),
            Err(EtcdError::AuthFailed)
        );
    }
}
