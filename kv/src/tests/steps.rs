//! A range read in steps (`Reader::range_steps`), as a shard reads one between its other
//! tasks, answers exactly what one walk answers, split or whole, for seeded random stores,
//! requests and step sizes; writes between its steps change nothing it reads, and a
//! compaction past its revision fails it as compacted.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::split::{compact_to, key, put_at, random_store};
use crate::*;

/// A random request over the 60 keys of `random_store`: any range end, limit, revision,
/// sort, filter, count-only or keys-only.
fn random_request(rng: &mut StdRng, current: i64) -> RangeRequest {
    let start = rng.gen_range(0..60);
    let range_end = match rng.gen_range(0..4) {
        0 => Bytes::from_static(b"\0"),
        1 => key(rng.gen_range(start..61)),
        2 => Bytes::new(),
        _ => Bytes::from_static(b"k\xff"),
    };
    let pick = |rng: &mut StdRng, p: f64, value: i64| if rng.gen_bool(p) { value } else { 0 };
    let limit = rng.gen_range(0..40);
    let revision = rng.gen_range(0..=current);
    let min_mod = rng.gen_range(0..=current);
    let max_create = rng.gen_range(0..=current);
    RangeRequest {
        key: key(start),
        range_end,
        limit: pick(rng, 0.5, limit),
        revision: pick(rng, 0.5, revision),
        keys_only: rng.gen_bool(0.3),
        count_only: rng.gen_bool(0.2),
        sort_order: match rng.gen_range(0..5) {
            0 => SortOrder::Ascend,
            1 => SortOrder::Descend,
            _ => SortOrder::None,
        },
        sort_target: match rng.gen_range(0..6) {
            0 => SortTarget::Mod,
            1 => SortTarget::Value,
            2 => SortTarget::Version,
            _ => SortTarget::Key,
        },
        min_mod_revision: pick(rng, 0.1, min_mod),
        max_create_revision: pick(rng, 0.1, max_create),
        ..Default::default()
    }
}

/// The steps of `req` with `between` run after each one that did not reach the end; the
/// answer with its rest read out, how many steps were taken, and the shapes shown.
fn read_in_steps(
    r: &Reader,
    req: &RangeRequest,
    kvs_max: Option<usize>,
    keys_max: usize,
    mut between: impl FnMut(),
) -> (Result<RangeResponse>, usize, usize) {
    let mut steps = r.range_steps(req, kvs_max).expect("a valid read");
    let mut shapes = 0;
    let mut taken = 1;
    while !r.range_step(&mut steps, req, keys_max, &mut |_| shapes += 1) {
        between();
        taken += 1;
    }
    let answer = r.range_steps_finish(steps, req).map(|unchecked| {
        let (mut answer, rest) = unchecked.check();
        if let Some(mut rest) = rest {
            assert_eq!(rest.kvs_left(), shapes, "each owed key-value shown once");
            while rest.kvs_left() > 0 {
                answer
                    .kvs
                    .extend(r.range_rest(&mut rest, 100).expect("nothing written since"));
            }
        } else {
            assert_eq!(shapes, 0, "no rest, no shapes");
        }
        answer
    });
    (answer, taken, shapes)
}

#[test]
fn a_range_read_in_steps_answers_what_one_walk_answers() {
    let mut split_with_rest = 0;
    for seed in 0..40 {
        let (_w, r) = random_store(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x57e9);
        for _ in 0..40 {
            let req = random_request(&mut rng, r.current_revision());
            let whole = r.range(&req);
            let kvs_max = rng.gen_bool(0.5).then(|| rng.gen_range(1..8));
            let keys_max = rng.gen_range(1..6);
            let (stepped, taken, shapes) = read_in_steps(&r, &req, kvs_max, keys_max, || {});
            assert_eq!(
                stepped, whole,
                "seed {seed}, {req:?}, {kvs_max:?} / {keys_max}"
            );
            if shapes > 0 {
                split_with_rest += 1;
            }
            if let (Ok(whole), true) = (&whole, req.range_end.is_empty()) {
                assert!(whole.count <= 1);
                assert_eq!(taken, 1, "a single key is one step");
            }
        }
    }
    assert!(split_with_rest > 0, "some reads were split with a rest");
}

