//! Tests beside the code: data-driven scenarios, a model-based property test, checkpoint round
//! trips and damage, and a concurrency test.

mod checkpoint;
mod concurrency;
mod delta;
mod history;
mod model;
mod on_disk;
mod scenario;
mod space;
mod split;
mod steps;

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::{CompactionRequest, Op, Writer};

/// What the server's driver does, against a map: each sealed segment's records, padded to a
/// 4 KiB block as O_DIRECT writes it, become the segment's "file", and the values move into
/// it.
fn write_sealed(w: &mut Writer, disk: &mut BTreeMap<u32, Bytes>) {
    for sealed in w.take_sealed_segments() {
        let mut file: Vec<u8> = sealed.records.to_vec();
        assert_eq!(file.len() as u64, sealed.bytes);
        file.resize(file.len().next_multiple_of(4096), 0);
        let file = Bytes::from(file);
        disk.insert(sealed.id, file.clone());
        w.segment_durable(sealed.id, sealed.bytes, file);
    }
    assert_eq!(w.sealed_backlog_bytes(), 0);
}

/// Applies, as raft entry `index`, a compaction at `revision` (its steps are the caller's).
fn compact(w: &mut Writer, index: u64, revision: i64) {
    w.apply(
        index,
        &Op::Compact(CompactionRequest {
            revision,
            physical: false,
        }),
    )
    .unwrap();
}

/// An apply that writes more events than `apply_bounded` may keep hands out none, says so,
/// still counts every write, and leaves the revision to history reads, which give every
/// event; one under the bound keeps all of its events.
#[test]
fn an_apply_past_its_event_bound_leaves_the_events_to_history() {
    use crate::{DeleteRangeRequest, EventKind, PutRequest, Store, WriteCounts};
    let put = |i: u64| {
        Op::Put(PutRequest {
            key: Bytes::from(format!("k{i}")),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        })
    };
    let (mut w, r) = Store::new();
    for i in 0..5u64 {
        let applied = w.apply_bounded(i + 1, &put(i), 3).expect("put");
        assert!(!applied.events_cut);
        assert_eq!(applied.events.len(), 1);
        assert_eq!(
            applied.counts,
            WriteCounts {
                puts: 1,
                created: 1,
                deletes: 0
            }
        );
    }
    let delete = Op::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(b"k"),
        range_end: Bytes::from_static(b"l"),
        ..Default::default()
    });
    let applied = w.apply_bounded(6, &delete, 3).expect("delete");
    assert!(applied.events_cut);
    assert!(applied.events.is_empty());
    assert_eq!(applied.counts.deletes, 5);
    let rev = w.current_revision();
    let history = r.range_events(rev, b"k", b"l", 100).expect("not compacted");
    assert_eq!(history.events.len(), 5);
    assert!(history
        .events
        .iter()
        .all(|e| e.kind == EventKind::Delete && e.kv.mod_revision == rev));
    // Exactly at the bound, every event is kept.
    let (mut w, _r) = Store::new();
    for i in 0..3u64 {
        w.apply(i + 1, &put(i)).expect("put");
    }
    let applied = w.apply_bounded(4, &delete, 3).expect("delete");
    assert!(!applied.events_cut);
    assert_eq!(applied.events.len(), 3);
}

/// A store with lease 7 granted at index 1 and keys k0..k9 put at indexes 2..11, those for
/// which `leased(i)` holds attached to the lease.
fn store_with_leased_keys(leased: fn(u64) -> bool) -> (Writer, crate::Reader) {
    use crate::{LeaseGrantRequest, PutRequest, Store};
    let (mut w, r) = Store::new();
    w.apply(1, &Op::LeaseGrant(LeaseGrantRequest { ttl_s: 60, id: 7 }))
        .expect("grant");
    for i in 0..10u64 {
        let put = Op::Put(PutRequest {
            key: Bytes::from(format!("k{i}")),
            value: Bytes::from_static(b"v"),
            lease: if leased(i) { 7 } else { 0 },
            ..Default::default()
        });
        w.apply(i + 2, &put).expect("put");
    }
    (w, r)
}

