//! Crash simulation of the whole storage engine: keel-io's WAL on the seeded simulated disk
//! (`SimStore`) in front of keel-kv, with checkpoints, as the server uses them.
//!
//! Several writers append operations to the WAL concurrently (group commit) and apply each to
//! the store once its append is acknowledged; now and then a checkpoint image is kept, as if
//! written durably. At a random moment the disk loses power. Recovery restores the newest
//! checkpoint and replays the WAL records after it. Checked after every crash:
//! - every acknowledged operation is in the recovered log, in acknowledgement-compatible order;
//! - nothing that was never appended appears;
//! - the recovered store equals a simple model (a map) replaying the same operations, key for
//!   key, value for value, and the revision counts every write.
//!
//! The second test runs the same with values on disk, as the server keeps them: sealed
//! value-log segments are written by a driver task that a crash can interrupt (a torn file,
//! or none), whose write may fail with EIO (the server stops: the run ends there), and which
//! reports a segment durable only once its whole file is; checkpoints point into durable
//! segments. Recovery deletes every segment file the checkpoint does not name (as the server
//! does), restores from the rest, and must again equal the model. Then a bit flipped in a
//! value the checkpoint points to must stop the reader with the file and offset, never be
//! served. (Reporting a segment durable before its whole file is written makes this test
//! fail: a checkpoint then names a file a crash leaves torn.)
//!
//! A failure prints its seed; `SEED=n cargo test -p keel-kv --test crash` replays it.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

use bytes::Bytes;
use futures_lite::future::block_on;
use keel_io::{Record, SimExecutor, SimStore, Wal, WalConfig};
use keel_kv::{
    checkpoint_segments, DeleteRangeRequest, Op, PutRequest, RangeRequest, SealedSegment, Store,
    ValueLogOptions, Writer,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: u32 = 16;
const WRITERS: usize = 6;
const CYCLES: usize = 4;

fn config() -> WalConfig {
    WalConfig {
        segment_bytes: 16 * 4096,
        batch_bytes_max: 8 * 1024,
        batch_records_max: 16,
        queue_records_max: 32,
        queue_bytes_max: 16 * 1024,
    }
}

/// One logged operation: a unique id, then a put or a delete of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LoggedOp {
    id: u64,
    key: u32,
    /// None = delete.
    value: Option<u64>,
}

impl LoggedOp {
    fn encode(&self) -> Bytes {
        let mut b = Vec::with_capacity(21);
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&self.key.to_le_bytes());
        match self.value {
            Some(v) => {
                b.push(1);
                b.extend_from_slice(&v.to_le_bytes());
            }
            None => b.push(0),
        }
        b.into()
    }

    fn decode(b: &[u8]) -> LoggedOp {
        let id = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
        let key = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        let value =
            (b[12] == 1).then(|| u64::from_le_bytes(b[13..21].try_into().expect("8 bytes")));
        LoggedOp { id, key, value }
    }

    fn key_bytes(&self) -> Bytes {
        Bytes::from(format!("key{:02}", self.key))
    }

    fn to_op(&self) -> Op {
        match self.value {
            Some(v) => Op::Put(PutRequest {
                key: self.key_bytes(),
                value: Bytes::from(v.to_string()),
                ..Default::default()
            }),
            None => Op::DeleteRange(DeleteRangeRequest {
                key: self.key_bytes(),
                ..Default::default()
            }),
        }
    }
}

/// What survives a crash outside the WAL: the newest checkpoint image (written durably) and
/// the value-log segment files, whole or torn.
struct Durable {
    checkpoint: Option<Vec<u8>>,
    segments: BTreeMap<u32, Bytes>,
}

/// How often each fault and check came up, so the test can show they were exercised.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    /// Recoveries from a checkpoint that pointed into segment files.
    restores_from_segments: u64,
    /// Segment files a recovery deleted (torn, or written after the checkpoint).
    unreferenced_deleted: u64,
    /// Segment writes that failed (EIO) and stopped the run.
    eio_stops: u64,
    /// Flipped values refused on read.
    flips_refused: u64,
}

thread_local! {
    static TALLY: Cell<Tally> = Cell::new(Tally::default());
}

fn count(f: impl FnOnce(&mut Tally)) {
    TALLY.with(|t| {
        let mut tally = t.get();
        f(&mut tally);
        t.set(tally);
    });
}

/// Small segments, so a run seals many of them.
const SEGMENT_BYTES: usize = 256;

