//! gRPC status codes, `Status`, the `grpc-message` percent-encoding, and THE one mapping from
//! etcd's errors to gRPC statuses.
//!
//! Clients match on the exact message text (clientv3 turns a known string back into a typed
//! error), so every string here is copied byte for byte from etcd 3.4's
//! `etcdserver/api/v3rpc/rpctypes/error.go`.

use std::fmt;

/// The 17 gRPC status codes, with their wire values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    Canceled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    /// Every code, in wire order (the index is the wire value).
    pub const ALL: [Code; 17] = [
        Code::Ok,
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The wire value sent in `grpc-status`.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Parses a wire value; values outside 0..=16 are `Unknown`, as gRPC specifies.
    pub fn from_u8(value: u8) -> Code {
        Code::ALL
            .get(usize::from(value))
            .copied()
            .unwrap_or(Code::Unknown)
    }

    /// The decimal form used in the `grpc-status` header.
    pub fn as_header_value(self) -> &'static str {
        const VALUES: [&str; 17] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
            "16",
        ];
        VALUES[usize::from(self.as_u8())]
    }
}

const _: () = assert!(Code::ALL.len() == 17);
const _: () = assert!(Code::Unauthenticated as usize == Code::ALL.len() - 1);

/// A gRPC status: what the trailers `grpc-status` and `grpc-message` carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }

    /// The success status (empty message).
    pub fn ok() -> Status {
        Status::new(Code::Ok, "")
    }

    pub fn is_ok(&self) -> bool {
        self.code == Code::Ok
    }

    /// grpc-go's answer for a path that names no registered method. `service_known` says
    /// whether the service part of the path is served (the text differs).
    pub fn unknown_method(path: &str, service_known: ServiceKnown) -> Status {
        match split_method_path(path) {
            None => Status::new(
                Code::Unimplemented,
                format!("malformed method name: {path:?}"),
            ),
            Some((service, method)) => match service_known {
                ServiceKnown::No => {
                    Status::new(Code::Unimplemented, format!("unknown service {service}"))
                }
                ServiceKnown::Yes => Status::new(
                    Code::Unimplemented,
                    format!("unknown method {method} for service {service}"),
                ),
            },
        }
    }

    /// grpc-go's text when a call's deadline passes.
    pub fn deadline_exceeded() -> Status {
        Status::new(Code::DeadlineExceeded, "context deadline exceeded")
    }

    /// grpc-go's text when a received message is over the receive limit.
    pub fn message_too_large(length_bytes: u64, max_bytes: usize) -> Status {
        Status::new(
            Code::ResourceExhausted,
            format!("grpc: received message larger than max ({length_bytes} vs. {max_bytes})"),
        )
    }

    /// The `grpc-message` header value: percent-encoded as the gRPC HTTP/2 spec requires.
    pub fn encoded_message(&self) -> String {
        percent_encode(&self.message)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl From<EtcdError> for Status {
    fn from(error: EtcdError) -> Status {
        error.to_status()
    }
}

/// Splits `/package.Service/Method` into `("package.Service", "Method")`, as grpc-go does
/// (the last '/' separates them). `None` when the path has no '/' after the leading one.
pub fn split_method_path(path: &str) -> Option<(&str, &str)> {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let slash = trimmed.rfind('/')?;
    Some((&trimmed[..slash], &trimmed[slash + 1..]))
}

/// Whether a service name in an unknown path is one the server serves (changes grpc-go's text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceKnown {
    Yes,
    No,
}

/// Percent-encodes a `grpc-message` value: bytes outside printable ASCII 0x20..=0x7E, and '%'
/// itself, become `%XX` (upper-case hex) over the UTF-8 bytes.
pub fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7E).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0F)]));
        }
    }
    assert!(out.len() >= message.len());
    out
}

/// Decodes a `grpc-message` value. Like grpc-go, a malformed escape is kept literally rather
/// than failing, and invalid UTF-8 is replaced.
pub fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte == b'%' && index + 2 < bytes.len() {
            let high = hex_value(bytes[index + 1]);
            let low = hex_value(bytes[index + 2]);
            if let (Some(high), Some(low)) = (high, low) {
                out.push(high << 4 | low);
                index += 3;
                continue;
            }
        }
        out.push(byte);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Every error etcd's gRPC API returns (etcd 3.4 `rpctypes`), the superset of COMPAT.md's list.
