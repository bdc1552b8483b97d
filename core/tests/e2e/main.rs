//! End-to-end tests: the real `keel` binary driven by real clients (etcdctl 3.4 and the
//! `etcd-client` crate), a differential run against a real etcd 3.4, malformed input on the
//! wire, crash/restart durability, limits (streams, connections, watchers, preface timeout,
//! taking over etcd's ports), faults (size limits, a failed raft core, a full disk, quota and
//! alarms), auto-compaction side by side with etcd, and etcd's snapshot format both ways
//! (Keel to a real etcd, etcd to Keel, make-mirror).
//!
//! One test binary, so the slow link of the gRPC client happens once. Every test starts its own
//! server on its own ports and data directory, so the tests run in parallel.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod bad_input;
mod client;
mod compaction;
mod deploy;
mod differential;
mod durability;
mod etcdctl;
mod faults;
mod gateway;
mod lifecycle;
mod limits;
mod observability;
mod snapshot;
mod tls;
