//! The writer's point lookups into the index: a key's hash names its skip-list node, so that a
//! put finds the history it appends to in one probe.
//!
//! A skip-list search compares the key at each level it descends, and each compare follows the
//! node's boxed key: about 30 dependent loads at 200,000 keys, and more than half of a put's
//! apply in `cargo bench -p keel-kv --bench mvcc -- apply 200000` (memcmp and `search_bound`
//! leading its profile). Every member applies every put, so in a cluster that search ran on
//! every raft core. Readers (the shards) still search the skip list: only the writer, which is
//! also the only thread that inserts or removes keys, keeps this table.
//!
//! The table learns a key when the writer looks it up and finds it in the skip list (a miss
//! falls back to the skip list and notes the node), not when it inserts one: it holds the keys
//! the writer looked up again since the start (puts, single-key deletes and compares, a put's
//! ignore_* check, lease revokes), so a restart or a restore builds nothing up front, and keys
//! written once and never looked up again cost no memory here. (Noting every created key cost
//! 40-50 bytes of RSS a key at 10,000 keys, from the tables' growth, in `compare`'s memory
//! row; a put that creates a key costs a probe more than before, and searches the skip list as
//! it did.) A slot is 12 bytes, in tables at most 3/4 full (16-32 bytes per key it met): a
//! pointer to the node's key, from which the node's value lies a fixed distance away (one
//! node type, so one layout; checked at every note), and 32 bits of the key's hash, so that a
//! table doubles without reading the keys again (with the pointer alone, the cache misses of
//! that rehash made a put that creates a key 50 % dearer). It is split by hash into tables
//! that double separately, as `DirtyKeys` is, so that no doubling rehashes millions of keys
//! at once on the raft core.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ptr::NonNull;

use crate::index::{Index, IndexEntry, IndexKey, KeyHistory};

/// Tables the keys are split over by hash. At 10 million keys one table holds about 40,000, so
/// a doubling rehashes that many, not all of them.
const TABLES: usize = 256;

/// The key bytes a table's pointer names.
///
/// # Safety
/// `p` names the key of a node in the index (every pointer in the tables does: see `find`).
unsafe fn key_of<'a>(p: NonNull<IndexKey>) -> &'a [u8] {
    // SAFETY: per the contract, the node, and so its key, is alive.
    unsafe { &*p.as_ptr() }
}

/// One key in a table: its node's key and the low half of its hash, 12 bytes (packed to 4).
/// (hashbrown's tables, before, took 13 bytes a bucket and filled to 7/8: 15-30 bytes a key
/// against 16-32 here.)
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Slot {
    /// None: an empty slot.
    key: Option<NonNull<IndexKey>>,
    hash_low: u32,
}

impl Slot {
    const EMPTY: Slot = Slot {
        key: None,
        hash_low: 0,
    };

    /// The key's node, None for an empty slot (a copy: a packed field cannot be borrowed).
    fn named(self) -> Option<NonNull<IndexKey>> {
        self.key
    }

    /// The hash the tables place a slot by, from the stored half alone: spread over 64 bits,
    /// whose top bits pick the home slot, so that a table doubles without reading any key.
    fn table_hash(hash_low: u32) -> u64 {
        u64::from(hash_low).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

/// An open-addressing table of slots, probed linearly from a home slot, at most 3/4 full.
///
/// Not hashbrown's: a lookup there reads a control group, then a slot on another line, one
/// load after the other, and the table offers no way to name those lines before the lookup.
/// Here the home slot's line is known from the hash alone, so `KeyLookup::prefetch` can start
/// loading it for a batch of keys before the batch is applied (a put's apply was mostly those
/// cache misses: `KeyLookup::find` was 12 % of a follower's raft core, BENCHMARKS.md
/// 2026-12-07).
#[derive(Default)]
struct SlotTable {
    /// A power of two in length, or empty.
    slots: Vec<Slot>,
    len: usize,
}

impl SlotTable {
    const CAPACITY_MIN: usize = 8;

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot a hash half probes from; the table is not empty.
    fn home(&self, hash_low: u32) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (Slot::table_hash(hash_low) >> (64 - bits)) as usize
    }

    /// Starts loading the home slot of a hash half (both lines, where a slot straddles two).
    fn prefetch_home(&self, hash_low: u32) {
        if !self.slots.is_empty() {
            let home: *const Slot = &self.slots[self.home(hash_low)];
            crate::index::prefetch(home);
            crate::index::prefetch(home.cast::<u8>().wrapping_add(size_of::<Slot>() - 1));
        }
    }

    /// The slot holding a key with this hash half that `same` accepts.
    fn find(
        &self,
        hash_low: u32,
        mut same: impl FnMut(NonNull<IndexKey>) -> bool,
    ) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut at = self.home(hash_low);
        loop {
            let slot = self.slots[at];
            let key = slot.named()?;
            if slot.hash_low == hash_low && same(key) {
                return Some(at);
            }
            at = (at + 1) & mask;
        }
    }

