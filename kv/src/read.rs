//! Reads shared by the writer (inside a txn) and the lock-free readers.

use crossbeam_epoch as epoch;

use crate::error::{KvError, Result};
use crate::index::{for_each_in_range, live_at};
use crate::store::Shared;
use crate::types::{KeyValue, RangeRequest, RangeResponse, SortOrder, SortTarget};

/// etcd's `rangeKeys` plus the applier's filter/sort/limit, at `cur_rev` (the revision the caller
/// treats as current) with `compact_rev` as the oldest readable revision.
pub(crate) fn range_at(
    shared: &Shared,
    req: &RangeRequest,
    cur_rev: i64,
    compact_rev: i64,
) -> Result<RangeResponse> {
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
    // etcd fetches everything when it will sort or filter, else one more than the limit so it can
    // tell whether there is more.
    let fetch_max: usize = if req.sort_order != SortOrder::None || filtered || req.limit <= 0 {
        usize::MAX
    } else {
        usize::try_from(req.limit)
            .expect("limit is positive here")
            .saturating_add(1)
    };
    let guard = epoch::pin();
    let mut count: i64 = 0;
    let mut kvs: Vec<KeyValue> = Vec::new();
    for_each_in_range(&shared.index, &req.key, &req.range_end, |key, history| {
        if let Some(v) = live_at(history.load(&guard), rev) {
            count += 1;
            if !req.count_only && kvs.len() < fetch_max {
                // The table is loaded after the list (see `segments.rs`).
                kvs.push(v.to_key_value(key, shared.segments.load(&guard)));
            }
        }
        true
    });
    if req.max_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision <= req.max_mod_revision);
    }
    if req.min_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision >= req.min_mod_revision);
    }
    if req.max_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision <= req.max_create_revision);
    }
    if req.min_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision >= req.min_create_revision);
    }
    let mut sort_order = req.sort_order;
    if req.sort_target != SortTarget::Key && sort_order == SortOrder::None {
        sort_order = SortOrder::Ascend;
    }
    if sort_order != SortOrder::None {
        let cmp = |a: &KeyValue, b: &KeyValue| match req.sort_target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        };
        // A stable sort keeps ties in key order, as Go's insertion sort does for small results.
        match sort_order {
            SortOrder::Ascend => kvs.sort_by(cmp),
            SortOrder::Descend => kvs.sort_by(|a, b| cmp(b, a)),
            SortOrder::None => unreachable!("handled above"),
        }
    }
    let mut more = false;
    if req.limit > 0 {
        let limit = usize::try_from(req.limit).expect("limit is positive here");
        if kvs.len() > limit {
            kvs.truncate(limit);
            more = true;
        }
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value = bytes::Bytes::new();
        }
    }
    assert!(
        kvs.len() as i64 <= count,
        "never more kvs than keys in range"
    );
    Ok(RangeResponse {
        revision: cur_rev,
        kvs,
        more,
        count,
    })
}
