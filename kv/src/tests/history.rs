//! A watcher's history read in steps (`Reader::range_events_steps`), bounded as it walks,
//! hands out exactly the batch a rule applied to the whole history gives: every event of the
//! range from the start revision, whole revisions only, as many as fit `events_max` (the first
//! revision whole however large), then where to go on. Seeded random stores with multi-key
//! revisions (txns, range deletes, a put and delete of one key in one txn), random ranges,
//! bounds and step sizes, and writes between the steps.

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::*;

fn key(i: usize) -> Bytes {
    Bytes::from(format!("h{i:02}"))
}

fn put(i: usize, value: usize) -> RequestOp {
    RequestOp::Put(PutRequest {
        key: key(i),
        value: Bytes::from(vec![b'a' + (value % 26) as u8; value % 50]),
        ..Default::default()
    })
}

/// 300 writes over 40 keys: puts, deletes of one key or of a range, and txns of several
/// writes, some to the same key.
fn random_store(rng: &mut StdRng) -> (Writer, Reader, u64) {
    let (mut w, r) = Store::with_segment_bytes(4096);
    let mut index = 0u64;
    for n in 0..300usize {
        index += 1;
        let k = rng.gen_range(0..40);
        let op = match rng.gen_range(0..10) {
            0..=5 => Op::Put(PutRequest {
                key: key(k),
                value: Bytes::from(vec![b'a' + (n % 26) as u8; n % 50]),
                ..Default::default()
            }),
            6 => Op::DeleteRange(DeleteRangeRequest {
                key: key(k),
                ..Default::default()
            }),
            7 => Op::DeleteRange(DeleteRangeRequest {
                key: key(k),
                range_end: key(rng.gen_range(k..=40)),
                prev_kv: false,
            }),
            _ => {
                let mut success = Vec::new();
                for _ in 0..rng.gen_range(2..7) {
                    let k = rng.gen_range(0..40);
                    if rng.gen_bool(0.25) {
                        success.push(RequestOp::DeleteRange(DeleteRangeRequest {
                            key: key(k),
                            ..Default::default()
                        }));
                    } else {
                        success.push(put(k, n));
                    }
                }
                Op::Txn(TxnRequest {
                    success,
                    ..Default::default()
                })
            }
        };
        w.apply(index, &op).expect("applies");
    }
    (w, r, index)
}

type Seen = (EventKind, Bytes, i64, i64, i64, Bytes, Option<(i64, Bytes)>);

fn seen(batch: EventBatch) -> (Vec<Seen>, i64) {
    let events = batch
        .events
        .into_iter()
        .map(|e| {
            let prev = e.prev_kv.map(|p| {
                let p = p.checked();
                (p.mod_revision, p.value)
            });
            let kv = e.kv;
            (
                e.kind,
                kv.key,
                kv.mod_revision,
                kv.create_revision,
                kv.version,
                kv.value,
                prev,
            )
        })
        .collect();
    (events, batch.next_rev)
}

/// The batch rule, applied to every event of the range at once (`all`, in revision order):
/// the longest run of whole revisions within `events_max` events, at least the first.
fn batch_of(all: &[Seen], events_max: usize, read_rev: i64, start_rev: i64) -> (Vec<Seen>, i64) {
    let mut kept = 0;
    let mut next_rev = (read_rev + 1).max(start_rev);
    let mut i = 0;
    while i < all.len() {
        let main = all[i].2;
        let end = i + all[i..].iter().take_while(|e| e.2 == main).count();
        if kept > 0 && end > events_max {
            next_rev = main;
            break;
        }
        kept = end;
        i = end;
    }
    (all[..kept].to_vec(), next_rev)
}

