//! Auto-compaction against real etcd 3.4 (the same flags, the same writes, the same schedule),
//! revision-mode auto-compaction with Keel's test-only check interval, and Maintenance.Hash.

use std::time::{Duration, Instant};

use etcd_client::{GetOptions, PutOptions};

use crate::common::{client, grpc_error, Server};

const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

/// One server's view during the side-by-side run.
struct Observed {
    name: &'static str,
    client: etcd_client::Client,
    /// When each revision's put was acknowledged, since the run started (index = revision).
    acked_ms: Vec<Option<u64>>,
    /// Each compaction seen: when HashKV first reported it, and its revision.
    compactions: Vec<(u64, i64)>,
}

impl Observed {
    async fn put(&mut self, value: &str, t0: Instant) {
        let r = self.client.put("k", value, None).await.expect("put");
        let rev = r.header().expect("a put has a header").revision() as usize;
        if self.acked_ms.len() <= rev {
            self.acked_ms.resize(rev + 1, None);
        }
        self.acked_ms[rev] = Some(t0.elapsed().as_millis() as u64);
    }

    async fn watch_compaction(&mut self, t0: Instant) {
        let h = self.client.hash_kv(0).await.expect("hash_kv");
        let compact_rev = h.compact_version();
        if compact_rev > self.compactions.last().map_or(-1, |c| c.1) {
            self.compactions
                .push((t0.elapsed().as_millis() as u64, compact_rev));
        }
    }

    /// How long before the compaction was seen its revision stopped being the newest (the next
    /// write's acknowledgement): the history the compaction kept, as the test measures it.
    fn kept_ms(&self, k: usize) -> Option<u64> {
        let (seen_ms, rev) = self.compactions[k];
        let next = self.acked_ms.get(rev as usize + 1).copied().flatten()?;
        Some(seen_ms.saturating_sub(next))
    }
}

