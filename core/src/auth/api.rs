//! The Auth service a shard serves (etcd's etcdserver/v3_server.go Authenticator), and the
//! credential checks the other services make before they read or propose.
//!
//! Every Auth call goes through raft, as in etcd (reads included, so an answer reflects every
//! change applied before it). UserAdd and UserChangePassword hash the password on this shard's
//! blocking thread (`rt::blocking`) first and propose only the hash (etcd 3.5's `hashedPassword`); Authenticate
//! checks the password here, then proposes the user name with a fresh token prefix, so the raft
//! core never runs bcrypt and the log never holds a password.

use std::rc::Rc;

use http::HeaderMap;
use keel_grpc::{unary, Call, EtcdError, ResponseSink, Status};
use keel_proto::etcdserverpb as pb;

use super::jwt::SignError;
use super::{tokens, AuthInfo, AuthReply, PermType, TokenProvider};
use crate::service::Api;
use crate::shared::{Answer, Shared};

type R<T> = Result<T, Status>;

fn etcd(e: EtcdError) -> Status {
    Status::from(e)
}

/// Authenticate retries when the auth store changed between the password check and the
/// token's apply (etcd retries without bound; a change per attempt this often is an attack).
const AUTHENTICATE_ATTEMPTS_MAX: usize = 8;

/// Resolves a call's credentials (see `auth::who`).
pub async fn who(shared: &Shared, headers: &HeaderMap) -> R<AuthInfo> {
    super::who(shared, headers).await.map_err(etcd)
}

/// etcd's IsAdminPermitted for calls checked on the shard (maintenance and membership).
pub async fn check_admin(shared: &Shared, headers: &HeaderMap) -> R<()> {
    let who = who(shared, headers).await?;
    shared.auth().state.check_admin(&who).map_err(etcd)
}

/// etcd's admin check in its maintenance server (Defragment, Snapshot, Hash, HashKV), which
/// passes the auth store's errors on unmapped (gRPC Unknown, "auth: ...").
pub async fn check_admin_maintenance(shared: &Shared, headers: &HeaderMap) -> R<()> {
    let raw = |e: EtcdError| match e {
        EtcdError::InvalidAuthToken => EtcdError::AuthRawInvalidToken,
        EtcdError::UserEmpty => EtcdError::AuthRawUserEmpty,
        EtcdError::UserNotFound => EtcdError::AuthRawUserNotFound,
        EtcdError::PermissionDenied => EtcdError::AuthRawPermissionDenied,
        other => other,
    };
    let who = super::who(shared, headers)
        .await
        .map_err(|e| etcd(raw(e)))?;
    shared
        .auth()
        .state
        .check_admin(&who)
        .map_err(|e| etcd(raw(e)))
}

/// etcd's read check for Range and Watch, against the published store.
pub fn check_read(shared: &Shared, who: &AuthInfo, key: &[u8], range_end: &[u8]) -> R<()> {
    shared
        .auth()
        .state
        .check_op(who, key, range_end, PermType::Read)
        .map_err(etcd)
}

/// etcd's checkTxnAuth for a read-only txn served on this member, against the published store.
pub fn check_txn_read(shared: &Shared, who: &AuthInfo, req: &keel_kv::TxnRequest) -> R<()> {
    let auth = &shared.auth().state;
    if !auth.enabled() {
        return Ok(());
    }
    super::apply::check_txn(auth, who, req).map_err(etcd)
}

/// etcd's doSerialize: a read served while the auth store changed answers "old revision".
pub fn check_still_current(shared: &Shared, who: &AuthInfo) -> R<()> {
    if who.revision != 0 && who.revision != shared.auth().state.revision() {
        return Err(etcd(EtcdError::AuthOldRevision));
    }
    Ok(())
}

/// Proposes an auth entry as `who` and waits for its answer and response header.
async fn propose(
    api: &Api,
    req: pb::InternalRaftRequest,
    who: &AuthInfo,
) -> R<(AuthReply, Option<pb::ResponseHeader>)> {
    let shared = api.shared();
    let out = shared.propose_as(req, who).await.map_err(etcd)?;
    match out.response {
        Answer::Auth { reply, revision } => Ok((
            reply,
            Some(pb::ResponseHeader {
                cluster_id: shared.cluster_id(),
                member_id: shared.member_id(),
                revision,
                raft_term: out.raft_term,
            }),
        )),
        other => {
            tracing::error!(?other, "mismatched apply response to an auth request");
            Err(Status::new(
                keel_grpc::Code::Internal,
                "keel: mismatched apply response",
            ))
        }
    }
}

macro_rules! simple_call {
    ($name:ident, $req:ty, $field:ident, $resp:ident) => {
        pub async fn $name(api: &Api, who: &AuthInfo, r: $req) -> R<pb::$resp> {
            let (_, header) = propose(
                api,
                pb::InternalRaftRequest {
                    $field: Some(r),
                    ..Default::default()
                },
                who,
            )
            .await?;
            Ok(pb::$resp { header })
        }
    };
}

