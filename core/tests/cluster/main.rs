//! Replicated-cluster tests: several real `keel` members replicating through Raft, driven by
//! etcdctl and the `etcd-client` crate. Members are killed, restarted, added, removed and
//! partitioned (in private network namespaces), while concurrent clients record histories that
//! a Porcupine-style linearizability checker ([`porcupine`]) must accept.
//!
//! One test binary, so the gRPC client links once. Every test owns its members, ports, data
//! directories and namespaces, so the tests run in parallel.

#[path = "../common/mod.rs"]
mod common;

mod harness;
mod netns;
mod porcupine;
mod workload;

mod alarms;
mod auth;
mod basic;
mod compaction;
mod corrupt;
mod failover;
mod membership;
mod partition;
mod peer_tls;
mod snapshot;

use std::time::Duration;

use porcupine::CheckResult;
use workload::ClientLog;

/// How many lines of a key's history a failure message shows.
const FAILURE_LINES_MAX: usize = 400;

/// Runs the checker over all clients' operations; panics with the offending key's history.
pub fn assert_linearizable(logs: &[ClientLog]) {
    let history = workload::history(logs);
    assert!(
        history
            .iter()
            .any(|op| op.output != porcupine::Output::Unknown),
        "the clients completed no operation, so the history proves nothing"
    );
    let started = std::time::Instant::now();
    let verdict = porcupine::check(&history);
    eprintln!(
        "checker: {verdict} over {} in {:?}",
        workload::summary(logs),
        started.elapsed()
    );
    match &verdict {
        CheckResult::Ok => {}
        CheckResult::Illegal { key, .. } | CheckResult::Undecided { key, .. } => {
            let text = porcupine::describe(&history, key);
            let lines: Vec<&str> = text.lines().take(FAILURE_LINES_MAX).collect();
            panic!("{verdict}\n{}", lines.join("\n"));
        }
    }
}

/// Runs `future` to completion on a fresh single-threaded tokio runtime.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime builds")
        .block_on(future)
}

/// Twice the election timeout: the bound on electing a new leader after the old one dies.
pub fn two_election_timeouts() -> Duration {
    Duration::from_millis(2 * harness::ELECTION_TIMEOUT_MS)
}