/// Applies `op` as the raft core does, `keys_max` keys per call, running `between` before each
/// call after the first (while the entry is part applied); its outcome and the calls made.
fn apply_stepping(
    w: &mut Writer,
    index: u64,
    op: &Op,
    (events_max, keys_max): (usize, usize),
    mut between: impl FnMut(&mut Writer, &crate::ApplyInSteps),
) -> (crate::Result<crate::Applied>, usize) {
    let mut progress = w.apply_in_steps(index, op, events_max, keys_max);
    let mut calls = 1;
    loop {
        match progress {
            crate::Progress::Done(applied) => return (applied, calls),
            crate::Progress::More(rest) => {
                between(w, &rest);
                progress = w.apply_step(rest, keys_max);
                calls += 1;
            }
        }
    }
}

/// A range delete applied in steps ends as one applied whole: the same answer, events and
/// counts, the same history, and its keys' leases let go of them. Until the last step no
/// reader sees any of it and the entry is not applied; the event bound holds across steps.
#[test]
fn a_range_delete_in_steps_ends_as_the_same_delete_applied_whole() {
    use crate::{DeleteRangeRequest, Progress, RangeRequest};
    let setup = || store_with_leased_keys(|i| i % 2 == 0);
    let delete = |prev_kv| {
        Op::DeleteRange(DeleteRangeRequest {
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"l"),
            prev_kv,
        })
    };
    let all = RangeRequest {
        key: Bytes::from_static(b"k"),
        range_end: Bytes::from_static(b"l"),
        ..Default::default()
    };
    for (prev_kv, events_max) in [(true, usize::MAX), (false, 4)] {
        let (mut whole, _) = setup();
        let expected = whole.apply_bounded(12, &delete(prev_kv), events_max);
        let (mut w, r) = setup();
        let before = r.range(&all).expect("readable");
        let size_before = r.size_bytes_published();
        let (applied, steps) =
            apply_stepping(&mut w, 12, &delete(prev_kv), (events_max, 3), |w, rest| {
                assert_eq!(rest.raft_index(), 12);
                assert_eq!(w.applied_index(), 11, "applied only once complete");
                assert_eq!(r.current_revision(), 11);
                assert_eq!(r.range(&all).expect("readable"), before);
                // Nor does the size count the steps' writes before the last.
                w.publish_size();
                assert_eq!(r.size_bytes_published(), size_before);
                assert!(w.size_bytes() > size_before);
            });
        assert_eq!(steps, 4, "ten keys, three per step");
        assert_eq!(applied, expected);
        let applied = applied.expect("delete");
        assert_eq!(applied.counts.deletes, 10);
        assert_eq!(applied.events_cut, events_max < 10);
        assert_eq!((w.applied_index(), w.stepping()), (12, None));
        assert_eq!(r.size_bytes_published(), w.size_bytes());
        assert_eq!(r.range(&all).expect("readable").count, 0);
        assert_eq!(r.hash_kv(0), whole.reader().hash_kv(0));
        assert_eq!(
            w.lease(7).expect("lease").keys,
            whole.lease(7).expect("lease").keys
        );
        assert!(w.lease(7).expect("lease").keys.is_empty());
    }
    // Anything but a range delete is applied whole.
    let (mut w, _) = setup();
    let single = Op::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(b"k1"),
        ..Default::default()
    });
    assert!(matches!(
        w.apply_in_steps(12, &single, usize::MAX, 1),
        Progress::Done(Ok(_))
    ));
    assert_eq!(w.applied_index(), 12);
}

/// While an entry is applied in steps nothing else may change the store or capture it.
#[test]
fn nothing_else_is_applied_while_an_entry_is_applied_in_steps() {
    use crate::{DeleteRangeRequest, Progress, PutRequest, Store};
    let started = || {
        let (mut w, _) = Store::new();
        for i in 0..4u64 {
            let put = Op::Put(PutRequest {
                key: Bytes::from(format!("k{i}")),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            });
            w.apply(i + 1, &put).expect("put");
        }
        let delete = Op::DeleteRange(DeleteRangeRequest {
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"l"),
            prev_kv: false,
        });
        let Progress::More(rest) = w.apply_in_steps(5, &delete, usize::MAX, 1) else {
            panic!("four keys take four steps");
        };
        (w, rest)
    };
    let panics = |f: &dyn Fn(&mut Writer)| {
        let (mut w, _rest) = started();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut w))).is_err()
    };
    assert!(panics(&|w| w.apply_empty(6)));
    assert!(panics(&|w| {
        let _ = w.apply(
            6,
            &Op::Put(PutRequest {
                key: Bytes::from_static(b"x"),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            }),
        );
    }));
    assert!(panics(&|w| {
        let _ = w.checkpoint_source();
    }));
    assert!(panics(&|w| {
        let _ = w.compact_step(1);
    }));
}

