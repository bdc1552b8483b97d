//! A range split into a first part and a rest read a batch at a time (`RangeSplit`,
//! `Reader::range_rest`) answers exactly what the whole range answers, for seeded random
//! stores and requests, and fails as compacted when a compaction passes its revision.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::*;

pub(super) fn key(i: usize) -> Bytes {
    Bytes::from(format!("k{i:03}"))
}

/// A store of random puts (values of 0..300 bytes, some with a lease) and deletes over 60 keys,
/// in small segments so values span sealed and open ones.
pub(super) fn random_store(seed: u64) -> (Writer, Reader) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut w, r) = Store::with_segment_bytes(4096);
    let mut index = 1;
    w.apply(
        index,
        &Op::LeaseGrant(LeaseGrantRequest { id: 7, ttl_s: 60 }),
    )
    .expect("grant");
    for _ in 0..400 {
        index += 1;
        let k = rng.gen_range(0..60);
        let op = if rng.gen_range(0..5) == 0 {
            Op::DeleteRange(DeleteRangeRequest {
                key: key(k),
                ..Default::default()
            })
        } else {
            let value_bytes = rng.gen_range(0..300);
            Op::Put(PutRequest {
                key: key(k),
                value: Bytes::from(vec![b'a' + (index % 26) as u8; value_bytes]),
                lease: if rng.gen_bool(0.2) { 7 } else { 0 },
                ..Default::default()
            })
        };
        w.apply(index, &op).expect("applies");
    }
    (w, r)
}

/// A `KeyValueShape` kept past its callback.
struct OwnedShape {
    key: Vec<u8>,
    revisions_and_lease: (i64, i64, i64, i64),
    value_len: usize,
}

/// The split answer put back together: its first key-values, then every batch of the rest.
fn split_then_rest(
    r: &Reader,
    req: &RangeRequest,
    kvs_max: usize,
    batch_bytes: usize,
) -> (RangeResponse, Vec<OwnedShape>, usize) {
    let mut shapes = Vec::new();
    let mut on_rest = |shape: KeyValueShape<'_>| {
        shapes.push(OwnedShape {
            key: shape.key.to_vec(),
            revisions_and_lease: (
                shape.create_revision,
                shape.mod_revision,
                shape.version,
                shape.lease,
            ),
            value_len: shape.value_len,
        })
    };
    let (mut answer, rest) = r
        .range_split(
            req,
            RangeSplit {
                kvs_max,
                on_rest: &mut on_rest,
            },
        )
        .expect("range");
    let mut batches = 0;
    if let Some(mut rest) = rest {
        assert_eq!(rest.kvs_left(), shapes.len());
        while rest.kvs_left() > 0 {
            let kvs = r.range_rest(&mut rest, batch_bytes).expect("rest");
            assert!(!kvs.is_empty(), "a batch holds at least one key-value");
            answer.kvs.extend(kvs);
            batches += 1;
        }
    } else {
        assert!(shapes.is_empty(), "no rest, no shapes");
    }
    (answer, shapes, batches)
}