/// `to_status()` is THE mapping: no other place in Keel spells these strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EtcdError {
    EmptyKey,
    KeyNotFound,
    ValueProvided,
    LeaseProvided,
    TooManyOps,
    DuplicateKey,
    Compacted,
    FutureRev,
    NoSpace,
    LeaseNotFound,
    LeaseExist,
    LeaseTtlTooLarge,
    WatchCanceled,
    MemberExist,
    PeerUrlExist,
    MemberNotEnoughStarted,
    MemberBadUrls,
    MemberNotFound,
    MemberNotLearner,
    LearnerNotReady,
    TooManyLearners,
    RequestTooLarge,
    TooManyRequests,
    RootUserNotExist,
    RootRoleNotExist,
    UserAlreadyExist,
    UserEmpty,
    UserNotFound,
    RoleAlreadyExist,
    RoleNotFound,
    RoleEmpty,
    AuthFailed,
    PermissionDenied,
    RoleNotGranted,
    PermissionNotGranted,
    AuthNotEnabled,
    InvalidAuthToken,
    InvalidAuthMgmt,
    AuthOldRevision,
    /// etcd's maintenance server (Defragment, Snapshot, Hash, HashKV) returns the auth store's
    /// own errors without mapping them: gRPC Unknown with the auth package's text.
    AuthRawPermissionDenied,
    AuthRawUserEmpty,
    AuthRawUserNotFound,
    AuthRawInvalidToken,
    /// Authenticate on a member whose JWT key can only verify (etcd's ErrVerifyOnly, raised at
    /// apply and passed on unmapped).
    AuthRawVerifyOnly,
    /// Authenticate as a user added with no password: etcd's CheckPassword refuses it before
    /// proposing with an error its gRPC layer does not map.
    AuthRawNoPasswordUser,
    NoLeader,
    NotLeader,
    LeaderChanged,
    NotCapable,
    Stopped,
    Timeout,
    TimeoutDueToLeaderFail,
    TimeoutDueToConnectionLost,
    TimeoutWaitAppliedIndex,
    Unhealthy,
    Corrupt,
    NotSupportedForLearner,
    BadLeaderTransferee,
}

impl EtcdError {
    /// Every variant, for tests and for building reverse look-ups.
    pub const ALL: [EtcdError; 58] = [
        EtcdError::EmptyKey,
        EtcdError::KeyNotFound,
        EtcdError::ValueProvided,
        EtcdError::LeaseProvided,
        EtcdError::TooManyOps,
        EtcdError::DuplicateKey,
        EtcdError::Compacted,
        EtcdError::FutureRev,
        EtcdError::NoSpace,
        EtcdError::LeaseNotFound,
        EtcdError::LeaseExist,
        EtcdError::LeaseTtlTooLarge,
        EtcdError::WatchCanceled,
        EtcdError::MemberExist,
        EtcdError::PeerUrlExist,
        EtcdError::MemberNotEnoughStarted,
        EtcdError::MemberBadUrls,
        EtcdError::MemberNotFound,
        EtcdError::MemberNotLearner,
        EtcdError::LearnerNotReady,
        EtcdError::TooManyLearners,
        EtcdError::RequestTooLarge,
        EtcdError::TooManyRequests,
        EtcdError::RootUserNotExist,
        EtcdError::RootRoleNotExist,
        EtcdError::UserAlreadyExist,
        EtcdError::UserEmpty,
        EtcdError::UserNotFound,
        EtcdError::RoleAlreadyExist,
        EtcdError::RoleNotFound,
        EtcdError::RoleEmpty,
        EtcdError::AuthFailed,
        EtcdError::PermissionDenied,
        EtcdError::RoleNotGranted,
        EtcdError::PermissionNotGranted,
        EtcdError::AuthNotEnabled,
        EtcdError::InvalidAuthToken,
        EtcdError::InvalidAuthMgmt,
        EtcdError::AuthOldRevision,
        EtcdError::AuthRawPermissionDenied,
        EtcdError::AuthRawUserEmpty,
        EtcdError::AuthRawUserNotFound,
        EtcdError::AuthRawInvalidToken,
        EtcdError::AuthRawVerifyOnly,
        EtcdError::AuthRawNoPasswordUser,
        EtcdError::NoLeader,
        EtcdError::NotLeader,
        EtcdError::LeaderChanged,
        EtcdError::NotCapable,
        EtcdError::Stopped,
        EtcdError::Timeout,
        EtcdError::TimeoutDueToLeaderFail,
        EtcdError::TimeoutDueToConnectionLost,
        EtcdError::TimeoutWaitAppliedIndex,
        EtcdError::Unhealthy,
        EtcdError::Corrupt,
        EtcdError::NotSupportedForLearner,
        EtcdError::BadLeaderTransferee,
    ];

