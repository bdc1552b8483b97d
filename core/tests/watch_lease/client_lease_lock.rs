//! Lease, v3lock and v3election through the etcd-client crate, as its own examples use them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcd_client::{
    EventType, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, LockOptions, ProclaimOptions,
    PutOptions, ResignOptions, WatchOptions,
};

use crate::common::{client, grpc_error, Server};
use crate::support::{collect_events, expect_created, revision, STEP_TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_grant_keep_alive_time_to_live_leases_and_revoke() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    let g = c.lease_grant(60, None).await.expect("grant");
    assert_eq!(g.ttl(), 60);
    let id = g.id();
    assert!(id > 0, "server-picked ids are positive: {id}");
    assert_eq!(
        c.lease_grant(1, None).await.expect("grant").ttl(),
        2,
        "raised to the minimum"
    );
    let fixed = c
        .lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .expect("grant with an id");
    assert_eq!(fixed.id(), 0x1234);
    assert_eq!(
        grpc_error(
            c.lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1234)))
                .await
        ),
        (
            "FailedPrecondition".into(),
            "etcdserver: lease already exists".into()
        )
    );
    assert_eq!(
        grpc_error(c.lease_grant(9_000_000_001, None).await),
        (
            "OutOfRange".into(),
            "etcdserver: too large lease TTL".into()
        )
    );

    for k in ["lk/1", "lk/2"] {
        c.put(k, "v", Some(PutOptions::new().with_lease(id)))
            .await
            .expect("put with lease");
    }
    let ttl = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .expect("time to live");
    assert_eq!((ttl.id(), ttl.granted_ttl()), (id, 60));
    assert!((55..=60).contains(&ttl.ttl()), "remaining {}", ttl.ttl());
    let keys: BTreeSet<Vec<u8>> = ttl.keys().iter().cloned().collect();
    assert_eq!(keys, BTreeSet::from([b"lk/1".to_vec(), b"lk/2".to_vec()]));
    let no_keys = c.lease_time_to_live(id, None).await.expect("time to live");
    assert!(no_keys.keys().is_empty());

    let (mut keeper, mut replies) = c.lease_keep_alive(id).await.expect("keep alive");
    for _ in 0..3 {
        keeper.keep_alive().await.expect("keep alive request");
        let r = tokio::time::timeout(STEP_TIMEOUT, replies.message())
            .await
            .expect("a keep-alive reply in time")
            .expect("the keep-alive stream works")
            .expect("a reply");
        assert_eq!((r.id(), r.ttl()), (id, 60));
    }

    let listed: BTreeSet<i64> = c
        .leases()
        .await
        .expect("leases")
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    assert!(
        listed.contains(&id) && listed.contains(&0x1234),
        "{listed:?}"
    );

    c.lease_revoke(id).await.expect("revoke");
    let left = c
        .get("lk/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(left.count(), 0, "revoke deletes the attached keys");
    assert_eq!(c.lease_time_to_live(id, None).await.expect("ttl").ttl(), -1);
    assert_eq!(
        grpc_error(c.lease_revoke(id).await),
        (
            "NotFound".into(),
            "etcdserver: requested lease not found".into()
        )
    );
    // A keep-alive for a lease that no longer exists answers TTL 0 on the same stream.
    keeper.keep_alive().await.expect("keep alive request");
    let r = tokio::time::timeout(STEP_TIMEOUT, replies.message())
        .await
        .expect("a keep-alive reply in time")
        .expect("the keep-alive stream works")
        .expect("a reply");
    assert_eq!(r.ttl(), 0);
    assert_eq!(
        grpc_error(
            c.put("x", "y", Some(PutOptions::new().with_lease(id)))
                .await
        ),
        (
            "NotFound".into(),
            "etcdserver: requested lease not found".into()
        )
    );
}

