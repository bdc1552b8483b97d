//! The production `SegmentStore`: glommio `DmaFile`s (O_DIRECT, io_uring) in one directory, and
//! the disk-floor probe benchmarks compare the WAL against.

use std::cell::Cell;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use glommio::io::{Directory, DmaFile, OpenOptions};

use crate::error::WalError;
use crate::frame::BLOCK_BYTES;
use crate::store::{BackgroundTask, SegmentStore};

const SEGMENT_SUFFIX: &str = ".wal";
const CREATING_SUFFIX: &str = ".wal.creating";
/// Largest single read or zero-fill write: bounds the DMA buffers.
const IO_CHUNK_BYTES: usize = 1 << 20;
const _: () = assert!(IO_CHUNK_BYTES % BLOCK_BYTES == 0);

/// Segment files `<seq as 16 hex digits>.wal` in one directory, read and written with O_DIRECT
/// through glommio's io_uring. Must be used on a glommio executor.
pub struct DmaStore {
    dir: PathBuf,
    /// Whether glommio's IOPOLL probe has been answered for this directory's device.
    primed: Cell<bool>,
}

/// The file the IOPOLL probe reads (see `prime_iopoll_probe`); removed right after.
const PROBE_FILE: &str = "iopoll.probe";

/// Reads that fell back from io_uring to pread since the process started (see `read_at`).
static PREAD_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// How many segment reads fell back to pread because io_uring refused them (0 when the IOPOLL
/// probe was primed before the device's first DmaFile, as `DmaStore` does).
pub fn pread_fallbacks() -> u64 {
    PREAD_FALLBACKS.load(Ordering::Relaxed)
}

impl DmaStore {
    /// A store over `dir`; the directory is created by `list` (that is, by `Wal::open`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DmaStore {
            dir: dir.into(),
            primed: Cell::new(false),
        }
    }

    /// Answers glommio's IOPOLL probe for this directory's device before any segment opens.
    ///
    /// The first DmaFile a process opens on a block device makes glommio probe IOPOLL support
    /// with a real read on its poll ring, and the answer is cached for the whole device. If that
    /// file is empty (a segment being created), the read hits end of file, "succeeds", and every
    /// later DMA read on the device goes to the poll ring, where this kind of disk (no poll
    /// queues) fails it with EOPNOTSUPP. A non-empty file makes the probe fail honestly with
    /// ENOTSUP, so glommio reads through the main ring. See shared/FIELD-NOTES.md.
    async fn prime_iopoll_probe(&self) -> io::Result<()> {
        if self.primed.replace(true) {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(PROBE_FILE);
        std::fs::write(&path, vec![0u8; BLOCK_BYTES * 8])?;
        let opened = OpenOptions::new().read(true).dma_open(&path).await;
        if let Ok(file) = opened {
            file.close().await?;
        }
        std::fs::remove_file(&path)?;
        Ok(())
    }

    /// O_DIRECT preads on the segment's fd: the fallback when io_uring refuses a read.
    fn pread_at(segment: &DmaSegment, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let fd = segment.file.as_raw_fd();
        let mut out = Vec::with_capacity(len);
        let mut buf = segment
            .file
            .alloc_dma_buffer(IO_CHUNK_BYTES.min(len.next_multiple_of(BLOCK_BYTES)));
        while out.len() < len {
            let want = (len - out.len()).min(buf.len());
            let aligned = want.next_multiple_of(BLOCK_BYTES);
            let at = offset + out.len() as u64;
            let at = libc::off_t::try_from(at).expect("segment offsets fit in off_t");
            // SAFETY: `buf` is a live, exclusively borrowed allocation of at least `aligned` bytes.
            let read = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), aligned, at) };
            if read < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error);
            }
            let read = read as usize;
            out.extend_from_slice(&buf.as_bytes()[..read.min(want)]);
            if read < aligned {
                break; // End of file.
            }
        }
        Ok(out)
    }

    /// The path of segment `seq`.
    pub fn segment_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:016x}{SEGMENT_SUFFIX}"))
    }

    async fn sync_dir(&self) -> io::Result<()> {
        let dir = Directory::open(&self.dir).await?;
        dir.sync().await?;
        dir.close().await?;
        Ok(())
    }
}

/// An open segment file.
pub struct DmaSegment {
    file: DmaFile,
}

