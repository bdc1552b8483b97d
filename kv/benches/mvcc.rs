//! keel-kv micro-benchmark: apply throughput (puts of 256-byte values, one raft entry each, over
//! many keys and to one key with a long history), one DeleteRange of many keys (one apply: the
//! raft core's longest pause in a mass delete), one txn that compares or reads a million keys
//! (whole, and in the raft core's steps), and single-key and 100-key range throughput from 1,
//! 2 and 4 reader threads at once.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-kv cargo bench -p keel-kv --bench mvcc`
//!
//! `cargo bench -p keel-kv --bench mvcc -- apply KEYS ROUNDS` runs only a put apply
//! measurement, for comparing builds: per round a fresh store, KEYS keys created in order, then
//! 4 x KEYS puts to them in a random order (the raft core's work for a put load over a working
//! set), then the same puts again in blocks of 32, every other block hinted first
//! (`Writer::prefetch_keys`, as the raft core hints a window of entries; the two kinds of
//! block alternate, so they run on histories of the same length and their columns compare),
//! then the same puts again keeping no watch events (a member without watchers), each phase's
//! ns per put printed, and the medians at the end. Compare the other columns across builds,
//! not with each other: each phase runs on longer histories than the one before. (Since
//! 2026-12-07 03:00 the hinted phase runs before the one without events, whose histories are
//! longer for it than in the figures of BENCHMARKS.md before then.)
//!
//! `cargo bench -p keel-kv --bench mvcc -- walk KEYS ROUNDS` times a walk of a skip list laid
//! out as the index is (boxed keys, an 8-byte value, nodes allocated in a random key order as
//! a store's keys arrive), in key order as a full checkpoint walks it, each under one epoch
//! guard: through `SkipMap`'s iterator, which takes and drops a reference count on every node,
//! and through `base::SkipList`'s, which does not. It estimates the per-node cost of those
//! reference counts; a checkpoint's walk also prefetches and reads each key's bytes and
//! versions, which neither walk here does.
//!
//! `cargo bench -p keel-kv --bench mvcc -- count KEYS ROUNDS` times a count of every key of a
//! store of KEYS keys, walked whole and in the steps a shard takes (`Reader::range_steps`)
//! of 256 to 16,384 keys, with nothing between the steps: what stepping itself costs.
//!
//! mimalloc is the allocator in all modes, as in the server (since 2026-12-06; figures in
//! BENCHMARKS.md from before were taken with the system allocator).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_kv::{
    Applied, CompactionRequest, CompactionStatus, Compare, CompareResult, CompareTarget, Op,
    Progress, PutRequest, RangeRequest, Reader, RequestOp, SortOrder, SortTarget, Store,
    TxnRequest, Writer,
};

const KEYS: u64 = 100_000;
const PUTS: u64 = 400_000;
const VALUE_BYTES: usize = 256;
const COMPACT_STEP_KEYS: usize = 1000;
const READ_DURATION: Duration = Duration::from_secs(2);
const HOT_PUTS: u64 = 20_000;
const HOT_BLOCK_PUTS: u64 = 1000;
const DELETE_KEYS: u64 = 1_000_000;
/// keel-core's `limits::APPLY_KEYS_PER_STEP`.
const APPLY_KEYS_PER_STEP: usize = 16_384;
/// Puts per hinted block in `apply` mode: about what a raft core applies per batch under load.
const PREFETCH_BLOCK_PUTS: usize = 32;

fn key(i: u64) -> Bytes {
    Bytes::from(format!("/registry/pods/default/pod-{i:08}"))
}

/// A tiny xorshift so the generator costs nothing next to the read.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Applies `op` as the raft core does, in steps of `keys_max` keys: (total, longest step,
/// steps, answer).
fn apply_stepped(
    writer: &mut Writer,
    index: u64,
    op: &Op,
    keys_max: usize,
) -> (Duration, Duration, usize, Applied) {
    let start = Instant::now();
    let mut step_start = Instant::now();
    let (mut longest, mut steps) = (Duration::ZERO, 1);
    let mut progress = writer.apply_in_steps(index, op, usize::MAX, keys_max);
    loop {
        longest = longest.max(step_start.elapsed());
        match progress {
            Progress::Done(applied) => {
                return (
                    start.elapsed(),
                    longest,
                    steps,
                    applied.expect("the txn applies"),
                )
            }
            Progress::More(rest) => {
                step_start = Instant::now();
                steps += 1;
                progress = writer.apply_step(rest, keys_max);
            }
        }
    }
}

