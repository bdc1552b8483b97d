//! The value cache: the bytes of durable value-log segments this member keeps in memory, under
//! a byte limit (`--value-cache-bytes`).
//!
//! Durable segments are mapped files, so their values are cached by the kernel's page cache as
//! they are read; nothing else holds them. Left alone, a member that reads its whole store
//! keeps all of it resident, and counts it in its RSS. The value cache bounds that: once a
//! second, a thread that is not pinned to any core asks mincore how much of each mapped
//! segment is in memory, and when the total passes the limit, pages out whole segments
//! (MADV_PAGEOUT: their pages leave this process and the page cache) until it is back under,
//! choosing them by the clock algorithm: every read of a value marks its segment
//! (`kv::MappedSegment::take_read`), the hand clears marks as it passes and pages out the
//! first segment it finds unmarked, so segments read since the last pass get a second chance.
//! A read of a paged-out value comes back through the pager (see `pager`) like any cold one.
//!
//! Nothing here is on a serving thread: a read of a value from a mapped segment pays one
//! relaxed load (a store only when the mark was clear); a write's look at the version it
//! replaces marks nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::shared::Shared;

/// How often the value cache looks (and pages out what passes the limit).
pub const VALUE_CACHE_LOOK_MS: u64 = 1000;

/// The default limit when `--value-cache-bytes` is not given: a quarter of the memory this
/// process may use (the machine's, or its cgroup's `memory.max` when lower, as in a
/// container), which leaves the rest to the index, connections and other processes.
pub fn default_limit_bytes() -> u64 {
    // SAFETY: sysconf reads constants of the running kernel.
    let (pages, page_bytes) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let machine = match (u64::try_from(pages), u64::try_from(page_bytes)) {
        (Ok(pages), Ok(page_bytes)) if pages > 0 && page_bytes > 0 => pages * page_bytes,
        // Unknown memory: no limit, the kernel decides as it does for any page cache.
        _ => return 0,
    };
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|max| max.trim().parse::<u64>().ok());
    machine.min(cgroup.unwrap_or(u64::MAX)) / 4
}

/// What the value cache did, for `/metrics`.
#[derive(Debug, Default)]
pub struct ValueCacheStats {
    /// The limit in bytes (0: none).
    pub limit_bytes: AtomicU64,
    /// Bytes of mapped segments in memory at the last look, after paging out.
    pub resident_bytes: AtomicU64,
    /// Bytes paged out since the start (resident when paged out).
    pub paged_out_bytes: AtomicU64,
}

/// One segment as a look sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    id: u32,
    resident_bytes: u64,
}

/// The clock's hand: the segment id the next pass starts at.
#[derive(Debug, Default)]
struct Clock {
    hand: u32,
}

impl Clock {
    /// The segments (indices into `seen`, ascending by id) to page out so that the resident
    /// bytes fall to `limit_bytes`, taking each segment's read mark (`take_read`, which
    /// clears it) as the hand passes it: a marked segment is spared once. Segments with
    /// nothing in memory are passed without touching their marks. At most two turns: the
    /// first may only clear marks.
    fn pass(
        &mut self,
        seen: &[Seen],
        limit_bytes: u64,
        take_read: &mut dyn FnMut(usize) -> bool,
    ) -> Vec<usize> {
        let mut resident: u64 = seen.iter().map(|s| s.resident_bytes).sum();
        let mut victims = Vec::new();
        if resident <= limit_bytes || seen.is_empty() {
            return victims;
        }
        let start = seen.partition_point(|s| s.id < self.hand) % seen.len();
        for step in 0..2 * seen.len() {
            let i = (start + step) % seen.len();
            self.hand = seen[i].id.wrapping_add(1);
            if seen[i].resident_bytes == 0 || victims.contains(&i) || take_read(i) {
                continue;
            }
            victims.push(i);
            resident -= seen[i].resident_bytes;
            if resident <= limit_bytes {
                break;
            }
        }
        victims
    }
}

