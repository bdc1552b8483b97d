//! Checkpoint round trips and damaged checkpoints; hash format; value-log reclaim.

use bytes::Bytes;

use crate::*;

fn put(key: &str, value: &[u8], lease: i64) -> Op {
    Op::Put(PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value),
        lease,
        ..Default::default()
    })
}

/// A store with history, a tombstone, a lease and a pending compaction.
fn populated() -> (Writer, Reader) {
    let (mut w, r) = Store::with_segment_bytes(1024);
    let mut index = 0;
    let mut apply = |w: &mut Writer, op: Op| {
        index += 1;
        w.apply(index, &op).expect("applies");
    };
    apply(
        &mut w,
        Op::LeaseGrant(LeaseGrantRequest { id: 7, ttl_s: 30 }),
    );
    for i in 0..40 {
        apply(
            &mut w,
            put(
                &format!("k{:02}", i % 13),
                &vec![i as u8; 100 + i],
                if i % 5 == 0 { 7 } else { 0 },
            ),
        );
    }
    apply(
        &mut w,
        Op::DeleteRange(DeleteRangeRequest {
            key: Bytes::from_static(b"k03"),
            ..Default::default()
        }),
    );
    apply(&mut w, put("empty", b"", 0));
    apply(
        &mut w,
        Op::Compact(CompactionRequest {
            revision: 20,
            physical: false,
        }),
    );
    w.compact_step(3);
    (w, r)
}

#[test]
fn checkpoint_round_trip() {
    let (w, r) = populated();
    let bytes = w.checkpoint();
    let (w2, r2) = Store::restore(&bytes).expect("restores");
    assert_eq!(
        r2.size_bytes_published(),
        w2.size_bytes(),
        "published before use"
    );
    assert!(w2.size_bytes() > 0);
    assert_eq!(w2.applied_index(), w.applied_index());
    assert_eq!(w2.current_revision(), w.current_revision());
    assert_eq!(w2.compact_revision(), 20);
    assert_eq!(w2.leases(), w.leases());
    assert!(!w2.leases()[0].keys.is_empty());
    for rev in [20, 30, 0] {
        let all = RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            revision: rev,
            ..Default::default()
        };
        assert_eq!(r2.range(&all), r.range(&all));
    }
    assert_eq!(r2.hash_kv(0), r.hash_kv(0));
    // Checkpointing the restored store gives the same bytes: the format is deterministic.
    assert_eq!(w2.checkpoint(), bytes);
}

#[test]
fn a_checkpoint_restores_the_same_from_an_aligned_or_a_misaligned_buffer() {
    // The aligned payload is read in place, a misaligned one from a copy: both the same store.
    let (w, r) = populated();
    let bytes = w.checkpoint();
    let all = RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..Default::default()
    };
    let mut buffer = rkyv::util::AlignedVec::<64>::with_capacity(bytes.len() + 64);
    for shift in 0..CHECKPOINT_PAYLOAD_ALIGN_BYTES + 1 {
        buffer.clear();
        // Places the payload (after the header) at `shift` past an aligned address.
        let pad = (CHECKPOINT_PAYLOAD_ALIGN_BYTES - CHECKPOINT_HEADER_BYTES % 16 + shift) % 64;
        buffer.extend_from_slice(&vec![0u8; pad]);
        buffer.extend_from_slice(&bytes);
        let image = &buffer[pad..];
        assert_eq!(
            (image[CHECKPOINT_HEADER_BYTES..].as_ptr() as usize) % CHECKPOINT_PAYLOAD_ALIGN_BYTES,
            shift % CHECKPOINT_PAYLOAD_ALIGN_BYTES
        );
        let (w2, r2) = Store::restore(image).expect("restores");
        assert_eq!(w2.applied_index(), w.applied_index(), "shift {shift}");
        assert_eq!(r2.range(&all), r.range(&all), "shift {shift}");
        assert_eq!(
            checkpoint_segments(image).unwrap(),
            checkpoint_segments(&bytes).unwrap()
        );
    }
}