fn reads_per_s(reader: &Reader, threads: usize, span_keys: u64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let reader = reader.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let i = next(&mut state) % (KEYS - span_keys);
                    let req = RangeRequest {
                        key: key(i),
                        range_end: if span_keys > 1 {
                            key(i + span_keys)
                        } else {
                            Bytes::new()
                        },
                        serializable: true,
                        ..Default::default()
                    };
                    let resp = reader.range(&req).expect("range");
                    assert!(resp.kvs.len() as u64 == span_keys);
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    std::thread::sleep(READ_DURATION);
    stop.store(true, Ordering::Relaxed);
    let total: u64 = handles.into_iter().map(|h| h.join().expect("reader")).sum();
    total as f64 / READ_DURATION.as_secs_f64()
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The median of a mode's per-round figures.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// See the module's `walk` mode.
fn walk_rounds(keys: u64, rounds: usize) {
    use crossbeam_skiplist::{base::SkipList, SkipMap};
    // Keys in a random order (xorshift), so that neighbours in key order are not neighbours
    // in memory, as in a store whose keys arrived in no particular order.
    let mut order: Vec<u64> = (0..keys).collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..order.len()).rev() {
        order.swap(i, (next(&mut x) % (i as u64 + 1)) as usize);
    }
    let boxed = |i: u64| -> Box<[u8]> { key(i).to_vec().into_boxed_slice() };
    let map: SkipMap<Box<[u8]>, usize> = SkipMap::new();
    let list: SkipList<Box<[u8]>, usize> =
        SkipList::new(crossbeam_epoch::default_collector().clone());
    {
        let guard = crossbeam_epoch::pin();
        // Interleaved, so that both lists' nodes are spread over the same memory.
        for &i in &order {
            map.insert(boxed(i), i as usize);
            list.insert(boxed(i), i as usize, &guard).release(&guard);
        }
    }
    let (mut counted, mut guarded) = (Vec::new(), Vec::new());
    // Each walk holds a guard, as a checkpoint's does: `SkipMap`'s iterator pins per entry,
    // and under an outer guard that pin is a nested one, as in the checkpoint's walk.
    let walk_map = || {
        let _guard = crossbeam_epoch::pin();
        let start = Instant::now();
        let mut sum = 0usize;
        for entry in map.iter() {
            sum = sum.wrapping_add(entry.key().len() + *entry.value());
        }
        (start.elapsed().as_nanos() as f64 / keys as f64, sum)
    };
    let walk_list = || {
        let guard = crossbeam_epoch::pin();
        let start = Instant::now();
        let mut sum = 0usize;
        for entry in list.iter(&guard) {
            sum = sum.wrapping_add(entry.key().len() + *entry.value());
        }
        (start.elapsed().as_nanos() as f64 / keys as f64, sum)
    };
    for round in 0..rounds {
        // Alternated, so that neither walk always finds the other's leftovers in the cache.
        let ((by_map, sum), (by_base, sum_base)) = if round % 2 == 0 {
            (walk_map(), walk_list())
        } else {
            let list_first = walk_list();
            (walk_map(), list_first)
        };
        assert_eq!(sum, sum_base, "both walks see the same entries");
        println!(
            "round {round}: {keys} keys, SkipMap::iter {by_map:.0} ns/key, \
             base::SkipList::iter {by_base:.0} ns/key"
        );
        counted.push(by_map);
        guarded.push(by_base);
    }
    println!(
        "median of {rounds}: SkipMap::iter {:.0} ns/key, base::SkipList::iter {:.0} ns/key",
        median(&mut counted),
        median(&mut guarded)
    );
}

