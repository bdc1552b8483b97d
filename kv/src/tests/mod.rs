//! Tests beside the code: data-driven scenarios, a model-based property test, checkpoint round
//! trips and damage, and a concurrency test.

mod checkpoint;
mod concurrency;
mod delta;
mod model;
mod on_disk;
mod scenario;
mod space;
mod split;

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::{CompactionRequest, Op, Writer};

/// What the server's driver does, against a map: each sealed segment's records, padded to a
/// 4 KiB block as O_DIRECT writes it, become the segment's "file", and the values move into
/// it.
fn write_sealed(w: &mut Writer, disk: &mut BTreeMap<u32, Bytes>) {
    for sealed in w.take_sealed_segments() {
        let mut file: Vec<u8> = sealed.records.to_vec();
        assert_eq!(file.len() as u64, sealed.bytes);
        file.resize(file.len().next_multiple_of(4096), 0);
        let file = Bytes::from(file);
        disk.insert(sealed.id, file.clone());
        w.segment_durable(sealed.id, sealed.bytes, file);
    }
    assert_eq!(w.sealed_backlog_bytes(), 0);
}

/// Applies, as raft entry `index`, a compaction at `revision` (its steps are the caller's).
fn compact(w: &mut Writer, index: u64, revision: i64) {
    w.apply(
        index,
        &Op::Compact(CompactionRequest {
            revision,
            physical: false,
        }),
    )
    .unwrap();
}

/// An apply that writes more events than `apply_bounded` may keep hands out none, says so,
/// still counts every write, and leaves the revision to history reads, which give every
/// event; one under the bound keeps all of its events.
#[test]
fn an_apply_past_its_event_bound_leaves_the_events_to_history() {
    use crate::{DeleteRangeRequest, EventKind, PutRequest, Store, WriteCounts};
    let put = |i: u64| {
        Op::Put(PutRequest {
            key: Bytes::from(format!("k{i}")),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        })
    };
    let (mut w, r) = Store::new();
    for i in 0..5u64 {
        let applied = w.apply_bounded(i + 1, &put(i), 3).expect("put");
        assert!(!applied.events_cut);
        assert_eq!(applied.events.len(), 1);
        assert_eq!(
            applied.counts,
            WriteCounts {
                puts: 1,
                created: 1,
                deletes: 0
            }
        );
    }
    let delete = Op::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(b"k"),
        range_end: Bytes::from_static(b"l"),
        ..Default::default()
    });
    let applied = w.apply_bounded(6, &delete, 3).expect("delete");
    assert!(applied.events_cut);
    assert!(applied.events.is_empty());
    assert_eq!(applied.counts.deletes, 5);
    let rev = w.current_revision();
    let history = r.range_events(rev, b"k", b"l", 100).expect("not compacted");
    assert_eq!(history.events.len(), 5);
    assert!(history
        .events
        .iter()
        .all(|e| e.kind == EventKind::Delete && e.kv.mod_revision == rev));
    // Exactly at the bound, every event is kept.
    let (mut w, _r) = Store::new();
    for i in 0..3u64 {
        w.apply(i + 1, &put(i)).expect("put");
    }
    let applied = w.apply_bounded(4, &delete, 3).expect("delete");
    assert!(!applied.events_cut);
    assert_eq!(applied.events.len(), 3);
}