#[test]
fn damaged_checkpoints_are_rejected() {
    let (w, _) = populated();
    let bytes = w.checkpoint();
    let damaged = |b: &[u8]| matches!(Store::restore(b), Err(KvError::CheckpointDamaged(_)));
    assert!(damaged(&[]));
    for len in [
        1,
        CHECKPOINT_HEADER_BYTES - 1,
        CHECKPOINT_HEADER_BYTES,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        assert!(damaged(&bytes[..len]), "truncated to {len}");
    }
    // Every single flipped bit position class: header fields, payload start, middle and end.
    let positions = [
        0,
        9,
        17,
        25,
        33,
        37,
        CHECKPOINT_HEADER_BYTES,
        bytes.len() / 2,
        bytes.len() - 1,
    ];
    for pos in positions {
        let mut b = bytes.clone();
        b[pos] ^= 0x40;
        assert!(damaged(&b), "flipped byte at {pos}");
    }
    for pad in [1, 8, 4096] {
        let mut b = bytes.clone();
        b.extend(std::iter::repeat_n(0u8, pad));
        assert!(damaged(&b), "zero padded by {pad}");
    }
    // Zeros where the payload should be, with a header that matches them: rkyv would read an empty
    // archive from the trailing zeros; the key count and crc catch it.
    let mut zeros = bytes.clone();
    for b in &mut zeros[CHECKPOINT_HEADER_BYTES..] {
        *b = 0;
    }
    assert!(damaged(&zeros));
    // The same, with the crcs recomputed to match the zeros: only the archive validation and the key
    // count stand between this and a silently empty store.
    let payload_crc = crc32fast::hash(&zeros[CHECKPOINT_HEADER_BYTES..]);
    zeros[32..36].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32fast::hash(&zeros[..36]);
    zeros[36..40].copy_from_slice(&header_crc.to_le_bytes());
    let err = Store::restore(&zeros).err().expect("zeros never restore");
    assert!(
        matches!(
            err,
            KvError::CheckpointDamaged(
                "key count does not match the header" | "archive failed validation"
            )
        ),
        "{err}"
    );
    assert!(
        Store::restore(&bytes).is_ok(),
        "the undamaged original still restores"
    );
}

#[test]
fn hash_follows_the_documented_format() {
    let (mut w, r) = Store::new();
    w.apply(1, &put("k", b"v", 0)).expect("put");
    let mut h = crc32fast::Hasher::new();
    h.update(&1u64.to_le_bytes());
    h.update(b"k");
    h.update(&2i64.to_le_bytes()); // main
    h.update(&0i64.to_le_bytes()); // sub
    h.update(&[1]); // a put
    h.update(&2i64.to_le_bytes()); // create
    h.update(&1i64.to_le_bytes()); // version
    h.update(&0i64.to_le_bytes()); // lease
    h.update(&1u64.to_le_bytes());
    h.update(b"v");
    h.update(&COMPACT_REVISION_NONE.to_le_bytes());
    assert_eq!(r.hash_kv(0), Ok((h.finalize(), COMPACT_REVISION_NONE)));
    // The hash at revision 1 covers nothing but the compact revision.
    let empty = crc32fast::hash(&COMPACT_REVISION_NONE.to_le_bytes());
    assert_eq!(r.hash_kv(1), Ok((empty, COMPACT_REVISION_NONE)));
    assert_eq!(r.hash_kv(3), Err(KvError::FutureRevision));
}

