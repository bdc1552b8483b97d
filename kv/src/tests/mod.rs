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