/// A revoke of a lease with many keys is applied in steps too, and ends as the revoke applied
/// whole: the same answer, events and hash, and the lease gone only at the last step.
#[test]
fn a_lease_revoke_in_steps_ends_as_the_revoke_applied_whole() {
    use crate::{LeaseRevokeRequest, Progress};
    let setup = || store_with_leased_keys(|_| true);
    let revoke = Op::LeaseRevoke(LeaseRevokeRequest { id: 7 });
    let (mut whole, _) = setup();
    let expected = whole.apply(12, &revoke);
    let (mut w, r) = setup();
    let (applied, steps) = apply_stepping(&mut w, 12, &revoke, (usize::MAX, 4), |w, _| {
        assert!(w.lease(7).is_some(), "the lease goes at the last step");
        assert_eq!((w.applied_index(), r.current_revision()), (11, 11));
    });
    assert_eq!(steps, 3, "ten keys, four per step");
    assert_eq!(applied, expected);
    assert_eq!(applied.expect("revoke").events.len(), 10);
    assert!(w.lease(7).is_none());
    assert_eq!(r.hash_kv(0), whole.reader().hash_kv(0));
    // An unknown lease is refused whole, as before.
    let (mut w, _) = setup();
    let unknown = Op::LeaseRevoke(LeaseRevokeRequest { id: 8 });
    assert!(matches!(
        w.apply_in_steps(12, &unknown, usize::MAX, 4),
        Progress::Done(Err(crate::KvError::LeaseNotFound))
    ));
}

