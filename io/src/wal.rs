//! The write-ahead log: group commit, rotation, release and recovery over a `SegmentStore`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use crate::error::WalError;
use crate::frame::{
    align_down, align_up, encode_batch, find_later_header, frame_padded_bytes, parse_batch,
    BatchParse, Record, BATCH_HEADER_BYTES, BLOCK_BYTES, FRAME_HEADER_BYTES,
};
use crate::store::{FsyncFailure, SegmentStore};

/// Limits and sizes of a WAL. `WalConfig::default()` suits production; tests shrink it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalConfig {
    /// Size of each preallocated, zero-filled segment file.
    pub segment_bytes: u64,
    /// Most bytes (framed records) one batch writes; also the largest record.
    pub batch_bytes_max: usize,
    /// Most records one batch writes.
    pub batch_records_max: usize,
    /// Most records waiting for the next batch; appenders beyond it wait (first come, first served).
    pub queue_records_max: usize,
    /// Most framed bytes waiting for the next batch.
    pub queue_bytes_max: usize,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            segment_bytes: 64 << 20,
            batch_bytes_max: 1 << 20,
            batch_records_max: 4096,
            queue_records_max: 16384,
            queue_bytes_max: 8 << 20,
        }
    }
}

impl WalConfig {
    /// Panics on a configuration no WAL can run with (a programmer error).
    pub fn assert_valid(&self) {
        assert!(
            self.segment_bytes % BLOCK_BYTES as u64 == 0,
            "segment_bytes must be block-aligned"
        );
        assert!(
            self.batch_bytes_max >= frame_padded_bytes(0),
            "batch_bytes_max below one empty record"
        );
        assert!(
            self.batch_records_max >= 1 && self.queue_records_max >= 1 && self.queue_bytes_max >= 1
        );
        // A batch must always fit in a fresh segment, or rotation could not make progress.
        let batch_write_bytes_max =
            align_up(BATCH_HEADER_BYTES + self.batch_bytes_max, BLOCK_BYTES);
        assert!(
            self.segment_bytes >= batch_write_bytes_max as u64,
            "segment_bytes {} cannot hold a batch of batch_bytes_max {}",
            self.segment_bytes,
            self.batch_bytes_max
        );
    }

    /// Largest payload one record may carry.
    pub fn record_payload_bytes_max(&self) -> usize {
        self.batch_bytes_max - FRAME_HEADER_BYTES
    }
}

/// Counters of the WAL's work since `open`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalStats {
    /// Records made durable.
    pub records: u64,
    /// Batches written: one durable write each (a write then an fdatasync, or one synchronous
    /// write where the store's writes are durable).
    pub batches: u64,
    /// fdatasync calls on segments (each batch's where writes are not durable, plus recovery's
    /// truncation).
    pub fdatasyncs: u64,
    /// Bytes handed to the store in writes (whole blocks, tail block rewrites included).
    pub bytes_written: u64,
    /// Segments the log moved on to.
    pub rotations: u64,
    /// Segments deleted by `release_before`.
    pub segments_released: u64,
}

struct Segment<S: SegmentStore> {
    seq: u64,
    handle: Rc<S::Segment>,
    capacity_bytes: u64,
    /// Largest record index in the segment; `None` while it holds no record.
    index_max: Option<u64>,
}

/// One `append` call's progress.
struct Call {
    records_left: Cell<usize>,
    outcome: RefCell<Option<Result<(), WalError>>>,
    waker: RefCell<Option<Waker>>,
}

impl Call {
    fn finish(&self, outcome: Result<(), WalError>) {
        *self.outcome.borrow_mut() = Some(outcome);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    fn wake(&self) {
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

struct Pending {
    record: Record,
    frame_bytes: usize,
    call: Rc<Call>,
}

enum Spare<S: SegmentStore> {
    Absent,
    Preparing,
    Ready(Segment<S>),
    Failed,
}

struct State<S: SegmentStore> {
    /// Live segments, oldest first; the last one is the active segment the next batch goes to.
    segments: VecDeque<Segment<S>>,
    /// Offset in the active segment where the next batch starts.
    write_pos: u64,
    /// The bytes of the active segment from `align_down(write_pos)` to `write_pos`: the next batch
    /// rewrites that block whole (O_DIRECT), and these bytes must come back unchanged.
    tail_block: Vec<u8>,
    /// The last batch's encoding buffer, emptied, for the next batch (one batch is in flight
    /// at a time). A fresh buffer each batch cost the raft core a page fault for every 4 KiB
    /// of it. Kept only up to `ENCODE_BUFFER_KEPT_BYTES_MAX`.
    encode_buffer: Vec<u8>,
    next_batch_seq: u64,
    queue: VecDeque<Pending>,
    queue_bytes: usize,
    batch_in_flight: bool,
    stopped: Option<String>,
    /// First-come-first-served admission to the bounded queue: a ticket per `append` call.
    ticket_next: u64,
    ticket_admitted_next: u64,
    tickets_abandoned: BTreeSet<u64>,
    admission_wakers: BTreeMap<u64, Waker>,
    spare: Spare<S>,
    spare_waker: Option<Waker>,
    stats: WalStats,
}

struct Inner<S: SegmentStore> {
    store: S,
    config: WalConfig,
    state: RefCell<State<S>>,
}

/// The write-ahead log over a `SegmentStore`: `Wal<DmaStore>` in production, `Wal<SimStore>` in
/// simulations (see the `DmaWal` and `SimWal` aliases).
///
/// It lives on one executor (`!Send`) and is shared by reference between the tasks that append.
pub struct Wal<S: SegmentStore> {
    inner: Rc<Inner<S>>,
}

/// Admission ticket that gives its place up if the `append` future is dropped while waiting.
struct Admission<'a, S: SegmentStore> {
    inner: &'a Inner<S>,
    ticket: u64,
    admitted: bool,
}

impl<S: SegmentStore> Drop for Admission<'_, S> {
    fn drop(&mut self) {
        if !self.admitted {
            let mut state = self.inner.state.borrow_mut();
            state.admission_wakers.remove(&self.ticket);
            state.tickets_abandoned.insert(self.ticket);
            if state.ticket_admitted_next == self.ticket {
                state.advance_admission();
            }
        }
    }
}

/// Stops the WAL if the leader's future is dropped mid-batch: the tail on disk is then unknown.
struct BatchGuard<'a, S: SegmentStore> {
    inner: &'a Inner<S>,
    calls: Vec<Rc<Call>>,
    armed: bool,
}

impl<S: SegmentStore> Drop for BatchGuard<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            let mut state = self.inner.state.borrow_mut();
            state.stop(
                "an append was cancelled while its batch was being written",
                &self.calls,
            );
        }
    }
}

