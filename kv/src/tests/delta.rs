//! Incremental checkpoints: a delta restored over its base is the store a full checkpoint of
//! the same capture restores, through puts, deletes, leases, compaction and reclaim, on an
//! in-memory "disk" of segment files (seeded, replayable).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{compact, write_sealed};
use crate::checkpoint::renumber_segments;
use crate::*;

fn on_disk(first_segment_id: u32) -> ValueLogOptions {
    ValueLogOptions {
        segment_bytes: 2048,
        first_segment_id,
        on_disk: true,
    }
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        // xorshift64*: enough for choosing ops, and the seed replays a failure.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn key(k: u64) -> Bytes {
    Bytes::from(format!("key{k:04}"))
}

fn put(k: u64, value: &[u8], lease: i64) -> Op {
    Op::Put(PutRequest {
        key: key(k),
        value: Bytes::copy_from_slice(value),
        lease,
        ..Default::default()
    })
}

fn delete(k: u64) -> Op {
    Op::DeleteRange(DeleteRangeRequest {
        key: key(k),
        ..Default::default()
    })
}

/// Key `k`'s values at `revision` (0: the newest).
fn values_of(r: &Reader, k: u64, revision: i64) -> Vec<Bytes> {
    r.range(&RangeRequest {
        key: key(k),
        revision,
        ..Default::default()
    })
    .unwrap()
    .kvs
    .into_iter()
    .map(|kv| kv.value)
    .collect()
}

/// Everything a restore must give back, as comparable values.
fn contents(w: &Writer) -> (i64, i64, Vec<ExportVersion>, Vec<LeaseInfo>, u32) {
    let source = w.checkpoint_source();
    (
        w.current_revision(),
        w.compact_revision(),
        source.versions_by_revision().expect("no compaction races"),
        w.leases(),
        source.hash().expect("no compaction races"),
    )
}

fn restore(
    image: &[u8],
    base: Option<&[u8]>,
    disk: &BTreeMap<u32, Bytes>,
    first_free: u32,
) -> (Writer, Reader) {
    Store::restore_on_base(
        image,
        base,
        on_disk(first_free),
        &mut |id| disk.get(&id).cloned().ok_or(format!("no file {id}")),
        RestoreHelpers {
            threads: 2,
            on_start: &|| {},
        },
    )
    .expect("restores")
}

/// One random op on a store of `keys` keys and a few leases.
fn random_op(rng: &mut Rng, w: &mut Writer, index: &mut u64, keys: u64, leases: &mut Vec<i64>) {
    *index += 1;
    let op = match rng.below(20) {
        0..=11 => {
            let lease = match rng.below(4) {
                0 if !leases.is_empty() => leases[rng.below(leases.len() as u64) as usize],
                _ => 0,
            };
            let len = 1 + rng.below(300) as usize;
            put(rng.below(keys), &vec![rng.below(256) as u8; len], lease)
        }
        12..=14 => {
            let from = rng.below(keys);
            Op::DeleteRange(DeleteRangeRequest {
                key: key(from),
                range_end: key(from + rng.below(3)),
                prev_kv: false,
            })
        }
        15 => {
            let id = 1000 + *index as i64;
            leases.push(id);
            Op::LeaseGrant(LeaseGrantRequest { id, ttl_s: 60 })
        }
        16 if !leases.is_empty() => {
            let id = leases.remove(rng.below(leases.len() as u64) as usize);
            Op::LeaseRevoke(LeaseRevokeRequest { id })
        }
        _ => {
            let (low, high) = (w.compact_revision().max(1), w.current_revision());
            if low >= high {
                w.apply_empty(*index);
                return;
            }
            Op::Compact(CompactionRequest {
                revision: low + 1 + rng.below((high - low) as u64) as i64,
                physical: false,
            })
        }
    };
    w.apply(*index, &op).expect("a valid op applies");
    // Compaction and reclaim in bounded steps, sometimes left unfinished at a checkpoint.
    for _ in 0..rng.below(6) {
        if w.compact_step(8) == CompactionStatus::Idle {
            break;
        }
    }
}

