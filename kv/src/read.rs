//! Reads shared by the writer (inside a txn) and the lock-free readers.

use bytes::Bytes;
use crossbeam_epoch as epoch;

use crate::error::{KvError, Result};
use crate::index::{for_each_in_range, live_at, RecordCheck, Unchecked, Version};
use crate::store::Shared;
use crate::types::{KeyValue, RangeRequest, RangeResponse, SortOrder, SortTarget};

/// etcd's `rangeKeys` plus the applier's filter/sort/limit, at `cur_rev` (the revision the caller
/// treats as current) with `compact_rev` as the oldest readable revision; its values in mapped
/// segment files not yet read (see `Unchecked`).
pub(crate) fn range_at_unchecked(
    shared: &Shared,
    req: &RangeRequest,
    cur_rev: i64,
    compact_rev: i64,
) -> Result<Unchecked<RangeResponse>> {
    range_split_at(shared, req, cur_rev, compact_rev, None).map(|unchecked| {
        unchecked.map(|(response, rest)| {
            assert!(rest.is_none(), "only a split range leaves a rest");
            response
        })
    })
}

/// One key-value of a range's rest, without its value: what its encoding's length depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyValueShape<'a> {
    pub key: &'a [u8],
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    /// 0 for a keys-only range, whose answers carry no value.
    pub value_len: usize,
    pub lease: i64,
}

/// How a range that may be large is split: the first `kvs_max` key-values are read into the
/// answer, and each one after them that the answer owes is only shown to `on_rest`, to be read
/// later a batch at a time (`Reader::range_rest`). So a range of any size holds at most
/// `kvs_max` key-values at once, and its length is known before the rest is read.
pub struct RangeSplit<'f> {
    pub kvs_max: usize,
    pub on_rest: &'f mut dyn FnMut(KeyValueShape<'_>),
}

/// Where a split range goes on: the key-values it still owes, after the last one handed out
/// and up to the last one owed, at the revision the range read. Reading it needs no lock and
/// holds no epoch between batches.
///
/// What the rest reads at its revision cannot change, but for compaction past that revision:
/// compaction only ever cuts the oldest versions off a key's list (and may drop the key), so
/// a key the rest reads is either still answered exactly as the walk saw it, or not at all.
/// Bounded by the last owed key, the rest then either hands out exactly the key-values it
/// owes or comes up short, which `range_rest` reports as compacted. A compaction that cut
/// nothing this range reads does not disturb it.
#[derive(Debug)]
pub struct RangeRest {
    /// The last key handed out; the rest starts after it.
    after: Box<[u8]>,
    /// The last key the answer owes; the rest ends with it.
    last: Box<[u8]>,
    rev: i64,
    kvs_left: usize,
    keys_only: bool,
}

impl RangeRest {
    /// Key-values still owed.
    pub fn kvs_left(&self) -> usize {
        self.kvs_left
    }

    /// The revision the range reads at.
    pub fn revision(&self) -> i64 {
        self.rev
    }
}

/// A range answered in key order with nothing to filter: its key-values are the first keys
/// of the walk, so the walk can stop and resume at a key.
fn in_walk_order(req: &RangeRequest) -> bool {
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    let key_order = req.sort_target == SortTarget::Key
        && matches!(req.sort_order, SortOrder::None | SortOrder::Ascend);
    key_order && !filtered && !req.count_only && !req.range_end.is_empty()
}

