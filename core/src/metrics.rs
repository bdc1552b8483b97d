//! Prometheus metrics with etcd's names, kept in atomics so the request path takes no lock.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use keel_grpc::Code;

use crate::shared::Shared;

/// One gRPC method as `grpc_server_*` metrics label it (go-grpc-prometheus's labels).
struct Method {
    path: &'static str,
    service: &'static str,
    method: &'static str,
    /// `grpc_type`: unary, client_stream, server_stream or bidi_stream.
    kind: &'static str,
}

/// Every method etcd 3.4 serves, so each call is counted under its own labels; anything else
/// (an unknown path) is counted under the last row.
const METHODS: [Method; 49] = [
    Method {
        path: "/etcdserverpb.KV/Range",
        service: "etcdserverpb.KV",
        method: "Range",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.KV/Put",
        service: "etcdserverpb.KV",
        method: "Put",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.KV/DeleteRange",
        service: "etcdserverpb.KV",
        method: "DeleteRange",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.KV/Txn",
        service: "etcdserverpb.KV",
        method: "Txn",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.KV/Compact",
        service: "etcdserverpb.KV",
        method: "Compact",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Watch/Watch",
        service: "etcdserverpb.Watch",
        method: "Watch",
        kind: "bidi_stream",
    },
    Method {
        path: "/etcdserverpb.Lease/LeaseGrant",
        service: "etcdserverpb.Lease",
        method: "LeaseGrant",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Lease/LeaseRevoke",
        service: "etcdserverpb.Lease",
        method: "LeaseRevoke",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Lease/LeaseKeepAlive",
        service: "etcdserverpb.Lease",
        method: "LeaseKeepAlive",
        kind: "bidi_stream",
    },
    Method {
        path: "/etcdserverpb.Lease/LeaseTimeToLive",
        service: "etcdserverpb.Lease",
        method: "LeaseTimeToLive",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Lease/LeaseLeases",
        service: "etcdserverpb.Lease",
        method: "LeaseLeases",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Cluster/MemberAdd",
        service: "etcdserverpb.Cluster",
        method: "MemberAdd",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Cluster/MemberRemove",
        service: "etcdserverpb.Cluster",
        method: "MemberRemove",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Cluster/MemberUpdate",
        service: "etcdserverpb.Cluster",
        method: "MemberUpdate",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Cluster/MemberList",
        service: "etcdserverpb.Cluster",
        method: "MemberList",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Cluster/MemberPromote",
        service: "etcdserverpb.Cluster",
        method: "MemberPromote",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Maintenance/Alarm",
        service: "etcdserverpb.Maintenance",
        method: "Alarm",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Maintenance/Status",
        service: "etcdserverpb.Maintenance",
        method: "Status",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Maintenance/Defragment",
        service: "etcdserverpb.Maintenance",
        method: "Defragment",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Maintenance/Hash",
        service: "etcdserverpb.Maintenance",
        method: "Hash",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Maintenance/HashKV",
        service: "etcdserverpb.Maintenance",
        method: "HashKV",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Maintenance/Snapshot",
        service: "etcdserverpb.Maintenance",
        method: "Snapshot",
        kind: "server_stream",
    },
    Method {
        path: "/etcdserverpb.Maintenance/MoveLeader",
        service: "etcdserverpb.Maintenance",
        method: "MoveLeader",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/AuthEnable",
        service: "etcdserverpb.Auth",
        method: "AuthEnable",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/AuthDisable",
        service: "etcdserverpb.Auth",
        method: "AuthDisable",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/Authenticate",
        service: "etcdserverpb.Auth",
        method: "Authenticate",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/UserAdd",
        service: "etcdserverpb.Auth",
        method: "UserAdd",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/UserGet",
        service: "etcdserverpb.Auth",
        method: "UserGet",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/UserList",
        service: "etcdserverpb.Auth",
        method: "UserList",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/UserDelete",
        service: "etcdserverpb.Auth",
        method: "UserDelete",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/UserChangePassword",
        service: "etcdserverpb.Auth",
        method: "UserChangePassword",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/UserGrantRole",
        service: "etcdserverpb.Auth",
        method: "UserGrantRole",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/UserRevokeRole",
        service: "etcdserverpb.Auth",
        method: "UserRevokeRole",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/RoleAdd",
        service: "etcdserverpb.Auth",
        method: "RoleAdd",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/RoleGet",
        service: "etcdserverpb.Auth",
        method: "RoleGet",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/RoleList",
        service: "etcdserverpb.Auth",
        method: "RoleList",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/RoleDelete",
        service: "etcdserverpb.Auth",
        method: "RoleDelete",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/RoleGrantPermission",
        service: "etcdserverpb.Auth",
        method: "RoleGrantPermission",
        kind: "unary",
    },
    Method {
        path: "/etcdserverpb.Auth/RoleRevokePermission",
        service: "etcdserverpb.Auth",
        method: "RoleRevokePermission",
        kind: "unary",
    },
    Method {
        path: "/v3lockpb.Lock/Lock",
        service: "v3lockpb.Lock",
        method: "Lock",
        kind: "unary",
    },
    Method {
        path: "/v3lockpb.Lock/Unlock",
        service: "v3lockpb.Lock",
        method: "Unlock",
        kind: "unary",
    },
    Method {
        path: "/v3electionpb.Election/Campaign",
        service: "v3electionpb.Election",
        method: "Campaign",
        kind: "unary",
    },
    Method {
        path: "/v3electionpb.Election/Proclaim",
        service: "v3electionpb.Election",
        method: "Proclaim",
        kind: "unary",
    },
    Method {
        path: "/v3electionpb.Election/Leader",
        service: "v3electionpb.Election",
        method: "Leader",
        kind: "unary",
    },
    Method {
        path: "/v3electionpb.Election/Observe",
        service: "v3electionpb.Election",
        method: "Observe",
        kind: "server_stream",
    },
    Method {
        path: "/v3electionpb.Election/Resign",
        service: "v3electionpb.Election",
        method: "Resign",
        kind: "unary",
    },
    Method {
        path: "/grpc.health.v1.Health/Check",
        service: "grpc.health.v1.Health",
        method: "Check",
        kind: "unary",
    },
    Method {
        path: "/grpc.health.v1.Health/Watch",
        service: "grpc.health.v1.Health",
        method: "Watch",
        kind: "server_stream",
    },
    Method {
        path: "",
        service: "unknown",
        method: "unknown",
        kind: "unary",
    },
];
const CODES: usize = 17;
const CODE_NAMES: [&str; CODES] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// A method's row in the metrics table (see `Metrics::method_index`).
#[derive(Clone, Copy, Debug)]
pub struct MethodIndex(usize);