/// `LeaseLeases` lists the leases soonest to expire first, as etcd's lessor sorts them, not
/// by id: the TTLs here put the ids in an order of expiry that differs from theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_listed_soonest_to_expire_first() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    for (id, ttl_s) in [(1, 300), (2, 100), (3, 200), (4, 400), (5, 10), (6, 11)] {
        c.lease_grant(ttl_s, Some(LeaseGrantOptions::new().with_id(id)))
            .await
            .expect("grant");
    }
    let listed = |c: &mut etcd_client::Client| {
        let mut c = c.clone();
        async move {
            c.leases()
                .await
                .expect("leases")
                .leases()
                .iter()
                .map(|l| l.id())
                .collect::<Vec<i64>>()
        }
    };
    assert_eq!(listed(&mut c).await, vec![5, 6, 2, 3, 1, 4]);
    // A keep-alive moves a lease's expiry, and with it its place: renewed 2 s on, lease 5
    // runs out a second after lease 6.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut keeper, mut replies) = c.lease_keep_alive(5).await.expect("keep alive");
    keeper.keep_alive().await.expect("keep alive request");
    let renewed = tokio::time::timeout(STEP_TIMEOUT, replies.message())
        .await
        .expect("a keep-alive reply in time")
        .expect("the keep-alive stream works")
        .expect("a reply");
    assert_eq!((renewed.id(), renewed.ttl()), (5, 10));
    assert_eq!(listed(&mut c).await, vec![6, 5, 2, 3, 1, 4]);
    c.lease_revoke(3).await.expect("revoke");
    assert_eq!(listed(&mut c).await, vec![6, 5, 2, 1, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_deletes_at_one_revision_and_keep_alive_prevents_it() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    let dying = c.lease_grant(2, None).await.expect("grant").id();
    let kept = c.lease_grant(2, None).await.expect("grant").id();
    for (k, lease) in [
        ("x/a", dying),
        ("x/b", dying),
        ("x/c", dying),
        ("x/kept", kept),
    ] {
        c.put(k, k, Some(PutOptions::new().with_lease(lease)))
            .await
            .expect("put with lease");
    }
    let start = revision(&mut c).await + 1;
    let mut stream = c
        .watch(
            "x/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_start_revision(start),
            ),
        )
        .await
        .expect("watch");
    expect_created(&mut stream).await;
    let (mut keeper, mut replies) = c.lease_keep_alive(kept).await.expect("keep alive");
    let keep = tokio::spawn(async move {
        for _ in 0..10 {
            keeper.keep_alive().await.expect("keep alive request");
            let r = replies.message().await.expect("stream").expect("reply");
            assert_eq!(r.ttl(), 2);
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    });
    let events = collect_events(&mut stream, 3).await;
    assert!(
        events
            .iter()
            .all(|e| e.kind == EventType::Delete && e.mod_revision == start),
        "{events:?}"
    );
    let keys: Vec<&[u8]> = events.iter().map(|e| e.key.as_slice()).collect();
    assert_eq!(keys, [&b"x/a"[..], b"x/b", b"x/c"]);
    assert!(
        events
            .iter()
            .all(|e| e.prev_value.as_deref() == Some(e.key.as_slice())),
        "prev_kv on every delete: {events:?}"
    );
    keep.await.expect("the keep-alive task finishes");
    // Four seconds on, the kept-alive lease and its key are still there.
    let got = c
        .get("x/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    let left: Vec<&[u8]> = got.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(left, [&b"x/kept"[..]]);
    assert!(c.lease_time_to_live(kept, None).await.expect("ttl").ttl() > 0);
    assert_eq!(
        c.lease_time_to_live(dying, None).await.expect("ttl").ttl(),
        -1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_for_unlock_and_for_lease_expiry() {
    let server = Server::under_test(&[]);
    let mut c1 = client(&server).await;
    let mut c2 = client(&server).await;
    let first = c1.lock("L", None).await.expect("lock");
    let key1 = first.key().to_vec();
    assert!(key1.starts_with(b"L/"), "{key1:?}");
    let waiter = tokio::spawn(async move {
        let r = c2.lock("L", None).await.expect("lock");
        (
            r.key().to_vec(),
            r.header().expect("header").revision(),
            Instant::now(),
        )
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiter.is_finished(), "the second locker got a held lock");
    let unlocked_at = Instant::now();
    let unlock_rev = c1
        .unlock(key1.clone())
        .await
        .expect("unlock")
        .header()
        .expect("header")
        .revision();
    let (key2, rev2, got_at) = tokio::time::timeout(STEP_TIMEOUT, waiter)
        .await
        .expect("the waiter gets the lock after unlock")
        .expect("the waiter task");
    assert!(got_at >= unlocked_at);
    assert!(key2 != key1 && key2.starts_with(b"L/"), "{key2:?}");
    assert!(
        rev2 >= unlock_rev,
        "lock header {rev2} before unlock {unlock_rev}"
    );

    // A lock held under a lease nobody keeps alive is released by the lease's expiry.
    let lease = c1.lease_grant(2, None).await.expect("grant").id();
    let held = c1
        .lock("M", Some(LockOptions::new().with_lease(lease)))
        .await
        .expect("lock with lease");
    let mut c3 = client(&server).await;
    let started = Instant::now();
    let next = tokio::time::timeout(STEP_TIMEOUT, c3.lock("M", None))
        .await
        .expect("expiry releases the lock")
        .expect("lock");
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "got the lock after {:?}",
        started.elapsed()
    );
    assert_ne!(next.key(), held.key());
    c3.unlock(next.key()).await.expect("unlock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_campaign_proclaim_leader_observe_and_resign() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    let lease1 = c.lease_grant(30, None).await.expect("grant").id();
    let lease2 = c.lease_grant(30, None).await.expect("grant").id();
    assert_eq!(
        grpc_error(c.leader("E").await),
        ("Unknown".into(), "election: no leader".into())
    );
    // Observe starts before there is a leader. The call itself only returns once the server
    // sends the first leader (gRPC sends response headers with the first message), so it runs
    // in its own task and forwards what it sees.
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let mut oc = client(&server).await;
    let observer = tokio::spawn(async move {
        let mut observe = oc.observe("E").await.expect("observe");
        while let Some(r) = observe.message().await.expect("the observe stream works") {
            let value = r.kv().expect("a leader kv").value().to_vec();
            if seen_tx.send(value).await.is_err() {
                return;
            }
        }
    });
    let mut next_observed = async || {
        tokio::time::timeout(STEP_TIMEOUT, seen_rx.recv())
            .await
            .expect("an observed leader in time")
            .expect("the observer runs")
    };

    let leader1 = c
        .campaign("E", "v1", lease1)
        .await
        .expect("campaign")
        .leader()
        .expect("a leader key")
        .clone();
    assert_eq!(leader1.lease(), lease1);
    assert_eq!(next_observed().await, b"v1");
    c.proclaim(
        "v2",
        Some(ProclaimOptions::new().with_leader(leader1.clone())),
    )
    .await
    .expect("proclaim");
    assert_eq!(next_observed().await, b"v2");
    let now = c.leader("E").await.expect("leader");
    assert_eq!(now.kv().expect("kv").value(), b"v2");

    let mut c2 = client(&server).await;
    let second =
        tokio::spawn(async move { c2.campaign("E", "w1", lease2).await.expect("campaign") });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !second.is_finished(),
        "a second leader while the first holds"
    );
    c.resign(Some(ResignOptions::new().with_leader(leader1.clone())))
        .await
        .expect("resign");
    let won = tokio::time::timeout(STEP_TIMEOUT, second)
        .await
        .expect("the second candidate wins after the resign")
        .expect("campaign task");
    let leader2 = won.leader().expect("a leader key").clone();
    assert_eq!(leader2.lease(), lease2);
    assert_eq!(next_observed().await, b"w1");
    assert_eq!(
        c.leader("E")
            .await
            .expect("leader")
            .kv()
            .expect("kv")
            .value(),
        b"w1"
    );

    assert_eq!(
        grpc_error(
            c.proclaim("stale", Some(ProclaimOptions::new().with_leader(leader1)))
                .await
        ),
        ("Unknown".into(), "election: not leader".into())
    );
    c.resign(Some(ResignOptions::new().with_leader(leader2)))
        .await
        .expect("resign");
    assert_eq!(
        grpc_error(c.leader("E").await),
        ("Unknown".into(), "election: no leader".into())
    );
    observer.abort();
}
