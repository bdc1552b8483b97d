//! The store's size as the quota counts it, and defragment giving dead space back.

use bytes::Bytes;

use crate::store::{LEASE_BYTES, VERSION_INDEX_BYTES};
use crate::*;

fn put(w: &mut Writer, index: u64, key: &str, value_bytes: usize) {
    w.apply(
        index,
        &Op::Put(PutRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            value: Bytes::from(vec![b'v'; value_bytes]),
            ..Default::default()
        }),
    )
    .expect("put applies");
}

fn compact_fully(w: &mut Writer) {
    while w.compact_step(64) == CompactionStatus::Pending {}
}

#[test]
fn size_counts_value_records_index_and_leases() {
    // What the segment files hold for a value: its record, header and key included.
    let record = |value_bytes: usize| record_bytes(1, value_bytes) as u64;
    let (mut w, r) = Store::with_segment_bytes(4096);
    assert_eq!(w.size_bytes(), 0);
    put(&mut w, 1, "a", 100);
    assert_eq!(w.size_bytes(), record(100) + 1 + VERSION_INDEX_BYTES);
    // Readers (a shard's quota check) see it as soon as the apply returns.
    assert_eq!(r.size_bytes_published(), w.size_bytes());
    put(&mut w, 2, "a", 50);
    assert_eq!(
        w.size_bytes(),
        record(100) + record(50) + 2 * (1 + VERSION_INDEX_BYTES)
    );
    w.apply(3, &Op::LeaseGrant(LeaseGrantRequest { id: 9, ttl_s: 60 }))
        .expect("grant");
    assert_eq!(r.size_bytes_published(), w.size_bytes());
    assert_eq!(
        w.size_bytes(),
        record(100) + record(50) + 2 * (1 + VERSION_INDEX_BYTES) + LEASE_BYTES
    );
    // Compaction drops the old version from the index at once; its record stays until the
    // segment is rewritten.
    w.apply(
        4,
        &Op::Compact(CompactionRequest {
            revision: 3,
            physical: true,
        }),
    )
    .expect("compact");
    compact_fully(&mut w);
    assert_eq!(
        w.size_bytes_in_use(),
        record(50) + 1 + VERSION_INDEX_BYTES + LEASE_BYTES
    );
    assert_eq!(
        w.size_bytes() - w.size_bytes_in_use(),
        record(100),
        "the dead record"
    );
}

#[test]
fn defragment_rewrites_every_segment_with_dead_bytes_then_stops() {
    // 4 KiB segments: four 1000-byte values each.
    let (mut w, r) = Store::with_segment_bytes(4096);
    let mut index = 0;
    for k in 0..20 {
        index += 1;
        put(&mut w, index, &format!("k{k:02}"), 1000);
    }
    // Overwrite one value in each of the five full segments: each stays three-quarters live,
    // which routine reclaim leaves alone (it rewrites segments at most half live).
    for k in (0..20).step_by(4) {
        index += 1;
        put(&mut w, index, &format!("k{k:02}"), 1000);
    }
    index += 1;
    let rev = w.current_revision();
    w.apply(
        index,
        &Op::Compact(CompactionRequest {
            revision: rev,
            physical: true,
        }),
    )
    .expect("compact");
    compact_fully(&mut w);
    let before = w.size_bytes();
    let live = w.size_bytes_in_use();
    assert_eq!(
        before - live,
        5 * record_bytes(3, 1000) as u64,
        "five dead records remain after compaction"
    );
    w.defragment();
    assert!(w.compaction_pending());
    compact_fully(&mut w);
    assert!(!w.compaction_pending(), "defragment never ends");
    assert_eq!(w.size_bytes(), w.size_bytes_in_use(), "dead bytes remain");
    // Every value still reads back.
    for k in 0..20 {
        let got = r
            .range(&RangeRequest {
                key: Bytes::from(format!("k{k:02}")),
                ..Default::default()
            })
            .expect("range");
        assert_eq!(got.kvs[0].value.len(), 1000);
    }
    // With nothing dead, defragment has nothing to do.
    w.defragment();
    assert!(!w.compaction_pending());
}

#[test]
fn a_flipped_value_changes_the_hash_and_compaction_progress_does_not() {
    let (mut w, r) = Store::with_segment_bytes(4096);
    for i in 1..=10 {
        put(&mut w, i, "k", 10 + i as usize);
    }
    let rev = w.current_revision();
    let (before, _) = r.hash_kv(rev).expect("hash");
    // A compaction that has not run a step yet hashes like one that has finished.
    w.apply(
        11,
        &Op::Compact(CompactionRequest {
            revision: rev - 2,
            physical: false,
        }),
    )
    .expect("compact");
    let (mid, _) = r.hash_kv(rev).expect("hash");
    compact_fully(&mut w);
    let (done, _) = r.hash_kv(rev).expect("hash");
    assert_eq!(mid, done);
    assert_ne!(before, done, "the compact revision is part of the hash");
    assert!(w.test_only_flip_value(b"k"));
    let (flipped, _) = r.hash_kv(rev).expect("hash");
    assert_ne!(flipped, done);
}
