//! The keys written since the newest full checkpoint, so that an incremental checkpoint reads
//! those keys' lists and not the whole index.
//!
//! A delta holds each key's versions newer than its base's revision. Finding them by walking
//! the index costs a pass over every key for each delta: at millions of keys, more than the
//! delta itself when the writes go to a small working set.
//! The writer instead notes each key it writes, with the revision of that write, and a
//! checkpoint captures the keys newer than its base (a copy of their bytes, on the writer:
//! O(changed keys), never O(keys)).
//!
//! Memory is bounded: past `max(keys / DIRTY_SHARE_MAX, DIRTY_KEYS_MIN)` keys the set is
//! dropped and tracking starts again from the current revision (such a delta would be too
//! large to pay anyway; until a full checkpoint at or after that revision becomes the base,
//! deltas walk the index as before).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

/// The set holds at most this share (1/n) of the index's keys.
pub(crate) const DIRTY_SHARE_MAX: usize = 16;
/// ... or this many keys, for small stores.
pub(crate) const DIRTY_KEYS_MIN: usize = 1024;
/// The set is split in this many tables by its keys' hashes. A table grows by doubling, and
/// rehashes all it holds at once: as one table at 250,000 keys (a 4M-key store), each
/// doubling stalled the raft core for 15-41 ms. Split, a doubling moves a 64th of that.
const SHARDS: usize = 64;

#[derive(Debug)]
pub(crate) struct DirtyKeys {
    /// Every key with a version newer than this revision is in `shards`.
    since_rev: i64,
    /// Each key written after `since_rev` (its bytes in `arena`), with its newest write's
    /// main revision, in the shard its hash names. std's SipHash, keyed per process: the
    /// keys are the clients', and these tables live on the raft core.
    shards: Vec<HashTable<Noted>>,
    /// The noted keys' bytes, back to back: one buffer that keeps its room when the set
    /// starts again, where a box per key cost an allocation and a free for nearly every put
    /// of a load that writes more keys than the set holds (it starts again every
    /// `keys_max` new keys). Holds only the keys in `shards`: `rebase` copies the keys it
    /// keeps into a new buffer of their size and drops the old one.
    arena: Vec<u8>,
    hasher: RandomState,
    /// Keys held, over all shards.
    len: usize,
}

/// A noted key: where its bytes are in the arena, and its newest write's main revision.
#[derive(Debug, Clone, Copy)]
struct Noted {
    start_byte: usize,
    len_bytes: usize,
    main: i64,
}

impl Noted {
    fn key(self, arena: &[u8]) -> &[u8] {
        &arena[self.start_byte..self.start_byte + self.len_bytes]
    }
}

impl DirtyKeys {
    /// Tracking from `rev` on: nothing written after it yet (a new or restored store).
    pub(crate) fn since(rev: i64) -> Self {
        DirtyKeys {
            since_rev: rev,
            shards: Self::empty_shards(),
            arena: Vec::new(),
            hasher: RandomState::new(),
            len: 0,
        }
    }

    fn empty_shards() -> Vec<HashTable<Noted>> {
        (0..SHARDS).map(|_| HashTable::new()).collect()
    }

    /// The shard of a key's hash: bits 32-37, which a table's bucket index (the low bits, at
    /// fewer than 2^32 buckets) and its control tag (the top 7) do not use, so that the keys
    /// of one shard still spread over its buckets and tags.
    fn shard_of(hash: u64) -> usize {
        (hash >> 32) as usize % SHARDS
    }

    /// `key` was written at main revision `main`; the index holds `keys_held` keys.
    pub(crate) fn wrote(&mut self, key: &[u8], main: i64, keys_held: usize) {
        if main == self.since_rev {
            // Tracking restarted within this txn: the set names versions newer than
            // `since_rev`, and a delete of a million keys would otherwise fill it, drop it
            // and fill it again for each sixteenth of the index.
            return;
        }
        // One hash and one probe, whether the key is new or not.
        let hash = self.hasher.hash_one(key);
        let (hasher, arena) = (&self.hasher, &mut self.arena);
        let shard = &mut self.shards[Self::shard_of(hash)];
        match shard.entry(
            hash,
            |noted| noted.key(arena) == key,
            |noted| hasher.hash_one(noted.key(arena)),
        ) {
            Entry::Occupied(mut at) => at.get_mut().main = main,
            Entry::Vacant(slot) => {
                if self.len >= Self::keys_max(keys_held) {
                    // Writes of the same txn already noted at `main` are dropped with the
                    // rest, so only what comes after `main` is tracked from here on. The
                    // tables keep their room: the set fills to the bound again, and regrowing
                    // 64 tables from nothing each time cost a rehash per doubling (1 % of a
                    // put load's server CPU over 20,000 keys, where the set restarts every
                    // 1,250 new keys). What they hold is bounded by `keys_max` all the same,
                    // and `rebase` shrinks tables left mostly empty.
                    for shard in &mut self.shards {
                        shard.clear();
                    }
                    self.arena.clear();
                    self.len = 0;
                    self.since_rev = main;
                    return;
                }
                let start_byte = arena.len();
                arena.extend_from_slice(key);
                slot.insert(Noted {
                    start_byte,
                    len_bytes: key.len(),
                    main,
                });
                self.len += 1;
            }
        }
    }

