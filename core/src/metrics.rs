//! Prometheus metrics with etcd's names, kept in atomics so the request path takes no lock.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_grpc::{CallCounts, Code};

use crate::service::{ETCD_CLUSTER_VERSION, ETCD_VERSION};
use crate::shared::Shared;
use crate::stats::{Histogram, PeerStats, GRPC_HANDLING_BUCKETS_NS};

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

/// Per-method gRPC series (go-grpc-prometheus's) and the client traffic totals, shared by all
/// shards. Each call adds to a handful of relaxed atomics when it ends.
pub struct Metrics {
    /// Calls started, per method (`grpc_server_started_total`).
    started: Vec<AtomicU64>,
    /// Calls finished, per method and code (`grpc_server_handled_total`).
    handled: Vec<AtomicU64>,
    /// Request messages received, per method (`grpc_server_msg_received_total`).
    msg_received: Vec<AtomicU64>,
    /// Response messages sent, per method (`grpc_server_msg_sent_total`).
    msg_sent: Vec<AtomicU64>,
    /// Call durations, per method (`grpc_server_handling_seconds`).
    handling: Vec<Histogram>,
    /// Request and response message bytes (`etcd_network_client_grpc_*_bytes_total`).
    client_received_bytes: AtomicU64,
    client_sent_bytes: AtomicU64,
    /// /health answers (`etcd_server_health_success` / `etcd_server_health_failures`).
    health_success: AtomicU64,
    health_failures: AtomicU64,
    /// Keep-alives answered by the shard that took them, and by the raft core
    /// (`keel_lease_keepalives_total`).
    keepalives_on_shard: AtomicU64,
    keepalives_on_raft_core: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        let per_method = || (0..METHODS.len()).map(|_| AtomicU64::new(0)).collect();
        Metrics {
            started: per_method(),
            handled: (0..METHODS.len() * CODES)
                .map(|_| AtomicU64::new(0))
                .collect(),
            msg_received: per_method(),
            msg_sent: per_method(),
            handling: (0..METHODS.len())
                .map(|_| Histogram::seconds(&GRPC_HANDLING_BUCKETS_NS))
                .collect(),
            client_received_bytes: AtomicU64::new(0),
            client_sent_bytes: AtomicU64::new(0),
            health_success: AtomicU64::new(0),
            health_failures: AtomicU64::new(0),
            keepalives_on_shard: AtomicU64::new(0),
            keepalives_on_raft_core: AtomicU64::new(0),
        }
    }
}

