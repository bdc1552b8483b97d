//! Auto-compaction and Maintenance.Hash on a 3-member cluster: only the leader runs the
//! compactor, every member compacts at the revision it proposed, a new leader takes the
//! compactor over, and members that applied the same index answer the same Hash.

use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions};

use crate::block_on;
use crate::harness::{Cluster, Net};

/// Revision mode with Keel's test-only check interval, so a quiet cluster stops proposing
/// compactions (a check that finds nothing new proposes nothing) and Hash can be compared.
const RETENTION_REVISIONS: i64 = 5;
const CHECK_INTERVAL_MS: u64 = 300;

async fn connect(url: &str) -> Client {
    Client::connect([url], None)
        .await
        .expect("etcd-client connects")
}

/// Each member's (applied index, compact revision, Hash, header revision), asked of every
/// member in turn, and whether the member stood still while it was asked: its applied index
/// is read again after the Hash. A compaction is an entry, so one the leader proposes between
/// a member's status and its Hash moves that index; without the second read such a member
/// looks as if it applied what the others did yet hashes a compacted store.
async fn snapshot(clients: &mut [Client]) -> (Vec<(u64, i64, u32, i64)>, bool) {
    let mut out = Vec::new();
    let mut still = true;
    for c in clients.iter_mut() {
        let applied = c.status().await.expect("status").raft_applied_index();
        let compact = c.hash_kv(0).await.expect("hash_kv").compact_version();
        let h = c.hash().await.expect("hash");
        let revision = h.header().expect("a header").revision();
        let applied_after = c.status().await.expect("status").raft_applied_index();
        still &= applied_after == applied;
        out.push((applied, compact, h.hash(), revision));
    }
    (out, still)
}

/// What each member holds, for a failure message that says which part of the state differs:
/// HashKV at every revision up to `revision` (the first that differs names the write; 0 where
/// compacted), the leases with their granted TTLs, the voters and the keys.
async fn diagnose(clients: &mut [Client], revision: i64) -> String {
    let mut out = String::new();
    for (i, c) in clients.iter_mut().enumerate() {
        let mut kv = Vec::new();
        for r in 1..=revision {
            kv.push(c.hash_kv(r).await.map(|h| h.hash()).unwrap_or(0));
        }
        let mut leases = Vec::new();
        for l in c.leases().await.expect("leases").leases() {
            let ttl = c.lease_time_to_live(l.id(), None).await.expect("ttl");
            leases.push((l.id(), ttl.granted_ttl()));
        }
        let mut voters: Vec<u64> = c
            .member_list()
            .await
            .expect("member list")
            .members()
            .iter()
            .filter(|m| !m.is_learner())
            .map(|m| m.id())
            .collect();
        voters.sort_unstable();
        let all = c
            .get("", Some(etcd_client::GetOptions::new().with_all_keys()))
            .await
            .expect("get all");
        let keys: Vec<String> = all
            .kvs()
            .iter()
            .map(crate::common::key_value_line)
            .collect();
        out.push_str(&format!(
            "n{i}: HashKV by revision {kv:?}\n    leases {leases:?} voters {voters:?}\n    keys {keys:?}\n"
        ));
    }
    out
}

