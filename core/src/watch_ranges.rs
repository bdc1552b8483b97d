//! The index of range watchers: which watchers a key's event reaches.
//!
//! An interval tree (a treap ordered by (start, end), each node also holding the largest end in
//! its subtree), as etcd's watcher groups keep an interval tree. One node per distinct range
//! holds every watcher of that range, so the common case (many watchers of one prefix, as
//! Kubernetes' are) is one node whose watchers are matched as one contiguous set.
//!
//! Memory is one node per distinct range plus one entry per watcher, whatever the ranges'
//! overlap. The index it replaces cut the key space at every boundary and listed in each
//! elementary interval the watchers covering it; ranges that overlap without sharing a
//! boundary (watchers from many different start keys to the end) cost it quadratic memory and
//! time: 411 MiB and 3.7 s of CPU for 5,000 such watchers (BENCHMARKS.md).
//!
//! Costs: adding or removing a watcher is O(log R) expected for R distinct ranges (a new range
//! splits and merges the treap); matching a key visits the nodes whose range contains it and,
//! at most, O(log R) others on each path down, since a subtree whose largest end is at or
//! before the key, or whose smallest start is after it, is skipped whole.

use bytes::Bytes;
use indexmap::IndexSet;

/// The watchers of one range, as (stream id, watch id): removal is O(1) (a swap with the last),
/// so a stream closing with 100,000 watchers on one range costs 100,000 steps, not 5 billion.
/// Order carries no meaning (each watcher's events stay in order).
pub type WatcherSet = IndexSet<(u64, i64)>;

/// Where a range ends: before a key, or at the end of the key space (`--from-key`). Ordered
/// so that the end of the key space comes after every key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Before(Bytes),
    Unbounded,
}

impl End {
    fn of(end: Option<&Bytes>) -> End {
        end.map_or(End::Unbounded, |e| End::Before(e.clone()))
    }

    /// Whether a range ending here still contains `key`.
    fn after(&self, key: &[u8]) -> bool {
        match self {
            End::Before(e) => key < e.as_ref(),
            End::Unbounded => true,
        }
    }
}

struct Node {
    start: Bytes,
    end: End,
    watchers: WatcherSet,
    /// The treap's heap order: a node's priority is at least its children's, which keeps the
    /// tree's depth O(log R) expected whatever order ranges arrive in.
    priority: u64,
    /// The largest end in this subtree (this node's and its children's).
    max_end: End,
    left: Option<Box<Node>>,
    right: Option<Box<Node>>,
}

type Tree = Option<Box<Node>>;

impl Node {
    fn key_cmp(&self, start: &[u8], end: &End) -> std::cmp::Ordering {
        (self.start.as_ref(), &self.end).cmp(&(start, end))
    }

    /// Recomputes `max_end` from this node and its children.
    fn update(&mut self) {
        let mut max_end = self.end.clone();
        for child in [&self.left, &self.right].into_iter().flatten() {
            if child.max_end > max_end {
                max_end = child.max_end.clone();
            }
        }
        self.max_end = max_end;
    }
}

/// Splits `tree` into the nodes ordered before (start, end) and those at or after it.
fn split(tree: Tree, start: &[u8], end: &End) -> (Tree, Tree) {
    let Some(mut node) = tree else {
        return (None, None);
    };
    if node.key_cmp(start, end).is_lt() {
        let (less, rest) = split(node.right.take(), start, end);
        node.right = less;
        node.update();
        (Some(node), rest)
    } else {
        let (less, rest) = split(node.left.take(), start, end);
        node.left = rest;
        node.update();
        (less, Some(node))
    }
}

/// Joins two treaps, every node of `low` ordered before every node of `high`.
fn merge(low: Tree, high: Tree) -> Tree {
    match (low, high) {
        (None, t) | (t, None) => t,
        (Some(mut l), Some(mut h)) => {
            if l.priority >= h.priority {
                l.right = merge(l.right.take(), Some(h));
                l.update();
                Some(l)
            } else {
                h.left = merge(Some(l), h.left.take());
                h.update();
                Some(h)
            }
        }
    }
}

/// Removes the node of (start, end) from `tree`, if there, and returns what is left.
fn remove_node(tree: Tree, start: &[u8], end: &End) -> Tree {
    let mut node = tree?;
    match node.key_cmp(start, end) {
        std::cmp::Ordering::Equal => merge(node.left.take(), node.right.take()),
        std::cmp::Ordering::Less => {
            node.right = remove_node(node.right.take(), start, end);
            node.update();
            Some(node)
        }
        std::cmp::Ordering::Greater => {
            node.left = remove_node(node.left.take(), start, end);
            node.update();
            Some(node)
        }
    }
}

fn find_mut<'a>(mut tree: &'a mut Tree, start: &[u8], end: &End) -> Option<&'a mut Node> {
    while let Some(node) = tree {
        match node.key_cmp(start, end) {
            std::cmp::Ordering::Equal => return Some(node),
            std::cmp::Ordering::Less => tree = &mut node.right,
            std::cmp::Ordering::Greater => tree = &mut node.left,
        }
    }
    None
}