/// etcd 3.4 and Keel, started together with `--auto-compaction-retention 2s`, get the same
/// writes (one every 100 ms) and are watched through HashKV every 50 ms. etcd's periodic
/// compactor samples the revision every 200 ms (retention / 10), compacts first after 2 s to
/// the revision it sampled at its start, then every 2 s to the oldest of its last 11 samples
/// (the revision of 2.2 s before). Both must follow that schedule, and their compact revisions
/// must agree within what the difference of their start times and Keel's 100 ms tick allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_auto_compaction_follows_etcds_schedule() {
    const WRITE_EVERY_MS: u64 = 100;
    const OBSERVE_EVERY_MS: u64 = 50;
    const COMPACTIONS: usize = 4;
    let flags = [
        "--auto-compaction-mode",
        "periodic",
        "--auto-compaction-retention",
        "2s",
    ];
    // Each compactor's clock starts with its process: launch both at once.
    let (etcd, keel) = std::thread::scope(|s| {
        let etcd = s.spawn(|| Server::etcd(&flags));
        let keel = s.spawn(|| Server::keel(&flags));
        (
            etcd.join().expect("etcd starts"),
            keel.join().expect("keel starts"),
        )
    });
    let t0 = Instant::now();
    let mut servers = [
        Observed {
            name: "etcd",
            client: client(&etcd).await,
            acked_ms: Vec::new(),
            compactions: Vec::new(),
        },
        Observed {
            name: "keel",
            client: client(&keel).await,
            acked_ms: Vec::new(),
            compactions: Vec::new(),
        },
    ];
    let deadline = Duration::from_secs(15);
    let mut slot = 0u64;
    while servers.iter().any(|s| s.compactions.len() < COMPACTIONS) {
        assert!(
            t0.elapsed() < deadline,
            "fewer than {COMPACTIONS} compactions in {deadline:?}: etcd {:?}, keel {:?}\n{}",
            servers[0].compactions,
            servers[1].compactions,
            keel.log_tail()
        );
        if slot.is_multiple_of(WRITE_EVERY_MS / OBSERVE_EVERY_MS) {
            for s in servers.iter_mut() {
                s.put(&format!("v{slot}"), t0).await;
            }
        }
        for s in servers.iter_mut() {
            s.watch_compaction(t0).await;
        }
        slot += 1;
        let next = t0 + Duration::from_millis(slot * OBSERVE_EVERY_MS);
        tokio::time::sleep(next.saturating_duration_since(Instant::now())).await;
    }
    for s in &servers {
        let kept: Vec<Option<u64>> = (0..s.compactions.len()).map(|k| s.kept_ms(k)).collect();
        eprintln!(
            "{}: compactions (seen at ms, revision) {:?}, history kept (ms) {:?}",
            s.name, s.compactions, kept
        );
    }

    // Which 2 s step of its schedule each compaction is, counted from the first (a step whose
    // oldest sample is still the revision of the one before compacts nothing new, so HashKV
    // cannot show it: that happens when the writes began late). Steps are counted gap by gap,
    // because etcd's schedule drifts by its timer's lateness at every wake-up.
    let steps = |c: &[(u64, i64)]| -> Vec<(u64, i64)> {
        let mut step = 0;
        let mut out = vec![(0, c[0].1)];
        for pair in c.windows(2) {
            step += (pair[1].0 - pair[0].0 + 1000) / 2000;
            out.push((step, pair[1].1));
        }
        out
    };
    for s in &servers {
        let c = &s.compactions;
        // Started before any write: the first compaction is to the revision sampled at start.
        assert_eq!(c[0].1, 1, "{}: {c:?}", s.name);
        // One compaction every 2 s: a wake-up is seen late by at most a tick (Keel: 100 ms;
        // etcd: its timer), and HashKV shows it late by at most one 50 ms observation round.
        for pair in c.windows(2) {
            let gap_ms = (pair[1].0 - pair[0].0) as i64;
            let step_ms = 2000 * ((gap_ms + 1000) / 2000);
            assert!(
                step_ms > 0 && (gap_ms - step_ms).abs() <= 200,
                "{}: {gap_ms} ms between compactions: {c:?}",
                s.name
            );
        }
        // Each later one keeps 2.2 s of history (the oldest of 11 samples 200 ms apart), seen
        // up to a tick plus an observation round late, measured against 100 ms writes.
        for k in 1..c.len() {
            let kept_ms = s
                .kept_ms(k)
                .expect("the compacted revision was overwritten");
            assert!(
                (1900..=2600).contains(&kept_ms),
                "{}: compaction {k} kept {kept_ms} ms of history: {c:?}",
                s.name
            );
        }
    }
    // Both started within a few hundred ms of each other and got the same writes at the same
    // times, so at each step their compact revisions differ by at most the writes made in the
    // time between their two compactions, plus one for Keel sampling at its tick and one for the
    // write that lands between the two servers' puts.
    let (e, k) = (&servers[0].compactions, &servers[1].compactions);
    let phase_ms = k[0].0 as i64 - e[0].0 as i64;
    eprintln!("keel's schedule runs {phase_ms} ms after etcd's");
    assert!(
        phase_ms.abs() < 600,
        "the two schedules are {phase_ms} ms apart"
    );
    let (e_steps, k_steps) = (steps(e), steps(k));
    let mut paired = 0;
    for (i, (step, e_rev)) in e_steps.iter().enumerate() {
        if let Some(j) = k_steps.iter().position(|(s, _)| s == step) {
            paired += 1;
            let apart_ms = (k[j].0 as i64 - e[i].0 as i64).unsigned_abs();
            let tolerance = (apart_ms / WRITE_EVERY_MS) as i64 + 2;
            let k_rev = k_steps[j].1;
            assert!(
                (k_rev - e_rev).abs() <= tolerance,
                "step {step}: keel compacted to {k_rev}, etcd to {e_rev}, {apart_ms} ms apart \
                 (tolerance {tolerance}): keel {k:?}, etcd {e:?}"
            );
        }
    }
    assert!(paired >= COMPACTIONS - 1, "keel {k:?}, etcd {e:?}");
    // Old revisions now answer "compacted" on both, the compacted one still reads.
    for s in servers.iter_mut() {
        let last = s.compactions[COMPACTIONS - 1].1;
        let e = grpc_error(
            s.client
                .get("k", Some(GetOptions::new().with_revision(last - 1)))
                .await,
        );
        assert_eq!(e, ("OutOfRange".into(), COMPACTED.into()), "{}", s.name);
        s.client
            .get("k", Some(GetOptions::new().with_revision(last)))
            .await
            .expect("the compact revision itself stays readable");
    }
    // Only the leader compacts, so the one Keel member logged every compaction etcd's way.
    let log = std::fs::read_to_string(keel.dir.path().join("server-1.log")).expect("keel's log");
    let started = log.matches("starting auto-compaction").count();
    assert!(started >= COMPACTIONS, "{started} compactions logged");
    assert!(log.contains("\"retention\":\"2s\""), "{}", keel.log_tail());
}

fn log_count(server: &Server, what: &str) -> usize {
    std::fs::read_to_string(server.dir.path().join("server-1.log"))
        .expect("the server's log")
        .matches(what)
        .count()
}

