//! Membership changes: a learner that must catch up by snapshot (the leader's log is compacted
//! by a small --snapshot-count), its promotion, removing a member, and replacing a member that
//! lost its data directory.

use std::time::{Duration, Instant};

use etcd_client::Client;

use crate::block_on;
use crate::harness::{Cluster, Net, Voting};

/// Keys written before the learner joins: several times the snapshot count, so the entries the
/// learner needs are compacted away on the leader.
const KEYS_BEFORE_JOIN: usize = 300;
const SNAPSHOT_COUNT: &str = "50";

/// Puts `count` keys `prefix{i}` through `url`, one after another.
fn put_keys(url: &str, prefix: &str, count: usize) {
    block_on(async {
        let mut client = Client::connect([url], None)
            .await
            .expect("etcd-client connects");
        for i in 0..count {
            client
                .put(format!("{prefix}{i:04}"), format!("value-{i}"), None)
                .await
                .unwrap_or_else(|e| panic!("put {prefix}{i} through {url}: {e}"));
        }
    });
}

/// Retries `member promote` until the learner is in sync (etcd refuses to promote before).
fn promote(c: &Cluster, via: usize, hex_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = c.etcdctl(via, &["member", "promote", hex_id]);
        if out.code == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "member promote {hex_id} kept failing: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn learner_catches_up_by_snapshot_then_members_are_promoted_removed_and_replaced() {
    // Small value-log segments: the leader's checkpoints point into its segment files, so the
    // snapshot it sends must carry the values themselves (what a large store does).
    let mut c = Cluster::start(
        3,
        Net::Loopback,
        &[
            "--snapshot-count",
            SNAPSHOT_COUNT,
            "--value-log-segment-bytes",
            "4096",
        ],
    );
    put_keys(&c.members[0].client_url(), "before/", KEYS_BEFORE_JOIN);
    let segments = std::fs::read_dir(c.members[0].data_dir.join("vlog"))
        .expect("the value-log directory")
        .count();
    assert!(segments > 1, "300 puts sealed {segments} segments");

    // Add a learner; it must be served a snapshot, the log it needs is gone.
    let learner = c.add_member(0, "n3", Voting::Learner, None);
    let (_, kvs) = c.wait_converged(&[0, 1, 2, learner], Duration::from_secs(30));
    assert_eq!(
        kvs.iter()
            .filter(|(k, _, _)| k.starts_with("before/"))
            .count(),
        KEYS_BEFORE_JOIN
    );
    assert!(
        (0..3).any(|i| c.members[i]
            .log_all()
            .contains("values copied inline from the value-log segments")),
        "no member sent a snapshot built from its segment files"
    );
    let learner_log = c.members[learner].log_all();
    assert!(
        learner_log.contains("installed the leader's snapshot"),
        "the learner caught up without a snapshot; its log:\n{}",
        c.members[learner].log_tail()
    );
    let listed = c.member_list(0);
    assert_eq!(listed.len(), 4);
    assert_eq!(
        listed.iter().filter(|m| m.is_learner).count(),
        1,
        "exactly the new member is a learner: {listed:?}"
    );

    let learner_id = c.member_hex_id(0, learner);
    promote(&c, 0, &learner_id);
    assert!(
        c.member_list(1).iter().all(|m| !m.is_learner),
        "promotion left a learner"
    );
    // The promoted member serves linearizable reads and writes.
    c.wait_ready(learner);
    c.etcdctl(learner, &["put", "promoted", "yes"]).ok();
    let out = c
        .etcdctl(1, &["get", "promoted", "--print-value-only"])
        .ok();
    assert_eq!(out.stdout.trim(), "yes");

    // Remove a follower (a removed member does not notice, so the test stops it).
    let all: Vec<usize> = vec![0, 1, 2, learner];
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let removed = [1, 2, 0]
        .into_iter()
        .find(|&i| i != leader)
        .expect("some original member follows");
    let removed_id = c.member_hex_id(leader, removed);
    c.etcdctl(leader, &["member", "remove", &removed_id]).ok();
    c.kill9(removed);
    let listed = c.member_list(leader);
    assert_eq!(listed.len(), 3, "after remove: {listed:?}");
    assert!(
        listed.iter().all(|m| format!("{:x}", m.id) != removed_id),
        "the removed member is still listed: {listed:?}"
    );
    let live: Vec<usize> = all.iter().copied().filter(|&i| i != removed).collect();
    c.wait_leader(&live, Duration::from_secs(10));
    put_keys(&c.members[learner].client_url(), "after-remove/", 20);

    // Replace a follower whose disk is gone: remove it, wipe it, add it back with the same URLs.
    let (leader, _, _) = c.wait_leader(&live, Duration::from_secs(10));
    let replaced = live
        .iter()
        .copied()
        .find(|&i| i != leader)
        .expect("a follower remains");
    let old_id = c.member_hex_id(leader, replaced);
    c.kill9(replaced);
    std::fs::remove_dir_all(&c.members[replaced].data_dir).expect("wiping the data dir");
    c.etcdctl(leader, &["member", "remove", &old_id]).ok();
    let removed_at = std::time::Instant::now();
    // Write enough that a leader's checkpoint covers the removal before the replacement joins
    // and is sent the newest one. Checkpoints are written beside the raft loop and land a
    // little after they are due, so write twice --snapshot-count, not just past it.
    let snapshot_count: usize = SNAPSHOT_COUNT.parse().expect("a number");
    put_keys(
        &c.members[leader].client_url(),
        "while-replacing/",
        2 * snapshot_count,
    );
    // Ids mix in the second of the MemberAdd, as etcd's do: add in a later second than the
    // removal, or the replacement would get the removed id back.
    std::thread::sleep(Duration::from_millis(1_100).saturating_sub(removed_at.elapsed()));
    let name = c.members[replaced].name.clone();
    let again = c.add_member(leader, &name, Voting::Voter, Some(replaced));
    assert_eq!(again, replaced);
    c.wait_ready(replaced);
    let (_, kvs) = c.wait_converged(&live, Duration::from_secs(30));
    for prefix in ["before/", "after-remove/", "while-replacing/", "promoted"] {
        assert!(
            kvs.iter().any(|(k, _, _)| k.starts_with(prefix)),
            "keys {prefix}* missing after the replacement"
        );
    }
    let listed = c.member_list(replaced);
    assert_eq!(listed.len(), 3, "after replace: {listed:?}");
    // As in etcd, the re-added member gets a fresh id (the time of the MemberAdd is hashed in),
    // and it learned that id from its peers when it joined.
    let replacement = listed
        .iter()
        .find(|m| m.peer_urls.contains(&c.members[replaced].peer_url()))
        .expect("the replacement is listed under its old URL");
    assert_ne!(
        format!("{:x}", replacement.id),
        old_id,
        "the replacement has a new id"
    );
    assert!(
        !replacement.is_learner,
        "the replacement was added as a voter"
    );
    assert!(listed.iter().all(|m| !m.is_learner));
}
