//! The `etcd-client` crate (tonic) against keel: KV, txn compares, old revisions, compaction
//! errors, leases, maintenance status and the member list.

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, LeaseGrantOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse,
};

use crate::common::{b64, client, grpc_error, json_keys, Server};

fn revision_of(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.expect("KV answers carry a header").revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_put_get_delete_and_old_revisions() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    let r = c.put("k", "v1", None).await.expect("put");
    assert_eq!(revision_of(r.header()), 2);
    let r = c
        .put("k", "v2", Some(PutOptions::new().with_prev_key()))
        .await
        .expect("put with prev_kv");
    let prev = r.prev_key().expect("prev_kv was asked for");
    assert_eq!(
        (prev.value(), prev.mod_revision(), prev.version()),
        (&b"v1"[..], 2, 1)
    );
    let r = c
        .put("fresh", "x", Some(PutOptions::new().with_prev_key()))
        .await
        .expect("put");
    assert!(r.prev_key().is_none(), "a new key has no prev_kv");

    let r = c.get("k", None).await.expect("get");
    assert_eq!(r.kvs().len(), 1);
    assert_eq!(
        (
            r.kvs()[0].value(),
            r.kvs()[0].version(),
            r.kvs()[0].create_revision()
        ),
        (&b"v2"[..], 2, 2)
    );
    let r = c
        .get("k", Some(GetOptions::new().with_revision(2)))
        .await
        .expect("get at revision 2");
    assert_eq!(r.kvs()[0].value(), b"v1");
    assert_eq!(
        revision_of(r.header()),
        4,
        "the header carries the current revision, not the one read"
    );
    let r = c
        .get("fresh", Some(GetOptions::new().with_revision(3)))
        .await
        .expect("get at revision 3");
    assert!(r.kvs().is_empty(), "fresh was written at revision 4");

    for i in 0..5 {
        c.put(format!("p/{i}"), format!("{}", 9 - i), None)
            .await
            .expect("put");
    }
    let r = c
        .get(
            "p/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count only");
    assert_eq!((r.count(), r.kvs().len()), (5, 0));
    let r = c
        .get(
            "p/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_limit(2),
            ),
        )
        .await
        .expect("keys only");
    assert_eq!((r.count(), r.more(), r.kvs().len()), (5, true, 2));
    assert!(
        r.kvs().iter().all(|kv| kv.value().is_empty()),
        "keys_only drops values"
    );
    let r = c
        .get(
            "p/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Value, SortOrder::Ascend)
                    .with_limit(3),
            ),
        )
        .await
        .expect("sorted by value");
    let keys: Vec<&str> = r
        .kvs()
        .iter()
        .map(|kv| kv.key_str().expect("utf-8"))
        .collect();
    assert_eq!(keys, vec!["p/4", "p/3", "p/2"]);
    let r = c
        .get(
            "p/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_min_mod_revision(7)
                    .with_serializable(),
            ),
        )
        .await
        .expect("get");
    let keys: Vec<&str> = r
        .kvs()
        .iter()
        .map(|kv| kv.key_str().expect("utf-8"))
        .collect();
    assert_eq!(
        keys,
        vec!["p/2", "p/3", "p/4"],
        "p/2 was written at revision 7"
    );
    assert_eq!(r.count(), 5, "count ignores the min/max filters");

    let r = c
        .delete(
            "p/",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .expect("delete");
    assert_eq!((r.deleted(), r.prev_kvs().len()), (5, 5));
    assert_eq!(revision_of(r.header()), 10);
    let r = c
        .delete("p/", Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("delete nothing");
    assert_eq!(
        (r.deleted(), revision_of(r.header())),
        (0, 10),
        "deleting nothing leaves the revision alone"
    );
    let r = c
        .get("p/0", Some(GetOptions::new().with_revision(9)))
        .await
        .expect("a deleted key at an old revision");
    assert_eq!(r.kvs()[0].value(), b"9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_compares_branches_and_nesting() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    // Kubernetes' create: If MOD(key) == 0 Then Put.
    let create = |val: &'static str| {
        Txn::new()
            .when([Compare::mod_revision("obj", CompareOp::Equal, 0)])
            .and_then([TxnOp::put("obj", val, None)])
            .or_else([TxnOp::get("obj", None)])
    };
    let r = c.txn(create("first")).await.expect("txn");
    assert!(r.succeeded());
    assert_eq!(revision_of(r.header()), 2);
    let r = c.txn(create("second")).await.expect("txn");
    assert!(!r.succeeded());
    assert_eq!(
        revision_of(r.header()),
        2,
        "a txn that only reads keeps the revision"
    );
    let TxnOpResponse::Get(get) = &r.op_responses()[0] else {
        panic!("expected a range response")
    };
    assert_eq!(get.kvs()[0].value(), b"first");

    // Every compare target with every result.
    c.put("a", "10", None).await.expect("put");
    let compares = [
        (Compare::version("a", CompareOp::Equal, 1), true),
        (Compare::version("a", CompareOp::Greater, 1), false),
        (Compare::create_revision("a", CompareOp::Less, 4), true),
        (Compare::mod_revision("a", CompareOp::NotEqual, 3), false),
        (Compare::value("a", CompareOp::Greater, "1"), true),
        (Compare::value("a", CompareOp::Less, "1"), false),
        (Compare::value("missing", CompareOp::Equal, ""), false),
        (Compare::lease("a", CompareOp::Equal, 0), true),
        (
            Compare::version("a", CompareOp::Greater, 0).with_prefix(),
            true,
        ),
        (
            Compare::version("a", CompareOp::Greater, 0).with_range("b"),
            true,
        ),
        (
            Compare::version("a", CompareOp::Greater, 1).with_range("z"),
            false,
        ),
    ];
    for (i, (compare, want)) in compares.into_iter().enumerate() {
        let r = c.txn(Txn::new().when([compare])).await.expect("txn");
        assert_eq!(r.succeeded(), want, "compare #{i}");
    }

    // A nested txn and a delete in one revision; inner headers carry only the revision.
    let inner = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "10")])
        .and_then([TxnOp::put("b", "from-inner", None)]);
    let r = c
        .txn(Txn::new().and_then([
            TxnOp::txn(inner),
            TxnOp::delete("obj", Some(DeleteOptions::new().with_prev_key())),
            TxnOp::get("b", None),
        ]))
        .await
        .expect("txn");
    assert!(r.succeeded());
    assert_eq!(revision_of(r.header()), 4);
    let ops = r.op_responses();
    let TxnOpResponse::Txn(nested) = &ops[0] else {
        panic!("expected a txn response")
    };
    assert!(nested.succeeded());
    let TxnOpResponse::Delete(del) = &ops[1] else {
        panic!("expected a delete response")
    };
    assert_eq!(
        (del.deleted(), del.prev_kvs()[0].value()),
        (1, &b"first"[..])
    );
    let TxnOpResponse::Get(get) = &ops[2] else {
        panic!("expected a range response")
    };
    assert_eq!(
        get.kvs()[0].value(),
        b"from-inner",
        "later ops see earlier writes of the same txn"
    );
    let header = get.header().expect("inner responses have a header");
    assert_eq!(
        (
            header.revision(),
            header.cluster_id(),
            header.member_id(),
            header.raft_term()
        ),
        (4, 0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_errors_match_etcd() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    for v in ["1", "2", "3"] {
        c.put("k", v, None).await.expect("put");
    }
    c.compact(3, None).await.expect("compact");
    let e = grpc_error(c.get("k", Some(GetOptions::new().with_revision(2))).await);
    assert_eq!(
        e,
        (
            "OutOfRange".into(),
            "etcdserver: mvcc: required revision has been compacted".into()
        )
    );
    let e = grpc_error(c.compact(3, None).await);
    assert_eq!(
        e,
        (
            "OutOfRange".into(),
            "etcdserver: mvcc: required revision has been compacted".into()
        )
    );
    let e = grpc_error(c.compact(5, None).await);
    assert_eq!(
        e,
        (
            "OutOfRange".into(),
            "etcdserver: mvcc: required revision is a future revision".into()
        )
    );
    let e = grpc_error(c.get("k", Some(GetOptions::new().with_revision(5))).await);
    assert_eq!(
        e,
        (
            "OutOfRange".into(),
            "etcdserver: mvcc: required revision is a future revision".into()
        )
    );
    let r = c
        .get("k", Some(GetOptions::new().with_revision(3)))
        .await
        .expect("the compacted revision is readable");
    assert_eq!(r.kvs()[0].value(), b"2");
    // A txn reading below the compacted revision fails the whole txn.
    let e = grpc_error(
        c.txn(Txn::new().and_then([TxnOp::get("k", Some(GetOptions::new().with_revision(1)))]))
            .await,
    );
    assert_eq!(
        e,
        (
            "OutOfRange".into(),
            "etcdserver: mvcc: required revision has been compacted".into()
        )
    );
    let r = c.hash_kv(0).await.expect("hash_kv");
    assert_eq!(r.compact_version(), 3);
    assert_ne!(r.hash(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_grant_revoke_and_errors() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    let g = c.lease_grant(60, None).await.expect("grant");
    assert!(g.id() > 0);
    assert_eq!(g.ttl(), 60);
    c.put("leased", "v", Some(PutOptions::new().with_lease(g.id())))
        .await
        .expect("put with lease");
    let r = c.get("leased", None).await.expect("get");
    assert_eq!(r.kvs()[0].lease(), g.id());
    let e = grpc_error(
        c.put("k", "v", Some(PutOptions::new().with_lease(g.id() + 1)))
            .await,
    );
    assert_eq!(
        e,
        (
            "NotFound".into(),
            "etcdserver: requested lease not found".into()
        )
    );

    let e = grpc_error(
        c.lease_grant(10, Some(LeaseGrantOptions::new().with_id(g.id())))
            .await,
    );
    assert_eq!(
        e,
        (
            "FailedPrecondition".into(),
            "etcdserver: lease already exists".into()
        )
    );
    let e = grpc_error(c.lease_grant(9_000_000_001, None).await);
    assert_eq!(
        e,
        (
            "OutOfRange".into(),
            "etcdserver: too large lease TTL".into()
        )
    );
    let mine = c
        .lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .expect("grant with an id");
    assert_eq!(mine.id(), 0x1234);

    let before = revision_of(c.get("leased", None).await.expect("get").header());
    c.lease_revoke(g.id()).await.expect("revoke");
    let r = c.get("leased", None).await.expect("get");
    assert!(r.kvs().is_empty(), "revoke deletes the attached key");
    assert_eq!(revision_of(r.header()), before + 1);
    let e = grpc_error(c.lease_revoke(g.id()).await);
    assert_eq!(
        e,
        (
            "NotFound".into(),
            "etcdserver: requested lease not found".into()
        )
    );
    c.lease_revoke(0x1234)
        .await
        .expect("revoke a lease with no keys");
    let r = c.get("leased", None).await.expect("get");
    assert_eq!(
        revision_of(r.header()),
        before + 1,
        "revoking a lease without keys writes nothing"
    );
}

/// A txn of ranges alone is answered as etcd answers one: on the member, without an entry in
/// the raft log (the raft index stays), at one revision, linearizable or serializable.
/// A read-only txn over more keys than a shard walks or sorts in one go: its compares over
/// 20,000 keys are decided a step at a time, and its range sorted by modification revision
/// is sorted off the shard's executor (past `READ_SORT_ON_SHARD_KVS_MAX`). Both branches
/// answer as the same reads made alone, and neither is written to the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_txn_comparing_and_sorting_many_keys_answers_as_its_reads_alone() {
    const KEYS: usize = 20_000;
    let server = Server::under_test(&["--max-txn-ops", "1000"]);
    let mut c = client(&server).await;
    for first in (0..KEYS).step_by(1000) {
        let ops: Vec<TxnOp> = (first..first + 1000)
            .map(|i| TxnOp::put(format!("s/{i:05}"), "v", None))
            .collect();
        c.txn(Txn::new().and_then(ops)).await.expect("txn of puts");
    }
    // The newest write, and the only key at version 2.
    c.put("s/00007", "again", None).await.expect("put");
    let sorted = || {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Mod, SortOrder::Descend)
            .with_limit(3)
    };
    let alone = c.get("s/", Some(sorted())).await.expect("get");
    let keys_of = |kvs: &[etcd_client::KeyValue]| -> Vec<Vec<u8>> {
        kvs.iter().map(|kv| kv.key().to_vec()).collect()
    };
    assert_eq!(keys_of(alone.kvs())[0], b"s/00007".to_vec());
    let index_before = c.status().await.expect("status").raft_index();
    for (compare, succeeds) in [
        (
            Compare::version("s/", CompareOp::Greater, 0).with_range("s0"),
            true,
        ),
        (
            Compare::version("s/", CompareOp::Equal, 1).with_range("s0"),
            false,
        ),
    ] {
        let r = c
            .txn(
                Txn::new()
                    .when([compare])
                    .and_then([TxnOp::get("s/", Some(sorted()))])
                    .or_else([TxnOp::get("s/00007", None)]),
            )
            .await
            .expect("txn");
        assert_eq!(r.succeeded(), succeeds);
        let TxnOpResponse::Get(got) = &r.op_responses()[0] else {
            panic!("a range's answer")
        };
        if succeeds {
            assert_eq!(keys_of(got.kvs()), keys_of(alone.kvs()));
            assert_eq!(got.count(), KEYS as i64);
            assert!(got.more());
        } else {
            assert_eq!(got.kvs()[0].value(), b"again");
        }
    }
    let index_after = c.status().await.expect("status").raft_index();
    assert_eq!(index_before, index_after, "no entry for a read-only txn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_txns_are_answered_without_the_log() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    c.put("a", "1", None).await.expect("put");
    c.put("b", "2", None).await.expect("put");
    let index_before = c.status().await.expect("status").raft_index();
    for serializable in [false, true, false] {
        let get = |key: &'static str| {
            let options = GetOptions::new();
            TxnOp::get(
                key,
                Some(if serializable {
                    options.with_serializable()
                } else {
                    options
                }),
            )
        };
        let r = c
            .txn(
                Txn::new()
                    .when([Compare::value("a", CompareOp::Equal, "1")])
                    .and_then([get("a"), get("b")])
                    .or_else([get("missing")]),
            )
            .await
            .expect("txn");
        assert!(r.succeeded());
        assert_eq!(revision_of(r.header()), 3);
        let values: Vec<Vec<u8>> = r
            .op_responses()
            .iter()
            .map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs()[0].value().to_vec(),
                other => panic!("a read-only txn answered {other:?}"),
            })
            .collect();
        assert_eq!(values, vec![b"1".to_vec(), b"2".to_vec()]);
    }
    let index_after = c.status().await.expect("status").raft_index();
    assert_eq!(index_before, index_after, "no entry for a read-only txn");
    // One that writes is proposed, as before.
    let r = c
        .txn(Txn::new().and_then([TxnOp::put("c", "3", None), TxnOp::get("a", None)]))
        .await
        .expect("txn");
    assert_eq!(revision_of(r.header()), 4);
    assert!(c.status().await.expect("status").raft_index() > index_after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_status_and_member_list() {
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    c.put("a", "1", None).await.expect("put");
    let s = c.status().await.expect("status");
    let header = s.header().expect("status has a header").clone();
    assert_eq!(header.revision(), 2);
    assert_eq!(
        s.leader(),
        header.member_id(),
        "a single member leads itself"
    );
    assert!(s.db_size() > 0, "kube-apiserver refuses a zero dbSize");
    assert!(s.raft_index() >= 2 && s.raft_term() >= 1, "{s:?}");
    let parts: Vec<u64> = s
        .version()
        .split('.')
        .map(|p| p.parse().expect("semver"))
        .collect();
    assert_eq!(parts.len(), 3, "version {}", s.version());
    assert!(parts[0] == 3 && parts[1] >= 4, "version {}", s.version());

    let m = c.member_list().await.expect("member list");
    assert_eq!(m.members().len(), 1);
    let me = &m.members()[0];
    assert_eq!(me.id(), header.member_id());
    assert_eq!(me.name(), "e2e");
    assert_eq!(me.client_urls(), [server.client_url()]);
    assert_eq!(
        me.peer_urls(),
        [format!("http://127.0.0.1:{}", server.peer_port)]
    );
    assert!(!me.is_learner());

    let a = c
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .expect("alarm list");
    assert!(a.alarms().is_empty());
    c.defragment().await.expect("defragment");
    let h = c.hash_kv(0).await.expect("hash_kv");
    assert_eq!(h.compact_version(), -1, "no compaction yet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_counted_under_their_own_method_type_and_code() {
    let server = Server::keel(&[]);
    let mut c = client(&server).await;
    // A client that goes away mid-watch (etcdctl killed): its call ends canceled.
    let mut watcher = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        // From revision 1, so the event prints even if the put lands before the watch starts.
        .args([
            "--endpoints",
            &server.endpoint(),
            "watch",
            "--rev=1",
            "metrics/key",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("etcdctl starts");
    c.put("metrics/key", "v", None).await.expect("put");
    let mut first = [0u8; 3];
    std::io::Read::read_exact(watcher.stdout.as_mut().expect("piped"), &mut first)
        .expect("the watcher prints the event");
    watcher.kill().expect("SIGKILL is delivered");
    watcher.wait().expect("etcdctl reaped");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let canceled = "grpc_server_handled_total{grpc_code=\"Canceled\",grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 1";
    loop {
        let (code, body) = server.http_get("/metrics");
        assert_eq!(code, 200);
        if body.contains(canceled) {
            assert!(body.contains("grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 1"), "{body}");
            assert!(body.contains("grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1"), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a canceled Watch is not counted as etcd counts it:\n{body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Values in durable value-log segments are read through the segments' mappings, whose
/// pages start out on disk (the segments were written with O_DIRECT): the shard hands a read
/// whose pages are missing to a pager thread, which brings them in, and the answer is whole.
/// The shards take no major faults for them (a few allowed for code pages): the disk waits
/// are the pager's. A second read finds the pages in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_values_are_brought_in_off_the_shard_and_answer_whole() {
    // About a hundred pages in seven segments: few enough that the shard asks mincore first.
    const KEYS: usize = 100;
    const VALUE_BYTES: usize = 4096;
    let server = Server::under_test(&["--value-log-segment-bytes", "65536"]);
    let mut c = client(&server).await;
    let value_of = |i: usize| vec![b'a' + (i % 26) as u8; VALUE_BYTES];
    for i in 0..KEYS {
        c.put(format!("cold/{i:04}"), value_of(i), None)
            .await
            .expect("put");
    }
    let metric = |series: &str| crate::common::metric_value(&server.http_get("/metrics").1, series);
    let paged = r#"keel_pager_reads_total{outcome="paged"}"#;
    let in_memory = r#"keel_pager_reads_total{outcome="in_memory"}"#;
    // A segment is read through its mapping once the disk has it: until then a read finds
    // it in memory. Read until one was paged.
    let shard_faults_before = crate::common::major_faults_of(server.pid(), "keel-shard");
    let mut reads = 0;
    while metric(paged) == 0 {
        assert!(reads < 50, "no read was handed to the pager");
        reads += 1;
        let r = c
            .get("cold/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("range");
        assert_eq!(r.kvs().len(), KEYS);
        for (i, kv) in r.kvs().iter().enumerate() {
            assert!(kv.value() == value_of(i).as_slice(), "value {i}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(metric("keel_pager_pages_missing_total") > 0);
    // About a hundred cold pages: a shard reading them itself took 96 major faults.
    let shard_faults =
        crate::common::major_faults_of(server.pid(), "keel-shard") - shard_faults_before;
    assert!(
        shard_faults <= 3,
        "a shard waited on the disk {shard_faults} times: {:?}",
        crate::common::major_faults_by_thread(server.pid())
    );
    let warm_before = metric(in_memory);
    let r = c.get("cold/0007", None).await.expect("get");
    assert!(r.kvs()[0].value() == value_of(7).as_slice());
    assert!(
        metric(in_memory) > warm_before,
        "the pages stayed in memory"
    );
}

/// The value cache keeps the bytes of mapped segments in memory under `--value-cache-bytes`,
/// paging out segments nobody read since its last look, and paged-out values read back whole.
/// Answers the raft core leaves unread (a txn's ranges, a put's prev_kv) are whole too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_value_cache_keeps_to_its_limit_and_paged_out_values_read_back_whole() {
    const KEYS: usize = 200;
    const VALUE_BYTES: usize = 4096;
    const LIMIT_BYTES: u64 = 128 * 1024;
    let server = Server::under_test(&[
        "--value-log-segment-bytes",
        "65536",
        "--value-cache-bytes",
        &LIMIT_BYTES.to_string(),
    ]);
    let mut c = client(&server).await;
    let value_of = |i: usize| vec![b'a' + (i % 26) as u8; VALUE_BYTES];
    for i in 0..KEYS {
        c.put(format!("cache/{i:04}"), value_of(i), None)
            .await
            .expect("put");
    }
    let metric = |series: &str| crate::common::metric_value(&server.http_get("/metrics").1, series);
    assert_eq!(metric("keel_value_cache_limit_bytes"), LIMIT_BYTES);
    let read_all = |r: etcd_client::GetResponse| {
        assert_eq!(r.kvs().len(), KEYS);
        for (i, kv) in r.kvs().iter().enumerate() {
            assert!(kv.value() == value_of(i).as_slice(), "value {i}");
        }
    };
    // Reading everything brings about 800 KiB of segments in; the cache's looks page them
    // out again. Read until one did.
    let mut reads = 0;
    while metric("keel_value_cache_paged_out_bytes_total") == 0 {
        assert!(reads < 100, "nothing was paged out in {reads} reads");
        reads += 1;
        read_all(
            c.get("cache/", Some(GetOptions::new().with_prefix()))
                .await
                .expect("range"),
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // A watch from the first put catches up through the pager, its values whole. Its reads
    // must find pages out of memory, and `keel_value_cache_resident_bytes` is what the last
    // look (one a second) saw after paging out: a look that ran while a read was still
    // bringing pages in likely left it low with the pages back in memory, and the catch-up
    // then needed no pager (this failed once on a loaded machine). So each try counts the
    // bytes paged out, reads everything (about 800 KiB, past the limit, so a look pages out
    // during the read or after it), waits for that page-out, then catches up; a catch-up
    // that found all its pages in memory is tried again. The gauge is checked as well, as a
    // sanity check of the look that paged out.
    let paged = r#"keel_pager_reads_total{outcome="paged"}"#;
    let missing = "keel_pager_pages_missing_total";
    let paged_out = "keel_value_cache_paged_out_bytes_total";
    const CATCH_UP_TRIES: usize = 5;
    for attempt in 1.. {
        let out_before = metric(paged_out);
        read_all(
            c.get("cache/", Some(GetOptions::new().with_prefix()))
                .await
                .expect("range"),
        );
        let mut looked = None;
        for _ in 0..40 {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            // One scrape for both, so they come from the same moment.
            let body = server.http_get("/metrics").1;
            let (out, resident) = (
                crate::common::metric_value(&body, paged_out),
                crate::common::metric_value(&body, "keel_value_cache_resident_bytes"),
            );
            if out > out_before {
                looked = Some(resident);
                if resident <= LIMIT_BYTES {
                    break;
                }
            }
        }
        let resident = looked.expect("a look paged out after the read");
        assert!(resident <= LIMIT_BYTES, "{resident} bytes resident");
        let missing_before = metric(missing);
        let paged_before = metric(paged);
        let mut stream = c
            .watch(
                "cache/",
                Some(
                    etcd_client::WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(2),
                ),
            )
            .await
            .expect("watch");
        let mut seen = 0;
        while seen < KEYS {
            let msg = tokio::time::timeout(std::time::Duration::from_secs(20), stream.message())
                .await
                .expect("the history arrives in time")
                .expect("the watch stream works")
                .expect("the stream stays open");
            for e in msg.events() {
                assert!(e.kv().expect("a key-value").value() == value_of(seen).as_slice());
                seen += 1;
            }
        }
        drop(stream);
        // Through the pager because mincore found pages missing, not because the read was
        // too large to ask (`RESIDENCY_PAGES_MAX`).
        if metric(paged) > paged_before && metric(missing) > missing_before {
            break;
        }
        assert!(
            attempt < CATCH_UP_TRIES,
            "the catch-up went through the pager in none of {CATCH_UP_TRIES} tries"
        );
    }
    // A range sorted by value compares paged-out values (brought in before it is read) and
    // answers them whole and in etcd's order.
    let sorted = c
        .get(
            "cache/",
            Some(GetOptions::new().with_prefix().with_sort(
                etcd_client::SortTarget::Value,
                etcd_client::SortOrder::Descend,
            )),
        )
        .await
        .expect("range");
    assert_eq!(sorted.kvs().len(), KEYS);
    for pair in sorted.kvs().windows(2) {
        assert!(pair[0].value() >= pair[1].value(), "descending by value");
    }
    for kv in sorted.kvs() {
        let i: usize = kv.key_str().unwrap()["cache/".len()..].parse().unwrap();
        assert!(kv.value() == value_of(i).as_slice(), "value of {i}");
    }
    // Values paged out answer whole: a range, a txn that writes and reads, a put's prev_kv.
    read_all(
        c.get("cache/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("range"),
    );
    let r = c
        .txn(Txn::new().and_then([
            TxnOp::put("cache/new", "n", None),
            TxnOp::get(
                "cache/",
                Some(GetOptions::new().with_prefix().with_limit(KEYS as i64)),
            ),
        ]))
        .await
        .expect("txn");
    let TxnOpResponse::Get(get) = &r.op_responses()[1] else {
        panic!("a range answers the txn's get")
    };
    read_all(get.clone());
    let r = c
        .put(
            "cache/0003",
            "over",
            Some(etcd_client::PutOptions::new().with_prev_key()),
        )
        .await
        .expect("put");
    assert!(r.prev_key().expect("existed").value() == value_of(3).as_slice());
    // Watchers asking for prev_kv get previous values in segment files whole: live (the
    // shard has the pager bring them in before it dispatches the batch) and from history
    // (among the catch-up's reads).
    let over_rev = r.header().expect("a header").revision();
    let prev_kv_watch = |start_revision: i64| {
        let mut options = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_prev_key();
        if start_revision > 0 {
            options = options.with_start_revision(start_revision);
        }
        options
    };
    let mut live = c
        .watch("cache/0005", Some(prev_kv_watch(0)))
        .await
        .expect("watch");
    c.put("cache/0005", "again", None).await.expect("put");
    async fn next_event(stream: &mut etcd_client::WatchStream) -> etcd_client::Event {
        loop {
            let msg = tokio::time::timeout(std::time::Duration::from_secs(20), stream.message())
                .await
                .expect("an event in time")
                .expect("the watch stream works")
                .expect("the stream stays open");
            if let Some(e) = msg.events().first() {
                return e.clone();
            }
        }
    }
    let e = next_event(&mut live).await;
    assert!(e.prev_kv().expect("a previous state").value() == value_of(5).as_slice());
    let mut history = c
        .watch("cache/", Some(prev_kv_watch(over_rev)))
        .await
        .expect("watch");
    let e = next_event(&mut history).await;
    assert_eq!(e.kv().expect("a key-value").key(), b"cache/0003");
    assert!(e.prev_kv().expect("a previous state").value() == value_of(3).as_slice());
}

/// A range of many megabytes (far more than one piece of `keel_grpc::PieceEncode`), most of
/// its values in sealed value-log segments, reaches etcdctl and the etcd-client crate whole and
/// in order; a limit, keys-only and a count over it still answer as etcd does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_of_many_megabytes_reaches_both_clients_whole() {
    const KEYS: usize = 600;
    const VALUE_BYTES: usize = 16 * 1024;
    let server = Server::under_test(&["--value-log-segment-bytes", "1048576"]);
    let mut c = client(&server).await;
    let value_of = |i: usize| {
        let mut v = format!("value-{i:04}-").into_bytes();
        v.resize(VALUE_BYTES, b'a' + (i % 26) as u8);
        v
    };
    for i in 0..KEYS {
        c.put(format!("big/{i:04}"), value_of(i), None)
            .await
            .expect("put");
    }
    // The etcd-client crate (tonic) takes answers of at most 4 MiB: it reads 200 values
    // (3.2 MiB, many pieces); etcdctl below reads all 9.6 MiB.
    let r = c
        .get(
            "big/",
            Some(GetOptions::new().with_prefix().with_limit(200)),
        )
        .await
        .expect("range with a limit");
    assert_eq!(
        (r.kvs().len(), r.more(), r.count()),
        (200, true, KEYS as i64)
    );
    for (i, kv) in r.kvs().iter().enumerate() {
        assert_eq!(kv.key(), format!("big/{i:04}").as_bytes());
        assert!(kv.value() == value_of(i).as_slice(), "value {i}");
        assert_eq!(kv.mod_revision(), i as i64 + 2);
    }
    let r = c
        .get(
            "big/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("keys only");
    assert_eq!(r.kvs().len(), KEYS);
    assert!(r.kvs().iter().all(|kv| kv.value().is_empty()));

    let out = server
        .etcdctl(&["get", "--prefix", "big/", "--print-value-only"])
        .ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), KEYS);
    for (i, line) in lines.iter().enumerate() {
        assert!(
            line.as_bytes() == value_of(i).as_slice(),
            "etcdctl value {i}"
        );
    }
    let out = server
        .etcdctl(&["get", "--prefix", "big/", "-w", "json"])
        .ok();
    let json = out.json();
    assert_eq!(json["count"], KEYS);
    assert_eq!(json["kvs"].as_array().map(Vec::len), Some(KEYS));

    // The same reads inside a txn: its answer goes out piece by piece too. etcdctl reads all
    // 9.6 MiB twice over (a whole get and a limited one) beside a write.
    let out = server
        .etcdctl_stdin(
            &["txn", "-i", "-w", "json"],
            "\nget big/ --prefix\nput after-txn yes\nget big/ --prefix --limit 5\n\n\n",
        )
        .ok();
    let json = out.json();
    assert_eq!(json["succeeded"], true);
    let responses = json["responses"].as_array().expect("responses");
    assert_eq!(responses.len(), 3);
    let range = &responses[0]["Response"]["ResponseRange"];
    assert_eq!(range["count"], KEYS);
    let kvs = range["kvs"].as_array().expect("kvs");
    assert_eq!(kvs.len(), KEYS);
    let limited = &responses[2]["Response"]["ResponseRange"];
    assert_eq!(limited["more"], true);
    assert_eq!(limited["kvs"].as_array().map(Vec::len), Some(5));
    // Through the etcd-client crate, under its 4 MiB limit: 200 values and the keys of all.
    let r = c
        .txn(Txn::new().and_then([
            TxnOp::get(
                "big/",
                Some(GetOptions::new().with_prefix().with_limit(200)),
            ),
            TxnOp::get(
                "big/",
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
        ]))
        .await
        .expect("a txn of two ranges");
    assert!(r.succeeded());
    let ranges: Vec<_> = r
        .op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(g) => g,
            other => panic!("a get answered {other:?}"),
        })
        .collect();
    assert_eq!(ranges[0].kvs().len(), 200);
    for (i, kv) in ranges[0].kvs().iter().enumerate() {
        assert!(kv.value() == value_of(i).as_slice(), "txn value {i}");
    }
    assert_eq!(ranges[1].kvs().len(), KEYS);
}

/// A range of more keys than a range holds at once (`convert::RANGE_FIRST_KVS_MAX`, 10,000):
/// the rest is read from the store a batch at a time while the answer is sent. Both clients
/// get every key in order with its value, at the latest revision and at an older one after
/// the keys of the rest were overwritten and deleted, and limit, keys-only and count answer as
/// etcd does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_of_more_keys_than_it_holds_at_once_reaches_both_clients_whole() {
    const KEYS: usize = 25_000;
    const PER_TXN: usize = 100;
    let server = Server::under_test(&["--value-log-segment-bytes", "1048576"]);
    let mut c = client(&server).await;
    let key_of = |i: usize| format!("many/{i:05}");
    let value_of = |i: usize, round: &str| format!("{round}-{i:05}-{}", "v".repeat(i % 40));
    for first in (0..KEYS).step_by(PER_TXN) {
        let puts = (first..first + PER_TXN)
            .map(|i| TxnOp::put(key_of(i), value_of(i, "one"), None))
            .collect::<Vec<_>>();
        c.txn(Txn::new().and_then(puts)).await.expect("txn of puts");
    }
    let loaded = c.get(
        "many/",
        Some(GetOptions::new().with_prefix().with_count_only()),
    );
    let loaded = loaded.await.expect("count");
    assert_eq!(loaded.count(), KEYS as i64);
    let loaded_rev = revision_of(loaded.header());
    // Overwrite and delete keys that only the rest reads, after the loaded revision.
    c.txn(
        Txn::new().and_then(
            (20_000..20_050)
                .map(|i| TxnOp::put(key_of(i), value_of(i, "two"), None))
                .collect::<Vec<_>>(),
        ),
    )
    .await
    .expect("overwrite");
    c.delete(
        key_of(24_000),
        Some(DeleteOptions::new().with_range(key_of(24_100))),
    )
    .await
    .expect("delete");

    let check = |kvs: &[etcd_client::KeyValue], expect: &dyn Fn(usize) -> Option<String>| {
        let want: Vec<(String, String)> = (0..KEYS)
            .filter_map(|i| expect(i).map(|v| (key_of(i), v)))
            .collect();
        assert_eq!(kvs.len(), want.len());
        for (kv, (key, value)) in kvs.iter().zip(&want) {
            assert_eq!(kv.key_str().expect("utf-8"), key);
            assert_eq!(kv.value_str().expect("utf-8"), value);
        }
    };
    let now = |i: usize| match i {
        20_000..20_050 => Some(value_of(i, "two")),
        24_000..24_100 => None,
        _ => Some(value_of(i, "one")),
    };
    let r = c
        .get("many/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("range of all");
    assert_eq!((r.count(), r.more()), (KEYS as i64 - 100, false));
    check(r.kvs(), &now);
    let r = c
        .get(
            "many/",
            Some(GetOptions::new().with_prefix().with_revision(loaded_rev)),
        )
        .await
        .expect("range at the loaded revision");
    assert_eq!(r.count(), KEYS as i64);
    check(r.kvs(), &|i| Some(value_of(i, "one")));
    let r = c
        .get(
            "many/",
            Some(GetOptions::new().with_prefix().with_limit(20_010)),
        )
        .await
        .expect("range with a limit");
    assert_eq!(
        (r.kvs().len(), r.more(), r.count()),
        (20_010, true, KEYS as i64 - 100)
    );
    assert_eq!(
        r.kvs()[20_009].value_str().expect("utf-8"),
        value_of(20_009, "two")
    );
    let r = c
        .get(
            "many/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("keys only");
    assert_eq!(r.kvs().len(), KEYS - 100);
    assert!(r.kvs().iter().all(|kv| kv.value().is_empty()));
    assert_eq!(
        r.kvs()[KEYS - 101].key_str().expect("utf-8"),
        key_of(KEYS - 1)
    );

    let out = server
        .etcdctl(&["get", "--prefix", "many/", "-w", "json"])
        .ok();
    let json = out.json();
    assert_eq!(json["count"], KEYS - 100);
    let keys = json_keys(&json);
    assert_eq!(keys.len(), KEYS - 100);
    assert_eq!(keys.last(), Some(&key_of(KEYS - 1)));
    let last = json["kvs"]
        .as_array()
        .and_then(|kvs| kvs.last())
        .expect("a last key");
    assert_eq!(last["value"], b64(&value_of(KEYS - 1, "one")));
    let out = server
        .etcdctl(&["get", "--prefix", "many/", "--keys-only"])
        .ok();
    let keys: Vec<&str> = out.stdout.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), KEYS - 100);
    assert_eq!(keys[19_999], key_of(19_999));
    assert_eq!(keys[24_000], key_of(24_100), "the deleted keys are skipped");
}

/// A txn that overwrites a key and then deletes it with more keys than one apply step
/// visits (`limits::APPLY_KEYS_PER_STEP`, 16,384), so the raft core applies it in steps:
/// the client hears one answer for the whole txn, every key is gone, and a watcher with
/// prev_kv sees each event's key as it stood before the txn, as etcd answers (it reads an
/// event's previous state at its revision less one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_deleting_more_keys_than_a_step_answers_whole_with_etcds_prev_kv() {
    use etcd_client::{EventType, WatchOptions};
    const KEYS: usize = 17_000;
    let server = Server::under_test(&[]);
    let mut c = client(&server).await;
    c.put("w/old", "before", None).await.expect("put");
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(128) {
        let puts: Vec<TxnOp> = chunk
            .iter()
            .map(|i| TxnOp::put(format!("mass/{i:05}"), "v", None))
            .collect();
        c.txn(Txn::new().and_then(puts)).await.expect("txn of puts");
    }
    let mut watch = c
        .watch(
            "w/",
            Some(WatchOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .expect("watch");
    // Everything from "m" on, w/old included: etcd's duplicate-key check compares the end
    // "\0" literally, so the put and the delete of w/old pass it.
    let r = c
        .txn(Txn::new().and_then([
            TxnOp::put("w/old", "mid", None),
            TxnOp::delete("m", Some(DeleteOptions::new().with_from_key())),
        ]))
        .await
        .expect("the txn is answered");
    assert!(r.succeeded());
    let deleted = match &r.op_responses()[1] {
        TxnOpResponse::Delete(d) => d.deleted(),
        other => panic!("{other:?} answers no delete"),
    };
    assert_eq!(deleted, KEYS as i64 + 1);
    let left = c
        .get(
            "m",
            Some(GetOptions::new().with_from_key().with_count_only()),
        )
        .await
        .expect("count");
    assert_eq!(left.count(), 0, "whole once answered");
    let mut events = Vec::new();
    while events.len() < 2 {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(20), watch.message())
            .await
            .expect("events in time")
            .expect("the watch stream works")
            .expect("the stream stays open");
        events.extend(msg.events().iter().cloned());
    }
    assert_eq!(events.len(), 2, "{events:?}");
    for e in &events {
        let prev = e.prev_kv().expect("a previous state");
        assert_eq!(prev.value(), b"before", "{e:?}");
    }
    assert_eq!(events[0].event_type(), EventType::Put);
    assert_eq!(events[1].event_type(), EventType::Delete);
}

/// A txn answer without what differs between servers (cluster and member ids, term): the
/// branch taken, the revision, and each op's answer.
fn txn_summary(r: &etcd_client::TxnResponse) -> String {
    fn kvs(kvs: &[etcd_client::KeyValue]) -> String {
        kvs.iter()
            .map(crate::common::key_value_line)
            .collect::<Vec<_>>()
            .join(", ")
    }
    let ops: Vec<String> = r
        .op_responses()
        .iter()
        .map(|op| match op {
            TxnOpResponse::Put(p) => format!(
                "put rev {} prev [{}]",
                revision_of(p.header()),
                kvs(p
                    .prev_key()
                    .into_iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .as_slice())
            ),
            TxnOpResponse::Get(g) => format!(
                "get rev {} count {} more {} [{}]",
                revision_of(g.header()),
                g.count(),
                g.more(),
                kvs(g.kvs())
            ),
            TxnOpResponse::Delete(d) => format!(
                "delete rev {} deleted {} [{}]",
                revision_of(d.header()),
                d.deleted(),
                kvs(d.prev_kvs())
            ),
            TxnOpResponse::Txn(t) => format!("txn ({})", txn_summary(t)),
        })
        .collect();
    format!(
        "succeeded {} rev {} ops [{}]",
        r.succeeded(),
        r.header().map_or(0, |h| h.revision()),
        ops.join("; ")
    )
}

/// Compares of ranges (each key must match; an empty range compares as a zero key-value,
/// but never on VALUE) and reads of ranges in txns with writes (sorted, limited, filtered,
/// counted, keys only, reading the txn's own writes, in nested txns), against real etcd:
/// the same answers, op by op. Keel decides such compares key by key, stopping at the
/// first that fails, and reads the ranges in steps (`CompareEval`, `RangeGather`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txns_comparing_and_reading_ranges_answer_as_etcd() {
    let etcd = std::thread::spawn(|| Server::etcd(&[]));
    let keel = Server::keel(&[]);
    let etcd = etcd.join().expect("etcd starts");
    let big = 1_000_000;
    let txns: Vec<(&str, Txn)> = vec![
        (
            "every version above 0: a put, the newest three, a count",
            Txn::new()
                .when([Compare::version("r/", CompareOp::Greater, 0).with_prefix()])
                .and_then([
                    TxnOp::put("r/05", "new", None),
                    TxnOp::get(
                        "r/",
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_sort(SortTarget::Mod, SortOrder::Descend)
                                .with_limit(3),
                        ),
                    ),
                    TxnOp::get(
                        "r/",
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    ),
                ]),
        ),
        (
            "every value v00 fails at r/01: keys only, limited",
            Txn::new()
                .when([Compare::value("r/", CompareOp::Equal, "v00").with_prefix()])
                .and_then([TxnOp::put("never", "x", None)])
                .or_else([TxnOp::get(
                    "r/",
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_limit(5),
                    ),
                )]),
        ),
        (
            "a value compare on an empty range is false",
            Txn::new()
                .when([Compare::value("q/", CompareOp::Equal, "").with_prefix()])
                .and_then([TxnOp::put("never", "x", None)])
                .or_else([TxnOp::get("q/", Some(GetOptions::new().with_prefix()))]),
        ),
        (
            "a mod compare on an empty range compares a zero key-value",
            Txn::new()
                .when([Compare::mod_revision("q/", CompareOp::Equal, 0).with_prefix()])
                .and_then([
                    TxnOp::put("q/1", "one", None),
                    TxnOp::get("q/", Some(GetOptions::new().with_prefix())),
                ]),
        ),
        (
            "nested: created before big, no lease; sorted by value, filtered by mod",
            Txn::new()
                .when([Compare::create_revision("r/", CompareOp::Less, big).with_range("r/10")])
                .and_then([
                    TxnOp::put("r/02", "a-first", None),
                    TxnOp::txn(
                        Txn::new()
                            .when([Compare::lease("r/", CompareOp::Equal, 0).with_prefix()])
                            .and_then([TxnOp::get(
                                "r/",
                                Some(
                                    GetOptions::new()
                                        .with_prefix()
                                        .with_sort(SortTarget::Value, SortOrder::Ascend)
                                        .with_min_mod_revision(10),
                                ),
                            )]),
                    ),
                ]),
        ),
        (
            "every key modified before the newest revision fails at r/02: a delete, a read",
            Txn::new()
                .when([
                    Compare::version("r/", CompareOp::NotEqual, 0).with_prefix(),
                    Compare::mod_revision("r/", CompareOp::Less, 25).with_prefix(),
                ])
                .and_then([TxnOp::put("never", "x", None)])
                .or_else([
                    TxnOp::delete(
                        "r/1",
                        Some(DeleteOptions::new().with_prefix().with_prev_key()),
                    ),
                    TxnOp::get(
                        "r/",
                        Some(
                            GetOptions::new()
                                .with_from_key()
                                .with_sort(SortTarget::Create, SortOrder::Descend),
                        ),
                    ),
                ]),
        ),
        (
            "from a key to the end: versions not 0 hold over every later key",
            Txn::new()
                .when([Compare::version("r/", CompareOp::NotEqual, 0).with_range("\0")])
                .and_then([TxnOp::get(
                    "r/0",
                    Some(
                        GetOptions::new()
                            .with_range("r/09")
                            .with_max_create_revision(8),
                    ),
                )]),
        ),
    ];
    let mut answers: Vec<Vec<String>> = Vec::new();
    for server in [&etcd, &keel] {
        let mut c = client(server).await;
        // r/00..r/19 at revisions 2..21, their values distinct and out of key order (etcd
        // sorts with Go's unstable sort.Sort, so the order of equal values depends on the Go
        // release it was built with: no client can rely on it), then r/03 and r/07 again.
        for i in 0..20 {
            c.put(format!("r/{i:02}"), format!("v{:02}", (i * 7) % 20), None)
                .await
                .expect("a put");
        }
        for key in ["r/03", "r/07"] {
            c.put(key, "again", None).await.expect("a put");
        }
        let mut got = Vec::new();
        for (what, txn) in &txns {
            let r = c.txn(txn.clone()).await.expect("a txn");
            got.push(format!("{what}: {}", txn_summary(&r)));
        }
        answers.push(got);
    }
    for (want, got) in answers[0].iter().zip(&answers[1]) {
        assert_eq!(got, want, "keel (left) against etcd (right)");
    }
    // The scenario reaches both branches and every shape it names.
    let all = answers[0].join("\n");
    assert!(
        all.contains("succeeded false") && all.contains("succeeded true"),
        "{all}"
    );
}

/// A txn comparing the values of more keys than the raft core applies in one step (16,384):
/// the raft core looks at a step's keys for the values it will read, a pager thread lists and
/// brings in the rest, and the compare is decided over two steps. The answer is etcd's: it
/// holds while every value matches, and fails once one does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_txn_comparing_the_values_of_more_keys_than_a_step_answers_whole() {
    const KEYS: usize = 20_000;
    // 100-byte values: 2.5 MB of records, so most lie in durable value-log segments, whose
    // pages the pager brings in.
    let same = "s".repeat(100);
    let server = Server::keel(&[]);
    let mut c = client(&server).await;
    // 128 puts a txn (etcd's default --max-txn-ops).
    for first in (0..KEYS).step_by(128) {
        let puts: Vec<TxnOp> = (first..(first + 128).min(KEYS))
            .map(|i| TxnOp::put(format!("many/{i:05}"), same.as_str(), None))
            .collect();
        c.txn(Txn::new().and_then(puts))
            .await
            .expect("a txn of puts");
    }
    let every_is_same = || {
        Txn::new()
            .when([Compare::value("many/", CompareOp::Equal, same.as_str()).with_prefix()])
            .and_then([TxnOp::put("verdict", "all same", None)])
            .or_else([TxnOp::put("verdict", "one differs", None)])
    };
    let r = c.txn(every_is_same()).await.expect("a txn");
    assert!(r.succeeded(), "every value is the same");
    c.put(format!("many/{:05}", KEYS - 1), "other", None)
        .await
        .expect("a put");
    let r = c.txn(every_is_same()).await.expect("a txn");
    assert!(!r.succeeded(), "the last key's value differs");
    let got = c.get("verdict", None).await.expect("a get");
    assert_eq!(got.kvs()[0].value(), b"one differs");
}

/// The server turns transparent huge pages off for its process at start (BENCHMARKS.md,
/// "Transparent huge pages off"): the kernel says so in the process's status.
#[test]
fn the_server_runs_without_transparent_huge_pages() {
    let server = Server::keel(&[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid()))
        .expect("the server's status");
    assert!(
        status.contains("THP_enabled:\t0"),
        "transparent huge pages are on for the server:\n{status}"
    );
}
