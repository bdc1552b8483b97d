//! Calls waiting for something the member does later (an apply, a ReadIndex answer, a leader's
//! reply), each with a deadline past which it is answered "request timed out".
//!
//! One type for every kind of waiting call, so expiry is written once. Time is the member's
//! millisecond clock, passed in: this module reads no clock.

use std::collections::VecDeque;
use std::fmt::Debug;

/// Waiting calls by key, visited in key order: expiry and draining take calls in the same
/// order on every run, so a simulation replayed from its seed answers them in the same order.
///
/// A deque sorted by key, not a `BTreeMap`: keys are mostly ids handed out in increasing
/// order (proposal ids from a counter the shards share reach the raft core nearly in order)
/// and mostly taken oldest first, so an insert is usually a push at the back and a removal a
/// binary search that usually lands at the front; others are inserted in place. The map's
/// node allocations and rebalancing cost a put about 1 % of the server's CPU on the raft core
/// (an insert and a removal per proposal).
/// A call taken from the middle leaves a tombstone until the calls before it go too; the
/// deque is compacted once tombstones outnumber the calls, so it holds at most about twice
/// the calls waiting.
#[derive(Debug)]
pub struct Waiters<K, T> {
    /// Ascending by key, each key once; None where a call was taken.
    entries: VecDeque<(K, Option<Waiting<T>>)>,
    /// The entries that hold a call.
    live: usize,
}

#[derive(Debug)]
struct Waiting<T> {
    waiter: T,
    /// Past this time (on the member's clock) the call is expired.
    deadline_ms: u64,
}

impl<K, T> Default for Waiters<K, T> {
    fn default() -> Self {
        Waiters {
            entries: VecDeque::new(),
            live: 0,
        }
    }
}

/// Tombstones tolerated beyond the calls held before a compaction.
const TOMBSTONES_SLACK: usize = 32;

