//! The value-log writer: the member's sealed segments written to `<data-dir>/vlog/` by one task
//! on the raft core's executor, with O_DIRECT through io_uring (keel-io's `vlog`), made durable,
//! mapped, and reported back through a mailbox the raft loop polls with its other inputs. The
//! loop never waits for a segment: io_uring does the writing, and the kernel's fsync workers
//! the syncing, while the loop goes on proposing and applying.
//!
//! Segments are written one at a time, oldest first. A segment needs no ordering against the
//! WAL or against other segments: a checkpoint points only into segments already reported
//! durable, and WAL replay rebuilds anything newer. The queue is bounded in bytes: while more
//! than `limits::SEALED_BACKLOG_BYTES_MAX` waits (`Member::values_backlogged`), the member
//! takes no new proposals (its own or forwarded ones, as leader) and no new entries (as
//! follower). The two mailboxes are sized for the segments that bound allows, with an
//! overflow list for the rare burst of small segments past it.
//!
//! A write that fails stops the raft core (and the process), as a failed WAL write does; a
//! failed fdatasync aborts inside keel-io.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use keel_kv as kv;

use crate::error::CoreError;
use crate::rt::{self, Mailbox};

/// Segments queued to the writer task, and completions queued back.
const SEGMENTS_QUEUED_MAX: usize = 256;

/// A segment made durable and mapped.
pub struct Durable {
    pub id: u32,
    /// Its record bytes, as sealed.
    pub bytes: u64,
    pub file: Bytes,
}

pub struct VlogWriter {
    dir: PathBuf,
    todo: Arc<Mailbox<kv::SealedSegment>>,
    /// Segments that did not fit in `todo`; moved there as it drains.
    overflow: VecDeque<kv::SealedSegment>,
    done: Arc<Mailbox<Result<Durable, CoreError>>>,
}