/// A count over every key, one key a step, takes a step per index entry: the walk really
/// stops between steps.
#[test]
fn a_count_in_steps_of_one_key_stops_at_every_key() {
    let (mut w, r) = Store::new();
    for i in 0..10 {
        put_at(&mut w, i as u64 + 1, i, b"v");
    }
    let req = RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        count_only: true,
        ..Default::default()
    };
    let (answer, taken, _) = read_in_steps(&r, &req, Some(4), 1, || {});
    assert_eq!(answer.expect("count").count, 10);
    assert_eq!(taken, 10, "ten keys, one a step");
    let (_, taken, _) = read_in_steps(&r, &req, None, 4, || {});
    assert_eq!(taken, 3, "ten keys, four a step");
}

/// Writes between the steps (puts and deletes of keys visited or not yet visited) leave the
/// answer exactly the one read before them; a compaction past the revision read at fails it
/// as compacted, and one at or below it changes nothing.
#[test]
fn writes_and_compactions_between_steps_leave_the_answer_exact_or_fail_it_as_compacted() {
    let (mut exact, mut exact_beside_compaction, mut compacted) = (0, 0, 0);
    for seed in 0..60 {
        let (mut w, r) = random_store(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0xbe51de);
        let req = RangeRequest {
            key: key(rng.gen_range(0..20)),
            range_end: Bytes::from_static(b"\0"),
            count_only: rng.gen_bool(0.3),
            limit: if rng.gen_bool(0.5) {
                rng.gen_range(1..30)
            } else {
                0
            },
            revision: if rng.gen_bool(0.3) {
                r.current_revision() - rng.gen_range(0..5)
            } else {
                0
            },
            ..Default::default()
        };
        let whole = r.range(&req).expect("whole range");
        let read_rev = if req.revision > 0 {
            req.revision
        } else {
            r.current_revision()
        };
        let compact_before = r.compact_revision();
        let mut index = 1_000;
        let kvs_max = rng.gen_bool(0.5).then(|| rng.gen_range(1..8));
        let (answer, _, _) = read_in_steps(&r, &req, kvs_max, 3, || {
            for _ in 0..rng.gen_range(0..4) {
                index += 1;
                if rng.gen_bool(0.2) {
                    w.apply(
                        index,
                        &Op::DeleteRange(DeleteRangeRequest {
                            key: key(rng.gen_range(0..60)),
                            ..Default::default()
                        }),
                    )
                    .expect("delete");
                } else {
                    put_at(&mut w, index, rng.gen_range(0..60), b"later");
                }
            }
            let top = (read_rev + 3).min(w.current_revision());
            let bottom = r.compact_revision().max(0) + 1;
            if rng.gen_bool(0.3) && bottom <= top {
                index += 1;
                let to = rng.gen_range(bottom..=top);
                compact_to(&mut w, index, to);
            }
        });
        if r.compact_revision() > read_rev {
            compacted += 1;
            assert_eq!(answer, Err(KvError::Compacted), "seed {seed}");
        } else {
            exact += 1;
            if r.compact_revision() > compact_before {
                exact_beside_compaction += 1;
            }
            assert_eq!(answer.expect("not compacted past it"), whole, "seed {seed}");
        }
    }
    assert!(
        exact_beside_compaction > 0 && compacted > 0,
        "exact {exact} ({exact_beside_compaction} beside a compaction at or below its revision), compacted {compacted}"
    );
}

