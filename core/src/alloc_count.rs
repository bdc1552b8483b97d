//! Heap allocations counted per thread role, for `keel_heap_allocations_total`: what a request
//! costs in allocations is one of the things issue #15 measures (`keel-bench compare` divides
//! the counter's rise by the requests served, beside etcd's `go_memstats_mallocs_total`).
//!
//! The label is the thread's: a shard that runs in the raft core's executor (`shard::Host`)
//! counts under `raft_core`.
//!
//! Each thread owns one cache-line slot and is its only writer, so counting is a load and a
//! plain store per allocation: no lock-prefixed add, no cache line shared between cores.
//! Readers (the metrics page) sum the slots and may see a count a few allocations old.
//! Threads past `SLOTS_MAX` share one slot with atomic adds; the pinned executors start first
//! and always get slots of their own.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Slots for threads with a counter of their own. Threads that come and go (checkpoint
/// writers, hash helpers) each take one until they run out, then share the overflow slot.
pub const SLOTS_MAX: usize = 256;

/// What a thread does, as the metric's `thread` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ThreadRole {
    Other = 0,
    Shard = 1,
    RaftCore = 2,
}

impl ThreadRole {
    pub const ALL: [ThreadRole; 3] = [ThreadRole::Shard, ThreadRole::RaftCore, ThreadRole::Other];

    pub fn label(self) -> &'static str {
        match self {
            ThreadRole::Other => "other",
            ThreadRole::Shard => "shard",
            ThreadRole::RaftCore => "raft_core",
        }
    }

    /// The role of a pinned executor from the name `rt::spawn_pinned` gives its thread.
    pub fn of_executor(name: &str) -> ThreadRole {
        if name.starts_with("keel-shard") {
            ThreadRole::Shard
        } else if name == "keel-raft" {
            ThreadRole::RaftCore
        } else {
            ThreadRole::Other
        }
    }

    fn from_u8(v: u8) -> ThreadRole {
        match v {
            1 => ThreadRole::Shard,
            2 => ThreadRole::RaftCore,
            _ => ThreadRole::Other,
        }
    }
}

// One cache line each, so two cores' counters never share a line.
#[repr(align(64))]
struct Slot {
    allocations: AtomicU64,
    bytes: AtomicU64,
    role: AtomicU8,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            allocations: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            role: AtomicU8::new(ThreadRole::Other as u8),
        }
    }
}

static SLOTS: [Slot; SLOTS_MAX] = [const { Slot::new() }; SLOTS_MAX];
static OVERFLOW: Slot = Slot::new();
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
/// Set by the first allocation through `CountingAlloc`: without it (a library's tests, where
/// the system allocator is global) there is nothing to report, and the metric is left out.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// This thread's slot index, `UNASSIGNED` until its first allocation, `OVERFLOWED` once the
/// slots ran out. A const-initialised Copy thread local: reading it never allocates and it has
/// no destructor, so the allocator may use it at any point of a thread's life.
const UNASSIGNED: usize = usize::MAX;
const OVERFLOWED: usize = usize::MAX - 1;
thread_local! {
    static MY_SLOT: Cell<usize> = const { Cell::new(UNASSIGNED) };
}

fn my_slot() -> usize {
    MY_SLOT
        .try_with(|slot| {
            let index = slot.get();
            if index != UNASSIGNED {
                return index;
            }
            let next = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
            let index = if next < SLOTS_MAX { next } else { OVERFLOWED };
            slot.set(index);
            index
        })
        .unwrap_or(OVERFLOWED)
}

fn count(bytes: usize) {
    // Only an allocation through `CountingAlloc` comes here (a thread's label does not):
    // a process whose global allocator is another reports nothing.
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
    let index = my_slot();
    if index == OVERFLOWED {
        OVERFLOW.allocations.fetch_add(1, Ordering::Relaxed);
        OVERFLOW.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        return;
    }
    let slot = &SLOTS[index];
    // This thread is the slot's only writer: a load and a store, not a locked add.
    let n = slot.allocations.load(Ordering::Relaxed);
    slot.allocations.store(n + 1, Ordering::Relaxed);
    let b = slot.bytes.load(Ordering::Relaxed);
    slot.bytes.store(b + bytes as u64, Ordering::Relaxed);
}