    /// Adds a slot for a key not in the table.
    fn insert_unique(&mut self, slot: Slot) {
        assert!(slot.named().is_some(), "an inserted slot names a key");
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        self.place(slot);
        self.len += 1;
    }

    fn place(&mut self, slot: Slot) {
        let mask = self.mask();
        let mut at = self.home(slot.hash_low);
        while self.slots[at].named().is_some() {
            at = (at + 1) & mask;
        }
        self.slots[at] = slot;
    }

    /// Doubles the table, placing every slot again from its stored hash half (no key read).
    fn grow(&mut self) {
        let capacity = (self.slots.len() * 2).max(Self::CAPACITY_MIN);
        let old = std::mem::replace(&mut self.slots, vec![Slot::EMPTY; capacity]);
        for slot in old.into_iter().filter(|s| s.named().is_some()) {
            self.place(slot);
        }
    }

    /// Empties slot `at`, then moves back each slot after it in its run that may move, so
    /// that no key sits past an empty slot on its way from its home (backward-shift
    /// deletion: no tombstones, so lookups never slow with churn).
    fn remove(&mut self, mut at: usize) {
        let mask = self.mask();
        self.slots[at] = Slot::EMPTY;
        self.len -= 1;
        let mut next = (at + 1) & mask;
        while self.slots[next].named().is_some() {
            let home = self.home(self.slots[next].hash_low);
            // The slot at `next` may fill the hole at `at` unless its home lies cyclically
            // in (at, next]: then it would sit before its home.
            if (next.wrapping_sub(home) & mask) >= (next.wrapping_sub(at) & mask) {
                self.slots[at] = self.slots[next];
                self.slots[next] = Slot::EMPTY;
                at = next;
            }
            next = (next + 1) & mask;
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A key's node, found by the writer: its key and its history.
#[derive(Clone, Copy)]
pub(crate) struct Found<'i> {
    pub(crate) key: &'i [u8],
    pub(crate) history: &'i KeyHistory,
}

impl<'i> Found<'i> {
    /// The node an index entry names (one a walk of the index found).
    pub(crate) fn of(entry: &'i IndexEntry<'_>) -> Self {
        Found {
            key: entry.key(),
            history: entry.value(),
        }
    }
}

/// Cells, so that the writer's `&self` paths (a txn's compares, decided before it writes)
/// look keys up too: the table is the writer's own, on one thread.
pub(crate) struct KeyLookup {
    /// Pointers to the `IndexKey` inside skip-list nodes, each a node in the index now.
    tables: RefCell<Vec<SlotTable>>,
    /// Bytes from a node's `IndexKey` to its `KeyHistory`: the same in every node (one type),
    /// learned at the first note and asserted at each one after.
    value_offset: Cell<Option<isize>>,
    /// std's SipHash, keyed per process: the keys are the clients'.
    hasher: RandomState,
}

// SAFETY: the pointers name nodes of the index, a `SkipMap<Box<[u8]>, KeyHistory>`, which is
// itself Send and Sync; only the writer that owns this table follows them.
unsafe impl Send for KeyLookup {}

impl std::fmt::Debug for KeyLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.tables.try_borrow().map(|tables| Self::len_of(&tables));
        f.debug_struct("KeyLookup").field("len", &len.ok()).finish()
    }
}

