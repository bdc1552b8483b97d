//! Watch: change streams, fanned out per shard.
//!
//! The raft core encodes each applied batch of events once (`WatchBatch`: every event as
//! protobuf bytes without prev_kv) and hands the same `Arc` to every shard's hub. A hub
//! matches events to its watchers and appends pre-encoded events to per-watcher responses, so
//! a write costs one encoding however many watchers see it. The encoding with prev_kv is made
//! on a shard, by the first watcher that asks for it, so the raft core never reads a
//! previous value for a watcher.
//!
//! A watcher is *synced* (fed from live batches) or *unsynced* (catching up from MVCC history
//! with `Reader::range_events_steps`, in bounded batches, each walked in steps). A new
//! watcher whose start revision is in the past starts unsynced. A stream whose client reads too slowly, or a shard that fell behind the
//! raft core, turns its watchers unsynced instead of buffering without bound: apply never waits
//! for a watcher. `next_rev` (the first revision a watcher still needs) makes every hand-over
//! exact: events below it are never sent again, events at or above it are never skipped.
//!
//! Architecture invariant: events on a stream are ordered by revision, unique and complete,
//! and one revision's events are never split across responses unless the client asked for
//! fragments.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures_channel::oneshot;
use futures_util::future::{select, Either};
use keel_grpc::{Call, ResponseSink, Status};
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use prost::Message;

use crate::convert;
use crate::shared::{Shared, OVERFLOW_LOST};
use crate::watch_ranges::RangeIndex;

/// Encoded responses a stream may have queued before its watchers fall back to history.
pub const STREAM_QUEUE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Most bytes of queued responses one h2 write of a watch stream joins (a single larger
/// response still goes whole): big enough that a revision seen by a stream's hundreds of
/// watchers is one write, small enough that the copy stays in cache.
pub const SEND_BATCH_BYTES_MAX: usize = 256 * 1024;
/// Fewest events a catch-up read hands out (when its range has them): one read is a batch,
/// walked `limits::READ_KEYS_PER_STEP` keys at a time between the shard's other tasks.
pub const CATCHUP_EVENTS_PER_STEP: usize = 1000;
/// Most events a catch-up read hands out (but for one revision that alone holds more), the
/// bound of what it holds at once (about twice this, see `kv::EventSteps`) and of what it
/// queues on its stream at once. In events, not bytes: a batch of 4 KiB values queues about
/// 256 MiB (etcd reads a watcher's whole history at once).
pub const CATCHUP_EVENTS_PER_STEP_MAX: usize = 65_536;
/// Keys of a watcher's range per event of its next catch-up read: every read walks the whole
/// range, so a read of a range of a million keys that handed out a thousand events would
/// walk a thousand times more than it hands out. A batch of at least an eighth of the keys
/// the last read walked keeps the walking within eight keys per event handed out, up to
/// `CATCHUP_EVENTS_PER_STEP_MAX`.
pub const CATCHUP_KEYS_PER_EVENT: usize = 8;
/// Soft size of one catch-up response: history is cut into responses of about this size,
/// only ever between revisions.
pub const CATCHUP_RESPONSE_BYTES_MAX: usize = 1024 * 1024;
/// Default interval of progress notifications (etcd: 10 minutes).
pub const PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(600);

const WATCH_ID_INVALID: i64 = -1;
const REASON_EMPTY_RANGE: &str = "mvcc: watcher range is empty";
const REASON_DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
const REASON_COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
/// A create beyond `--max-watchers-per-stream` (etcd has no such limit, so no string of its
/// own): worded like etcd's errors, and fixed, so clients can match on it.
pub const REASON_TOO_MANY_WATCHERS: &str = "etcdserver: too many watchers on this watch stream";

/// One event, encoded once for every watcher of every shard.
#[derive(Debug)]
pub struct WireEvent {
    pub key: Bytes,
    pub kind: kv::EventKind,
    pub mod_revision: i64,
    /// `mvccpb.Event` without prev_kv.
    pub plain: Bytes,
    /// The key's previous state, its value not yet read (see `kv::PrevKv`).
    prev: Option<kv::PrevKv>,
    /// `mvccpb.Event` with prev_kv, encoded by the first shard with a watcher that asks for it.
    with_prev: OnceLock<Bytes>,
}

impl WireEvent {
    /// `mvccpb.Event` with prev_kv (equal to `plain` when the key had no previous version).
    /// The raft core encodes only `plain`: reading the previous value (perhaps faulting it in
    /// from a segment file) and checking it happen here, on a shard, once for all shards, and
    /// only when a watcher wants it.
    pub fn with_prev(&self) -> &Bytes {
        self.with_prev.get_or_init(|| match &self.prev {
            None => self.plain.clone(),
            Some(prev) => {
                // Protobuf fields may follow one another in any number of pieces, and prost
                // writes them in field order: `plain` (fields 1 and 2) then field 3 is
                // exactly the encoding of the whole event.
                let prev = convert::key_value(prev.clone().checked());
                let mut bytes = BytesMut::with_capacity(
                    self.plain.len() + prost::encoding::message::encoded_len(3, &prev),
                );
                bytes.extend_from_slice(&self.plain);
                prost::encoding::message::encode(3, &prev, &mut bytes);
                bytes.freeze()
            }
        })
    }
}

/// The events of one applied raft batch, ascending by revision.
#[derive(Debug)]
pub struct WatchBatch {
    /// The store revision after the batch: every event's revision is at most this.
    pub revision: i64,
    pub events: Vec<WireEvent>,
}

impl WatchBatch {
    pub fn encode(revision: i64, events: Vec<kv::Event>) -> WatchBatch {
        let events = events
            .into_iter()
            .map(|mut e| {
                let prev = e.prev_kv.take();
                WireEvent {
                    key: e.kv.key.clone(),
                    kind: e.kind,
                    mod_revision: e.kv.mod_revision,
                    plain: Bytes::from(convert::event(e, false).encode_to_vec()),
                    prev,
                    with_prev: OnceLock::new(),
                }
            })
            .collect();
        WatchBatch { revision, events }
    }
}

/// The key space a watcher covers, with etcd's conventions for range_end.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyRange {
    Single(Bytes),
    /// Every key >= the start (range_end "\0").
    From(Bytes),
    /// [start, end).
    Range(Bytes, Bytes),
}

