//! Applying auth entries and checking writes at apply, as etcd's `authApplierV3` does
//! (etcdserver/apply_auth.go): the entry's header names the user and the auth revision its
//! credentials were resolved at; auth management needs the root role; writes need write
//! permission on every key they touch, checked against the store as it is at this index.

use keel_grpc::EtcdError;
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;

use super::perms::PermType;
use super::store::{AuthReply, AuthState};
use super::tokens::TokenTable;
use super::AuthInfo;

/// What applying an auth entry changed, for publishing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Changed {
    pub state: bool,
    pub tokens: bool,
}

/// The credentials an entry carries.
pub fn header_info(req: &pb::InternalRaftRequest) -> AuthInfo {
    req.header
        .as_ref()
        .map(|h| AuthInfo {
            user: h.username.clone(),
            revision: h.auth_revision,
        })
        .unwrap_or_default()
}

/// Whether an entry is an auth request.
pub fn is_auth_request(req: &pb::InternalRaftRequest) -> bool {
    req.auth_enable.is_some()
        || req.auth_disable.is_some()
        || req.authenticate.is_some()
        || req.auth_user_add.is_some()
        || req.auth_user_delete.is_some()
        || req.auth_user_get.is_some()
        || req.auth_user_change_password.is_some()
        || req.auth_user_grant_role.is_some()
        || req.auth_user_revoke_role.is_some()
        || req.auth_user_list.is_some()
        || req.auth_role_list.is_some()
        || req.auth_role_add.is_some()
        || req.auth_role_delete.is_some()
        || req.auth_role_get.is_some()
        || req.auth_role_grant_permission.is_some()
        || req.auth_role_revoke_permission.is_some()
}

/// etcd's `needAdminPermission`: every auth request but Authenticate, UserGet and RoleGet.
fn needs_admin(req: &pb::InternalRaftRequest) -> bool {
    is_auth_request(req)
        && req.authenticate.is_none()
        && req.auth_user_get.is_none()
        && req.auth_role_get.is_none()
}

/// Applies one auth entry at raft `index`. `tokens_ttl_ms` is `--auth-token-ttl`.
pub fn apply(
    state: &mut AuthState,
    tokens: &mut TokenTable,
    req: &pb::InternalRaftRequest,
    index: u64,
    now_ms: u64,
    tokens_ttl_ms: u64,
) -> (Result<AuthReply, EtcdError>, Changed) {
    assert!(is_auth_request(req), "only auth entries come here");
    let who = header_info(req);
    let mut changed = Changed::default();
    if needs_admin(req) {
        if let Err(e) = state.check_admin(&who) {
            return (Err(e), changed);
        }
    }
    let revision_before = state.revision();
    let enabled_before = state.enabled();
    let result = if req.auth_enable.is_some() {
        state.enable()
    } else if req.auth_disable.is_some() {
        let r = state.disable();
        // Disabling invalidates every token (etcd's tokenProvider.disable).
        changed.tokens |= tokens.clear();
        r
    } else if let Some(a) = &req.authenticate {
        state.check_authenticate(&a.name).map(|()| {
            if a.simple_token.is_empty() {
                return AuthReply::Authenticated {
                    user: a.name.clone(),
                    revision: state.revision(),
                };
            }
            let token = format!("{}.{index}", a.simple_token);
            tokens.assign(token.clone(), &a.name, now_ms, tokens_ttl_ms);
            changed.tokens = true;
            AuthReply::Token(token)
        })
    } else if let Some(r) = &req.auth_user_add {
        let no_password = r.options.as_ref().is_some_and(|o| o.no_password);
        state.user_add(&r.name, &r.hashed_password, no_password)
    } else if let Some(r) = &req.auth_user_delete {
        let res = state.user_delete(&r.name);
        if res.is_ok() {
            changed.tokens |= tokens.invalidate_user(&r.name);
        }
        res
    } else if let Some(r) = &req.auth_user_change_password {
        let res = state.user_change_password(&r.name, &r.hashed_password);
        if res.is_ok() {
            changed.tokens |= tokens.invalidate_user(&r.name);
        }
        res
    } else if let Some(r) = &req.auth_user_grant_role {
        state.user_grant_role(&r.user, &r.role)
    } else if let Some(r) = &req.auth_user_revoke_role {
        state.user_revoke_role(&r.name, &r.role)
    } else if let Some(r) = &req.auth_user_get {
        // A user may read itself without the root role.
        match state.check_admin(&who) {
            Err(e) if r.name != who.user => Err(e),
            _ => state.user_get(&r.name),
        }
    } else if req.auth_user_list.is_some() {
        state.user_list()
    } else if req.auth_role_list.is_some() {
        state.role_list()
    } else if let Some(r) = &req.auth_role_add {
        state.role_add(&r.name)
    } else if let Some(r) = &req.auth_role_delete {
        state.role_delete(&r.role)
    } else if let Some(r) = &req.auth_role_get {
        // A user may read the roles it holds without the root role.
        let holds = state
            .user(&who.user)
            .is_some_and(|u| u.roles.contains(&r.role));
        match state.check_admin(&who) {
            Err(e) if !holds => Err(e),
            _ => state.role_get(&r.role),
        }
    } else if let Some(r) = &req.auth_role_grant_permission {
        match &r.perm {
            Some(perm) => state.role_grant_permission(&r.name, perm),
            // etcd would dereference a nil permission; refuse it instead.
            None => Err(EtcdError::PermissionNotGranted),
        }
    } else if let Some(r) = &req.auth_role_revoke_permission {
        state.role_revoke_permission(&r.role, &r.key, &r.range_end)
    } else {
        unreachable!("is_auth_request covers every auth field")
    };
    changed.state = state.revision() != revision_before || state.enabled() != enabled_before;
    (result, changed)
}