impl KeyLookup {
    pub(crate) fn new() -> Self {
        KeyLookup {
            tables: RefCell::new((0..TABLES).map(|_| SlotTable::default()).collect()),
            value_offset: Cell::new(None),
            hasher: RandomState::new(),
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The table of a hash (`hash`'s answer) and the half of it kept in the slot: bits 32-39
    /// pick the table, the low 32 bits place the key in it.
    fn split(hash: u64) -> (usize, u32) {
        ((hash >> 32) as usize % TABLES, hash as u32)
    }

    /// Keys noted.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        Self::len_of(&self.tables.borrow())
    }

    fn len_of(tables: &[SlotTable]) -> usize {
        tables.iter().map(|t| t.len).sum()
    }

    /// `key`'s node in `index`, through the table, or through the skip list (then noted).
    ///
    /// The answer stays valid until the writer removes a key from `index`: callers hold it
    /// only within one operation's write of that key (removal happens in compaction alone,
    /// which goes through `remove`).
    pub(crate) fn find<'i>(&self, index: &'i Index, key: &[u8]) -> Option<Found<'i>> {
        let hash = self.hash(key);
        let (table, hash_low) = Self::split(hash);
        // SAFETY: every pointer in the tables names the key of a node that is in the index
        // (`note` takes only entries of the index, `remove` drops a key's pointer before the
        // writer removes its node), and nodes in the index are alive.
        let same = |at: NonNull<IndexKey>| unsafe { key_of(at) } == key;
        let tables = self.tables.borrow();
        let hit = tables[table]
            .find(hash_low, same)
            .and_then(|at| tables[table].slots[at].named());
        drop(tables);
        if let Some(at) = hit {
            return Some(unsafe { self.found(at) });
        }
        let entry = index.get(key)?;
        self.note(&entry, hash);
        let at = NonNull::from(entry.key());
        // SAFETY: as above; the entry's node is in the index (the writer alone removes nodes,
        // and it is here).
        Some(unsafe { self.found(at) })
    }

    /// As `index::for_each_in_range`, with a single key (`end` empty) found through the
    /// table.
    pub(crate) fn for_each_in_range<F>(&self, index: &Index, key: &[u8], end: &[u8], mut f: F)
    where
        F: FnMut(&[u8], &KeyHistory) -> bool,
    {
        if end.is_empty() {
            if let Some(found) = self.find(index, key) {
                f(found.key, found.history);
            }
        } else {
            crate::index::for_each_in_range(index, key, end, f);
        }
    }

    /// Notes a node of the index that the writer found and the table did not hold.
    fn note(&self, entry: &IndexEntry<'_>, hash: u64) {
        let key_at = entry.key() as *const IndexKey;
        let value_at = entry.value() as *const KeyHistory;
        let offset = (value_at as isize) - (key_at as isize);
        match self.value_offset.get() {
            None => self.value_offset.set(Some(offset)),
            Some(known) => assert_eq!(
                known, offset,
                "every skip-list node lays out its key and value alike"
            ),
        }
        let (table, hash_low) = Self::split(hash);
        let slot = Slot {
            key: Some(NonNull::from(entry.key())),
            hash_low,
        };
        // Unique: `find` notes a key only after the table missed it.
        self.tables.borrow_mut()[table].insert_unique(slot);
    }

