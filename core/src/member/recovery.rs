//! The member's WAL records: what a Ready turns into, and how a restart rebuilds the member
//! (raft log, store, membership, alarms) from the newest checkpoint and the records after it.
//! Pure: the driver reads the files and writes the WAL; this module encodes and rebuilds, so a
//! simulator can restart a member from its simulated disk the same way.
//!
//! Architecture invariant: a snapshot's WAL record is written only after its state is durable
//! as a checkpoint, so replay that meets a snapshot record past the newest checkpoint refuses
//! to start (only the empty bootstrap snapshot at index 1 has no checkpoint).

use bytes::Bytes;
use keel_io::Record;
use keel_kv as kv;
use keel_raft::{
    Durability, Entry, HardState, MemStorage, RawNode, Snapshot, SnapshotMetadata, Storage,
};

use crate::alarms::Alarms;
use crate::auth::AuthImage;
use crate::checkpoint::Checkpoint;
use crate::error::CoreError;
use crate::ids::Member as MemberInfo;

/// WAL record kinds. The WAL frames and checksums them; these say what the payload is.
pub const WAL_KIND_ENTRY: u8 = 1;
pub const WAL_KIND_HARD_STATE: u8 = 2;
pub const WAL_KIND_SNAPSHOT: u8 = 3;

/// The WAL records one Ready must make durable before its after-persist messages go out, in
/// write order: the snapshot marker, the entries, then the hard state. `last_index` is the
/// log's last index, which the hard state record is filed under when the Ready has no entries.
/// Empty when the Ready need not be synced: a commit-only change rides along with the next
/// synced batch instead of costing an fdatasync of its own (it is recoverable from the log and
/// from peers).
pub fn ready_records(
    snapshot: Option<&SnapshotMetadata>,
    entries: &[Entry],
    hard_state: Option<&HardState>,
    durability: Durability,
    last_index: u64,
) -> Vec<Record> {
    if durability != Durability::Sync {
        return Vec::new();
    }
    // All of a Ready's records are encoded into one buffer, and each record's payload is a
    // slice of it: one allocation per Ready rather than one per entry (on the raft core,
    // which every write goes through).
    let mut spans: Vec<(u8, u64, usize, usize)> = Vec::with_capacity(entries.len() + 2);
    let entry_bytes: usize = entries
        .iter()
        .map(|e| e.data.len() + ENTRY_HEAD_BYTES)
        .sum();
    let mut buf = Vec::with_capacity(entry_bytes + 2 * META_RECORD_BYTES);
    let mut encode = |kind: u8, index: u64, write: &dyn Fn(&mut Vec<u8>)| {
        let start = buf.len();
        write(&mut buf);
        spans.push((kind, index, start, buf.len()));
    };
    if let Some(meta) = snapshot {
        encode(WAL_KIND_SNAPSHOT, meta.index, &|b| meta.encode(b));
    }
    for e in entries {
        encode(WAL_KIND_ENTRY, e.index, &|b| e.encode(b));
    }
    if let Some(hs) = hard_state {
        let index = entries.last().map_or(last_index, |e| e.index);
        encode(WAL_KIND_HARD_STATE, index, &|b| hs.encode(b));
    }
    let all = Bytes::from(buf);
    spans
        .into_iter()
        .map(|(kind, index, start, end)| Record {
            kind,
            index,
            payload: all.slice(start..end),
        })
        .collect()
}

/// Room for an entry's encoding beyond its data (type, term, index, data length), and for a
/// hard state or snapshot marker: what `ready_records` reserves so its buffer rarely grows.
const ENTRY_HEAD_BYTES: usize = 32;
const META_RECORD_BYTES: usize = 64;

