//! The checkpoint writer: one plain thread, off the raft core's CPU, that serializes the store
//! image of a `CheckpointRequest`, encodes the checkpoint file and writes it durably (write,
//! fsync, rename, fsync the directory). The raft loop hands it a request and goes on
//! proposing, appending and applying; it learns of the outcome from a mailbox it polls with its
//! other inputs, never by waiting (except at stop, when the loop is finishing anyway).
//!
//! Serializing a large store takes seconds (about 6 s for 1 GB here). Done on the raft core,
//! or on glommio's blocking pool, which is pinned to the same CPU, and awaited, it stopped
//! every request for that long (issue #10).
//!
//! Architecture invariant: at most one checkpoint is being written (the member keeps one in
//! flight), so both queues hold one item and never refuse.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use keel_raft::ConfState;

use crate::checkpoint;
use crate::error::CoreError;
use crate::ids::write_durably_parts;
use crate::member::CheckpointRequest;
use crate::rt::{self, Mailbox};

/// Requests queued to the writer, and outcomes queued back: one checkpoint is in flight at most.
const CHECKPOINTS_IN_FLIGHT_MAX: usize = 1;

/// What became of one request.
pub enum Written {
    /// The file for `index` is durable.
    Durable {
        index: u64,
        conf_state: ConfState,
        /// The durable file, mapped read-only: raft keeps it as the snapshot it sends a
        /// follower, and its pages take memory only while something reads them (a snapshot
        /// being sent), never for the time between checkpoints as a heap copy would.
        file: Bytes,
        /// A delta's base (the index of the full checkpoint it needs); None: written full.
        delta_of: Option<u64>,
        /// Serializing the image and encoding the file.
        serialize_elapsed: Duration,
        /// The whole job: serializing, encoding and the durable write.
        elapsed: Duration,
    },
    /// The image could not be taken: a compaction started after the capture and trimmed what
    /// it read. Nothing was written; the member captures afresh.
    Raced { index: u64 },
}

/// The raft core's handle on the writer thread. Dropping it ends the thread once the job it is
/// on (if any) is done: the file is then complete or absent, as after any crash.
pub struct CheckpointWriter {
    jobs: mpsc::SyncSender<CheckpointRequest>,
    done: Arc<Mailbox<Result<Written, CoreError>>>,
}

impl CheckpointWriter {
    /// Starts the thread, which writes files into `snap_dir`, on the CPUs beside the caller's
    /// (the raft core's pinned CPU): see `rt::spawn_beside`.
    pub fn start(snap_dir: PathBuf) -> Result<CheckpointWriter, CoreError> {
        let (jobs, jobs_rx) = mpsc::sync_channel::<CheckpointRequest>(CHECKPOINTS_IN_FLIGHT_MAX);
        let done = Mailbox::new(CHECKPOINTS_IN_FLIGHT_MAX);
        let done_tx = done.clone();
        rt::spawn_beside("keel-checkpoint", move || {
            // Ends when the raft core drops its handle.
            while let Ok(req) = jobs_rx.recv() {
                let index = req.index;
                let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| write(&snap_dir, req)))
                    .unwrap_or_else(|_| {
                        // The panic itself is already printed; the raft core stops on this.
                        Err(CoreError::Executor(format!(
                            "the checkpoint writer panicked writing checkpoint {index}"
                        )))
                    });
                // A checkpoint allocates and frees several copies of the index's size on this
                // thread; mimalloc would keep those pages for reuse, and a member at rest
                // would hold them (at 4M keys, about 1 GB more). Give them back now.
                rt::release_freed_memory();
                if done_tx.try_send(outcome).is_err() {
                    panic!("the outcome mailbox has room: one checkpoint is in flight at most");
                }
            }
        })
        .map_err(|e| CoreError::Executor(format!("cannot start the checkpoint writer: {e}")))?;
        Ok(CheckpointWriter { jobs, done })
    }

    /// Hands `req` to the writer without waiting. The caller has taken the outcome of the
    /// previous request (the member keeps one in flight), so the queue has room.
    pub fn submit(&self, req: CheckpointRequest) -> Result<(), CoreError> {
        assert!(self.done.is_empty(), "the previous outcome was taken first");
        match self.jobs.try_send(req) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Full(_)) => {
                panic!("the writer's queue has room: one checkpoint is in flight at most")
            }
            Err(mpsc::TrySendError::Disconnected(_)) => Err(CoreError::Executor(
                "the checkpoint writer thread has ended".into(),
            )),
        }
    }

    /// The outcome of the request in flight, if the writer has finished it.
    pub fn try_take(&self) -> Option<Result<Written, CoreError>> {
        self.done.try_recv()
    }

    /// Whether an outcome waits to be taken.
    pub fn has_outcome(&self) -> bool {
        !self.done.is_empty()
    }

    /// The outcomes mailbox, for a loop that waits on it among its other inputs.
    pub fn outcomes(&self) -> Arc<Mailbox<Result<Written, CoreError>>> {
        self.done.clone()
    }

    /// Waits for the outcome of the request in flight (at stop only: the loop waits on it).
    pub async fn wait(&self) -> Result<Written, CoreError> {
        loop {
            if let Some(outcome) = self.done.try_recv() {
                return outcome;
            }
            self.done.ready().await;
        }
    }
}