simple_call!(
    auth_enable,
    pb::AuthEnableRequest,
    auth_enable,
    AuthEnableResponse
);
simple_call!(
    auth_disable,
    pb::AuthDisableRequest,
    auth_disable,
    AuthDisableResponse
);
simple_call!(
    user_delete,
    pb::AuthUserDeleteRequest,
    auth_user_delete,
    AuthUserDeleteResponse
);
simple_call!(
    user_grant_role,
    pb::AuthUserGrantRoleRequest,
    auth_user_grant_role,
    AuthUserGrantRoleResponse
);
simple_call!(
    user_revoke_role,
    pb::AuthUserRevokeRoleRequest,
    auth_user_revoke_role,
    AuthUserRevokeRoleResponse
);
simple_call!(
    role_add,
    pb::AuthRoleAddRequest,
    auth_role_add,
    AuthRoleAddResponse
);
simple_call!(
    role_delete,
    pb::AuthRoleDeleteRequest,
    auth_role_delete,
    AuthRoleDeleteResponse
);
simple_call!(
    role_grant_permission,
    pb::AuthRoleGrantPermissionRequest,
    auth_role_grant_permission,
    AuthRoleGrantPermissionResponse
);
simple_call!(
    role_revoke_permission,
    pb::AuthRoleRevokePermissionRequest,
    auth_role_revoke_permission,
    AuthRoleRevokePermissionResponse
);

pub async fn user_add(
    api: &Api,
    who: &AuthInfo,
    mut r: pb::AuthUserAddRequest,
) -> R<pb::AuthUserAddResponse> {
    let no_password = r.options.as_ref().is_some_and(|o| o.no_password);
    if !no_password && r.hashed_password.is_empty() {
        let cost = api.shared().config.bcrypt_cost;
        r.hashed_password = super::hash_password(std::mem::take(&mut r.password), cost)
            .await
            .map_err(etcd)?;
    }
    r.password.clear();
    let (_, header) = propose(
        api,
        pb::InternalRaftRequest {
            auth_user_add: Some(r),
            ..Default::default()
        },
        who,
    )
    .await?;
    Ok(pb::AuthUserAddResponse { header })
}

pub async fn user_change_password(
    api: &Api,
    who: &AuthInfo,
    mut r: pb::AuthUserChangePasswordRequest,
) -> R<pb::AuthUserChangePasswordResponse> {
    if r.hashed_password.is_empty() {
        let cost = api.shared().config.bcrypt_cost;
        r.hashed_password = super::hash_password(std::mem::take(&mut r.password), cost)
            .await
            .map_err(etcd)?;
    }
    r.password.clear();
    let (_, header) = propose(
        api,
        pb::InternalRaftRequest {
            auth_user_change_password: Some(r),
            ..Default::default()
        },
        who,
    )
    .await?;
    Ok(pb::AuthUserChangePasswordResponse { header })
}

pub async fn user_get(
    api: &Api,
    who: &AuthInfo,
    r: pb::AuthUserGetRequest,
) -> R<pb::AuthUserGetResponse> {
    let (reply, header) = propose(
        api,
        pb::InternalRaftRequest {
            auth_user_get: Some(r),
            ..Default::default()
        },
        who,
    )
    .await?;
    match reply {
        AuthReply::UserRoles(roles) => Ok(pb::AuthUserGetResponse { header, roles }),
        other => mismatched(&other),
    }
}

pub async fn user_list(
    api: &Api,
    who: &AuthInfo,
    r: pb::AuthUserListRequest,
) -> R<pb::AuthUserListResponse> {
    let (reply, header) = propose(
        api,
        pb::InternalRaftRequest {
            auth_user_list: Some(r),
            ..Default::default()
        },
        who,
    )
    .await?;
    match reply {
        AuthReply::Names(users) => Ok(pb::AuthUserListResponse { header, users }),
        other => mismatched(&other),
    }
}

pub async fn role_get(
    api: &Api,
    who: &AuthInfo,
    r: pb::AuthRoleGetRequest,
) -> R<pb::AuthRoleGetResponse> {
    let (reply, header) = propose(
        api,
        pb::InternalRaftRequest {
            auth_role_get: Some(r),
            ..Default::default()
        },
        who,
    )
    .await?;
    match reply {
        AuthReply::RolePerms(perm) => Ok(pb::AuthRoleGetResponse { header, perm }),
        other => mismatched(&other),
    }
}

pub async fn role_list(
    api: &Api,
    who: &AuthInfo,
    r: pb::AuthRoleListRequest,
) -> R<pb::AuthRoleListResponse> {
    let (reply, header) = propose(
        api,
        pb::InternalRaftRequest {
            auth_role_list: Some(r),
            ..Default::default()
        },
        who,
    )
    .await?;
    match reply {
        AuthReply::Names(roles) => Ok(pb::AuthRoleListResponse { header, roles }),
        other => mismatched(&other),
    }
}