/// Per round, ns per put: creating `keys` keys, updating them in a random order, the same in
/// blocks not hinted and hinted, and again keeping no events; then the medians.
fn apply_rounds(keys: u64, rounds: usize) {
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let put = |i: u64| {
        Op::Put(PutRequest {
            key: key(i),
            value: value.clone(),
            ..Default::default()
        })
    };
    let (mut creates, mut updates, mut quiets) = (Vec::new(), Vec::new(), Vec::new());
    let (mut plains, mut hinteds) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (mut writer, _reader) = Store::new();
        let mut index = 0u64;
        let created: Vec<Op> = (0..keys).map(put).collect();
        let start = Instant::now();
        for op in &created {
            index += 1;
            writer.apply(index, op).expect("put");
        }
        let create_ns = start.elapsed().as_nanos() as f64 / keys as f64;
        let mut state = 0x2545_f491_4f6c_dd1du64 ^ round as u64;
        let updated: Vec<Op> = (0..4 * keys)
            .map(|_| put(next(&mut state) % keys))
            .collect();
        let start = Instant::now();
        for op in &updated {
            index += 1;
            writer.apply(index, op).expect("put");
        }
        let update_ns = start.elapsed().as_nanos() as f64 / (4 * keys) as f64;
        // The same again in blocks of PREFETCH_BLOCK_PUTS puts, every other block hinted first, as
        // the raft core hints the entries of a batch it applies: the two kinds of block run on
        // histories of the same length, so their times compare.
        let (mut plain, mut hinted) = (Duration::ZERO, Duration::ZERO);
        let (mut plain_puts, mut hinted_puts) = (0usize, 0usize);
        for (n, block) in updated.chunks(PREFETCH_BLOCK_PUTS).enumerate() {
            let start = Instant::now();
            if n % 2 == 1 {
                let keys: Vec<&[u8]> = block
                    .iter()
                    .filter_map(|op| match op {
                        Op::Put(p) => Some(&p.key[..]),
                        _ => None,
                    })
                    .collect();
                writer.prefetch_keys(&keys);
            }
            for op in block {
                index += 1;
                writer.apply(index, op).expect("put");
            }
            let elapsed = start.elapsed();
            if n % 2 == 1 {
                hinted += elapsed;
                hinted_puts += block.len();
            } else {
                plain += elapsed;
                plain_puts += block.len();
            }
        }
        let plain_ns = plain.as_nanos() as f64 / plain_puts.max(1) as f64;
        let hinted_ns = hinted.as_nanos() as f64 / hinted_puts.max(1) as f64;
        // As many again with no events kept: a member whose shards have no watchers.
        let start = Instant::now();
        for op in &updated {
            index += 1;
            writer.apply_bounded(index, op, 0).expect("put");
        }
        let quiet_ns = start.elapsed().as_nanos() as f64 / (4 * keys) as f64;
        println!(
            "round {round}: {keys} keys, create {create_ns:.0} ns/put, update {update_ns:.0} ns/put, \
             blocks plain {plain_ns:.0} / hinted {hinted_ns:.0} ns/put, update without events {quiet_ns:.0} ns/put"
        );
        creates.push(create_ns);
        updates.push(update_ns);
        quiets.push(quiet_ns);
        plains.push(plain_ns);
        hinteds.push(hinted_ns);
    }
    println!(
        "median of {rounds}: create {:.0} ns/put, update {:.0} ns/put, blocks plain {:.0} / \
         hinted {:.0} ns/put, update without events {:.0} ns/put",
        median(&mut creates),
        median(&mut updates),
        median(&mut plains),
        median(&mut hinteds),
        median(&mut quiets)
    );
}