/// The raft core's mailboxes and the watch queues, for `keel_*_queue_depth`.
const QUEUE_HELP: &str = "Items waiting in one of Keel's bounded queues into the raft core.";

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

    /// Counts what a finished call moved and how long it took.
    pub fn record_call(&self, method: MethodIndex, counts: &CallCounts, elapsed: Duration) {
        let m = method.0;
        let add = |a: &AtomicU64, n: u64| {
            if n > 0 {
                a.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.msg_received[m], counts.messages_received.get());
        add(&self.msg_sent[m], counts.messages_sent.get());
        add(&self.client_received_bytes, counts.bytes_received.get());
        add(&self.client_sent_bytes, counts.bytes_sent.get());
        self.handling[m].observe_duration(elapsed);
    }

    /// Counts one /health answer.
    pub fn record_health(&self, healthy: bool) {
        let counter = if healthy {
            &self.health_success
        } else {
            &self.health_failures
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one keep-alive answer: by the shard that took it (the leader renewing in its
    /// window) or by the raft core (a follower forwarding, or a leader that cannot vouch for
    /// its leadership now).
    pub fn record_keepalive(&self, on_shard: bool) {
        let counter = if on_shard {
            &self.keepalives_on_shard
        } else {
            &self.keepalives_on_raft_core
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self, shared: &Shared) -> String {
        let mut out = String::with_capacity(64 * 1024);
        self.render_server(&mut out, shared);
        render_disk_and_store(&mut out, shared);
        self.render_network(&mut out, shared);
        self.render_grpc(&mut out);
        render_keel(&mut out, shared);
        self.render_keepalives(&mut out);
        crate::procstat::render(&mut out, shared);
        out
    }

    fn render_keepalives(&self, out: &mut String) {
        labelled_counter(
            out,
            "keel_lease_keepalives_total",
            "Lease keep-alives answered, by where: on the shard that took them (the leader, renewing in its window) or by the raft core.",
            "answered_on",
            &[
                ("shard", self.keepalives_on_shard.load(Ordering::Relaxed)),
                (
                    "raft_core",
                    self.keepalives_on_raft_core.load(Ordering::Relaxed),
                ),
            ],
        );
    }

    fn render_server(&self, out: &mut String, shared: &Shared) {
        let stats = &shared.raft_stats;
        let leader = shared.leader_id.load(Ordering::Acquire);
        gauge(
            out,
            "etcd_server_has_leader",
            "Whether or not a leader exists. 1 is existence, 0 is not.",
            u64::from(leader != 0),
        );
        gauge(
            out,
            "etcd_server_is_leader",
            "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            u64::from(leader == shared.member_id()),
        );
        gauge(
            out,
            "etcd_server_is_learner",
            "Whether or not this member is a learner. 1 if is, 0 otherwise.",
            u64::from(shared.is_learner.load(Ordering::Acquire)),
        );
        counter(
            out,
            "etcd_server_leader_changes_seen_total",
            "The number of leader changes seen.",
            stats.leader_changes_seen.load(Ordering::Relaxed),
        );
        gauge(
            out,
            "etcd_server_proposals_committed_total",
            "The total number of consensus proposals committed.",
            shared.commit_index.load(Ordering::Acquire),
        );
        gauge(
            out,
            "etcd_server_proposals_applied_total",
            "The total number of consensus proposals applied.",
            shared.applied_index.load(Ordering::Acquire),
        );
        gauge(
            out,
            "etcd_server_proposals_pending",
            "The current number of pending proposals to commit.",
            stats.proposals_pending.load(Ordering::Relaxed),
        );
        counter(
            out,
            "etcd_server_proposals_failed_total",
            "The total number of failed proposals seen.",
            stats.proposals_failed.load(Ordering::Relaxed),
        );
        counter(
            out,
            "etcd_server_heartbeat_send_failures_total",
            "The total number of leader heartbeat send failures (likely overloaded from slow disk).",
            stats.heartbeat_send_failures.load(Ordering::Relaxed),
        );
        counter(
            out,
            "etcd_server_slow_apply_total",
            "The total number of slow apply requests (likely overloaded from slow disk).",
            stats.slow_apply.load(Ordering::Relaxed),
        );
        counter(
            out,
            "etcd_server_read_indexes_failed_total",
            "The total number of failed read indexes seen.",
            stats.read_indexes_failed.load(Ordering::Relaxed),
        );
        counter(
            out,
            "etcd_server_health_success",
            "The total number of successful health checks",
            self.health_success.load(Ordering::Relaxed),
        );
        counter(
            out,
            "etcd_server_health_failures",
            "The total number of failed health checks",
            self.health_failures.load(Ordering::Relaxed),
        );
        gauge(
            out,
            "etcd_server_term",
            "Current raft term.",
            shared.raft_term.load(Ordering::Acquire),
        );
        gauge(
            out,
            "etcd_server_quota_backend_bytes",
            "Current backend storage quota size in bytes.",
            shared.config.quota_backend_bytes,
        );
        labelled_gauge(
            out,
            "etcd_server_id",
            "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
            &format!("server_id=\"{:x}\"", shared.member_id()),
        );
        labelled_gauge(
            out,
            "etcd_server_version",
            "Which version is running. 1 for 'server_version' label with current version.",
            &format!("server_version=\"{ETCD_VERSION}\""),
        );
        // etcd reports the cluster version as major.minor.
        let cluster = ETCD_CLUSTER_VERSION
            .rsplit_once('.')
            .map_or(ETCD_CLUSTER_VERSION, |(major_minor, _)| major_minor);
        labelled_gauge(
            out,
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            &format!("cluster_version=\"{cluster}\""),
        );
    }

    fn render_network(&self, out: &mut String, shared: &Shared) {
        counter(
            out,
            "etcd_network_client_grpc_received_bytes_total",
            "The total number of bytes received from grpc clients.",
            self.client_received_bytes.load(Ordering::Relaxed),
        );
        counter(
            out,
            "etcd_network_client_grpc_sent_bytes_total",
            "The total number of bytes sent to grpc clients.",
            self.client_sent_bytes.load(Ordering::Relaxed),
        );
        let peers = shared.peer_stats.all();
        let series = |out: &mut String,
                      name: &str,
                      help: &str,
                      kind: &str,
                      label: &str,
                      f: &dyn Fn(&PeerStats) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for p in &peers {
                let _ = writeln!(out, "{name}{{{label}=\"{:x}\"}} {}", p.id, f(p));
            }
        };
        series(
            out,
            "etcd_network_peer_sent_bytes_total",
            "The total number of bytes sent to peers.",
            "counter",
            "To",
            &|p| p.sent_bytes.load(Ordering::Relaxed),
        );
        series(
            out,
            "etcd_network_peer_received_bytes_total",
            "The total number of bytes received from peers.",
            "counter",
            "From",
            &|p| p.received_bytes.load(Ordering::Relaxed),
        );
        series(
            out,
            "etcd_network_peer_sent_failures_total",
            "The total number of send failures from peers.",
            "counter",
            "To",
            &|p| p.sent_failures.load(Ordering::Relaxed),
        );
        let name = "etcd_network_peer_round_trip_time_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Round-Trip-Time histogram between peers\n# TYPE {name} histogram"
        );
        for p in &peers {
            p.round_trip
                .render_series(out, name, &format!("To=\"{:x}\"", p.id));
        }
    }

    fn render_grpc(&self, out: &mut String) {
        // Every method's row is written, zeros included, as go-grpc-prometheus pre-registers
        // them: a rate() over a series that appears only at its first call misses that call.
        let labels = |m: &Method| {
            format!(
                "grpc_method=\"{}\",grpc_service=\"{}\",grpc_type=\"{}\"",
                m.method, m.service, m.kind
            )
        };
        let known = &METHODS[..METHODS.len() - 1];
        let per_method = |out: &mut String, name: &str, help: &str, values: &[AtomicU64]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (m, method) in METHODS.iter().enumerate() {
                let n = values[m].load(Ordering::Relaxed);
                if m < known.len() || n > 0 {
                    let _ = writeln!(out, "{name}{{{}}} {n}", labels(method));
                }
            }
        };
        per_method(
            out,
            "grpc_server_started_total",
            "Total number of RPCs started on the server.",
            &self.started,
        );
        per_method(
            out,
            "grpc_server_msg_received_total",
            "Total number of RPC stream messages received on the server.",
            &self.msg_received,
        );
        per_method(
            out,
            "grpc_server_msg_sent_total",
            "Total number of gRPC stream messages sent by the server.",
            &self.msg_sent,
        );
        let _ = writeln!(out, "# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.");
        let _ = writeln!(out, "# TYPE grpc_server_handled_total counter");
        for (m, method) in METHODS.iter().enumerate() {
            for (c, code) in CODE_NAMES.iter().enumerate() {
                let n = self.handled[m * CODES + c].load(Ordering::Relaxed);
                if m < known.len() || n > 0 {
                    let _ = writeln!(
                        out,
                        "grpc_server_handled_total{{grpc_code=\"{code}\",{}}} {n}",
                        labels(method)
                    );
                }
            }
        }
        let name = "grpc_server_handling_seconds";
        let _ = writeln!(out, "# HELP {name} Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.\n# TYPE {name} histogram");
        for (m, method) in METHODS.iter().enumerate() {
            if m < known.len() || self.handling[m].count() > 0 {
                self.handling[m].render_series(out, name, &labels(method));
            }
        }
    }
}

fn render_disk_and_store(out: &mut String, shared: &Shared) {
    let stats = &shared.raft_stats;
    stats.wal_fsync.render(
        out,
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
    );
    stats.backend_commit.render(
        out,
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
    );
    let size = shared.db_size_bytes();
    gauge(
        out,
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        size,
    );
    gauge(
        out,
        "etcd_debugging_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        size,
    );
    gauge(
        out,
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "Total size of the underlying database logically in use in bytes.",
        shared.db_size_in_use_bytes.load(Ordering::Acquire),
    );
    let reader = shared.reader();
    gauge(
        out,
        "etcd_debugging_mvcc_current_revision",
        "The current revision of store.",
        reader.current_revision().max(0) as u64,
    );
    gauge(
        out,
        "etcd_debugging_mvcc_compact_revision",
        "The revision of the last compaction in store.",
        reader.compact_revision().max(0) as u64,
    );
    gauge(
        out,
        "etcd_debugging_mvcc_keys_total",
        "Total number of keys.",
        stats.keys.load(Ordering::Relaxed).max(0) as u64,
    );
    let puts = stats.puts.load(Ordering::Relaxed);
    let deletes = stats.deletes.load(Ordering::Relaxed);
    for prefix in ["etcd_mvcc", "etcd_debugging_mvcc"] {
        counter(
            out,
            &format!("{prefix}_put_total"),
            "Total number of puts seen by this member.",
            puts,
        );
        counter(
            out,
            &format!("{prefix}_delete_total"),
            "Total number of deletes seen by this member.",
            deletes,
        );
    }
}

/// Keel's own series: queue depths, group-commit batch sizes, checkpoint durations.
fn render_keel(out: &mut String, shared: &Shared) {
    let _ = writeln!(
        out,
        "# HELP keel_queue_depth {QUEUE_HELP}\n# TYPE keel_queue_depth gauge"
    );
    let _ = writeln!(
        out,
        "keel_queue_depth{{queue=\"proposals\"}} {}",
        shared.proposals.len()
    );
    let _ = writeln!(
        out,
        "keel_queue_depth{{queue=\"reads\"}} {}",
        shared.reads.len()
    );
    let _ = writeln!(
        out,
        "keel_queue_depth{{queue=\"queries\"}} {}",
        shared.queries.len()
    );
    let _ = writeln!(
        out,
        "# HELP keel_watch_queue_depth Applied event batches waiting for one shard's watch hub.\n# TYPE keel_watch_queue_depth gauge"
    );
    for (shard, q) in shared.watch_batches.iter().enumerate() {
        let _ = writeln!(
            out,
            "keel_watch_queue_depth{{shard=\"{shard}\"}} {}",
            q.len()
        );
    }
    gauge(
        out,
        "keel_watchers",
        "Watchers on all shards.",
        shared.watchers_total.load(Ordering::Relaxed) as u64,
    );
    let stats = &shared.raft_stats;
    stats.wal_batch_entries.render(
        out,
        "keel_wal_batch_records",
        "WAL records per append (one write and one fdatasync each): the group commit batch size.",
    );
    stats.checkpoint.render(
        out,
        "keel_checkpoint_duration_seconds",
        "Time to serialize and durably write one checkpoint.",
    );
    counter(
        out,
        "keel_appends_deferred_total",
        "Raft appends a follower left for the leader to send again while its values waited for the disk.",
        stats.appends_deferred.load(Ordering::Relaxed),
    );
    render_heap_allocations(out);
    let pager = &shared.pager.stats;
    labelled_counter(
        out,
        "keel_pager_reads_total",
        "Reads of values in mapped segment files by outcome: all pages in memory, pages brought in by a pager thread, or faults left to the shard (queue full).",
        "outcome",
        &[
            ("in_memory", pager.reads_in_memory.load(Ordering::Relaxed)),
            ("paged", pager.reads_paged.load(Ordering::Relaxed)),
            ("unpaged", pager.reads_unpaged.load(Ordering::Relaxed)),
        ],
    );
    counter(
        out,
        "keel_pager_pages_missing_total",
        "Pages of values that reads found not in memory (mincore), before a pager thread brought them in.",
        pager.pages_missing.load(Ordering::Relaxed),
    );
    let cache = &shared.value_cache;
    gauge(
        out,
        "keel_value_cache_limit_bytes",
        "The value cache's limit: bytes of mapped value-log segments kept in memory (--value-cache-bytes; 0: none).",
        cache.limit_bytes.load(Ordering::Relaxed),
    );
    gauge(
        out,
        "keel_value_cache_resident_bytes",
        "Bytes of mapped value-log segments in memory at the value cache's last look.",
        cache.resident_bytes.load(Ordering::Relaxed),
    );
    counter(
        out,
        "keel_value_cache_paged_out_bytes_total",
        "Bytes of mapped value-log segments the value cache paged out to keep to its limit.",
        cache.paged_out_bytes.load(Ordering::Relaxed),
    );
}

/// Heap allocations by the threads of each role (alloc_count.rs), when the binary counts them.
fn render_heap_allocations(out: &mut String) {
    let Some(totals) = crate::alloc_count::totals() else {
        return;
    };
    labelled_counter(
        out,
        "keel_heap_allocations_total",
        "Heap allocations (alloc, alloc_zeroed, realloc) made by the threads of each role.",
        "thread",
        &totals.map(|(role, t)| (role.label(), t.allocations)),
    );
    labelled_counter(
        out,
        "keel_heap_allocated_bytes_total",
        "Bytes asked for by those heap allocations.",
        "thread",
        &totals.map(|(role, t)| (role.label(), t.bytes)),
    );
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

/// A counter with one series per value of `label`.
fn labelled_counter(out: &mut String, name: &str, help: &str, label: &str, rows: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (value, count) in rows {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {count}");
    }
}

/// A gauge whose one series carries its information in a label, set to 1 (etcd_server_id...).
fn labelled_gauge(out: &mut String, name: &str, help: &str, labels: &str) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} 1"
    );
}
