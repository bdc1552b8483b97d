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