impl KeyRange {
    fn contains(&self, key: &[u8]) -> bool {
        match self {
            KeyRange::Single(k) => k.as_ref() == key,
            KeyRange::From(s) => key >= s.as_ref(),
            KeyRange::Range(s, e) => key >= s.as_ref() && key < e.as_ref(),
        }
    }
    fn start(&self) -> &Bytes {
        match self {
            KeyRange::Single(k) | KeyRange::From(k) | KeyRange::Range(k, _) => k,
        }
    }
    /// The range_end keel-kv's history reads take.
    fn kv_end(&self) -> Bytes {
        match self {
            KeyRange::Single(_) => Bytes::new(),
            KeyRange::From(_) => Bytes::from_static(b"\0"),
            KeyRange::Range(_, e) => e.clone(),
        }
    }
}

struct Watcher {
    range: KeyRange,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    progress_notify: bool,
    fragment: bool,
    /// The first revision this watcher still needs.
    next_rev: i64,
    synced: bool,
    /// Events were sent since the last progress notification.
    sent_since_progress: bool,
    /// The bound of this watcher's next catch-up read (see `CATCHUP_KEYS_PER_EVENT`).
    catch_up_events_max: usize,
}

impl Watcher {
    fn wants(&self, kind: kv::EventKind) -> bool {
        match kind {
            kv::EventKind::Put => !self.no_put,
            kv::EventKind::Delete => !self.no_delete,
        }
    }
}

/// One gRPC Watch stream's state, shared between its call task and the shard hub.
struct Stream {
    id: u64,
    /// The stream's credentials, resolved when it opened (etcd reads them from the stream's
    /// context); each create is checked with them, or refused with their error.
    who: Result<crate::auth::AuthInfo, keel_grpc::EtcdError>,
    watchers: RefCell<BTreeMap<i64, Watcher>>,
    next_watch_id: Cell<i64>,
    queue: RefCell<VecDeque<Bytes>>,
    queue_bytes: Cell<usize>,
    unsynced: Cell<usize>,
    progress_requested: Cell<bool>,
    waker: RefCell<Option<Waker>>,
    woken: Cell<bool>,
}

impl Stream {
    fn new(id: u64, who: Result<crate::auth::AuthInfo, keel_grpc::EtcdError>) -> Stream {
        Stream {
            id,
            who,
            watchers: RefCell::new(BTreeMap::new()),
            next_watch_id: Cell::new(0),
            queue: RefCell::new(VecDeque::new()),
            queue_bytes: Cell::new(0),
            unsynced: Cell::new(0),
            progress_requested: Cell::new(false),
            waker: RefCell::new(None),
            woken: Cell::new(false),
        }
    }

    fn push(&self, frame: Bytes) {
        self.queue_bytes.set(self.queue_bytes.get() + frame.len());
        self.queue.borrow_mut().push_back(frame);
        self.wake();
    }

    /// Moves queued frames into `batch` (empty on entry), in order, while they total at most
    /// `bytes_max`; the first frame always goes, whatever its size.
    fn pop_batch(&self, batch: &mut Vec<Bytes>, bytes_max: usize) {
        debug_assert!(batch.is_empty());
        let mut queue = self.queue.borrow_mut();
        let mut taken_bytes = 0;
        while let Some(front) = queue.front() {
            if !batch.is_empty() && taken_bytes + front.len() > bytes_max {
                break;
            }
            let f = queue.pop_front().expect("front exists");
            taken_bytes += f.len();
            batch.push(f);
        }
        self.queue_bytes.set(self.queue_bytes.get() - taken_bytes);
    }