/// A read-only txn of random compares and ranges read in steps, as a shard reads one,
/// answers what its ranges answer read one by one (`Reader::range`), on the branch its
/// compares choose, the first failing range's error (a revision compacted or in the
/// future) being the txn's: for stores compacted at random revisions and any step size.
#[test]
fn a_read_only_txn_in_steps_answers_what_its_ranges_answer() {
    let (mut many_steps, mut failed) = (0, 0);
    for seed in 0..40 {
        let (mut w, r) = random_store(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7e4d);
        let compacted_at = rng.gen_range(1..r.current_revision());
        compact_to(&mut w, 10_000, compacted_at);
        let current = r.current_revision();
        for _ in 0..20 {
            let ranges = |rng: &mut StdRng| -> Vec<RequestOp> {
                (0..rng.gen_range(0..4))
                    .map(|_| {
                        let mut range = random_request(rng, current);
                        if rng.gen_bool(0.1) {
                            range.revision = current + rng.gen_range(1..3);
                        }
                        RequestOp::Range(range)
                    })
                    .collect()
            };
            let compares: Vec<(Bytes, i64)> = (0..rng.gen_range(0..3))
                .map(|_| (key(rng.gen_range(0..60)), rng.gen_range(0..3)))
                .collect();
            let req = TxnRequest {
                compare: compares
                    .iter()
                    .map(|(key, version)| Compare {
                        result: CompareResult::Greater,
                        target: CompareTarget::Version(*version),
                        key: key.clone(),
                        range_end: Bytes::new(),
                    })
                    .collect(),
                success: ranges(&mut rng),
                failure: ranges(&mut rng),
            };
            // The oracle: each compare read as a range of its key, each range read alone.
            let succeeded = compares.iter().all(|(key, version)| {
                let got = r
                    .range(&RangeRequest {
                        key: key.clone(),
                        ..Default::default()
                    })
                    .expect("the current revision");
                got.kvs.first().map_or(0, |kv| kv.version) > *version
            });
            let branch = if succeeded {
                &req.success
            } else {
                &req.failure
            };
            let expected: Result<Vec<RangeResponse>> = branch
                .iter()
                .map(|op| {
                    let RequestOp::Range(range) = op else {
                        unreachable!("ranges only")
                    };
                    r.range(range)
                })
                .collect();
            let keys_max = rng.gen_range(1..6);
            let mut steps = r.txn_read_steps(&req);
            let mut taken = 1;
            while !r.txn_read_step(&mut steps, &req, keys_max) {
                taken += 1;
            }
            let TxnReadEnd::Answered(stepped) = r.txn_read_end(steps, &req) else {
                panic!("nothing was compacted meanwhile")
            };
            let stepped = stepped.map(Unchecked::check).map(|answer| {
                assert_eq!((answer.revision, answer.succeeded), (current, succeeded));
                answer
                    .responses
                    .into_iter()
                    .map(|op| match op {
                        ResponseOp::Range(range) => range,
                        other => panic!("a range's answer, not {other:?}"),
                    })
                    .collect::<Vec<_>>()
            });
            assert_eq!(stepped, expected, "seed {seed}, {req:?}");
            if stepped.is_err() {
                failed += 1;
            }
            if taken > 3 {
                many_steps += 1;
            }
        }
    }
    assert!(
        many_steps > 0 && failed > 0,
        "many steps {many_steps}, failed {failed}"
    );
}