/// Rebuilds the raft log in `storage` (which already holds the newest checkpoint's snapshot,
/// or the bootstrap configuration) from the WAL's records, oldest first. Entries apply as raft
/// last wrote them (a later entry at an index overwrites the tail from there); a snapshot
/// record discards everything before it.
pub fn replay(storage: &mut MemStorage, records: Vec<Record>) -> Result<(), CoreError> {
    let applied = storage.first_index() - 1;
    let mut entries: Vec<Entry> = Vec::new();
    let mut hard_state: Option<HardState> = None;
    for rec in records {
        match rec.kind {
            WAL_KIND_ENTRY => {
                let e = Entry::decode(&rec.payload)
                    .map_err(|e| CoreError::Wal(format!("bad entry record: {e}")))?;
                while entries.last().is_some_and(|last| last.index >= e.index) {
                    entries.pop();
                }
                entries.push(e);
            }
            WAL_KIND_HARD_STATE => {
                hard_state = Some(
                    HardState::decode(&rec.payload)
                        .map_err(|e| CoreError::Wal(format!("bad hard state record: {e}")))?,
                );
            }
            WAL_KIND_SNAPSHOT => {
                let meta = SnapshotMetadata::decode(&rec.payload)
                    .map_err(|e| CoreError::Wal(format!("bad snapshot record: {e}")))?;
                entries.clear();
                if meta.index > applied {
                    if meta.index > 1 {
                        return Err(CoreError::Wal(format!(
                            "WAL names snapshot {} but the newest valid checkpoint is at \
                             {applied}: the snapshot's checkpoint file is missing or damaged",
                            meta.index
                        )));
                    }
                    storage.set_conf_state(meta.conf_state.clone());
                    storage.apply_snapshot(Snapshot {
                        metadata: meta,
                        data: Bytes::new(),
                    });
                }
            }
            other => return Err(CoreError::Wal(format!("unknown WAL record kind {other}"))),
        }
    }
    let applied = storage.first_index() - 1;
    let tail: Vec<Entry> = entries.into_iter().filter(|e| e.index > applied).collect();
    if let Some(first) = tail.first() {
        if first.index != applied + 1 {
            // The WAL is released only behind a durable checkpoint, so a gap means the
            // checkpoint it was released behind is not the one we started from: that file is
            // missing or damaged (an older one was taken instead), and only it can fill the gap.
            return Err(CoreError::Wal(format!(
                "WAL entries start at {} but the newest valid checkpoint ends at {applied}: a \
                 gap; the WAL was released behind a newer checkpoint, at index {} or later, \
                 and that checkpoint file is missing or damaged",
                first.index,
                first.index - 1
            )));
        }
        storage.append(&tail);
    }
    // The commit index may trail what the log holds (it is persisted lazily); it never points
    // past the last entry we have, and never below what the checkpoint applied.
    let mut hard_state = hard_state.unwrap_or_else(|| storage.hard_state());
    hard_state.term = hard_state.term.max(storage.hard_state().term);
    hard_state.commit = hard_state
        .commit
        .clamp(applied, storage.last_index().max(applied));
    storage.set_hard_state(hard_state);
    assert!(
        storage.hard_state().commit <= storage.last_index().max(applied),
        "recovered commit index past the recovered log"
    );
    Ok(())
}

/// The raft configuration of a member (without the applied index, which `recover` sets): one
/// tick per heartbeat, `election_tick` ticks to an election, messages and the uncommitted tail
/// bounded by the size limits.
pub fn raft_config(
    member_id: u64,
    election_tick: usize,
    msg_bytes_max: u64,
    uncommitted_bytes_max: u64,
) -> keel_raft::Config {
    assert!(
        election_tick >= 2,
        "an election takes more than one heartbeat"
    );
    let mut rc = keel_raft::Config::new(member_id);
    rc.heartbeat_tick = 1;
    rc.election_tick = election_tick;
    rc.seed = member_id;
    rc.max_size_per_msg_bytes = msg_bytes_max;
    rc.max_uncommitted_entries_bytes = uncommitted_bytes_max;
    rc
}

/// How a member with no checkpoint of its own begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// A founding member: a bootstrap snapshot at index 1 holds the initial voters.
    Founding,
    /// A member joining an existing cluster: it starts empty and learns everything from the
    /// leader.
    Joining,
}

/// What a member restarts from: the raft node over its rebuilt log, the store, and the
/// replicated state the checkpoint carried.
pub struct Recovered {
    pub node: RawNode<MemStorage>,
    pub writer: kv::Writer,
    pub reader: kv::Reader,
    pub members: Vec<MemberInfo>,
    pub alarms: Alarms,
    /// The auth store the checkpoint carried (empty without one; the log replays the rest).
    pub auth: AuthImage,
    /// The removed members' ids the checkpoint carried (none without one; the log replays the
    /// rest). Give them to `Member::restore_removed`.
    pub removed: Vec<u64>,
    /// The index the newest checkpoint (or the bootstrap snapshot) covers.
    pub checkpoint_index: u64,
    /// The oldest checkpoint file the loaded one needs: its own index, or a delta's base's.
    pub checkpoint_root: u64,
}

/// Where recovery finds the store's values and how it may rebuild the index.
pub struct StoreSource<'a, 'f> {
    /// How the store keeps values (its first segment id above every segment file on disk).
    pub value_log: kv::ValueLogOptions,
    /// Maps the durable value-log segments the checkpoint points into.
    pub segment_files: &'a mut kv::SegmentFiles<'f>,
    /// The threads the restore may add beside the caller's (none in simulations, which must
    /// replay exactly).
    pub restore_helpers: kv::RestoreHelpers<'a>,
}