/// The write and read permissions a kv operation needs at apply, checked for `who`
/// (etcd's authApplierV3 Put, DeleteRange, Txn and LeaseRevoke). `lease_keys` answers the keys
/// attached to a lease: a put that attaches one, and a revoke, need write permission on them.
pub fn check_op(
    state: &AuthState,
    who: &AuthInfo,
    op: &kv::Op,
    lease_keys: &dyn Fn(i64) -> Vec<bytes::Bytes>,
) -> Result<(), EtcdError> {
    if !state.enabled() {
        return Ok(());
    }
    match op {
        kv::Op::Put(p) => check_put(state, who, p, lease_keys),
        kv::Op::DeleteRange(d) => check_delete(state, who, d),
        kv::Op::Txn(t) => check_txn(state, who, t),
        kv::Op::LeaseRevoke(r) => check_lease_keys(state, who, r.id, lease_keys),
        // etcd checks neither compaction nor lease grants.
        _ => Ok(()),
    }
}

fn check_lease_keys(
    state: &AuthState,
    who: &AuthInfo,
    lease: i64,
    lease_keys: &dyn Fn(i64) -> Vec<bytes::Bytes>,
) -> Result<(), EtcdError> {
    if lease == 0 {
        return Ok(());
    }
    for key in lease_keys(lease) {
        state.check_op(who, &key, b"", PermType::Write)?;
    }
    Ok(())
}

fn check_put(
    state: &AuthState,
    who: &AuthInfo,
    p: &kv::PutRequest,
    lease_keys: &dyn Fn(i64) -> Vec<bytes::Bytes>,
) -> Result<(), EtcdError> {
    state.check_op(who, &p.key, b"", PermType::Write)?;
    check_lease_keys(state, who, p.lease, lease_keys)?;
    if p.prev_kv {
        state.check_op(who, &p.key, b"", PermType::Read)?;
    }
    Ok(())
}

fn check_delete(
    state: &AuthState,
    who: &AuthInfo,
    d: &kv::DeleteRangeRequest,
) -> Result<(), EtcdError> {
    state.check_op(who, &d.key, &d.range_end, PermType::Write)?;
    if d.prev_kv {
        state.check_op(who, &d.key, &d.range_end, PermType::Read)?;
    }
    Ok(())
}

/// etcd's checkTxnAuth: every compare needs read; every op of both branches its own permission
/// (nested txns are not looked into, as in etcd 3.4).
pub fn check_txn(state: &AuthState, who: &AuthInfo, t: &kv::TxnRequest) -> Result<(), EtcdError> {
    for c in &t.compare {
        state.check_op(who, &c.key, &c.range_end, PermType::Read)?;
    }
    for op in t.success.iter().chain(t.failure.iter()) {
        match op {
            kv::RequestOp::Range(r) => state.check_op(who, &r.key, &r.range_end, PermType::Read)?,
            kv::RequestOp::Put(p) => state.check_op(who, &p.key, b"", PermType::Write)?,
            kv::RequestOp::DeleteRange(d) => {
                if d.prev_kv {
                    state.check_op(who, &d.key, &d.range_end, PermType::Read)?;
                }
                state.check_op(who, &d.key, &d.range_end, PermType::Write)?;
            }
            kv::RequestOp::Txn(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(name: &str, simple_token: &str) -> pb::InternalRaftRequest {
        pb::InternalRaftRequest {
            authenticate: Some(pb::InternalAuthenticateRequest {
                name: name.into(),
                password: String::new(),
                simple_token: simple_token.into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_login_without_a_prefix_keeps_nothing_and_names_the_revision() {
        let mut state = AuthState::from_image(&super::super::AuthImage::default());
        state.user_add("root", "h", false).expect("new user");
        state.user_grant_role("root", "root").expect("root role");
        state.enable().expect("enable");
        let mut tokens = TokenTable::default();
        // JWT (and the no-op provider): the proposer signs; the member keeps no token.
        let (reply, changed) = apply(&mut state, &mut tokens, &login("root", ""), 9, 0, 1_000);
        assert_eq!(
            reply,
            Ok(AuthReply::Authenticated {
                user: "root".into(),
                revision: state.revision()
            })
        );
        assert_eq!(changed, Changed::default());
        assert!(tokens.is_empty());
        // A simple token is assigned at apply, named by the entry's index.
        let prefix = "abcdefghijklmnop";
        let (reply, changed) = apply(
            &mut state,
            &mut tokens,
            &login("root", prefix),
            10,
            0,
            1_000,
        );
        assert_eq!(reply, Ok(AuthReply::Token(format!("{prefix}.10"))));
        assert!(changed.tokens);
        assert_eq!(tokens.touch("abcdefghijklmnop.10", 1), Some("root".into()));
        // Either way an unknown user fails alike.
        let (reply, _) = apply(&mut state, &mut tokens, &login("ghost", ""), 11, 0, 1_000);
        assert_eq!(reply, Err(EtcdError::AuthFailed));
    }
}
