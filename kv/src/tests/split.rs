//! A range split into a first part and a rest read a batch at a time (`RangeSplit`,
//! `Reader::range_rest`) answers exactly what the whole range answers, for seeded random
//! stores and requests, and fails as compacted when a compaction passes its revision.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::*;

fn key(i: usize) -> Bytes {
    Bytes::from(format!("k{i:03}"))
}

/// A store of random puts (values of 0..300 bytes, some with a lease) and deletes over 60 keys,
/// in small segments so values span sealed and open ones.
fn random_store(seed: u64) -> (Writer, Reader) {
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

#[test]
fn a_compaction_past_the_revision_fails_the_rest_as_compacted() {
    let (mut w, r) = Store::with_segment_bytes(4096);
    for i in 0..20 {
        w.apply(
            i as u64 + 1,
            &Op::Put(PutRequest {
                key: key(i),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            }),
        )
        .expect("put");
    }
    let req = RangeRequest {
        key: key(0),
        range_end: Bytes::from_static(b"\0"),
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
    assert_eq!((answer.kvs.len(), answer.count), (5, 20));
    let mut rest = rest.expect("15 owed");
    let revision = rest.revision();
    assert_eq!(r.range_rest(&mut rest, 1).expect("one batch").len(), 1);
    // Writes and a compaction up to the range's own revision change nothing it reads.
    for (index, i) in (21..).zip(0..5) {
        w.apply(
            index,
            &Op::Put(PutRequest {
                key: key(i),
                value: Bytes::from_static(b"newer"),
                ..Default::default()
            }),
        )
        .expect("put");
    }
    w.apply(
        30,
        &Op::Compact(CompactionRequest {
            revision,
            physical: true,
        }),
    )
    .expect("compact");
    while w.compact_step(64) == CompactionStatus::Pending {}
    let kvs = r
        .range_rest(&mut rest, 1)
        .expect("compaction at the revision itself");
    assert_eq!((kvs.len(), &kvs[0].key), (1, &key(6)));
    // One past it may have trimmed what the rest reads.
    w.apply(
        31,
        &Op::Compact(CompactionRequest {
            revision: revision + 1,
            physical: true,
        }),
    )
    .expect("compact");
    assert_eq!(r.range_rest(&mut rest, 1).err(), Some(KvError::Compacted));
}