    /// Starts loading, for each of `keys` this table holds, what a `find` of it and a put's
    /// apply read: its slot, its node, its key's bytes, its history's chunk and newest
    /// version. Each is a cache miss that depends on the one before, so each step is taken
    /// for the whole batch before the next: the misses of a step overlap, where a lone
    /// `find` waits for each in turn. A key this table does not hold is skipped after its
    /// slot; nothing is noted or changed.
    pub(crate) fn prefetch(&self, keys: &[&[u8]]) {
        /// Keys in flight at once: past about this many, the first lines loaded would be
        /// evicted by the last before they are read.
        const BATCH_KEYS: usize = 16;
        let Some(offset) = self.value_offset.get() else {
            return;
        };
        let tables = self.tables.borrow();
        let guard = crossbeam_epoch::pin();
        for keys in keys.chunks(BATCH_KEYS) {
            let mut placed = [(0usize, 0u32); BATCH_KEYS];
            for (key, at) in keys.iter().zip(placed.iter_mut()) {
                let (table, hash_low) = Self::split(self.hash(key));
                *at = (table, hash_low);
                tables[table].prefetch_home(hash_low);
            }
            // The first slot whose hash half matches: almost always the key's own (a false
            // match costs only a useless prefetch).
            let mut nodes: [Option<NonNull<IndexKey>>; BATCH_KEYS] = [None; BATCH_KEYS];
            for (&(table, hash_low), node) in placed[..keys.len()].iter().zip(nodes.iter_mut()) {
                let table = &tables[table];
                *node = table
                    .find(hash_low, |_| true)
                    .and_then(|at| table.slots[at].named());
                if let Some(key_at) = *node {
                    crate::index::prefetch(key_at.as_ptr());
                    crate::index::prefetch(key_at.as_ptr().cast::<u8>().wrapping_offset(offset));
                }
            }
            for &key_at in nodes[..keys.len()].iter().flatten() {
                // SAFETY: the slot names a node in the index (as in `find`), and the node's
                // value lies `offset` bytes from its key.
                let found = unsafe { self.found(key_at) };
                crate::index::prefetch(found.key.as_ptr());
                found.history.prefetch_chunk(&guard);
            }
            for &key_at in nodes[..keys.len()].iter().flatten() {
                // SAFETY: as above.
                unsafe { self.found(key_at) }
                    .history
                    .prefetch_newest(&guard);
            }
        }
    }

    /// Removes `key` from `index`, forgetting its slot first: the one way the writer removes
    /// a key, so that no slot outlives its node.
    pub(crate) fn remove(&mut self, index: &Index, key: &[u8]) {
        self.forget(key);
        index.remove(key);
    }

    fn forget(&mut self, key: &[u8]) {
        let (table, hash_low) = Self::split(self.hash(key));
        let table = &mut self.tables.get_mut()[table];
        // SAFETY: as in `find`: the node of `key` is still in the index.
        let same = |at: NonNull<IndexKey>| unsafe { key_of(at) } == key;
        if let Some(at) = table.find(hash_low, same) {
            table.remove(at);
        }
    }

