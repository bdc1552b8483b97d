//! The storage seam: the handful of file operations the WAL needs.
//!
//! The WAL logic (framing, batching, recovery, rotation) is written once over this trait. `DmaStore`
//! implements it with glommio `DmaFile`s (O_DIRECT, io_uring); `SimStore` implements it in memory
//! with seeded crashes, torn writes and injected EIO, so the same WAL code runs in simulations.

use std::future::Future;
use std::io;
use std::pin::Pin;

/// A detached background task (the spare-segment preparation).
pub type BackgroundTask = Pin<Box<dyn Future<Output = ()>>>;

/// What the WAL does when an fdatasync fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncFailure {
    /// Abort the process: the kernel may have dropped the dirty pages and cleared the error,
    /// so a retry could "succeed" without the data. Restart and recover instead. What real
    /// disks get.
    Abort,
    /// Stop the WAL (every call fails) and let the caller end the process: for a simulated
    /// disk, whose simulation must go on after the member dies.
    StopTheWal,
}

/// Segment files, named by a sequence number, on one storage device.
///
/// All offsets and lengths passed to `write_at` are multiples of `frame::BLOCK_BYTES`.
/// Implementations are single-threaded (their futures are `!Send`), like the WAL itself.
#[allow(async_fn_in_trait)] // The WAL lives on one executor; nothing here is ever sent across threads.
pub trait SegmentStore: 'static {
    /// An open segment.
    type Segment: 'static;

    /// A human-readable name of segment `seq` for errors and logs (the file path).
    fn describe(&self, seq: u64) -> String;

    /// The sequence numbers of all complete segments, ascending. Removes leftovers of segment
    /// creations that a crash interrupted.
    async fn list(&self) -> io::Result<Vec<u64>>;

    /// Creates segment `seq` with `capacity_bytes` of zeros, durably, and makes it visible only once
    /// complete (so a crash never leaves a half-created segment under a segment name).
    async fn create(&self, seq: u64, capacity_bytes: u64) -> io::Result<Self::Segment>;

    /// Opens an existing segment for reading and writing.
    async fn open(&self, seq: u64) -> io::Result<Self::Segment>;

    /// Removes segment `seq` durably.
    async fn remove(&self, seq: u64) -> io::Result<()>;

    /// The segment's size in bytes.
    async fn len_bytes(&self, segment: &Self::Segment) -> io::Result<u64>;

    /// Reads up to `len` bytes at `offset`; shorter only at the end of the file.
    async fn read_at(
        &self,
        segment: &Self::Segment,
        offset: u64,
        len: usize,
    ) -> io::Result<Vec<u8>>;

    /// Writes all of `data` at `offset`; both are block-aligned. Not durable until `fdatasync`,
    /// unless `writes_are_durable`.
    async fn write_at(&self, segment: &Self::Segment, offset: u64, data: &[u8]) -> io::Result<()>;

    /// Makes every completed write to the segment durable.
    async fn fdatasync(&self, segment: &Self::Segment) -> io::Result<()>;

    /// Whether a completed `write_at` is already durable (segments opened with O_DSYNC). The
    /// WAL then acknowledges a batch when its write completes, with no `fdatasync` after it,
    /// and treats a failed write as a failed sync (see `fsync_failure`): an error from a
    /// synchronous write may be the sync's.
    fn writes_are_durable(&self) -> bool {
        false
    }

    /// Runs `task` in the background on the current executor.
    fn spawn_background(&self, task: BackgroundTask);

    /// What a failed `fdatasync` does to the process (see `FsyncFailure`).
    fn fsync_failure(&self) -> FsyncFailure {
        FsyncFailure::Abort
    }
}
