//! Watch consistency under load: a watcher that stops reading while writers run, and a
//! Kubernetes-shaped list-then-watch consumer whose reconstructed view must equal the store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};

use crate::common::{client, Server};
use crate::support::{assert_no_response, collect_events, expect_created, next_response, revision};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_watcher_does_not_block_writers_and_catches_up_exactly() {
    const KEYS: usize = 100;
    const WRITERS: usize = 16;
    const PUTS_PER_WRITER: usize = 250;
    // Large values with prev_kv make the unread events (about 24 MB) far exceed the server's
    // per-stream queue and the HTTP/2 windows, so the watcher must fall back to history.
    const VALUE_BYTES: usize = 3000;
    let server = Server::under_test(&[]);
    let mut writer = client(&server).await;
    // The watcher has its own connection, as a slow consumer in another process would.
    let watcher = client(&server).await;
    let base = revision(&mut writer).await;
    // A catch-up response holds up to a thousand 6 KB events; Go clients accept up to 2 GiB,
    // tonic's default is 4 MiB.
    let mut stream = watcher
        .watch_client()
        .max_decoding_message_size(256 << 20)
        .watch(
            "slow/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_prev_key()
                    .with_start_revision(base + 1),
            ),
        )
        .await
        .expect("watch");
    expect_created(&mut stream).await;

    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut c = writer.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::with_capacity(PUTS_PER_WRITER);
            for i in 0..PUTS_PER_WRITER {
                let key = format!("slow/{:03}", (w * PUTS_PER_WRITER + i) % KEYS);
                let mut value = format!("{w}-{i}-");
                value.extend(std::iter::repeat_n('x', VALUE_BYTES - value.len()));
                let r = c.put(key.clone(), value.clone(), None).await.expect("put");
                done.push((r.header().expect("header").revision(), key, value));
            }
            done
        }));
    }
    let mut writes = Vec::new();
    for t in tasks {
        writes.extend(t.await.expect("writer task"));
    }
    let write_time = started.elapsed();
    let total = WRITERS * PUTS_PER_WRITER;
    eprintln!(
        "slow watcher: {total} puts in {write_time:?} ({:.0}/s) with an unread watcher",
        total as f64 / write_time.as_secs_f64()
    );
    assert!(
        write_time < Duration::from_secs(60),
        "writes took {write_time:?} with a stalled watcher"
    );
    writes.sort();
    let revs: Vec<i64> = writes.iter().map(|w| w.0).collect();
    assert_eq!(
        revs,
        ((base + 1)..=(base + total as i64)).collect::<Vec<_>>(),
        "every put is its own revision"
    );

    // Now read: every event exactly once, in revision order, with the right prev_kv.
    let events = collect_events(&mut stream, total).await;
    let mut last_value: BTreeMap<String, String> = BTreeMap::new();
    for (e, (rev, key, value)) in events.iter().zip(&writes) {
        assert_eq!(e.kind, EventType::Put);
        assert_eq!(e.mod_revision, *rev);
        assert_eq!(e.key, key.as_bytes());
        assert_eq!(e.value, value.as_bytes(), "value at revision {rev}");
        let prev = last_value.insert(key.clone(), value.clone());
        assert_eq!(
            e.prev_value.as_deref(),
            prev.as_deref().map(str::as_bytes),
            "prev_kv at revision {rev}"
        );
    }
    assert_no_response(&mut stream, Duration::from_millis(300)).await;
}

/// splitmix64: a seeded, reproducible choice of operations without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const PREFIX: &str = "/registry/pods/";
const PREFIX_END: &str = "/registry/pods0";

/// What the consumer believes a key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Obj {
    value: Vec<u8>,
    mod_revision: i64,
}

#[derive(Debug, Default)]
struct View {
    objects: BTreeMap<Vec<u8>, Obj>,
    /// The revision the view is complete up to (list revision, events, progress).
    revision: i64,
    /// (revision, key, delete) of every event applied, in order.
    log: Vec<(i64, Vec<u8>, bool)>,
    progress_replies: usize,
}

/// kube-apiserver's list: pages of `limit` keys, the first at the latest revision and every
/// later page at that same revision, each starting at the last key + "\0".
async fn list(c: &mut Client, limit: i64) -> View {
    let mut view = View::default();
    let mut start = PREFIX.as_bytes().to_vec();
    loop {
        let mut opts = GetOptions::new().with_range(PREFIX_END).with_limit(limit);
        if view.revision > 0 {
            opts = opts.with_revision(view.revision);
        }
        let page = c.get(start.clone(), Some(opts)).await.expect("list page");
        if view.revision == 0 {
            view.revision = page.header().expect("header").revision();
        }
        for kv in page.kvs() {
            view.objects.insert(
                kv.key().to_vec(),
                Obj {
                    value: kv.value().to_vec(),
                    mod_revision: kv.mod_revision(),
                },
            );
        }
        let more = (page.kvs().len() as i64) < page.count();
        assert_eq!(more, page.more(), "hasMore from count agrees with more");
        if !page.more() {
            return view;
        }
        start = page.kvs().last().expect("a non-empty page").key().to_vec();
        start.push(0);
    }
}