/// A compaction past a read-only txn's revision between its steps makes it read again at
/// the revision then current, and after `TXN_READ_ATTEMPTS_MAX` tries it is answered as
/// compacted; writes between the steps change nothing it reads.
#[test]
fn a_compaction_between_a_txns_steps_reads_it_again() {
    let (mut w, r) = Store::new();
    for i in 0..10 {
        put_at(&mut w, i as u64 + 1, i, b"v");
    }
    let req = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Range(RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            count_only: true,
            ..Default::default()
        })],
        failure: vec![],
    };
    let count_of = |answer: Result<Unchecked<TxnResponse>>| {
        let answer = answer.expect("read").check();
        let ResponseOp::Range(range) = &answer.responses[0] else {
            panic!("a range's answer")
        };
        (answer.revision, range.count)
    };
    // Writes between steps: the txn still reads the revision it began at.
    let mut steps = r.txn_read_steps(&req);
    assert!(!r.txn_read_step(&mut steps, &req, 3));
    put_at(&mut w, 11, 10, b"later");
    while !r.txn_read_step(&mut steps, &req, 3) {}
    let TxnReadEnd::Answered(answer) = r.txn_read_end(steps, &req) else {
        panic!("nothing was compacted")
    };
    assert_eq!(count_of(answer), (11, 10), "ten keys at revision 11");
    // A compaction past the revision between steps, on every try.
    let mut index = 20;
    let mut steps = r.txn_read_steps(&req);
    let mut tries = 1;
    let answer = loop {
        assert!(!r.txn_read_step(&mut steps, &req, 3));
        index += 1;
        put_at(&mut w, index, 0, b"newer");
        index += 1;
        let rev = w.current_revision();
        compact_to(&mut w, index, rev);
        while !r.txn_read_step(&mut steps, &req, 3) {}
        match r.txn_read_end(steps, &req) {
            TxnReadEnd::Answered(answer) => break answer,
            TxnReadEnd::Again(again) => {
                tries += 1;
                steps = *again;
            }
        }
    };
    assert_eq!(tries, 3, "TXN_READ_ATTEMPTS_MAX tries");
    assert_eq!(answer.map(|_| ()), Err(KvError::Compacted));
    // A compaction on the first try only: the second reads at the newer revision.
    let mut steps = r.txn_read_steps(&req);
    assert!(!r.txn_read_step(&mut steps, &req, 3));
    index += 1;
    put_at(&mut w, index, 1, b"newer");
    index += 1;
    let rev = w.current_revision();
    compact_to(&mut w, index, rev);
    while !r.txn_read_step(&mut steps, &req, 3) {}
    let TxnReadEnd::Again(steps) = r.txn_read_end(steps, &req) else {
        panic!("compacted past its revision")
    };
    let mut steps = *steps;
    while !r.txn_read_step(&mut steps, &req, 3) {}
    let TxnReadEnd::Answered(answer) = r.txn_read_end(steps, &req) else {
        panic!("nothing compacted on the second try")
    };
    assert_eq!(count_of(answer), (r.current_revision(), 11));
}