impl VlogWriter {
    /// Starts the writer task on the current (raft core's) executor, writing into `dir`.
    pub fn start(dir: PathBuf) -> VlogWriter {
        let todo: Arc<Mailbox<kv::SealedSegment>> = Mailbox::new(SEGMENTS_QUEUED_MAX);
        let done = Mailbox::new(SEGMENTS_QUEUED_MAX);
        let (task_todo, task_done, task_dir) = (todo.clone(), done.clone(), dir.clone());
        rt::spawn_local(async move {
            loop {
                task_todo.ready().await;
                if task_todo.is_closed() && task_todo.is_empty() {
                    return;
                }
                while let Some(segment) = task_todo.try_recv() {
                    let mut outcome = write(&task_dir, segment).await;
                    // The loop drains completions before it hands over more segments, and at
                    // most SEGMENTS_QUEUED_MAX are queued, so this waits only briefly if ever.
                    while let Err(back) = task_done.try_send(outcome) {
                        outcome = back;
                        if task_done.is_closed() {
                            return;
                        }
                        rt::sleep(std::time::Duration::from_millis(1)).await;
                    }
                }
            }
        });
        VlogWriter {
            dir,
            todo,
            overflow: VecDeque::new(),
            done,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Queues sealed segments, oldest first.
    pub fn submit(&mut self, segments: Vec<kv::SealedSegment>) {
        self.overflow.extend(segments);
        self.refill();
    }

    fn refill(&mut self) {
        while let Some(segment) = self.overflow.pop_front() {
            if let Err(back) = self.todo.try_send(segment) {
                self.overflow.push_front(back);
                break;
            }
        }
    }

    /// A finished segment, if any.
    pub fn try_take(&mut self) -> Option<Result<Durable, CoreError>> {
        let outcome = self.done.try_recv();
        self.refill();
        outcome
    }

    pub fn has_outcome(&self) -> bool {
        !self.done.is_empty()
    }

    /// The completions mailbox, to wait on beside the loop's other inputs.
    pub fn outcomes(&self) -> Arc<Mailbox<Result<Durable, CoreError>>> {
        self.done.clone()
    }
}

impl Drop for VlogWriter {
    fn drop(&mut self) {
        self.todo.close();
        self.done.close();
    }
}

async fn write(dir: &Path, segment: kv::SealedSegment) -> Result<Durable, CoreError> {
    let kv::SealedSegment { id, records, bytes } = segment;
    let path = keel_io::vlog::segment_path(dir, id);
    let failed = |source: std::io::Error| CoreError::DataDir {
        path: path.clone(),
        source,
    };
    keel_io::vlog::write_segment(dir, id, std::slice::from_ref(&records), bytes)
        .await
        .map_err(failed)?;
    drop(records);
    let file = keel_io::vlog::map_file(&path).map_err(failed)?;
    Ok(Durable { id, bytes, file })
}

/// Maps segment `id` of `dir`; the error names the file (restores and snapshots report it).
pub fn map_segment(dir: &Path, id: u32) -> Result<Bytes, String> {
    let path = keel_io::vlog::segment_path(dir, id);
    keel_io::vlog::map_file(&path).map_err(|e| format!("{}: {e}", path.display()))
}

/// At start: deletes every segment file in `dir` that none of `kept` (the segments the kept
/// checkpoints point into) names (see `unreferenced`). Returns the first free segment id.
pub fn remove_unreferenced(dir: &Path, kept: Option<&[u32]>) -> Result<u32, CoreError> {
    let data_dir_error = |source| CoreError::DataDir {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(data_dir_error)?;
    let present = keel_io::vlog::list_segments(dir).map_err(data_dir_error)?;
    let (gone, first_free) = unreferenced(&present, kept);
    for id in gone {
        let path = keel_io::vlog::segment_path(dir, id);
        std::fs::remove_file(&path).map_err(|source| CoreError::DataDir { path, source })?;
    }
    Ok(first_free)
}

/// Of the segment files `present` at start, those none of `kept` names, which go: files
/// written after the newest checkpoint (WAL replay writes their values again), half-written
/// ones, and dead ones a crash kept from being deleted. Also the first free segment id:
/// above every file that stays, and above every kept id, file or not (a kept checkpoint
/// naming a missing file must never find another segment's file under that name later).
///
/// `kept` is None when some checkpoint file could not be read: which segments it names is
/// not known, so every file stays. Deleting by the others' lists would destroy the values of
/// a damaged newest checkpoint that the WAL needs (the start then refuses, and stays unable
/// to start once the operator repairs the file). The simulation found this.
pub fn unreferenced(present: &[u32], kept: Option<&[u32]>) -> (Vec<u32>, u32) {
    let mut first_free = kept
        .unwrap_or_default()
        .iter()
        .map(|id| id + 1)
        .max()
        .unwrap_or(0);
    let mut gone = Vec::new();
    for &id in present {
        if kept.is_none_or(|kept| kept.contains(&id)) {
            first_free = first_free.max(id + 1);
        } else {
            gone.push(id);
        }
    }
    (gone, first_free)
}

/// The ids of the dead segments in `dead` whose files may go once the checkpoint at `index` is
/// taken and the checkpoints before `remove_before` go (0: it keeps none before it). A
/// segment that died before the oldest kept checkpoint was captured is in none of them. The
/// rest stay in `dead`, waiting for a later checkpoint.
pub fn released_by_checkpoint(
    dead: &mut Vec<kv::DeadSegment>,
    index: u64,
    remove_before: u64,
) -> Vec<u32> {
    let oldest_kept = if remove_before == 0 {
        index
    } else {
        remove_before
    };
    let (gone, waiting): (Vec<_>, Vec<_>) = std::mem::take(dead)
        .into_iter()
        .partition(|d| d.died_at_index < oldest_kept);
    *dead = waiting;
    gone.into_iter().map(|d| d.id).collect()
}

/// Deletes the files of dead segments (on a thread beside the raft CPU: thousands of unlinks
/// must not stall the loop). A file already gone is fine: a segment sealed and dropped before
/// it was written has none.
pub fn remove_dead(dir: PathBuf, ids: Vec<u32>) {
    if ids.is_empty() {
        return;
    }
    rt::spawn_local(async move {
        rt::on_thread("keel-vlog-gc", move || {
            for id in ids {
                let path = keel_io::vlog::segment_path(&dir, id);
                if let Err(e) = std::fs::remove_file(&path) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(path = %path.display(), error = %e, "cannot delete a dead value-log segment");
                    }
                }
            }
        })
        .await;
    });
}

#[cfg(test)]
mod tests {
    use super::unreferenced;

    #[test]
    fn files_no_kept_checkpoint_names_go_and_new_ids_start_above_what_stays() {
        // 7 is named but missing (a crash before its file was written): no file may take
        // its name later. 9 is named by no checkpoint: it goes.
        assert_eq!(unreferenced(&[2, 3, 9], Some(&[2, 3, 7])), (vec![9], 8));
        assert_eq!(unreferenced(&[4, 5], Some(&[])), (vec![4, 5], 0));
        assert_eq!(unreferenced(&[], Some(&[1])), (vec![], 2));
    }

    #[test]
    fn a_dead_segment_goes_once_the_oldest_kept_checkpoint_was_taken_after_it_died() {
        let dead = |id, died_at_index| keel_kv::DeadSegment { id, died_at_index };
        let mut waiting = vec![dead(1, 10), dead(2, 20), dead(3, 30)];
        // Checkpoint 25 taken, those before 15 removed: 15 is the oldest kept, and segment
        // 2, dead at 20, is still in it.
        assert_eq!(super::released_by_checkpoint(&mut waiting, 25, 15), vec![1]);
        assert_eq!(waiting, vec![dead(2, 20), dead(3, 30)]);
        // A checkpoint that keeps none before it: only what died before it goes.
        assert_eq!(super::released_by_checkpoint(&mut waiting, 30, 0), vec![2]);
        assert_eq!(waiting, vec![dead(3, 30)]);
    }

    #[test]
    fn a_checkpoint_that_cannot_be_read_keeps_every_file() {
        // Which segments it names is not known: all stay, new ids go above them all.
        assert_eq!(unreferenced(&[2, 3, 9], None), (vec![], 10));
        assert_eq!(unreferenced(&[], None), (vec![], 0));
    }
}