/// Waits until every member reports the same applied index before and after hashing (nothing
/// was applied in between anywhere), then returns what they answered.
async fn agreed_state(clients: &mut [Client], timeout: Duration) -> (u64, i64, u32, i64) {
    let start = Instant::now();
    loop {
        let (before, still_before) = snapshot(clients).await;
        let (after, still_after) = snapshot(clients).await;
        let quiet = still_before
            && still_after
            && before
                .iter()
                .chain(after.iter())
                .all(|s| s.0 == before[0].0);
        if quiet {
            // Same index applied everywhere: everything replicated must hash the same.
            if after.iter().any(|s| *s != after[0]) {
                eprintln!("{}", diagnose(clients, after[0].3).await);
            }
            for (i, s) in after.iter().enumerate() {
                assert_eq!(
                    *s, after[0],
                    "member n{i} applied index {} like n0 but answers (applied, compact revision, \
                     hash, revision) {s:?} against n0's {:?}",
                    s.0, after[0]
                );
            }
            return after[0];
        }
        assert!(
            start.elapsed() < timeout,
            "the members never stood still at one applied index: {before:?} then {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the members agree and the compactor has caught up with the last write
/// (compact revision = revision - retention); returns (compact revision, hash, revision).
async fn settled(clients: &mut [Client], timeout: Duration) -> (i64, u32, i64) {
    let start = Instant::now();
    loop {
        let (_, compact, hash, revision) = agreed_state(clients, timeout).await;
        if compact == revision - RETENTION_REVISIONS {
            return (compact, hash, revision);
        }
        assert!(
            start.elapsed() < timeout,
            "no compaction to revision {} - {RETENTION_REVISIONS}: compact revision {compact}",
            revision
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn log_count(c: &Cluster, i: usize, what: &str) -> usize {
    c.members[i].log_all().matches(what).count()
}

#[test]
fn members_compact_at_the_leaders_revision_and_agree_on_hash() {
    let interval = CHECK_INTERVAL_MS.to_string();
    let retention = RETENTION_REVISIONS.to_string();
    let mut c = Cluster::start(
        3,
        Net::Loopback,
        &[
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            &retention,
            "--revision-compaction-interval-ms",
            &interval,
        ],
    );
    let all = [0, 1, 2];
    let (leader, _, _) = c.wait_leader(&all, Duration::from_secs(10));
    let urls: Vec<String> = c.members.iter().map(|m| m.client_url()).collect();
    block_on(async {
        let mut clients = Vec::new();
        for url in &urls {
            clients.push(connect(url).await);
        }
        // Writes through every member, a lease with a key, a delete.
        let lease = clients[1].lease_grant(600, None).await.expect("grant").id();
        for i in 0..30 {
            let via = i % 3;
            clients[via]
                .put(format!("k{}", i % 7), format!("v{i}"), None)
                .await
                .expect("put");
        }
        clients[2]
            .put("leased", "x", Some(PutOptions::new().with_lease(lease)))
            .await
            .expect("put with lease");
        clients[0].delete("k3", None).await.expect("delete");
        // Every member compacted to the leader's current revision - retention.
        let (compact, hash, revision) = settled(&mut clients, Duration::from_secs(10)).await;
        eprintln!(
            "3 members agree: compact revision {compact}, revision {revision}, hash {hash:x}"
        );
        assert_eq!((compact, revision), (33 - RETENTION_REVISIONS, 33));
        assert_ne!(hash, 0);
    });
    // Only the leader ran the compactor; followers applied its proposal.
    for i in all {
        let started = log_count(&c, i, "starting auto-compaction");
        if i == leader {
            assert!(started >= 1, "the leader n{i} logged no compaction");
        } else {
            assert_eq!(started, 0, "follower n{i} proposed a compaction");
        }
    }

    // The leader dies: the new one takes the compactor over (etcd resumes it on the new leader).
    c.kill9(leader);
    let survivors: Vec<usize> = all.iter().copied().filter(|&i| i != leader).collect();
    let (new_leader, _, _) = c.wait_leader(&survivors, Duration::from_secs(15));
    block_on(async {
        let mut clients = Vec::new();
        for &i in &survivors {
            clients.push(connect(&urls[i]).await);
        }
        for i in 0..10 {
            clients[i % 2]
                .put("after-failover", format!("{i}"), None)
                .await
                .expect("put");
        }
        let (compact, _, revision) = settled(&mut clients, Duration::from_secs(10)).await;
        assert_eq!((compact, revision), (43 - RETENTION_REVISIONS, 43));
    });
    assert!(
        log_count(&c, new_leader, "starting auto-compaction") >= 1,
        "the new leader n{new_leader} never compacted"
    );

    // The old leader comes back, catches up, and hashes like the others.
    c.restart(leader);
    block_on(async {
        let mut clients = Vec::new();
        for url in &urls {
            clients.push(connect(url).await);
        }
        let (compact, _, revision) = settled(&mut clients, Duration::from_secs(15)).await;
        assert_eq!((compact, revision), (43 - RETENTION_REVISIONS, 43));
    });
}
