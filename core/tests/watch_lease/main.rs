//! End-to-end tests of Watch, Lease, Lock and Election: the real `keel` binary driven by
//! etcdctl 3.4 and the `etcd-client` crate, plus watch consistency under load (a slow watcher,
//! a Kubernetes-shaped list-then-watch consumer) and `#[ignore]`d latency benchmarks.
//!
//! Every test starts its own server on its own ports and data directory, so tests run in
//! parallel. With `KEEL_E2E_TARGET=etcd` the same tests run against a real etcd 3.4, which is
//! how their expectations were checked.

#[path = "../common/mod.rs"]
mod common;

mod bench;
mod client_lease_lock;
mod client_watch;
mod consistency;
mod etcdctl_cli;
mod support;