#[test]
fn a_split_range_answers_what_the_whole_range_answers() {
    for seed in 0..40 {
        let (_w, r) = random_store(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        let current = r.current_revision();
        for _ in 0..30 {
            let start = rng.gen_range(0..60);
            let range_end = match rng.gen_range(0..3) {
                0 => Bytes::from_static(b"\0"),
                1 => key(rng.gen_range(start..61)),
                _ => Bytes::from_static(b"k\xff"),
            };
            let req = RangeRequest {
                key: key(start),
                range_end,
                limit: if rng.gen_bool(0.5) {
                    rng.gen_range(0..40)
                } else {
                    0
                },
                revision: if rng.gen_bool(0.5) {
                    rng.gen_range(0..=current)
                } else {
                    0
                },
                keys_only: rng.gen_bool(0.3),
                sort_order: if rng.gen_bool(0.2) {
                    SortOrder::Ascend
                } else {
                    SortOrder::None
                },
                ..Default::default()
            };
            let whole = r.range(&req).expect("whole range");
            let kvs_max = rng.gen_range(1..8);
            let batch_bytes = rng.gen_range(1..600);
            let (split, shapes, batches) = split_then_rest(&r, &req, kvs_max, batch_bytes);
            assert_eq!(split, whole, "seed {seed}, {req:?}, first {kvs_max}");
            // Each shape describes the key-value the rest later handed out.
            let rest = &whole.kvs[whole.kvs.len() - shapes.len()..];
            for (shape, kv) in shapes.iter().zip(rest) {
                assert_eq!(shape.key, &kv.key[..]);
                assert_eq!(
                    shape.revisions_and_lease,
                    (kv.create_revision, kv.mod_revision, kv.version, kv.lease)
                );
                assert_eq!(
                    shape.value_len,
                    kv.value.len(),
                    "keys-only shapes have no value"
                );
            }
            assert!(batches <= shapes.len());
        }
    }
}

#[test]
fn sorted_filtered_and_single_key_ranges_are_not_split() {
    let (_w, r) = random_store(3);
    let all = |f: fn(&mut RangeRequest)| {
        let mut req = RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..Default::default()
        };
        f(&mut req);
        req
    };
    for req in [
        all(|r| r.sort_order = SortOrder::Descend),
        all(|r| r.sort_target = SortTarget::Mod),
        all(|r| r.min_mod_revision = 2),
        all(|r| r.max_create_revision = 300),
        all(|r| r.count_only = true),
        RangeRequest {
            key: key(5),
            ..Default::default()
        },
    ] {
        let (split, shapes, _) = split_then_rest(&r, &req, 1, 100);
        assert!(shapes.is_empty(), "{req:?} is read whole");
        assert_eq!(split, r.range(&req).expect("range"), "{req:?}");
    }
}

pub(super) fn put_at(w: &mut Writer, index: u64, i: usize, value: &'static [u8]) {
    w.apply(
        index,
        &Op::Put(PutRequest {
            key: key(i),
            value: Bytes::from_static(value),
            ..Default::default()
        }),
    )
    .expect("put");
}

pub(super) fn compact_to(w: &mut Writer, index: u64, revision: i64) {
    w.apply(
        index,
        &Op::Compact(CompactionRequest {
            revision,
            physical: true,
        }),
    )
    .expect("compact");
    while w.compact_step(64) == CompactionStatus::Pending {}
}

/// A range of keys 0..20 split after 5, with 1 key-value of its rest read.
fn split_range_of_twenty(w: &mut Writer, r: &Reader) -> RangeRest {
    for i in 0..20 {
        put_at(w, i as u64 + 1, i, b"v");
    }
    let req = RangeRequest {
        key: key(0),
        range_end: Bytes::from_static(b"\0"),
        limit: 19,
        ..Default::default()
    };
    let (answer, rest) = r
        .range_split(
            &req,
            RangeSplit {
                kvs_max: 5,
                on_rest: &mut |_| {},
            },
        )
        .expect("range");
    assert_eq!((answer.kvs.len(), answer.count, answer.more), (5, 20, true));
    let mut rest = rest.expect("14 owed");
    assert_eq!(rest.kvs_left(), 14);
    assert_eq!(
        r.range_rest(&mut rest, 1).expect("one batch")[0].key,
        key(5)
    );
    rest
}

#[test]
fn a_compaction_that_cuts_nothing_the_rest_reads_leaves_it_whole() {
    let (mut w, r) = Store::with_segment_bytes(4096);
    let mut rest = split_range_of_twenty(&mut w, &r);
    let revision = rest.revision();
    // Newer versions of keys already handed out, and of the key past the limit, then a
    // compaction past the range's revision: it cuts only lists the rest does not read.
    put_at(&mut w, 30, 0, b"newer");
    put_at(&mut w, 31, 4, b"newer");
    put_at(&mut w, 32, 19, b"newer");
    compact_to(&mut w, 33, revision + 3);
    assert!(r.compact_revision() > revision);
    let mut keys = Vec::new();
    while rest.kvs_left() > 0 {
        keys.extend(r.range_rest(&mut rest, 1).expect("nothing owed was cut"));
    }
    let keys: Vec<Bytes> = keys.into_iter().map(|kv| kv.key).collect();
    assert_eq!(keys, (6..19).map(key).collect::<Vec<_>>());
}