/// A batch's sync failed (its fdatasync, or its synchronous write: see
/// `SegmentStore::writes_are_durable`). The kernel may have dropped the dirty pages and cleared
/// the error, so a retry could "succeed" without the data: never retry a sync; restart and
/// recover instead, as the store's `fsync_failure` says.
fn failed_sync<S: SegmentStore>(
    inner: &Inner<S>,
    what: &str,
    error: &std::io::Error,
    guard: &mut BatchGuard<'_, S>,
) {
    match inner.store.fsync_failure() {
        FsyncFailure::Abort => {
            tracing::error!(%error, "wal: {what} failed; aborting");
            std::process::abort();
        }
        FsyncFailure::StopTheWal => {
            guard.armed = false;
            let reason = format!("{what} failed: {error}");
            inner.state.borrow_mut().stop(&reason, &guard.calls);
        }
    }
}

impl<S: SegmentStore> State<S> {
    fn active(&self) -> &Segment<S> {
        self.segments
            .back()
            .expect("a WAL always has an active segment")
    }

    fn advance_admission(&mut self) {
        self.ticket_admitted_next += 1;
        while self.tickets_abandoned.remove(&self.ticket_admitted_next) {
            self.ticket_admitted_next += 1;
        }
        self.wake_admission();
    }

    fn wake_admission(&mut self) {
        if let Some(waker) = self.admission_wakers.remove(&self.ticket_admitted_next) {
            waker.wake();
        }
    }

    /// Fails the in-flight batch's calls and every queued call, and refuses all later appends.
    fn stop(&mut self, reason: &str, in_flight: &[Rc<Call>]) {
        tracing::error!(reason, "wal stopped");
        if self.stopped.is_none() {
            self.stopped = Some(reason.to_string());
        }
        self.batch_in_flight = false;
        let stopped = || WalError::Stopped {
            reason: reason.to_string(),
        };
        for call in in_flight {
            call.finish(Err(stopped()));
        }
        for pending in std::mem::take(&mut self.queue) {
            if pending.call.outcome.borrow().is_none() {
                pending.call.finish(Err(stopped()));
            }
        }
        self.queue_bytes = 0;
        for (_, waker) in std::mem::take(&mut self.admission_wakers) {
            waker.wake();
        }
    }
}