/// A txn whose chosen ops hold a range delete is applied in steps too, its puts counting one
/// key each and its range reads the keys they walk, and ends as the txn applied whole: the
/// same nested answer (a range after the delete reading its own writes), events, hash and
/// leases. A txn whose compares chose no walk of a range, or that its checks refuse, is
/// applied whole.
#[test]
fn a_txn_holding_a_range_delete_in_steps_ends_as_the_txn_applied_whole() {
    use crate::{
        Compare, CompareResult, CompareTarget, DeleteRangeRequest, Progress, PutRequest,
        RangeRequest, RequestOp, TxnRequest,
    };
    let setup = || store_with_leased_keys(|i| i % 2 == 0);
    let range = |key: &'static [u8], end: &'static [u8]| {
        RequestOp::Range(RangeRequest {
            key: Bytes::from_static(key),
            range_end: Bytes::from_static(end),
            ..Default::default()
        })
    };
    // k0 was put at revision 2: the compare holds while nothing moved it.
    let txn = |k0_mod: i64, lease: i64| {
        Op::Txn(TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal,
                target: CompareTarget::Mod(k0_mod),
                key: Bytes::from_static(b"k0"),
                range_end: Bytes::new(),
            }],
            success: vec![
                RequestOp::Put(PutRequest {
                    key: Bytes::from_static(b"a"),
                    value: Bytes::from_static(b"before"),
                    lease,
                    ..Default::default()
                }),
                RequestOp::Txn(TxnRequest {
                    compare: vec![],
                    success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                        key: Bytes::from_static(b"k"),
                        range_end: Bytes::from_static(b"l"),
                        prev_kv: true,
                    })],
                    failure: vec![],
                }),
                range(b"k", b"l"),
                RequestOp::Put(PutRequest {
                    key: Bytes::from_static(b"z"),
                    value: Bytes::from_static(b"after"),
                    ..Default::default()
                }),
            ],
            failure: vec![range(b"k0", b"")],
        })
    };
    let (mut whole, _) = setup();
    let expected = whole.apply(12, &txn(2, 0));
    let (mut w, r) = setup();
    let before = r.range(&RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..Default::default()
    });
    let (applied, steps) = apply_stepping(&mut w, 12, &txn(2, 0), (usize::MAX, 3), |w, _| {
        assert_eq!((w.applied_index(), r.current_revision()), (11, 11));
        assert_eq!(
            r.range(&RangeRequest {
                key: Bytes::from_static(b"\0"),
                range_end: Bytes::from_static(b"\0"),
                ..Default::default()
            }),
            before,
            "no reader sees a step's writes"
        );
    });
    // Three keys a step: the put, the delete's walk over ten keys, the range's walk over the
    // same ten (tombstones now), then the last put: 1 + 10 + 10 + 1 = 22 keys in 8 steps.
    assert_eq!(steps, 8);
    assert_eq!(applied, expected);
    let applied = applied.expect("txn");
    assert_eq!((applied.counts.puts, applied.counts.deletes), (2, 10));
    let crate::OpResponse::Txn(resp) = applied.response.check() else {
        panic!("a txn answer")
    };
    assert!(resp.succeeded);
    assert_eq!(resp.revision, 12);
    let crate::ResponseOp::Txn(inner) = &resp.responses[1] else {
        panic!("the nested txn's answer")
    };
    let crate::ResponseOp::DeleteRange(deleted) = &inner.responses[0] else {
        panic!("the delete's answer")
    };
    assert_eq!((deleted.deleted, deleted.prev_kvs.len()), (10, 10));
    let crate::ResponseOp::Range(after) = &resp.responses[2] else {
        panic!("the range's answer")
    };
    assert_eq!(after.count, 0, "the range reads the txn's own deletes");
    assert_eq!((w.applied_index(), w.stepping()), (12, None));
    assert_eq!(r.hash_kv(0), whole.reader().hash_kv(0));
    assert!(w.lease(7).expect("lease").keys.is_empty());

    // The failure branch deletes nothing: applied whole, in one call.
    let (mut w, _) = setup();
    let Progress::Done(Ok(failed)) = w.apply_in_steps(12, &txn(3, 0), usize::MAX, 1) else {
        panic!("applied whole")
    };
    let crate::OpResponse::Txn(resp) = failed.response.check() else {
        panic!("a txn answer")
    };
    assert!(!resp.succeeded);
    assert_eq!(w.applied_index(), 12);
    // A refused txn (its put names an unknown lease) is refused whole, and changes nothing.
    let (mut w, r) = setup();
    assert!(matches!(
        w.apply_in_steps(12, &txn(2, 99), usize::MAX, 1),
        Progress::Done(Err(crate::KvError::LeaseNotFound))
    ));
    assert_eq!(
        (w.applied_index(), w.stepping(), r.current_revision()),
        (12, None, 11)
    );
}