    fn keys_max(keys_held: usize) -> usize {
        (keys_held / DIRTY_SHARE_MAX).max(DIRTY_KEYS_MIN)
    }

    /// The full checkpoint that deltas are taken against is at `base_rev`: keys written at or
    /// before it are no longer dirty.
    pub(crate) fn rebase(&mut self, base_rev: i64) {
        if self.since_rev > base_rev {
            // Tracking restarted after the base: this set cannot name its changes; a later
            // base at or after `since_rev` can use it.
            return;
        }
        let (hasher, arena) = (&self.hasher, &self.arena);
        let mut len = 0;
        for shard in &mut self.shards {
            shard.retain(|noted| noted.main > base_rev);
            len += shard.len();
            if shard.capacity() > 4 * shard.len().max(DIRTY_KEYS_MIN / SHARDS) {
                shard.shrink_to_fit(|noted| hasher.hash_one(noted.key(arena)));
            }
        }
        // The kept keys' bytes into a fresh arena, so it holds no forgotten key's.
        let kept_bytes = self
            .shards
            .iter()
            .flatten()
            .map(|noted| noted.len_bytes)
            .sum();
        let mut kept = Vec::with_capacity(kept_bytes);
        for noted in self.shards.iter_mut().flat_map(|shard| shard.iter_mut()) {
            let start_byte = kept.len();
            kept.extend_from_slice(noted.key(&self.arena));
            noted.start_byte = start_byte;
        }
        self.arena = kept;
        self.len = len;
        self.since_rev = base_rev;
    }

    /// The keys with a version newer than `base_rev`, or None when the set cannot say (it
    /// was dropped after `base_rev`).
    pub(crate) fn since_base(&self, base_rev: i64) -> Option<DirtyList> {
        if self.since_rev > base_rev {
            return None;
        }
        let mut list = DirtyList {
            base_rev,
            bytes: Vec::new(),
            ends: Vec::new(),
        };
        for noted in self
            .shards
            .iter()
            .flatten()
            .filter(|noted| noted.main > base_rev)
        {
            list.bytes.extend_from_slice(noted.key(&self.arena));
            list.ends.push(list.bytes.len());
        }
        Some(list)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        assert_eq!(
            self.len,
            self.shards.iter().map(HashTable::len).sum::<usize>()
        );
        self.len
    }
}

