//! Prometheus metrics with etcd's names, kept in atomics so the request path takes no lock.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use keel_grpc::Code;

use crate::shared::Shared;

/// The methods counted in `grpc_server_handled_total`; anything else counts as "other".
const METHODS: [(&str, &str, &str); 14] = [
    ("/etcdserverpb.KV/Range", "etcdserverpb.KV", "Range"),
    ("/etcdserverpb.KV/Put", "etcdserverpb.KV", "Put"),
    (
        "/etcdserverpb.KV/DeleteRange",
        "etcdserverpb.KV",
        "DeleteRange",
    ),
    ("/etcdserverpb.KV/Txn", "etcdserverpb.KV", "Txn"),
    ("/etcdserverpb.KV/Compact", "etcdserverpb.KV", "Compact"),
    (
        "/etcdserverpb.Lease/LeaseGrant",
        "etcdserverpb.Lease",
        "LeaseGrant",
    ),
    (
        "/etcdserverpb.Lease/LeaseRevoke",
        "etcdserverpb.Lease",
        "LeaseRevoke",
    ),
    (
        "/etcdserverpb.Maintenance/Status",
        "etcdserverpb.Maintenance",
        "Status",
    ),
    (
        "/etcdserverpb.Maintenance/Alarm",
        "etcdserverpb.Maintenance",
        "Alarm",
    ),
    (
        "/etcdserverpb.Maintenance/Defragment",
        "etcdserverpb.Maintenance",
        "Defragment",
    ),
    (
        "/etcdserverpb.Maintenance/HashKV",
        "etcdserverpb.Maintenance",
        "HashKV",
    ),
    (
        "/etcdserverpb.Cluster/MemberList",
        "etcdserverpb.Cluster",
        "MemberList",
    ),
    (
        "/grpc.health.v1.Health/Check",
        "grpc.health.v1.Health",
        "Check",
    ),
    ("", "unknown", "unknown"),
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

pub struct Metrics {
    handled: Vec<AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
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

    pub fn record_grpc(&self, path: &str, code: Code) {
        let m = METHODS
            .iter()
            .position(|(p, _, _)| *p == path)
            .unwrap_or(METHODS.len() - 1);
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
        let _ = writeln!(out, "# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.");
        let _ = writeln!(out, "# TYPE grpc_server_handled_total counter");
        for (m, (_, service, method)) in METHODS.iter().enumerate() {
            for (c, code) in CODE_NAMES.iter().enumerate() {
                let n = self.handled[m * CODES + c].load(Ordering::Relaxed);
                if n > 0 {
                    let _ = writeln!(
                        out,
                        "grpc_server_handled_total{{grpc_code=\"{code}\",grpc_method=\"{method}\",grpc_service=\"{service}\",grpc_type=\"unary\"}} {n}"
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
