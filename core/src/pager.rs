//! Page faults of cold reads, taken on helper threads rather than on a shard.
//!
//! Values in durable value-log segments are read through the segment's mapping: the first
//! read of a page that is not in memory is a page fault, and the thread that takes it waits
//! for the disk. On a shard that wait would hold up every connection the shard serves. So a
//! range reads its values unchecked first (`kv::Unchecked`: slices of their records, no byte
//! read), asks mincore whether the pages of those in mapped segment files are in memory, and
//! when some are not, hands the records to the pager and awaits it: a pager thread asks the
//! kernel to read them all ahead and reads one byte of each page, and the shard serves others
//! meanwhile. The crc check that follows, on the shard, then finds the pages in memory.
//!
//! The kernel may still drop a page between the pager's read and the shard's (under memory
//! pressure), and then the shard faults as it did before; the pager makes the common case
//! fast, it does not pin pages. A full queue, or a member whose pager is not started (the
//! library's tests), also leaves the faults to the shard.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::task::{Context, Poll};

use bytes::Bytes;
use crossbeam::channel::{Receiver, Sender, TrySendError};
use futures_channel::oneshot;

/// Threads that take faults. They wait on the disk, not on a CPU, and several keep an NVMe
/// drive's queue busy while each waits for its own job.
pub const PAGER_THREADS: usize = 4;
/// Jobs waiting for a pager thread; past it a shard takes its own faults. A job is one
/// read's records on disk: a range's first `RANGE_FIRST_KVS_MAX` or one batch of its rest,
/// or a whole range the JSON gateway, a sort or a filter reads (as large as the range), or
/// the values a txn about to be applied reads, which the job may list itself
/// (`bring_in_listed`: as many as the txn compares).
pub const PAGER_QUEUE_JOBS_MAX: usize = 64;
/// Records a pager thread lists of a txn's reads before it brings their pages in: one chunk
/// is held at a time (2 MiB of handles), whatever the txn compares.
pub const PAGER_LIST_CHUNK_RECORDS: usize = 65_536;
/// Pages a read may ask mincore about on the shard (one call per run of touching pages, and
/// per `keel_io::pages::PAGES_PER_CALL` of a long one). A read on more pages (1 MiB of
/// values at 4 KiB pages) goes to the pager without asking: it is large, and the pager's
/// reads of pages already in memory cost little.
pub const RESIDENCY_PAGES_MAX: usize = 256;

/// What the pager did, for /metrics.
#[derive(Debug, Default)]
pub struct PagerStats {
    /// Reads whose pages were all in memory: served with no hand-off. (Reads with no
    /// value in a mapped segment file ask nothing and are not counted.)
    pub reads_in_memory: AtomicU64,
    /// Reads handed to the pager.
    pub reads_paged: AtomicU64,
    /// Reads that found the pager's queue full (or the pager not started) and took their
    /// own faults.
    pub reads_unpaged: AtomicU64,
    /// Pages mincore found missing (reads that asked it).
    pub pages_missing: AtomicU64,
}

struct Job {
    records: Vec<Bytes>,
    /// More records to list first, on the pager thread (`Member::take_pages_wanted`).
    rest: Option<keel_kv::TxnReads>,
    done: oneshot::Sender<()>,
}

/// The pager threads' queue, started once (`start`) by the member.
#[derive(Default)]
pub struct Pager {
    jobs: OnceLock<Sender<Job>>,
    pub stats: PagerStats,
}

impl std::fmt::Debug for Pager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pager")
            .field("started", &self.jobs.get().is_some())
            .field("stats", &self.stats)
            .finish()
    }
}

/// The wait for a pager thread to have brought a read's pages in.
pub struct PagerWait(oneshot::Receiver<()>);

impl PagerWait {
    /// Whether the pages are in by now (or the pager gave up on them), without waiting: for
    /// a caller that polls between other work rather than awaiting.
    pub fn is_done(&mut self) -> bool {
        !matches!(self.0.try_recv(), Ok(None))
    }
}

impl Future for PagerWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // A pager thread that ended without answering (the process is stopping) leaves the
        // faults to the reader, as a full queue does.
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

/// Whether the pages of `records` are in memory (`MemberConfig::values_resident`): what the
/// raft core asks before it applies an entry that reads values. None, without asking, for
/// more pages than a shard would ask about: the pager looks, once.
pub fn values_resident(records: &[Bytes]) -> Option<bool> {
    keel_io::pages::pages_missing_within(records.iter().map(|r| &r[..]), RESIDENCY_PAGES_MAX)
        .map(|missing| missing == 0)
}

impl Pager {
    /// Starts the pager threads, from a thread that is not pinned (they run on any of the
    /// process's CPUs). Calling it again does nothing.
    pub fn start(&self) -> std::io::Result<()> {
        if self.jobs.get().is_some() {
            return Ok(());
        }
        let (tx, rx) = crossbeam::channel::bounded::<Job>(PAGER_QUEUE_JOBS_MAX);
        for i in 0..PAGER_THREADS {
            let rx: Receiver<Job> = rx.clone();
            crate::rt::spawn_beside(&format!("keel-pager-{i}"), move || {
                // Ends when the member's pager (the queue's sender) is dropped.
                for job in rx {
                    keel_io::pages::fault_in(job.records.iter().map(|r| &r[..]));
                    if let Some(rest) = &job.rest {
                        rest.for_each_chunk(PAGER_LIST_CHUNK_RECORDS, |chunk| {
                            keel_io::pages::fault_in(chunk.iter().map(|r| &r[..]));
                        });
                    }
                    let _ = job.done.send(());
                }
            })?;
        }
        let _ = self.jobs.set(tx);
        Ok(())
    }