    /// # Safety
    /// `key_at` names the key of a node in the index, and `value_offset` is known.
    unsafe fn found<'i>(&self, key_at: NonNull<IndexKey>) -> Found<'i> {
        let offset = self
            .value_offset
            .get()
            .expect("a noted node taught the value's offset");
        // SAFETY: per the contract, the node is alive, and its value lies `offset` bytes from
        // its key (asserted for every noted node). The value's pointer is derived from the
        // key's: crossbeam's node is `repr(C)` (its value, then its key), so both lie in one
        // allocation that nothing frees or moves while the node is in the index. (Stacked
        // Borrows would object to a pointer from one field reaching its sibling; the node
        // offers no pointer to itself to derive both from.)
        unsafe {
            let key: &'i IndexKey = &*key_at.as_ptr();
            let history = &*(key_at.as_ptr().cast::<u8>().offset(offset) as *const KeyHistory);
            Found { key, history }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_with(keys: &[&[u8]]) -> Index {
        let index = Index::new();
        for k in keys {
            index.insert(Box::from(*k), KeyHistory::new(Vec::new()));
        }
        index
    }

    #[test]
    fn finds_what_the_skip_list_holds_and_nothing_else() {
        let index = index_with(&[b"a", b"bb", b"ccc"]);
        let lookup = KeyLookup::new();
        // A hint before anything is noted, and after: it notes nothing and changes nothing.
        lookup.prefetch(&[b"a", b"zz"]);
        assert_eq!(lookup.len(), 0);
        for key in [&b"a"[..], b"bb", b"ccc"] {
            for _ in 0..2 {
                let found = lookup.find(&index, key).expect("in the index");
                assert_eq!(found.key, key);
                let entry = index.get(key).unwrap();
                assert!(std::ptr::eq(found.history, entry.value()));
            }
        }
        assert_eq!(lookup.len(), 3);
        lookup.prefetch(&[b"a", b"zz", b"ccc", b"bb", b"a"]);
        assert_eq!(lookup.len(), 3);
        assert!(lookup.find(&index, b"zz").is_none());
        assert_eq!(lookup.len(), 3, "a miss notes nothing");
    }

    #[test]
    fn a_removed_key_is_looked_up_again_and_a_new_node_noted() {
        let index = index_with(&[b"k"]);
        let mut lookup = KeyLookup::new();
        assert!(lookup.find(&index, b"k").is_some());
        lookup.remove(&index, b"k");
        assert_eq!(lookup.len(), 0);
        assert!(lookup.find(&index, b"k").is_none());
        let entry = index.insert(Box::from(&b"k"[..]), KeyHistory::new(Vec::new()));
        let found = lookup.find(&index, b"k").expect("inserted again");
        assert!(std::ptr::eq(found.history, entry.value()));
        assert_eq!(lookup.len(), 1);
    }

    /// The table alone against a model, with hash halves drawn from a handful of values so
    /// that runs collide, wrap past the table's end and are cut by removals.
    #[test]
    fn a_table_of_colliding_keys_finds_what_a_model_holds_through_churn() {
        for seed in 1..=20u64 {
            let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            // Stable addresses for the slots to name: one boxed key per key number.
            let keys: Vec<Box<IndexKey>> = (0..40u32)
                .map(|i| Box::new(i.to_be_bytes().to_vec().into_boxed_slice()))
                .collect();
            let hash_of = |i: usize| (i % 5) as u32 * 0x1234_5677;
            let at = |i: usize| NonNull::from(&*keys[i]);
            let mut table = SlotTable::default();
            let mut model = std::collections::BTreeSet::new();
            for _ in 0..2000 {
                let i = (next() % keys.len() as u64) as usize;
                let found = table.find(hash_of(i), |k| k == at(i));
                assert_eq!(found.is_some(), model.contains(&i), "seed {seed}: key {i}");
                match found {
                    Some(slot) if next() % 2 == 0 => {
                        table.remove(slot);
                        model.remove(&i);
                    }
                    None => {
                        table.insert_unique(Slot {
                            key: Some(at(i)),
                            hash_low: hash_of(i),
                        });
                        model.insert(i);
                    }
                    Some(_) => {}
                }
                assert_eq!(table.len, model.len());
                assert!(table.len * 4 <= table.slots.len() * 3, "at most 3/4 full");
            }
            for i in 0..keys.len() {
                let found = table.find(hash_of(i), |k| k == at(i));
                assert_eq!(
                    found.is_some(),
                    model.contains(&i),
                    "seed {seed}: key {i} at the end"
                );
            }
        }
    }

    #[test]
    fn many_keys_spread_over_the_tables_and_all_are_found() {
        let keys: Vec<Vec<u8>> = (0..20_000u32)
            .map(|i| format!("key/{i}").into_bytes())
            .collect();
        let index = Index::new();
        let mut lookup = KeyLookup::new();
        for k in &keys {
            index.insert(k.clone().into_boxed_slice(), KeyHistory::new(Vec::new()));
            lookup.find(&index, k).expect("just inserted");
        }
        assert_eq!(std::mem::size_of::<Slot>(), 12);
        assert_eq!(lookup.len(), keys.len());
        let used = lookup
            .tables
            .borrow()
            .iter()
            .filter(|t| !t.is_empty())
            .count();
        assert_eq!(used, TABLES, "20,000 keys reach every table");
        for k in keys.iter().step_by(7) {
            let found = lookup.find(&index, k).expect("noted");
            assert_eq!(found.key, &k[..]);
            assert!(std::ptr::eq(
                found.history,
                index.get(&k[..]).unwrap().value()
            ));
        }
        for k in keys.iter().step_by(2) {
            lookup.remove(&index, k);
        }
        assert_eq!(lookup.len(), keys.len() / 2);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(lookup.find(&index, k).is_some(), i % 2 == 1);
        }
    }
}
