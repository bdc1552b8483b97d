//! A writer applying txns while reader threads range at published revisions: no reader ever sees
//! half a txn.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::{compact, write_sealed};
use crate::*;

const KEYS_PER_TXN: usize = 8;

#[test]
fn readers_never_see_a_torn_txn() {
    let (mut writer, reader) = Store::with_segment_bytes(8192);
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let reader = reader.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let mut checks = 0u64;
                while !done.load(Ordering::Acquire) || checks == 0 {
                    let rev = reader.current_revision();
                    let all = RangeRequest {
                        key: Bytes::from_static(b"\0"),
                        range_end: Bytes::from_static(b"\0"),
                        // Alternate between the latest and a recent older revision.
                        revision: if checks.is_multiple_of(2) {
                            0
                        } else {
                            (rev - 3).max(1)
                        },
                        ..Default::default()
                    };
                    let resp = match reader.range(&all) {
                        Ok(resp) => resp,
                        Err(KvError::Compacted) => continue,
                        Err(e) => panic!("unexpected {e}"),
                    };
                    assert!(
                        resp.revision >= rev,
                        "the published revision never goes back"
                    );
                    // Every txn writes all keys with the same value: a torn txn shows two values.
                    if let Some(first) = resp.kvs.first() {
                        assert_eq!(resp.kvs.len(), KEYS_PER_TXN, "all keys or none");
                        for kv in &resp.kvs {
                            assert_eq!(
                                kv.value, first.value,
                                "torn txn at revision {}",
                                resp.revision
                            );
                            assert_eq!(kv.mod_revision, first.mod_revision);
                        }
                    }
                    checks += 1;
                }
                checks
            })
        })
        .collect();
    for round in 0..3000u32 {
        let value = Bytes::from(round.to_le_bytes().repeat(16));
        let success = (0..KEYS_PER_TXN)
            .map(|k| {
                RequestOp::Put(PutRequest {
                    key: Bytes::from(format!("key{k}")),
                    value: value.clone(),
                    ..Default::default()
                })
            })
            .collect();
        let txn = TxnRequest {
            compare: vec![],
            success,
            failure: vec![],
        };
        writer
            .apply(u64::from(round) * 2 + 1, &Op::Txn(txn))
            .expect("txn");
        if round % 100 == 99 {
            let revision = writer.current_revision() - 10;
            writer
                .apply(
                    u64::from(round) * 2 + 2,
                    &Op::Compact(CompactionRequest {
                        revision,
                        physical: false,
                    }),
                )
                .expect("compact");
        } else {
            writer.apply_empty(u64::from(round) * 2 + 2);
        }
        writer.compact_step(2);
    }
    done.store(true, Ordering::Release);
    for r in readers {
        let checks = r.join().expect("reader thread");
        assert!(checks > 0);
    }
}

