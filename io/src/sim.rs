//! In-memory, seeded storage and a tiny seeded executor for deterministic simulations.
//!
//! `SimStore` models a disk with a volatile cache: writes land in `current`, `fdatasync` copies them
//! to `durable` (or, made `with_durable_writes`, a successful write goes to both at once), and
//! `crash()` keeps `durable` plus, for every block written since the last sync, one of: the old
//! bytes, the new bytes, or a torn block (a prefix of its 512-byte sectors new). Writes
//! can fail with EIO on request. Nothing here needs glommio: drive it with
//! `futures_lite::future::block_on` or with `SimExecutor`.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::frame::BLOCK_BYTES;
use crate::store::{BackgroundTask, FsyncFailure, SegmentStore};

const SECTOR_BYTES: usize = 512;
const _: () = assert!(BLOCK_BYTES % SECTOR_BYTES == 0);

/// Faults `SimStore` injects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimFaults {
    /// Chance, in parts per million, that a `write_at` fails with EIO after landing a random prefix of
    /// its blocks in the volatile cache.
    pub write_eio_per_million: u32,
    /// Chance, in parts per million, that an `fdatasync` fails with EIO (the WAL then stops:
    /// see `fsync_failure`).
    pub fsync_eio_per_million: u32,
}

/// Counters of the operations a `SimStore` served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub writes: u64,
    pub bytes_written: u64,
    pub fdatasyncs: u64,
    pub creates: u64,
    pub removes: u64,
    pub crashes: u64,
}

#[derive(Clone)]
struct SimFile {
    durable: Vec<u8>,
    current: Vec<u8>,
    dirty_blocks: BTreeSet<usize>,
}

struct SimDisk {
    files: BTreeMap<u64, SimFile>,
    rng: StdRng,
    faults: SimFaults,
    stats: SimStats,
    /// Writes are durable when they succeed, as on `DmaStore`'s O_DSYNC segments.
    durable_writes: bool,
}

/// A seeded in-memory `SegmentStore`. Clones share the same disk, so a test keeps one clone to crash
/// the disk while the WAL owns another.
#[derive(Clone)]
pub struct SimStore {
    disk: Rc<RefCell<SimDisk>>,
}

impl SimStore {
    /// An empty disk whose random choices (torn blocks, EIO) follow `seed`.
    pub fn new(seed: u64) -> Self {
        SimStore {
            disk: Rc::new(RefCell::new(SimDisk {
                files: BTreeMap::new(),
                rng: StdRng::seed_from_u64(seed),
                faults: SimFaults::default(),
                stats: SimStats::default(),
                durable_writes: false,
            })),
        }
    }

    /// As `new`, but a write that succeeds is durable at once, as `DmaStore`'s O_DSYNC segments
    /// are (`writes_are_durable`), so the WAL issues no fdatasync after a batch. A write that
    /// fails with EIO leaves what landed of it undecided until the crash, as without.
    pub fn with_durable_writes(seed: u64) -> Self {
        let store = SimStore::new(seed);
        store.disk.borrow_mut().durable_writes = true;
        store
    }

    /// Sets the faults injected from now on.
    pub fn set_faults(&self, faults: SimFaults) {
        assert!(faults.write_eio_per_million <= 1_000_000);
        assert!(faults.fsync_eio_per_million <= 1_000_000);
        self.disk.borrow_mut().faults = faults;
    }

    /// Operation counters so far.
    pub fn stats(&self) -> SimStats {
        self.disk.borrow().stats
    }

    /// Loses power: keeps what was synced plus a random, possibly torn, subset of unsynced blocks.
    /// Whoever used the store before must be dropped; a new `Wal::open` recovers.
    pub fn crash(&self) {
        let disk = &mut *self.disk.borrow_mut();
        disk.stats.crashes += 1;
        for file in disk.files.values_mut() {
            let dirty = std::mem::take(&mut file.dirty_blocks);
            for block in dirty {
                let range = block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES;
                let new_bytes_end = match disk.rng.gen_range(0..3) {
                    0 => range.start,
                    1 => range.end,
                    _ => {
                        range.start
                            + SECTOR_BYTES * disk.rng.gen_range(1..BLOCK_BYTES / SECTOR_BYTES)
                    }
                };
                let new_bytes = range.start..new_bytes_end;
                file.durable[new_bytes.clone()].copy_from_slice(&file.current[new_bytes]);
            }
            file.current.clone_from(&file.durable);
        }
    }