    fn wake(&self) {
        self.woken.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    async fn woken(&self) {
        std::future::poll_fn(|cx| {
            if self.woken.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    /// Moves a watcher to history catch-up. It has seen every batch up to `delivered_rev`
    /// (the hub's revision before the batch being dispatched, if any).
    fn mark_unsynced(&self, w: &mut Watcher, delivered_rev: i64) {
        if w.synced {
            w.next_rev = w.next_rev.max(delivered_rev + 1);
            w.synced = false;
            self.unsynced.set(self.unsynced.get() + 1);
        }
    }
}

/// The watchers one key reaches (see `watch_ranges::WatcherSet`).
type WatcherSet = crate::watch_ranges::WatcherSet;

/// Internal waiters (Lock and Election): woken by any change in a key range after a revision,
/// or by an overflow (they re-check by reading, so a spurious wake is harmless).
struct ChangeWaiter {
    range: KeyRange,
    after_rev: i64,
    tx: oneshot::Sender<()>,
}

/// A shard's watch hub: its streams, the index that matches events to them, and the revision
/// it has seen batches up to.
pub struct Hub {
    shard: usize,
    shared: Arc<Shared>,
    streams: RefCell<HashMap<u64, Rc<Stream>>>,
    /// Watchers on a single key, by key: matched in O(1).
    single: RefCell<HashMap<Bytes, WatcherSet>>,
    /// Watchers on ranges, in an interval tree (`watch_ranges`).
    ranges: RefCell<RangeIndex>,
    waiters: RefCell<Vec<ChangeWaiter>>,
    next_stream_id: Cell<u64>,
    delivered_rev: Cell<i64>,
    /// `dispatch`'s (stream, watch id, event index) list, kept between batches so its
    /// memory is reused.
    matched: Cell<Vec<(u64, i64, usize)>>,
    /// Watchers in the index that ask for prev_kv: while there are any, a batch's previous
    /// values on disk are brought in by the pager before it is dispatched.
    prev_kv_watchers: Cell<usize>,
    /// How many times `overflowed` sent the watchers to history. A catch-up read that waited
    /// (for the pager) across one may have missed the revisions that caused it, which no
    /// batch carries: its watcher stays unsynced and reads again.
    resyncs: Cell<u64>,
}

impl Hub {
    pub fn new(shard: usize, shared: Arc<Shared>) -> Rc<Hub> {
        let rev = shared.reader().current_revision();
        Rc::new(Hub {
            shard,
            shared,
            streams: RefCell::new(HashMap::new()),
            single: RefCell::new(HashMap::new()),
            ranges: RefCell::new(RangeIndex::default()),
            waiters: RefCell::new(Vec::new()),
            next_stream_id: Cell::new(1),
            delivered_rev: Cell::new(rev),
            matched: Cell::new(Vec::new()),
            prev_kv_watchers: Cell::new(0),
            resyncs: Cell::new(0),
        })
    }

    /// Receives the raft core's batches for this shard, forever.
    pub async fn run(self: Rc<Self>) {
        let mailbox = self.shared.watch_batches[self.shard].clone();
        loop {
            mailbox.ready().await;
            if mailbox.is_closed() && mailbox.is_empty() {
                return;
            }
            self.resync_if_overflowed();
            while let Some(batch) = mailbox.try_recv() {
                // Look at the flag after taking the batch: a drop the raft core flagged before
                // queueing this batch must turn watchers unsynced before they see it, or they
                // would skip the dropped revisions.
                self.resync_if_overflowed();
                self.bring_in_prev_values(&batch).await;
                self.dispatch(&batch);
            }
        }
    }

    fn add_watcher_count(&self, delta: isize) {
        if delta > 0 {
            self.shared
                .watchers_total
                .fetch_add(delta as usize, Ordering::SeqCst);
        } else {
            self.shared
                .watchers_total
                .fetch_sub((-delta) as usize, Ordering::SeqCst);
        }
        // Pairs with the raft core's fence between publishing a revision and reading the
        // count: either it sees this watcher, or this watcher's first history read sees the
        // revision.
        fence(Ordering::SeqCst);
    }

    /// A watcher whose prev_kv wants previous values may need a batch's previous values, and
    /// the first shard that encodes an event with its previous state reads that value
    /// (`WireEvent::with_prev`): one not written for a long time lies in a segment file and
    /// would fault the shard. So while this hub has such watchers, the pager brings those
    /// pages in first, and the shard serves its other connections meanwhile. Batches are
    /// dispatched in order, so a later one waits behind it, as it waited behind the fault.
    /// It brings in every previous value of the batch, also those only watchers without
    /// prev_kv see: finding which events reach a prev_kv watcher is dispatch's own matching,
    /// and a write's previous value is usually in memory anyway (mincore finds it there and
    /// nothing waits).
    async fn bring_in_prev_values(&self, batch: &WatchBatch) {
        if self.prev_kv_watchers.get() == 0 {
            return;
        }
        let records = batch
            .events
            .iter()
            .filter(|e| e.with_prev.get().is_none())
            .filter_map(|e| e.prev.as_ref()?.record_on_disk());
        if let Some(wait) = self.shared.pager.bring_in_records(records) {
            wait.await;
        }
    }

    fn index_add(&self, stream: u64, id: i64, range: &KeyRange, prev_kv: bool) {
        if prev_kv {
            self.prev_kv_watchers.set(self.prev_kv_watchers.get() + 1);
        }
        match range {
            KeyRange::Single(k) => {
                self.single
                    .borrow_mut()
                    .entry(k.clone())
                    .or_default()
                    .insert((stream, id));
            }
            KeyRange::From(start) => self.ranges.borrow_mut().insert(start, None, (stream, id)),
            KeyRange::Range(start, end) => {
                self.ranges
                    .borrow_mut()
                    .insert(start, Some(end), (stream, id))
            }
        }
    }

    fn index_remove(&self, stream: u64, id: i64, range: &KeyRange, prev_kv: bool) {
        if prev_kv {
            let count = self.prev_kv_watchers.get();
            assert!(count > 0, "a prev_kv watcher leaves the index once");
            self.prev_kv_watchers.set(count - 1);
        }
        match range {
            KeyRange::Single(k) => {
                let mut single = self.single.borrow_mut();
                if let Some(v) = single.get_mut(k) {
                    v.swap_remove(&(stream, id));
                    if v.is_empty() {
                        single.remove(k);
                    }
                }
            }
            KeyRange::From(start) => self.ranges.borrow_mut().remove(start, None, (stream, id)),
            KeyRange::Range(start, end) => {
                self.ranges
                    .borrow_mut()
                    .remove(start, Some(end), (stream, id))
            }
        }
    }

    fn resync_if_overflowed(&self) {
        let why = self.shared.watch_overflow[self.shard].swap(0, Ordering::AcqRel);
        if why != 0 {
            self.overflowed(why);
        }
    }

    /// Revisions were published that no batch brings this shard (a batch dropped for a slow
    /// shard, an entry's events cut, a store replaced by a snapshot, or entries applied while
    /// nobody watched as a watcher arrived): every watcher catches up from history, every
    /// waiter re-checks. `why` holds `OVERFLOW_*` bits.
    fn overflowed(&self, why: u8) {
        if why & OVERFLOW_LOST != 0 {
            tracing::info!(
                shard = self.shard,
                "revisions without a watch batch; watchers catch up from history"
            );
        } else {
            // Routine: the first watcher after writes nobody watched.
            tracing::debug!(
                shard = self.shard,
                "revisions applied unwatched; watchers catch up from history"
            );
        }
        self.resyncs.set(self.resyncs.get() + 1);
        for s in self.streams.borrow().values() {
            for w in s.watchers.borrow_mut().values_mut() {
                s.mark_unsynced(w, self.delivered_rev.get());
            }
            s.wake();
        }
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        let fired = waiters.len();
        for w in waiters {
            let _ = w.tx.send(());
        }
        // Each waiter counted as a watcher (wait_change); without this the count never returns
        // to zero and the raft core encodes batches for nobody.
        if fired > 0 {
            self.add_watcher_count(-(fired as isize));
        }
    }

    fn dispatch(&self, batch: &WatchBatch) {
        // Internal waiters first: they only need to know a delete happened.
        {
            let mut waiters = self.waiters.borrow_mut();
            if !waiters.is_empty() {
                let mut i = 0;
                while i < waiters.len() {
                    let w = &waiters[i];
                    let hit = batch
                        .events
                        .iter()
                        .any(|e| e.mod_revision > w.after_rev && w.range.contains(&e.key));
                    if hit || w.tx.is_canceled() {
                        let w = waiters.swap_remove(i);
                        let _ = w.tx.send(());
                        self.add_watcher_count(-1);
                    } else {
                        i += 1;
                    }
                }
            }
        }
        // Match: one (stream, watch id, event index) per watcher an event reaches. In a
        // vector reused from batch to batch, not a map: a revision seen by 10,000 watchers
        // would otherwise grow (and rehash) a 10,000-entry map per batch.
        let mut matched = self.matched.take();
        matched.clear();
        {
            let single = self.single.borrow();
            let ranges = self.ranges.borrow();
            for (i, e) in batch.events.iter().enumerate() {
                if let Some(ws) = single.get(&e.key) {
                    matched.extend(ws.iter().map(|&(sid, wid)| (sid, wid, i)));
                }
                ranges.for_each_covering(&e.key, |&(sid, wid)| matched.push((sid, wid, i)));
            }
        }
        if batch.events.len() > 1 {
            // Each watcher's events together, in batch order (one event reaches a watcher
            // once: the two indexes hold disjoint kinds of range, each watcher has one).
            matched.sort_unstable();
        }
        // Everything but the watch id is the same in every watcher's response: the header's
        // encoding is made once per batch.
        let header_field = encoded_header_field(self.shared.header(batch.revision));
        let limit_bytes = self.shared.config.max_request_bytes as usize;
        let streams = self.streams.borrow();
        let mut current: Option<(u64, &Rc<Stream>)> = None;
        let mut events: Vec<&Bytes> = Vec::new();
        let mut run_start = 0;
        while run_start < matched.len() {
            let (sid, wid, _) = matched[run_start];
            let mut run_end = run_start + 1;
            while run_end < matched.len() && (matched[run_end].0, matched[run_end].1) == (sid, wid)
            {
                run_end += 1;
            }
            let run = &matched[run_start..run_end];
            run_start = run_end;
            let stream = match current {
                Some((id, stream)) if id == sid => stream,
                _ => {
                    let Some(stream) = streams.get(&sid) else {
                        continue;
                    };
                    current = Some((sid, stream));
                    stream
                }
            };
            let mut watchers = stream.watchers.borrow_mut();
            let Some(w) = watchers.get_mut(&wid) else {
                continue;
            };
            if !w.synced {
                continue;
            }
            events.clear();
            for &(_, _, i) in run {
                let e = &batch.events[i];
                // The index holds each watcher under its own range only (index_add and
                // index_remove pair up), so the key need not be compared again here.
                debug_assert!(
                    w.range.contains(&e.key),
                    "the index matched a key out of range"
                );
                if e.mod_revision >= w.next_rev && w.wants(e.kind) {
                    events.push(if w.prev_kv { e.with_prev() } else { &e.plain });
                }
            }
            if events.is_empty() {
                continue;
            }
            if stream.queue_bytes.get() > STREAM_QUEUE_BYTES_MAX {
                // The client is not reading: stop buffering, catch up from history later.
                stream.mark_unsynced(w, self.delivered_rev.get());
                stream.wake();
                continue;
            }
            let total_bytes: usize = events.iter().map(|e| e.len()).sum();
            if !w.fragment || events.len() < 2 || total_bytes < limit_bytes {
                stream.push(encode_response(&header_field, wid, false, &events));
            } else {
                let header = self.shared.header(batch.revision);
                for frame in responses(header, wid, &events, true, limit_bytes) {
                    stream.push(frame);
                }
            }
            w.sent_since_progress = true;
        }
        drop(events);
        drop(streams);
        self.matched.set(matched);
        // Synced watchers need no bookkeeping here: later batches only carry later revisions,
        // and a watcher that falls out of sync resumes after `delivered_rev`.
        self.delivered_rev
            .set(self.delivered_rev.get().max(batch.revision));
    }

    /// Resolves after any change to `key` (or, with a non-empty `range_end`, to the range, in
    /// etcd's range_end forms) at a revision above `after_rev`, or spuriously after an
    /// overflow. Callers re-read before trusting what changed. Register BEFORE the read that
    /// decides to wait, so no change between the two is missed.
    pub fn wait_change(
        &self,
        key: Bytes,
        range_end: &[u8],
        after_rev: i64,
    ) -> oneshot::Receiver<()> {
        let range = if range_end.is_empty() {
            KeyRange::Single(key)
        } else if range_end == b"\0" {
            KeyRange::From(key)
        } else {
            KeyRange::Range(key, Bytes::copy_from_slice(range_end))
        };
        let (tx, rx) = oneshot::channel();
        self.add_watcher_count(1);
        self.waiters.borrow_mut().push(ChangeWaiter {
            range,
            after_rev,
            tx,
        });
        rx
    }

    /// Serves one `/etcdserverpb.Watch/Watch` stream until the client closes it.
    pub async fn serve(self: &Rc<Self>, call: Call, sink: &mut ResponseSink) -> Status {
        let id = self.next_stream_id.get();
        self.next_stream_id.set(id + 1);
        let who = crate::auth::who(&self.shared, &call.head.metadata).await;
        let stream = Rc::new(Stream::new(id, who));
        self.streams.borrow_mut().insert(id, stream.clone());
        // Closes the stream however this future ends: returning, or dropped mid-way (a reset
        // or deadline on gRPC, a JSON gateway client that hung up), so its watchers never leak.
        struct Closer<'a> {
            hub: &'a Hub,
            stream: Rc<Stream>,
        }
        impl Drop for Closer<'_> {
            fn drop(&mut self) {
                self.hub.close_stream(&self.stream);
            }
        }
        let closer = Closer { hub: self, stream };
        self.serve_stream(&closer.stream, call, sink).await
    }

    fn close_stream(&self, stream: &Rc<Stream>) {
        self.streams.borrow_mut().remove(&stream.id);
        let watchers = std::mem::take(&mut *stream.watchers.borrow_mut());
        for (wid, w) in &watchers {
            self.index_remove(stream.id, *wid, &w.range, w.prev_kv);
        }
        if !watchers.is_empty() {
            self.add_watcher_count(-(watchers.len() as isize));
        }
    }

    async fn serve_stream(
        &self,
        stream: &Rc<Stream>,
        call: Call,
        sink: &mut ResponseSink,
    ) -> Status {
        let Call {
            head: _,
            mut requests,
        } = call;
        let interval = PROGRESS_NOTIFY_INTERVAL;
        let mut next_progress = Instant::now() + interval;
        let mut client_done = false;
        let mut batch = Vec::new();
        loop {
            // What queued since the last send goes out as one h2 write (up to a bound): a
            // put seen by many watchers of this stream is one DATA chunk, not one per watcher.
            loop {
                stream.pop_batch(&mut batch, SEND_BATCH_BYTES_MAX);
                if batch.is_empty() {
                    break;
                }
                if let Err(status) = sink.send_frames(&mut batch).await {
                    return status;
                }
            }
            if stream.unsynced.get() > 0 && stream.queue_bytes.get() < STREAM_QUEUE_BYTES_MAX / 2 {
                self.catch_up_step(stream).await;
                futures_lite::future::yield_now().await;
                continue;
            }
            if stream.progress_requested.get() && stream.unsynced.get() == 0 {
                stream.progress_requested.set(false);
                let resp = pb::WatchResponse {
                    header: self.shared.header(self.stream_synced_through(stream)),
                    watch_id: WATCH_ID_INVALID,
                    ..Default::default()
                };
                stream.push(frame_of(&resp));
                continue;
            }
            let now = Instant::now();
            if now >= next_progress {
                next_progress = now + interval;
                self.progress_notify(stream);
                continue;
            }
            if client_done {
                // etcd keeps a half-closed watch stream open, watchers or none (its recvLoop
                // returns on EOF, but the stream lives until its context ends), so a JSON
                // gateway watch, whose request side always ends with the body, stays open
                // until its client hangs up. A reset or hang-up drops this future.
                let wait = Box::pin(crate::rt::sleep(next_progress - now));
                futures_util::future::select(Box::pin(stream.woken()), wait).await;
                continue;
            }
            let next = {
                let req = Box::pin(requests.decode::<pb::WatchRequest>());
                let woken = Box::pin(stream.woken());
                let timer = Box::pin(crate::rt::sleep(next_progress - now));
                match select(req, select(woken, timer)).await {
                    Either::Left((r, _)) => Some(r),
                    Either::Right(_) => None,
                }
            };
            match next {
                None => {}
                Some(Ok(Some(req))) => self.handle_request(stream, req),
                Some(Ok(None)) => client_done = true,
                Some(Err(status)) => return status,
            }
        }
    }

    fn handle_request(&self, stream: &Rc<Stream>, req: pb::WatchRequest) {
        use pb::watch_request::RequestUnion;
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(stream, c),
            Some(RequestUnion::CancelRequest(c)) => {
                let removed = stream.watchers.borrow_mut().remove(&c.watch_id);
                if let Some(w) = removed {
                    self.index_remove(stream.id, c.watch_id, &w.range, w.prev_kv);
                    if !w.synced {
                        stream.unsynced.set(stream.unsynced.get() - 1);
                    }
                    self.add_watcher_count(-1);
                    let resp = pb::WatchResponse {
                        header: self.shared.header(self.shared.reader().current_revision()),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    };
                    stream.push(frame_of(&resp));
                }
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                stream.progress_requested.set(true);
                stream.wake();
            }
            None => {}
        }
    }

    fn create(&self, stream: &Rc<Stream>, c: pb::WatchCreateRequest) {
        let rev_now = self.shared.reader().current_revision();
        let reject = |reason: &str, watch_id: i64| pb::WatchResponse {
            header: self.shared.header(rev_now),
            watch_id,
            created: true,
            canceled: true,
            cancel_reason: reason.to_string(),
            ..Default::default()
        };
        // etcd: an empty key is "\0", the smallest key; range_end "\0" means every key >= key.
        let key = if c.key.is_empty() {
            Bytes::from_static(b"\0")
        } else {
            c.key.clone()
        };
        // etcd checks read permission before anything else about the create, and refuses it
        // as a created-and-canceled watch with the error's text as the reason.
        let permitted = match &stream.who {
            Ok(who) => self.shared.auth().state.check_op(
                who,
                &c.key,
                &c.range_end,
                crate::auth::PermType::Read,
            ),
            Err(e) => Err(*e),
        };
        if let Err(e) = permitted {
            let e = match e {
                keel_grpc::EtcdError::InvalidAuthToken
                | keel_grpc::EtcdError::AuthOldRevision
                | keel_grpc::EtcdError::UserEmpty => e,
                _ => keel_grpc::EtcdError::PermissionDenied,
            };
            // etcd sends the gRPC error's Go text ("rpc error: code = ... desc = ...").
            let reason = format!("rpc error: code = {:?} desc = {}", e.code(), e.message());
            stream.push(frame_of(&reject(&reason, WATCH_ID_INVALID)));
            return;
        }
        let range = if c.range_end.is_empty() {
            KeyRange::Single(key)
        } else if c.range_end.as_ref() == b"\0" {
            KeyRange::From(key)
        } else if key.as_ref() >= c.range_end.as_ref() {
            stream.push(frame_of(&reject(REASON_EMPTY_RANGE, WATCH_ID_INVALID)));
            return;
        } else {
            KeyRange::Range(key, c.range_end.clone())
        };
        if c.start_revision < 0 {
            stream.push(frame_of(&reject(REASON_COMPACTED, WATCH_ID_INVALID)));
            return;
        }
        // Before an id is taken, so a refused create does not use one up.
        if stream.watchers.borrow().len() >= self.shared.config.max_watchers_per_stream {
            stream.push(frame_of(&reject(
                REASON_TOO_MANY_WATCHERS,
                WATCH_ID_INVALID,
            )));
            return;
        }
        let id = if c.watch_id == 0 {
            let watchers = stream.watchers.borrow();
            let mut id = stream.next_watch_id.get();
            while watchers.contains_key(&id) {
                id += 1;
            }
            stream.next_watch_id.set(id + 1);
            id
        } else if stream.watchers.borrow().contains_key(&c.watch_id) {
            stream.push(frame_of(&reject(REASON_DUPLICATE_ID, WATCH_ID_INVALID)));
            return;
        } else {
            c.watch_id
        };
        self.add_watcher_count(1);
        // Read the revision only after the count is visible to the raft core (see
        // add_watcher_count): every later revision reaches this hub as a batch.
        let current = self.shared.reader().current_revision();
        let synced = c.start_revision == 0 || c.start_revision > current;
        let next_rev = if synced {
            (current + 1).max(c.start_revision)
        } else {
            c.start_revision
        };
        let filters = &c.filters;
        let w = Watcher {
            range: range.clone(),
            no_put: filters.contains(&(pb::watch_create_request::FilterType::Noput as i32)),
            no_delete: filters.contains(&(pb::watch_create_request::FilterType::Nodelete as i32)),
            prev_kv: c.prev_kv,
            progress_notify: c.progress_notify,
            fragment: c.fragment,
            next_rev,
            synced,
            sent_since_progress: false,
            catch_up_events_max: CATCHUP_EVENTS_PER_STEP,
        };
        if !synced {
            stream.unsynced.set(stream.unsynced.get() + 1);
        }
        stream.watchers.borrow_mut().insert(id, w);
        self.index_add(stream.id, id, &range, c.prev_kv);
        // The created response goes first, before any event of this watcher.
        let resp = pb::WatchResponse {
            header: self.shared.header(current),
            watch_id: id,
            created: true,
            ..Default::default()
        };
        stream.push(frame_of(&resp));
    }

    /// One bounded history read for each unsynced watcher of the stream. Values in mapped
    /// segment files, and the previous states' for a watcher that asks for prev_kv, come in
    /// through the pager (see `pager`), so a catch-up from old revisions does not stall the
    /// shard on page faults.
    async fn catch_up_step(&self, stream: &Rc<Stream>) {
        let ids: Vec<i64> = stream
            .watchers
            .borrow()
            .iter()
            .filter(|(_, w)| !w.synced)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let (range, next_rev, prev_kv, events_max) = {
                let watchers = stream.watchers.borrow();
                let Some(w) = watchers.get(&id) else { continue };
                (
                    w.range.clone(),
                    w.next_rev,
                    w.prev_kv,
                    w.catch_up_events_max,
                )
            };
            let resyncs_before = self.resyncs.get();
            // Its own handle, held across the steps, as a range's (`range_walked`).
            let reader = arc_swap::Guard::into_inner(self.shared.reader());
            let mut keys_visited = None;
            let read = match reader.range_events_steps(
                next_rev,
                range.start(),
                &range.kv_end(),
                events_max,
                prev_kv,
            ) {
                Ok(mut steps) => {
                    // A watcher from far back on a prefix of a million keys walks them all:
                    // in steps, as a long range does, so the shard's other calls (and, on
                    // a hosted shard, the raft core) go on meanwhile.
                    while !reader.range_events_step(&mut steps, crate::limits::READ_KEYS_PER_STEP) {
                        crate::rt::let_others_run().await;
                    }
                    keys_visited = Some(steps.keys_visited());
                    reader.range_events_finish(steps)
                }
                Err(e) => Err(e),
            };
            drop(reader);
            let read = match read {
                Ok(unchecked) => Ok(self.shared.pager.serve(unchecked).await),
                Err(e) => Err(e),
            };
            let mut watchers = stream.watchers.borrow_mut();
            let Some(w) = watchers.get_mut(&id) else {
                continue;
            };
            if let Some(keys) = keys_visited {
                w.catch_up_events_max = (keys / CATCHUP_KEYS_PER_EVENT)
                    .clamp(CATCHUP_EVENTS_PER_STEP, CATCHUP_EVENTS_PER_STEP_MAX);
            }
            match read {
                Err(_) => {
                    // Compacted past what the watcher needs: cancel it with the compact revision.
                    // etcd's header here carries no revision: its watcher sends the cancel with
                    // revision 0.
                    let resp = pb::WatchResponse {
                        header: self.shared.header(0),
                        watch_id: id,
                        canceled: true,
                        compact_revision: self.shared.reader().compact_revision(),
                        ..Default::default()
                    };
                    watchers.remove(&id);
                    drop(watchers);
                    self.index_remove(stream.id, id, &range, prev_kv);
                    stream.unsynced.set(stream.unsynced.get() - 1);
                    self.add_watcher_count(-1);
                    stream.push(frame_of(&resp));
                }
                Ok(batch) => {
                    let reached_read_rev = batch.reached_read_rev();
                    let encoded: Vec<(i64, Bytes)> = batch
                        .events
                        .into_iter()
                        .filter(|e| w.wants(e.kind))
                        .map(|e| {
                            let rev = e.kv.mod_revision;
                            (
                                rev,
                                Bytes::from(convert::event(e, w.prev_kv).encode_to_vec()),
                            )
                        })
                        .collect();
                    let header = self.shared.header(self.shared.reader().current_revision());
                    // History goes out in responses of about CATCHUP_RESPONSE_BYTES_MAX, cut
                    // only between revisions, so clients with a 4 MiB receive limit (tonic's
                    // default) keep up with large catch-ups.
                    for group in revision_groups(&encoded, CATCHUP_RESPONSE_BYTES_MAX) {
                        let refs: Vec<&Bytes> = group.iter().map(|(_, b)| b).collect();
                        for frame in responses(
                            header,
                            id,
                            &refs,
                            w.fragment,
                            self.shared.config.max_request_bytes as usize,
                        ) {
                            stream.push(frame);
                        }
                        w.sent_since_progress = true;
                    }
                    w.next_rev = w.next_rev.max(batch.next_rev);
                    // Synced only once the read reached the revision it read at (a batch cut
                    // to its bound did not), past every batch this hub delivered while the
                    // watcher was unsynced (which skipped it), and if no revision without a
                    // batch was published while the read waited: `overflowed` skipped this
                    // unsynced watcher, and the read's snapshot may predate that revision.
                    // The last delivered revision alone says nothing of the history: a
                    // member with no watchers publishes no batches, so it can be far behind
                    // the read, and a watcher from an old revision was taken for synced
                    // after its first batch.
                    if reached_read_rev
                        && w.next_rev > self.delivered_rev.get()
                        && self.resyncs.get() == resyncs_before
                    {
                        w.synced = true;
                        stream.unsynced.set(stream.unsynced.get() - 1);
                    }
                }
            }
        }
    }

