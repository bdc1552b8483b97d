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
/// member in turn.
async fn snapshot(clients: &mut [Client]) -> Vec<(u64, i64, u32, i64)> {
    let mut out = Vec::new();
    for c in clients.iter_mut() {
        let applied = c.status().await.expect("status").raft_applied_index();
        let compact = c.hash_kv(0).await.expect("hash_kv").compact_version();
        let h = c.hash().await.expect("hash");
        let revision = h.header().expect("a header").revision();
        out.push((applied, compact, h.hash(), revision));
    }
    out
}

/// Waits until every member reports the same applied index before and after hashing (nothing
/// was applied in between anywhere), then returns what they answered.
async fn agreed_state(clients: &mut [Client], timeout: Duration) -> (u64, i64, u32, i64) {
    let start = Instant::now();
    loop {
        let before = snapshot(clients).await;
        let after = snapshot(clients).await;
        let quiet = before
            .iter()
            .chain(after.iter())
            .all(|s| s.0 == before[0].0);
        if quiet {
            // Same index applied everywhere: everything replicated must hash the same.
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