fn value_log(first_segment_id: u32) -> ValueLogOptions {
    ValueLogOptions {
        segment_bytes: SEGMENT_BYTES,
        first_segment_id,
        on_disk: true,
    }
}

/// A segment's file as the server writes it: its records, zero-padded to a 4 KiB block.
fn segment_file(sealed: &SealedSegment) -> Vec<u8> {
    let mut file: Vec<u8> = sealed.records.to_vec();
    assert_eq!(file.len() as u64, sealed.bytes);
    file.resize(file.len().next_multiple_of(4096), 0);
    file
}

/// Restores `image`, its segment files read from `files`, new segments numbered from
/// `first_free`.
fn restore_from(
    image: &[u8],
    first_free: u32,
    files: &BTreeMap<u32, Bytes>,
) -> keel_kv::Result<(Writer, keel_kv::Reader)> {
    Store::restore_with_segments(image, value_log(first_free), &mut |id| {
        files
            .get(&id)
            .cloned()
            .ok_or(format!("segment {id} missing"))
    })
}

/// The server's start (`vlog_writer::remove_unreferenced` and `raftcore::open`): delete every
/// segment file the checkpoint does not name, then restore from the checkpoint with the rest
/// mapped, new segments numbered above every kept one.
fn recover_on_disk(seed: u64, durable: &mut Durable) -> (Writer, keel_kv::Reader) {
    let kept = durable
        .checkpoint
        .as_deref()
        .map(|image| checkpoint_segments(image).expect("our checkpoint lists its segments"))
        .unwrap_or_default();
    let before = durable.segments.len();
    durable.segments.retain(|id, _| kept.contains(id));
    let deleted = (before - durable.segments.len()) as u64;
    count(|t| t.unreferenced_deleted += deleted);
    if !kept.is_empty() {
        count(|t| t.restores_from_segments += 1);
    }
    for id in &kept {
        assert!(
            durable.segments.contains_key(id),
            "seed {seed}: the checkpoint points into segment {id}, which is not on disk"
        );
    }
    let first_free = kept.iter().map(|id| id + 1).max().unwrap_or(0);
    match &durable.checkpoint {
        Some(image) => restore_from(image, first_free, &durable.segments)
            .expect("a checkpoint we made restores from its segments"),
        None => Store::with_value_log(value_log(first_free)),
    }
}

/// Flips a bit in the value of one live key that the checkpoint holds in a segment file,
/// restores from the checkpoint with that damaged file, and checks that reading the key
/// stops the reader, naming the file and the record's offset.
fn a_flipped_value_is_refused(seed: u64, durable: &Durable, rng: &mut StdRng) {
    let Some(image) = durable.checkpoint.as_deref() else {
        return;
    };
    let files = &durable.segments;
    let first_free = files.keys().max().map_or(0, |id| id + 1);
    let (_w, reader) = restore_from(image, first_free, files).expect("restores");
    let everything = reader
        .range(&RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..Default::default()
        })
        .expect("full range");
    // Live values that sit in a segment file (the rest were inline in the checkpoint).
    let in_files: Vec<(Bytes, u32, usize)> = everything
        .kvs
        .iter()
        .filter(|kv| !kv.value.is_empty())
        .filter_map(|kv| {
            let v = kv.value.as_ptr() as usize;
            files.iter().find_map(|(id, f)| {
                let start = f.as_ptr() as usize;
                (v >= start && v + kv.value.len() <= start + f.len())
                    .then(|| (kv.key.clone(), *id, v - start))
            })
        })
        .collect();
    if in_files.is_empty() {
        return;
    }
    let (key, id, at) = in_files[rng.gen_range(0..in_files.len())].clone();
    let mut damaged = files.clone();
    let mut file = damaged[&id].to_vec();
    file[at] ^= 1 << rng.gen_range(0..8);
    damaged.insert(id, Bytes::from(file));
    let (_w, reader) = restore_from(image, first_free, &damaged)
        .expect("a damaged value does not stop the restore, only its read");
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reader.range(&RangeRequest {
            key: key.clone(),
            ..Default::default()
        })
    }));
    let message = match read {
        Ok(answer) => panic!("seed {seed}: a flipped value was served: {answer:?}"),
        Err(panic) => panic.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(
        message.contains(&format!("{id:08x}.seg")) && message.contains("fails its crc check"),
        "seed {seed}: {message}"
    );
    count(|t| t.flips_refused += 1);
}

