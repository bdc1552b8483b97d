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

/// How the minority is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// The single minority member's bridge port goes down.
    LinkDown,
    /// The minority members move to a bridge of their own: they still reach each other.
    SeparateBridge,
}

#[test]
fn isolated_leader_refuses_service_and_rejoins_as_follower() {
    partition_round(3, 1, Cut::LinkDown);
}

// Failed in about half the runs until 2026-12-05: when the network healed, the connections
// across the cut delivered every heartbeat the leader had sent meanwhile, each answer let one
// more megabyte append out, and the majority leader's loop spent tens of seconds (and
// gigabytes) on thousands of them, losing leadership and staying behind. Raft now lets only
// the first answer per heartbeat unblock a follower (`raft/testdata/heartbeat_flood.txt`).
#[test]
fn leader_and_follower_cut_from_three_cannot_serve_and_rejoin() {
    partition_round(5, 2, Cut::SeparateBridge);
}

/// A follower cut off by the network while the others remove it (etcd's case for its 410
/// Gone): it cannot hear of its removal and keeps running; once the network heals, the notice
/// its peers sent reaches it, and it exits 0 by itself with etcd's words. The two left serve.
#[test]
fn a_member_removed_while_cut_off_exits_by_itself_once_the_network_heals() {
    let mut c = Cluster::start(3, Net::Namespaces, &[]);
    let all: Vec<usize> = (0..3).collect();
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let cut = (leader + 1) % 3;
    let left: Vec<usize> = all.iter().copied().filter(|&i| i != cut).collect();
    let cut_id = c.member_hex_id(leader, cut);
    c.netns.as_ref().expect("a namespace cluster").isolate(cut);
    c.remove_member(leader, &cut_id).ok();
    // Several election timeouts: it campaigns, unheard, and must not stop on its own.
    std::thread::sleep(Duration::from_millis(
        3 * crate::harness::ELECTION_TIMEOUT_MS,
    ));
    assert!(
        c.members[cut].wait_exit(Duration::ZERO).is_none(),
        "the cut-off member stopped before it could hear of its removal:\n{}",
        c.members[cut].log_tail()
    );
    c.netns.as_ref().expect("a namespace cluster").heal(cut);
    let healed = Instant::now();
    crate::membership::assert_exits_removed(&mut c, cut);
    eprintln!(
        "the removed member stopped {:?} after the heal",
        healed.elapsed()
    );
    let (leader, _, _) = c.wait_leader(&left, Duration::from_secs(10));
    c.etcdctl(leader, &["put", "after-removal", "yes"]).ok();
    let (_, kvs) = c.wait_converged(&left, Duration::from_secs(20));
    assert!(kvs
        .iter()
        .any(|(k, v, _)| k == "after-removal" && v == "yes"));
    assert_eq!(c.member_list(left[0]).len(), 2);
}

/// Cuts the leader plus `minority_size - 1` followers off from the rest of `count` members
/// while clients on every member run, checks both sides, heals, and checks the aftermath.
fn partition_round(count: usize, minority_size: usize, cut: Cut) {
    assert!(2 * minority_size < count, "the minority is a minority");
    assert!(
        cut == Cut::SeparateBridge || minority_size == 1,
        "a downed link isolates one member"
    );
    let c = Cluster::start(count, Net::Namespaces, &[]);
    let net = c.netns.as_ref().expect("a namespace cluster has a network");
    let all: Vec<usize> = (0..count).collect();
    let (old, before, _) = c.wait_leader(&all, Duration::from_secs(10));
    let minority: Vec<usize> = std::iter::once(old)
        .chain(
            all.iter()
                .copied()
                .filter(|&i| i != old)
                .take(minority_size - 1),
        )
        .collect();
    let majority: Vec<usize> = all
        .iter()
        .copied()
        .filter(|i| !minority.contains(i))
        .collect();
    let clients_per_member = if count > 3 { 1 } else { CLIENTS_PER_MEMBER };
    let epoch = Instant::now();
    let specs = (0..count * clients_per_member)
        .map(|id| ClientSpec {
            id,
            url: c.members[id % count].client_url(),
            netns: c.members[id % count].netns.clone(),
            timeout_ms: CALL_TIMEOUT_MS,
        })
        .collect();
    let workload = Workload::start(specs, &["k0", "k1", "k2"], epoch);
    std::thread::sleep(Duration::from_millis(1000));

    match cut {
        Cut::LinkDown => net.isolate(old),
        Cut::SeparateBridge => net.split(&minority),
    }
    let (new, after, elapsed) = c.wait_leader(&majority, Duration::from_secs(15));
    eprintln!(
        "partition: {minority:?} cut off from {majority:?}, n{new} leads term {} after {elapsed:?}",
        after.raft_term
    );
    assert!(after.raft_term > before.raft_term);

    // The minority side answers neither a write nor a linearizable read.
    for &m in &minority {
        let write = c.etcdctl(m, &["put", "minority-write", "x", "--command-timeout=2s"]);
        assert_ne!(
            write.code, 0,
            "minority member n{m} acknowledged a write: {write:?}"
        );
        let read = c.etcdctl(m, &["get", "k0", "--command-timeout=2s"]);
        assert_ne!(
            read.code, 0,
            "minority member n{m} served a linearizable read: {read:?}"
        );
    }
    // The majority side serves both.
    c.etcdctl(new, &["put", "majority-write", "y"]).ok();
    for &m in &majority {
        let out = c
            .etcdctl(m, &["get", "majority-write", "--print-value-only"])
            .ok();
        assert_eq!(
            out.stdout.trim(),
            "y",
            "majority member n{m} misses the write"
        );
    }
    std::thread::sleep(Duration::from_millis(500));

    match cut {
        Cut::LinkDown => net.heal(old),
        Cut::SeparateBridge => net.join_all(),
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = c.status(old);
        if let Some(s) = s {
            if s.leader != s.member_id && s.leader != 0 && s.raft_term >= after.raft_term {
                eprintln!(
                    "partition: old leader n{old} now follows {:x} in term {}",
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
        "a write proposed only on the minority side was committed"
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
        .filter(|(id, _)| minority.contains(&(id % count)))
        .map(|(_, l)| l.failures)
        .sum();
    assert!(
        minority_failures > 0,
        "clients of the minority never saw a failure"
    );
    assert_linearizable(&logs);
}
