//! keel-io: the only crate that does syscalls for storage. It holds the write-ahead log and the
//! value-log segment files.
//!
//! Bird's-eye view: `Wal<S>` turns `append(records)` calls from many tasks on one glommio executor
//! into batches (group commit): one aligned O_DIRECT write plus one fdatasync per batch, into
//! preallocated, zero-filled segment files. Every record is framed with its length, a
//! caller-defined kind, its raft index and a crc32; batches carry a header with a sequence number so
//! that recovery can cut a torn tail and refuse corruption in the middle. `release_before(index)`
//! deletes segments a checkpoint covers.
//!
//! The WAL logic is written once over the `SegmentStore` trait (module `store`):
//! - `DmaStore` (module `dma`): glommio `DmaFile`, O_DIRECT, io_uring; `DmaWal = Wal<DmaStore>`.
//! - `SimStore` (module `sim`): in memory and seeded, with crashes that keep only synced blocks
//!   plus a torn subset of the rest, and injected EIO; `SimWal = Wal<SimStore>`. It needs no
//!   glommio: drive it with `futures_lite::future::block_on` or `sim::SimExecutor`.
//!
//! Module map: `frame` (on-disk format, pure), `wal` (batching, rotation, recovery), `store` (the
//! seam), `dma` and `sim` (the two stores), `error` (`WalError`), `vlog` (keel-kv's value-log
//! segment files: written once with O_DIRECT through io_uring, made durable, mapped read-only),
//! `pages` (which pages of mapped bytes are in memory, and bringing them in off the shards).
//!
//! Architecture invariant: an `append` returns `Ok` only after its records were written and
//! fdatasync'ed; a failed fdatasync aborts the process, it is never retried nor reported as `Ok`.
//!
//! Architecture invariant: at most one batch is being written at a time, so only the last batch can
//! be torn; recovery cuts a torn tail but refuses (`WalError::Corrupt`, with file and offset) an
//! invalid batch that a valid later batch follows.
//!
//! Architecture invariant: after `open`, every byte after the end of the log in the active segment
//! is zero, and every write covers whole 4 KiB blocks at aligned offsets, rewriting the partial tail
//! block with its previous bytes unchanged.
//!
//! Architecture invariant: every queue and buffer is bounded (`WalConfig`'s `*_max` limits, 1 MiB
//! I/O chunks, one segment read at a time during recovery).
//!
//! Architecture invariant: the WAL logic does no I/O of its own: only `SegmentStore` implementations
//! touch files, so the simulation runs the exact production code.

pub mod dma;
pub mod error;
pub mod frame;
pub mod pages;
pub mod sim;
pub mod store;
pub mod vlog;
pub mod wal;

pub use dma::{measure_fsync_floor, pread_fallbacks, DmaSegment, DmaStore, FloorStats};
pub use error::WalError;
pub use frame::Record;
pub use sim::{SimExecutor, SimFaults, SimStats, SimStore};
pub use store::{FsyncFailure, SegmentStore};
pub use wal::{Wal, WalConfig, WalStats};

/// The production WAL: O_DIRECT segment files through glommio's io_uring.
pub type DmaWal = Wal<DmaStore>;
/// The simulated WAL: seeded, in memory, with crashes and faults.
pub type SimWal = Wal<SimStore>;
