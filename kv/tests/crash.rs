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
//! A failure prints its seed; `SEED=n cargo test -p keel-kv --test crash` replays it.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use bytes::Bytes;
use futures_lite::future::block_on;
use keel_io::{Record, SimExecutor, SimStore, Wal, WalConfig};
use keel_kv::{DeleteRangeRequest, Op, PutRequest, RangeRequest, Store};
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

/// What survives a crash outside the WAL: the newest checkpoint image (written durably).
struct Durable {
    checkpoint: Option<Vec<u8>>,
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

fn run_seed(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let disk = SimStore::new(seed);
    let durable = Rc::new(RefCell::new(Durable { checkpoint: None }));
    let mut acked_all: BTreeSet<u64> = BTreeSet::new();
    let mut appended_all: BTreeSet<u64> = BTreeSet::new();
    let mut next_id = 1u64;
    for cycle in 0..CYCLES {
        // Recover: newest checkpoint, then the WAL records after it.
        let (wal, recovered) = block_on(Wal::open(disk.clone(), config()))
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: recovery failed: {e}"));
        let (mut writer, reader) = match &durable.borrow().checkpoint {
            Some(image) => Store::restore(image).expect("a checkpoint we made restores"),
            None => Store::new(),
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

        // Run: concurrent writers append and apply until the disk loses power.
        let wal = Rc::new(wal);
        let writer = Rc::new(RefCell::new(writer));
        let next_index = Rc::new(RefCell::new(recovered.last().map_or(0, |r| r.index) + 1));
        let acked = Rc::new(RefCell::new(Vec::<u64>::new()));
        let pending = Rc::new(RefCell::new(BTreeMap::<u64, LoggedOp>::new()));
        let mut executor = SimExecutor::new(seed ^ (cycle as u64 + 1), WRITERS + 1);
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
                Some(rng.gen_range(3..10))
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
            executor.spawn(async move {
                for (n, op) in ops.into_iter().enumerate() {
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
                    if wal.append(vec![record]).await.is_err() {
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

#[test]
fn acknowledged_operations_survive_crashes_and_the_store_equals_the_model() {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => (0..200).collect(),
    };
    for seed in seeds {
        if let Err(panic) = std::panic::catch_unwind(|| run_seed(seed)) {
            eprintln!("storage crash simulation failed; replay with SEED={seed}");
            std::panic::resume_unwind(panic);
        }
    }
}