    /// The revision a synced watcher has been sent every event up to, given the store's
    /// `current_rev`. `delivered_rev` alone can be far behind: the raft core publishes no
    /// batches while a node has no watchers, and a watcher created since then already covers
    /// everything below its `next_rev`. A watcher waiting for a future start revision covers
    /// at most the present.
    fn synced_through(&self, w: &Watcher, current_rev: i64) -> i64 {
        assert!(
            w.synced,
            "only a synced watcher is complete up to a revision"
        );
        (w.next_rev - 1)
            .min(current_rev)
            .max(self.delivered_rev.get())
    }

    /// The revision a progress reply for a fully synced stream may claim: no event at or
    /// below it is still pending for any of the stream's watchers.
    fn stream_synced_through(&self, stream: &Stream) -> i64 {
        assert_eq!(
            stream.unsynced.get(),
            0,
            "progress only for a synced stream"
        );
        let current_rev = self.shared.reader().current_revision();
        let watchers = stream.watchers.borrow();
        let through = watchers
            .values()
            .map(|w| self.synced_through(w, current_rev))
            .min();
        // With no watchers nothing is pending: the store's revision, as etcd answers.
        through.unwrap_or(current_rev)
    }

    fn progress_notify(&self, stream: &Rc<Stream>) {
        let current_rev = self.shared.reader().current_revision();
        let mut frames = Vec::new();
        for (id, w) in stream.watchers.borrow_mut().iter_mut() {
            if w.progress_notify && w.synced && !w.sent_since_progress {
                let rev = self.synced_through(w, current_rev);
                frames.push(frame_of(&pb::WatchResponse {
                    header: self.shared.header(rev),
                    watch_id: *id,
                    ..Default::default()
                }));
            }
            w.sent_since_progress = false;
        }
        for f in frames {
            stream.push(f);
        }
    }
}