#[test]
fn a_delta_over_its_base_restores_what_a_full_checkpoint_restores() {
    let mut deltas = 0;
    for seed in 1..=60u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (mut w, _r) = Store::with_value_log(on_disk(0));
        let mut disk = BTreeMap::new();
        let (mut index, keys, mut leases) = (0u64, 300u64, Vec::new());
        for k in 0..keys {
            index += 1;
            w.apply(index, &put(k, &[k as u8; 40], 0)).unwrap();
        }
        let mut base: Option<(Vec<u8>, DeltaBase)> = None;
        for round in 0..8 {
            for _ in 0..rng.below(50) {
                random_op(&mut rng, &mut w, &mut index, keys, &mut leases);
            }
            if rng.below(2) == 0 {
                write_sealed(&mut w, &mut disk);
            }
            let source = w.checkpoint_source();
            let parts = source
                .serialize_parts_against(base.as_ref().map(|(_, b)| b))
                .expect("no compaction races");
            let image = parts.to_vec();
            let first_free = w.segment_ids().last().map_or(0, |id| id + 1);
            let (restored, _) = match (parts.delta_of(), &base) {
                (Some(of), Some((base_image, b))) => {
                    assert_eq!(of, b.applied_index());
                    assert!(checkpoint_kind(&image).unwrap() == CheckpointKind::Delta(*b));
                    deltas += 1;
                    // A delta is refused alone, and over a full checkpoint of another point.
                    assert!(matches!(
                        Store::restore_on_base(
                            &image,
                            None,
                            on_disk(first_free),
                            &mut |id| Ok(disk[&id].clone()),
                            RestoreHelpers::NONE
                        ),
                        Err(KvError::CheckpointDamaged(_))
                    ));
                    let other = source.serialize().unwrap();
                    assert!(matches!(
                        Store::restore_on_base(
                            &image,
                            Some(&other),
                            on_disk(first_free),
                            &mut |id| Ok(disk[&id].clone()),
                            RestoreHelpers::NONE
                        ),
                        Err(KvError::CheckpointDamaged(_))
                    ));
                    restore(&image, Some(base_image), &disk, first_free)
                }
                (None, _) => {
                    assert!(matches!(
                        checkpoint_kind(&image),
                        Ok(CheckpointKind::Full(_))
                    ));
                    let restored = restore(&image, None, &disk, first_free);
                    // A full checkpoint is the next base, as the server adopts it.
                    w.set_delta_base_revision(source.revision());
                    base = Some((image.clone(), source.delta_base()));
                    restored
                }
                (Some(_), None) => panic!("a delta without a base asked for"),
            };
            let mut restored = restored;
            let (got, want) = (contents(&restored), contents(&w));
            if got != want {
                let first = got
                    .2
                    .iter()
                    .zip(&want.2)
                    .position(|(a, b)| a != b)
                    .map(|at| {
                        (
                            &got.2[at].key,
                            got.2[at].rev,
                            &want.2[at].key,
                            want.2[at].rev,
                        )
                    });
                panic!(
                    "seed {seed} round {round}: the restore differs from the store: revisions {:?} / {:?}, versions {} / {}, first difference {first:?}, leases equal {}, hashes {} / {}",
                    (got.0, got.1),
                    (want.0, want.1),
                    got.2.len(),
                    want.2.len(),
                    got.3 == want.3,
                    got.4,
                    want.4
                );
            }
            // Compaction finished on both gives the same store too (the restore redoes what
            // compaction trimmed since the base).
            while restored.compact_step(64) == CompactionStatus::Pending {}
            while w.compact_step(64) == CompactionStatus::Pending {}
            assert_eq!(
                contents(&restored),
                contents(&w),
                "seed {seed} round {round}"
            );
        }
    }
    assert!(deltas >= 100, "only {deltas} rounds wrote a delta");
}

/// Compacts `w` at `revision` through raft index `index` and runs the compaction to its end.
fn compact_fully(w: &mut Writer, index: u64, revision: i64) {
    compact(w, index, revision);
    while w.compact_step(64) == CompactionStatus::Pending {}
}

