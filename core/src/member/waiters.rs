//! Calls waiting for something the member does later (an apply, a ReadIndex answer, a leader's
//! reply), each with a deadline past which it is answered "request timed out".
//!
//! One type for every kind of waiting call, so expiry is written once. Time is the member's
//! millisecond clock, passed in: this module reads no clock.

use std::collections::BTreeMap;
use std::fmt::Debug;

/// Waiting calls by key. A `BTreeMap` so that expiry and draining visit keys in the same order
/// on every run: a simulation replayed from its seed answers calls in the same order.
#[derive(Debug)]
pub struct Waiters<K, T> {
    entries: BTreeMap<K, Waiting<T>>,
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
            entries: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Copy + Debug, T> Waiters<K, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a waiting call. Keys are ids the member hands out once, so a key in use is a bug.
    pub fn insert(&mut self, key: K, waiter: T, deadline_ms: u64) {
        let previous = self.entries.insert(
            key,
            Waiting {
                waiter,
                deadline_ms,
            },
        );
        assert!(previous.is_none(), "waiter key {key:?} used twice");
    }

    /// Takes the call waiting under `key`, if it has not expired or been taken.
    pub fn remove(&mut self, key: &K) -> Option<T> {
        self.entries.remove(key).map(|w| w.waiter)
    }

    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Takes every call whose deadline is at or before `now_ms`, in key order.
    pub fn expire(&mut self, now_ms: u64) -> Vec<T> {
        let expired: Vec<K> = self
            .entries
            .iter()
            .filter(|(_, w)| w.deadline_ms <= now_ms)
            .map(|(k, _)| *k)
            .collect();
        let taken: Vec<T> = expired
            .iter()
            .filter_map(|k| self.entries.remove(k).map(|w| w.waiter))
            .collect();
        assert_eq!(taken.len(), expired.len(), "expired keys were just listed");
        taken
    }

    /// Takes every call for which `which` holds, in key order.
    pub fn take_where(&mut self, which: impl Fn(&T) -> bool) -> Vec<T> {
        let keys: Vec<K> = self
            .entries
            .iter()
            .filter(|(_, w)| which(&w.waiter))
            .map(|(k, _)| *k)
            .collect();
        keys.iter()
            .filter_map(|k| self.entries.remove(k).map(|w| w.waiter))
            .collect()
    }

    /// Takes every call, in key order (the member is stopping).
    pub fn drain(&mut self) -> Vec<T> {
        std::mem::take(&mut self.entries)
            .into_values()
            .map(|w| w.waiter)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
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

    #[test]
    #[should_panic(expected = "used twice")]
    fn a_key_in_use_is_a_bug() {
        let mut w: Waiters<u64, ()> = Waiters::new();
        w.insert(1, (), 10);
        w.insert(1, (), 20);
    }
}