    /// The gRPC code and exact message etcd sends for this error.
    pub fn code_and_message(self) -> (Code, &'static str) {
        use Code::*;
        match self {
            EtcdError::EmptyKey => (InvalidArgument, "etcdserver: key is not provided"),
            EtcdError::KeyNotFound => (InvalidArgument, "etcdserver: key not found"),
            EtcdError::ValueProvided => (InvalidArgument, "etcdserver: value is provided"),
            EtcdError::LeaseProvided => (InvalidArgument, "etcdserver: lease is provided"),
            EtcdError::TooManyOps => (
                InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            EtcdError::DuplicateKey => (
                InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            EtcdError::Compacted => (
                OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            EtcdError::FutureRev => (
                OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            EtcdError::NoSpace => (
                ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            EtcdError::LeaseNotFound => (NotFound, "etcdserver: requested lease not found"),
            EtcdError::LeaseExist => (FailedPrecondition, "etcdserver: lease already exists"),
            EtcdError::LeaseTtlTooLarge => (OutOfRange, "etcdserver: too large lease TTL"),
            EtcdError::WatchCanceled => (Canceled, "etcdserver: watch canceled"),
            EtcdError::MemberExist => (FailedPrecondition, "etcdserver: member ID already exist"),
            EtcdError::PeerUrlExist => (FailedPrecondition, "etcdserver: Peer URLs already exists"),
            EtcdError::MemberNotEnoughStarted => (
                FailedPrecondition,
                "etcdserver: re-configuration failed due to not enough started members",
            ),
            EtcdError::MemberBadUrls => {
                (InvalidArgument, "etcdserver: given member URLs are invalid")
            }
            EtcdError::MemberNotFound => (NotFound, "etcdserver: member not found"),
            EtcdError::MemberNotLearner => (
                FailedPrecondition,
                "etcdserver: can only promote a learner member",
            ),
            EtcdError::LearnerNotReady => (
                FailedPrecondition,
                "etcdserver: can only promote a learner member which is in sync with leader",
            ),
            EtcdError::TooManyLearners => (
                FailedPrecondition,
                "etcdserver: too many learner members in cluster",
            ),
            EtcdError::RequestTooLarge => (InvalidArgument, "etcdserver: request is too large"),
            EtcdError::TooManyRequests => (ResourceExhausted, "etcdserver: too many requests"),
            EtcdError::RootUserNotExist => {
                (FailedPrecondition, "etcdserver: root user does not exist")
            }
            EtcdError::RootRoleNotExist => (
                FailedPrecondition,
                "etcdserver: root user does not have root role",
            ),
            EtcdError::UserAlreadyExist => {
                (FailedPrecondition, "etcdserver: user name already exists")
            }
            EtcdError::UserEmpty => (InvalidArgument, "etcdserver: user name is empty"),
            EtcdError::UserNotFound => (FailedPrecondition, "etcdserver: user name not found"),
            EtcdError::RoleAlreadyExist => {
                (FailedPrecondition, "etcdserver: role name already exists")
            }
            EtcdError::RoleNotFound => (FailedPrecondition, "etcdserver: role name not found"),
            EtcdError::RoleEmpty => (InvalidArgument, "etcdserver: role name is empty"),
            EtcdError::AuthFailed => (
                InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            EtcdError::PermissionDenied => (PermissionDenied, "etcdserver: permission denied"),
            EtcdError::RoleNotGranted => (
                FailedPrecondition,
                "etcdserver: role is not granted to the user",
            ),
            EtcdError::PermissionNotGranted => (
                FailedPrecondition,
                "etcdserver: permission is not granted to the role",
            ),
            EtcdError::AuthNotEnabled => (
                FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            EtcdError::InvalidAuthToken => (Unauthenticated, "etcdserver: invalid auth token"),
            EtcdError::InvalidAuthMgmt => (InvalidArgument, "etcdserver: invalid auth management"),
            EtcdError::AuthOldRevision => {
                (InvalidArgument, "etcdserver: revision of auth store is old")
            }
            EtcdError::AuthRawPermissionDenied => (Unknown, "auth: permission denied"),
            EtcdError::AuthRawUserEmpty => (Unknown, "auth: user name is empty"),
            EtcdError::AuthRawUserNotFound => (Unknown, "auth: user not found"),
            EtcdError::AuthRawInvalidToken => (Unknown, "auth: invalid auth token"),
            EtcdError::AuthRawVerifyOnly => (
                Unknown,
                "auth: token signing attempted with verify-only key",
            ),
            EtcdError::AuthRawNoPasswordUser => (
                Unknown,
                "auth: authentication failed, password was given for no password user",
            ),
            EtcdError::NoLeader => (Unavailable, "etcdserver: no leader"),
            EtcdError::NotLeader => (FailedPrecondition, "etcdserver: not leader"),
            EtcdError::LeaderChanged => (Unavailable, "etcdserver: leader changed"),
            EtcdError::NotCapable => (Unavailable, "etcdserver: not capable"),
            EtcdError::Stopped => (Unavailable, "etcdserver: server stopped"),
            EtcdError::Timeout => (Unavailable, "etcdserver: request timed out"),
            EtcdError::TimeoutDueToLeaderFail => (
                Unavailable,
                "etcdserver: request timed out, possibly due to previous leader failure",
            ),
            EtcdError::TimeoutDueToConnectionLost => (
                Unavailable,
                "etcdserver: request timed out, possibly due to connection lost",
            ),
            EtcdError::TimeoutWaitAppliedIndex => (
                Unavailable,
                "etcdserver: request timed out, waiting for the applied index took too long",
            ),
            EtcdError::Unhealthy => (Unavailable, "etcdserver: unhealthy cluster"),
            EtcdError::Corrupt => (DataLoss, "etcdserver: corrupt cluster"),
            EtcdError::NotSupportedForLearner => {
                (Unavailable, "etcdserver: rpc not supported for learner")
            }
            EtcdError::BadLeaderTransferee => {
                (FailedPrecondition, "etcdserver: bad leader transferee")
            }
        }
    }

    /// The exact message text.
    pub fn message(self) -> &'static str {
        self.code_and_message().1
    }

    /// The gRPC code.
    pub fn code(self) -> Code {
        self.code_and_message().0
    }

    /// THE mapping from an etcd error to the status sent on the wire.
    pub fn to_status(self) -> Status {
        let (code, message) = self.code_and_message();
        assert!(
            message.starts_with("etcdserver: ")
                || (code == Code::Unknown && message.starts_with("auth: "))
        );
        assert!(code != Code::Ok);
        Status::new(code, message)
    }
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn code_wire_values_round_trip() {
        for (index, code) in Code::ALL.iter().enumerate() {
            assert_eq!(usize::from(code.as_u8()), index);
            assert_eq!(Code::from_u8(code.as_u8()), *code);
            assert_eq!(code.as_header_value(), index.to_string());
        }
        assert_eq!(Code::from_u8(17), Code::Unknown);
        assert_eq!(Code::from_u8(255), Code::Unknown);
    }

    #[test]
    fn percent_encoding_follows_the_grpc_spec() {
        assert_eq!(
            percent_encode("etcdserver: key not found"),
            "etcdserver: key not found"
        );
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("a\nb\tc"), "a%0Ab%09c");
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode("~ !"), "~ !");
        assert_eq!(percent_encode("\u{7f}"), "%7F");
        for text in ["", "plain", "100%", "multi\nline é 日本", "%zz", "%4"] {
            assert_eq!(percent_decode(&percent_encode(text)), text);
        }
        // Malformed escapes are kept as they are, like grpc-go does.
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%41%4a"), "AJ");
    }

    #[test]
    fn unknown_method_texts_match_grpc_go() {
        let unknown_service = Status::unknown_method("/foo.Bar/Baz", ServiceKnown::No);
        assert_eq!(unknown_service.code, Code::Unimplemented);
        assert_eq!(unknown_service.message, "unknown service foo.Bar");
        let unknown_method = Status::unknown_method("/etcdserverpb.KV/Nope", ServiceKnown::Yes);
        assert_eq!(
            unknown_method.message,
            "unknown method Nope for service etcdserverpb.KV"
        );
        assert_eq!(
            split_method_path("/etcdserverpb.KV/Range"),
            Some(("etcdserverpb.KV", "Range"))
        );
        assert_eq!(split_method_path("/a/b/c"), Some(("a/b", "c")));
        assert_eq!(split_method_path("/nopath"), None);
        let malformed = Status::unknown_method("nopath", ServiceKnown::No);
        assert_eq!(malformed.message, "malformed method name: \"nopath\"");
        assert_eq!(
            Status::message_too_large(10, 4).message,
            "grpc: received message larger than max (10 vs. 4)"
        );
    }

    /// The table COMPAT.md lists, byte for byte; every entry must map exactly.
    #[test]
    fn every_compat_error_maps_to_its_exact_status() {
        let table: &[(EtcdError, Code, &str)] = &[
            (
                EtcdError::EmptyKey,
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                EtcdError::KeyNotFound,
                Code::InvalidArgument,
                "etcdserver: key not found",
            ),
            (
                EtcdError::ValueProvided,
                Code::InvalidArgument,
                "etcdserver: value is provided",
            ),
            (
                EtcdError::LeaseProvided,
                Code::InvalidArgument,
                "etcdserver: lease is provided",
            ),
            (
                EtcdError::TooManyOps,
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (
                EtcdError::DuplicateKey,
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (
                EtcdError::RequestTooLarge,
                Code::InvalidArgument,
                "etcdserver: request is too large",
            ),
            (
                EtcdError::UserEmpty,
                Code::InvalidArgument,
                "etcdserver: user name is empty",
            ),
            (
                EtcdError::RoleEmpty,
                Code::InvalidArgument,
                "etcdserver: role name is empty",
            ),
            (
                EtcdError::AuthFailed,
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (
                EtcdError::Compacted,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                EtcdError::FutureRev,
                Code::OutOfRange,
                "etcdserver: mvcc: required revision is a future revision",
            ),
            (
                EtcdError::LeaseTtlTooLarge,
                Code::OutOfRange,
                "etcdserver: too large lease TTL",
            ),
            (
                EtcdError::NoSpace,
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                EtcdError::TooManyRequests,
                Code::ResourceExhausted,
                "etcdserver: too many requests",
            ),
            (
                EtcdError::LeaseNotFound,
                Code::NotFound,
                "etcdserver: requested lease not found",
            ),
            (
                EtcdError::MemberNotFound,
                Code::NotFound,
                "etcdserver: member not found",
            ),
            (
                EtcdError::LeaseExist,
                Code::FailedPrecondition,
                "etcdserver: lease already exists",
            ),
            (
                EtcdError::AuthNotEnabled,
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            (
                EtcdError::UserAlreadyExist,
                Code::FailedPrecondition,
                "etcdserver: user name already exists",
            ),
            (
                EtcdError::UserNotFound,
                Code::FailedPrecondition,
                "etcdserver: user name not found",
            ),
            (
                EtcdError::RoleAlreadyExist,
                Code::FailedPrecondition,
                "etcdserver: role name already exists",
            ),
            (
                EtcdError::RoleNotFound,
                Code::FailedPrecondition,
                "etcdserver: role name not found",
            ),
            (
                EtcdError::NotLeader,
                Code::FailedPrecondition,
                "etcdserver: not leader",
            ),
            (
                EtcdError::MemberExist,
                Code::FailedPrecondition,
                "etcdserver: member ID already exist",
            ),
            (
                EtcdError::PeerUrlExist,
                Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
            (
                EtcdError::BadLeaderTransferee,
                Code::FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
            (
                EtcdError::PermissionDenied,
                Code::PermissionDenied,
                "etcdserver: permission denied",
            ),
            (
                EtcdError::InvalidAuthToken,
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
            ),
            (
                EtcdError::NoLeader,
                Code::Unavailable,
                "etcdserver: no leader",
            ),
            (
                EtcdError::LeaderChanged,
                Code::Unavailable,
                "etcdserver: leader changed",
            ),
            (
                EtcdError::Stopped,
                Code::Unavailable,
                "etcdserver: server stopped",
            ),
            (
                EtcdError::Timeout,
                Code::Unavailable,
                "etcdserver: request timed out",
            ),
        ];
        for (error, code, message) in table {
            let status = Status::from(*error);
            assert_eq!(status.code, *code, "{error:?}");
            assert_eq!(status.message, *message, "{error:?}");
            assert_eq!(error.to_string(), *message);
        }
    }

    #[test]
    fn every_etcd_error_is_distinct_and_prefixed() {
        let mut messages = HashSet::new();
        let mut variants = HashSet::new();
        for error in EtcdError::ALL {
            let status = error.to_status();
            // Only the auth store's unmapped errors (etcd's maintenance server) lack the prefix.
            assert!(
                status.message.starts_with("etcdserver: ")
                    || (status.code == Code::Unknown && status.message.starts_with("auth: ")),
                "{error:?}"
            );
            assert!(
                messages.insert(status.message),
                "{error:?} repeats a message"
            );
            assert!(variants.insert(error), "{error:?} listed twice in ALL");
        }
        assert_eq!(variants.len(), EtcdError::ALL.len());
    }
}