/// Starts the value cache's thread, unpinned. With `limit_bytes` 0 (no limit) it only
/// measures.
pub fn start(shared: Arc<Shared>, limit_bytes: u64) -> std::io::Result<()> {
    shared
        .value_cache
        .limit_bytes
        .store(limit_bytes, Ordering::Relaxed);
    std::thread::Builder::new()
        .name("value-cache".into())
        .spawn(move || {
            let mut clock = Clock::default();
            let mut limit_bytes = limit_bytes;
            while !shared.stopping.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(VALUE_CACHE_LOOK_MS));
                if let Err(e) = look(&shared, &mut clock, limit_bytes) {
                    // A kernel before 5.4 (no MADV_PAGEOUT): say so once, and only measure.
                    tracing::warn!(error = %e, "cannot page out value-log segments; the value cache limit is not kept");
                    limit_bytes = 0;
                }
            }
        })
        .map(|_| ())
}

/// One look: measure, and page out what passes the limit. What a page-out freed is measured
/// again, not assumed: pages the kernel keeps (another process reading them) stay counted,
/// and a victim that frees nothing ends the look rather than paging out the hot segments.
fn look(shared: &Shared, clock: &mut Clock, limit_bytes: u64) -> std::io::Result<()> {
    let page_bytes = keel_io::pages::page_bytes() as u64;
    let segments = shared.reader().mapped_segments();
    let seen: Vec<Seen> = segments
        .iter()
        .map(|s| Seen {
            id: s.id,
            resident_bytes: keel_io::pages::pages_resident(&s.file) as u64 * page_bytes,
        })
        .collect();
    let victims = if limit_bytes == 0 {
        Vec::new()
    } else {
        clock.pass(&seen, limit_bytes, &mut |i| segments[i].take_read())
    };
    let mut resident: u64 = seen.iter().map(|s| s.resident_bytes).sum();
    let mut outcome = Ok(());
    for i in victims {
        if let Err(e) = keel_io::pages::page_out(&segments[i].file) {
            outcome = Err(e);
            break;
        }
        let left_bytes = keel_io::pages::pages_resident(&segments[i].file) as u64 * page_bytes;
        let freed_bytes = seen[i].resident_bytes.saturating_sub(left_bytes);
        resident -= freed_bytes;
        shared
            .value_cache
            .paged_out_bytes
            .fetch_add(freed_bytes, Ordering::Relaxed);
        if freed_bytes == 0 {
            break;
        }
    }
    shared
        .value_cache
        .resident_bytes
        .store(resident, Ordering::Relaxed);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(resident: &[u64]) -> Vec<Seen> {
        resident
            .iter()
            .enumerate()
            .map(|(i, r)| Seen {
                id: 10 + i as u32,
                resident_bytes: *r,
            })
            .collect()
    }

    #[test]
    fn under_the_limit_nothing_is_paged_out_and_no_mark_is_taken() {
        let mut clock = Clock::default();
        let mut taken = 0;
        let victims = clock.pass(&seen(&[100, 100]), 200, &mut |_| {
            taken += 1;
            true
        });
        assert!(victims.is_empty());
        assert_eq!(taken, 0);
    }

    #[test]
    fn unread_segments_go_first_and_read_ones_get_a_second_chance() {
        let mut clock = Clock::default();
        let mut marks = [true, false, true, false];
        let victims = clock.pass(&seen(&[100, 100, 100, 100]), 250, &mut |i| {
            std::mem::replace(&mut marks[i], false)
        });
        assert_eq!(victims, vec![1, 3], "the unread ones");
        assert_eq!(marks, [false; 4], "marks passed are taken");
        // The hand goes on after the last victim: the next pass starts past segment 13.
        assert_eq!(clock.hand, 14);
        let mut marks = [true, false, false, false];
        let victims = clock.pass(&seen(&[100, 0, 100, 0]), 100, &mut |i| {
            std::mem::replace(&mut marks[i], false)
        });
        assert_eq!(
            victims,
            vec![2],
            "wraps around to 10, read since: spared once"
        );
        assert!(!marks[0]);
    }

    #[test]
    fn when_every_segment_was_read_the_second_turn_pages_out() {
        let mut clock = Clock::default();
        let mut marks = [true; 3];
        let victims = clock.pass(&seen(&[100, 100, 100]), 100, &mut |i| {
            std::mem::replace(&mut marks[i], false)
        });
        assert_eq!(victims, vec![0, 1]);
        // Nothing in memory is passed by, and a limit below one segment empties the rest.
        let victims = clock.pass(&seen(&[0, 0, 300]), 0, &mut |_| false);
        assert_eq!(victims, vec![2]);
    }
}