    /// Flips bits of one durable byte, as bit rot would (tests of corruption detection).
    pub fn corrupt_byte(&self, seq: u64, offset: usize) {
        let disk = &mut *self.disk.borrow_mut();
        let file = disk
            .files
            .get_mut(&seq)
            .expect("corrupting an existing segment");
        file.durable[offset] ^= 0x5A;
        file.current[offset] ^= 0x5A;
    }

    /// The durable bytes of segment `seq` (what a crash now would keep at least).
    pub fn durable_bytes(&self, seq: u64) -> Vec<u8> {
        self.disk
            .borrow()
            .files
            .get(&seq)
            .expect("an existing segment")
            .durable
            .clone()
    }

    /// Overwrites bytes of segment `seq` durably, bypassing the WAL (tests of damaged logs).
    pub fn write_durable(&self, seq: u64, offset: usize, data: &[u8]) {
        let disk = &mut *self.disk.borrow_mut();
        let file = disk.files.get_mut(&seq).expect("an existing segment");
        file.durable[offset..offset + data.len()].copy_from_slice(data);
        file.current[offset..offset + data.len()].copy_from_slice(data);
    }

    /// The sequence numbers of the segments on the disk.
    pub fn segment_seqs(&self) -> Vec<u64> {
        self.disk.borrow().files.keys().copied().collect()
    }
}

fn not_found(seq: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("sim segment {seq} does not exist"),
    )
}

impl SegmentStore for SimStore {
    type Segment = u64;

    fn describe(&self, seq: u64) -> String {
        format!("sim:{seq:016x}.wal")
    }

    async fn list(&self) -> io::Result<Vec<u64>> {
        Ok(self.segment_seqs())
    }

    async fn create(&self, seq: u64, capacity_bytes: u64) -> io::Result<u64> {
        let capacity = usize::try_from(capacity_bytes).expect("sim segments fit in memory");
        assert!(capacity % BLOCK_BYTES == 0);
        let disk = &mut *self.disk.borrow_mut();
        disk.stats.creates += 1;
        // Creation is durable and atomic, as DmaStore's write-to-temporary-then-rename is.
        let file = SimFile {
            durable: vec![0; capacity],
            current: vec![0; capacity],
            dirty_blocks: BTreeSet::new(),
        };
        disk.files.insert(seq, file);
        Ok(seq)
    }

    async fn open(&self, seq: u64) -> io::Result<u64> {
        if self.disk.borrow().files.contains_key(&seq) {
            Ok(seq)
        } else {
            Err(not_found(seq))
        }
    }

    async fn remove(&self, seq: u64) -> io::Result<()> {
        let disk = &mut *self.disk.borrow_mut();
        disk.stats.removes += 1;
        disk.files
            .remove(&seq)
            .map(|_| ())
            .ok_or_else(|| not_found(seq))
    }

    async fn len_bytes(&self, segment: &u64) -> io::Result<u64> {
        let disk = self.disk.borrow();
        let file = disk.files.get(segment).ok_or_else(|| not_found(*segment))?;
        Ok(file.current.len() as u64)
    }

    async fn read_at(&self, segment: &u64, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let disk = self.disk.borrow();
        let file = disk.files.get(segment).ok_or_else(|| not_found(*segment))?;
        let start = usize::try_from(offset)
            .expect("sim offsets fit in memory")
            .min(file.current.len());
        let end = (start + len).min(file.current.len());
        Ok(file.current[start..end].to_vec())
    }