/// Revision mode with Keel's test-only check interval (etcd checks every 5 minutes): compact
/// to current - retention at each check, skip a check when that did not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revision_auto_compaction_keeps_the_last_revisions() {
    const CHECK_MS: u64 = 500;
    let server = Server::keel(&[
        "--auto-compaction-mode",
        "revision",
        "--auto-compaction-retention",
        "10",
        "--revision-compaction-interval-ms",
        &CHECK_MS.to_string(),
    ]);
    let mut c = client(&server).await;
    let compact_revision = |c: &mut etcd_client::Client| {
        let mut c = c.clone();
        async move { c.hash_kv(0).await.expect("hash_kv").compact_version() }
    };
    let wait_for = |c: &mut etcd_client::Client, want: i64| {
        let mut c = c.clone();
        async move {
            let start = Instant::now();
            loop {
                let got = c.hash_kv(0).await.expect("hash_kv").compact_version();
                if got == want {
                    return start.elapsed();
                }
                assert!(
                    start.elapsed() < Duration::from_millis(4 * CHECK_MS),
                    "compact revision {got}, waiting for {want}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // Below the retention nothing happens: revision 6 - 10 is not a revision.
    for i in 0..5 {
        c.put("k", format!("{i}"), None).await.expect("put");
    }
    tokio::time::sleep(Duration::from_millis(3 * CHECK_MS)).await;
    assert_eq!(compact_revision(&mut c).await, -1);
    for i in 5..25 {
        c.put("k", format!("{i}"), None).await.expect("put");
    }
    // Revision 26: the next check compacts to 16.
    let took = wait_for(&mut c, 16).await;
    eprintln!("compacted to 16 {took:?} after the last write");
    let e = grpc_error(c.get("k", Some(GetOptions::new().with_revision(15))).await);
    assert_eq!(e, ("OutOfRange".into(), COMPACTED.into()));
    let r = c
        .get("k", Some(GetOptions::new().with_revision(16)))
        .await
        .expect("revision 16 is kept");
    assert_eq!(r.kvs()[0].value(), b"14");
    // Checks that find the revision where it was propose nothing.
    tokio::time::sleep(Duration::from_millis(3 * CHECK_MS)).await;
    assert_eq!(compact_revision(&mut c).await, 16);
    assert_eq!(log_count(&server, "starting auto-compaction"), 1);
    assert_eq!(log_count(&server, "finished auto-compaction"), 1);
    for i in 25..30 {
        c.put("k", format!("{i}"), None).await.expect("put");
    }
    wait_for(&mut c, 21).await;
    assert_eq!(log_count(&server, "starting auto-compaction"), 2);
    assert!(log_count(&server, "\"retention\":\"10 revisions\"") >= 2);
}

/// Maintenance.Hash covers the whole store (every kept revision, leases, compaction), carries a
/// full header, and is the same after a restart, clean or after kill -9. Runs against etcd too
/// (`KEEL_E2E_TARGET=etcd`): the values differ, the behaviour does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_covers_the_whole_store_and_survives_restarts() {
    let mut server = Server::under_test(&[]);
    let mut c = client(&server).await;
    let hash = |c: &mut etcd_client::Client| {
        let mut c = c.clone();
        async move {
            let h = c.hash().await.expect("hash");
            let header = h.header().expect("Hash answers a header").clone();
            assert_ne!(header.member_id(), 0);
            assert_ne!(header.cluster_id(), 0);
            assert_ne!(header.raft_term(), 0);
            (h.hash(), header.revision())
        }
    };
    let (empty, rev) = hash(&mut c).await;
    assert_eq!(rev, 1);
    assert_ne!(empty, 0, "etcd's Hash is never 0 in practice");
    assert_eq!(
        hash(&mut c).await,
        (empty, 1),
        "asking again changes nothing"
    );

    c.put("a", "1", None).await.expect("put");
    c.put("a", "2", None).await.expect("put");
    let (two_puts, rev) = hash(&mut c).await;
    assert_eq!(rev, 3, "the header carries the current revision");
    assert_ne!(two_puts, empty);
    // HashKV at revision 2 is unchanged by the put at 3; Hash covers every revision.
    let hash_kv_at_2 = c.hash_kv(2).await.expect("hash_kv").hash();
    let lease = c.lease_grant(600, None).await.expect("grant").id();
    let (leased, rev) = hash(&mut c).await;
    assert_eq!(rev, 3, "a lease grant makes no revision");
    assert_ne!(leased, two_puts, "leases are in the hash");
    c.put("b", "x", Some(PutOptions::new().with_lease(lease)))
        .await
        .expect("put with lease");
    assert_eq!(c.hash_kv(2).await.expect("hash_kv").hash(), hash_kv_at_2);
    c.compact(3, None).await.expect("compact");
    // HashKV refuses the compacted revision itself and every one below it, as etcd's
    // HashByRev does; the current revision (4, or 0 for "now") still hashes.
    for at in [2, 3] {
        assert_eq!(
            grpc_error(c.hash_kv(at).await),
            ("OutOfRange".into(), COMPACTED.into()),
            "HashKV at {at}"
        );
    }
    assert_eq!(
        c.hash_kv(4).await.expect("hash_kv at 4").hash(),
        c.hash_kv(0).await.expect("hash_kv now").hash()
    );
    let (compacted, rev) = hash(&mut c).await;
    assert_eq!(rev, 4);
    assert_ne!(compacted, leased);

    // The same store after a clean restart, and after kill -9 (WAL replay).
    server.stop();
    server.restart();
    let mut c = client(&server).await;
    assert_eq!(hash(&mut c).await, (compacted, 4), "after a clean restart");
    c.put("c", "y", None).await.expect("put");
    let before_kill = hash(&mut c).await;
    server.kill9();
    server.restart();
    let mut c = client(&server).await;
    assert_eq!(hash(&mut c).await, before_kill, "after kill -9");
}