/// `range_at_unchecked`, split as `split` says when the range is answered in walk order (otherwise the
/// whole answer is read, as etcd sorts and filters it in memory too).
pub(crate) fn range_split_at(
    shared: &Shared,
    req: &RangeRequest,
    cur_rev: i64,
    compact_rev: i64,
    split: Option<RangeSplit<'_>>,
) -> Result<Unchecked<(RangeResponse, Option<RangeRest>)>> {
    let mut no_rest = |_: KeyValueShape<'_>| {};
    let (kvs_max, on_rest): (_, &mut dyn FnMut(KeyValueShape<'_>)) = match split {
        Some(split) => (Some(split.kvs_max), split.on_rest),
        None => (None, &mut no_rest),
    };
    let mut steps = RangeSteps::start(req, cur_rev, compact_rev, kvs_max)?;
    let walked = steps.step(shared, req, usize::MAX, on_rest);
    assert!(walked, "one unbounded step walks the whole range");
    Ok(steps.finish(req))
}

/// One step of a walk that resumes: visits at most `keys_max` index entries of
/// [`*next_key`, `range_end`), showing `live` each key live at `rev` with its version and the
/// step's epoch guard, and leaves in `next_key` the first key not visited (None once the walk
/// reached the range's end, or was there already). Returns how many entries it visited.
fn walk_live(
    shared: &Shared,
    next_key: &mut Option<Bytes>,
    range_end: &[u8],
    (rev, keys_max): (i64, usize),
    mut live: impl FnMut(&[u8], &Version, &epoch::Guard),
) -> usize {
    walk_histories(
        shared,
        next_key,
        range_end,
        keys_max,
        |key, versions, guard| {
            if let Some(v) = live_at(versions, rev) {
                live(key, v, guard);
            }
        },
    )
}

/// The walk `walk_live` makes, showing `visit` each key's whole version list (a watcher's
/// history read wants every version, not the one live at a revision).
pub(crate) fn walk_histories(
    shared: &Shared,
    next_key: &mut Option<Bytes>,
    range_end: &[u8],
    keys_max: usize,
    mut visit: impl FnMut(&[u8], &[Version], &epoch::Guard),
) -> usize {
    let Some(from) = next_key.take() else {
        return 0;
    };
    let guard = epoch::pin();
    let mut visited = 0usize;
    for_each_in_range(&shared.index, &from, range_end, |key, history| {
        if visited == keys_max {
            *next_key = Some(Bytes::copy_from_slice(key));
            return false;
        }
        visited += 1;
        visit(key, history.load(&guard), &guard);
        true
    });
    visited
}

/// A whole range read (not split), walked in steps when the caller needs them: a range of a
/// million keys inside a txn applied in steps must not hold the raft core for its whole walk
/// (about 400 ms), nor one a shard reads its other calls (`RangeSteps`). `walk` visits the
/// keys, `finish` filters, sorts and limits, as etcd's `rangeKeys` and the applier do. What
/// may change the store between the steps: for the writer's txn, nothing (its steps read its
/// own writes); for a reader, anything, since it reads at a fixed revision that later writes
/// do not touch, and a compaction past that revision fails the read at its end
/// (`Reader::range_steps_finish`).
pub(crate) struct RangeGather {
    /// The revision read at, and the one the answer reports.
    rev: i64,
    cur_rev: i64,
    /// The next key to visit; None once the walk reached the range's end.
    next_key: Option<Bytes>,
    fetch_max: usize,
    /// Filters and a sort drop and move key-values, and each one's record check must go with
    /// it, so that only what is answered is checked (and brought into memory): they work on
    /// pairs. Most ranges have neither, and collect their checks as they read (the limit then
    /// drops at most the one extra key-value fetched to tell whether there is more, whose
    /// record is checked as it always was).
    reorders: bool,
    sort_order: SortOrder,
    /// A keys-only answer serves no value: it reads one only to sort by it.
    with_value: bool,
    count: i64,
    kvs: Vec<KeyValue>,
    checks: Vec<RecordCheck>,
    kv_checks: Vec<Option<RecordCheck>>,
}

impl RangeGather {
    /// A walk of `req` at `cur_rev` (the revision the caller treats as current), or the
    /// error the read answers.
    pub(crate) fn start(req: &RangeRequest, cur_rev: i64, compact_rev: i64) -> Result<Self> {
        assert!(cur_rev >= 1, "the store starts at revision 1");
        if req.revision > cur_rev {
            return Err(KvError::FutureRevision);
        }
        let rev = if req.revision <= 0 {
            cur_rev
        } else {
            req.revision
        };
        if rev < compact_rev {
            return Err(KvError::Compacted);
        }
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        // etcd fetches everything when it will sort or filter, else one more than the limit
        // so it can tell whether there is more.
        let fetch_max: usize = if req.sort_order != SortOrder::None || filtered || req.limit <= 0 {
            usize::MAX
        } else {
            usize::try_from(req.limit)
                .expect("limit is positive here")
                .saturating_add(1)
        };
        let mut sort_order = req.sort_order;
        if req.sort_target != SortTarget::Key && sort_order == SortOrder::None {
            sort_order = SortOrder::Ascend;
        }
        Ok(RangeGather {
            rev,
            cur_rev,
            next_key: Some(req.key.clone()),
            fetch_max,
            reorders: filtered || sort_order != SortOrder::None,
            sort_order,
            with_value: !req.keys_only || req.sort_target == SortTarget::Value,
            count: 0,
            kvs: Vec::new(),
            checks: Vec::new(),
            kv_checks: Vec::new(),
        })
    }

    /// Whether the walk reached the range's end.
    pub(crate) fn walked(&self) -> bool {
        self.next_key.is_none()
    }

    /// Visits at most `keys_max` more index entries of `req`'s range (live or not); returns
    /// how many it visited.
    pub(crate) fn walk(&mut self, shared: &Shared, req: &RangeRequest, keys_max: usize) -> usize {
        let (rev, with_value) = (self.rev, self.with_value);
        walk_live(
            shared,
            &mut self.next_key,
            &req.range_end,
            (rev, keys_max),
            |key, v, guard| {
                self.count += 1;
                if !req.count_only && self.kvs.len() < self.fetch_max {
                    // The table is loaded after the list (see `segments.rs`).
                    let table = shared.segments.load(guard);
                    let (kv, check) = v.to_key_value_unchecked(key, table, with_value);
                    self.kvs.push(kv);
                    if self.reorders {
                        self.kv_checks.push(check);
                    } else {
                        self.checks.extend(check);
                    }
                }
            },
        )
    }

    /// The answer of a walk that reached the range's end.
    pub(crate) fn finish(self, req: &RangeRequest) -> Unchecked<RangeResponse> {
        assert!(self.walked(), "the walk reached the range's end");
        let RangeGather {
            cur_rev,
            sort_order,
            reorders,
            count,
            mut kvs,
            mut checks,
            kv_checks,
            ..
        } = self;
        let limit = usize::try_from(req.limit).ok().filter(|limit| *limit > 0);
        if reorders {
            let mut pairs: Vec<(KeyValue, Option<RecordCheck>)> =
                kvs.into_iter().zip(kv_checks).collect();
            if req.max_mod_revision != 0 {
                pairs.retain(|(kv, _)| kv.mod_revision <= req.max_mod_revision);
            }
            if req.min_mod_revision != 0 {
                pairs.retain(|(kv, _)| kv.mod_revision >= req.min_mod_revision);
            }
            if req.max_create_revision != 0 {
                pairs.retain(|(kv, _)| kv.create_revision <= req.max_create_revision);
            }
            if req.min_create_revision != 0 {
                pairs.retain(|(kv, _)| kv.create_revision >= req.min_create_revision);
            }
            let cmp = |a: &KeyValue, b: &KeyValue| match req.sort_target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            };
            // A stable sort keeps ties in key order, as Go's insertion sort does for small
            // results. (A sort by value compares values not yet checked: a damaged one still
            // stops the reader at `check`, before anything is answered.)
            match sort_order {
                SortOrder::Ascend => pairs.sort_by(|(a, _), (b, _)| cmp(a, b)),
                SortOrder::Descend => pairs.sort_by(|(a, _), (b, _)| cmp(b, a)),
                SortOrder::None => {}
            }
            let answered = limit.map_or(pairs.len(), |limit| limit.min(pairs.len()));
            kvs = Vec::with_capacity(pairs.len());
            for (i, (kv, check)) in pairs.into_iter().enumerate() {
                if i < answered {
                    checks.extend(check);
                }
                kvs.push(kv);
            }
        }
        let mut more = false;
        if let Some(limit) = limit {
            if kvs.len() > limit {
                kvs.truncate(limit);
                more = true;
            }
        }
        if req.keys_only {
            // Values read only to sort by: nothing of them is answered, so nothing is checked.
            for kv in &mut kvs {
                kv.value = Bytes::new();
            }
            checks.clear();
        }
        assert!(
            kvs.len() as i64 <= count,
            "never more kvs than keys in range"
        );
        Unchecked::new(
            RangeResponse {
                revision: cur_rev,
                kvs,
                more,
                count,
            },
            checks,
        )
    }
}