/// A txn's compares of ranges and its reads of ranges walk their keys in steps too: over a
/// million keys each held the raft core for 0.3-0.5 s in one call. Compares are decided in
/// etcd's order (the outer ones, then those of the nested txns on the branch they chose,
/// all on the state before the txn), a compare that fails stops its walk, and the answer,
/// its sorted and limited ranges included, is the one the txn applied whole gives. Nothing
/// is seen before the last step, and a txn its checks refuse after its compares were
/// decided in steps is refused whole.
#[test]
fn a_txns_compares_and_reads_of_ranges_walk_their_keys_in_steps() {
    use crate::{
        Compare, CompareResult, CompareTarget, PutRequest, RangeRequest, RequestOp, SortOrder,
        SortTarget, TxnRequest,
    };
    let setup = || store_with_leased_keys(|i| i % 2 == 0);
    // k0..k9 hold "v", put at revisions 2..11.
    let every = |target: CompareTarget, result: CompareResult| Compare {
        result,
        target,
        key: Bytes::from_static(b"k"),
        range_end: Bytes::from_static(b"l"),
    };
    let put_k3 = |lease: i64| {
        RequestOp::Put(PutRequest {
            key: Bytes::from_static(b"k3"),
            value: Bytes::from_static(b"w"),
            lease,
            ..Default::default()
        })
    };
    let txn = |lease: i64| {
        Op::Txn(TxnRequest {
            // Holds: ten keys visited, their values read.
            compare: vec![every(
                CompareTarget::Value(Bytes::from_static(b"v")),
                CompareResult::Equal,
            )],
            success: vec![
                put_k3(lease),
                RequestOp::Txn(TxnRequest {
                    // Fails at k3, the fourth key (modified at revision 5), on the state
                    // before the txn: the put of k3 before it does not count.
                    compare: vec![every(CompareTarget::Mod(5), CompareResult::Less)],
                    success: vec![],
                    // Reads the txn's own put: the newest three by modification, of ten.
                    failure: vec![RequestOp::Range(RangeRequest {
                        key: Bytes::from_static(b"k"),
                        range_end: Bytes::from_static(b"l"),
                        sort_target: SortTarget::Mod,
                        sort_order: SortOrder::Descend,
                        limit: 3,
                        ..Default::default()
                    })],
                }),
                RequestOp::Range(RangeRequest {
                    key: Bytes::from_static(b"k"),
                    range_end: Bytes::from_static(b"l"),
                    count_only: true,
                    ..Default::default()
                }),
            ],
            failure: vec![],
        })
    };
    let (mut whole, _) = setup();
    let expected = whole.apply(12, &txn(0));
    let (mut w, r) = setup();
    let all = RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..Default::default()
    };
    let before = r.range(&all);
    let (applied, steps) = apply_stepping(&mut w, 12, &txn(0), (usize::MAX, 3), |w, _| {
        assert_eq!((w.applied_index(), r.current_revision()), (11, 11));
        assert_eq!(r.range(&all), before, "no reader sees a step's writes");
    });
    // Keys visited at three a step: the outer compare's ten, the nested compare's four, the
    // put, the sorted range's ten and the count's ten: 35 in 12 steps.
    assert_eq!(steps, 12);
    assert_eq!(applied, expected);
    let crate::OpResponse::Txn(resp) = applied.expect("txn").response.check() else {
        panic!("a txn answer")
    };
    assert!(resp.succeeded);
    assert_eq!(resp.revision, 12);
    let crate::ResponseOp::Txn(nested) = &resp.responses[1] else {
        panic!("the nested txn's answer")
    };
    assert!(!nested.succeeded, "the nested compare fails at k3");
    let crate::ResponseOp::Range(newest) = &nested.responses[0] else {
        panic!("the sorted range's answer")
    };
    let keys: Vec<&[u8]> = newest.kvs.iter().map(|kv| kv.key.as_ref()).collect();
    assert_eq!(keys, [&b"k3"[..], b"k9", b"k8"]);
    assert_eq!((newest.count, newest.more), (10, true));
    let crate::ResponseOp::Range(counted) = &resp.responses[2] else {
        panic!("the count's answer")
    };
    assert_eq!((counted.count, counted.kvs.len()), (10, 0));
    assert_eq!((w.applied_index(), w.stepping()), (12, None));
    assert_eq!(r.hash_kv(0), whole.reader().hash_kv(0));

    // Its put names an unknown lease: refused once the compares are decided, in steps,
    // and nothing changes.
    let (mut w, r) = setup();
    let (refused, _) = apply_stepping(&mut w, 12, &txn(99), (usize::MAX, 3), |_, _| {});
    assert!(matches!(refused, Err(crate::KvError::LeaseNotFound)));
    let (mut whole, _) = setup();
    assert_eq!(refused, whole.apply(12, &txn(99)));
    assert_eq!(
        (w.applied_index(), w.stepping(), r.current_revision()),
        (12, None, 11)
    );
    assert_eq!(r.range(&all), before);
}