#[test]
fn a_compaction_that_cuts_what_the_rest_owes_fails_it_as_compacted() {
    for cut in [7, 12, 18] {
        let (mut w, r) = Store::with_segment_bytes(4096);
        let mut rest = split_range_of_twenty(&mut w, &r);
        let revision = rest.revision();
        // A compaction at the range's own revision keeps what it reads.
        compact_to(&mut w, 30, revision);
        assert_eq!(
            r.range_rest(&mut rest, 1).expect("at the revision")[0].key,
            key(6)
        );
        // A key the rest owes is written again, and a compaction past the range's revision
        // cuts the version the range reads: the rest can no longer be what was promised.
        put_at(&mut w, 31, cut, b"newer");
        compact_to(&mut w, 32, revision + 1);
        let mut handed_out = 0;
        let error = loop {
            match r.range_rest(&mut rest, 1) {
                Ok(kvs) => handed_out += kvs.len(),
                Err(error) => break error,
            }
            assert!(rest.kvs_left() > 0, "cut at {cut}: the rest ended whole");
        };
        assert_eq!(error, KvError::Compacted, "cut at {cut}");
        assert!(
            handed_out <= 12,
            "cut at {cut}: only keys before the cut were handed out"
        );
    }
}

#[test]
fn writes_and_compactions_beside_a_rest_leave_it_exact_or_fail_it_as_compacted() {
    let (mut exact, mut exact_past_compaction, mut compacted) = (0, 0, 0);
    for seed in 0..60 {
        let (mut w, r) = random_store(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0xc0ffee);
        let req = RangeRequest {
            key: key(rng.gen_range(0..20)),
            range_end: Bytes::from_static(b"\0"),
            limit: if rng.gen_bool(0.5) {
                rng.gen_range(10..50)
            } else {
                0
            },
            ..Default::default()
        };
        let whole = r.range(&req).expect("whole range");
        let (mut answer, rest) = r
            .range_split(
                &req,
                RangeSplit {
                    kvs_max: rng.gen_range(1..5),
                    on_rest: &mut |_| {},
                },
            )
            .expect("split");
        let Some(mut rest) = rest else { continue };
        let mut index = 1_000;
        let outcome = loop {
            // Between batches: a few writes, and now and then a compaction up to a revision
            // at most a few past the range's (so it may or may not cut what the rest owes).
            for _ in 0..rng.gen_range(0..4) {
                index += 1;
                let k = rng.gen_range(0..60);
                put_at(&mut w, index, k, b"later");
            }
            let top = (rest.revision() + 3).min(w.current_revision());
            let bottom = r.compact_revision().max(0) + 1;
            if rng.gen_bool(0.3) && bottom <= top {
                index += 1;
                compact_to(&mut w, index, rng.gen_range(bottom..=top));
            }
            match r.range_rest(&mut rest, rng.gen_range(1..400)) {
                Ok(kvs) => answer.kvs.extend(kvs),
                Err(error) => break Err(error),
            }
            if rest.kvs_left() == 0 {
                break Ok(answer);
            }
        };
        match outcome {
            Ok(answer) => {
                exact += 1;
                if r.compact_revision() > rest.revision() {
                    exact_past_compaction += 1;
                }
                assert_eq!(answer, whole, "seed {seed}");
            }
            Err(error) => {
                compacted += 1;
                assert_eq!(error, KvError::Compacted, "seed {seed}");
                assert!(r.compact_revision() > rest.revision(), "seed {seed}");
            }
        }
    }
    // Every outcome was reached, a whole answer beside a compaction past its revision too.
    assert!(
        exact_past_compaction > 0 && compacted > 0,
        "exact {exact} ({exact_past_compaction} past a compaction), compacted {compacted}"
    );
}