/// Calls `f` with the watchers of every range in `tree` that contains `key`.
fn visit<'a>(tree: &'a Tree, key: &[u8], f: &mut impl FnMut(&'a WatcherSet)) {
    let Some(node) = tree else {
        return;
    };
    if !node.max_end.after(key) {
        return; // Every range below ends at or before the key.
    }
    visit(&node.left, key, f);
    if node.start.as_ref() <= key {
        if node.end.after(key) {
            f(&node.watchers);
        }
        visit(&node.right, key, f);
    } // Otherwise this node and everything right of it start after the key.
}

/// Range watchers indexed for matching (see the module's comment).
#[derive(Default)]
pub struct RangeIndex {
    root: Tree,
    /// Distinct ranges (nodes).
    ranges: usize,
    /// Feeds the priorities: a hub's index builds the same tree for the same calls, so a
    /// simulation replays it exactly.
    priority_seed: u64,
}

impl RangeIndex {
    /// splitmix64: well-spread priorities from a counter.
    fn next_priority(&mut self) -> u64 {
        self.priority_seed = self.priority_seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.priority_seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Adds a watcher of [start, end), or of [start, ∞) when `end` is None.
    pub fn insert(&mut self, start: &Bytes, end: Option<&Bytes>, watcher: (u64, i64)) {
        assert!(
            end.is_none_or(|e| start < e),
            "an empty range is refused before indexing"
        );
        let end = End::of(end);
        if let Some(node) = find_mut(&mut self.root, start, &end) {
            node.watchers.insert(watcher);
            return;
        }
        let node = Box::new(Node {
            start: start.clone(),
            max_end: end.clone(),
            end,
            watchers: WatcherSet::from([watcher]),
            priority: self.next_priority(),
            left: None,
            right: None,
        });
        let (less, rest) = split(self.root.take(), &node.start, &node.end);
        self.root = merge(merge(less, Some(node)), rest);
        self.ranges += 1;
    }

    /// Removes a watcher added with the same range; its range's node goes with its last one.
    pub fn remove(&mut self, start: &Bytes, end: Option<&Bytes>, watcher: (u64, i64)) {
        let end = End::of(end);
        let Some(node) = find_mut(&mut self.root, start, &end) else {
            return;
        };
        node.watchers.swap_remove(&watcher);
        if node.watchers.is_empty() {
            self.root = remove_node(self.root.take(), start, &end);
            self.ranges -= 1;
        }
    }

    /// Calls `f` with each watcher whose range contains `key` (each once: a watcher has one
    /// range).
    pub fn for_each_covering<'a>(&'a self, key: &[u8], mut f: impl FnMut(&'a (u64, i64))) {
        visit(&self.root, key, &mut |set: &'a WatcherSet| {
            set.iter().for_each(&mut f)
        });
    }

    /// Distinct ranges indexed.
    pub fn ranges(&self) -> usize {
        self.ranges
    }

    /// The tree's depth (for tests: it stays logarithmic).
    #[cfg(test)]
    fn depth(&self) -> usize {
        fn depth(t: &Tree) -> usize {
            t.as_ref()
                .map_or(0, |n| 1 + depth(&n.left).max(depth(&n.right)))
        }
        depth(&self.root)
    }
}