pub struct Metrics {
    /// Calls started, per method (`grpc_server_started_total`).
    started: Vec<AtomicU64>,
    /// Calls finished, per method and code (`grpc_server_handled_total`).
    handled: Vec<AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: (0..METHODS.len()).map(|_| AtomicU64::new(0)).collect(),
            handled: (0..METHODS.len() * CODES)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    /// The row of `path` in the method table, looked up once per call (the hot methods come
    /// first, so most lookups stop within a few entries).
    pub fn method_index(path: &str) -> MethodIndex {
        MethodIndex(
            METHODS
                .iter()
                .position(|m| m.path == path)
                .unwrap_or(METHODS.len() - 1),
        )
    }

    /// Counts a call as it starts.
    pub fn record_started(&self, method: MethodIndex) {
        self.started[method.0].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call as it ends, with its status code.
    pub fn record_grpc(&self, method: MethodIndex, code: Code) {
        let m = method.0;
        let c = (code as usize).min(CODES - 1);
        self.handled[m * CODES + c].fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self, shared: &Shared) -> String {
        let mut out = String::with_capacity(4096);
        let leader = shared.leader_id.load(Ordering::Acquire);
        gauge(
            &mut out,
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
            u64::from(leader != 0),
        );
        gauge(
            &mut out,
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            u64::from(leader == shared.member_id()),
        );
        gauge(
            &mut out,
            "etcd_server_proposals_committed_total",
            "The total number of consensus proposals committed.",
            shared.commit_index.load(Ordering::Acquire),
        );
        gauge(
            &mut out,
            "etcd_server_proposals_applied_total",
            "The total number of consensus proposals applied.",
            shared.applied_index.load(Ordering::Acquire),
        );
        gauge(
            &mut out,
            "etcd_server_term",
            "Current raft term.",
            shared.raft_term.load(Ordering::Acquire),
        );
        gauge(
            &mut out,
            "etcd_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
            shared.db_size_bytes.load(Ordering::Acquire),
        );
        gauge(
            &mut out,
            "etcd_mvcc_db_total_size_in_use_in_bytes",
            "Total size of the underlying database logically in use in bytes.",
            shared.db_size_in_use_bytes.load(Ordering::Acquire),
        );
        gauge(
            &mut out,
            "etcd_debugging_mvcc_current_revision",
            "The current revision of store.",
            shared.reader().current_revision().max(0) as u64,
        );
        gauge(
            &mut out,
            "etcd_server_quota_backend_bytes",
            "Current backend storage quota size in bytes.",
            shared.config.quota_backend_bytes,
        );
        let _ = writeln!(
            out,
            "# HELP grpc_server_started_total Total number of RPCs started on the server."
        );
        let _ = writeln!(out, "# TYPE grpc_server_started_total counter");
        for (m, method) in METHODS.iter().enumerate() {
            let n = self.started[m].load(Ordering::Relaxed);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "grpc_server_started_total{{grpc_method=\"{}\",grpc_service=\"{}\",grpc_type=\"{}\"}} {n}",
                    method.method, method.service, method.kind
                );
            }
        }
        let _ = writeln!(out, "# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.");
        let _ = writeln!(out, "# TYPE grpc_server_handled_total counter");
        for (m, method) in METHODS.iter().enumerate() {
            for (c, code) in CODE_NAMES.iter().enumerate() {
                let n = self.handled[m * CODES + c].load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "grpc_server_handled_total{{grpc_code=\"{code}\",grpc_method=\"{}\",grpc_service=\"{}\",grpc_type=\"{}\"}} {n}",
                        method.method, method.service, method.kind
                    );
                }
            }
        }
        out
    }
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}