fn all_keys(reader: &keel_kv::Reader) -> BTreeMap<String, String> {
    let r = reader
        .range(&RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..Default::default()
        })
        .expect("full range");
    r.kvs
        .into_iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
            )
        })
        .collect()
}

fn run_seed(seed: u64, on_disk: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let disk = SimStore::new(seed);
    let durable = Rc::new(RefCell::new(Durable {
        checkpoint: None,
        segments: BTreeMap::new(),
    }));
    let mut acked_all: BTreeSet<u64> = BTreeSet::new();
    let mut appended_all: BTreeSet<u64> = BTreeSet::new();
    let mut next_id = 1u64;
    for cycle in 0..CYCLES {
        // Recover: newest checkpoint, then the WAL records after it.
        let (wal, recovered) = block_on(Wal::open(disk.clone(), config()))
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: recovery failed: {e}"));
        let (mut writer, reader) = if on_disk {
            recover_on_disk(seed, &mut durable.borrow_mut())
        } else {
            match &durable.borrow().checkpoint {
                Some(image) => Store::restore(image).expect("a checkpoint we made restores"),
                None => Store::new(),
            }
        };
        let mut model: BTreeMap<String, String> = BTreeMap::new();
        // The model replays the whole recovered log; the store skips what its checkpoint holds.
        let recovered_ops: Vec<(u64, LoggedOp)> = recovered
            .iter()
            .map(|r| (r.index, LoggedOp::decode(&r.payload)))
            .collect();
        let ids: Vec<u64> = recovered_ops.iter().map(|(_, op)| op.id).collect();
        let unique: BTreeSet<u64> = ids.iter().copied().collect();
        assert_eq!(
            unique.len(),
            ids.len(),
            "seed {seed}: an operation was recovered twice"
        );
        for id in &acked_all {
            assert!(
                unique.contains(id),
                "seed {seed} cycle {cycle}: acknowledged op {id} lost"
            );
        }
        for id in &unique {
            assert!(
                appended_all.contains(id),
                "seed {seed}: op {id} was never appended"
            );
        }
        // Ops recovered but never acknowledged are now durable: they count as acknowledged
        // from here on (a later crash must not lose them either).
        acked_all.extend(unique.iter().copied());
        let mut writes = 0i64;
        for (index, op) in &recovered_ops {
            let key = String::from_utf8_lossy(&op.key_bytes()).into_owned();
            match op.value {
                Some(v) => {
                    model.insert(key, v.to_string());
                    writes += 1;
                }
                None => {
                    if model.remove(&key).is_some() {
                        writes += 1;
                    }
                }
            }
            if *index > writer.applied_index() {
                writer
                    .apply(*index, &op.to_op())
                    .expect("puts and deletes of valid keys apply");
            }
        }
        assert_eq!(
            all_keys(&reader),
            model,
            "seed {seed} cycle {cycle}: recovered store differs from the model"
        );
        assert_eq!(
            reader.current_revision(),
            1 + writes,
            "seed {seed} cycle {cycle}: revision does not count every write"
        );
        if on_disk && rng.gen_bool(0.3) {
            a_flipped_value_is_refused(seed, &durable.borrow(), &mut rng);
        }

        // Run: concurrent writers append and apply until the disk loses power.
        let wal = Rc::new(wal);
        let writer = Rc::new(RefCell::new(writer));
        let next_index = Rc::new(RefCell::new(recovered.last().map_or(0, |r| r.index) + 1));
        let acked = Rc::new(RefCell::new(Vec::<u64>::new()));
        let pending = Rc::new(RefCell::new(BTreeMap::<u64, LoggedOp>::new()));
        let mut executor = SimExecutor::new(seed ^ (cycle as u64 + 1), WRITERS + 2);
        // Values on disk: sealed segments wait here for the driver; a failed segment write
        // stops the member (no write is acknowledged after it).
        let sealed = Rc::new(RefCell::new(VecDeque::<SealedSegment>::new()));
        let stopped = Rc::new(Cell::new(false));
        if on_disk {
            let (writer, durable, sealed, stopped) = (
                writer.clone(),
                durable.clone(),
                sealed.clone(),
                stopped.clone(),
            );
            let mut driver_rng = StdRng::seed_from_u64(seed ^ 0xd15c ^ cycle as u64);
            executor.spawn(async move {
                while !stopped.get() {
                    let Some(segment) = sealed.borrow_mut().pop_front() else {
                        futures_lite::future::yield_now().await;
                        continue;
                    };
                    let file = segment_file(&segment);
                    // The write is under way: a crash now leaves a torn file, or none.
                    let torn_bytes = driver_rng.gen_range(0..=file.len());
                    durable
                        .borrow_mut()
                        .segments
                        .insert(segment.id, Bytes::copy_from_slice(&file[..torn_bytes]));
                    // The write takes a while: writers go on meanwhile (and may checkpoint).
                    for _ in 0..driver_rng.gen_range(1..24) {
                        futures_lite::future::yield_now().await;
                    }
                    if driver_rng.gen_bool(0.02) {
                        // EIO: the server logs it and exits; nothing more is acknowledged.
                        stopped.set(true);
                        count(|t| t.eio_stops += 1);
                        return;
                    }
                    let file = Bytes::from(file);
                    durable
                        .borrow_mut()
                        .segments
                        .insert(segment.id, file.clone());
                    writer
                        .borrow_mut()
                        .segment_durable(segment.id, segment.bytes, file);
                }
            });
        }
        for w in 0..WRITERS {
            let ops: Vec<LoggedOp> = (0..rng.gen_range(1..30))
                .map(|_| {
                    let op = LoggedOp {
                        id: next_id,
                        key: rng.gen_range(0..KEYS),
                        value: if rng.gen_bool(0.8) {
                            Some(rng.gen_range(0..1000))
                        } else {
                            None
                        },
                    };
                    next_id += 1;
                    op
                })
                .collect();
            appended_all.extend(ops.iter().map(|o| o.id));
            let checkpoint_every = if w == 0 {
                // With values on disk, often: a checkpoint then catches segments in flight.
                Some(if on_disk {
                    rng.gen_range(1..4)
                } else {
                    rng.gen_range(3..10)
                })
            } else {
                None
            };
            let (wal, writer, next_index, acked, durable, pending) = (
                wal.clone(),
                writer.clone(),
                next_index.clone(),
                acked.clone(),
                durable.clone(),
                pending.clone(),
            );
            let (sealed, stopped) = (sealed.clone(), stopped.clone());
            executor.spawn(async move {
                for (n, op) in ops.into_iter().enumerate() {
                    if stopped.get() {
                        return;
                    }
                    let index = {
                        let mut ni = next_index.borrow_mut();
                        let i = *ni;
                        *ni += 1;
                        i
                    };
                    let record = Record {
                        kind: 1,
                        index,
                        payload: op.encode(),
                    };
                    if wal.append(vec![record]).await.is_err() || stopped.get() {
                        return;
                    }
                    acked.borrow_mut().push(op.id);
                    // Apply in log order, as the raft core does: every index below an
                    // acknowledged one is acknowledged too (indexes are taken in append order).
                    pending.borrow_mut().insert(index, op);
                    {
                        let mut w = writer.borrow_mut();
                        let mut p = pending.borrow_mut();
                        while let Some(op) = p.remove(&(w.applied_index() + 1)) {
                            let i = w.applied_index() + 1;
                            w.apply(i, &op.to_op())
                                .expect("puts and deletes of valid keys apply");
                        }
                        sealed.borrow_mut().extend(w.take_sealed_segments());
                    }
                    if let Some(every) = checkpoint_every {
                        if n % every == every - 1 {
                            let image = writer.borrow().checkpoint();
                            durable.borrow_mut().checkpoint = Some(image);
                        }
                    }
                }
            });
        }
        let steps = rng.gen_range(1..400);
        executor.run(steps);
        acked_all.extend(acked.borrow().iter().copied());
        drop(executor);
        drop(wal);
        disk.crash();
    }
}

fn run_seeds(on_disk: bool) {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => (0..200).collect(),
    };
    let all_seeds = seeds.len() > 1;
    for seed in seeds {
        if let Err(panic) = std::panic::catch_unwind(|| run_seed(seed, on_disk)) {
            eprintln!("storage crash simulation failed; replay with SEED={seed}");
            std::panic::resume_unwind(panic);
        }
    }
    let tally = TALLY.with(Cell::get);
    println!("{tally:?}");
    if on_disk && all_seeds {
        assert!(
            tally.restores_from_segments > 0
                && tally.unreferenced_deleted > 0
                && tally.eio_stops > 0
                && tally.flips_refused > 0,
            "a fault was never exercised: {tally:?}"
        );
    }
}

#[test]
fn acknowledged_operations_survive_crashes_and_the_store_equals_the_model() {
    run_seeds(false);
}

#[test]
fn with_values_on_disk_torn_and_lost_segments_and_eio_lose_nothing_acknowledged() {
    run_seeds(true);
}