/// A checkpoint serialized on another thread while the writer goes on putting, compacting and
/// reclaiming (which moves live values into segments opened after the serialize began): it
/// is either a whole image that restores at its revision, or refused as raced by a compaction.
#[test]
fn a_checkpoint_serialized_beside_reclaim_is_whole() {
    let (mut w, _r) = Store::with_segment_bytes(512);
    let mut index = 0u64;
    let put = |k: u64, round: u64| {
        Op::Put(PutRequest {
            key: Bytes::from(format!("key{k:03}")),
            value: Bytes::from(vec![(round % 251) as u8; 60]),
            ..Default::default()
        })
    };
    for k in 0..200 {
        index += 1;
        w.apply(index, &put(k, 0)).unwrap();
    }
    let (mut whole, mut raced) = (0, 0);
    for round in 1..=300u64 {
        let source = w.checkpoint_source();
        let revision = source.revision();
        let serializer = std::thread::spawn(move || source.serialize_parts());
        // Overwrites make old values dead; a compaction now and then lets reclaim move the
        // live ones of mostly dead segments into new ones.
        for k in 0..40 {
            index += 1;
            w.apply(index, &put((round * 7 + k) % 200, round)).unwrap();
            w.compact_step(4);
        }
        if round % 3 == 0 {
            index += 1;
            let revision = w.current_revision() - 20;
            w.apply(
                index,
                &Op::Compact(CompactionRequest {
                    revision,
                    physical: false,
                }),
            )
            .unwrap();
        }
        match serializer.join().expect("the serializer does not panic") {
            Ok(parts) => {
                let (restored, _) = Store::restore(&parts.to_vec()).expect("a whole image");
                assert_eq!(restored.current_revision(), revision);
                whole += 1;
            }
            Err(KvError::Compacted) => raced += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(whole > 0, "every checkpoint raced a compaction ({raced})");
}

/// Values on disk in segments of 64 KiB, for the checkpoint-beside-reclaim tests.
fn options(first_segment_id: u32) -> ValueLogOptions {
    ValueLogOptions {
        segment_bytes: 65536,
        first_segment_id,
        on_disk: true,
    }
}

/// Key `k`'s value of round `round`: 2,000 bytes of it.
fn put(k: u64, round: u8) -> Op {
    Op::Put(PutRequest {
        key: Bytes::from(format!("key{k:05}")),
        value: Bytes::from(vec![round; 2000]),
        ..Default::default()
    })
}

/// Round 0 over `keys` keys, then round 1 over all but those with `k % 10 == kept`, each
/// round made durable, then a compaction at the end: a tenth of round 0 stays live, spread
/// over segments the compaction leaves mostly dead. Returns the compacted revision.
fn two_rounds_compacted(
    w: &mut Writer,
    disk: &mut std::collections::BTreeMap<u32, Bytes>,
    index: &mut u64,
    keys: u64,
    kept: u64,
) -> i64 {
    for round in 0..2u8 {
        for k in (0..keys).filter(|k| round == 0 || k % 10 != kept) {
            *index += 1;
            w.apply(*index, &put(k, round)).unwrap();
        }
        write_sealed(w, disk);
    }
    *index += 1;
    let revision = w.current_revision();
    compact(w, *index, revision);
    revision
}

/// A checkpoint captured before reclaim moves the live values of mostly dead segments, and
/// archived once the segments they went to are durable, points into those segments rather
/// than holding the values inline: it is no larger than a checkpoint captured afterwards,
/// and it restores whole. At 4M keys, after deleting half, the inline copies made a full
/// checkpoint of 1.13 GB that took 32 s to archive.
#[test]
fn a_checkpoint_points_into_segments_durable_since_its_capture() {
    const KEYS: u64 = 3000;
    let (mut w, _r) = Store::with_value_log(options(0));
    let mut disk = std::collections::BTreeMap::new();
    let mut index = 0;
    // A tenth of round 0 (600 KB) stays live, spread over segments that compaction leaves
    // mostly dead.
    let revision = two_rounds_compacted(&mut w, &mut disk, &mut index, KEYS, 0);
    let before = w.checkpoint_source();
    // Every segment there is now; the newest is the open one, not durable.
    let mut at_capture = w.segment_ids();
    at_capture.pop();
    while w.compact_step(64) == CompactionStatus::Pending {
        write_sealed(&mut w, &mut disk);
    }
    write_sealed(&mut w, &mut disk);
    let after = w.checkpoint_source();
    let image = before
        .serialize_parts()
        .expect("no compaction meanwhile")
        .to_vec();
    let baseline = after
        .serialize_parts()
        .expect("no compaction meanwhile")
        .to_vec();
    // The captured image lists the reclaimed segments too (dead now, but durable at its
    // capture): a few bytes each. The moved values inline would be 600 KB.
    assert!(
        image.len() <= baseline.len() + 4096,
        "the image holds what reclaim moved inline: {} bytes, {} captured afterwards",
        image.len(),
        baseline.len()
    );
    let first_free = w.segment_ids().last().unwrap() + 1;
    let (restored, r) = Store::restore_with_segments(&image, options(first_free), &mut |id| {
        disk.get(&id).cloned().ok_or(format!("no file {id}"))
    })
    .expect("a whole image");
    assert_eq!(restored.current_revision(), revision);
    for k in 0..KEYS {
        let got = r
            .range(&RangeRequest {
                key: Bytes::from(format!("key{k:05}")),
                ..Default::default()
            })
            .unwrap();
        let round = u8::from(k % 10 != 0);
        assert_eq!(got.kvs[0].value, Bytes::from(vec![round; 2000]), "key {k}");
    }
    // The segments it names that were not durable at the capture die, if they do, at an
    // index after it: the server deletes a dead segment's file only once every checkpoint it
    // keeps was captured after the death, so this checkpoint's files stay while it does.
    let late: Vec<u32> = crate::checkpoint_segments(&image)
        .unwrap()
        .into_iter()
        .filter(|id| !at_capture.contains(id))
        .collect();
    assert!(!late.is_empty(), "the image names segments durable since");
    for k in 0..KEYS {
        index += 1;
        w.apply(index, &put(k, 2)).unwrap();
    }
    write_sealed(&mut w, &mut disk);
    index += 1;
    let revision = w.current_revision();
    compact(&mut w, index, revision);
    let mut died = Vec::new();
    while w.compact_step(64) == CompactionStatus::Pending {
        write_sealed(&mut w, &mut disk);
        died.extend(w.take_dead_segments());
    }
    died.extend(w.take_dead_segments());
    let late_deaths: Vec<_> = died.iter().filter(|d| late.contains(&d.id)).collect();
    assert!(!late_deaths.is_empty(), "the late segments die");
    for d in late_deaths {
        assert!(d.died_at_index > before.applied_index(), "{d:?}");
    }
}

/// Reclaim moving values out of segments the capture holds durable (into the open segment,
/// in memory) while a checkpoint is archived: the archive takes them inline, past the bound
/// its buffer was sized by, and is still whole. At 4M keys, after deleting half, this stopped a
/// member ("the archive fits the bound it was sized for").
#[test]
fn a_checkpoint_beside_reclaim_of_durable_segments_is_whole() {
    const KEYS: u64 = 3000;
    for attempt in 0..20u64 {
        let (mut w, _r) = Store::with_value_log(options(0));
        let mut disk = std::collections::BTreeMap::new();
        let mut index = 0;
        let revision = two_rounds_compacted(&mut w, &mut disk, &mut index, KEYS, attempt % 10);
        // The index walk first, so only reclaim runs beside the archive.
        while w.reclaim_file().is_none() {
            assert_eq!(w.compact_step(64), CompactionStatus::Pending);
        }
        let source = w.checkpoint_source();
        let serializer = std::thread::spawn(move || source.serialize_parts());
        while !serializer.is_finished() && w.compact_step(8) == CompactionStatus::Pending {}
        let parts = serializer
            .join()
            .expect("the serializer does not panic")
            .expect("no compaction was applied meanwhile");
        let image = parts.to_vec();
        let first_free = w.segment_ids().last().unwrap() + 1;
        let (restored, r) = Store::restore_with_segments(&image, options(first_free), &mut |id| {
            disk.get(&id).cloned().ok_or(format!("no file {id}"))
        })
        .expect("a whole image");
        assert_eq!(restored.current_revision(), revision);
        for k in (0..KEYS).step_by(7) {
            let got = r
                .range(&RangeRequest {
                    key: Bytes::from(format!("key{k:05}")),
                    ..Default::default()
                })
                .unwrap();
            let round = u8::from(k % 10 != attempt % 10);
            assert_eq!(got.kvs[0].value, Bytes::from(vec![round; 2000]), "key {k}");
        }
    }
}