/// The walk of a range in walk order, in steps as `RangeGather`'s: every key is counted, the
/// first `kvs_max` that the answer owes are read, the others it owes are shown to `on_rest`.
pub(crate) struct SplitWalk {
    rev: i64,
    cur_rev: i64,
    kvs_max: usize,
    /// Without filters the answer owes the first `limit` keys, and there is more when the
    /// range holds more: the same answer etcd's fetch of limit + 1 gives.
    owed_max: usize,
    /// The next key to visit; None once the walk reached the range's end.
    next_key: Option<Bytes>,
    count: usize,
    kvs: Vec<KeyValue>,
    rest_kvs: usize,
    checks: Vec<RecordCheck>,
    /// One buffer reused for each owed key: the walk's keys live only as long as its entry.
    last_owed: Vec<u8>,
}

impl SplitWalk {
    fn start(req: &RangeRequest, rev: i64, cur_rev: i64, kvs_max: usize) -> Self {
        assert!(kvs_max > 0, "the rest resumes after a key handed out");
        SplitWalk {
            rev,
            cur_rev,
            kvs_max,
            owed_max: match usize::try_from(req.limit) {
                Ok(limit) if limit > 0 => limit,
                _ => usize::MAX,
            },
            next_key: Some(req.key.clone()),
            count: 0,
            kvs: Vec::new(),
            rest_kvs: 0,
            checks: Vec::new(),
            last_owed: Vec::new(),
        }
    }