/// A read-only txn whose compares cover ranges decides them a step's keys at a time and
/// chooses the branch the writer's whole evaluation chooses (the writer applying the same
/// txn, `compare_path`): random ranges, every target (a value compare carries what it found
/// across steps) and result, every step size from one key.
#[test]
fn a_read_only_txns_range_compares_walk_in_steps_and_choose_the_writers_branch() {
    let (mut stepped_compares, mut both) = (0, [0usize; 2]);
    for seed in 0..40 {
        let (mut w, r) = random_store(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0xc0de);
        let current = r.current_revision();
        for n in 0..20u64 {
            let compare: Vec<Compare> = (0..rng.gen_range(1..4))
                .map(|_| {
                    let start = rng.gen_range(0..60);
                    Compare {
                        result: match rng.gen_range(0..4) {
                            0 => CompareResult::Equal,
                            1 => CompareResult::Greater,
                            2 => CompareResult::Less,
                            _ => CompareResult::NotEqual,
                        },
                        target: match rng.gen_range(0..5) {
                            0 => CompareTarget::Version(rng.gen_range(0..4)),
                            1 => CompareTarget::Mod(rng.gen_range(0..=current)),
                            2 => CompareTarget::Create(rng.gen_range(0..=current)),
                            // `random_store`'s values: one letter repeated; short ones
                            // match some keys, and compare below or above the rest.
                            3 => CompareTarget::Value(Bytes::from(vec![
                                b'a' + rng
                                    .gen_range(0..26u8);
                                rng.gen_range(0..3)
                            ])),
                            // Its only lease is 7.
                            _ => CompareTarget::Lease(if rng.gen_bool(0.5) { 7 } else { 0 }),
                        },
                        key: key(start),
                        range_end: match rng.gen_range(0..3) {
                            0 => Bytes::new(),
                            1 => key(rng.gen_range(start..61)),
                            _ => Bytes::from_static(b"\0"),
                        },
                    }
                })
                .collect();
            let one_key = |i: usize| {
                vec![RequestOp::Range(RangeRequest {
                    key: key(i),
                    ..Default::default()
                })]
            };
            let req = TxnRequest {
                compare,
                success: one_key(1),
                failure: one_key(2),
            };
            let applied = w
                .apply(20_000 + seed * 100 + n, &Op::Txn(req.clone()))
                .expect("a read-only txn applies");
            let OpResponse::Txn(writers) = applied.response.check() else {
                panic!("a txn's answer")
            };
            let keys_max = rng.gen_range(1..4);
            let mut steps = r.txn_read_steps(&req);
            let mut taken = 1;
            while !r.txn_read_step(&mut steps, &req, keys_max) {
                taken += 1;
            }
            let TxnReadEnd::Answered(Ok(answer)) = r.txn_read_end(steps, &req) else {
                panic!("nothing compacted, a valid txn")
            };
            let answer = answer.check();
            assert_eq!(answer.revision, current, "a read-only txn writes nothing");
            assert_eq!(answer.succeeded, writers.succeeded, "seed {seed}: {req:?}");
            assert_eq!(answer.responses, writers.responses, "seed {seed}");
            both[usize::from(answer.succeeded)] += 1;
            // Its one range costs a step at most: more steps were the compares'.
            if taken > 2 {
                stepped_compares += 1;
            }
        }
    }
    assert!(
        stepped_compares > 100,
        "compares walked in steps: {stepped_compares}"
    );
    assert!(
        both[0] > 50 && both[1] > 50,
        "both branches chosen: {both:?}"
    );
}

/// A compaction past a txn's revision while its compares are still walking reads the txn
/// again at the newer revision, compares and all.
#[test]
fn a_compaction_while_a_txns_compares_walk_reads_it_again() {
    let (mut w, r) = Store::new();
    for i in 0..10 {
        put_at(&mut w, i as u64 + 1, i, b"v");
    }
    // Every key's version is 1 at revision 11, and key 0's is 2 after the put below: the
    // compare holds at the first revision only.
    let req = TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal,
            target: CompareTarget::Version(1),
            key: key(0),
            range_end: key(10),
        }],
        success: vec![RequestOp::Range(RangeRequest {
            key: key(0),
            ..Default::default()
        })],
        failure: vec![],
    };
    let mut steps = r.txn_read_steps(&req);
    // Ten keys to compare, three a step: still comparing.
    assert!(!r.txn_read_step(&mut steps, &req, 3));
    put_at(&mut w, 11, 0, b"newer");
    let rev = w.current_revision();
    compact_to(&mut w, 12, rev);
    while !r.txn_read_step(&mut steps, &req, 3) {}
    let TxnReadEnd::Again(mut again) = r.txn_read_end(steps, &req) else {
        panic!("a compaction passed the revision read at")
    };
    while !r.txn_read_step(&mut again, &req, 3) {}
    let TxnReadEnd::Answered(answer) = r.txn_read_end(*again, &req) else {
        panic!("nothing compacted since")
    };
    let answer = answer.expect("read").check();
    assert_eq!(answer.revision, 12);
    assert!(!answer.succeeded, "key 0 is at version 2 now");
    assert!(answer.responses.is_empty(), "the failure branch is empty");
}