#[test]
fn a_history_read_in_bounded_steps_hands_out_the_batch_of_the_whole_history() {
    for seed in 0..300u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut w, r, mut index) = random_store(&mut rng);
        let read_rev = r.current_revision();
        let start = rng.gen_range(0..40);
        let end = match rng.gen_range(0..3) {
            0 => Bytes::new(),
            1 => key(rng.gen_range(start..=40)),
            _ => Bytes::from_static(b"\0"),
        };
        let start_rev = rng.gen_range(0..=read_rev + 2);
        let with_prev = rng.gen_bool(0.5);
        let events_max = rng.gen_range(1..30);
        let keys_max = rng.gen_range(1..12);
        let whole = r
            .range_events_unchecked(start_rev, &key(start), &end, usize::MAX, with_prev)
            .expect("nothing compacted")
            .check();
        assert!(whole.reached_read_rev(), "seed {seed}: nothing cut");
        let (all, _) = seen(whole);
        assert!(
            all.windows(2).all(|p| p[0].2 <= p[1].2),
            "seed {seed}: in revision order"
        );
        let mut steps = r
            .range_events_steps(start_rev, &key(start), &end, events_max, with_prev)
            .expect("nothing compacted");
        let mut taken = 1;
        while !r.range_events_step(&mut steps, keys_max) {
            // Held events stay within twice the bound, or twice a revision that alone
            // holds more (a range delete of up to 40 keys, a txn of up to 6 writes).
            assert!(
                steps.events_held() < 2 * events_max.max(40),
                "seed {seed}: {} events held for a batch of {events_max}",
                steps.events_held()
            );
            // Writes after the revision read change nothing it hands out.
            index += 1;
            w.apply(
                index,
                &Op::Put(PutRequest {
                    key: key(rng.gen_range(0..40)),
                    value: Bytes::from_static(b"later"),
                    ..Default::default()
                }),
            )
            .expect("applies");
            taken += 1;
        }
        let visited = steps.keys_visited();
        assert!(
            taken >= visited / keys_max,
            "seed {seed}: {taken} steps for {visited} keys, {keys_max} at a time"
        );
        let batch = r
            .range_events_finish(steps)
            .expect("nothing compacted")
            .check();
        assert_eq!(batch.read_rev, read_rev);
        let want = batch_of(&all, events_max, read_rev, start_rev.max(1));
        assert_eq!(
            batch.reached_read_rev(),
            want.1 > read_rev,
            "seed {seed}: cut or not"
        );
        assert_eq!(seen(batch), want, "seed {seed}");
    }
}

/// A compaction past the start revision between the steps fails the read as compacted: the
/// lists it walked may have been trimmed under it.
#[test]
fn a_compaction_past_the_start_between_steps_fails_the_history_read() {
    let mut rng = StdRng::seed_from_u64(7);
    let (mut w, r, index) = random_store(&mut rng);
    let mut steps = r
        .range_events_steps(2, b"\0", b"\0", 10, false)
        .expect("nothing compacted yet");
    assert!(
        !r.range_events_step(&mut steps, 3),
        "40 keys take more than a step"
    );
    w.apply(
        index + 1,
        &Op::Compact(CompactionRequest {
            revision: 50,
            physical: true,
        }),
    )
    .expect("compacts");
    while !r.range_events_step(&mut steps, 3) {}
    assert!(matches!(
        r.range_events_finish(steps),
        Err(KvError::Compacted)
    ));
}

/// One key's many versions are cut as they are read, not once the key is done: a read of a
/// key with a thousand versions, in batches of ten, holds no more than twice ten events.
#[test]
fn a_key_with_many_versions_is_read_within_the_bound() {
    let (mut w, r) = Store::with_segment_bytes(4096);
    for index in 1..=1_000u64 {
        w.apply(
            index,
            &Op::Put(PutRequest {
                key: key(1),
                value: Bytes::from(index.to_string()),
                ..Default::default()
            }),
        )
        .expect("applies");
    }
    let mut steps = r
        .range_events_steps(1, &key(1), b"", 10, true)
        .expect("nothing compacted");
    assert!(r.range_events_step(&mut steps, 1), "one key, one step");
    assert!(
        steps.events_held() < 20,
        "{} events held for a batch of 10",
        steps.events_held()
    );
    let batch = r
        .range_events_finish(steps)
        .expect("nothing compacted")
        .check();
    let revisions: Vec<i64> = batch.events.iter().map(|e| e.kv.mod_revision).collect();
    assert_eq!(revisions, (2..12).collect::<Vec<i64>>());
    assert_eq!(batch.next_rev, 12);
}