/// A put that keeps a key's value (or lease) after a delete of the same txn removed the key
/// finds it missing, and the txn is refused whole ("key not found"), as when the key was
/// never there: checked against the state before the txn it passed, and its apply then
/// panicked (on every member). etcd's duplicate-key check lets such txns through when the
/// delete runs to "\0" (it compares that end literally).
#[test]
fn a_put_keeping_the_value_of_a_key_its_txn_deleted_is_refused() {
    use crate::{
        DeleteRangeRequest, KvError, PutRequest, RequestOp, Store, TxnRequest, MAX_TXN_OPS_DEFAULT,
    };
    let (mut w, r) = Store::new();
    for (i, key) in ["a", "b"].into_iter().enumerate() {
        let put = Op::Put(PutRequest {
            key: Bytes::from(key),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        });
        w.apply(i as u64 + 1, &put).expect("put");
    }
    let keep_b = |ignore_value, ignore_lease| {
        RequestOp::Put(PutRequest {
            key: Bytes::from_static(b"b"),
            ignore_value,
            ignore_lease,
            value: if ignore_value {
                Bytes::new()
            } else {
                Bytes::from_static(b"w")
            },
            ..Default::default()
        })
    };
    let from_a = RequestOp::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(b"a"),
        range_end: Bytes::from_static(b"\0"),
        prev_kv: false,
    });
    let txns = [
        vec![from_a.clone(), keep_b(true, false)],
        vec![from_a, keep_b(false, true)],
    ];
    for (i, success) in txns.into_iter().enumerate() {
        let txn = TxnRequest {
            compare: vec![],
            success,
            failure: vec![],
        };
        crate::validate_txn(&txn, MAX_TXN_OPS_DEFAULT).expect("etcd lets it through");
        // Applied as the raft core applies it: in steps, where it deletes a range.
        assert!(
            matches!(
                w.apply_in_steps(10 + i as u64, &Op::Txn(txn), usize::MAX, 1),
                crate::Progress::Done(Err(KvError::KeyNotFound))
            ),
            "txn {i}"
        );
        assert_eq!(r.current_revision(), 3, "nothing changed");
    }
    // A put of a key the txn deleted, keeping nothing, still applies (etcd allows it).
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::DeleteRange(DeleteRangeRequest {
                key: Bytes::from_static(b"a"),
                range_end: Bytes::from_static(b"\0"),
                prev_kv: false,
            }),
            keep_b(false, false),
        ],
        failure: vec![],
    };
    w.apply(20, &Op::Txn(txn)).expect("applies");
    assert_eq!(r.current_revision(), 4);
}

/// A watch event's previous state is the key as it stood at the revision before the
/// event's, as etcd reads it: within a txn that wrote the key before (a put, then a delete
/// to "\0" that etcd's duplicate-key check lets through; a delete, then a put), the events
/// carry the state before the txn, both as applied and from history.
#[test]
fn watch_events_in_a_txn_carry_the_state_before_the_txn() {
    use crate::{DeleteRangeRequest, EventKind, PutRequest, RequestOp, Store, TxnRequest};
    let (mut w, r) = Store::new();
    let put = |key: &'static [u8], value: &'static [u8]| PutRequest {
        key: Bytes::from_static(key),
        value: Bytes::from_static(value),
        ..Default::default()
    };
    w.apply(1, &Op::Put(put(b"w/old", b"before"))).expect("put");
    let from_w = RequestOp::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(b"w/"),
        range_end: Bytes::from_static(b"\0"),
        prev_kv: true,
    });
    // Revision 3: put w/new and overwrite w/old, then delete everything from w/.
    let txn = Op::Txn(TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::Put(put(b"w/new", b"new")),
            RequestOp::Put(put(b"w/old", b"mid")),
            from_w.clone(),
        ],
        failure: vec![],
    });
    crate::validate_txn(
        match &txn {
            Op::Txn(t) => t,
            _ => unreachable!(),
        },
        crate::MAX_TXN_OPS_DEFAULT,
    )
    .expect("etcd lets it through");
    let applied = w.apply(2, &txn).expect("txn");
    let prev_value = |e: &crate::Event| {
        e.prev_kv
            .clone()
            .map(|p| (p.mod_revision(), p.checked().value))
    };
    let deletes: Vec<_> = applied
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Delete)
        .map(|e| (e.kv.key.clone(), prev_value(e)))
        .collect();
    let expected = vec![
        (Bytes::from_static(b"w/new"), None),
        (
            Bytes::from_static(b"w/old"),
            Some((2, Bytes::from_static(b"before"))),
        ),
    ];
    assert_eq!(deletes, expected, "as applied");
    // The answer still shows what the delete found: the txn's own puts.
    let crate::OpResponse::Txn(t) = applied.response.check() else {
        panic!("a txn answer")
    };
    let crate::ResponseOp::DeleteRange(d) = &t.responses[2] else {
        panic!("the delete's answer")
    };
    assert_eq!(d.prev_kvs[1].value, Bytes::from_static(b"mid"));
    let history = r.range_events(3, b"w/", b"\0", 100).expect("history");
    let deletes: Vec<_> = history
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Delete)
        .map(|e| (e.kv.key.clone(), prev_value(e)))
        .collect();
    assert_eq!(deletes, expected, "from history");

    // Revision 4: w/old back; revision 5: delete it, then put it again.
    w.apply(3, &Op::Put(put(b"w/old", b"back"))).expect("put");
    let txn = Op::Txn(TxnRequest {
        compare: vec![],
        success: vec![from_w, RequestOp::Put(put(b"w/old", b"again"))],
        failure: vec![],
    });
    let applied = w.apply(4, &txn).expect("txn");
    let put_event = applied
        .events
        .iter()
        .find(|e| e.kind == EventKind::Put)
        .expect("the put's event");
    let expected = Some((4, Bytes::from_static(b"back")));
    assert_eq!(prev_value(put_event), expected, "as applied");
    let history = r.range_events(5, b"w/", b"\0", 100).expect("history");
    let put_event = history
        .events
        .iter()
        .find(|e| e.kind == EventKind::Put)
        .expect("the put's event");
    assert_eq!(prev_value(put_event), expected, "from history");
}