/// Watches from `view.revision + 1` (prev_kv, progress_notify, a progress request every
/// 100 ms) and applies events until `done(view)`; checks every rule a cache relies on.
///
/// etcd 3.4.23 fails this under KEEL_E2E_TARGET=etcd: it answers a progress request at once
/// with the store's revision, ahead of events still being replayed (fixed in 3.4.31 and
/// 3.5.13, the versions kube-apiserver requires before it sends progress requests).
async fn consume(c: &mut Client, view: &mut View, done: impl Fn(&View) -> bool) {
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_progress_notify()
        .with_start_revision(view.revision + 1);
    let mut stream = c.watch(PREFIX, Some(opts)).await.expect("watch");
    let created = expect_created(&mut stream).await;
    let wid = created.watch_id();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // No event may carry a revision a progress reply already covered.
    let mut progress_rev = 0;
    while !done(view) {
        let r = tokio::select! {
            _ = tick.tick() => {
                stream.request_progress().await.expect("progress request");
                continue;
            }
            r = next_response(&mut stream) => r,
        };
        assert!(!r.canceled() && !r.created(), "unexpected {r:?}");
        let header_rev = r.header().expect("header").revision();
        if r.events().is_empty() {
            assert!(r.watch_id() == -1 || r.watch_id() == wid, "{r:?}");
            assert!(
                header_rev >= view.revision,
                "progress {header_rev} went back"
            );
            progress_rev = header_rev;
            view.revision = header_rev;
            view.progress_replies += 1;
            continue;
        }
        assert_eq!(r.watch_id(), wid);
        let first_rev = r.events()[0].kv().expect("kv").mod_revision();
        assert!(
            first_rev > view.revision,
            "event at {first_rev} after the view reached {}: duplicate or split revision",
            view.revision
        );
        for e in r.events() {
            let kv = e.kv().expect("kv");
            let rev = kv.mod_revision();
            assert!(
                rev > progress_rev,
                "event {rev} after progress {progress_rev}"
            );
            assert!(rev >= view.revision, "events out of order");
            let key = kv.key().to_vec();
            let current = view.objects.get(&key).cloned();
            let prev = e.prev_kv().map(|p| Obj {
                value: p.value().to_vec(),
                mod_revision: p.mod_revision(),
            });
            match e.event_type() {
                EventType::Put if kv.version() == 1 => {
                    assert_eq!(current, None, "create of a key the view holds");
                    assert_eq!(prev, None);
                }
                _ => assert_eq!(prev, current, "prev_kv differs from the view at {rev}"),
            }
            let delete = e.event_type() == EventType::Delete;
            if delete {
                view.objects.remove(&key);
            } else {
                view.objects.insert(
                    key.clone(),
                    Obj {
                        value: kv.value().to_vec(),
                        mod_revision: rev,
                    },
                );
            }
            view.revision = rev;
            view.log.push((rev, key, delete));
        }
    }
}

fn key_of(i: u64) -> String {
    format!("{PREFIX}pod-{i:03}")
}

async fn create(c: &mut Client, key: &str, value: &str, lease: i64) -> bool {
    let put = if lease == 0 {
        TxnOp::put(key, value, None)
    } else {
        TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)))
    };
    let txn = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, 0)])
        .and_then([put]);
    c.txn(txn).await.expect("create txn").succeeded()
}