/// `count KEYS ROUNDS`: a count of every key of a store of KEYS keys (created in order, as
/// a sequential load writes them), read in one walk and in the steps a shard takes
/// (`Reader::range_steps`) of several sizes, nothing run between the steps: what stepping
/// itself costs a long walk. Medians of ROUNDS, in ms.
fn count_rounds(keys: u64, rounds: usize) {
    let (mut writer, reader) = Store::new();
    let value = Bytes::from(vec![b'v'; 64]);
    for i in 0..keys {
        let put = Op::Put(PutRequest {
            key: key(i),
            value: value.clone(),
            ..Default::default()
        });
        writer.apply(i + 1, &put).expect("put");
    }
    let req = RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        count_only: true,
        ..Default::default()
    };
    let ms = |f: &mut dyn FnMut() -> i64, expected: i64| {
        let mut times: Vec<f64> = (0..rounds)
            .map(|_| {
                let start = Instant::now();
                let count = f();
                assert_eq!(count, expected, "every key counted");
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        median(&mut times)
    };
    let whole = ms(
        &mut || reader.range(&req).expect("count").count,
        keys as i64,
    );
    println!("count of {keys} keys: one walk {whole:.1} ms");
    for keys_max in [256usize, 1024, 4096, 16384] {
        let stepped = ms(
            &mut || {
                let mut steps = reader.range_steps(&req, None).expect("a valid read");
                while !reader.range_step(&mut steps, &req, keys_max, &mut |_| {}) {}
                reader
                    .range_steps_finish(steps, &req)
                    .expect("no compaction")
                    .check()
                    .0
                    .count
            },
            keys as i64,
        );
        println!(
            "  in steps of {keys_max} keys: {stepped:.1} ms ({:+.1} %)",
            (stepped / whole - 1.0) * 100.0
        );
    }
    // What a sort adds (`READ_SORT_ON_SHARD_KVS_MAX`): every key-value gathered, sorted by
    // modification revision, newest first, the first one answered.
    for span in [16_384u64, keys] {
        let sorted = RangeRequest {
            key: key(0),
            range_end: key(span.min(keys)),
            sort_order: SortOrder::Descend,
            sort_target: SortTarget::Mod,
            limit: 1,
            ..Default::default()
        };
        let walked = RangeRequest {
            count_only: true,
            ..sorted.clone()
        };
        let count = reader.range(&walked).expect("count").count;
        let sort_ms = ms(
            &mut || {
                let answer = reader.range(&sorted).expect("sorted");
                assert_eq!(answer.kvs.len(), 1);
                answer.count
            },
            count,
        );
        let walk_ms = ms(&mut || reader.range(&walked).expect("count").count, count);
        println!("  {count} keys sorted by modification revision: {sort_ms:.1} ms (their count alone {walk_ms:.1} ms)");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The numbers after a mode's name; what is not one (cargo appends `--bench`) leaves the
    // default.
    let number = |at: usize, i: usize, default: u64| {
        args.get(at + i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
            .max(1)
    };
    if let Some(at) = args.iter().position(|a| a == "apply") {
        apply_rounds(number(at, 1, KEYS), number(at, 2, 5) as usize);
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "count") {
        count_rounds(number(at, 1, 1_000_000), number(at, 2, 5) as usize);
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "walk") {
        walk_rounds(number(at, 1, 1_000_000), number(at, 2, 5) as usize);
        return;
    }
    let (mut writer, reader) = Store::new();
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let ops: Vec<Op> = (0..PUTS)
        .map(|i| {
            Op::Put(PutRequest {
                key: key(i % KEYS),
                value: value.clone(),
                ..Default::default()
            })
        })
        .collect();
    let start = Instant::now();
    for (index, op) in ops.iter().enumerate() {
        writer.apply(index as u64 + 1, op).expect("put");
    }
    let elapsed = start.elapsed();
    println!(
        "apply: {PUTS} puts of {VALUE_BYTES}-byte values over {KEYS} keys in {:.3} s = {:.0} puts/s",
        elapsed.as_secs_f64(),
        PUTS as f64 / elapsed.as_secs_f64()
    );
    let start = Instant::now();
    let source = writer.checkpoint_source();
    let capture = start.elapsed();
    let checkpoint = source.serialize().expect("no compaction meanwhile");
    println!(
        "checkpoint: capture on the writer {:.3} ms, serialize {} bytes in {:.1} ms (off the writer)",
        capture.as_secs_f64() * 1e3,
        checkpoint.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    // Restore: what a restart does before the WAL tail (work proportional to the index).
    let start = Instant::now();
    let (restored, _restored_reader) = Store::restore(&checkpoint).expect("our checkpoint");
    println!(
        "checkpoint restore: {} bytes in {:.1} ms",
        checkpoint.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    drop(restored);
    // Compaction in bounded steps: the longest single step is the pause the raft core sees.
    let revision = writer.current_revision();
    writer
        .apply(
            PUTS + 1,
            &Op::Compact(CompactionRequest {
                revision,
                physical: false,
            }),
        )
        .expect("compact");
    let (mut steps, mut step_max, start) = (0u32, Duration::ZERO, Instant::now());
    loop {
        let step_start = Instant::now();
        let status = writer.compact_step(COMPACT_STEP_KEYS);
        step_max = step_max.max(step_start.elapsed());
        steps += 1;
        if status == CompactionStatus::Idle {
            break;
        }
    }
    println!(
        "compaction: {steps} steps of {COMPACT_STEP_KEYS} keys in {:.1} ms, longest step {:.3} ms, log {} -> live {} bytes",
        start.elapsed().as_secs_f64() * 1e3,
        step_max.as_secs_f64() * 1e3,
        writer.value_log_bytes(),
        writer.value_log_bytes_live()
    );
    // One hot key with a long history (no compaction): a put must cost the same at the
    // 20,000th version as at the first.
    let (mut hot_writer, _hot_reader) = Store::new();
    let hot = Op::Put(PutRequest {
        key: key(0),
        value: value.clone(),
        ..Default::default()
    });
    let mut last_block = Duration::ZERO;
    let start = Instant::now();
    for block in 0..HOT_PUTS / HOT_BLOCK_PUTS {
        let block_start = Instant::now();
        for i in 0..HOT_BLOCK_PUTS {
            hot_writer
                .apply(block * HOT_BLOCK_PUTS + i + 1, &hot)
                .expect("put");
        }
        last_block = block_start.elapsed();
    }
    println!(
        "apply: {HOT_PUTS} puts to one key in {:.3} s; the last {HOT_BLOCK_PUTS} (history {}+ long) at {:.0} puts/s",
        start.elapsed().as_secs_f64(),
        HOT_PUTS - HOT_BLOCK_PUTS,
        HOT_BLOCK_PUTS as f64 / last_block.as_secs_f64()
    );
    // One DeleteRange over a million keys, as `etcdctl del --prefix` of a large directory:
    // with every watch event gathered, and as the server applies it (at most 65,536 events,
    // keel-core's WATCH_EVENTS_PER_APPLY_MAX, past which watchers read history instead).
    for (label, events_max) in [("every event", usize::MAX), ("events cut", 65_536)] {
        let (mut del_writer, _del_reader) = Store::new();
        for i in 0..DELETE_KEYS {
            let put = Op::Put(PutRequest {
                key: key(i),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            });
            del_writer.apply(i + 1, &put).expect("put");
        }
        let delete = Op::DeleteRange(keel_kv::DeleteRangeRequest {
            key: key(0),
            range_end: key(DELETE_KEYS),
            ..Default::default()
        });
        let start = Instant::now();
        let applied = del_writer
            .apply_bounded(DELETE_KEYS + 1, &delete, events_max)
            .expect("delete");
        let elapsed = start.elapsed();
        println!(
            "apply: one DeleteRange of {DELETE_KEYS} keys ({label}: {} events) in {:.1} ms = {:.0} ns per key",
            applied.events.len(),
            elapsed.as_secs_f64() * 1e3,
            elapsed.as_nanos() as f64 / DELETE_KEYS as f64
        );
        drop(applied);
        drop(del_writer);
    }
    // One txn that reads a million keys after a put, and one whose compare of a range visits
    // them all (versions, then values): whole, and in the raft core's steps.
    let (mut txn_writer, _txn_reader) = Store::new();
    for i in 0..DELETE_KEYS {
        let put = Op::Put(PutRequest {
            key: key(i),
            value: value.clone(),
            ..Default::default()
        });
        txn_writer.apply(i + 1, &put).expect("put");
    }
    let put_x = RequestOp::Put(PutRequest {
        key: Bytes::from_static(b"x"),
        value: Bytes::from_static(b"y"),
        ..Default::default()
    });
    let every = |target| {
        vec![Compare {
            result: CompareResult::Equal,
            target,
            key: key(0),
            range_end: key(DELETE_KEYS),
        }]
    };
    let txns = [
        (
            "put, then a range of every key",
            TxnRequest {
                compare: vec![],
                success: vec![
                    put_x.clone(),
                    RequestOp::Range(RangeRequest {
                        key: key(0),
                        range_end: key(DELETE_KEYS),
                        ..Default::default()
                    }),
                ],
                failure: vec![],
            },
        ),
        (
            "compare of every key's lease, then a put",
            TxnRequest {
                compare: every(CompareTarget::Lease(0)),
                success: vec![put_x.clone()],
                failure: vec![],
            },
        ),
        (
            "compare of every key's value, then a put",
            TxnRequest {
                compare: every(CompareTarget::Value(value.clone())),
                success: vec![put_x.clone()],
                failure: vec![],
            },
        ),
    ];
    let mut index = DELETE_KEYS;
    for (label, txn) in txns {
        for keys_max in [usize::MAX, APPLY_KEYS_PER_STEP] {
            index += 1;
            let (total, longest, steps, applied) =
                apply_stepped(&mut txn_writer, index, &Op::Txn(txn.clone()), keys_max);
            let how = if keys_max == usize::MAX {
                "whole".to_string()
            } else {
                format!("in steps of {keys_max} keys")
            };
            println!(
                "apply: one txn ({label}, {DELETE_KEYS} keys) {how}: {:.1} ms, longest step {:.1} ms, {steps} step(s)",
                total.as_secs_f64() * 1e3,
                longest.as_secs_f64() * 1e3,
            );
            drop(applied);
        }
    }
    drop(txn_writer);
    for span_keys in [1u64, 100] {
        for threads in [1usize, 2, 4] {
            println!(
                "range {span_keys:>3} key(s), {threads} thread(s): {:.0} ranges/s",
                reads_per_s(&reader, threads, span_keys)
            );
        }
    }
}