/// A store applied keeping no watch events (a member without watchers) ends exactly as one
/// applied keeping them: the same answers (prev_kv included), the same counts, leases and
/// history, previous states and all. Covers a lease, ignore_lease, ignore_value, prev_kv, a
/// txn that puts one key twice and deletes another, and a delete of a range.
#[test]
fn applying_without_events_changes_the_store_as_applying_with_them() {
    use crate::{DeleteRangeRequest, LeaseGrantRequest, PutRequest, RequestOp, Store, TxnRequest};
    let put = |key: &'static str, value: &'static str, lease: i64| PutRequest {
        key: Bytes::from_static(key.as_bytes()),
        value: Bytes::from_static(value.as_bytes()),
        lease,
        ..Default::default()
    };
    let delete = |key: &'static str, range_end: &'static str| DeleteRangeRequest {
        key: Bytes::from_static(key.as_bytes()),
        range_end: Bytes::from_static(range_end.as_bytes()),
        prev_kv: true,
    };
    let ops = vec![
        Op::LeaseGrant(LeaseGrantRequest { ttl_s: 60, id: 7 }),
        Op::Put(put("a", "1", 0)),
        Op::Put(put("b", "1", 7)),
        Op::Put(PutRequest {
            prev_kv: true,
            ..put("a", "2", 7)
        }),
        Op::Put(PutRequest {
            ignore_lease: true,
            ..put("b", "2", 0)
        }),
        Op::Put(PutRequest {
            ignore_value: true,
            ..put("a", "", 0)
        }),
        Op::Put(PutRequest {
            ignore_value: true,
            ignore_lease: true,
            prev_kv: true,
            ..put("b", "", 0)
        }),
        Op::Txn(TxnRequest {
            compare: Vec::new(),
            success: vec![
                RequestOp::Put(put("c", "1", 0)),
                RequestOp::Put(PutRequest {
                    prev_kv: true,
                    ..put("c", "2", 7)
                }),
                RequestOp::DeleteRange(delete("a", "")),
            ],
            failure: Vec::new(),
        }),
        Op::Put(put("a", "3", 0)),
        Op::DeleteRange(delete("a", "z")),
        Op::Put(put("b", "4", 7)),
    ];
    let (mut with, with_reader) = Store::new();
    let (mut without, without_reader) = Store::new();
    for (i, op) in ops.iter().enumerate() {
        let index = i as u64 + 1;
        let kept = with.apply(index, op).expect("applies");
        let left = without.apply_bounded(index, op, 0).expect("applies");
        assert_eq!(kept.counts, left.counts, "op {i}");
        assert!(left.events.is_empty(), "op {i}");
        assert_eq!(left.events_cut, !kept.events.is_empty(), "op {i}");
        assert_eq!(kept.response.check(), left.response.check(), "op {i}");
    }
    assert_eq!(with.current_revision(), without.current_revision());
    assert_eq!(with.leases(), without.leases());
    let history = |reader: &crate::Reader| {
        reader
            .range_events_unchecked(1, b"a", b"z", 1000, true)
            .expect("not compacted")
            .check()
            .events
    };
    let (kept, left) = (history(&with_reader), history(&without_reader));
    assert_eq!(kept.len(), 14, "every write of the sequence");
    assert_eq!(kept, left);
}
