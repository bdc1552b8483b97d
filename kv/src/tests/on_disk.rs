//! The value log on disk, with an in-memory "disk": sealed segments written as files, values
//! moved into the files' mappings, checkpoints that point into them and restores that map them.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{compact, write_sealed};
use crate::checkpoint::renumber_segments;
use crate::*;

fn put(key: &str, value: &[u8]) -> Op {
    Op::Put(PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value),
        ..Default::default()
    })
}

fn on_disk(first_segment_id: u32) -> ValueLogOptions {
    ValueLogOptions {
        segment_bytes: 512,
        first_segment_id,
        on_disk: true,
    }
}

/// Applies, as raft entry `index`, a compaction at the store's current revision.
fn compact_at_current(w: &mut Writer, index: u64) {
    let revision = w.current_revision();
    compact(w, index, revision);
}

/// Twenty keys overwritten five times (round r writes 100 bytes of r), every sealed segment
/// made durable: the store, its reader, its "disk" and the last applied index.
fn five_rounds_of_twenty_keys() -> (Writer, Reader, BTreeMap<u32, Bytes>, u64) {
    let (mut w, r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    let mut index = 0;
    for round in 0..5u8 {
        for k in 0..20 {
            index += 1;
            w.apply(index, &put(&format!("k{k:02}"), &[round; 100]))
                .unwrap();
        }
    }
    write_sealed(&mut w, &mut disk);
    (w, r, disk, index)
}

fn value_of(r: &Reader, key: &str) -> Option<Bytes> {
    let resp = r
        .range(&RangeRequest {
            key: Bytes::copy_from_slice(key.as_bytes()),
            ..Default::default()
        })
        .expect("reads");
    resp.kvs.first().map(|kv| kv.value.clone())
}

fn points_into(value: &Bytes, file: &Bytes) -> bool {
    let (v, f) = (value.as_ptr() as usize, file.as_ptr() as usize);
    v >= f && v + value.len() <= f + file.len()
}

/// Walks a segment file's records and checks each crc, as recovery tools would.
fn walk_records(file: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + RECORD_HEADER_BYTES <= file.len() {
        let crc = u32::from_le_bytes(file[at..at + 4].try_into().unwrap());
        let key_len = u32::from_le_bytes(file[at + 4..at + 8].try_into().unwrap()) as usize;
        let value_len = u32::from_le_bytes(file[at + 8..at + 12].try_into().unwrap()) as usize;
        if key_len == 0 {
            break; // Padding.
        }
        let end = at + record_bytes(key_len, value_len);
        assert_eq!(crc32fast::hash(&file[at + 4..end]), crc, "record at {at}");
        let key = file[at + RECORD_HEADER_BYTES..at + RECORD_HEADER_BYTES + key_len].to_vec();
        out.push((key, file[end - value_len..end].to_vec()));
        at = end;
    }
    out
}

#[test]
fn sealed_segments_become_files_and_values_move_into_them() {
    let (mut w, r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    for i in 0..60u32 {
        w.apply(
            u64::from(i) + 1,
            &put(&format!("k{:02}", i % 20), &[i as u8; 100]),
        )
        .expect("applies");
    }
    write_sealed(&mut w, &mut disk);
    assert!(
        disk.len() >= 10,
        "60 records of ~130 bytes fill many 512-byte segments"
    );
    // Every record in every file is intact and in write order.
    let mut written = 0;
    for file in disk.values() {
        written += walk_records(file).len();
    }
    assert!(written > 0 && written <= 60);
    // Values of sealed, durable segments are read from the files; the newest may still be in
    // the open segment, in memory.
    let mut from_files = 0;
    for i in 0..20 {
        let key = format!("k{i:02}");
        let value = value_of(&r, &key).expect("present");
        assert_eq!(value.len(), 100);
        if disk.values().any(|f| points_into(&value, f)) {
            from_files += 1;
        }
    }
    assert!(
        from_files >= 15,
        "only {from_files} of 20 values read from files"
    );
}

#[test]
fn a_checkpoint_points_into_durable_segments_and_restores_from_them() {
    let (mut w, r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    for i in 0..200u32 {
        w.apply(
            u64::from(i) + 1,
            &put(&format!("k{:03}", i % 150), &[i as u8; 1000]),
        )
        .expect("applies");
    }
    write_sealed(&mut w, &mut disk);
    let image = w.checkpoint();
    // The values in files are not copied into the image: it is far smaller than the values.
    assert!(
        image.len() < 200 * 1000 / 5,
        "image of {} bytes holds the values",
        image.len()
    );
    // An inline-only restore refuses it, naming the segment.
    assert!(matches!(
        Store::restore(&image),
        Err(KvError::SegmentUnusable { .. })
    ));
    let first_free = w.segment_ids().last().unwrap() + 1;
    let (w2, r2) = Store::restore_with_segments(&image, on_disk(first_free), &mut |id| {
        disk.get(&id).cloned().ok_or(format!("no file {id}"))
    })
    .expect("restores");
    let rev = w.current_revision();
    assert_eq!(w2.current_revision(), rev);
    assert_eq!(r2.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    for i in 0..150 {
        let key = format!("k{i:03}");
        assert_eq!(value_of(&r2, &key), value_of(&r, &key), "{key}");
    }
    // Restored values in files are slices of the files, not copies.
    let v = value_of(&r2, "k000").unwrap();
    assert!(disk.values().any(|f| points_into(&v, f)));
    // A missing or short file is refused with the segment named.
    let missing = *disk.keys().next().unwrap();
    match Store::restore_with_segments(&image, on_disk(first_free), &mut |id| {
        if id == missing {
            Err("gone".to_string())
        } else {
            Ok(disk[&id].clone())
        }
    }) {
        Err(KvError::SegmentUnusable { segment, why }) => {
            assert_eq!(segment, missing);
            assert_eq!(why, "gone");
        }
        other => panic!("expected SegmentUnusable, got {:?}", other.map(|_| ())),
    }
    match Store::restore_with_segments(&image, on_disk(first_free), &mut |id| {
        Ok(disk[&id].slice(..8))
    }) {
        Err(KvError::SegmentUnusable { why, .. }) => {
            assert!(why.contains("holds 8 bytes"), "{why}")
        }
        other => panic!("expected SegmentUnusable, got {:?}", other.map(|_| ())),
    }
    // New segments start above every listed one, whatever the caller asked.
    let (w3, _) = Store::restore_with_segments(&image, on_disk(0), &mut |id| Ok(disk[&id].clone()))
        .expect("restores");
    assert!(w3.segment_ids().last() > disk.keys().last());
    // The list a restart keeps, read without restoring.
    let listed = checkpoint_segments(&image).unwrap();
    assert_eq!(listed, disk.keys().copied().collect::<Vec<_>>());
    // Renumbered (a follower stores a leader's files under its own higher ids), the image names
    // the raised ids and restores from the same files under them, to the same store.
    let shift = 1000;
    let renumbered = renumber_segments(&image, shift).unwrap();
    assert_eq!(
        renumbered.len(),
        image.len(),
        "renumbering changes the header alone"
    );
    let raised: Vec<u32> = listed.iter().map(|id| id + shift).collect();
    assert_eq!(checkpoint_segments(&renumbered).unwrap(), raised);
    let (w4, r4) = Store::restore_with_segments(&renumbered, on_disk(0), &mut |id| {
        id.checked_sub(shift)
            .and_then(|own| disk.get(&own).cloned())
            .ok_or(format!("no file {id}"))
    })
    .expect("restores from the files under their new ids");
    assert_eq!(r4.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    for i in 0..150 {
        let key = format!("k{i:03}");
        assert_eq!(value_of(&r4, &key), value_of(&r, &key), "{key}");
    }
    // Its own segments start above the raised ones, and its next checkpoint names them as is.
    assert!(w4.segment_ids().last().unwrap() > raised.last().unwrap());
    let again = w4.checkpoint();
    assert_eq!(checkpoint_segments(&again).unwrap(), raised);
    // No shift, or no segment, leaves an image as it is; a shift past the id space is refused.
    assert_eq!(renumber_segments(&image, 0).unwrap(), image);
    assert!(matches!(
        renumber_segments(&image, u32::MAX - 2),
        Err(KvError::CheckpointDamaged(_))
    ));
    let mut damaged = image.clone();
    *damaged.last_mut().unwrap() ^= 1;
    assert!(renumber_segments(&damaged, shift).is_err());
}

#[test]
fn reclaimed_segments_are_reported_dead_and_later_checkpoints_do_not_need_them() {
    let (mut w, r, mut disk, mut index) = five_rounds_of_twenty_keys();
    index += 1;
    compact_at_current(&mut w, index);
    while w.compact_step(16) == CompactionStatus::Pending {}
    write_sealed(&mut w, &mut disk);
    let dead = w.take_dead_segments();
    assert!(!dead.is_empty(), "old rounds' segments were reclaimed");
    assert!(dead.iter().all(|d| d.died_at_index == index));
    let image = w.checkpoint();
    for d in &dead {
        disk.remove(&d.id);
    }
    let first_free = w.segment_ids().last().unwrap() + 1;
    let (_w2, r2) = Store::restore_with_segments(&image, on_disk(first_free), &mut |id| {
        disk.get(&id)
            .cloned()
            .ok_or(format!("segment {id} was deleted"))
    })
    .expect("a checkpoint after the reclaim needs no dead segment");
    for k in 0..20 {
        let key = format!("k{k:02}");
        assert_eq!(value_of(&r2, &key), Some(Bytes::from(vec![4u8; 100])));
        assert_eq!(value_of(&r, &key), value_of(&r2, &key));
    }
}

/// A compaction step that reclaims a durable segment names its mapped file first
/// (`reclaim_file`), so the raft core's driver can have it brought in; one that walks only the
/// index names none.
#[test]
fn a_reclaim_names_the_segment_file_it_reads() {
    let (mut w, _r, disk, mut index) = five_rounds_of_twenty_keys();
    assert_eq!(w.reclaim_file(), None, "nothing to compact");
    index += 1;
    compact_at_current(&mut w, index);
    assert_eq!(w.reclaim_file(), None, "the index walk comes first");
    let mut named = Vec::new();
    loop {
        if let Some(file) = w.reclaim_file() {
            let id = disk
                .iter()
                .find(|(_, f)| f.as_ptr() == file.as_ptr())
                .map(|(id, _)| *id)
                .expect("a durable segment's own file");
            if named.last() != Some(&id) {
                named.push(id);
            }
        }
        if w.compact_step(16) == CompactionStatus::Idle {
            break;
        }
    }
    let dead: Vec<u32> = w.take_dead_segments().iter().map(|d| d.id).collect();
    assert!(!named.is_empty());
    assert!(
        named.iter().all(|id| dead.contains(id)),
        "named {named:?}, reclaimed {dead:?}"
    );
    assert_eq!(w.reclaim_file(), None, "done");
}

#[test]
fn a_restored_store_still_knows_its_segments_dead_bytes_and_reclaims_them() {
    let (w, _r, disk, mut index) = five_rounds_of_twenty_keys();
    // Older rounds are still history (no compaction yet), so nothing is dead yet; after the
    // compaction below in the restored store, they are.
    let image = w.checkpoint();
    let first_free = w.segment_ids().last().unwrap() + 1;
    let (mut w2, r2) = Store::restore_with_segments(&image, on_disk(first_free), &mut |id| {
        disk.get(&id).cloned().ok_or(format!("no file {id}"))
    })
    .unwrap();
    // The open segment's values were inline and are appended again, so compare what the
    // durable segments hold.
    assert!(w2.value_log_bytes() >= w.value_log_bytes() - 512);
    index += 1;
    compact_at_current(&mut w2, index);
    while w2.compact_step(16) == CompactionStatus::Pending {}
    assert!(
        !w2.take_dead_segments().is_empty(),
        "the restored store reclaimed none of the old rounds' segments"
    );
    assert!(w2.value_log_bytes() < w.value_log_bytes() / 2);
    for k in 0..20 {
        assert_eq!(
            value_of(&r2, &format!("k{k:02}")),
            Some(Bytes::from(vec![4u8; 100]))
        );
    }
}

/// Reclaim of a durable segment finds its values by walking its file (nothing keeps a
/// back-reference per version). A dead record that fails its crc hides where the next record
/// starts: reclaim then walks the index instead, and every live value still moves.
#[test]
fn reclaim_walks_a_segment_file_and_a_damaged_dead_record_strands_no_live_value() {
    for damage_at in [
        RECORD_HEADER_BYTES + 3, // the dead value's first byte: its crc fails
        4,                       // its key length: where the next record starts is lost
    ] {
        let (mut w, r) = Store::with_value_log(on_disk(0));
        for i in 0..20u32 {
            w.apply(u64::from(i) + 1, &put(&format!("k{i:02}"), &[i as u8; 100]))
                .unwrap();
        }
        // k00's first value (the first record of the first segment) dies; k01 and k02 beside
        // it stay live, so only defragment rewrites that segment.
        w.apply(21, &put("k00", &[99; 100])).unwrap();
        compact_at_current(&mut w, 22);
        while w.compact_step(16) == CompactionStatus::Pending {}
        let mut sealed = w.take_sealed_segments();
        let first = sealed.remove(0);
        let mut file: Vec<u8> = first.records.to_vec();
        file[damage_at] ^= 0x04;
        file.resize(file.len().next_multiple_of(4096), 0);
        w.segment_durable(first.id, first.bytes, Bytes::from(file));
        for s in sealed {
            w.segment_durable(s.id, s.bytes, Bytes::from(s.records.to_vec()));
        }
        w.defragment();
        while w.compact_step(2) == CompactionStatus::Pending {}
        assert!(
            !w.segment_ids().contains(&first.id),
            "the damaged segment was rewritten and removed (damage at {damage_at})"
        );
        assert!(w.take_dead_segments().iter().any(|d| d.id == first.id));
        // The damaged record is reported, with where it is: the first of its segment.
        assert_eq!(
            w.unreadable_records(),
            (
                1,
                Some(UnreadableRecord {
                    segment: first.id,
                    offset: 0
                })
            ),
            "damage at {damage_at}"
        );
        assert_eq!(value_of(&r, "k00"), Some(Bytes::from(vec![99u8; 100])));
        for i in 1..20u32 {
            assert_eq!(
                value_of(&r, &format!("k{i:02}")),
                Some(Bytes::from(vec![i as u8; 100])),
                "k{i:02} after damage at {damage_at}"
            );
        }
        assert_eq!(w.value_log_bytes_live(), 20 * 100);
    }
}

#[test]
fn a_bit_flip_in_a_segment_file_is_never_served() {
    // The "disk" returns the first segment with one bit of its first value flipped.
    let (_w, r, segment) = store_with_damaged_values(1);
    // Every other value reads as written.
    assert_eq!(value_of(&r, "k01"), Some(Bytes::from(vec![1u8; 100])));
    // The damaged one stops the reader (the server aborts on a panic) and names the file and
    // the record's offset.
    let message = panic_message(|| {
        value_of(&r, "k00");
    });
    assert!(
        message.contains(&format!("{segment:08x}.seg"))
            && message.contains("record at offset 0 fails its crc check"),
        "{message}"
    );
}

/// A read unchecked hands out nothing until `check`: it names the records in durable segment
/// files (whose pages may be on disk) and not those in memory, a keys-only read names none,
/// and `check` still refuses a damaged record, however the answer was read.
#[test]
fn a_read_unchecked_names_its_records_on_disk_and_check_still_refuses_damage() {
    let (mut w, r, segment) = store_with_damaged_values(1);
    // Two more keys, in the open segment (memory).
    w.apply(100, &put("m0", &[7; 10])).unwrap();
    w.apply(101, &put("m1", &[8; 10])).unwrap();
    let range = |key: &str, end: &str, keys_only: bool| RangeRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        range_end: Bytes::copy_from_slice(end.as_bytes()),
        keys_only,
        ..Default::default()
    };
    let on_disk = r.range_unchecked(&range("k01", "k05", false)).unwrap();
    assert_eq!(on_disk.records_on_disk().count(), 4);
    for record in on_disk.records_on_disk() {
        let parsed = crate::vlog::record_at(record, 0).expect("a whole record");
        assert_eq!(parsed.record_bytes, record.len());
    }
    let answer = on_disk.check();
    assert_eq!(answer.kvs.len(), 4);
    assert_eq!(answer.kvs[0].value, Bytes::from(vec![1u8; 100]));

    // A sort and a limit, and a filter: only the records answered are to be checked.
    let sorted = RangeRequest {
        sort_order: SortOrder::Descend,
        sort_target: SortTarget::Mod,
        limit: 2,
        ..range("k01", "k09", false)
    };
    let sorted = r.range_unchecked(&sorted).unwrap();
    assert_eq!(sorted.records_on_disk().count(), 2);
    let answer = sorted.check();
    assert_eq!(answer.kvs.len(), 2);
    assert_eq!(answer.kvs[0].key, Bytes::from_static(b"k08"));
    let newest_mod = answer.kvs[0].mod_revision;
    let filtered = RangeRequest {
        min_mod_revision: newest_mod - 1,
        ..range("k01", "k09", false)
    };
    let filtered = r.range_unchecked(&filtered).unwrap();
    assert_eq!(filtered.records_on_disk().count(), 2);
    assert_eq!(filtered.check().kvs.len(), 2);

    let in_memory = r.range_unchecked(&range("m", "n", false)).unwrap();
    assert_eq!(in_memory.records_on_disk().count(), 0);
    assert_eq!(in_memory.check().kvs.len(), 2);

    let keys_only = r.range_unchecked(&range("k", "l", true)).unwrap();
    assert_eq!(
        keys_only.records_on_disk().count(),
        0,
        "keys-only reads no value"
    );
    let answer = keys_only.check();
    assert_eq!(answer.kvs.len(), 20);
    assert!(answer.kvs.iter().all(|kv| kv.value.is_empty()));

    // k00's record is damaged: reading it unchecked is harmless, checking it stops the reader.
    let damaged = r.range_unchecked(&range("k00", "", false)).unwrap();
    assert_eq!(damaged.records_on_disk().count(), 1);
    let message = panic_message(|| {
        damaged.check();
    });
    assert!(message.contains(&format!("{segment:08x}.seg")), "{message}");
}

/// A range that sorts by value compares values before any check: its records on disk are
/// named for a shard to bring in first (a range alone is listed as a txn of it); any other
/// range names none.
#[test]
fn a_sort_by_value_names_the_values_it_compares() {
    let (_w, r, _disk, _index) = five_rounds_of_twenty_keys();
    let range = |sort_target: SortTarget, count_only: bool| RangeRequest {
        key: Bytes::from_static(b"k00"),
        range_end: Bytes::from_static(b"k05"),
        sort_target,
        count_only,
        ..Default::default()
    };
    // A range alone is listed as a txn of that range (core's `range_checked`).
    let listed = |req: RangeRequest| {
        r.records_txn_reads(&TxnRequest {
            success: vec![RequestOp::Range(req)],
            ..Default::default()
        })
    };
    assert_eq!(listed(range(SortTarget::Value, false)).len(), 5);
    assert!(listed(range(SortTarget::Key, false)).is_empty());
    assert!(listed(range(SortTarget::Mod, false)).is_empty());
    assert!(listed(range(SortTarget::Value, true)).is_empty());
}

/// A history read for a watcher that asks for prev_kv names the previous states' records
/// on disk beside the events' own, so a shard can have all of them brought in before it
/// hands the events out; one for a watcher that does not names only the events' values.
#[test]
fn history_for_prev_kv_names_the_previous_values_on_disk() {
    let (_w, r, _disk, _index) = five_rounds_of_twenty_keys();
    // k00's five puts: the first has no previous state, the other four have one each.
    let plain = r
        .range_events_unchecked(1, b"k00", b"", 100, false)
        .unwrap();
    assert_eq!(plain.records_on_disk().count(), 5);
    let with_prev = r.range_events_unchecked(1, b"k00", b"", 100, true).unwrap();
    assert_eq!(with_prev.records_on_disk().count(), 9);
    let batch = with_prev.check();
    assert_eq!(batch.events.len(), 5);
    assert!(
        batch.reached_read_rev(),
        "a whole read reaches its revision"
    );
    for (round, e) in batch.events.iter().enumerate().skip(1) {
        let prev = e.prev_kv.clone().expect("a previous state").checked();
        assert_eq!(prev.value, Bytes::from(vec![round as u8 - 1; 100]));
    }
    // A batch cut short names only the records of the events it keeps.
    let cut = r.range_events_unchecked(1, b"k00", b"", 2, true).unwrap();
    assert_eq!(cut.records_on_disk().count(), 3);
    let cut = cut.check();
    assert!(
        !cut.reached_read_rev(),
        "a batch cut at {} stops short of the revision it read, {}",
        cut.next_rev,
        cut.read_rev
    );
}

/// Twenty keys k00..k19 of 100 bytes each, their segments made durable, with one bit
/// flipped in each of the first `damaged` values on "disk" (the first records of the first
/// segment); the damaged segment's id.
fn store_with_damaged_values(damaged: usize) -> (Writer, Reader, u32) {
    let (mut w, r) = Store::with_value_log(on_disk(0));
    for i in 0..20u32 {
        w.apply(u64::from(i) + 1, &put(&format!("k{i:02}"), &[i as u8; 100]))
            .unwrap();
    }
    let mut sealed = w.take_sealed_segments();
    assert!(!sealed.is_empty());
    let first = sealed.remove(0);
    let mut file: Vec<u8> = first.records.to_vec();
    let key_len = 3;
    let record = crate::vlog::record_bytes(key_len, 100);
    assert!(first.records.len() >= damaged * record);
    for at in (0..damaged).map(|n| n * record) {
        file[at + RECORD_HEADER_BYTES + key_len] ^= 0x04;
    }
    file.resize(file.len().next_multiple_of(4096), 0);
    w.segment_durable(first.id, first.bytes, Bytes::from(file));
    for s in sealed {
        w.segment_durable(s.id, s.bytes, Bytes::from(s.records.to_vec()));
    }
    (w, r, first.id)
}

fn panic_message(run: impl FnOnce()) -> String {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
    let message = outcome.expect_err("a damaged value was handed out");
    message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default()
}

/// Writes over a key read only its metadata on the raft core: its previous value (perhaps in
/// a segment file not in the page cache) is read, and checked, only by whoever hands it out.
#[test]
fn writes_over_a_key_read_its_previous_value_only_for_whoever_hands_it_out() {
    let (mut w, r, segment) = store_with_damaged_values(2);
    let names_it =
        |m: &str| m.contains(&format!("{segment:08x}.seg")) && m.contains("fails its crc check");
    // A plain put and a plain delete over damaged values apply: they never read them.
    let applied = w.apply(100, &put("k00", b"new")).expect("applies");
    let put_rev = applied.events[0].kv.mod_revision;
    let prev = applied.events[0].prev_kv.clone().expect("k00 existed");
    assert_eq!((prev.key().as_ref(), prev.version()), (&b"k00"[..], 1));
    let applied = w
        .apply(
            101,
            &Op::DeleteRange(DeleteRangeRequest {
                key: Bytes::from_static(b"k01"),
                ..Default::default()
            }),
        )
        .expect("applies");
    let deleted_prev = applied.events[0].prev_kv.clone().expect("k01 existed");
    assert_eq!(value_of(&r, "k00"), Some(Bytes::from_static(b"new")));
    assert_eq!(value_of(&r, "k01"), None);
    // A watcher asking for prev_kv checks the value before it goes out, and is stopped.
    let message = panic_message(|| {
        prev.checked();
    });
    assert!(names_it(&message), "{message}");
    let message = panic_message(|| {
        deleted_prev.checked();
    });
    assert!(names_it(&message), "{message}");
    // Catch-up from history hands out the same unread previous states.
    let batch = r
        .range_events(put_rev, b"k00", b"k02", 100)
        .expect("uncompacted");
    assert_eq!(batch.events.len(), 2);
    assert!(batch.events.iter().all(|e| e.prev_kv.is_some()));
    // A request that asks for the previous value gets it unread in its answer: the raft core
    // applies without reading it, and whoever serves the answer checks it, and is stopped.
    let (mut w, _r, _) = store_with_damaged_values(2);
    let applied = w
        .apply(
            100,
            &Op::Put(PutRequest {
                key: Bytes::from_static(b"k00"),
                value: Bytes::from_static(b"new"),
                prev_kv: true,
                ..Default::default()
            }),
        )
        .expect("applies without reading the previous value");
    assert_eq!(applied.response.records_on_disk().count(), 1);
    let message = panic_message(|| {
        applied.response.check();
    });
    assert!(names_it(&message), "{message}");
    let applied = w
        .apply(
            101,
            &Op::DeleteRange(DeleteRangeRequest {
                key: Bytes::from_static(b"k00"),
                range_end: Bytes::from_static(b"k02"),
                prev_kv: true,
            }),
        )
        .expect("applies without reading the previous values");
    // k00's previous value is now "new", in memory and checked as it was read; k01's is on disk.
    assert_eq!(applied.response.records_on_disk().count(), 1);
    let message = panic_message(|| {
        applied.response.check();
    });
    assert!(names_it(&message), "{message}");
}

fn txn(compare: Vec<Compare>, success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
    TxnRequest {
        compare,
        success,
        failure,
    }
}

fn get(key: &str) -> RequestOp {
    RequestOp::Range(RangeRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        ..Default::default()
    })
}

fn compare(key: &str, target: CompareTarget) -> Compare {
    Compare {
        key: Bytes::copy_from_slice(key.as_bytes()),
        range_end: Bytes::new(),
        target,
        result: CompareResult::Equal,
    }
}

/// A txn's ranges are answered unread, as a range is: the raft core applies a txn that writes
/// and reads without waiting for the values it reads; a compare of revisions reads no value
/// at all; what a compare of values and an `ignore_value` put read on the raft core is named
/// beforehand, for a shard to bring in.
#[test]
fn a_txn_reads_its_values_where_it_is_served() {
    let (mut w, r, segment) = store_with_damaged_values(1);
    let names_it =
        |m: &str| m.contains(&format!("{segment:08x}.seg")) && m.contains("fails its crc check");
    let k00_mod_revision = r
        .range(&RangeRequest {
            key: Bytes::from_static(b"k00"),
            keys_only: true,
            ..Default::default()
        })
        .unwrap()
        .kvs[0]
        .mod_revision;
    // The kube-apiserver's update: compare k00's mod revision, put, else get it.
    let update = |mod_revision: i64| {
        Op::Txn(txn(
            vec![compare("k00", CompareTarget::Mod(mod_revision))],
            vec![RequestOp::Put(PutRequest {
                key: Bytes::from_static(b"k05"),
                value: Bytes::from_static(b"x"),
                ..Default::default()
            })],
            vec![get("k00"), get("k01")],
        ))
    };
    // Failed: the else branch's gets of damaged k00 and intact k01 apply unread.
    let applied = w
        .apply(100, &update(k00_mod_revision + 1))
        .expect("applies unread");
    assert_eq!(applied.response.records_on_disk().count(), 2);
    let message = panic_message(|| {
        applied.response.check();
    });
    assert!(names_it(&message), "{message}");
    // Succeeded: the compare read k00's metadata only, never its damaged value.
    let applied = w
        .apply(101, &update(k00_mod_revision))
        .expect("compares no value");
    let OpResponse::Txn(t) = applied.response.check() else {
        panic!("a txn answers a txn")
    };
    assert!(t.succeeded);

    // What applying reads on the raft core: the values compared, in any branch, and the
    // value an ignore_value put keeps.
    let by_value = txn(
        vec![compare(
            "k00",
            CompareTarget::Value(Bytes::from_static(b"?")),
        )],
        vec![RequestOp::Txn(txn(
            vec![compare("k02", CompareTarget::Value(Bytes::new()))],
            vec![],
            vec![],
        ))],
        vec![RequestOp::Put(PutRequest {
            key: Bytes::from_static(b"k03"),
            ignore_value: true,
            ..Default::default()
        })],
    );
    assert_eq!(r.records_txn_reads(&by_value).len(), 3);
    // The raft core's look visits at most the keys it is given, and says when it stopped
    // short: here after the first compare's key, then the second's.
    let within = |req: &TxnRequest, keys_max| {
        let (records, whole) = r.records_txn_reads_within(req, keys_max);
        (records.len(), whole)
    };
    assert_eq!(within(&by_value, 1), (1, false));
    assert_eq!(within(&by_value, 2), (2, false));
    assert_eq!(within(&by_value, 3), (3, true));
    let every = txn(
        vec![Compare {
            range_end: Bytes::from_static(b"l"),
            ..compare("k", CompareTarget::Value(Bytes::new()))
        }],
        vec![],
        vec![],
    );
    let all = r.records_txn_reads(&every);
    assert!(all.len() > 3, "{} values compared", all.len());
    assert_eq!(within(&every, 3), (3, false));
    assert_eq!(within(&every, usize::MAX), (all.len(), true));
    // What the pager lists for the rest is the whole list, in chunks of at most the size it
    // asks for, in the same order.
    assert_eq!(r.txn_reads_of(every.clone()).records(), all);
    for chunk_max in [1, 2, all.len() - 1, all.len(), all.len() + 1] {
        let mut chunks: Vec<Vec<Bytes>> = Vec::new();
        r.txn_reads_of(every.clone())
            .for_each_chunk(chunk_max, |chunk| chunks.push(chunk.to_vec()));
        assert!(
            chunks.iter().all(|c| !c.is_empty() && c.len() <= chunk_max),
            "chunks of at most {chunk_max}: {:?}",
            chunks.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert_eq!(chunks.concat(), all, "chunks of {chunk_max}");
    }
    let Op::Txn(update) = update(k00_mod_revision) else {
        unreachable!("built as a txn")
    };
    assert_eq!(r.records_txn_reads(&update).len(), 0);
    let keep_value = |ignore_value| PutRequest {
        key: Bytes::from_static(b"k00"),
        ignore_value,
        ..Default::default()
    };
    assert_eq!(r.records_put_reads(&keep_value(false)).len(), 0);
    assert_eq!(r.records_put_reads(&keep_value(true)).len(), 1);

    // A read-only txn is answered by a reader at one revision, its values unread too.
    let read_only = txn(
        vec![compare("k00", CompareTarget::Version(1))],
        vec![get("k00")],
        vec![get("k01"), get("k02")],
    );
    assert!(txn_is_read_only(&read_only) && !txn_is_serializable(&read_only));
    let answer = r.txn_read_only_unchecked(&read_only).expect("reads");
    assert_eq!(answer.records_on_disk().count(), 1, "k00 is at version 1");
    let message = panic_message(|| {
        answer.check();
    });
    assert!(names_it(&message), "{message}");
    w.apply(102, &put("k00", b"fixed")).unwrap();
    let t = r.txn_read_only_unchecked(&read_only).unwrap().check();
    assert!(!t.succeeded);
    assert_eq!(t.revision, r.current_revision());
    let values: Vec<_> = t
        .responses
        .iter()
        .map(|op| match op {
            ResponseOp::Range(range) => range.kvs[0].value.clone(),
            _ => panic!("a read-only txn answers ranges"),
        })
        .collect();
    assert_eq!(
        values,
        vec![Bytes::from(vec![1u8; 100]), Bytes::from(vec![2u8; 100])]
    );
}

/// A restore that builds parts of the index on helper threads ends with the same store as one
/// built on the caller's thread alone: every value, lease, revision and byte count.
#[test]
fn a_restore_in_parts_equals_one_on_one_thread() {
    let (mut w, r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    let mut index = 0;
    index += 1;
    w.apply(
        index,
        &Op::LeaseGrant(LeaseGrantRequest { id: 7, ttl_s: 60 }),
    )
    .unwrap();
    for round in 0..3u8 {
        for k in 0..300u32 {
            index += 1;
            let op = if round == 2 && k % 5 == 0 {
                Op::DeleteRange(DeleteRangeRequest {
                    key: Bytes::from(format!("k{k:04}")),
                    ..Default::default()
                })
            } else {
                Op::Put(PutRequest {
                    key: Bytes::from(format!("k{k:04}")),
                    value: Bytes::from(vec![round.wrapping_add(k as u8); 40 + k as usize % 60]),
                    lease: if k % 7 == 0 { 7 } else { 0 },
                    ..Default::default()
                })
            };
            w.apply(index, &op).unwrap();
        }
        // The last round's values stay in memory: the image holds them inline, and the
        // restore appends them to its own value log.
        if round < 2 {
            write_sealed(&mut w, &mut disk);
        }
    }
    let image = w.checkpoint();
    let first_free = w.segment_ids().last().unwrap() + 1;
    let files = |id: u32| disk.get(&id).cloned().ok_or(format!("no file {id}"));
    let (alone, alone_r) =
        Store::restore_with_segments(&image, on_disk(first_free), &mut |id| files(id)).unwrap();
    let started = &std::sync::atomic::AtomicUsize::new(0);
    let on_start = || {
        started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let helpers = RestoreHelpers {
        threads: 3,
        on_start: &on_start,
    };
    let (parts, parts_r) =
        Store::restore_with_helpers(&image, on_disk(first_free), &mut |id| files(id), helpers)
            .unwrap();
    assert_eq!(
        started.load(std::sync::atomic::Ordering::Relaxed),
        3,
        "three helpers built parts"
    );
    let rev = w.current_revision();
    assert_eq!(parts.current_revision(), rev);
    assert_eq!(parts.applied_index(), alone.applied_index());
    assert_eq!(parts_r.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    assert_eq!(parts_r.hash_kv(rev).unwrap(), alone_r.hash_kv(rev).unwrap());
    assert_eq!(parts.value_log_bytes_live(), alone.value_log_bytes_live());
    assert_eq!(parts.size_bytes_in_use(), alone.size_bytes_in_use());
    assert_eq!(parts.size_bytes(), alone.size_bytes());
    assert_eq!(
        parts.lease(7).map(|l| l.keys.len()),
        alone.lease(7).map(|l| l.keys.len())
    );
    assert!(parts.lease(7).unwrap().keys.len() > 30);
    // Live keys are counted as the parts are built: what a count of the range says (the
    // deleted fifth left out), however the keys were split.
    let live = r
        .range(&RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            count_only: true,
            ..Default::default()
        })
        .unwrap()
        .count;
    assert_eq!(live, 240);
    assert_eq!(alone.live_keys_restored(), live as u64);
    assert_eq!(parts.live_keys_restored(), live as u64);
    assert_eq!(
        w.live_keys_restored(),
        0,
        "a store never restored counts none"
    );
    for k in 0..300u32 {
        let key = format!("k{k:04}");
        assert_eq!(value_of(&parts_r, &key), value_of(&r, &key), "{key}");
    }
}

/// A read of a value in a durable segment marks the segment, for the value cache's clock; the
/// mark is taken once, and a read of a value still in memory marks nothing.
#[test]
fn reads_mark_the_durable_segments_they_read() {
    let (mut w, r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    for i in 0..20u32 {
        w.apply(u64::from(i) + 1, &put(&format!("k{i:02}"), &[i as u8; 100]))
            .unwrap();
    }
    write_sealed(&mut w, &mut disk);
    let mapped = r.mapped_segments();
    assert_eq!(
        mapped.iter().map(|m| m.id).collect::<Vec<_>>(),
        disk.keys().copied().collect::<Vec<_>>()
    );
    assert!(mapped.iter().all(|m| !m.take_read()), "unread so far");
    assert_eq!(value_of(&r, "k00"), Some(Bytes::from(vec![0u8; 100])));
    let read: Vec<bool> = mapped.iter().map(|m| m.take_read()).collect();
    assert_eq!(read.iter().filter(|r| **r).count(), 1, "{read:?}");
    assert!(read[0], "k00 is in the first segment");
    assert!(mapped.iter().all(|m| !m.take_read()), "taken once");
    // A txn's compare of values reads them too (on the raft core), and marks their segments:
    // here every key's, so every segment. A compare of revisions reads no value.
    let every = |target| {
        Op::Txn(txn(
            vec![Compare {
                range_end: Bytes::from_static(b"l"),
                result: CompareResult::NotEqual,
                ..compare("k", target)
            }],
            vec![],
            vec![],
        ))
    };
    w.apply(21, &every(CompareTarget::Mod(0))).unwrap();
    assert!(mapped.iter().all(|m| !m.take_read()), "no value compared");
    w.apply(22, &every(CompareTarget::Value(Bytes::new())))
        .unwrap();
    assert!(
        mapped.iter().all(|m| m.take_read()),
        "every segment's values compared"
    );
}