/// etcd's Authenticate: a linearizable read, the password checked against the store as read,
/// then the token assigned through raft; again if the store changed in between.
pub async fn authenticate(
    api: &Api,
    who: &AuthInfo,
    r: pb::AuthenticateRequest,
) -> R<pb::AuthenticateResponse> {
    let shared = api.shared();
    let provider = &shared.config.auth_token;
    shared.read_barrier().await.map_err(etcd)?;
    let mut last = None;
    for _ in 0..AUTHENTICATE_ATTEMPTS_MAX {
        let (hash, checked_revision) = shared.auth().state.password_hash(&r.name).map_err(|e| {
            if e != EtcdError::AuthNotEnabled {
                tracing::warn!(user = r.name, error = %e, "invalid authentication was requested");
            }
            etcd(e)
        })?;
        if !super::password_matches(r.password.clone(), hash).await {
            tracing::info!(user = r.name, "invalid password");
            return Err(etcd(EtcdError::AuthFailed));
        }
        let req = pb::InternalRaftRequest {
            authenticate: Some(pb::InternalAuthenticateRequest {
                name: r.name.clone(),
                password: String::new(),
                // Only simple tokens are assigned at apply; without a prefix the apply answers
                // the user and auth revision, and this shard signs (etcd's genTokenPrefix is
                // empty for JWT too).
                simple_token: match provider {
                    TokenProvider::Simple => tokens::new_prefix(),
                    TokenProvider::Jwt(_) | TokenProvider::Nop => String::new(),
                },
            }),
            ..Default::default()
        };
        let (reply, header) = propose(api, req, who).await?;
        let token = match (provider, reply) {
            (TokenProvider::Simple, AuthReply::Token(token)) => token,
            (TokenProvider::Jwt(jwt), AuthReply::Authenticated { user, revision }) => {
                super::sign_jwt(jwt.clone(), user, revision)
                    .await
                    .map_err(|e| match e {
                        SignError::VerifyOnly => etcd(EtcdError::AuthRawVerifyOnly),
                        SignError::Crypto => Status::new(
                            keel_grpc::Code::Unknown,
                            "auth: failed to sign a JWT token",
                        ),
                    })?
            }
            // etcd's no-op provider refuses every login at assign.
            (TokenProvider::Nop, AuthReply::Authenticated { .. }) => {
                return Err(etcd(EtcdError::AuthFailed))
            }
            (_, reply) => return mismatched(&reply),
        };
        last = Some(pb::AuthenticateResponse { header, token });
        if checked_revision == shared.auth().state.revision() {
            break;
        }
        tracing::info!("revision when password checked became stale; retrying");
    }
    last.ok_or_else(|| etcd(EtcdError::AuthOldRevision))
}

fn mismatched<T>(reply: &AuthReply) -> R<T> {
    tracing::error!(?reply, "mismatched auth reply");
    Err(Status::new(
        keel_grpc::Code::Internal,
        "keel: mismatched apply response",
    ))
}

/// Serves `/etcdserverpb.Auth/*`.
pub async fn dispatch(api: &Rc<Api>, path: &str, call: Call, sink: &mut ResponseSink) -> Status {
    macro_rules! route {
        ($f:ident) => {{
            let api = api.clone();
            unary(call, sink, |r, head| async move {
                let who = who(api.shared(), &head.metadata).await?;
                $f(&api, &who, r).await
            })
            .await
        }};
    }
    match path {
        "/etcdserverpb.Auth/AuthEnable" => route!(auth_enable),
        "/etcdserverpb.Auth/AuthDisable" => route!(auth_disable),
        "/etcdserverpb.Auth/Authenticate" => route!(authenticate),
        "/etcdserverpb.Auth/UserAdd" => route!(user_add),
        "/etcdserverpb.Auth/UserGet" => route!(user_get),
        "/etcdserverpb.Auth/UserList" => route!(user_list),
        "/etcdserverpb.Auth/UserDelete" => route!(user_delete),
        "/etcdserverpb.Auth/UserChangePassword" => route!(user_change_password),
        "/etcdserverpb.Auth/UserGrantRole" => route!(user_grant_role),
        "/etcdserverpb.Auth/UserRevokeRole" => route!(user_revoke_role),
        "/etcdserverpb.Auth/RoleAdd" => route!(role_add),
        "/etcdserverpb.Auth/RoleGet" => route!(role_get),
        "/etcdserverpb.Auth/RoleList" => route!(role_list),
        "/etcdserverpb.Auth/RoleDelete" => route!(role_delete),
        "/etcdserverpb.Auth/RoleGrantPermission" => route!(role_grant_permission),
        "/etcdserverpb.Auth/RoleRevokePermission" => route!(role_revoke_permission),
        _ => Status::unknown_method(path, keel_grpc::ServiceKnown::Yes),
    }
}
