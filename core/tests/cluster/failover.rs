//! kill -9 of the leader while clients write: a new leader within two election timeouts, the
//! writes go on, no acknowledged write is lost, the old leader catches up after a restart, and
//! the recorded histories are linearizable.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::{Cluster, Net};
use crate::workload::{ClientSpec, Workload};
use crate::{assert_linearizable, two_election_timeouts};

/// Clients per member.
const CLIENTS_PER_MEMBER: usize = 2;
/// How long each client call may take before its outcome counts as unknown.
const CALL_TIMEOUT_MS: u64 = 1500;

#[test]
fn killing_the_leader_elects_a_new_one_and_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, Net::Loopback, &[]);
    let all: Vec<usize> = (0..3).collect();
    let (old, before, _) = c.wait_leader(&all, Duration::from_secs(10));
    let epoch = Instant::now();
    let specs = (0..3 * CLIENTS_PER_MEMBER)
        .map(|id| ClientSpec {
            id,
            url: c.members[id % 3].client_url(),
            netns: None,
            timeout_ms: CALL_TIMEOUT_MS,
        })
        .collect();
    let workload = Workload::start(specs, &["k0", "k1", "k2"], epoch);
    std::thread::sleep(Duration::from_millis(1500));

    c.kill9(old);
    let killed_at = std::time::SystemTime::now();
    let killed_at_ns = epoch.elapsed().as_nanos() as u64;
    let survivors: Vec<usize> = all.iter().copied().filter(|&i| i != old).collect();
    let (new, after, elapsed) = c.wait_leader(&survivors, Duration::from_secs(15));
    // The poll above adds etcdctl round trips; the new leader's own log says when it won.
    let won_at = c.members[new]
        .became_leader_at()
        .expect("the new leader logged its role change");
    let election = won_at
        .duration_since(killed_at)
        .expect("the new leader won after the kill");
    eprintln!(
        "failover: n{old} killed, n{new} leads term {} after {election:?} (by its log; \
         {elapsed:?} by polling; election timeout {}ms)",
        after.raft_term,
        crate::harness::ELECTION_TIMEOUT_MS
    );
    assert_ne!(new, old, "a killed member cannot lead");
    assert!(
        after.raft_term > before.raft_term,
        "a new election raises the term"
    );
    assert!(
        election < two_election_timeouts(),
        "electing a new leader took {election:?}, more than two election timeouts"
    );
    // Writes continue on the survivors with the old leader down.
    let put = c.etcdctl(new, &["put", "after-failover", "yes"]);
    assert_eq!(put.code, 0, "write after failover failed: {put:?}");
    std::thread::sleep(Duration::from_millis(1500));

    c.restart(old);
    std::thread::sleep(Duration::from_millis(1000));
    let logs = workload.finish();

    let (_, kvs) = c.wait_converged(&all, Duration::from_secs(20));
    let stored: BTreeSet<&str> = kvs.iter().map(|(k, _, _)| k.as_str()).collect();
    assert!(stored.contains("after-failover"));
    let acked: Vec<&String> = logs.iter().flat_map(|l| l.acked_keys.iter()).collect();
    assert!(!acked.is_empty(), "no unique put was acknowledged at all");
    let lost: Vec<&&String> = acked
        .iter()
        .filter(|k| !stored.contains(k.as_str()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes are lost: {lost:?}",
        lost.len(),
        acked.len()
    );
    // Clients kept completing checked operations after the kill.
    let completed_after_kill = logs
        .iter()
        .flat_map(|l| l.ops.iter())
        .filter(|op| op.call_ns > killed_at_ns && op.output != crate::porcupine::Output::Unknown)
        .count();
    assert!(
        completed_after_kill > 0,
        "no client operation completed after the leader was killed"
    );
    assert_linearizable(&logs);
}