/// Names the calling thread's role for the metric's label. Called first thing on each pinned
/// executor's thread; an unnamed thread counts as `other`.
pub fn label_this_thread(role: ThreadRole) {
    let index = my_slot();
    if index != OVERFLOWED {
        SLOTS[index].role.store(role as u8, Ordering::Relaxed);
    }
}

/// Allocations and bytes requested so far by the threads of one role (all threads that ever
/// ran, live or ended).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoleTotals {
    pub allocations: u64,
    pub bytes: u64,
}

/// Totals per role, in `ThreadRole::ALL`'s order; None when `CountingAlloc` is not the global
/// allocator of this process.
pub fn totals() -> Option<[(ThreadRole, RoleTotals); 3]> {
    if !INSTALLED.load(Ordering::Relaxed) {
        return None;
    }
    let mut out = ThreadRole::ALL.map(|role| (role, RoleTotals::default()));
    let used = NEXT_SLOT.load(Ordering::Relaxed).min(SLOTS_MAX);
    let add = |out: &mut [(ThreadRole, RoleTotals); 3], slot: &Slot, role: ThreadRole| {
        let totals = &mut out
            .iter_mut()
            .find(|(r, _)| *r == role)
            .expect("ALL holds every role")
            .1;
        totals.allocations += slot.allocations.load(Ordering::Relaxed);
        totals.bytes += slot.bytes.load(Ordering::Relaxed);
    };
    for slot in &SLOTS[..used] {
        add(
            &mut out,
            slot,
            ThreadRole::from_u8(slot.role.load(Ordering::Relaxed)),
        );
    }
    add(&mut out, &OVERFLOW, ThreadRole::Other);
    Some(out)
}

/// A global allocator that counts each allocation (alloc, alloc_zeroed and realloc: a realloc
/// may move and copy, and is a call into the allocator like any other) and passes it on to `A`.
/// Deallocations are not counted: the figure is allocations made, as Go's mallocs counter is.
pub struct CountingAlloc<A>(pub A);

// SAFETY: every method forwards to `A` with the caller's arguments unchanged; counting touches
// only atomics and a const thread local, neither of which allocates.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded as received.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded as received.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded as received.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    // The library's tests run on the system allocator; drive a CountingAlloc by hand, which
    // counts into the same slots as a global one would.
    static COUNTING: CountingAlloc<System> = CountingAlloc(System);

    fn role_totals(role: ThreadRole) -> RoleTotals {
        totals().expect("installed by the first counted allocation")[ThreadRole::ALL
            .iter()
            .position(|r| *r == role)
            .expect("a role")]
        .1
    }

    #[test]
    fn each_allocation_counts_on_its_threads_role() {
        let layout = Layout::from_size_align(100, 8).expect("valid");
        let (before, after) = std::thread::spawn(move || {
            label_this_thread(ThreadRole::RaftCore);
            // SAFETY: the layout is non-zero; each pointer is freed with the layout it got.
            unsafe {
                let p = COUNTING.alloc(layout);
                let before = role_totals(ThreadRole::RaftCore);
                let q = COUNTING.alloc_zeroed(layout);
                let r = COUNTING.realloc(q, layout, 300);
                COUNTING.dealloc(p, layout);
                COUNTING.dealloc(r, Layout::from_size_align(300, 8).expect("valid"));
                (before, role_totals(ThreadRole::RaftCore))
            }
        })
        .join()
        .expect("thread");
        // Other tests' threads never label themselves raft_core, so the rise is exactly ours.
        assert_eq!(after.allocations - before.allocations, 2);
        assert_eq!(after.bytes - before.bytes, 400);
    }

    #[test]
    fn executor_names_give_roles() {
        assert_eq!(ThreadRole::of_executor("keel-shard-3"), ThreadRole::Shard);
        assert_eq!(ThreadRole::of_executor("keel-raft"), ThreadRole::RaftCore);
        assert_eq!(
            ThreadRole::of_executor("keel-checkpoint"),
            ThreadRole::Other
        );
        for role in ThreadRole::ALL {
            assert_eq!(ThreadRole::from_u8(role as u8), role);
        }
    }
}