/// A txn's range that gathered more key-values to sort than the caller's bound is left to
/// the caller to finish (a shard does it off its executor) and answers as one finished in
/// place; one within the bound is finished by the step.
#[test]
fn a_txns_large_sort_is_left_to_the_caller_and_answers_as_in_place() {
    let (mut w, r) = Store::new();
    for i in 0..50 {
        put_at(&mut w, i as u64 + 1, i, b"v");
    }
    let sorted = |key_start: usize| {
        RequestOp::Range(RangeRequest {
            key: key(key_start),
            range_end: key(50),
            sort_order: SortOrder::Descend,
            sort_target: SortTarget::Mod,
            limit: 5,
            ..Default::default()
        })
    };
    // 50 key-values, then 5: only the first passes a bound of 10.
    let req = TxnRequest {
        compare: vec![],
        success: vec![sorted(0), sorted(45)],
        failure: vec![],
    };
    let in_place = r.txn_read_only_unchecked(&req).expect("read").check();
    let mut steps = r.txn_read_steps(&req);
    steps.finish_elsewhere_past(10);
    let mut left = 0;
    let answer = loop {
        while !r.txn_read_step(&mut steps, &req, 7) {}
        if let Some((range, range_req)) = steps.take_walked_range(&req) {
            left += 1;
            assert_eq!(range.reordered_kvs(), 50);
            let answer = r.range_steps_finish(range, &range_req);
            r.txn_read_range_finished(&mut steps, answer);
            continue;
        }
        match r.txn_read_end(steps, &req) {
            TxnReadEnd::Answered(answer) => break answer.expect("read").check(),
            TxnReadEnd::Again(_) => panic!("nothing compacted"),
        }
    };
    assert_eq!(left, 1, "the large sort only");
    assert_eq!(answer, in_place);
}

/// A compaction past a txn's revision while its large sort is finished elsewhere fails that
/// range as compacted, and the txn is read again at the newer revision.
#[test]
fn a_compaction_during_a_txns_sort_elsewhere_reads_it_again() {
    let (mut w, r) = Store::new();
    for i in 0..50 {
        put_at(&mut w, i as u64 + 1, i, b"v");
    }
    let req = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Range(RangeRequest {
            key: key(0),
            range_end: key(50),
            sort_order: SortOrder::Descend,
            sort_target: SortTarget::Mod,
            limit: 1,
            ..Default::default()
        })],
        failure: vec![],
    };
    let mut steps = r.txn_read_steps(&req);
    steps.finish_elsewhere_past(10);
    while !r.txn_read_step(&mut steps, &req, 7) {}
    let (range, range_req) = steps.take_walked_range(&req).expect("left to finish");
    put_at(&mut w, 51, 0, b"newer");
    let rev = w.current_revision();
    compact_to(&mut w, 52, rev);
    let answer = r.range_steps_finish(range, &range_req);
    assert!(matches!(answer, Err(KvError::Compacted)));
    r.txn_read_range_finished(&mut steps, answer);
    assert!(
        r.txn_read_step(&mut steps, &req, 7),
        "a failed range ends the steps"
    );
    assert!(steps.take_walked_range(&req).is_none());
    let TxnReadEnd::Again(mut again) = r.txn_read_end(steps, &req) else {
        panic!("a compaction passed the revision read at")
    };
    // The bound carries over to the next try.
    while !r.txn_read_step(&mut again, &req, 7) {}
    let (range, range_req) = again.take_walked_range(&req).expect("left to finish again");
    let answer = r.range_steps_finish(range, &range_req);
    r.txn_read_range_finished(&mut again, answer);
    while !r.txn_read_step(&mut again, &req, 7) {}
    let TxnReadEnd::Answered(answer) = r.txn_read_end(*again, &req) else {
        panic!("nothing compacted since")
    };
    let answer = answer.expect("read").check();
    assert_eq!(answer.revision, rev);
    let ResponseOp::Range(range) = &answer.responses[0] else {
        panic!("a range's answer")
    };
    assert_eq!(range.kvs[0].mod_revision, rev, "the newest put first");
}