#[test]
fn reclaim_rewrites_mostly_dead_segments_and_readers_keep_their_slices() {
    let (mut w, r) = Store::with_segment_bytes(4096);
    let mut index = 0;
    for round in 0..20u8 {
        for k in 0..8 {
            index += 1;
            w.apply(index, &put(&format!("key{k}"), &[round; 200], 0))
                .expect("put");
        }
    }
    let held = r
        .range(&RangeRequest {
            key: Bytes::from_static(b"key0"),
            revision: 2,
            ..Default::default()
        })
        .expect("old revision readable");
    let bytes_before = w.value_log_bytes();
    assert_eq!(bytes_before, 20 * 8 * 200);
    index += 1;
    w.apply(
        index,
        &Op::Compact(CompactionRequest {
            revision: w.current_revision(),
            physical: true,
        }),
    )
    .expect("compact");
    let mut steps = 0;
    while w.compact_step(4) == CompactionStatus::Pending {
        steps += 1;
        assert!(steps < 10_000);
    }
    assert!(steps > 2, "bounded steps: the work is split");
    assert!(!w.compaction_pending());
    // Only the newest value of each key is live, and old segments were dropped from the log.
    assert_eq!(w.value_log_bytes_live(), 8 * 200);
    assert!(
        w.value_log_bytes() < bytes_before / 4,
        "reclaimed: {} bytes left",
        w.value_log_bytes()
    );
    // A slice handed out before compaction still reads its bytes.
    assert_eq!(held.kvs[0].value.as_ref(), &[0u8; 200][..]);
    let latest = r
        .range(&RangeRequest {
            key: Bytes::from_static(b"key0"),
            ..Default::default()
        })
        .expect("latest");
    assert_eq!(latest.kvs[0].value.as_ref(), &[19u8; 200][..]);
    assert_eq!(latest.kvs[0].version, 20);
}

#[test]
fn checkpoint_source_serializes_off_the_writer_while_it_applies() {
    let (mut w, r) = populated();
    let source = w.checkpoint_source();
    let revision = source.revision();
    let applied_index = source.applied_index();
    let serializer = std::thread::spawn(move || source.serialize());
    // The writer keeps applying: new keys, overwrites, deletes and a new lease.
    keep_applying(&mut w);
    let bytes = serializer
        .join()
        .expect("serializer thread")
        .expect("no new compaction started");
    let (w2, r2) = Store::restore(&bytes).expect("restores");
    assert_eq!(w2.applied_index(), applied_index);
    assert_eq!(w2.current_revision(), revision);
    assert_eq!(w2.leases().len(), 1, "the lease granted later is not in it");
    let all = RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        revision,
        ..Default::default()
    };
    let (mut expected, mut restored) = (
        r.range(&all).expect("range"),
        r2.range(&all).expect("range"),
    );
    (expected.revision, restored.revision) = (0, 0);
    assert_eq!(restored, expected);
    assert_eq!(
        r2.hash_kv(revision).map(|h| h.0),
        r.hash_kv(revision).map(|h| h.0)
    );

    // A compaction that starts while serializing makes the archive stale: refuse it.
    let source = w.checkpoint_source();
    compact_at_current_revision(&mut w);
    assert_eq!(source.serialize(), Err(KvError::Compacted));
}

/// Applies `ops` to a fresh store, one raft index each.
fn store_with(ops: &[Op]) -> (Writer, Reader) {
    let (mut w, r) = Store::with_segment_bytes(1024);
    for (i, op) in ops.iter().enumerate() {
        w.apply(i as u64 + 1, op).expect("applies");
    }
    (w, r)
}

/// History on a few keys, a lease with keys, a delete and a compaction in the middle.
fn member_log() -> Vec<Op> {
    let mut ops = vec![Op::LeaseGrant(LeaseGrantRequest { id: 7, ttl_s: 30 })];
    for i in 0..60 {
        ops.push(put(
            &format!("k{:02}", i % 11),
            &vec![i as u8; 50 + i],
            if i % 4 == 0 { 7 } else { 0 },
        ));
    }
    ops.push(Op::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(b"k05"),
        ..Default::default()
    }));
    ops.push(Op::Compact(CompactionRequest {
        revision: 40,
        physical: false,
    }));
    ops.push(put("after", b"compaction", 0));
    ops
}