fn frame_of(resp: &pb::WatchResponse) -> Bytes {
    response_with_events_of(resp, &[])
}

/// Appends `events` (each an encoded `mvccpb.Event`) to an encoded WatchResponse as field 11,
/// without decoding or re-encoding them, behind the gRPC 5-byte prefix: one allocation.
fn response_with_events(
    header: Option<pb::ResponseHeader>,
    watch_id: i64,
    fragment: bool,
    events: &[&Bytes],
) -> Bytes {
    response_with_events_of(
        &pb::WatchResponse {
            header,
            watch_id,
            fragment,
            ..Default::default()
        },
        events,
    )
}

/// The header as `WatchResponse` encodes it (field 1), or nothing when there is none.
fn encoded_header_field(header: Option<pb::ResponseHeader>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(h) = header {
        prost::encoding::message::encode(1, &h, &mut buf);
    }
    buf
}

/// A framed `WatchResponse` with a pre-encoded header field, byte for byte what prost makes
/// of `{header, watch_id, fragment, events}` (fields in tag order; zero and false omitted).
fn encode_response(header_field: &[u8], watch_id: i64, fragment: bool, events: &[&Bytes]) -> Bytes {
    const WATCH_ID_TAG: u8 = 2 << 3;
    const FRAGMENT_TAG: u8 = 7 << 3;
    const PREFIX_BYTES: usize = 5;
    let watch_id_bytes = if watch_id != 0 {
        1 + prost::encoding::encoded_len_varint(watch_id as u64)
    } else {
        0
    };
    let body_bytes =
        header_field.len() + watch_id_bytes + if fragment { 2 } else { 0 } + events_bytes(events);
    let mut buf = BytesMut::with_capacity(PREFIX_BYTES + body_bytes);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(body_bytes).expect("watch responses stay far below 4 GiB"));
    buf.put_slice(header_field);
    if watch_id != 0 {
        buf.put_u8(WATCH_ID_TAG);
        prost::encoding::encode_varint(watch_id as u64, &mut buf);
    }
    if fragment {
        buf.put_u8(FRAGMENT_TAG);
        buf.put_u8(1);
    }
    put_events(&mut buf, events);
    assert_eq!(
        buf.len(),
        PREFIX_BYTES + body_bytes,
        "the computed length and the encoding agree"
    );
    buf.freeze()
}

