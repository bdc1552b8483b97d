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
//! it did.) It holds 12 bytes per key it met: a pointer to the node's key, from which the node's value lies a fixed distance away
//! (one node type, so one layout; checked at every note), and 32 bits of the key's hash, so
//! that a table doubles without reading the keys again (with the pointer alone, the cache
//! misses of that rehash made a put that creates a key 50 % dearer). It is split by hash into
//! tables that double separately, as `DirtyKeys` is, so that no doubling rehashes millions of
//! keys at once on the raft core.

use std::cell::{Cell, RefCell};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::ptr::NonNull;

use hashbrown::HashTable;

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
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Slot {
    key: NonNull<IndexKey>,
    hash_low: u32,
}

impl Slot {
    /// The hash the tables place a slot by, from the stored half alone: spread over 64 bits
    /// so that both the bucket index (low bits) and the control tag (top 7) depend on it.
    fn table_hash(hash_low: u32) -> u64 {
        u64::from(hash_low).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// # Safety
    /// As `key_of`.
    unsafe fn key<'a>(self) -> &'a [u8] {
        // SAFETY: per the contract.
        unsafe { key_of(self.key) }
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
    tables: RefCell<Vec<HashTable<Slot>>>,
    /// Bytes from a node's `IndexKey` to its `KeyHistory`: the same in every node (one type),
    /// learned at the first note and asserted at each one after.
    value_offset: Cell<Option<isize>>,
    /// std's SipHash, keyed per process: the keys are the clients'.
    hasher: RandomState,
    len: Cell<usize>,
}

// SAFETY: the pointers name nodes of the index, a `SkipMap<Box<[u8]>, KeyHistory>`, which is
// itself Send and Sync; only the writer that owns this table follows them.
unsafe impl Send for KeyLookup {}

impl std::fmt::Debug for KeyLookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyLookup")
            .field("len", &self.len.get())
            .finish()
    }
}

impl KeyLookup {
    pub(crate) fn new() -> Self {
        KeyLookup {
            tables: RefCell::new((0..TABLES).map(|_| HashTable::new()).collect()),
            value_offset: Cell::new(None),
            hasher: RandomState::new(),
            len: Cell::new(0),
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
        self.len.get()
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
        let same = |s: &Slot| s.hash_low == hash_low && unsafe { s.key() } == key;
        let hit = self.tables.borrow()[table]
            .find(Slot::table_hash(hash_low), same)
            .map(|at| at.key);
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
            key: NonNull::from(entry.key()),
            hash_low,
        };
        // Unique: `find` notes a key only after the table missed it.
        self.tables.borrow_mut()[table].insert_unique(Slot::table_hash(hash_low), slot, |s| {
            Slot::table_hash(s.hash_low)
        });
        self.len.set(self.len.get() + 1);
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
        let same = |s: &Slot| s.hash_low == hash_low && unsafe { s.key() } == key;
        if let Ok(at) = table.find_entry(Slot::table_hash(hash_low), same) {
            at.remove();
            self.len.set(self.len.get() - 1);
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
        for key in [&b"a"[..], b"bb", b"ccc"] {
            for _ in 0..2 {
                let found = lookup.find(&index, key).expect("in the index");
                assert_eq!(found.key, key);
                let entry = index.get(key).unwrap();
                assert!(std::ptr::eq(found.history, entry.value()));
            }
        }
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