    /// Makes sure the pages of the records `unchecked` will read are in memory before the
    /// calling thread reads them: None when they are (or the faults are left to the caller),
    /// else the wait for a pager thread to bring them in.
    pub fn bring_in<T>(&self, unchecked: &keel_kv::Unchecked<T>) -> Option<PagerWait> {
        self.bring_in_records(unchecked.records_on_disk())
    }

    /// Serves a read: its values' pages brought in (awaiting a pager thread where some are
    /// missing, while the calling shard serves others), then its records checked.
    ///
    /// Not an `async fn`: the pages are asked for here, when called, and the future holds
    /// the read once (an `async fn` holds each argument twice, and every write's answer and
    /// every read's task carries this future).
    pub fn serve<T>(&self, unchecked: keel_kv::Unchecked<T>) -> impl Future<Output = T> {
        let wait = self.bring_in(&unchecked);
        async move {
            if let Some(wait) = wait {
                wait.await;
            }
            unchecked.check()
        }
    }

    /// `bring_in_records` of `records`, and of every record `rest` lists, which the pager
    /// thread lists itself (a txn that compares more values than the raft core looks at).
    /// Whether they are in memory is not asked first: `rest` is not listed yet.
    pub fn bring_in_listed(
        &self,
        records: Vec<Bytes>,
        rest: keel_kv::TxnReads,
    ) -> Option<PagerWait> {
        self.queue(records, Some(rest))
    }

    /// Queues a job for a pager thread: its wait, or None (counted) when the pager is not
    /// started or its queue is full, and the caller takes the faults.
    fn queue(&self, records: Vec<Bytes>, rest: Option<keel_kv::TxnReads>) -> Option<PagerWait> {
        let Some(jobs) = self.jobs.get() else {
            self.stats.reads_unpaged.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let (done, wait) = oneshot::channel();
        let job = Job {
            records,
            rest,
            done,
        };
        match jobs.try_send(job) {
            Ok(()) => {
                self.stats.reads_paged.fetch_add(1, Ordering::Relaxed);
                Some(PagerWait(wait))
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.stats.reads_unpaged.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// `bring_in` for any bytes this process holds (a read of none asks nothing).
    pub fn bring_in_records<'a>(
        &self,
        records: impl Iterator<Item = &'a Bytes> + Clone,
    ) -> Option<PagerWait> {
        records.clone().next()?;
        let spans = records.clone().map(|r| &r[..]);
        if let Some(missing) = keel_io::pages::pages_missing_within(spans, RESIDENCY_PAGES_MAX) {
            if missing == 0 {
                self.stats.reads_in_memory.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            self.stats
                .pages_missing
                .fetch_add(missing as u64, Ordering::Relaxed);
        }
        self.queue(records.cloned().collect(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// `pages` pages of a synced file, mapped, dropped from the page cache.
    fn cold_file(pages: usize) -> (tempfile::NamedTempFile, Bytes) {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(&vec![9u8; pages * keel_io::pages::page_bytes()])
            .expect("write");
        file.as_file().sync_all().expect("sync");
        keel_io::pages::drop_cached(file.as_file()).expect("fadvise");
        let mapped = keel_io::vlog::map_file(file.path()).expect("map");
        (file, mapped)
    }

    #[test]
    fn cold_pages_are_brought_in_by_a_pager_thread() {
        let (_file, bytes) = cold_file(16);
        let page = keel_io::pages::page_bytes();
        // Records on pages 0, 5..6 and 15.
        let records = [
            bytes.slice(10..20),
            bytes.slice(5 * page + 1..6 * page + 3),
            bytes.slice(15 * page..16 * page),
        ];
        let spans = || records.iter().map(|r| &r[..]);
        assert!(
            keel_io::pages::pages_missing(spans()) > 0,
            "DONTNEED dropped them"
        );

        let unstarted = Pager::default();
        assert!(unstarted.bring_in_records(records.iter()).is_none());
        assert_eq!(unstarted.stats.reads_unpaged.load(Ordering::Relaxed), 1);

        let pager = Pager::default();
        pager.start().expect("threads start");
        let wait = pager
            .bring_in_records(records.iter())
            .expect("some pages are missing");
        futures_lite::future::block_on(wait);
        assert_eq!(keel_io::pages::pages_missing(spans()), 0);
        assert_eq!(pager.stats.reads_paged.load(Ordering::Relaxed), 1);
        assert!(pager.stats.pages_missing.load(Ordering::Relaxed) > 0);
        // In memory now: no hand-off.
        assert!(pager.bring_in_records(records.iter()).is_none());
        assert_eq!(pager.stats.reads_in_memory.load(Ordering::Relaxed), 1);
        assert!(pager.bring_in_records([].iter()).is_none());
    }

    #[test]
    fn a_full_queue_leaves_the_faults_to_the_reader() {
        let pager = Pager::default();
        // A queue no thread takes from: started by hand with a receiver that is held idle.
        let (tx, _idle) = crossbeam::channel::bounded::<Job>(1);
        pager.jobs.set(tx).expect("not started");
        let (_file, bytes) = cold_file(4);
        let records = [bytes.slice(0..100)];
        assert!(pager.bring_in_records(records.iter()).is_some(), "queued");
        assert!(pager.bring_in_records(records.iter()).is_none(), "full");
        assert_eq!(pager.stats.reads_unpaged.load(Ordering::Relaxed), 1);
    }
}