/// The writer's job: serialize, encode, write durably. Runs on the writer thread.
fn write(snap_dir: &std::path::Path, req: CheckpointRequest) -> Result<Written, CoreError> {
    let started = Instant::now();
    let index = req.index;
    // Against the request's base, the image may be a delta: only the keys changed since.
    let Ok(kv_image) = req.source.serialize_parts_against(req.base.as_ref()) else {
        return Ok(Written::Raced { index });
    };
    let delta_of = kv_image.delta_of();
    // Written from where rkyv put the archive: the file is never one buffer in memory (at 4M
    // keys the image is 416 MB, and framing it, then the file around it, made two copies).
    let [image_header, archive] = kv_image.parts();
    let framing = req.encode_around(&[image_header, archive]);
    let serialize_elapsed = started.elapsed();
    let path = snap_dir.join(checkpoint::file_name(index));
    let file_bytes = framing.prefix.len() + image_header.len() + archive.len() + framing.crc.len();
    // A failed write or fsync is returned, and the raft core stops on it: never retry an fsync.
    write_durably_parts(
        snap_dir,
        &path,
        &[&framing.prefix, image_header, archive, &framing.crc],
    )?;
    // The heap copy goes here, on this thread, not on the raft core.
    drop(kv_image);
    let file = keel_io::vlog::map_file(&path).map_err(|source| CoreError::DataDir {
        path: path.clone(),
        source,
    })?;
    assert_eq!(
        file.len(),
        file_bytes,
        "the mapping is the whole durable file"
    );
    Ok(Written::Durable {
        index,
        conf_state: req.conf_state,
        file,
        delta_of,
        serialize_elapsed,
        elapsed: started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alarms::Alarms;
    use crate::member::{Member, MemberConfig};
    use keel_kv as kv;
    use keel_raft::{MemStorage, RawNode};

    /// A lone voter that applied a few writes, as `raftcore::open` builds one and it then runs.
    fn member_with_writes() -> Member {
        let storage = MemStorage::new_with_voters(&[1]);
        let mut rc = keel_raft::Config::new(1);
        rc.applied = 1;
        let node = RawNode::new(&rc, storage).expect("a valid raft configuration");
        let (writer, _reader) = kv::Store::new();
        let config = MemberConfig {
            id: 1,
            name: "one".into(),
            advertise_client_urls: vec![],
            request_timeout_ms: 1_000,
            tick_ms: 100,
            snapshot_count: 10_000,
            stats: Arc::default(),
            auth_token_ttl_ms: 300_000,
            sealed_backlog_bytes_max: crate::limits::SEALED_BACKLOG_BYTES_MAX,
            watch_events_per_apply_max: crate::limits::WATCH_EVENTS_PER_APPLY_MAX,
            apply_keys_per_step: crate::limits::APPLY_KEYS_PER_STEP,
            ids_first: 1,
            values_resident: |_| Some(true),
            install_helpers: crate::member::InstallHelpers::NONE,
            strict_reconfig_check: true,
            published_auth: std::sync::Arc::default(),
        };
        let members = vec![crate::ids::Member {
            id: 1,
            name: "one".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec![],
            is_learner: false,
        }];
        let mut m = Member::new(config, node, writer, members, Alarms::default(), 1);
        m.start(0);
        while let Some(_io) = m.ready(0) {
            m.persisted(0).expect("nothing to install");
        }
        assert!(m.is_leader(), "a lone voter leads at once");
        m
    }

    #[test]
    fn the_writer_thread_writes_a_checkpoint_that_loads_and_reports_it() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut m = member_with_writes();
        let writer = CheckpointWriter::start(dir.path().to_path_buf()).expect("thread starts");
        let req = m
            .checkpoint_request()
            .expect("term known")
            .expect("the leader's empty entry was applied");
        let index = req.index;
        writer.submit(req).expect("the thread runs");
        let outcome = futures_lite::future::block_on(writer.wait()).expect("written");
        let Written::Durable {
            index: got, file, ..
        } = outcome
        else {
            panic!("no compaction ran, so none raced the image");
        };
        assert_eq!(got, index);
        assert!(!writer.has_outcome());
        let loaded = checkpoint::load_newest(dir.path())
            .expect("the directory reads")
            .expect("the file is there");
        assert_eq!(loaded.checkpoint.meta.index, index);
        assert_eq!(
            loaded.file.bytes(),
            &file,
            "the loaded mapping is the same file"
        );
        let on_disk = std::fs::read(dir.path().join(checkpoint::file_name(index))).expect("read");
        assert_eq!(
            on_disk,
            &file[..],
            "the reported bytes are the durable file"
        );
    }
}