/// The bytes `put_events` writes: each pre-encoded event as field 11 of a `WatchResponse`.
fn events_bytes(events: &[&Bytes]) -> usize {
    events
        .iter()
        .map(|e| e.len() + 1 + prost::length_delimiter_len(e.len()))
        .sum()
}

/// Appends each pre-encoded event as field 11 (`events`) of a `WatchResponse`.
fn put_events(buf: &mut BytesMut, events: &[&Bytes]) {
    const EVENTS_TAG: u8 = (11 << 3) | 2;
    for e in events {
        buf.put_u8(EVENTS_TAG);
        prost::encoding::encode_varint(e.len() as u64, buf);
        buf.put_slice(e);
    }
}

fn response_with_events_of(head: &pb::WatchResponse, events: &[&Bytes]) -> Bytes {
    const PREFIX_BYTES: usize = 5;
    let body_bytes = head.encoded_len() + events_bytes(events);
    let mut buf = BytesMut::with_capacity(PREFIX_BYTES + body_bytes);
    // Uncompressed flag, then the big-endian body length.
    buf.put_u8(0);
    buf.put_u32(u32::try_from(body_bytes).expect("watch responses stay far below 4 GiB"));
    head.encode(&mut buf).expect("BytesMut grows as needed");
    put_events(&mut buf, events);
    assert_eq!(
        buf.len(),
        PREFIX_BYTES + body_bytes,
        "encoded_len and the encoding agree"
    );
    buf.freeze()
}