    /// Visits at most `keys_max` more index entries of `req`'s range (live or not); returns
    /// how many it visited.
    fn walk(
        &mut self,
        shared: &Shared,
        req: &RangeRequest,
        keys_max: usize,
        on_rest: &mut dyn FnMut(KeyValueShape<'_>),
    ) -> usize {
        let (rev, kvs_max, owed_max) = (self.rev, self.kvs_max, self.owed_max);
        walk_live(
            shared,
            &mut self.next_key,
            &req.range_end,
            (rev, keys_max),
            |key, v, guard| {
                if self.count < kvs_max.min(owed_max) {
                    // The table is loaded after the list (see `segments.rs`).
                    let table = shared.segments.load(guard);
                    let (kv, check) = v.to_key_value_unchecked(key, table, !req.keys_only);
                    self.kvs.push(kv);
                    self.checks.extend(check);
                } else if self.count < owed_max {
                    self.rest_kvs += 1;
                    self.last_owed.clear();
                    self.last_owed.extend_from_slice(key);
                    on_rest(KeyValueShape {
                        key,
                        create_revision: v.create_revision,
                        mod_revision: v.main(),
                        version: v.version,
                        value_len: if req.keys_only { 0 } else { v.value_len() },
                        lease: v.lease,
                    });
                }
                self.count += 1;
            },
        )
    }

    /// The answer of a walk that reached the range's end, and its rest.
    fn finish(self, req: &RangeRequest) -> Unchecked<(RangeResponse, Option<RangeRest>)> {
        assert!(self.next_key.is_none(), "the walk reached the range's end");
        assert_eq!(
            self.kvs.len() + self.rest_kvs,
            self.count.min(self.owed_max),
            "each owed key once"
        );
        let rest = self
            .kvs
            .last()
            .filter(|_| self.rest_kvs > 0)
            .map(|handed_out| RangeRest {
                after: handed_out.key.to_vec().into_boxed_slice(),
                last: self.last_owed.into_boxed_slice(),
                rev: self.rev,
                kvs_left: self.rest_kvs,
                keys_only: req.keys_only,
            });
        let response = RangeResponse {
            revision: self.cur_rev,
            kvs: self.kvs,
            more: self.count > self.owed_max,
            count: i64::try_from(self.count).expect("a count of index entries fits i64"),
        };
        Unchecked::new((response, rest), self.checks)
    }
}

/// A range read by a reader in steps (`Reader::range_steps`): whole (`RangeGather`), or split
/// when it is answered in walk order and the caller asked for a split (`SplitWalk`).
pub struct RangeSteps {
    walk: StepsWalk,
    /// The revision the caller treated as current at the first step: the answer's.
    cur_rev: i64,
    /// The request's range end, which each step is asked for again: a step of another
    /// request would walk on from this one's key with another end and answer neither.
    range_end: Bytes,
}

enum StepsWalk {
    Whole(RangeGather),
    Split(SplitWalk),
}

impl RangeSteps {
    /// The steps of `req` at `cur_rev`, split after `kvs_max` key-values when given and the
    /// range is answered in walk order; or the error the read answers.
    pub(crate) fn start(
        req: &RangeRequest,
        cur_rev: i64,
        compact_rev: i64,
        kvs_max: Option<usize>,
    ) -> Result<Self> {
        let gather = RangeGather::start(req, cur_rev, compact_rev)?;
        let walk = match kvs_max.filter(|_| in_walk_order(req)) {
            Some(kvs_max) => StepsWalk::Split(SplitWalk::start(req, gather.rev, cur_rev, kvs_max)),
            None => StepsWalk::Whole(gather),
        };
        Ok(RangeSteps {
            walk,
            cur_rev,
            range_end: req.range_end.clone(),
        })
    }