/// One writer: reads a key, then creates, updates or deletes it guarded by its mod_revision,
/// as kube-apiserver's GuaranteedUpdate does; some creates carry short leases nobody renews.
async fn writer(mut c: Client, seed: u64, ops: usize) -> (usize, usize) {
    let mut rng = Rng(seed);
    let (mut done, mut conflicts) = (0, 0);
    for op in 0..ops {
        let key = key_of(rng.below(60));
        let value = format!("s{seed}-op{op}");
        let got = c.get(key.clone(), None).await.expect("get");
        let Some(kv) = got.kvs().first() else {
            let lease = if rng.below(4) == 0 {
                c.lease_grant(2, None).await.expect("grant").id()
            } else {
                0
            };
            if create(&mut c, &key, &value, lease).await {
                done += 1;
            } else {
                conflicts += 1;
            }
            continue;
        };
        let rev = kv.mod_revision();
        let guard = Compare::mod_revision(key.clone(), CompareOp::Equal, rev);
        let then = if rng.below(4) == 0 {
            TxnOp::delete(key.clone(), None)
        } else {
            // An update keeps the key's lease, as kube-apiserver does for TTL objects.
            let lease = kv.lease();
            TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )
        };
        let txn = Txn::new()
            .when([guard])
            .and_then([then])
            .or_else([TxnOp::get(key.clone(), None)]);
        match c.txn(txn).await {
            Ok(r) if r.succeeded() => done += 1,
            Ok(r) => {
                conflicts += 1;
                assert!(matches!(
                    r.op_responses().first(),
                    Some(TxnOpResponse::Get(_))
                ));
            }
            // The key's lease expired between the read and the update.
            Err(e) if e.to_string().contains("requested lease not found") => conflicts += 1,
            Err(e) => panic!("update txn: {e:?}"),
        }
    }
    (done, conflicts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_list_watch_consumer_matches_the_store() {
    const WRITERS: u64 = 4;
    const OPS_PER_WRITER: usize = 100;
    let seed: u64 = std::env::var("KEEL_KUBE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_130);
    eprintln!("kubernetes consumer: seed {seed} (KEEL_KUBE_SEED to replay)");
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    for i in 0..40 {
        assert!(create(&mut c, &key_of(i), "initial", 0).await);
    }
    let mut view = list(&mut c, 7).await;
    assert_eq!(view.objects.len(), 40);
    let listed_at = view.revision;

    let writers_done = Arc::new(AtomicBool::new(false));
    let final_rev = Arc::new(AtomicI64::new(0));
    let driver = {
        let (c, writers_done, final_rev) = (c.clone(), writers_done.clone(), final_rev.clone());
        tokio::spawn(async move {
            let mut tasks = Vec::new();
            for w in 0..WRITERS {
                tasks.push(tokio::spawn(writer(c.clone(), seed + w, OPS_PER_WRITER)));
            }
            let mut writes = 0;
            for t in tasks {
                writes += t.await.expect("writer task").0;
            }
            writers_done.store(true, Ordering::SeqCst);
            // Wait until every short lease expired, so the final state includes the deletes.
            let mut c = c;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let leases = c.leases().await.expect("leases");
                if leases.leases().is_empty() {
                    break;
                }
                assert!(Instant::now() < deadline, "leases never expired");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let fin = c
                .get(PREFIX, Some(GetOptions::new().with_range(PREFIX_END)))
                .await
                .expect("final range");
            let rev = fin.header().expect("header").revision();
            let objects: BTreeMap<Vec<u8>, Obj> = fin
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        kv.key().to_vec(),
                        Obj {
                            value: kv.value().to_vec(),
                            mod_revision: kv.mod_revision(),
                        },
                    )
                })
                .collect();
            final_rev.store(rev, Ordering::SeqCst);
            (objects, rev, writes)
        })
    };

    // Watch for a while, drop the connection's stream mid-way, and resume from revision + 1.
    consume(&mut c, &mut view, |v| {
        v.log.len() >= 60 || writers_done.load(Ordering::SeqCst)
    })
    .await;
    let before_disconnect = view.log.len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c2 = client(&server).await;
    consume(&mut c2, &mut view, |v| {
        let target = final_rev.load(Ordering::SeqCst);
        target > 0 && v.revision >= target
    })
    .await;
    let (objects, rev, writes) = driver.await.expect("driver task");
    eprintln!(
        "kubernetes consumer: {writes} guarded writes, {} events ({} before the disconnect), \
         {} progress replies, final revision {rev}",
        view.log.len(),
        before_disconnect,
        view.progress_replies
    );
    assert!(before_disconnect > 0 && view.log.len() > before_disconnect);
    assert!(
        view.log.iter().any(|(_, _, delete)| *delete),
        "the run had no deletes"
    );
    assert_eq!(view.revision, rev);
    assert_eq!(
        view.objects, objects,
        "the consumer's view differs from the store"
    );

    // Event for event: an uninterrupted watch from the list revision sees the same sequence.
    let mut reference = View {
        revision: listed_at,
        ..View::default()
    };
    reference.objects = list_at(&mut c, listed_at).await;
    consume(&mut c, &mut reference, |v| v.revision >= rev).await;
    assert_eq!(reference.log, view.log);
}

/// The prefix's objects at an older revision.
async fn list_at(c: &mut Client, revision: i64) -> BTreeMap<Vec<u8>, Obj> {
    let r = c
        .get(
            PREFIX,
            Some(
                GetOptions::new()
                    .with_range(PREFIX_END)
                    .with_revision(revision),
            ),
        )
        .await
        .expect("range at a revision");
    r.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                Obj {
                    value: kv.value().to_vec(),
                    mod_revision: kv.mod_revision(),
                },
            )
        })
        .collect()
}