impl<K: Ord + Copy + Debug, T> Waiters<K, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Where `key` is, or would go.
    fn search(&self, key: &K) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(key))
    }

    /// Adds a waiting call. Keys are ids the member hands out once, so a key in use is a bug.
    pub fn insert(&mut self, key: K, waiter: T, deadline_ms: u64) {
        let waiting = Some(Waiting {
            waiter,
            deadline_ms,
        });
        if self.entries.back().is_none_or(|(last, _)| *last < key) {
            self.entries.push_back((key, waiting));
        } else {
            match self.search(&key) {
                Ok(at) => {
                    let slot = &mut self.entries[at].1;
                    assert!(slot.is_none(), "waiter key {key:?} used twice");
                    *slot = waiting;
                }
                Err(at) => self.entries.insert(at, (key, waiting)),
            }
        }
        self.live += 1;
    }

    /// Takes the call waiting under `key`, if it has not expired or been taken.
    pub fn remove(&mut self, key: &K) -> Option<T> {
        let at = self.search(key).ok()?;
        let taken = self.entries[at].1.take()?;
        self.live -= 1;
        self.tidy();
        Some(taken.waiter)
    }

    pub fn contains(&self, key: &K) -> bool {
        self.search(key)
            .is_ok_and(|at| self.entries[at].1.is_some())
    }

    /// Drops the tombstones at both ends, and all of them once they outnumber the calls.
    fn tidy(&mut self) {
        while self.entries.front().is_some_and(|(_, w)| w.is_none()) {
            self.entries.pop_front();
        }
        while self.entries.back().is_some_and(|(_, w)| w.is_none()) {
            self.entries.pop_back();
        }
        if self.entries.len() > 2 * self.live + TOMBSTONES_SLACK {
            self.entries.retain(|(_, w)| w.is_some());
            assert_eq!(self.entries.len(), self.live, "every call is counted once");
        }
    }

    /// Takes every call for which `which` holds, in key order.
    fn take_each(&mut self, which: impl Fn(&Waiting<T>) -> bool) -> Vec<T> {
        let mut taken = Vec::new();
        for (_, slot) in self.entries.iter_mut() {
            if slot.as_ref().is_some_and(&which) {
                taken.push(slot.take().expect("just checked").waiter);
            }
        }
        self.live -= taken.len();
        self.tidy();
        taken
    }

    /// Takes every call whose deadline is at or before `now_ms`, in key order.
    pub fn expire(&mut self, now_ms: u64) -> Vec<T> {
        self.take_each(|w| w.deadline_ms <= now_ms)
    }

    /// Takes every call for which `which` holds, in key order.
    pub fn take_where(&mut self, which: impl Fn(&T) -> bool) -> Vec<T> {
        self.take_each(|w| which(&w.waiter))
    }

    /// Takes every call, in key order (the member is stopping).
    pub fn drain(&mut self) -> Vec<T> {
        self.live = 0;
        std::mem::take(&mut self.entries)
            .into_iter()
            .filter_map(|(_, w)| w.map(|w| w.waiter))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expire_takes_only_calls_at_or_past_their_deadline() {
        let mut w: Waiters<u64, &str> = Waiters::new();
        w.insert(3, "c", 300);
        w.insert(1, "a", 100);
        w.insert(2, "b", 200);
        assert!(w.expire(99).is_empty());
        assert_eq!(w.expire(200), vec!["a", "b"]);
        assert_eq!(w.len(), 1);
        assert!(w.contains(&3));
        assert!(!w.contains(&1));
        assert_eq!(w.expire(10_000), vec!["c"]);
        assert!(w.is_empty());
    }

    #[test]
    fn a_removed_call_never_expires() {
        let mut w: Waiters<u64, u32> = Waiters::new();
        w.insert(7, 70, 50);
        assert_eq!(w.remove(&7), Some(70));
        assert_eq!(w.remove(&7), None);
        assert!(w.expire(1_000).is_empty());
    }

    #[test]
    fn drain_answers_everything_in_key_order() {
        let mut w: Waiters<i64, i64> = Waiters::new();
        for k in [5, -1, 3] {
            w.insert(k, k * 10, 0);
        }
        assert_eq!(w.drain(), vec![-10, 30, 50]);
        assert!(w.is_empty());
    }

    /// Calls taken out of order leave tombstones that never show, and never pile up past
    /// about twice the calls waiting; keys inserted out of order still come out in order.
    #[test]
    fn out_of_order_takes_and_inserts_keep_key_order_and_bounded_room() {
        let mut w: Waiters<u64, u64> = Waiters::new();
        for k in 0..1000 {
            w.insert(k, k, k);
        }
        // Every odd key taken, then every even one above 100: tombstones in the middle.
        for k in (1..1000).step_by(2) {
            assert_eq!(w.remove(&k), Some(k));
        }
        for k in (102..1000).step_by(2) {
            assert_eq!(w.remove(&k), Some(k));
        }
        assert_eq!(w.len(), 51);
        assert!(
            w.entries.len() <= 2 * 51 + TOMBSTONES_SLACK,
            "{}",
            w.entries.len()
        );
        assert!(!w.contains(&1) && w.contains(&100) && !w.contains(&102));
        // A key below the newest goes in its place; a taken key may be used again.
        w.insert(5001, 5001, 0);
        w.insert(3, 3, 0);
        w.insert(1, 1, 0);
        assert_eq!(w.remove(&5001), Some(5001));
        assert_eq!(w.remove(&5001), None);
        let expired = w.expire(50);
        let mut expected: Vec<u64> = vec![0, 1, 2, 3];
        expected.extend((4..=50).step_by(2));
        assert_eq!(expired, expected);
        assert_eq!(
            w.take_where(|v| *v % 4 == 0),
            vec![52, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 96, 100]
        );
        assert_eq!(w.drain(), (54..=98).step_by(4).collect::<Vec<u64>>());
        assert!(w.is_empty() && w.entries.is_empty());
    }

    #[test]
    #[should_panic(expected = "used twice")]
    fn a_key_in_use_is_a_bug() {
        let mut w: Waiters<u64, ()> = Waiters::new();
        w.insert(1, (), 10);
        w.insert(1, (), 20);
    }
}