    /// The revision the answer reports.
    pub(crate) fn current_revision(&self) -> i64 {
        self.cur_rev
    }

    /// Key-values gathered so far that the end of the steps will filter and sort (a whole
    /// range that sorts or filters, as etcd does in memory): the work `finish` does in one
    /// go, which a caller may hand to another thread. 0 for a range whose key-values are
    /// only handed out.
    pub fn reordered_kvs(&self) -> usize {
        match &self.walk {
            StepsWalk::Whole(gather) if gather.reorders => gather.kvs.len(),
            _ => 0,
        }
    }

    /// Visits at most `keys_max` more index entries; true once the walk reached the range's
    /// end. Key-values past a split's first `kvs_max` that the answer owes go to `on_rest`
    /// (never called for a whole range).
    pub(crate) fn step(
        &mut self,
        shared: &Shared,
        req: &RangeRequest,
        keys_max: usize,
        on_rest: &mut dyn FnMut(KeyValueShape<'_>),
    ) -> bool {
        self.step_counted(shared, req, keys_max, on_rest).0
    }

    /// `step`, with the index entries it visited.
    pub(crate) fn step_counted(
        &mut self,
        shared: &Shared,
        req: &RangeRequest,
        keys_max: usize,
        on_rest: &mut dyn FnMut(KeyValueShape<'_>),
    ) -> (bool, usize) {
        assert!(keys_max > 0, "a step visits at least one key");
        assert_eq!(
            req.range_end, self.range_end,
            "each step walks the request the steps began with"
        );
        match &mut self.walk {
            StepsWalk::Whole(gather) => {
                let visited = gather.walk(shared, req, keys_max);
                (gather.walked(), visited)
            }
            StepsWalk::Split(split) => {
                let visited = split.walk(shared, req, keys_max, on_rest);
                (split.next_key.is_none(), visited)
            }
        }
    }

    /// The answer of steps that reached the range's end, and a split's rest.
    pub(crate) fn finish(
        self,
        req: &RangeRequest,
    ) -> Unchecked<(RangeResponse, Option<RangeRest>)> {
        assert_eq!(
            req.range_end, self.range_end,
            "the steps end with the request they began with"
        );
        match self.walk {
            StepsWalk::Whole(gather) => gather.finish(req).map(|response| (response, None)),
            StepsWalk::Split(split) => split.finish(req),
        }
    }
}

/// The next key-values of `rest`, in key order: at least one while any is owed, and more
/// until they hold `bytes_max` of keys and values. Fewer than owed once the walk reached the
/// last owed key means a compaction cut what the rest reads (see `RangeRest`); the caller
/// tells that from a broken invariant by the compact revision.
pub(crate) fn range_rest_batch(
    shared: &Shared,
    rest: &mut RangeRest,
    bytes_max: usize,
) -> (Unchecked<Vec<KeyValue>>, RestWalk) {
    use std::ops::Bound;
    let guard = epoch::pin();
    let mut kvs: Vec<KeyValue> = Vec::new();
    let mut checks: Vec<RecordCheck> = Vec::new();
    let mut bytes: usize = 0;
    let mut walk = RestWalk::Stopped;
    if rest.kvs_left > 0 {
        walk = RestWalk::ReachedLast;
        let bounds = (
            Bound::Excluded(&rest.after[..]),
            Bound::Included(&rest.last[..]),
        );
        for entry in shared.index.range::<[u8], _>(bounds) {
            if let Some(v) = live_at(entry.value().load(&guard), rest.rev) {
                let table = shared.segments.load(&guard);
                let (kv, check) = v.to_key_value_unchecked(entry.key(), table, !rest.keys_only);
                checks.extend(check);
                bytes += kv.key.len() + kv.value.len();
                kvs.push(kv);
            }
            if kvs.len() == rest.kvs_left || bytes >= bytes_max {
                walk = RestWalk::Stopped;
                break;
            }
        }
    }
    assert!(kvs.len() <= rest.kvs_left, "never more than the range owes");
    rest.kvs_left -= kvs.len();
    if let Some(handed_out) = kvs.last() {
        rest.after = handed_out.key.to_vec().into_boxed_slice();
    }
    (Unchecked::new(kvs, checks), walk)
}

/// How a batch of a range's rest ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestWalk {
    /// It held what was owed or its bytes, or nothing was owed.
    Stopped,
    /// It passed the last owed key: whatever is still owed is no longer there.
    ReachedLast,
}
