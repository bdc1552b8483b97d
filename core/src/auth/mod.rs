//! Authentication and role-based access control, as etcd 3.4 does them.
//!
//! - `store.rs`: the replicated auth store (users, roles, permissions, enabled flag, auth
//!   revision), owned by the member, applied from the log and checkpointed; `apply.rs` applies
//!   one auth entry to it, with etcd's admin checks.
//! - `perms.rs`: a user's merged key permissions (etcd's range-permission cache).
//! - `jwt.rs`: the `--auth-token` providers, and JWT tokens signed and checked as etcd's
//!   golang-jwt does (stateless: the proposing shard signs after the login applies, any member
//!   verifies, restarts forget nothing).
//! - `tokens.rs`: simple tokens ("<16 random letters>.<raft index>"), assigned at apply on every
//!   member, forgotten after `--auth-token-ttl` seconds without use, and on restart.
//! - `api.rs`: the Auth service a shard serves, and the checks every other call makes.
//!
//! Shards read the member's published `AuthState` and `TokenTable` (lock-free `ArcSwap`s in
//! `Shared`). Passwords are hashed and checked on a shard's blocking thread (`rt::blocking`: a
//! helper beside the raft core's CPU for a shard hosted there) before anything is
//! proposed, so the raft core never runs bcrypt and the log never holds a plaintext password.

pub mod api;
pub mod apply;
pub mod jwt;
pub mod perms;
pub mod store;
pub mod tokens;

use std::sync::atomic::Ordering;

use http::HeaderMap;
use keel_grpc::EtcdError;

use crate::shared::Shared;

pub use jwt::TokenProvider;
pub use perms::PermType;
pub use store::{AuthImage, AuthReply, AuthState};
pub use tokens::TokenTable;

/// The user etcd requires before auth can be enabled, and the role that may do everything.
pub const ROOT_USER: &str = "root";
pub const ROOT_ROLE: &str = "root";

/// etcd's default bcrypt cost (`bcrypt.DefaultCost`).
pub const BCRYPT_COST_DEFAULT: u32 = 10;

/// How long a shard waits for the raft index a simple token names to be applied here (a token
/// made on another member, or whose Authenticate reply outran this member's publish).
const TOKEN_INDEX_WAIT_MS_MAX: u64 = 5_000;

/// The metadata key a TLS connection's verified client-certificate common name travels under,
/// from the connection to `who`. Keel sets it; whatever a client sends under it is removed
/// first (`Api::grpc_from`, `Api::http`). A `HeaderName`, not a `&str`: every call removes it,
/// and a name given as `&str` is parsed again at every lookup.
pub const CERT_USER_HEADER: http::HeaderName =
    http::HeaderName::from_static("keel-internal-client-cert-cn");

/// Who a call comes from (etcd's `AuthInfo`): the user and the auth revision its credentials
/// were resolved at. The default (no user, revision 0) is a call without credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthInfo {
    pub user: String,
    pub revision: u64,
}