#[test]
fn store_hash_is_the_same_on_members_at_any_point_of_their_compaction() {
    let ops = member_log();
    // One member has not started its background compaction, one is in the middle of it, one has
    // finished it and rewritten its value-log segments.
    let (untouched, untouched_r) = store_with(&ops);
    let (mut partial, partial_r) = store_with(&ops);
    partial.compact_step(2);
    let (mut finished, finished_r) = store_with(&ops);
    while finished.compact_step(3) == CompactionStatus::Pending {}
    assert!(untouched.compaction_pending() && partial.compaction_pending());
    let hash = untouched
        .checkpoint_source()
        .hash()
        .expect("no compaction races");
    assert_eq!(partial.checkpoint_source().hash(), Ok(hash));
    assert_eq!(finished.checkpoint_source().hash(), Ok(hash));
    // HashKV skips what the compaction drops the same way.
    let hash_kv = untouched_r.hash_kv(0).expect("hash_kv");
    assert_eq!(partial_r.hash_kv(0), Ok(hash_kv));
    assert_eq!(finished_r.hash_kv(0), Ok(hash_kv));
    assert_eq!(finished_r.hash_kv(50), untouched_r.hash_kv(50));
    // A member restarted from a checkpoint (taken mid-compaction) answers the same.
    let (restored, _) = Store::restore(&partial.checkpoint()).expect("restores");
    assert_eq!(restored.checkpoint_source().hash(), Ok(hash));
    // Asking twice gives the same answer: nothing in it depends on when it is asked.
    assert_eq!(untouched.checkpoint_source().hash(), Ok(hash));
}

#[test]
fn store_hash_covers_every_revision_leases_and_the_compact_revision() {
    let ops = member_log();
    let (w, r) = store_with(&ops);
    let hash = w.checkpoint_source().hash().expect("hash");
    assert_ne!(hash, 0);

    // An entry that changes nothing replicated (an empty or membership entry) moves the applied
    // index but not the hash, as etcd leaves its consistent index out.
    let (mut empty, _) = store_with(&ops);
    empty.apply_empty(ops.len() as u64 + 1);
    assert_eq!(empty.checkpoint_source().hash(), Ok(hash));

    // A lease grant changes no revision, and still changes the hash.
    let mut with_lease = ops.clone();
    with_lease.push(Op::LeaseGrant(LeaseGrantRequest { id: 8, ttl_s: 30 }));
    let (leased, leased_r) = store_with(&with_lease);
    assert_eq!(leased.current_revision(), w.current_revision());
    assert_ne!(leased.checkpoint_source().hash(), Ok(hash));
    assert_eq!(leased_r.hash_kv(0), r.hash_kv(0), "HashKV covers keys only");
    // So does a different TTL on the same lease.
    let mut other_ttl = ops.clone();
    other_ttl[0] = Op::LeaseGrant(LeaseGrantRequest { id: 7, ttl_s: 31 });
    assert_ne!(
        store_with(&other_ttl).0.checkpoint_source().hash(),
        Ok(hash)
    );

    // One old value differs.
    let mut old_value = ops.clone();
    old_value[60] = put("k04", b"different", 0);
    let (changed, _) = store_with(&old_value);
    assert_ne!(changed.checkpoint_source().hash(), Ok(hash));

    // A compaction that drops versions changes the hash; compacting again at a revision where it
    // drops nothing still changes the compact revision, and so the hash.
    let mut compacted = ops.clone();
    compacted.push(Op::Compact(CompactionRequest {
        revision: w.current_revision(),
        physical: false,
    }));
    let (mut compacted_w, _) = store_with(&compacted);
    let compacted_hash = compacted_w.checkpoint_source().hash().expect("hash");
    assert_ne!(compacted_hash, hash);
    while compacted_w.compact_step(5) == CompactionStatus::Pending {}
    assert_eq!(compacted_w.checkpoint_source().hash(), Ok(compacted_hash));
}

