//! Network partitions in private namespaces: the isolated leader's side refuses writes and
//! linearizable reads, the majority elects a leader and goes on, and after healing the old
//! leader steps down and catches up. The clients' histories must be linearizable throughout.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::assert_linearizable;
use crate::harness::{Cluster, Net};
use crate::workload::{ClientSpec, Workload};

const CLIENTS_PER_MEMBER: usize = 2;
const CALL_TIMEOUT_MS: u64 = 1000;

#[test]
fn isolated_leader_refuses_service_and_rejoins_as_follower() {
    let c = Cluster::start(3, Net::Namespaces, &[]);
    let net = c.netns.as_ref().expect("a namespace cluster has a network");
    let all: Vec<usize> = (0..3).collect();
    let (old, before, _) = c.wait_leader(&all, Duration::from_secs(10));
    let epoch = Instant::now();
    let specs = (0..3 * CLIENTS_PER_MEMBER)
        .map(|id| ClientSpec {
            id,
            url: c.members[id % 3].client_url(),
            netns: c.members[id % 3].netns.clone(),
            timeout_ms: CALL_TIMEOUT_MS,
        })
        .collect();
    let workload = Workload::start(specs, &["k0", "k1", "k2"], epoch);
    std::thread::sleep(Duration::from_millis(1000));

    net.isolate(old);
    let majority: Vec<usize> = all.iter().copied().filter(|&i| i != old).collect();
    let (new, after, elapsed) = c.wait_leader(&majority, Duration::from_secs(15));
    eprintln!(
        "partition: n{old} isolated, n{new} leads term {} after {elapsed:?}",
        after.raft_term
    );
    assert!(after.raft_term > before.raft_term);

    // The minority side answers neither a write nor a linearizable read.
    let write = c.etcdctl(old, &["put", "minority-write", "x", "--command-timeout=2s"]);
    assert_ne!(
        write.code, 0,
        "the isolated member acknowledged a write: {write:?}"
    );
    let read = c.etcdctl(old, &["get", "k0", "--command-timeout=2s"]);
    assert_ne!(
        read.code, 0,
        "the isolated member served a linearizable read: {read:?}"
    );
    // The majority side serves both.
    c.etcdctl(new, &["put", "majority-write", "y"]).ok();
    let other = majority
        .iter()
        .copied()
        .find(|&i| i != new)
        .expect("a majority of two");
    let out = c
        .etcdctl(other, &["get", "majority-write", "--print-value-only"])
        .ok();
    assert_eq!(out.stdout.trim(), "y");
    std::thread::sleep(Duration::from_millis(500));

    net.heal(old);
    let new_id = after.member_id;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = c.status(old);
        if let Some(s) = s {
            if s.leader != s.member_id && s.leader != 0 && s.raft_term >= after.raft_term {
                eprintln!(
                    "partition: old leader now follows {:x} (new leader {new_id:x}) in term {}",
                    s.leader, s.raft_term
                );
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the old leader did not step down after healing: {s:?}\n{}",
            c.log_tails(&[old])
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1000));
    let logs = workload.finish();

    let (_, kvs) = c.wait_converged(&all, Duration::from_secs(20));
    let stored: BTreeSet<&str> = kvs.iter().map(|(k, _, _)| k.as_str()).collect();
    assert!(stored.contains("majority-write"));
    assert!(
        !stored.contains("minority-write"),
        "a write proposed only on the isolated old leader was committed"
    );
    let acked: Vec<&String> = logs.iter().flat_map(|l| l.acked_keys.iter()).collect();
    let lost: Vec<&&String> = acked
        .iter()
        .filter(|k| !stored.contains(k.as_str()))
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    let minority_failures: usize = logs
        .iter()
        .enumerate()
        .filter(|(id, _)| id % 3 == old)
        .map(|(_, l)| l.failures)
        .sum();
    assert!(
        minority_failures > 0,
        "clients of the isolated member never saw a failure"
    );
    assert_linearizable(&logs);
}