/// The token a call carries: gRPC metadata `token`, or `authorization` as etcd's JSON gateway
/// passes it on (etcd's TokenFieldNameGRPC and TokenFieldNameSwagger).
fn token_of(headers: &HeaderMap) -> Option<&str> {
    // A static name: one given as `&str` is parsed again at every lookup.
    const TOKEN: http::HeaderName = http::HeaderName::from_static("token");
    headers
        .get(TOKEN)
        .or_else(|| headers.get(http::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
}

/// Resolves a call's credentials (etcd's `AuthInfoFromCtx`): no token is no user; a simple token
/// this member knows is its user at the current auth revision (and restarts its TTL); a JWT
/// token that verifies is the user and auth revision it was signed with; any other token is
/// "invalid auth token", auth enabled or not, as in etcd.
pub async fn who(shared: &Shared, headers: &HeaderMap) -> Result<AuthInfo, EtcdError> {
    let Some(token) = token_of(headers) else {
        // No token: a verified client certificate's common name is the user.
        return Ok(headers
            .get(CERT_USER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(|user| AuthInfo {
                user: user.to_string(),
                revision: shared.auth().state.revision(),
            })
            .unwrap_or_default());
    };
    match &shared.config.auth_token {
        TokenProvider::Simple => {}
        TokenProvider::Jwt(jwt) => {
            let now_s = jwt::unix_seconds(std::time::SystemTime::now());
            return jwt.verify(token, now_s).ok_or(EtcdError::InvalidAuthToken);
        }
        TokenProvider::Nop => return Err(EtcdError::InvalidAuthToken),
    }
    if let Some(info) = lookup(shared, token) {
        return Ok(info);
    }
    // A simple token names the raft index its Authenticate was applied at; until this member
    // has applied that far it cannot know the token yet (etcd's indexWaiter).
    let index = tokens::token_index(token).ok_or(EtcdError::InvalidAuthToken)?;
    let deadline_ms = shared.uptime_ms() + TOKEN_INDEX_WAIT_MS_MAX;
    while shared.applied_index.load(Ordering::Acquire) < index {
        if shared.uptime_ms() >= deadline_ms || shared.stopping.load(Ordering::Acquire) {
            return Err(EtcdError::InvalidAuthToken);
        }
        crate::rt::sleep(std::time::Duration::from_millis(1)).await;
    }
    lookup(shared, token).ok_or(EtcdError::InvalidAuthToken)
}

fn lookup(shared: &Shared, token: &str) -> Option<AuthInfo> {
    // One version of both: the token's user and the store's revision from the same apply.
    let auth = shared.auth();
    let user = auth.tokens.touch(token, shared.uptime_ms())?;
    Some(AuthInfo {
        user,
        revision: auth.state.revision(),
    })
}

/// The subject common name of a DER certificate (the first, as Go's `Subject.CommonName`).
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// A connection whose client presented a verified certificate: its calls carry the
/// certificate's common name as their user when they carry no token.
pub struct CertUserConnection {
    pub api: std::rc::Rc<crate::service::Api>,
    pub user: String,
}

/// A listener's handler that can serve a connection as a certificate's user: the etcd API can;
/// the metrics-only listener has no calls to authorize, so it serves the connection as it is.
pub trait ServesCertUser: keel_grpc::Handler + Sized {
    fn for_cert_user(self: &std::rc::Rc<Self>, user: String) -> Option<CertUserConnection>;
}

impl ServesCertUser for crate::service::Api {
    fn for_cert_user(self: &std::rc::Rc<Self>, user: String) -> Option<CertUserConnection> {
        Some(CertUserConnection {
            api: self.clone(),
            user,
        })
    }
}

impl ServesCertUser for crate::extra_listeners::MetricsOnly {
    fn for_cert_user(self: &std::rc::Rc<Self>, _user: String) -> Option<CertUserConnection> {
        None
    }
}

impl keel_grpc::Handler for CertUserConnection {
    // Not an `async fn`, which would keep the 248-byte `call` twice in every call's task.
    fn grpc<'a>(
        self: std::rc::Rc<Self>,
        call: keel_grpc::Call,
        sink: &'a mut keel_grpc::ResponseSink,
    ) -> impl std::future::Future<Output = keel_grpc::Status> + 'a {
        self.api.clone().grpc_from(call, sink, Some(&self.user))
    }

    async fn http(
        self: std::rc::Rc<Self>,
        request: keel_grpc::HttpRequest,
    ) -> keel_grpc::HttpResponse {
        keel_grpc::Handler::http(self.api.clone(), request).await
    }
}

/// Hashes a password with bcrypt off the calling shard's executor (`rt::blocking`), in etcd's
/// "$2a$" form.
pub async fn hash_password(password: String, cost: u32) -> Result<String, EtcdError> {
    crate::rt::blocking(move || {
        bcrypt::hash_with_result(password, cost)
            .map(|h| h.format_for_version(bcrypt::Version::TwoA))
    })
    .await
    .map_err(|e| {
        tracing::warn!(error = %e, "failed to bcrypt hash a password");
        EtcdError::AuthFailed
    })
}

/// Signs a JWT token off the calling shard's executor (`rt::blocking`: an RSA signature costs
/// about a millisecond, more for large keys, not for the shard's request loop).
pub async fn sign_jwt(
    jwt: std::sync::Arc<jwt::Jwt>,
    user: String,
    revision: u64,
) -> Result<String, jwt::SignError> {
    crate::rt::blocking(move || jwt.sign(&user, revision, std::time::SystemTime::now())).await
}

/// Checks a password against its bcrypt hash off the calling shard's executor (`rt::blocking`).
pub async fn password_matches(password: String, hash: String) -> bool {
    crate::rt::blocking(move || bcrypt::verify(password, &hash).unwrap_or(false)).await
}