async fn write_all_at(file: &DmaFile, offset: u64, data: &[u8]) -> io::Result<()> {
    assert!(
        offset % BLOCK_BYTES as u64 == 0 && data.len() % BLOCK_BYTES == 0,
        "O_DIRECT alignment"
    );
    let mut buf = file.alloc_dma_buffer(data.len());
    buf.as_bytes_mut().copy_from_slice(data);
    let written = file.write_at(buf, offset).await?;
    if written != data.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short O_DIRECT write: {written} of {} bytes", data.len()),
        ));
    }
    Ok(())
}

async fn zero_fill(file: &DmaFile, capacity_bytes: u64) -> io::Result<()> {
    let zeros = vec![0u8; IO_CHUNK_BYTES.min(capacity_bytes as usize)];
    let mut offset = 0u64;
    while offset < capacity_bytes {
        let len = (capacity_bytes - offset).min(IO_CHUNK_BYTES as u64) as usize;
        write_all_at(file, offset, &zeros[..len]).await?;
        offset += len as u64;
    }
    Ok(())
}

impl SegmentStore for DmaStore {
    type Segment = DmaSegment;

    fn describe(&self, seq: u64) -> String {
        self.segment_path(seq).display().to_string()
    }

    async fn list(&self) -> io::Result<Vec<u64>> {
        // Blocking directory calls, once at startup, before any append.
        std::fs::create_dir_all(&self.dir)?;
        self.prime_iopoll_probe().await?;
        let mut seqs = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(CREATING_SUFFIX) {
                // A segment whose creation a crash interrupted: never part of the log.
                std::fs::remove_file(entry.path())?;
            } else if let Some(hex) = name.strip_suffix(SEGMENT_SUFFIX) {
                if let Ok(seq) = u64::from_str_radix(hex, 16) {
                    if hex.len() == 16 {
                        seqs.push(seq);
                    }
                }
            }
        }
        seqs.sort_unstable();
        Ok(seqs)
    }

    async fn create(&self, seq: u64, capacity_bytes: u64) -> io::Result<DmaSegment> {
        assert!(capacity_bytes % BLOCK_BYTES as u64 == 0);
        self.prime_iopoll_probe().await?;
        let path = self.segment_path(seq);
        let creating = self.dir.join(format!("{seq:016x}{CREATING_SUFFIX}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .dma_open(&creating)
            .await?;
        file.pre_allocate(capacity_bytes, false).await?;
        // Writing the zeros (not just allocating) turns unwritten extents into written ones, so the
        // WAL's fdatasyncs later do not pay for extent conversion (about 160 µs against 87 µs here).
        zero_fill(&file, capacity_bytes).await?;
        file.fdatasync().await?;
        glommio::io::rename(&creating, &path).await?;
        self.sync_dir().await?;
        // Opened again for the log's writes, each durable when it completes (O_DSYNC). The
        // zeros above went through a plain descriptor, since one sync for 64 MiB is cheaper
        // than one per chunk.
        file.close().await?;
        self.open(seq).await
    }

    async fn open(&self, seq: u64) -> io::Result<DmaSegment> {
        self.prime_iopoll_probe().await?;
        // O_DSYNC: a batch's write is its sync (`writes_are_durable`). One I/O instead of a
        // write then an fdatasync, which io_uring hands to a worker thread after the write
        // completes and the executor has woken to submit it: on dev-vm, one client's put took
        // 22 % less server CPU and 5 % less time (BENCHMARKS.md, "The WAL's writes are its
        // syncs"). The extents are written zeros already (`create`), so a write changes no
        // metadata and the kernel can complete it with a FUA write or one cache flush.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DSYNC)
            .dma_open(self.segment_path(seq))
            .await?;
        Ok(DmaSegment { file })
    }

    async fn remove(&self, seq: u64) -> io::Result<()> {
        glommio::io::remove(self.segment_path(seq)).await?;
        self.sync_dir().await
    }

    async fn len_bytes(&self, segment: &DmaSegment) -> io::Result<u64> {
        Ok(segment.file.file_size().await?)
    }

    async fn read_at(&self, segment: &DmaSegment, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        assert!(offset % BLOCK_BYTES as u64 == 0);
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let want = (len - out.len()).min(IO_CHUNK_BYTES);
            let aligned = want.next_multiple_of(BLOCK_BYTES);
            let at = offset + out.len() as u64;
            let read = match segment.file.read_at_aligned(at, aligned).await {
                Ok(read) => read,
                Err(e) => {
                    let e = io::Error::from(e);
                    // glommio reports the poll ring's EOPNOTSUPP as an Unsupported error.
                    let unsupported = e.raw_os_error() == Some(libc::EOPNOTSUPP)
                        || e.kind() == io::ErrorKind::Unsupported;
                    if !unsupported {
                        return Err(e);
                    }
                    // The device's IOPOLL answer was cached wrong before this store could
                    // prime it (another DmaFile opened first): read the rest with pread.
                    PREAD_FALLBACKS.fetch_add(1, Ordering::Relaxed);
                    let rest = Self::pread_at(segment, at, len - out.len())?;
                    out.extend_from_slice(&rest);
                    return Ok(out);
                }
            };
            out.extend_from_slice(&read[..read.len().min(want)]);
            if read.len() < aligned {
                break; // End of file.
            }
        }
        Ok(out)
    }

    async fn write_at(&self, segment: &DmaSegment, offset: u64, data: &[u8]) -> io::Result<()> {
        write_all_at(&segment.file, offset, data).await
    }

    async fn fdatasync(&self, segment: &DmaSegment) -> io::Result<()> {
        Ok(segment.file.fdatasync().await?)
    }

    fn writes_are_durable(&self) -> bool {
        true
    }

    fn spawn_background(&self, task: BackgroundTask) {
        glommio::spawn_local(task).detach();
    }
}