#[test]
fn store_hash_of_a_source_is_the_state_it_captured() {
    let ops = member_log();
    let (mut w, _) = store_with(&ops);
    let source = w.checkpoint_source();
    let expected = source.hash().expect("hash");
    // The writer moves on (writes, deletes, a lease) while another thread hashes the source.
    let hasher = std::thread::spawn(move || source.hash());
    keep_applying(&mut w);
    assert_eq!(hasher.join().expect("hasher thread"), Ok(expected));
    assert_ne!(w.checkpoint_source().hash(), Ok(expected));

    // A compaction newer than the captured one may trim what the scan reads: refuse, as
    // serialize does, and a fresh source hashes fine.
    let source = w.checkpoint_source();
    compact_at_current_revision(&mut w);
    assert_eq!(source.hash(), Err(KvError::Compacted));
    assert!(w.checkpoint_source().hash().is_ok());
}

/// The writer moves on after a capture: overwrites of 30 keys and a new lease.
fn keep_applying(w: &mut Writer) {
    let mut index = w.applied_index();
    for i in 0..200 {
        index += 1;
        w.apply(index, &put(&format!("k{:02}", i % 30), b"later", 0))
            .expect("put");
    }
    index += 1;
    w.apply(
        index,
        &Op::LeaseGrant(LeaseGrantRequest { id: 9, ttl_s: 5 }),
    )
    .expect("grant");
}

/// Applies a (logical) compaction at the current revision.
fn compact_at_current_revision(w: &mut Writer) {
    let revision = w.current_revision();
    w.apply(
        w.applied_index() + 1,
        &Op::Compact(CompactionRequest {
            revision,
            physical: false,
        }),
    )
    .expect("compact");
}

/// A full checkpoint's buffer is sized from the writer's counts, not from a walk of the
/// index: the bound holds for values held inline (in memory) and in durable segments, for
/// keys with many versions, leases, a tombstone and a compaction half done, and it is not
/// so loose that it reserves several times the archive.
#[test]
fn a_full_checkpoint_fits_the_bound_from_the_writers_counts() {
    let check = |w: &Writer, what: &str| {
        let source = w.checkpoint_source();
        let payload_bytes =
            source.serialize_parts().unwrap().to_vec().len() - CHECKPOINT_HEADER_BYTES;
        let bound = source.full_archive_bytes_max();
        assert!(
            payload_bytes <= bound,
            "{what}: {payload_bytes} archive bytes past the bound of {bound}"
        );
        assert!(
            bound <= 2 * payload_bytes + 4096,
            "{what}: a bound of {bound} for {payload_bytes} archive bytes"
        );
    };
    let (w, _) = populated();
    check(&w, "populated, in memory");
    // Long keys with many versions each, then most of their values in durable segments.
    let (mut w, _) = Store::with_value_log(ValueLogOptions {
        segment_bytes: 4096,
        first_segment_id: 0,
        on_disk: true,
    });
    let mut disk = std::collections::BTreeMap::new();
    let mut index = 0;
    for round in 0..6 {
        for k in 0..50 {
            index += 1;
            let key = format!("{}{k:04}", "a-long-key-prefix/".repeat(4));
            w.apply(index, &put(&key, &vec![round as u8; 700], 0))
                .unwrap();
        }
    }
    check(&w, "every value in memory");
    super::write_sealed(&mut w, &mut disk);
    check(&w, "values in durable segments");
    // 50 versions each of 200-byte keys: their bytes are held once, not once per version.
    let (mut w, _) = Store::new();
    let mut index = 0;
    for round in 0..50 {
        for k in 0..20 {
            index += 1;
            let key = format!("{k:0200}");
            w.apply(index, &put(&key, &[round as u8; 10], 0)).unwrap();
        }
    }
    check(&w, "long keys with many versions");
    // Half the keys deleted and compacted away: their bytes leave the count.
    for k in 0..10 {
        index += 1;
        w.apply(
            index,
            &Op::DeleteRange(DeleteRangeRequest {
                key: Bytes::from(format!("{k:0200}")),
                ..Default::default()
            }),
        )
        .unwrap();
    }
    let now = w.current_revision();
    super::compact(&mut w, index + 1, now);
    while w.compact_step(1000) == CompactionStatus::Pending {}
    check(&w, "after deletes compacted away");
    // A restored store counts what it restored.
    let (restored, _) = Store::restore(&w.checkpoint()).unwrap();
    check(&restored, "restored");
}