/// Rebuilds a member from what its driver read from disk: the newest valid checkpoint (if
/// any, with its file as it lies on disk, which raft keeps as its snapshot) and the WAL's
/// records, oldest first. `raft` is the raft configuration without its applied index, which
/// recovery sets; `initial_members` is the identity's membership, used when there is no
/// checkpoint; `store` says where the store's values are.
pub fn recover(
    mut raft: keel_raft::Config,
    start: Start,
    initial_members: Vec<MemberInfo>,
    checkpoint: Option<(Checkpoint, Bytes, Option<Checkpoint>)>,
    records: Vec<Record>,
    store: StoreSource<'_, '_>,
) -> Result<Recovered, CoreError> {
    let mut storage = match start {
        Start::Joining => MemStorage::new(),
        Start::Founding => {
            let voters: Vec<u64> = initial_members.iter().map(|m| m.id).collect();
            MemStorage::new_with_voters(&voters)
        }
    };
    let mut members = initial_members;
    let mut alarms = Alarms::default();
    let mut auth = AuthImage::default();
    let mut removed = Vec::new();
    let mut checkpoint_root = 0;
    let (writer, reader) = match checkpoint {
        Some((cp, file, base)) => {
            checkpoint_root = base.as_ref().map_or(cp.meta.index, |b| b.meta.index);
            let (w, r) = kv::Store::restore_on_base(
                &cp.kv_image,
                base.as_ref().map(|b| &b.kv_image[..]),
                store.value_log,
                store.segment_files,
                store.restore_helpers,
            )
            .map_err(|e| CoreError::Store(e.to_string()))?;
            assert_eq!(
                w.applied_index(),
                cp.meta.index,
                "checkpoint header and store disagree on the applied index"
            );
            members = cp.members.clone();
            alarms = Alarms::from_list(&cp.alarms);
            auth = cp.auth.clone();
            removed = cp.removed.clone();
            storage.set_conf_state(cp.meta.conf_state.clone());
            // The checkpoint file, as it lies on disk, is also what a far-behind follower
            // receives as a snapshot.
            drop(cp.kv_image);
            storage.apply_snapshot(Snapshot {
                metadata: cp.meta,
                data: file,
            });
            (w, r)
        }
        None => kv::Store::with_value_log(store.value_log),
    };
    replay(&mut storage, records)?;
    let applied = storage.first_index() - 1;
    let hard_state = storage.hard_state();
    raft.applied = applied;
    let node = RawNode::new(&raft, storage).map_err(|e| CoreError::Raft(e.to_string()))?;
    tracing::info!(
        applied_index = applied,
        last_index = node.store().last_index(),
        term = hard_state.term,
        commit = hard_state.commit,
        "recovered raft log"
    );
    Ok(Recovered {
        node,
        writer,
        reader,
        members,
        alarms,
        auth,
        removed,
        checkpoint_index: applied,
        checkpoint_root: checkpoint_root.min(applied),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_raft::EntryType;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            entry_type: EntryType::Normal,
            data: Bytes::from(format!("e{index}t{term}")),
        }
    }

    #[test]
    fn a_commit_only_ready_writes_nothing() {
        let hs = HardState {
            term: 1,
            vote: 1,
            commit: 3,
        };
        assert!(ready_records(None, &[], Some(&hs), Durability::NoSync, 3).is_empty());
        let records = ready_records(None, &[], Some(&hs), Durability::Sync, 3);
        assert_eq!(records.len(), 1);
        assert_eq!(
            (records[0].kind, records[0].index),
            (WAL_KIND_HARD_STATE, 3)
        );
    }

    #[test]
    fn replay_takes_the_last_write_of_each_index_and_clamps_commit() {
        let mut written = Vec::new();
        let hs = |term, commit| HardState {
            term,
            vote: 1,
            commit,
        };
        written.extend(ready_records(
            None,
            &[entry(2, 1), entry(3, 1), entry(4, 1)],
            Some(&hs(1, 3)),
            Durability::Sync,
            1,
        ));
        // A new leader overwrote index 4 onward; its hard state claims a commit we never got.
        written.extend(ready_records(
            None,
            &[entry(4, 2)],
            Some(&hs(2, 9)),
            Durability::Sync,
            4,
        ));
        let mut storage = MemStorage::new_with_voters(&[1]);
        replay(&mut storage, written).expect("a well-formed WAL replays");
        assert_eq!(storage.last_index(), 4);
        assert_eq!(storage.term(4).expect("index 4 is in the log"), 2);
        assert_eq!(storage.term(3).expect("index 3 is in the log"), 1);
        let recovered = storage.hard_state();
        assert_eq!((recovered.term, recovered.commit), (2, 4));
    }

    #[test]
    fn a_gap_after_the_checkpoint_refuses_to_start() {
        let records = ready_records(None, &[entry(5, 1)], None, Durability::Sync, 4);
        let mut storage = MemStorage::new_with_voters(&[1]);
        let err = replay(&mut storage, records).expect_err("index 2..4 are missing");
        let message = err.to_string();
        // Found by the soak (seed 8255203): the newest checkpoint, a leader's snapshot behind
        // which the WAL had been released, rotted; the older one was taken, and the refusal
        // said only "a gap". It names what is wrong: the checkpoint the WAL needs.
        assert!(
            message.contains("a gap")
                && message.contains("at index 4 or later")
                && message.contains("checkpoint file is missing or damaged"),
            "{message}"
        );
    }
}