/// The keys with a version newer than `base_rev` at a capture, in no order: their bytes
/// back to back.
#[derive(Debug, Clone)]
pub(crate) struct DirtyList {
    base_rev: i64,
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl DirtyList {
    /// The revision the list is complete after: it names every key with a version newer.
    pub(crate) fn base_rev(&self) -> i64 {
        self.base_rev
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    fn key(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// The keys ascending, as the index orders them (bytewise), each once.
    pub(crate) fn sorted(&self) -> Vec<&[u8]> {
        let mut keys: Vec<&[u8]> = (0..self.len()).map(|i| self.key(i)).collect();
        keys.sort_unstable();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "the set names each key once"
        );
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_dirty_after_a_base_only_when_written_after_it() {
        let mut d = DirtyKeys::since(1);
        d.wrote(b"a", 2, 10);
        d.wrote(b"b", 3, 10);
        d.wrote(b"a", 5, 10);
        let list = d.since_base(3).expect("tracked since 1");
        assert_eq!(list.sorted(), vec![b"a".as_slice()]);
        assert_eq!(d.since_base(1).unwrap().sorted().len(), 2);
        d.rebase(3);
        assert_eq!(d.len(), 1, "b's write at 3 is in the base");
        assert!(
            d.since_base(2).is_none(),
            "writes at or before 3 are forgotten"
        );
        assert_eq!(d.since_base(4).unwrap().sorted(), vec![b"a".as_slice()]);
        assert!(d.since_base(5).unwrap().sorted().is_empty());
    }

    #[test]
    fn past_its_bound_the_set_starts_again_and_serves_only_later_bases() {
        let mut d = DirtyKeys::since(0);
        for i in 0..DIRTY_KEYS_MIN as i64 {
            d.wrote(&i.to_be_bytes(), i + 1, 0);
        }
        assert_eq!(d.len(), DIRTY_KEYS_MIN);
        let overflow_rev = DIRTY_KEYS_MIN as i64 + 1;
        let room: usize = d.shards.iter().map(HashTable::capacity).sum();
        d.wrote(b"one more", overflow_rev, 0);
        assert_eq!(d.len(), 0);
        assert!(d.arena.is_empty(), "the keys' bytes go with them");
        // At least: a cleared table also counts the slots its deleted entries held.
        assert!(
            d.shards.iter().map(HashTable::capacity).sum::<usize>() >= room,
            "the tables keep their room for the next fill"
        );
        assert!(d.since_base(overflow_rev - 1).is_none());
        d.wrote(b"next", overflow_rev + 1, 0);
        assert_eq!(
            d.since_base(overflow_rev).unwrap().sorted(),
            vec![b"next".as_slice()]
        );
        d.rebase(overflow_rev - 1);
        assert!(
            d.since_base(overflow_rev - 1).is_none(),
            "an older base stays unserved"
        );
        d.rebase(overflow_rev + 1);
        assert!(d.since_base(overflow_rev + 1).unwrap().sorted().is_empty());
    }

    /// One txn that writes past the bound (a DeleteRange of many keys) drops the set once
    /// and notes none of its other keys: they are all at the revision tracking restarted
    /// from, which the set never needs to name.
    #[test]
    fn a_txn_past_the_bound_fills_the_set_once() {
        let mut d = DirtyKeys::since(0);
        for i in 0..(3 * DIRTY_KEYS_MIN) as i64 {
            d.wrote(&i.to_be_bytes(), 1, 0);
            assert!(d.len() <= DIRTY_KEYS_MIN);
        }
        assert_eq!(
            d.len(),
            0,
            "the keys past the bound are at the restart revision"
        );
        d.wrote(b"later", 2, 0);
        assert_eq!(d.since_base(1).unwrap().sorted(), vec![b"later".as_slice()]);
        assert!(d.since_base(0).is_none());
    }

    #[test]
    fn keys_spread_over_the_shards_and_each_is_named_once() {
        let mut d = DirtyKeys::since(0);
        let keys_held = 1_000_000;
        for i in 0..20_000 {
            d.wrote(format!("key/{i}").as_bytes(), 1 + i64::from(i), keys_held);
        }
        // Written again: updated in place, not held twice.
        for i in 0..10_000 {
            d.wrote(
                format!("key/{i}").as_bytes(),
                100_000 + i64::from(i),
                keys_held,
            );
        }
        assert_eq!(d.len(), 20_000);
        // The shard bits are independent of the tables' own: every shard takes its share.
        let share = 20_000 / SHARDS;
        for (i, shard) in d.shards.iter().enumerate() {
            assert!(
                shard.len() > share / 2 && shard.len() < share * 2,
                "shard {i} holds {} keys, against {share} on average",
                shard.len()
            );
        }
        // Newer than 15,000: the last 5,000 written once and the 10,000 written again.
        let list = d.since_base(15_000).expect("tracked since 0");
        assert_eq!(list.len(), 15_000);
        assert_eq!(list.sorted().len(), 15_000, "each key once");
        d.rebase(15_000);
        assert_eq!(d.len(), 15_000);
        // The arena holds the kept keys' bytes only, and each still reads back.
        let kept = || (0..10_000).chain(15_000..20_000);
        let kept_bytes: usize = kept().map(|i| format!("key/{i}").len()).sum();
        assert_eq!(d.arena.len(), kept_bytes);
        let mut named = d
            .since_base(15_000)
            .unwrap()
            .sorted()
            .into_iter()
            .map(<[u8]>::to_vec)
            .collect::<Vec<_>>();
        let mut expected: Vec<Vec<u8>> = kept().map(|i| format!("key/{i}").into_bytes()).collect();
        named.sort();
        expected.sort();
        assert_eq!(named, expected);
    }

    #[test]
    fn the_bound_grows_with_the_index() {
        let keys_held = DIRTY_KEYS_MIN * DIRTY_SHARE_MAX * 4;
        let mut d = DirtyKeys::since(0);
        for i in 0..(4 * DIRTY_KEYS_MIN) as i64 {
            d.wrote(&i.to_be_bytes(), i + 1, keys_held);
        }
        assert_eq!(d.len(), 4 * DIRTY_KEYS_MIN);
        assert!(d.since_base(0).is_some());
    }
}