/// `w` checkpointed as a delta against `base`, restored over `base_image`.
fn delta_restored(
    w: &Writer,
    base: &DeltaBase,
    base_image: &[u8],
    disk: &BTreeMap<u32, Bytes>,
) -> Reader {
    let parts = w
        .checkpoint_source()
        .serialize_parts_against(Some(base))
        .unwrap();
    assert_eq!(parts.delta_of(), Some(base.applied_index()));
    let first_free = w.segment_ids().last().unwrap() + 1;
    restore(&parts.to_vec(), Some(base_image), disk, first_free).1
}

#[test]
fn a_key_deleted_and_compacted_away_after_the_base_stays_deleted() {
    let (mut w, _r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    let mut index = 0;
    for k in 0..100 {
        index += 1;
        w.apply(index, &put(k, b"value", 0)).unwrap();
    }
    write_sealed(&mut w, &mut disk);
    let source = w.checkpoint_source();
    let base_image = source.serialize().unwrap();
    w.set_delta_base_revision(source.revision());
    let base = source.delta_base();
    index += 1;
    w.apply(index, &delete(7)).unwrap();
    index += 1;
    let revision = w.current_revision();
    compact_fully(&mut w, index, revision);
    let r = delta_restored(&w, &base, &base_image, &disk);
    assert!(
        values_of(&r, 7, 0).is_empty(),
        "the deleted key came back from the base"
    );
    assert_eq!(values_of(&r, 8, 0).len(), 1);
    // Deleted again and put back, then compacted between the two: at the compact revision
    // the key is deleted, and the base's value must not show through there either.
    index += 1;
    w.apply(index, &delete(9)).unwrap();
    index += 1;
    w.apply(index, &put(50, b"other", 0)).unwrap();
    let between = w.current_revision();
    index += 1;
    w.apply(index, &put(9, b"again", 0)).unwrap();
    index += 1;
    compact_fully(&mut w, index, between);
    let r = delta_restored(&w, &base, &base_image, &disk);
    assert!(
        values_of(&r, 9, between).is_empty(),
        "the base's value shows at the compact revision, where the key was deleted"
    );
    assert_eq!(values_of(&r, 9, 0), vec![Bytes::from_static(b"again")]);
}

#[test]
fn a_delta_of_most_keys_is_written_full_and_a_renumbered_pair_restores() {
    let (mut w, r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    let mut index = 0;
    for k in 0..200 {
        index += 1;
        w.apply(index, &put(k, &[1; 50], 0)).unwrap();
    }
    write_sealed(&mut w, &mut disk);
    let source = w.checkpoint_source();
    let base_image = source.serialize().unwrap();
    let base = source.delta_base();
    w.set_delta_base_revision(base.revision());
    // A few keys changed: a delta, far smaller than the base.
    for k in 0..10 {
        index += 1;
        w.apply(index, &put(k, &[2; 50], 0)).unwrap();
    }
    write_sealed(&mut w, &mut disk);
    let parts = w
        .checkpoint_source()
        .serialize_parts_against(Some(&base))
        .unwrap();
    assert!(parts.delta_of().is_some());
    let delta = parts.to_vec();
    assert!(
        delta.len() * 5 < base_image.len(),
        "{} bytes against {}",
        delta.len(),
        base_image.len()
    );
    // Renumbered together (a follower's copy), the pair restores from the raised ids.
    let shift = 500;
    let (base2, delta2) = (
        renumber_segments(&base_image, shift).unwrap(),
        renumber_segments(&delta, shift).unwrap(),
    );
    assert_eq!(
        checkpoint_kind(&delta2).unwrap(),
        CheckpointKind::Delta(base)
    );
    assert_eq!(checkpoint_kind(&base2).unwrap(), CheckpointKind::Full(base));
    let raised: BTreeMap<u32, Bytes> = disk.iter().map(|(id, f)| (id + shift, f.clone())).collect();
    let (w2, r2) = restore(&delta2, Some(&base2), &raised, 0);
    let rev = w.current_revision();
    assert_eq!(r2.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    assert_eq!(w2.delta_base_revision(), base.revision());
    // Most keys changed: written full, and it restores alone.
    for k in 0..150 {
        index += 1;
        w.apply(index, &put(k, &[3; 50], 0)).unwrap();
    }
    let parts = w
        .checkpoint_source()
        .serialize_parts_against(Some(&base))
        .unwrap();
    assert_eq!(parts.delta_of(), None);
    let first_free = w.segment_ids().last().unwrap() + 1;
    let (_, r3) = restore(&parts.to_vec(), None, &disk, first_free);
    let rev = w.current_revision();
    assert_eq!(r3.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    // A damaged delta is refused.
    let mut damaged = delta.clone();
    let at = damaged.len() - 3;
    damaged[at] ^= 1;
    assert!(Store::restore_on_base(
        &damaged,
        Some(&base_image),
        on_disk(first_free),
        &mut |id| Ok(disk[&id].clone()),
        RestoreHelpers::NONE
    )
    .is_err());
}

/// A follower stores a leader's checkpoint under raised segment ids (a new header), restores
/// it, and writes deltas of its own against it: those name its segments as they are (no
/// shift), and restore on the shifted base to the follower's store, and so does a second
/// shift on top of the first (the follower's snapshot sent on to another member).
#[test]
fn a_members_own_delta_over_a_leaders_base_under_raised_ids_restores() {
    let (mut leader, _) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    let mut index = 0;
    for k in 0..200 {
        index += 1;
        leader.apply(index, &put(k, &[1; 50], 0)).unwrap();
    }
    write_sealed(&mut leader, &mut disk);
    let leaders = leader.checkpoint();
    let listed = checkpoint_segments(&leaders).unwrap();
    assert!(listed.len() > 1, "the values are in several segment files");
    // Only the header differs; it names the raised ids.
    let shift = 700;
    let header = segment_shift_header(&leaders, shift, *listed.last().unwrap()).unwrap();
    let shifted = [&header[..], &leaders[CHECKPOINT_HEADER_BYTES..]].concat();
    assert_eq!(shifted.len(), leaders.len());
    assert_eq!(
        shifted[CHECKPOINT_HEADER_BYTES..],
        leaders[CHECKPOINT_HEADER_BYTES..]
    );
    let raised_ids: Vec<u32> = listed.iter().map(|id| id + shift).collect();
    assert_eq!(checkpoint_segments(&shifted).unwrap(), raised_ids);
    let mut follower_disk: BTreeMap<u32, Bytes> =
        disk.iter().map(|(id, f)| (id + shift, f.clone())).collect();
    let (mut w, r) = restore(&shifted, None, &follower_disk, 0);
    assert!(w.segment_ids().last().unwrap() > raised_ids.last().unwrap());
    let CheckpointKind::Full(base) = checkpoint_kind(&shifted).unwrap() else {
        panic!("a full checkpoint");
    };
    // Values large enough to fill segments of the follower's own, which the delta points into.
    for k in 0..10 {
        index += 1;
        w.apply(index, &put(k, &[2; 400], 0)).unwrap();
    }
    write_sealed(&mut w, &mut follower_disk);
    let parts = w
        .checkpoint_source()
        .serialize_parts_against(Some(&base))
        .unwrap();
    assert_eq!(parts.delta_of(), Some(base.applied_index()));
    let delta = parts.to_vec();
    assert!(
        checkpoint_segments(&delta)
            .unwrap()
            .iter()
            .any(|id| id > raised_ids.last().unwrap()),
        "the delta points into a segment of the follower's own"
    );
    let first_free = w.segment_ids().last().unwrap() + 1;
    let (_, r2) = restore(&delta, Some(&shifted), &follower_disk, first_free);
    let rev = w.current_revision();
    assert_eq!(r2.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    for k in [0, 9, 10, 199] {
        assert_eq!(values_of(&r2, k, 0), values_of(&r, k, 0), "key {k}");
    }
    // Sent on and shifted again by its receiver: both files under the same second shift.
    let more = 50;
    let highest = |image: &[u8]| *checkpoint_segments(image).unwrap().last().unwrap();
    let again = |image: &[u8]| {
        let header = segment_shift_header(image, more, highest(image)).unwrap();
        [&header[..], &image[CHECKPOINT_HEADER_BYTES..]].concat()
    };
    let (base3, delta3) = (again(&shifted), again(&delta));
    let third_disk: BTreeMap<u32, Bytes> = follower_disk
        .iter()
        .map(|(id, f)| (id + more, f.clone()))
        .collect();
    let (_, r3) = restore(&delta3, Some(&base3), &third_disk, 0);
    assert_eq!(r3.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    // As they go out to another member: the ids written into the archives and no shift left
    // (the format of a build before shifts), naming the same files.
    // The image as a file frames it (8 bytes of framing before it, so that its archive lies
    // aligned), with a crc of the framing's own that `mend` is given to fix.
    let plain = |image: &[u8]| {
        let file = [&[7u8; 8][..], image].concat();
        let mut mended = false;
        let out = without_segment_shift_in(&file, 8..file.len(), |all| {
            assert_eq!(all[..8], [7; 8], "the framing is kept");
            mended = true;
        })
        .unwrap();
        let Some(out) = out else {
            assert!(!mended);
            assert_eq!(segment_shift_of(image).unwrap(), 0);
            return image.to_vec();
        };
        assert!(mended);
        let out = out[8..].to_vec();
        assert_eq!(out.len(), image.len());
        assert_eq!(out[12..16], [0; 4], "no shift left");
        assert_eq!(segment_shift_of(&out).unwrap(), 0);
        assert!(u32::from_le_bytes(out[8..12].try_into().unwrap()) < 0x100);
        assert_eq!(
            checkpoint_segments(&out).unwrap(),
            checkpoint_segments(image).unwrap()
        );
        out
    };
    assert_eq!(segment_shift_of(&leaders).unwrap(), 0);
    assert_eq!(
        segment_shift_of(&delta).unwrap(),
        0,
        "the follower's own delta has no shift"
    );
    assert_eq!(segment_shift_of(&shifted).unwrap(), shift);
    assert_eq!(plain(&delta), delta);
    let (_, r4) = restore(&plain(&delta), Some(&plain(&shifted)), &follower_disk, 0);
    assert_eq!(r4.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
    let (_, r5) = restore(&plain(&delta3), Some(&plain(&base3)), &third_disk, 0);
    assert_eq!(r5.hash_kv(rev).unwrap(), r.hash_kv(rev).unwrap());
}

/// A header's segment id shift is read only with the format's flag, and a header that has one
/// half of the pair and not the other is refused as damaged, as is a shift that would carry
/// an id past the id space.
#[test]
fn a_segment_shift_header_is_checked() {
    let (mut w, _) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    for k in 0..100 {
        w.apply(k + 1, &put(k, &[1; 50], 0)).unwrap();
    }
    write_sealed(&mut w, &mut disk);
    let image = w.checkpoint();
    let highest = *checkpoint_segments(&image).unwrap().last().unwrap();
    let with_header = |mut header: [u8; CHECKPOINT_HEADER_BYTES]| {
        let crc = crc32fast::hash(&header[..36]);
        header[36..].copy_from_slice(&crc.to_le_bytes());
        [&header[..], &image[CHECKPOINT_HEADER_BYTES..]].concat()
    };
    let good = segment_shift_header(&image, 9, highest).unwrap();
    assert!(checkpoint_segments(&with_header(good)).is_ok());
    // The shift without the flag: an older build's header never has one.
    let mut no_flag = good;
    no_flag[8..12].copy_from_slice(&image[8..12]);
    assert!(matches!(
        checkpoint_segments(&with_header(no_flag)),
        Err(KvError::CheckpointDamaged(_))
    ));
    // The flag without a shift.
    let mut no_shift = good;
    no_shift[12..16].copy_from_slice(&0u32.to_le_bytes());
    assert!(matches!(
        checkpoint_segments(&with_header(no_shift)),
        Err(KvError::CheckpointDamaged(_))
    ));
    // A flag bit no build knows.
    let mut unknown = good;
    unknown[10] |= 1;
    assert!(checkpoint_segments(&with_header(unknown)).is_err());
    // Past the id space, asked for or already there.
    assert!(segment_shift_header(&image, SEGMENT_NONE - 1 - highest, highest).is_err());
    assert!(segment_shift_header(&image, SEGMENT_NONE - 2 - highest, highest).is_ok());
    let mut far = good;
    far[12..16].copy_from_slice(&(SEGMENT_NONE - 2).to_le_bytes());
    assert!(checkpoint_segments(&with_header(far)).is_err());
    assert!(Store::restore_on_base(
        &with_header(far),
        None,
        on_disk(0),
        &mut |id| Ok(disk[&id].clone()),
        RestoreHelpers::NONE
    )
    .is_err());
    // A damaged header is refused before anything is read.
    let mut bad = image.clone();
    bad[20] ^= 1;
    assert!(segment_shift_header(&bad, 9, highest).is_err());
}

/// The writer names the keys written since the base, and a delta of those keys is byte for
/// byte the delta a walk over the whole index finds: with the writer applying between the
/// capture and the serialize, bases adopted after further writes (as the server adopts a
/// full checkpoint once it is written), compaction, leases, and more keys written than the
/// writer keeps track of (it then falls back to the walk until a later base).
#[test]
fn a_delta_of_the_keys_the_writer_named_is_the_delta_a_walk_finds() {
    let (mut named_deltas, mut walked_after_overflow) = (0, 0);
    for seed in 1..=80u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (mut w, _r) = Store::with_value_log(on_disk(0));
        let mut disk = BTreeMap::new();
        // Every fourth seed writes to more keys than the writer tracks (1024 at this size).
        let keys = if seed % 4 == 0 { 3000 } else { 300 };
        let (mut index, mut leases) = (0u64, Vec::new());
        for k in 0..keys {
            index += 1;
            w.apply(index, &put(k, &[k as u8; 40], 0)).unwrap();
        }
        let mut base: Option<(Vec<u8>, DeltaBase)> = None;
        for round in 0..10 {
            let ops = if keys > 1024 && rng.below(3) == 0 {
                2000
            } else {
                rng.below(60)
            };
            for _ in 0..ops {
                random_op(&mut rng, &mut w, &mut index, keys, &mut leases);
            }
            if rng.below(2) == 0 {
                write_sealed(&mut w, &mut disk);
            }
            let b = base.as_ref().map(|(_, b)| *b);
            let walked = w.checkpoint_source();
            let named = w.checkpoint_source_against(b.as_ref());
            // The writer goes on applying while the checkpoint is serialized elsewhere.
            for _ in 0..rng.below(20) {
                random_op(&mut rng, &mut w, &mut index, keys, &mut leases);
            }
            let first_free = w.segment_ids().last().map_or(0, |id| id + 1);
            let Some(b) = b.filter(|_| round % 4 != 0) else {
                // A full checkpoint, adopted as the base once written (after more writes).
                let Ok(image) = walked.serialize() else {
                    continue; // a compaction began meanwhile: the server takes a new capture
                };
                for _ in 0..rng.below(20) {
                    random_op(&mut rng, &mut w, &mut index, keys, &mut leases);
                }
                w.set_delta_base_revision(walked.revision());
                base = Some((image, walked.delta_base()));
                continue;
            };
            let (Ok(by_name), Ok(by_walk)) = (
                named.serialize_delta_parts(&b),
                walked.serialize_delta_parts(&b),
            ) else {
                continue;
            };
            assert_eq!(
                by_name.to_vec(),
                by_walk.to_vec(),
                "seed {seed} round {round}: the named keys' delta is the walk's"
            );
            if named.names_keys() {
                named_deltas += 1;
            } else {
                assert!(
                    keys > 1024,
                    "seed {seed} round {round}: a small working set is named"
                );
                walked_after_overflow += 1;
            }
            // Left to choose, the named capture writes a delta only where the walk does (its
            // estimate of the full size is a lower bound), and the same one.
            let (chosen_by_name, chosen_by_walk) = (
                named.serialize_parts_against(Some(&b)).unwrap(),
                walked.serialize_parts_against(Some(&b)).unwrap(),
            );
            if chosen_by_name.delta_of().is_some() {
                assert_eq!(chosen_by_name.to_vec(), chosen_by_walk.to_vec());
            }
            let base_image = &base.as_ref().unwrap().0;
            let from_delta = restore(&by_name.to_vec(), Some(base_image), &disk, first_free);
            let from_full = restore(&walked.serialize().unwrap(), None, &disk, first_free);
            assert_eq!(
                contents(&from_delta.0),
                contents(&from_full.0),
                "seed {seed} round {round}"
            );
        }
    }
    assert!(
        named_deltas >= 60,
        "only {named_deltas} deltas of named keys"
    );
    assert!(
        walked_after_overflow >= 10,
        "only {walked_after_overflow} deltas walked after the writer stopped naming keys"
    );
}

/// The first full checkpoint of a store with no base yet (just started or restored): a key
/// deleted and compacted away while that checkpoint is written stays deleted in a delta
/// taken against it (the capture makes compaction keep the tombstone from then on).
#[test]
fn a_key_deleted_while_the_first_base_is_written_stays_deleted() {
    let (mut w, _r) = Store::with_value_log(on_disk(0));
    let mut disk = BTreeMap::new();
    let mut index = 0;
    for k in 0..40 {
        index += 1;
        w.apply(index, &put(k, b"before the base", 0)).unwrap();
    }
    write_sealed(&mut w, &mut disk);
    let full = w.checkpoint_source_against(None);
    let base_image = full.serialize().unwrap();
    // While the full checkpoint is written and synced: key 7 is deleted and compacted away.
    index += 1;
    w.apply(index, &delete(7)).unwrap();
    index += 1;
    w.apply(index, &put(8, b"after the base", 0)).unwrap();
    index += 1;
    let now = w.current_revision();
    compact_fully(&mut w, index, now);
    w.set_delta_base_revision(full.revision());
    write_sealed(&mut w, &mut disk);
    let delta = w.checkpoint_source_against(Some(&full.delta_base()));
    assert!(delta.names_keys());
    let parts = delta.serialize_delta_parts(&full.delta_base()).unwrap();
    let first_free = w.segment_ids().last().unwrap() + 1;
    let (restored, reader) = restore(&parts.to_vec(), Some(&base_image), &disk, first_free);
    let got = values_of(&reader, 7, 0);
    assert!(got.is_empty(), "the deleted key came back: {got:?}");
    assert_eq!(contents(&restored), contents(&w));
}

/// Writes `value` to each of `keys`, one raft entry each after `index`.
fn put_keys(w: &mut Writer, index: &mut u64, keys: std::ops::Range<u64>, value: &[u8]) {
    for k in keys {
        *index += 1;
        w.apply(*index, &put(k, value, 0)).unwrap();
    }
}

/// A store written through raft indexes, its segments written to an in-memory disk, and a
/// full checkpoint of it adopted as the delta base.
struct Based {
    w: Writer,
    disk: BTreeMap<u32, Bytes>,
    index: u64,
    base_image: Vec<u8>,
    base: DeltaBase,
}

impl Based {
    /// Keys `0..keys` written once, then the base.
    fn of(keys: u64) -> Based {
        let (mut w, _r) = Store::with_value_log(on_disk(0));
        let (mut disk, mut index) = (BTreeMap::new(), 0);
        put_keys(&mut w, &mut index, 0..keys, b"in the base");
        write_sealed(&mut w, &mut disk);
        let full = w.checkpoint_source_against(None);
        let base_image = full.serialize().unwrap();
        w.set_delta_base_revision(full.revision());
        Based {
            w,
            disk,
            index,
            base_image,
            base: full.delta_base(),
        }
    }

    fn put_keys(&mut self, keys: std::ops::Range<u64>, value: &[u8]) {
        put_keys(&mut self.w, &mut self.index, keys, value);
    }

    /// A checkpoint against the base from a capture that may bound it by the writer's counts
    /// (which remembered the base when `remembered` is Some: that many versions written
    /// since), checked to be the one a plain capture (which counts by a walk) writes, and
    /// to restore the store. Whether it is a delta.
    fn checkpoint_as_walked(&mut self, remembered: Option<u64>) -> bool {
        write_sealed(&mut self.w, &mut self.disk);
        let bounded = self.w.checkpoint_source_against(Some(&self.base));
        let walked = self.w.checkpoint_source();
        assert!(!bounded.names_keys());
        assert_eq!(bounded.versions_since_base(), remembered);
        assert_eq!(walked.versions_since_base(), None);
        let image = bounded.serialize_parts_against(Some(&self.base)).unwrap();
        let by_walk = walked.serialize_parts_against(Some(&self.base)).unwrap();
        assert_eq!(image.to_vec(), by_walk.to_vec());
        let first_free = self.w.segment_ids().last().unwrap() + 1;
        let delta = image.delta_of().is_some();
        if delta {
            assert_eq!(image.delta_of(), Some(self.base.applied_index()));
        }
        let base_image = delta.then_some(self.base_image.as_slice());
        let (restored, _) = restore(&image.to_vec(), base_image, &self.disk, first_free);
        assert_eq!(contents(&restored), contents(&self.w));
        delta
    }
}

/// An insert-heavy load writes to more keys between checkpoints than the writer names (a
/// sixteenth of the index): the delta is then sized from the versions written since its
/// base, without a walk, and is the delta a walk finds; past a quarter of the full size both
/// choose a full checkpoint.
#[test]
fn a_delta_past_the_named_keys_is_sized_from_the_writes_since_its_base() {
    let mut b = Based::of(16_000);
    // 2,000 keys written: past the 1,024 the writer names at this size.
    b.put_keys(16_000..17_500, b"new");
    b.put_keys(0..500, b"rewritten");
    assert!(b.checkpoint_as_walked(Some(2000)));
    // 7,500 more keys: the delta would be over a quarter of the store.
    b.put_keys(17_500..25_000, b"new");
    assert!(!b.checkpoint_as_walked(Some(9500)));
}

/// Keys written several times each since the base, past what the writer names: the bound
/// from the writer's counts (a version, a key record and a key's bytes for every write) is
/// then too loose to refuse a delta by, so the delta is counted by a walk, and both captures
/// choose the same delta.
#[test]
fn a_loose_bound_does_not_refuse_a_delta_a_walk_would_write() {
    let mut b = Based::of(16_000);
    // 2,000 keys (past the 1,024 named) written three times each.
    for round in 0..3u8 {
        b.put_keys(0..2000, &[round; 11]);
    }
    assert!(b.checkpoint_as_walked(Some(6000)));
}

/// Every key written twice since the base, past what the writer names: the versions written
/// alone are over a quarter of the full archive, so the checkpoint is full without counting
/// the delta by a walk, and is the one a walk chooses.
#[test]
fn a_delta_too_large_by_the_writes_alone_is_refused_without_a_walk() {
    let mut b = Based::of(4000);
    for round in 0..2u8 {
        b.put_keys(0..4000, &[round; 11]);
    }
    write_sealed(&mut b.w, &mut b.disk);
    let bounded = b.w.checkpoint_source_against(Some(&b.base));
    assert_eq!(bounded.versions_since_base(), Some(8000));
    let walks = crate::checkpoint::CheckpointSource::walks_counted();
    let image = bounded.serialize_parts_against(Some(&b.base)).unwrap();
    assert_eq!(image.delta_of(), None, "a full checkpoint");
    assert_eq!(
        crate::checkpoint::CheckpointSource::walks_counted(),
        walks,
        "no walk counted the delta"
    );
    // A capture that cannot bound the delta counts it, and writes the same image.
    assert!(!b.checkpoint_as_walked(Some(8000)));
    assert!(crate::checkpoint::CheckpointSource::walks_counted() > walks);
}

/// The writer remembers its last 16 captures: a base pushed out of them, or one from before a
/// restart, is counted by a walk, and the checkpoint is the same.
#[test]
fn a_base_the_writer_no_longer_remembers_is_counted_by_a_walk() {
    let mut b = Based::of(8000);
    // Past the 1,024 keys the writer names.
    b.put_keys(8000..9100, b"new");
    for capture in 1..=16u64 {
        b.put_keys(9100 + capture..9101 + capture, b"new");
        // Each capture is remembered; the 16th pushes the base's out.
        let remembered = (capture < 16).then_some(1100 + capture);
        assert!(b.checkpoint_as_walked(remembered), "capture {capture}");
    }
    let delta =
        b.w.checkpoint_source()
            .serialize_delta_parts(&b.base)
            .unwrap();
    let first_free = b.w.segment_ids().last().unwrap() + 1;
    let (mut restored, _) = restore(&delta.to_vec(), Some(&b.base_image), &b.disk, first_free);
    let after_restart = restored.checkpoint_source_against(Some(&b.base));
    assert_eq!(after_restart.versions_since_base(), None);
}