impl Drop for RangeIndex {
    /// Tears the tree down without recursion (a long-lived index may be deep in a bad case).
    fn drop(&mut self) {
        let mut stack: Vec<Box<Node>> = self.root.take().into_iter().collect();
        while let Some(mut node) = stack.pop() {
            stack.extend(node.left.take());
            stack.extend(node.right.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn at(idx: &RangeIndex, k: &str) -> Vec<(u64, i64)> {
        let mut v = Vec::new();
        idx.for_each_covering(k.as_bytes(), |w| v.push(*w));
        v.sort();
        v
    }

    #[test]
    fn matches_exactly_the_covering_watchers() {
        let mut idx = RangeIndex::default();
        idx.insert(&b("a"), Some(&b("m")), (1, 1));
        idx.insert(&b("f"), None, (1, 2));
        idx.insert(&b("c"), Some(&b("g")), (2, 1));
        assert_eq!(at(&idx, "0"), vec![]);
        assert_eq!(at(&idx, "a"), vec![(1, 1)]);
        assert_eq!(at(&idx, "d"), vec![(1, 1), (2, 1)]);
        assert_eq!(at(&idx, "f"), vec![(1, 1), (1, 2), (2, 1)]);
        assert_eq!(at(&idx, "g"), vec![(1, 1), (1, 2)]);
        assert_eq!(at(&idx, "z"), vec![(1, 2)]);
        idx.remove(&b("c"), Some(&b("g")), (2, 1));
        idx.remove(&b("a"), Some(&b("m")), (1, 1));
        assert_eq!(at(&idx, "d"), vec![]);
        assert_eq!(at(&idx, "z"), vec![(1, 2)]);
        idx.remove(&b("f"), None, (1, 2));
        assert_eq!(idx.ranges(), 0, "a range leaves with its last watcher");
    }

    #[test]
    fn many_watchers_on_one_range_leave_in_any_order_and_the_rest_stay_matched() {
        let mut idx = RangeIndex::default();
        let watchers: Vec<(u64, i64)> = (0..2_000).map(|i| (i % 7, i as i64)).collect();
        for w in &watchers {
            idx.insert(&b("/registry/pods/"), Some(&b("/registry/pods0")), *w);
        }
        idx.insert(&b("/registry/"), Some(&b("/registry0")), (9, 9));
        // Removed in an order unlike the insertion's, as streams close: each removal swaps
        // the last watcher into the gap, and the set must still hold exactly the others.
        let mut order = watchers.clone();
        order.sort_by_key(|&(s, id)| (id * 7919) % 2_000 + s as i64);
        let (gone, kept) = order.split_at(1_500);
        for w in gone {
            idx.remove(&b("/registry/pods/"), Some(&b("/registry/pods0")), *w);
        }
        let mut want: Vec<(u64, i64)> = kept.iter().copied().chain([(9, 9)]).collect();
        want.sort();
        assert_eq!(at(&idx, "/registry/pods/a"), want);
        for w in kept {
            idx.remove(&b("/registry/pods/"), Some(&b("/registry/pods0")), *w);
        }
        assert_eq!(at(&idx, "/registry/pods/a"), vec![(9, 9)]);
        assert_eq!(idx.ranges(), 1, "only the outer range remains");
    }

    /// Against a list of (start, end, watcher) searched whole, over random ranges that share
    /// boundaries, nest, overlap and repeat, added and removed in random order.
    #[test]
    fn matches_what_a_search_of_every_range_finds() {
        for seed in 0..30u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut idx = RangeIndex::default();
            let mut model: Vec<(Bytes, Option<Bytes>, (u64, i64))> = Vec::new();
            let key = |rng: &mut rand::rngs::StdRng| {
                let len = rng.gen_range(0..4);
                Bytes::from(
                    (0..len)
                        .map(|_| rng.gen_range(b'a'..b'f'))
                        .collect::<Vec<u8>>(),
                )
            };
            let mut next_id = 0i64;
            for step in 0..2_000 {
                if model.is_empty() || rng.gen_bool(0.6) {
                    let start = key(&mut rng);
                    let end = if rng.gen_bool(0.2) {
                        None
                    } else {
                        let e = key(&mut rng);
                        if e <= start {
                            continue;
                        }
                        Some(e)
                    };
                    next_id += 1;
                    let w = (rng.gen_range(0..4), next_id);
                    idx.insert(&start, end.as_ref(), w);
                    model.push((start, end, w));
                } else {
                    let (start, end, w) = model.swap_remove(rng.gen_range(0..model.len()));
                    idx.remove(&start, end.as_ref(), w);
                }
                for _ in 0..3 {
                    let k = key(&mut rng);
                    let mut want: Vec<(u64, i64)> = model
                        .iter()
                        .filter(|(s, e, _)| {
                            s.as_ref() <= k.as_ref() && e.as_ref().is_none_or(|e| k < e)
                        })
                        .map(|(_, _, w)| *w)
                        .collect();
                    want.sort();
                    let mut got = Vec::new();
                    idx.for_each_covering(&k, |w| got.push(*w));
                    got.sort();
                    assert_eq!(got, want, "seed {seed} step {step} key {k:?}");
                }
                let distinct: std::collections::BTreeSet<(&Bytes, &Option<Bytes>)> =
                    model.iter().map(|(s, e, _)| (s, e)).collect();
                assert_eq!(idx.ranges(), distinct.len(), "seed {seed} step {step}");
            }
        }
    }

    /// Watchers from 20,000 different start keys to the end: one node each, a shallow tree,
    /// and a key after all of them reaches every one (the case that cost the elementary
    /// intervals 200 million entries).
    #[test]
    fn ranges_that_overlap_without_sharing_boundaries_cost_one_node_each() {
        let mut idx = RangeIndex::default();
        let n = 20_000u64;
        for i in 0..n {
            let start = Bytes::from([&[1u8][..], &i.to_be_bytes()].concat());
            idx.insert(&start, None, (i % 10, i as i64));
        }
        assert_eq!(idx.ranges(), n as usize);
        assert!(idx.depth() <= 60, "depth {} for {n} ranges", idx.depth());
        let mut reached = 0;
        idx.for_each_covering(&[0xff], |_| reached += 1);
        assert_eq!(reached, n);
        let mut reached = 0;
        idx.for_each_covering(&[1, 0, 0, 0, 0, 0, 0, 0, 9], |_| reached += 1);
        assert_eq!(reached, 10, "starts 0 through 9 are at or before it");
        for i in (0..n).rev() {
            let start = Bytes::from([&[1u8][..], &i.to_be_bytes()].concat());
            idx.remove(&start, None, (i % 10, i as i64));
        }
        assert_eq!(idx.ranges(), 0);
    }
}