/// Latency summary of a timed loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorStats {
    pub samples: usize,
    pub ops_per_sec: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl FloorStats {
    /// Summarises per-operation latencies measured back to back over `elapsed`.
    pub fn from_latencies(latencies: &mut [Duration], elapsed: Duration) -> Self {
        assert!(!latencies.is_empty(), "at least one sample");
        latencies.sort_unstable();
        let micros = |d: Duration| d.as_secs_f64() * 1e6;
        let at = |q: f64| micros(latencies[((latencies.len() - 1) as f64 * q).round() as usize]);
        let total: Duration = latencies.iter().sum();
        FloorStats {
            samples: latencies.len(),
            ops_per_sec: latencies.len() as f64 / elapsed.as_secs_f64().max(1e-9),
            mean_us: micros(total) / latencies.len() as f64,
            p50_us: at(0.50),
            p99_us: at(0.99),
            max_us: micros(*latencies.last().expect("not empty")),
        }
    }
}

/// Times `samples` rounds of one 4 KiB O_DIRECT write plus fdatasync to successive blocks of a
/// preallocated, zero-filled file in `dir`: the floor a WAL append cannot beat. Needs a glommio
/// executor. The file is removed afterwards.
pub async fn measure_fsync_floor(dir: &Path, samples: usize) -> Result<FloorStats, WalError> {
    assert!(samples > 0);
    let path = dir.join("fsync-floor.probe");
    let context = |what: &str| format!("{what} {}", path.display());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .dma_open(&path)
        .await
        .map_err(|e| WalError::io(context("creating"), e.into()))?;
    let capacity_bytes = (samples * BLOCK_BYTES) as u64;
    file.pre_allocate(capacity_bytes, false)
        .await
        .map_err(|e| WalError::io(context("preallocating"), e.into()))?;
    zero_fill(&file, capacity_bytes)
        .await
        .map_err(|e| WalError::io(context("zero-filling"), e))?;
    file.fdatasync()
        .await
        .map_err(|e| WalError::io(context("syncing"), e.into()))?;
    let block = vec![0xA5u8; BLOCK_BYTES];
    let mut latencies = Vec::with_capacity(samples);
    let started = Instant::now();
    for sample in 0..samples {
        let op_started = Instant::now();
        write_all_at(&file, (sample * BLOCK_BYTES) as u64, &block)
            .await
            .map_err(|e| WalError::io(context("writing"), e))?;
        file.fdatasync()
            .await
            .map_err(|e| WalError::io(context("syncing"), e.into()))?;
        latencies.push(op_started.elapsed());
    }
    let elapsed = started.elapsed();
    file.close()
        .await
        .map_err(|e| WalError::io(context("closing"), e.into()))?;
    glommio::io::remove(&path)
        .await
        .map_err(|e| WalError::io(context("removing"), e.into()))?;
    Ok(FloorStats::from_latencies(&mut latencies, elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Record, Wal, WalConfig};
    use bytes::Bytes;
    use glommio::{LocalExecutorBuilder, Placement};
    use std::cell::Cell;
    use std::future::Future;
    use std::io::{Seek, SeekFrom, Write};
    use std::rc::Rc;

    /// Runs `future` on a fresh glommio executor with a small io_memory.
    fn run<T>(future: impl Future<Output = T>) -> T {
        LocalExecutorBuilder::new(Placement::Unbound)
            .io_memory(1 << 20)
            .make()
            .expect("glommio executor starts")
            .run(future)
    }

    /// A directory on a real file system that supports O_DIRECT (`KEEL_WAL_TEST_DIR` overrides).
    fn test_dir() -> tempfile::TempDir {
        let parent =
            std::env::var_os("KEEL_WAL_TEST_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
        tempfile::Builder::new()
            .prefix("keel-wal-test")
            .tempdir_in(parent)
            .expect("temporary directory")
    }

    fn config() -> WalConfig {
        WalConfig {
            segment_bytes: 4 * BLOCK_BYTES as u64,
            batch_bytes_max: 8 * 1024,
            batch_records_max: 64,
            queue_records_max: 256,
            queue_bytes_max: 64 * 1024,
        }
    }

    fn record(index: u64, len: usize) -> Record {
        Record {
            kind: (index % 7) as u8,
            index,
            payload: Bytes::from(vec![(index % 251) as u8; len]),
        }
    }

    fn indices(records: &[Record]) -> Vec<u64> {
        records.iter().map(|record| record.index).collect()
    }

    /// Appends records 1..=60 one batch each, returns the last batch's (segment, offset).
    async fn fill(dir: &Path) -> (u64, u64) {
        let (wal, recovered) = Wal::open(DmaStore::new(dir), config())
            .await
            .expect("fresh log opens");
        assert!(recovered.is_empty());
        for index in 1..60 {
            wal.append(vec![record(index, 600)]).await.expect("append");
        }
        let last_batch = wal.tail_position();
        wal.append(vec![record(60, 600)]).await.expect("append");
        assert!(
            wal.segment_seqs().len() >= 3,
            "the log rotated: {:?}",
            wal.segment_seqs()
        );
        wal.close().await;
        last_batch
    }

    fn overwrite(path: &Path, offset: u64, data: &[u8]) {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .expect("segment file");
        file.seek(SeekFrom::Start(offset)).expect("seek");
        file.write_all(data).expect("write");
        file.sync_all().expect("sync");
    }

    /// Damages the last batch with `damage`, reopens, checks the cut, appends, reopens again.
    fn torn_tail_case(damage: impl FnOnce(&Path, u64)) {
        let dir = test_dir();
        run(async {
            let (seq, last_batch) = fill(dir.path()).await;
            damage(&DmaStore::new(dir.path()).segment_path(seq), last_batch);
            let (wal, recovered) = Wal::open(DmaStore::new(dir.path()), config())
                .await
                .expect("torn tail recovers");
            assert_eq!(
                indices(&recovered),
                (1..60).collect::<Vec<_>>(),
                "all but the torn record"
            );
            assert_eq!(recovered[10], record(11, 600));
            assert_eq!(wal.tail_position(), (seq, last_batch));
            for index in 60..=70 {
                wal.append(vec![record(index, 20)])
                    .await
                    .expect("append after recovery");
            }
            wal.close().await;
            let (wal, recovered) = Wal::open(DmaStore::new(dir.path()), config())
                .await
                .expect("reopens");
            assert_eq!(indices(&recovered), (1..=70).collect::<Vec<_>>());
            assert_eq!(
                recovered[59],
                record(60, 20),
                "the new record 60, not the torn one"
            );
            wal.close().await;
        });
    }

    #[test]
    fn torn_tail_of_garbage_is_cut() {
        torn_tail_case(|path, last_batch| overwrite(path, last_batch + 100, &[0xEE; 50]));
    }

    #[test]
    fn torn_tail_of_zeroes_is_cut() {
        let batch_end = last_batch_end();
        torn_tail_case(|path, last_batch| overwrite(path, last_batch + batch_end - 64, &[0; 64]));
    }

    #[test]
    fn truncated_file_is_cut() {
        torn_tail_case(|path, last_batch| {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .expect("segment file");
            file.set_len(last_batch + 100).expect("truncate");
        });
    }

    /// Size of one batch of a single 600-byte record.
    fn last_batch_end() -> u64 {
        (crate::frame::BATCH_HEADER_BYTES + crate::frame::frame_padded_bytes(600)) as u64
    }

    #[test]
    fn corruption_in_the_middle_is_refused() {
        let dir = test_dir();
        run(async {
            fill(dir.path()).await;
            let first = DmaStore::new(dir.path()).segment_path(1);
            let second_batch = last_batch_end();
            overwrite(&first, second_batch + 40, &[0xEE]);
            let error = Wal::open(DmaStore::new(dir.path()), config())
                .await
                .err()
                .expect("refused");
            let message = error.to_string();
            assert!(
                message.contains(&first.display().to_string())
                    && message.contains(&format!("offset {second_batch}")),
                "{message}"
            );
        });
    }

    /// The WAL skips its fdatasync after a batch's write because the store says its writes
    /// are durable; that holds only while every segment it hands out is open with O_DSYNC.
    #[test]
    fn segments_are_open_for_durable_writes() {
        let dir = test_dir();
        run(async {
            let store = DmaStore::new(dir.path());
            assert!(store.writes_are_durable());
            let created = store.create(1, 1 << 20).await.expect("create");
            let opened = store.open(1).await.expect("open");
            for (how, segment) in [("created", &created), ("opened", &opened)] {
                // SAFETY: F_GETFL on a descriptor the segment owns and keeps open.
                let flags = unsafe { libc::fcntl(segment.file.as_raw_fd(), libc::F_GETFL) };
                assert!(flags >= 0, "fcntl: {}", io::Error::last_os_error());
                assert_eq!(flags & libc::O_DSYNC, libc::O_DSYNC, "{how}: no O_DSYNC");
                assert_eq!(flags & libc::O_DIRECT, libc::O_DIRECT, "{how}: no O_DIRECT");
            }
        });
    }

    #[test]
    fn concurrent_appenders_share_durable_writes() {
        let dir = test_dir();
        run(async {
            let (wal, _) = Wal::open(DmaStore::new(dir.path()), config())
                .await
                .expect("fresh log opens");
            let wal = Rc::new(wal);
            let fdatasyncs_before = wal.stats().fdatasyncs;
            let next_index = Rc::new(Cell::new(1u64));
            let (appenders, appends_each) = (32, 8);
            let tasks: Vec<_> = (0..appenders)
                .map(|_| {
                    let (wal, next_index) = (wal.clone(), next_index.clone());
                    glommio::spawn_local(async move {
                        for _ in 0..appends_each {
                            let index = next_index.get();
                            next_index.set(index + 1);
                            wal.append(vec![record(index, 64)]).await.expect("append");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
            let appends = (appenders * appends_each) as u64;
            let stats = wal.stats();
            assert_eq!(stats.records, appends);
            // Each batch is one durable write (O_DSYNC), so batches count the syncs.
            assert_eq!(
                stats.fdatasyncs, fdatasyncs_before,
                "the writes were the syncs"
            );
            assert!(
                stats.batches * 4 <= appends,
                "{} batches for {appends} appends",
                stats.batches
            );
            Rc::try_unwrap(wal)
                .ok()
                .expect("tasks finished")
                .close()
                .await;
            let (wal, recovered) = Wal::open(DmaStore::new(dir.path()), config())
                .await
                .expect("reopens");
            assert_eq!(indices(&recovered), (1..=appends).collect::<Vec<_>>());
            wal.close().await;
        });
    }

    #[test]
    fn fsync_floor_probe_measures() {
        let dir = test_dir();
        let stats = run(measure_fsync_floor(dir.path(), 16)).expect("probe runs");
        assert_eq!(stats.samples, 16);
        assert!(stats.p50_us > 0.0 && stats.p50_us <= stats.p99_us && stats.p99_us <= stats.max_us);
        assert!(
            std::fs::read_dir(dir.path()).expect("dir").next().is_none(),
            "probe file removed"
        );
    }
}