/// Splits revision-ordered events into runs of about `bytes_max` bytes, never splitting one
/// revision (a single revision larger than `bytes_max` stays whole).
fn revision_groups(events: &[(i64, Bytes)], bytes_max: usize) -> Vec<&[(i64, Bytes)]> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut size = 0;
    for i in 0..events.len() {
        let new_revision = i > start && events[i].0 != events[i - 1].0;
        if new_revision && size + events[i].1.len() > bytes_max {
            groups.push(&events[start..i]);
            start = i;
            size = 0;
        }
        size += events[i].1.len();
    }
    if start < events.len() {
        groups.push(&events[start..]);
    }
    groups
}

/// Responses for one watcher's events: one, or fragments when the client asked for them and
/// the whole would exceed the request size limit.
fn responses(
    header: Option<pb::ResponseHeader>,
    watch_id: i64,
    events: &[&Bytes],
    fragment: bool,
    limit_bytes: usize,
) -> Vec<Bytes> {
    let total: usize = events.iter().map(|e| e.len()).sum();
    if !fragment || events.len() < 2 || total < limit_bytes {
        return vec![response_with_events(header, watch_id, false, events)];
    }
    let mut out = Vec::new();
    let mut start = 0;
    while start < events.len() {
        let mut end = start + 1;
        let mut size = events[start].len();
        while end < events.len() && size + events[end].len() < limit_bytes {
            size += events[end].len();
            end += 1;
        }
        let more = end < events.len();
        out.push(response_with_events(
            header,
            watch_id,
            more,
            &events[start..end],
        ));
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::mvccpb;

    fn decode(frame: &Bytes) -> pb::WatchResponse {
        pb::WatchResponse::decode(&frame[5..]).expect("valid response")
    }

    fn event(key: &str, rev: i64) -> Bytes {
        Bytes::from(
            mvccpb::Event {
                r#type: 0,
                kv: Some(mvccpb::KeyValue {
                    key: key.as_bytes().to_vec().into(),
                    mod_revision: rev,
                    ..Default::default()
                }),
                prev_kv: None,
            }
            .encode_to_vec(),
        )
    }

    /// The per-batch encoding with its header made once is prost's, byte for byte, for any
    /// watch id (zero, large, negative), with and without the fragment flag and a header.
    #[test]
    fn responses_with_a_shared_header_encode_as_prost_encodes_them() {
        let events = [event("a", 7), event("bb", 8)];
        let refs: Vec<&Bytes> = events.iter().collect();
        let header = Some(pb::ResponseHeader {
            cluster_id: 0xdead_beef_0102,
            member_id: 42,
            revision: 8,
            raft_term: 3,
        });
        for header in [header, None] {
            for watch_id in [0, 1, 300, i64::MAX, -1] {
                for fragment in [false, true] {
                    for n in [0, 1, 2] {
                        let ours = encode_response(
                            &encoded_header_field(header),
                            watch_id,
                            fragment,
                            &refs[..n],
                        );
                        let theirs = response_with_events(header, watch_id, fragment, &refs[..n]);
                        assert_eq!(
                            ours, theirs,
                            "watch id {watch_id}, fragment {fragment}, {n} events"
                        );
                    }
                }
            }
        }
    }

    /// A stream sends what queued in order, joined up to the bound; a response larger than
    /// the bound still goes, alone; the queue's byte count follows.
    #[test]
    fn queued_responses_leave_in_order_in_batches_up_to_the_bound() {
        let stream = Stream::new(0, Err(keel_grpc::EtcdError::Stopped));
        let frame = |tag: u8, len: usize| Bytes::from(vec![tag; len]);
        for (tag, len) in [(1, 40), (2, 40), (3, 40), (4, 200), (5, 10)] {
            stream.push(frame(tag, len));
        }
        assert_eq!(stream.queue_bytes.get(), 330);
        let mut batch = Vec::new();
        let mut sent = Vec::new();
        loop {
            stream.pop_batch(&mut batch, 100);
            if batch.is_empty() {
                break;
            }
            sent.push(batch.iter().map(|f| f[0]).collect::<Vec<u8>>());
            batch.clear();
        }
        assert_eq!(sent, vec![vec![1, 2], vec![3], vec![4], vec![5]]);
        assert_eq!(stream.queue_bytes.get(), 0);
    }

    /// The encoding with prev_kv, made on a shard from `plain`, is byte for byte what prost
    /// makes of the whole event, for puts and deletes, with and without a previous state.
    #[test]
    fn events_with_prev_kv_encode_as_prost_encodes_them() {
        let kv = |key: &str, value: &str, rev: i64| kv::KeyValue {
            key: Bytes::copy_from_slice(key.as_bytes()),
            create_revision: 2,
            mod_revision: rev,
            version: rev - 1,
            value: Bytes::copy_from_slice(value.as_bytes()),
            lease: 7,
        };
        let events = vec![
            kv::Event {
                kind: kv::EventKind::Put,
                kv: kv("a", "new", 9),
                prev_kv: Some(kv::PrevKv::known(kv("a", "old", 8))),
            },
            kv::Event {
                kind: kv::EventKind::Put,
                kv: kv("b", "first", 9),
                prev_kv: None,
            },
            kv::Event {
                kind: kv::EventKind::Delete,
                kv: kv::KeyValue {
                    key: Bytes::from_static(b"c"),
                    mod_revision: 9,
                    ..Default::default()
                },
                prev_kv: Some(kv::PrevKv::known(kv("c", "gone", 3))),
            },
        ];
        let batch = WatchBatch::encode(9, events.clone());
        for (wire, e) in batch.events.iter().zip(events) {
            assert_eq!(wire.plain, convert::event(e.clone(), false).encode_to_vec());
            assert_eq!(wire.with_prev(), &convert::event(e, true).encode_to_vec());
        }
    }

    #[test]
    fn spliced_events_decode_as_a_normal_response() {
        let (a, b) = (event("a", 5), event("b", 5));
        let f = response_with_events(
            Some(pb::ResponseHeader {
                revision: 5,
                ..Default::default()
            }),
            3,
            false,
            &[&a, &b],
        );
        let r = decode(&f);
        assert_eq!(r.watch_id, 3);
        assert_eq!(r.events.len(), 2);
        assert_eq!(
            r.events[1].kv.as_ref().map(|kv| kv.key.as_ref()),
            Some(&b"b"[..])
        );
    }

    #[test]
    fn fragments_only_when_asked_and_large() {
        let evs: Vec<Bytes> = (0..10).map(|i| event(&format!("key{i}"), 7)).collect();
        let refs: Vec<&Bytes> = evs.iter().collect();
        assert_eq!(responses(None, 1, &refs, false, 10).len(), 1);
        let frags = responses(None, 1, &refs, true, 30);
        assert!(frags.len() > 1);
        let decoded: Vec<pb::WatchResponse> = frags.iter().map(decode).collect();
        assert!(decoded[..decoded.len() - 1].iter().all(|r| r.fragment));
        assert!(!decoded.last().expect("some").fragment);
        assert_eq!(decoded.iter().map(|r| r.events.len()).sum::<usize>(), 10);
    }

    #[test]
    fn catch_up_groups_cut_only_between_revisions() {
        let ev = |rev: i64, n: usize| (rev, Bytes::from(vec![0u8; n]));
        let events = vec![
            ev(1, 40),
            ev(1, 40),
            ev(2, 40),
            ev(3, 40),
            ev(3, 40),
            ev(3, 40),
        ];
        let groups = revision_groups(&events, 100);
        let revs: Vec<Vec<i64>> = groups
            .iter()
            .map(|g| g.iter().map(|(r, _)| *r).collect())
            .collect();
        assert_eq!(revs, vec![vec![1, 1], vec![2, 3, 3, 3]]);
        assert_eq!(groups.iter().map(|g| g.len()).sum::<usize>(), events.len());
        assert!(revision_groups(&[], 100).is_empty());
    }

    #[test]
    fn key_ranges_follow_etcds_range_end_forms() {
        assert!(KeyRange::Single("a".into()).contains(b"a"));
        assert!(!KeyRange::Single("a".into()).contains(b"ab"));
        assert!(KeyRange::From("b".into()).contains(b"zzz"));
        assert!(!KeyRange::From("b".into()).contains(b"a"));
        let r = KeyRange::Range("a".into(), "c".into());
        assert!(r.contains(b"b") && !r.contains(b"c"));
    }
}