impl<S: SegmentStore> Wal<S> {
    /// Recovers the log in `store` and opens it for appending. Returns every valid record, in order.
    ///
    /// A torn tail (the last batch, which was never acknowledged) is cut off and zeroed. An invalid
    /// batch followed by a valid later one is corruption: `WalError::Corrupt` names file and offset.
    pub async fn open(store: S, config: WalConfig) -> Result<(Wal<S>, Vec<Record>), WalError> {
        config.assert_valid();
        let seqs = store
            .list()
            .await
            .map_err(|e| WalError::io("listing segments", e))?;
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "list returns ascending sequence numbers"
        );
        let mut records = Vec::new();
        let mut segments: VecDeque<Segment<S>> = VecDeque::new();
        let mut expected_batch_seq: Option<u64> = None;
        // Once the log's end is found, later segments may only be empty ones (a prepared spare).
        // Where it ended (segment, offset, and why, when a damaged batch ended it) is what a
        // refusal must name: the damage is there, not in the later segment that shows it.
        let mut log_ended = false;
        let mut ended_at: Option<(String, usize, Option<String>)> = None;
        let mut spare: Option<Segment<S>> = None;
        // Where the data of the last kept segment ends, with that segment's bytes.
        let mut last_end: Option<(usize, Vec<u8>)> = None;
        // Segments past the end to delete, once the whole log is read and accepted: a later
        // segment may still show that the "torn" first batch was damage in the middle of the
        // log, and a refusal must leave every file as it found it, for the operator's repair.
        let mut past_the_end: Vec<(u64, String)> = Vec::new();
        for seq in seqs {
            let name = store.describe(seq);
            let handle = store
                .open(seq)
                .await
                .map_err(|e| WalError::io(format!("opening {name}"), e))?;
            let len_bytes = store
                .len_bytes(&handle)
                .await
                .map_err(|e| WalError::io(format!("sizing {name}"), e))?;
            let capacity_bytes = align_up(len_bytes as usize, BLOCK_BYTES);
            let mut bytes = store
                .read_at(&handle, 0, capacity_bytes)
                .await
                .map_err(|e| WalError::io(format!("reading {name}"), e))?;
            bytes.resize(capacity_bytes, 0);
            if log_ended {
                // Past the end of the log: a valid batch here is acknowledged data behind the end.
                if let Some(offset) = find_later_header(&bytes, 0, expected_batch_seq) {
                    let (file, end, invalid) = ended_at.clone().expect("the log ended somewhere");
                    let why_ended = invalid.unwrap_or_else(|| "the log ends here".into());
                    return Err(WalError::Corrupt {
                        file,
                        offset: end as u64,
                        reason: format!(
                            "{why_ended}; a valid batch follows in {name} at offset {offset}"
                        ),
                    });
                }
            }
            let (end, end_invalid, index_max) = if log_ended {
                (0, None, None)
            } else {
                scan_segment(&name, &bytes, &mut expected_batch_seq, &mut records)?
            };
            if end == 0 && !segments.is_empty() {
                // An empty segment after data: the prepared spare, or a new segment whose first batch
                // tore. The log ends in the previous segment. A clean spare is kept, saving its
                // zero-fill on every restart; anything else goes.
                if !log_ended {
                    ended_at = Some((name.clone(), 0, end_invalid));
                }
                log_ended = true;
                let active_seq = segments.back().expect("not empty").seq;
                let is_clean_spare = seq == active_seq + 1
                    && capacity_bytes as u64 == config.segment_bytes
                    && bytes.iter().all(|b| *b == 0);
                if is_clean_spare && spare.is_none() {
                    spare = Some(Segment {
                        seq,
                        handle: Rc::new(handle),
                        capacity_bytes: capacity_bytes as u64,
                        index_max: None,
                    });
                } else {
                    drop(handle);
                    past_the_end.push((seq, name));
                }
                continue;
            }
            segments.push_back(Segment {
                seq,
                handle: Rc::new(handle),
                capacity_bytes: capacity_bytes as u64,
                index_max,
            });
            // A clean end with room left may still be followed by the next segment: rotation happens
            // whenever the next batch does not fit. An empty first segment means an empty log.
            log_ended = end_invalid.is_some() || end == 0;
            if log_ended {
                ended_at = Some((name, end, end_invalid));
            }
            last_end = Some((end, bytes));
        }
        for (seq, name) in past_the_end {
            store
                .remove(seq)
                .await
                .map_err(|e| WalError::io(format!("removing {name}"), e))?;
        }
        let mut stats = WalStats::default();
        let (end, end_bytes) = match last_end {
            Some(last_end) => last_end,
            None => {
                assert!(segments.is_empty());
                let seq = 1;
                let name = store.describe(seq);
                let handle = store
                    .create(seq, config.segment_bytes)
                    .await
                    .map_err(|e| WalError::io(format!("creating {name}"), e))?;
                segments.push_back(Segment {
                    seq,
                    handle: Rc::new(handle),
                    capacity_bytes: config.segment_bytes,
                    index_max: None,
                });
                (0, Vec::new())
            }
        };
        let active = segments.back().expect("at least one segment");
        zero_after_end(&store, active, &end_bytes, end, &mut stats).await?;
        // What was read may not all be durable: a write that failed (EIO) or a process that
        // died may leave blocks in the device's volatile cache, readable now and lost at the
        // next power cut. Those records are returned as the log, so they must be durable
        // before anyone relies on them; later appends sync only the segment they write, so a
        // gap could otherwise open between an unsynced older tail and a synced newer segment.
        for segment in &segments {
            let name = store.describe(segment.seq);
            store
                .fdatasync(&segment.handle)
                .await
                .map_err(|e| WalError::io(format!("syncing {name}"), e))?;
            stats.fdatasyncs += 1;
        }
        let tail_block = end_bytes[align_down(end, BLOCK_BYTES)..end].to_vec();
        let state = State {
            segments,
            write_pos: end as u64,
            tail_block,
            encode_buffer: Vec::new(),
            next_batch_seq: expected_batch_seq.unwrap_or(1),
            queue: VecDeque::new(),
            queue_bytes: 0,
            batch_in_flight: false,
            stopped: None,
            ticket_next: 0,
            ticket_admitted_next: 0,
            tickets_abandoned: BTreeSet::new(),
            admission_wakers: BTreeMap::new(),
            spare: spare.map_or(Spare::Absent, Spare::Ready),
            spare_waker: None,
            stats,
        };
        let inner = Rc::new(Inner {
            store,
            config,
            state: RefCell::new(state),
        });
        Self::start_spare(&inner);
        Ok((Wal { inner }, records))
    }

    /// Appends `records` and returns once they are durable (written and fdatasync'ed), or with the
    /// error that stopped the WAL. Records of concurrent calls are written in call order; calls that
    /// arrive while a batch is being written form the next batch (group commit). Each record's
    /// `index` is the caller's: the WAL only keeps the largest per segment for `release_before`.
    ///
    /// Dropping the future before it completes is allowed while it waits; dropping it while its
    /// task leads a batch stops the WAL (the tail on disk is then unknown).
    pub async fn append(&self, records: Vec<Record>) -> Result<(), WalError> {
        let inner = &*self.inner;
        let config = &inner.config;
        let record_payload_bytes_max = config.record_payload_bytes_max();
        let mut call_bytes = 0usize;
        for record in &records {
            if record.payload.len() > record_payload_bytes_max {
                return Err(WalError::RecordTooLarge {
                    record_bytes: record.payload.len(),
                    record_bytes_max: record_payload_bytes_max,
                });
            }
            call_bytes += frame_padded_bytes(record.payload.len());
        }
        if records.is_empty() {
            return Ok(());
        }
        let call = Rc::new(Call {
            records_left: Cell::new(records.len()),
            outcome: RefCell::new(None),
            waker: RefCell::new(None),
        });
        let mut admission = {
            let mut state = inner.state.borrow_mut();
            let ticket = state.ticket_next;
            state.ticket_next += 1;
            Admission {
                inner,
                ticket,
                admitted: false,
            }
        };
        let mut records = Some(records);
        poll_fn(|cx| {
            let mut state = inner.state.borrow_mut();
            if let Some(reason) = &state.stopped {
                return Poll::Ready(Err(WalError::Stopped {
                    reason: reason.clone(),
                }));
            }
            let records_count = records.as_ref().expect("taken only when admitted").len();
            let fits = state.queue.is_empty()
                || (state.queue.len() + records_count <= config.queue_records_max
                    && state.queue_bytes + call_bytes <= config.queue_bytes_max);
            if state.ticket_admitted_next != admission.ticket || !fits {
                state
                    .admission_wakers
                    .insert(admission.ticket, cx.waker().clone());
                return Poll::Pending;
            }
            for record in records.take().expect("taken only when admitted") {
                let frame_bytes = frame_padded_bytes(record.payload.len());
                state.queue.push_back(Pending {
                    record,
                    frame_bytes,
                    call: call.clone(),
                });
            }
            state.queue_bytes += call_bytes;
            admission.admitted = true;
            state.advance_admission();
            Poll::Ready(Ok(()))
        })
        .await?;
        loop {
            let outcome = poll_fn(|cx| {
                if let Some(outcome) = call.outcome.borrow_mut().take() {
                    return Poll::Ready(Some(outcome));
                }
                let state = inner.state.borrow();
                if !state.batch_in_flight && !state.queue.is_empty() && state.stopped.is_none() {
                    return Poll::Ready(None); // This task leads the next batch.
                }
                *call.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            })
            .await;
            match outcome {
                Some(outcome) => return outcome,
                None => Self::write_batch(&self.inner).await,
            }
        }
    }

    /// Takes the next batch from the queue, writes it with the tail block in one aligned write,
    /// fdatasyncs (unless the store's writes are durable), and completes the calls whose
    /// records are all durable.
    async fn write_batch(inner: &Rc<Inner<S>>) {
        let config = &inner.config;
        let (batch, body_bytes) = {
            let mut state = inner.state.borrow_mut();
            assert!(!state.batch_in_flight && state.stopped.is_none());
            let mut batch: Vec<Pending> = Vec::new();
            let mut body_bytes = 0usize;
            while let Some(next) = state.queue.front() {
                let full = batch.len() == config.batch_records_max
                    || body_bytes + next.frame_bytes > config.batch_bytes_max;
                if full && !batch.is_empty() {
                    break;
                }
                body_bytes += next.frame_bytes;
                batch.push(state.queue.pop_front().expect("front exists"));
            }
            assert!(!batch.is_empty() && body_bytes <= config.batch_bytes_max);
            state.queue_bytes -= body_bytes;
            state.batch_in_flight = true;
            // The queue has room again.
            state.wake_admission();
            (batch, body_bytes)
        };
        let mut guard = BatchGuard {
            inner,
            calls: batch.iter().map(|pending| pending.call.clone()).collect(),
            armed: true,
        };
        let batch_write_bytes = (BATCH_HEADER_BYTES + body_bytes) as u64;
        let fits = {
            let state = inner.state.borrow();
            state.write_pos + batch_write_bytes <= state.active().capacity_bytes
        };
        if !fits {
            if let Err(error) = Self::rotate(inner).await {
                guard.armed = false;
                inner
                    .state
                    .borrow_mut()
                    .stop(&error.to_string(), &guard.calls);
                return;
            }
        }
        let (handle, seq, block_start, mut buf) = {
            let mut state = inner.state.borrow_mut();
            let mut buf = std::mem::take(&mut state.encode_buffer);
            let active = state.active();
            let block_start = align_down(state.write_pos as usize, BLOCK_BYTES);
            assert_eq!(
                block_start + state.tail_block.len(),
                state.write_pos as usize
            );
            buf.clear();
            buf.reserve(align_up(
                state.tail_block.len() + batch_write_bytes as usize,
                BLOCK_BYTES,
            ));
            buf.extend_from_slice(&state.tail_block);
            encode_batch(
                &mut buf,
                state.next_batch_seq,
                batch.iter().map(|pending| &pending.record),
            );
            assert_eq!(
                buf.len(),
                state.tail_block.len() + batch_write_bytes as usize
            );
            (active.handle.clone(), active.seq, block_start, buf)
        };
        let batch_end = block_start + buf.len();
        buf.resize(align_up(buf.len(), BLOCK_BYTES), 0);
        // With durable writes (O_DSYNC segments) the write is the sync: one I/O per batch, and
        // no turn of the executor between the write's completion and the fdatasync's start.
        let durable_writes = inner.store.writes_are_durable();
        if let Err(error) = inner
            .store
            .write_at(&handle, block_start as u64, &buf)
            .await
        {
            if durable_writes {
                let what = format!(
                    "synchronous write of {} at offset {block_start}",
                    inner.store.describe(seq)
                );
                failed_sync(inner, &what, &error, &mut guard);
                return;
            }
            guard.armed = false;
            let reason = format!(
                "writing {} at offset {block_start} failed: {error}",
                inner.store.describe(seq)
            );
            inner.state.borrow_mut().stop(&reason, &guard.calls);
            return;
        }
        if !durable_writes {
            if let Err(error) = inner.store.fdatasync(&handle).await {
                let what = format!("fdatasync of {}", inner.store.describe(seq));
                failed_sync(inner, &what, &error, &mut guard);
                return;
            }
        }
        guard.armed = false;
        {
            let mut state = inner.state.borrow_mut();
            let tail_start = align_down(batch_end, BLOCK_BYTES);
            state.tail_block = buf[tail_start - block_start..batch_end - block_start].to_vec();
            state.write_pos = batch_end as u64;
            state.next_batch_seq += 1;
            let batch_index_max = batch.iter().map(|pending| pending.record.index).max();
            let active = state
                .segments
                .back_mut()
                .expect("a WAL always has an active segment");
            active.index_max = active.index_max.max(batch_index_max);
            state.stats.batches += 1;
            state.stats.records += batch.len() as u64;
            if !durable_writes {
                state.stats.fdatasyncs += 1;
            }
            state.stats.bytes_written += buf.len() as u64;
            if buf.capacity() <= ENCODE_BUFFER_KEPT_BYTES_MAX {
                state.encode_buffer = buf;
            }
            state.batch_in_flight = false;
            if let Some(next) = state.queue.front() {
                next.call.wake(); // It leads the next batch.
            }
        }
        for pending in &batch {
            let records_left = pending.call.records_left.get() - 1;
            pending.call.records_left.set(records_left);
            if records_left == 0 {
                pending.call.finish(Ok(()));
            }
        }
    }

    /// Moves the log to the next segment (the prepared spare when there is one).
    async fn rotate(inner: &Rc<Inner<S>>) -> Result<(), WalError> {
        let next_seq = inner.state.borrow().active().seq + 1;
        let segment = loop {
            let spare = std::mem::replace(&mut inner.state.borrow_mut().spare, Spare::Absent);
            match spare {
                Spare::Ready(segment) => break segment,
                Spare::Preparing => {
                    inner.state.borrow_mut().spare = Spare::Preparing;
                    poll_fn(|cx| {
                        let mut state = inner.state.borrow_mut();
                        if matches!(state.spare, Spare::Preparing) {
                            state.spare_waker = Some(cx.waker().clone());
                            Poll::Pending
                        } else {
                            Poll::Ready(())
                        }
                    })
                    .await;
                }
                Spare::Absent | Spare::Failed => {
                    let handle = inner
                        .store
                        .create(next_seq, inner.config.segment_bytes)
                        .await
                        .map_err(|e| {
                            WalError::io(format!("creating {}", inner.store.describe(next_seq)), e)
                        })?;
                    break Segment {
                        seq: next_seq,
                        handle: Rc::new(handle),
                        capacity_bytes: inner.config.segment_bytes,
                        index_max: None,
                    };
                }
            }
        };
        assert_eq!(
            segment.seq, next_seq,
            "the spare follows the active segment"
        );
        {
            let mut state = inner.state.borrow_mut();
            assert!(state.batch_in_flight, "only the batch leader rotates");
            state.segments.push_back(segment);
            state.write_pos = 0;
            state.tail_block.clear();
            state.stats.rotations += 1;
        }
        Self::start_spare(inner);
        Ok(())
    }

    /// Starts preparing the segment after the active one in the background, unless one is ready.
    fn start_spare(inner: &Rc<Inner<S>>) {
        let seq = {
            let mut state = inner.state.borrow_mut();
            if !matches!(state.spare, Spare::Absent) {
                return;
            }
            state.spare = Spare::Preparing;
            state.active().seq + 1
        };
        let task_inner = inner.clone();
        inner.store.spawn_background(Box::pin(async move {
            let capacity_bytes = task_inner.config.segment_bytes;
            let created = task_inner.store.create(seq, capacity_bytes).await;
            let mut state = task_inner.state.borrow_mut();
            state.spare = match created {
                Ok(handle) => Spare::Ready(Segment {
                    seq,
                    handle: Rc::new(handle),
                    capacity_bytes,
                    index_max: None,
                }),
                Err(error) => {
                    // Rotation retries inline and reports the error if it persists.
                    tracing::warn!(file = %task_inner.store.describe(seq), %error, "wal: preparing a spare segment failed");
                    Spare::Failed
                }
            };
            if let Some(waker) = state.spare_waker.take() {
                waker.wake();
            }
        }));
    }

    /// Deletes the oldest segments whose records all have an index below `index` (a checkpoint
    /// covers them). The active segment is never deleted. Returns how many segments went.
    pub async fn release_before(&self, index: u64) -> Result<usize, WalError> {
        let mut released = 0;
        loop {
            let seq = {
                let mut state = self.inner.state.borrow_mut();
                if state.segments.len() <= 1 {
                    break;
                }
                let oldest = state.segments.front().expect("more than one segment");
                if oldest.index_max.is_some_and(|index_max| index_max >= index) {
                    break;
                }
                // Only a prefix goes: recovery checks that batch sequence numbers are contiguous.
                let oldest = state.segments.pop_front().expect("more than one segment");
                state.stats.segments_released += 1;
                oldest.seq
            };
            let name = self.inner.store.describe(seq);
            self.inner
                .store
                .remove(seq)
                .await
                .map_err(|e| WalError::io(format!("removing {name}"), e))?;
            released += 1;
        }
        Ok(released)
    }

    /// Waits for background work (spare-segment preparation) to finish, then drops the WAL. Call it
    /// before opening the same directory again in the same process.
    pub async fn close(self) {
        poll_fn(|cx| {
            let mut state = self.inner.state.borrow_mut();
            if matches!(state.spare, Spare::Preparing) {
                state.spare_waker = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
    }

    /// Counters since `open`.
    pub fn stats(&self) -> WalStats {
        self.inner.state.borrow().stats
    }

    /// Sequence numbers of the live segments, oldest first (the last one is active).
    pub fn segment_seqs(&self) -> Vec<u64> {
        self.inner
            .state
            .borrow()
            .segments
            .iter()
            .map(|s| s.seq)
            .collect()
    }

    /// Where the next batch goes: (active segment's sequence number, byte offset). For diagnostics.
    pub fn tail_position(&self) -> (u64, u64) {
        let state = self.inner.state.borrow();
        (state.active().seq, state.write_pos)
    }

    /// The configuration the WAL runs with.
    pub fn config(&self) -> &WalConfig {
        &self.inner.config
    }
}

/// Parses one segment's batches into `records`. Returns where its data ends, why the batch there is
/// invalid when one (torn) ends it, and the largest record index in it; errors on corruption.
fn scan_segment(
    name: &str,
    bytes: &[u8],
    expected_batch_seq: &mut Option<u64>,
    records: &mut Vec<Record>,
) -> Result<(usize, Option<String>, Option<u64>), WalError> {
    let mut pos = 0usize;
    let mut index_max: Option<u64> = None;
    loop {
        match parse_batch(bytes, pos) {
            BatchParse::End => {
                if let Some(later) = find_later_header(bytes, pos + 8, *expected_batch_seq) {
                    return Err(WalError::Corrupt {
                        file: name.to_string(),
                        offset: pos as u64,
                        reason: format!("zeroed gap before a valid batch at offset {later}"),
                    });
                }
                return Ok((pos, None, index_max));
            }
            BatchParse::Valid {
                batch_seq,
                next_pos,
                records: batch_records,
            } => {
                if let Some(expected) = *expected_batch_seq {
                    if expected != batch_seq {
                        return Err(WalError::Corrupt {
                            file: name.to_string(),
                            offset: pos as u64,
                            reason: format!(
                                "batch sequence {batch_seq} where {expected} was expected"
                            ),
                        });
                    }
                }
                *expected_batch_seq = Some(batch_seq + 1);
                let batch_index_max = batch_records.iter().map(|record| record.index).max();
                index_max = index_max.max(batch_index_max);
                records.extend(batch_records);
                pos = next_pos;
            }
            BatchParse::Invalid { reason } => {
                // Only the last batch can be torn: it was never acknowledged. A valid later batch
                // means acknowledged data sits behind the bad spot.
                if let Some(later) = find_later_header(bytes, pos + 8, *expected_batch_seq) {
                    return Err(WalError::Corrupt {
                        file: name.to_string(),
                        offset: pos as u64,
                        reason: format!("{reason}; a valid batch follows at offset {later}"),
                    });
                }
                tracing::warn!(
                    file = name,
                    offset = pos,
                    reason,
                    "wal: cutting off a torn tail"
                );
                return Ok((pos, Some(reason), index_max));
            }
        }
    }
}

/// Most bytes one zeroing write covers, to bound the buffer.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// The largest batch encoding buffer kept for the next batch: a rare large batch (a big
/// request) should not leave its memory held for every small one after it.
const ENCODE_BUFFER_KEPT_BYTES_MAX: usize = 4 << 20;
const _: () = assert!(ZERO_CHUNK_BYTES % BLOCK_BYTES == 0);

/// Zeroes every non-zero byte after `end` in the active segment and syncs, so that stale or torn
/// bytes can never be read back as valid after later, shorter batches.
async fn zero_after_end<S: SegmentStore>(
    store: &S,
    active: &Segment<S>,
    bytes: &[u8],
    end: usize,
    stats: &mut WalStats,
) -> Result<(), WalError> {
    let Some(last_non_zero) = bytes.iter().rposition(|b| *b != 0).filter(|at| *at >= end) else {
        return Ok(());
    };
    let name = store.describe(active.seq);
    let from = align_down(end, BLOCK_BYTES);
    let to = align_up(last_non_zero + 1, BLOCK_BYTES);
    assert!(from < to && to <= bytes.len());
    let mut image = bytes[from..to].to_vec();
    image[end - from..].fill(0);
    tracing::warn!(file = %name, offset = end, bytes = last_non_zero + 1 - end, "wal: zeroing bytes after the end of the log");
    for (chunk_index, chunk) in image.chunks(ZERO_CHUNK_BYTES).enumerate() {
        let offset = (from + chunk_index * ZERO_CHUNK_BYTES) as u64;
        store
            .write_at(&active.handle, offset, chunk)
            .await
            .map_err(|e| WalError::io(format!("zeroing {name} at offset {offset}"), e))?;
        stats.bytes_written += chunk.len() as u64;
    }
    store
        .fdatasync(&active.handle)
        .await
        .map_err(|e| WalError::io(format!("syncing {name}"), e))?;
    stats.fdatasyncs += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimExecutor, SimFaults, SimStore};
    use bytes::Bytes;
    use futures_lite::future::block_on;
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    fn small_config() -> WalConfig {
        WalConfig {
            segment_bytes: 16 * BLOCK_BYTES as u64,
            batch_bytes_max: 8 * 1024,
            batch_records_max: 16,
            queue_records_max: 24,
            queue_bytes_max: 16 * 1024,
        }
    }

    fn random_record(rng: &mut StdRng, index: u64) -> Record {
        let len = if rng.gen_ratio(1, 20) {
            rng.gen_range(1000..4000)
        } else {
            rng.gen_range(0..600)
        };
        let mut payload = vec![0u8; len];
        rng.fill_bytes(&mut payload);
        Record {
            kind: rng.gen(),
            index,
            payload: Bytes::from(payload),
        }
    }

    /// What the simulated world knows about the log.
    #[derive(Default)]
    struct Model {
        next_index: u64,
        /// The latest record submitted under each index.
        submitted: BTreeMap<u64, Record>,
        /// Indices that were acknowledged or recovered: they must survive every later crash.
        durable: BTreeSet<u64>,
        /// `release_before` was called with this: records below it may be gone.
        released_below: u64,
        appends_failed: u64,
    }

    impl Model {
        fn check_recovery(&mut self, seed: u64, cycle: usize, recovered: &[Record]) {
            for pair in recovered.windows(2) {
                assert_eq!(
                    pair[1].index,
                    pair[0].index + 1,
                    "seed {seed} cycle {cycle}: recovered records are contiguous, in append order"
                );
            }
            for record in recovered {
                assert_eq!(
                    self.submitted.get(&record.index),
                    Some(record),
                    "seed {seed} cycle {cycle}: record {} was appended exactly like this",
                    record.index
                );
            }
            let present: BTreeSet<u64> = recovered.iter().map(|record| record.index).collect();
            for index in self.durable.range(self.released_below..) {
                assert!(
                    present.contains(index),
                    "seed {seed} cycle {cycle}: acknowledged record {index} was lost"
                );
            }
            self.durable = present;
            if let Some(last) = recovered.last() {
                self.next_index = last.index + 1;
            }
            // Lost, unacknowledged submissions must never come back: forget them.
            let lost = self.submitted.split_off(&self.next_index);
            drop(lost);
        }
    }

    /// One seeded world: cycles of open (recover, check) → concurrent appends → crash at a random point.
    /// Odd seeds run on a store whose writes are durable (`DmaStore`'s O_DSYNC segments): the
    /// WAL then skips its fdatasyncs, and a failed write is a failed sync.
    fn run_crash_simulation(seed: u64) -> SimTotals {
        let mut totals = SimTotals::default();
        let mut rng = StdRng::seed_from_u64(seed);
        let store = if seed % 2 == 1 {
            SimStore::with_durable_writes(seed)
        } else {
            SimStore::new(seed)
        };
        let config = small_config();
        let model = Rc::new(RefCell::new(Model {
            next_index: 1,
            ..Model::default()
        }));
        let cycles = 4;
        for cycle in 0..=cycles {
            store.set_faults(SimFaults::default());
            let (wal, recovered) = block_on(Wal::open(store.clone(), config.clone()))
                .unwrap_or_else(|error| {
                    panic!("seed {seed} cycle {cycle}: recovery failed: {error}")
                });
            model.borrow_mut().check_recovery(seed, cycle, &recovered);
            totals.records_recovered += recovered.len() as u64;
            totals.tails_zeroed += wal.stats().fdatasyncs;
            if cycle == cycles {
                break;
            }
            let faults = match rng.gen_range(0..8) {
                0 | 1 => SimFaults {
                    write_eio_per_million: 30_000,
                    ..SimFaults::default()
                },
                2 => SimFaults {
                    fsync_eio_per_million: 30_000,
                    ..SimFaults::default()
                },
                _ => SimFaults::default(),
            };
            store.set_faults(faults);
            let wal = Rc::new(wal);
            let mut executor = SimExecutor::new(rng.gen(), 64);
            for _ in 0..rng.gen_range(1..=40) {
                let (wal, model) = (wal.clone(), model.clone());
                let mut task_rng = StdRng::seed_from_u64(rng.gen());
                let appends = task_rng.gen_range(1..=6);
                executor.spawn(async move {
                    for _ in 0..appends {
                        let records: Vec<Record> = {
                            let model = &mut *model.borrow_mut();
                            (0..task_rng.gen_range(1..=4))
                                .map(|_| {
                                    let record = random_record(&mut task_rng, model.next_index);
                                    model.next_index += 1;
                                    model.submitted.insert(record.index, record.clone());
                                    record
                                })
                                .collect()
                        };
                        let indices: Vec<u64> = records.iter().map(|record| record.index).collect();
                        match wal.append(records).await {
                            Ok(()) => model.borrow_mut().durable.extend(indices),
                            Err(WalError::Stopped { .. }) if faults != SimFaults::default() => {
                                model.borrow_mut().appends_failed += 1;
                                return;
                            }
                            Err(error) => {
                                panic!("seed {seed} cycle {cycle}: append failed: {error}")
                            }
                        }
                        if task_rng.gen_ratio(1, 8) {
                            let floor = model
                                .borrow()
                                .durable
                                .last()
                                .copied()
                                .unwrap_or(0)
                                .saturating_sub(60);
                            if wal.release_before(floor).await.is_ok() {
                                let model = &mut *model.borrow_mut();
                                model.released_below = model.released_below.max(floor);
                            }
                        }
                    }
                });
            }
            // Crash at a random point, sometimes only after everything finished.
            let steps_max = if rng.gen_ratio(1, 4) {
                usize::MAX
            } else {
                rng.gen_range(0..600)
            };
            executor.run(steps_max);
            drop(executor);
            totals.batches += wal.stats().batches;
            totals.rotations += wal.stats().rotations;
            totals.segments_released += wal.stats().segments_released;
            drop(wal);
            store.crash();
        }
        totals.appends_failed = model.borrow().appends_failed;
        totals.durable_writes = store.writes_are_durable();
        totals
    }

    #[derive(Debug, Default)]
    struct SimTotals {
        batches: u64,
        rotations: u64,
        segments_released: u64,
        records_recovered: u64,
        tails_zeroed: u64,
        appends_failed: u64,
        durable_writes: bool,
    }

    /// Found by the whole-cluster simulation: a write that failed with EIO left a complete
    /// batch in the volatile cache; the restarted WAL read it back as part of the log, then
    /// rotated and synced only the new segment, and a power cut lost the old tail, leaving a
    /// gap ("batch sequence N where N-1 was expected"). Everything recovery returns must
    /// survive a later crash.
    #[test]
    fn records_recovered_from_an_unsynced_tail_survive_a_later_crash() {
        for seed in 0..300u64 {
            let disk = SimStore::new(seed);
            let mut rng = StdRng::seed_from_u64(seed);
            let config = small_config();
            let record = |index: u64, rng: &mut StdRng| Record {
                kind: 1,
                index,
                payload: Bytes::from(vec![rng.gen::<u8>() | 1; rng.gen_range(10..3000)]),
            };
            let (wal, _) = block_on(Wal::open(disk.clone(), config.clone())).expect("opens");
            let mut index = 0;
            // Fill the segment until a few KiB are left, so the failed write can end near the
            // segment's end and the next append must rotate.
            let room = |wal: &Wal<SimStore>| config.segment_bytes - wal.tail_position().1;
            while index < 3 || room(&wal) > 7000 {
                index += 1;
                block_on(wal.append(vec![record(index, &mut rng)])).expect("appends");
            }
            disk.set_faults(SimFaults {
                write_eio_per_million: 1_000_000,
                ..SimFaults::default()
            });
            index += 1;
            let filler = room(&wal).saturating_sub(rng.gen_range(64..600)) as usize;
            let failed = Record {
                kind: 1,
                index,
                payload: Bytes::from(vec![7u8; filler.max(1)]),
            };
            assert!(block_on(wal.append(vec![failed])).is_err());
            drop(wal);
            disk.set_faults(SimFaults::default());
            let (wal, recovered) =
                block_on(Wal::open(disk.clone(), config.clone())).expect("reopens");
            let mut expected: Vec<u64> = recovered.iter().map(|r| r.index).collect();
            let next = expected.last().copied().unwrap_or(0);
            for i in 1..=rng.gen_range(1..10) {
                block_on(wal.append(vec![record(next + i, &mut rng)])).expect("appends");
                expected.push(next + i);
            }
            drop(wal);
            disk.crash();
            let (_, after_crash) =
                block_on(Wal::open(disk.clone(), config.clone())).expect("opens after the crash");
            let got: Vec<u64> = after_crash.iter().map(|r| r.index).collect();
            assert_eq!(got, expected, "seed {seed}");
        }
    }

    #[test]
    fn crash_simulation_keeps_every_acknowledged_append() {
        let seeds: Vec<u64> = match std::env::var("SEED") {
            Ok(seed) => vec![seed.parse().expect("SEED is a number")],
            Err(_) => (0..500).collect(),
        };
        let mut totals = Vec::new();
        for seed in seeds {
            match std::panic::catch_unwind(|| run_crash_simulation(seed)) {
                Ok(seed_totals) => totals.push(seed_totals),
                Err(panic) => {
                    eprintln!("crash simulation failed; replay with SEED={seed}");
                    std::panic::resume_unwind(panic);
                }
            }
        }
        let sum = |f: fn(&SimTotals) -> u64| totals.iter().map(f).sum::<u64>();
        let (batches, rotations) = (sum(|t| t.batches), sum(|t| t.rotations));
        let (released, zeroed, failed) = (
            sum(|t| t.segments_released),
            sum(|t| t.tails_zeroed),
            sum(|t| t.appends_failed),
        );
        eprintln!(
            "{} seeds: {batches} batches, {rotations} rotations, {released} segments released, {} records recovered, {zeroed} torn tails zeroed, {failed} appends failed by EIO",
            totals.len(),
            sum(|t| t.records_recovered)
        );
        // The simulation must reach the paths it exists to test.
        if totals.len() > 50 {
            assert!(rotations > 0 && released > 0 && zeroed > 0 && failed > 0);
            // With durable writes too: batches without fdatasyncs, and failed synchronous
            // writes stopping the log.
            let durable = totals.iter().filter(|t| t.durable_writes);
            let (durable_batches, durable_failed) =
                durable.fold((0, 0), |(b, f), t| (b + t.batches, f + t.appends_failed));
            assert!(durable_batches > 0 && durable_failed > 0);
        }
    }

    #[test]
    fn group_commit_needs_far_fewer_fdatasyncs_than_appends() {
        let store = SimStore::new(11);
        let config = WalConfig {
            segment_bytes: 1 << 20,
            batch_records_max: 64,
            queue_records_max: 256,
            ..small_config()
        };
        let (wal, recovered) =
            block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        assert!(recovered.is_empty());
        let wal = Rc::new(wal);
        let next_index = Rc::new(Cell::new(1u64));
        let acked = Rc::new(Cell::new(0usize));
        let mut executor = SimExecutor::new(11, 64);
        let (appenders, appends_each) = (64, 20);
        for _ in 0..appenders {
            let (wal, next_index, acked) = (wal.clone(), next_index.clone(), acked.clone());
            executor.spawn(async move {
                for _ in 0..appends_each {
                    let index = next_index.get();
                    next_index.set(index + 1);
                    let record = Record {
                        kind: 1,
                        index,
                        payload: Bytes::from(index.to_le_bytes().to_vec()),
                    };
                    wal.append(vec![record]).await.expect("no faults injected");
                    acked.set(acked.get() + 1);
                }
            });
        }
        let fdatasyncs_before = store.stats().fdatasyncs;
        executor.run(usize::MAX);
        assert_eq!(executor.unfinished(), 0);
        let appends = appenders * appends_each;
        assert_eq!(acked.get(), appends);
        let fdatasyncs = store.stats().fdatasyncs - fdatasyncs_before;
        assert_eq!(fdatasyncs, wal.stats().batches, "one fdatasync per batch");
        assert!(
            fdatasyncs * 10 <= appends as u64,
            "{fdatasyncs} fdatasyncs for {appends} appends: group commit did not batch"
        );
        drop(wal);
        let (_, recovered) = block_on(Wal::open(store, config)).expect("clean log reopens");
        let indices: Vec<u64> = recovered.iter().map(|record| record.index).collect();
        assert_eq!(indices, (1..=appends as u64).collect::<Vec<_>>());
    }

    fn append_one(wal: &Wal<SimStore>, index: u64, len: usize) {
        let record = Record {
            kind: 2,
            index,
            payload: Bytes::from(vec![index as u8; len]),
        };
        block_on(wal.append(vec![record])).expect("no faults injected");
    }

    #[test]
    fn release_before_deletes_only_covered_segments() {
        let store = SimStore::new(1);
        let config = small_config();
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        for index in 1..=200 {
            append_one(&wal, index, 700);
        }
        let seqs = wal.segment_seqs();
        assert!(seqs.len() >= 3, "records span several segments: {seqs:?}");
        assert_eq!(
            block_on(wal.release_before(1)).expect("release"),
            0,
            "nothing below index 1"
        );
        let released = block_on(wal.release_before(150)).expect("release");
        assert!(released >= 1);
        assert_eq!(wal.segment_seqs(), seqs[released..].to_vec());
        drop(wal);
        let (wal, recovered) = block_on(Wal::open(store.clone(), config.clone())).expect("reopens");
        let first = recovered.first().expect("records remain").index;
        assert!(first > 1 && first <= 150, "first remaining index {first}");
        assert_eq!(recovered.last().expect("records remain").index, 200);
        // Releasing everything keeps the active segment.
        block_on(wal.release_before(u64::MAX)).expect("release");
        assert_eq!(wal.segment_seqs().len(), 1);
    }

    #[test]
    fn corruption_in_the_middle_is_refused_with_file_and_offset() {
        let store = SimStore::new(2);
        let config = small_config();
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        for index in 1..=10 {
            append_one(&wal, index, 100);
        }
        drop(wal);
        // Flip a payload byte of the second batch (each append above is its own batch).
        let second_batch = align_up(BATCH_HEADER_BYTES + frame_padded_bytes(100), 8);
        store.corrupt_byte(
            1,
            second_batch + BATCH_HEADER_BYTES + FRAME_HEADER_BYTES + 5,
        );
        let error = block_on(Wal::open(store.clone(), config))
            .err()
            .expect("corruption is refused");
        let message = error.to_string();
        assert!(
            message.contains("sim:0000000000000001.wal")
                && message.contains(&format!("offset {second_batch}")),
            "{message}"
        );
    }

    /// Found by the whole-cluster soak (seed 4086584): damage to the last batch of a sealed
    /// segment ends the log there, and the refusal named the next segment at offset 0 (where
    /// the valid data showed up) instead of the damaged segment and offset.
    #[test]
    fn damage_at_the_end_of_a_sealed_segment_is_refused_naming_that_segment() {
        let store = SimStore::new(4);
        let config = small_config();
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        // Append until a batch lands in the second segment; the one before it ended the first.
        let mut last_batch_of_first = None;
        let mut index = 1;
        loop {
            let before = wal.tail_position();
            append_one(&wal, index, 1000);
            index += 1;
            if wal.tail_position().0 != 1 {
                break;
            }
            last_batch_of_first = Some(before.1);
        }
        append_one(&wal, index, 1000);
        drop(wal);
        let damaged = last_batch_of_first.expect("the first segment held batches");
        store.corrupt_byte(
            1,
            damaged as usize + BATCH_HEADER_BYTES + FRAME_HEADER_BYTES + 5,
        );
        let message = block_on(Wal::open(store, config))
            .err()
            .expect("corruption is refused")
            .to_string();
        assert!(
            message.contains("sim:0000000000000001.wal")
                && message.contains(&format!("offset {damaged}:"))
                && message.contains("a valid batch follows in sim:0000000000000002.wal"),
            "{message}"
        );
    }

    /// Found by the whole-cluster soak with values on disk (seed 7047702): damage to the first
    /// batch of a sealed segment other than the first made it look like a segment whose first
    /// batch tore, which recovery deletes. It was deleted before the next segment's valid
    /// batch made recovery refuse, so the refusal destroyed acknowledged records, and the
    /// operator's repair of the byte found no file to repair.
    #[test]
    fn damage_to_the_first_batch_of_a_sealed_segment_is_refused_and_deletes_nothing() {
        let store = SimStore::new(5);
        // Segments that hold one batch of 7,000 bytes each: a damaged first batch is then the
        // whole segment, as in the seed.
        let config = WalConfig {
            segment_bytes: 3 * BLOCK_BYTES as u64,
            batch_bytes_max: 8 * 1024,
            batch_records_max: 1,
            queue_records_max: 4,
            queue_bytes_max: 16 * 1024,
        };
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        let mut index = 1;
        while wal.tail_position().0 < 3 {
            append_one(&wal, index, 7000);
            index += 1;
        }
        append_one(&wal, index, 7000);
        drop(wal);
        let seqs_before = store.segment_seqs();
        let offset = BATCH_HEADER_BYTES + FRAME_HEADER_BYTES + 5;
        store.corrupt_byte(2, offset);
        let message = block_on(Wal::open(store.clone(), config.clone()))
            .err()
            .expect("corruption is refused")
            .to_string();
        assert!(
            message.contains("sim:0000000000000002.wal")
                && message.contains("a valid batch follows in sim:0000000000000003.wal"),
            "{message}"
        );
        assert_eq!(
            store.segment_seqs(),
            seqs_before,
            "a refusal deletes no segment"
        );
        // The operator repairs the byte: every record comes back.
        store.corrupt_byte(2, offset);
        let (_, recovered) = block_on(Wal::open(store, config)).expect("the repaired log opens");
        assert_eq!(
            recovered.iter().map(|r| r.index).collect::<Vec<_>>(),
            (1..=index).collect::<Vec<_>>()
        );
    }

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        let store = SimStore::new(3);
        let config = small_config();
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        for index in 1..=5 {
            append_one(&wal, index, 100);
        }
        let (seq, last_batch) = wal.tail_position();
        append_one(&wal, 6, 300);
        drop(wal);
        store.corrupt_byte(
            seq,
            last_batch as usize + BATCH_HEADER_BYTES + FRAME_HEADER_BYTES + 250,
        );
        let (wal, recovered) =
            block_on(Wal::open(store.clone(), config.clone())).expect("torn tail recovers");
        assert_eq!(
            recovered.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
        assert_eq!(wal.tail_position(), (seq, last_batch));
        let bytes = store.durable_bytes(seq);
        assert!(
            bytes[last_batch as usize..].iter().all(|b| *b == 0),
            "the torn batch was zeroed"
        );
        append_one(&wal, 6, 10);
        append_one(&wal, 7, 10);
        drop(wal);
        let (_, recovered) = block_on(Wal::open(store, config)).expect("reopens");
        assert_eq!(
            recovered.iter().map(|r| r.index).collect::<Vec<_>>(),
            (1..=7).collect::<Vec<_>>()
        );
        assert_eq!(
            recovered[5].payload.len(),
            10,
            "the new record 6, not the torn one"
        );
    }

    #[test]
    fn oversized_records_are_refused_without_io() {
        let store = SimStore::new(4);
        let config = small_config();
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        let writes_before = store.stats().writes;
        let record = Record {
            kind: 1,
            index: 1,
            payload: Bytes::from(vec![0; config.record_payload_bytes_max() + 1]),
        };
        let error = block_on(wal.append(vec![record])).expect_err("too large");
        assert!(matches!(error, WalError::RecordTooLarge { .. }), "{error}");
        assert_eq!(store.stats().writes, writes_before);
        append_one(&wal, 1, config.record_payload_bytes_max());
    }

    #[test]
    fn a_stale_batch_after_the_end_is_refused() {
        let store = SimStore::new(5);
        let config = small_config();
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        let mut batch_starts = Vec::new();
        for index in 1..=5 {
            batch_starts.push(wal.tail_position().1 as usize);
            append_one(&wal, index, 40);
        }
        let end = wal.tail_position().1 as usize;
        drop(wal);
        // A copy of batch 2 (sequence 2) where batch 6 would go: well-formed, but out of order.
        let bytes = store.durable_bytes(1);
        store.write_durable(1, end, &bytes[batch_starts[1]..batch_starts[2]]);
        let error = block_on(Wal::open(store, config))
            .err()
            .expect("out-of-order batch is refused");
        assert!(
            error
                .to_string()
                .contains(&format!("offset {end}: batch sequence 2 where 6")),
            "{error}"
        );
    }

    fn poll_once<F: std::future::Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        block_on(futures_lite::future::poll_once(future)).map_or(Poll::Pending, Poll::Ready)
    }

    #[test]
    fn a_dropped_waiting_append_gives_its_place_up() {
        let store = SimStore::new(6);
        let config = WalConfig {
            batch_records_max: 1,
            queue_records_max: 1,
            ..small_config()
        };
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        let record = |index: u64| Record {
            kind: 0,
            index,
            payload: Bytes::from(vec![index as u8; 8]),
        };
        let mut leading = Box::pin(wal.append(vec![record(1)]));
        assert!(
            poll_once(&mut leading).is_pending(),
            "its write is in flight"
        );
        let mut queued = Box::pin(wal.append(vec![record(2)]));
        assert!(
            poll_once(&mut queued).is_pending(),
            "queued behind the write"
        );
        let mut waiting = Box::pin(wal.append(vec![record(3)]));
        assert!(poll_once(&mut waiting).is_pending(), "the queue is full");
        let mut behind = Box::pin(wal.append(vec![record(4)]));
        assert!(
            poll_once(&mut behind).is_pending(),
            "first come, first served"
        );
        drop(waiting);
        block_on(leading).expect("append 1");
        block_on(queued).expect("append 2");
        block_on(behind).expect("append 4 is admitted although 3 left");
        drop(wal);
        let (_, recovered) = block_on(Wal::open(store, config)).expect("reopens");
        assert_eq!(
            recovered.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![1, 2, 4]
        );
    }

    #[test]
    fn a_dropped_leader_stops_the_wal() {
        let store = SimStore::new(7);
        let config = small_config();
        let (wal, _) = block_on(Wal::open(store.clone(), config.clone())).expect("fresh log opens");
        append_one(&wal, 1, 10);
        let record = Record {
            kind: 0,
            index: 2,
            payload: Bytes::from_static(b"x"),
        };
        let mut leading = Box::pin(wal.append(vec![record.clone()]));
        assert!(
            poll_once(&mut leading).is_pending(),
            "its write is in flight"
        );
        drop(leading);
        let error = block_on(wal.append(vec![record])).expect_err("the tail is unknown now");
        assert!(matches!(error, WalError::Stopped { .. }), "{error}");
        drop(wal);
        store.crash();
        let (_, recovered) = block_on(Wal::open(store, config)).expect("recovers");
        assert_eq!(recovered[0].index, 1);
    }
}