    async fn write_at(&self, segment: &u64, offset: u64, data: &[u8]) -> io::Result<()> {
        // Yield first, as real I/O would, so that other appenders run while a write is in flight.
        futures_lite::future::yield_now().await;
        let disk = &mut *self.disk.borrow_mut();
        let offset = usize::try_from(offset).expect("sim offsets fit in memory");
        assert!(
            offset % BLOCK_BYTES == 0 && data.len() % BLOCK_BYTES == 0,
            "O_DIRECT alignment"
        );
        let eio = disk.faults.write_eio_per_million > 0
            && disk.rng.gen_range(0..1_000_000) < disk.faults.write_eio_per_million;
        let blocks = data.len() / BLOCK_BYTES;
        let blocks_landed = if eio {
            disk.rng.gen_range(0..=blocks)
        } else {
            blocks
        };
        let file = disk
            .files
            .get_mut(segment)
            .ok_or_else(|| not_found(*segment))?;
        if offset + data.len() > file.current.len() {
            // O_DIRECT writes past the end extend the file; keep both images the same length.
            file.current.resize(offset + data.len(), 0);
            file.durable.resize(offset + data.len(), 0);
        }
        let landed_bytes = blocks_landed * BLOCK_BYTES;
        file.current[offset..offset + landed_bytes].copy_from_slice(&data[..landed_bytes]);
        let landed_blocks = offset / BLOCK_BYTES..offset / BLOCK_BYTES + blocks_landed;
        if disk.durable_writes && !eio {
            file.durable[offset..offset + landed_bytes].copy_from_slice(&data[..landed_bytes]);
            for block in landed_blocks {
                file.dirty_blocks.remove(&block);
            }
        } else {
            file.dirty_blocks.extend(landed_blocks);
        }
        disk.stats.writes += 1;
        disk.stats.bytes_written += landed_bytes as u64;
        if eio {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    async fn fdatasync(&self, segment: &u64) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        let disk = &mut *self.disk.borrow_mut();
        disk.stats.fdatasyncs += 1;
        if disk.faults.fsync_eio_per_million > 0
            && disk.rng.gen_range(0..1_000_000) < disk.faults.fsync_eio_per_million
        {
            // Nothing became durable; what the dirty blocks hold is decided at the crash.
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let file = disk
            .files
            .get_mut(segment)
            .ok_or_else(|| not_found(*segment))?;
        for block in std::mem::take(&mut file.dirty_blocks) {
            let range = block * BLOCK_BYTES..(block + 1) * BLOCK_BYTES;
            let (durable, current) = (&mut file.durable, &file.current);
            durable[range.clone()].copy_from_slice(&current[range]);
        }
        Ok(())
    }

    fn spawn_background(&self, task: BackgroundTask) {
        // SimStore operations never wait on anything outside themselves, so the task finishes here.
        futures_lite::future::block_on(task);
    }

    fn fsync_failure(&self) -> FsyncFailure {
        FsyncFailure::StopTheWal
    }

    fn writes_are_durable(&self) -> bool {
        self.disk.borrow().durable_writes
    }
}

type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

struct TaskWaker {
    task_id: usize,
    ready: Arc<Mutex<BTreeSet<usize>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready
            .lock()
            .expect("no panics while holding the ready set")
            .insert(self.task_id);
    }
}

/// A single-threaded executor that polls ready tasks in a seeded random order, so that a seed
/// replays one interleaving exactly.
pub struct SimExecutor {
    tasks: Vec<Option<LocalTask>>,
    ready: Arc<Mutex<BTreeSet<usize>>>,
    rng: StdRng,
    /// Upper bound on spawned tasks: a simulation that spawns without limit is a bug.
    tasks_max: usize,
}

impl SimExecutor {
    /// An executor whose scheduling order follows `seed`, running at most `tasks_max` tasks.
    pub fn new(seed: u64, tasks_max: usize) -> Self {
        SimExecutor {
            tasks: Vec::new(),
            ready: Arc::new(Mutex::new(BTreeSet::new())),
            rng: StdRng::seed_from_u64(seed),
            tasks_max,
        }
    }

    /// Adds a task; it is ready to run.
    pub fn spawn(&mut self, task: impl Future<Output = ()> + 'static) {
        assert!(
            self.tasks.len() < self.tasks_max,
            "more than {} sim tasks",
            self.tasks_max
        );
        let task_id = self.tasks.len();
        self.tasks.push(Some(Box::pin(task)));
        self.ready
            .lock()
            .expect("no panics while holding the ready set")
            .insert(task_id);
    }

    /// Polls one ready task chosen at random; returns false when no task is ready.
    pub fn step(&mut self) -> bool {
        let task_id = {
            let mut ready = self
                .ready
                .lock()
                .expect("no panics while holding the ready set");
            if ready.is_empty() {
                return false;
            }
            let nth = self.rng.gen_range(0..ready.len());
            let task_id = *ready.iter().nth(nth).expect("nth < len");
            ready.remove(&task_id);
            task_id
        };
        let Some(task) = self.tasks[task_id].as_mut() else {
            return true; // A stale wake-up of a finished task.
        };
        let waker = Waker::from(Arc::new(TaskWaker {
            task_id,
            ready: self.ready.clone(),
        }));
        if task
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
        {
            self.tasks[task_id] = None;
        }
        true
    }

    /// Runs until no task is ready or `steps_max` polls were made; returns the polls made.
    pub fn run(&mut self, steps_max: usize) -> usize {
        let mut steps = 0;
        while steps < steps_max && self.step() {
            steps += 1;
        }
        steps
    }

    /// Tasks that have not finished.
    pub fn unfinished(&self) -> usize {
        self.tasks.iter().filter(|t| t.is_some()).count()
    }
}
