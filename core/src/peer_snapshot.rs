//! Raft snapshots between members, streamed in chunks over a connection of their own.
//!
//! A leader's snapshot is its newest checkpoint file, whose store image points into the
//! leader's value-log segments. The leader sends both as they lie on disk: the file, then every
//! segment file it names, each cut into chunks of at most `limits::SNAPSHOT_CHUNK_BYTES`, and
//! last the raft message itself with its data left empty. The stream runs on its own
//! connection (dialed like any other, handshake and TLS included), so heartbeats and appends
//! never queue behind gigabytes, and nothing in it has a size limit: memory on each side is a
//! few chunks. Segment files are read on a thread beside the raft CPU.
//!
//! The receiver writes every part into `<data-dir>/snap/incoming/<index>-<from>-<stream>/` as
//! it comes, on a writer thread of the stream's own a few chunks behind the connection,
//! syncing each file once whole: the segments, and the checkpoint file too (paced, then
//! mapped). Only when the raft message arrives, with every part complete, is the staging
//! directory synced and the message handed to raft with the mapped file as its data. The
//! driver then stores the segments under this member's own ids ([`place`]), above every id of
//! its stores. Where no id moves (a member that never had a segment file, such as one just
//! added, or one whose ids all lie below the leader's), the staged checkpoint file is moved
//! into place as it is; otherwise its store image gets a header whose segment id shift names
//! the raised ids ([`IdShift`]: 40 bytes and the file's crc written over it, then a sync), and
//! it is moved into place. Either way it is never written again. Such a file goes out to
//! another member in the plain format, its ids written into a copy ([`write_snapshot`]).
//!
//! The receiver answers with one frame once the message is in raft's inbox, and only then does
//! the leader report the snapshot sent: reported as soon as it was written, raft would probe
//! the follower before the follower had stepped it, hear that its log is still empty, and send
//! the whole snapshot again.
//!
//! A delta checkpoint (an incremental one) needs the full checkpoint it names, its base: the
//! leader sends the base's file after the delta's, and the segments both name. The receiver
//! writes the base beside the delta, renamed alike.
//!
//! A dropped connection, a chunk out of order or a file that cannot be read fails the stream:
//! the leader reports the snapshot failed, raft sends a new one later from the start, and the
//! receiver deletes what it staged. A start deletes every staging directory.
//!
//! Frames (after the usual length prefix and kind byte; integers big-endian):
//! begin: raft index u64, checkpoint file bytes u64;
//! chunk: part u8 (0: the checkpoint file, 1: a segment file, 2: a delta's base checkpoint
//! file), segment id u32 (0 for the other parts), offset u64,
//! the whole file's bytes u64, then the chunk's bytes;
//! ack (receiver to sender): raft index u64.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures_lite::io::AsyncWriteExt;
use futures_lite::StreamExt;
use keel_kv as kv;

use crate::checkpoint;
use crate::error::CoreError;
use crate::member::PlacedSnapshot;
use crate::rt;
use crate::vlog_writer;

pub const FRAME_SNAPSHOT_BEGIN: u8 = 8;
pub const FRAME_SNAPSHOT_CHUNK: u8 = 9;
/// The receiver's answer on a snapshot stream (the one frame it writes back): the snapshot at
/// this raft index is durable in staging and its message is in raft's inbox.
pub const FRAME_SNAPSHOT_ACK: u8 = 10;
/// A begin frame's body.
pub const BEGIN_BYTES: usize = 8 + 8;
/// A chunk frame's header, after its kind byte.
pub const CHUNK_HEADER_BYTES: usize = 1 + 4 + 8 + 8;
/// The staging directory's name under `<data-dir>/snap`.
pub const STAGING_DIR: &str = "incoming";
/// How long one chunk may take to go out before the stream is given up: a peer that stopped
/// reading must not keep raft waiting for the snapshot's outcome forever.
const CHUNK_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the sender waits for the receiver's answer after the last frame: the receiver
/// checks the checkpoint file against the segments (a pass over the file, about a second per
/// 400 MB here) and syncs the staging before it answers.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(120);
/// Chunks read ahead of the socket on the sender.
const READ_AHEAD_CHUNKS: usize = 2;

const PART_CHECKPOINT: u8 = 0;
const PART_SEGMENT: u8 = 1;
const PART_BASE: u8 = 2;

/// Which file a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Checkpoint,
    Segment(u32),
    /// A delta checkpoint's base: the full checkpoint file it names.
    Base,
}

/// A chunk's place in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub part: Part,
    pub offset: u64,
    pub file_bytes: u64,
}

/// The begin frame, length prefix included.
pub fn encode_begin(index: u64, checkpoint_bytes: u64) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4 + 1 + BEGIN_BYTES);
    buf.extend_from_slice(&(1 + BEGIN_BYTES as u32).to_be_bytes());
    buf.push(FRAME_SNAPSHOT_BEGIN);
    buf.extend_from_slice(&index.to_be_bytes());
    buf.extend_from_slice(&checkpoint_bytes.to_be_bytes());
    buf
}

/// A chunk frame's length prefix, kind and header, for `body_bytes` of chunk after it.
pub fn encode_chunk_header(h: ChunkHeader, body_bytes: usize) -> Vec<u8> {
    let frame_bytes = 1 + CHUNK_HEADER_BYTES + body_bytes;
    let mut buf = Vec::with_capacity(4 + 1 + CHUNK_HEADER_BYTES);
    buf.extend_from_slice(
        &u32::try_from(frame_bytes)
            .expect("chunks are far below 4 GiB")
            .to_be_bytes(),
    );
    buf.push(FRAME_SNAPSHOT_CHUNK);
    let (part, segment) = match h.part {
        Part::Checkpoint => (PART_CHECKPOINT, 0),
        Part::Segment(id) => (PART_SEGMENT, id),
        Part::Base => (PART_BASE, 0),
    };
    buf.push(part);
    buf.extend_from_slice(&segment.to_be_bytes());
    buf.extend_from_slice(&h.offset.to_be_bytes());
    buf.extend_from_slice(&h.file_bytes.to_be_bytes());
    buf
}

/// The ack frame, length prefix included.
pub fn encode_ack(index: u64) -> Vec<u8> {
    let mut buf = Vec::with_capacity(4 + 1 + 8);
    buf.extend_from_slice(&9u32.to_be_bytes());
    buf.push(FRAME_SNAPSHOT_ACK);
    buf.extend_from_slice(&index.to_be_bytes());
    buf
}

/// An ack frame's body: the raft index it answers for.
pub fn parse_ack(body: &[u8]) -> io::Result<u64> {
    let bytes: [u8; 8] = body
        .try_into()
        .map_err(|_| io::Error::other("malformed snapshot ack frame"))?;
    Ok(u64::from_be_bytes(bytes))
}

/// A begin frame's body: `(raft index, checkpoint file bytes)`.
pub fn parse_begin(body: &[u8]) -> io::Result<(u64, u64)> {
    if body.len() != BEGIN_BYTES {
        return Err(io::Error::other("malformed snapshot begin frame"));
    }
    let u64_at = |o: usize| u64::from_be_bytes(body[o..o + 8].try_into().expect("8 bytes"));
    Ok((u64_at(0), u64_at(8)))
}

/// A chunk frame's header (its body after the kind byte; the chunk's bytes follow it).
pub fn parse_chunk_header(body: &[u8]) -> io::Result<ChunkHeader> {
    let bad = |why: &str| io::Error::other(format!("malformed snapshot chunk: {why}"));
    if body.len() < CHUNK_HEADER_BYTES {
        return Err(bad("shorter than its header"));
    }
    let segment = u32::from_be_bytes(body[1..5].try_into().expect("4 bytes"));
    let part = match body[0] {
        PART_CHECKPOINT if segment == 0 => Part::Checkpoint,
        PART_BASE if segment == 0 => Part::Base,
        PART_SEGMENT if segment < kv::SEGMENT_NONE - 1 => Part::Segment(segment),
        _ => return Err(bad("unknown part")),
    };
    let offset = u64::from_be_bytes(body[5..13].try_into().expect("8 bytes"));
    let file_bytes = u64::from_be_bytes(body[13..21].try_into().expect("8 bytes"));
    let len = (body.len() - CHUNK_HEADER_BYTES) as u64;
    if offset.checked_add(len).is_none_or(|end| end > file_bytes) {
        return Err(bad("past the end of its file"));
    }
    Ok(ChunkHeader {
        part,
        offset,
        file_bytes,
    })
}

/// A checkpoint file as it goes out: as it is, unless its store image has a segment id shift
/// (a leader's snapshot this member stored under raised ids, see `IdShift`). A build that
/// predates the shift refuses such a file, so the ids are written into a copy's archive and
/// the copy's crc mended (`kv::without_segment_shift_in`); the rest of the file goes byte for
/// byte. The copy costs the file's size in memory while the snapshot goes out, and only until
/// this member writes a full checkpoint of its own. (A delta of its own over such a base has
/// no shift: only the base is copied.)
fn as_sent(file: &Bytes) -> io::Result<Bytes> {
    let cp = checkpoint::decode_shared(file).map_err(io::Error::other)?;
    let image_at = checkpoint::image_offset(file, &cp);
    let plain = kv::without_segment_shift_in(file, image_at..image_at + cp.kv_image.len(), |all| {
        let crc_at = all.len() - 4;
        let crc = crc32fast::hash(&all[..crc_at]);
        all[crc_at..].copy_from_slice(&crc.to_le_bytes());
    })
    .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(plain.unwrap_or_else(|| file.clone()))
}

/// The segments a checkpoint file points into, with those of its base for a delta (what goes
/// out beside it). Read in place: a leader's file is mapped and a received one is in memory,
/// and a copy would double either.
fn segments_of(data: &Bytes, base: Option<&Bytes>) -> io::Result<Vec<u32>> {
    let cp = checkpoint::decode_shared(data).map_err(io::Error::other)?;
    let mut ids =
        kv::checkpoint_segments(&cp.kv_image).map_err(|e| io::Error::other(e.to_string()))?;
    if let Some(base) = base {
        let base = checkpoint::decode_shared(base).map_err(io::Error::other)?;
        ids.extend(
            kv::checkpoint_segments(&base.kv_image).map_err(|e| io::Error::other(e.to_string()))?,
        );
        ids.sort_unstable();
        ids.dedup();
    }
    Ok(ids)
}

/// For a delta checkpoint file, the index of the base it names.
fn base_index_of(data: &Bytes) -> io::Result<Option<u64>> {
    let cp = checkpoint::decode_shared(data).map_err(io::Error::other)?;
    Ok(checkpoint::base_index(&cp))
}

/// Whether `base` is the full checkpoint file the delta `data` names.
fn is_base_of(data: &Bytes, base: &Bytes) -> io::Result<bool> {
    let (cp, base) = (
        checkpoint::decode_shared(data).map_err(io::Error::other)?,
        checkpoint::decode_shared(base).map_err(io::Error::other)?,
    );
    Ok(
        match (
            kv::checkpoint_kind(&cp.kv_image),
            kv::checkpoint_kind(&base.kv_image),
        ) {
            (Ok(kv::CheckpointKind::Delta(named)), Ok(kv::CheckpointKind::Full(full))) => {
                named == full && base.meta.index == named.applied_index()
            }
            _ => false,
        },
    )
}

/// Writes `w` after at most `CHUNK_WRITE_TIMEOUT`, or fails.
async fn write_timed<W: futures_lite::AsyncWrite + Unpin>(
    w: &mut W,
    bytes: &[u8],
) -> io::Result<()> {
    let write = async { Some(w.write_all(bytes).await) };
    let expired = async {
        rt::sleep(CHUNK_WRITE_TIMEOUT).await;
        None
    };
    futures_lite::future::or(write, expired)
        .await
        .unwrap_or_else(|| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer took no snapshot chunk for too long",
            ))
        })
}

/// Streams the snapshot at `index` whose checkpoint file is `data` (the leader's, pointing
/// into the segment files of `vlog_dir`; a delta's base is in `snap_dir`): the begin frame,
/// the file's chunks, a delta's base's, then each segment's. Returns the bytes written. The
/// caller sends the raft message after it.
pub async fn write_snapshot<W: futures_lite::AsyncWrite + Unpin>(
    w: &mut W,
    data: &Bytes,
    index: u64,
    (vlog_dir, snap_dir): (&Path, &Path),
    chunk_bytes: usize,
) -> io::Result<u64> {
    assert!(chunk_bytes > 0, "a chunk carries bytes");
    let (data, base, listed) = {
        let data = data.clone();
        let snap_dir = snap_dir.to_path_buf();
        rt::on_thread("keel-snapshot-out", move || {
            // Mapped now: a newer full checkpoint may unlink the file while this goes out.
            let base = match base_index_of(&data)? {
                None => None,
                Some(base_index) => {
                    let path = snap_dir.join(checkpoint::file_name(base_index));
                    let file = keel_io::vlog::map_file_to_read(&path).map_err(|e| {
                        io::Error::new(e.kind(), format!("{}: {e}", path.display()))
                    })?;
                    let base = file.bytes().clone();
                    if !is_base_of(&data, &base)? {
                        return Err(io::Error::other(format!(
                            "{} is not the base its delta names",
                            path.display()
                        )));
                    }
                    Some(base)
                }
            };
            let data = as_sent(&data)?;
            let base = base.as_ref().map(as_sent).transpose()?;
            let listed = segments_of(&data, base.as_ref())?;
            Ok::<_, io::Error>((data, base, listed))
        })
        .await?
    };
    let data = &data;
    let mut sent = 0u64;
    let begin = encode_begin(index, data.len() as u64);
    write_timed(w, &begin).await?;
    sent += begin.len() as u64;
    let files = [(Part::Checkpoint, Some(data)), (Part::Base, base.as_ref())];
    for (part, file) in files {
        let Some(file) = file else { continue };
        let file_bytes = file.len() as u64;
        for offset in (0..file.len()).step_by(chunk_bytes) {
            let body = file.slice(offset..(offset + chunk_bytes).min(file.len()));
            let header = ChunkHeader {
                part,
                offset: offset as u64,
                file_bytes,
            };
            let head = encode_chunk_header(header, body.len());
            write_timed(w, &head).await?;
            write_timed(w, &body).await?;
            sent += (head.len() + body.len()) as u64;
        }
    }
    // Segment files are read on a thread (a read may wait for the disk; the raft CPU must
    // not), a few chunks ahead of the socket.
    let (tx, mut rx) = futures_channel::mpsc::channel(READ_AHEAD_CHUNKS);
    let dir = vlog_dir.to_path_buf();
    rt::spawn_beside("keel-snapshot-read", move || {
        read_segments(&dir, &listed, chunk_bytes, tx)
    })?;
    while let Some(chunk) = rx.next().await {
        let (header, body) = chunk?;
        let head = encode_chunk_header(header, body.len());
        write_timed(w, &head).await?;
        write_timed(w, &body).await?;
        sent += (head.len() + body.len()) as u64;
    }
    Ok(sent)
}

type ChunkSender = futures_channel::mpsc::Sender<io::Result<(ChunkHeader, Vec<u8>)>>;

/// The sender's reading thread: every chunk of every listed segment file, in order, or the
/// first error. Stops when the stream is dropped.
fn read_segments(dir: &Path, listed: &[u32], chunk_bytes: usize, mut tx: ChunkSender) {
    use std::os::unix::fs::FileExt;
    let mut send = |item| futures_lite::future::block_on(send_chunk(&mut tx, item));
    for &id in listed {
        let path = keel_io::vlog::segment_path(dir, id);
        // A file deleted since the checkpoint was taken (its segment died, and a newer
        // checkpoint let it go) fails this stream; raft sends the newer snapshot next.
        let opened = std::fs::File::open(&path).and_then(|f| Ok((f.metadata()?.len(), f)));
        let (file_bytes, file) = match opened {
            Ok(f) => f,
            Err(e) => {
                let _ = send(Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                )));
                return;
            }
        };
        let mut offset = 0u64;
        // At least one chunk per file, so an empty file arrives too.
        while offset < file_bytes || offset == 0 {
            let len = (file_bytes - offset).min(chunk_bytes as u64) as usize;
            let mut buf = vec![0u8; len];
            if let Err(e) = file.read_exact_at(&mut buf, offset) {
                let _ = send(Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                )));
                return;
            }
            let header = ChunkHeader {
                part: Part::Segment(id),
                offset,
                file_bytes,
            };
            if !send(Ok((header, buf))) {
                return;
            }
            offset += len as u64;
            if file_bytes == 0 {
                break;
            }
        }
    }
}

/// Sends one item; false once the stream is gone.
async fn send_chunk<T>(tx: &mut futures_channel::mpsc::Sender<T>, item: T) -> bool {
    std::future::poll_fn(|cx| tx.poll_ready(cx)).await.is_ok() && tx.start_send(item).is_ok()
}

/// A snapshot fully received and durable in its staging directory.
#[derive(Debug)]
pub struct StagedSnapshot {
    pub from: u64,
    pub index: u64,
    pub dir: PathBuf,
    /// The segment files in `dir`, by the leader's ids, ascending: exactly those `data` names.
    pub segments: Vec<u32>,
    /// The checkpoint file, which the raft message carries on as its data (the same buffer:
    /// the driver finds this staging by it): `dir/CHECKPOINT_FILE`, durable and mapped.
    pub data: Bytes,
    /// The mapping `data` is, for the driver to drop its pages once the store is restored.
    pub data_file: keel_io::vlog::MappedFile,
    /// For a delta, its base's checkpoint file (`dir/BASE_FILE`, durable and mapped).
    pub base: Option<Bytes>,
}

/// Chunks a stream's writer thread may have queued behind the one it writes: the connection
/// goes on reading frames while the thread writes and syncs (4 MiB at 1 MiB chunks).
const WRITE_AHEAD_CHUNKS: usize = 4;

/// Where one part of a snapshot is being received, and how much of it has come.
struct Receiving {
    path: PathBuf,
    written: u64,
    file_bytes: u64,
}

impl Receiving {
    fn new(path: PathBuf, file_bytes: u64) -> Receiving {
        Receiving {
            path,
            written: 0,
            file_bytes,
        }
    }

    fn complete(&self) -> bool {
        self.written == self.file_bytes
    }
}

/// What a stream's writer thread is asked to do, in the order the chunks came.
enum WriteJob {
    /// Appends `frame[body_at..]` to the file at `path` (created first when `create`), and
    /// syncs it when `last`: its file is whole.
    Append {
        path: PathBuf,
        create: bool,
        frame: Vec<u8>,
        body_at: usize,
        last: bool,
    },
    /// Answers once every job before it is done: Ok, or the first failure.
    Flush(futures_channel::oneshot::Sender<io::Result<()>>),
}

/// The staged files' writer: one thread per stream, off the raft CPU, a few chunks behind
/// the connection. Files come one after another, so one is open at a time. A failure stops
/// the writes and is told at the next chunk; a failed fsync aborts the process.
///
/// The thread alone deletes the staging directory, when the stream's queue closes (the
/// `IncomingSnapshot` is dropped, however it ended) unless the snapshot was handed on
/// (`keep`): after its last write, so no deletion races a file it has yet to create, and
/// also when the stream was cut off in the middle of `finish`, or the thread panicked.
struct StagingWriter {
    jobs: futures_channel::mpsc::Sender<WriteJob>,
    shared: std::sync::Arc<WriterShared>,
}

/// What a stream's writer thread and its connection share.
#[derive(Default)]
struct WriterShared {
    /// The first write that failed, for the next chunk to tell (taken: told once).
    failed: std::sync::Mutex<Option<io::Error>>,
    /// The snapshot was handed on: the staging directory is the driver's now.
    kept: std::sync::atomic::AtomicBool,
    /// The stream ended without being handed on: queued writes are skipped.
    abandoned: std::sync::atomic::AtomicBool,
}

impl StagingWriter {
    /// Starts the thread, which owns the deletion of `dir` (see above).
    fn start(dir: PathBuf) -> io::Result<StagingWriter> {
        // A channel holds its buffer plus one slot per sender: one sender here.
        let (jobs, rx) = futures_channel::mpsc::channel(WRITE_AHEAD_CHUNKS - 1);
        let shared = std::sync::Arc::new(WriterShared::default());
        let thread_shared = shared.clone();
        rt::spawn_beside("keel-snapshot-in", move || {
            let wrote = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                write_staged(rx, &thread_shared)
            }));
            if !thread_shared
                .kept
                .load(std::sync::atomic::Ordering::Acquire)
            {
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    if e.kind() != io::ErrorKind::NotFound {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot delete a staged snapshot");
                    }
                }
            }
            if let Err(panic) = wrote {
                std::panic::resume_unwind(panic);
            }
        })?;
        Ok(StagingWriter { jobs, shared })
    }

    /// The failure the thread met, if any (taken: told once).
    fn failure(&self) -> Option<io::Error> {
        self.shared
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// The snapshot is handed on: the thread leaves the staging directory alone. Set before
    /// the queue closes, so the thread sees it when it does.
    fn keep(&self) {
        self.shared
            .kept
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The stream ended without being handed on: writes still queued are skipped.
    fn abandon(&self) {
        self.shared
            .abandoned
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Queues one chunk of `part`, waiting while the queue is full.
    async fn append(
        &mut self,
        part: &mut Receiving,
        (offset, file_bytes): (u64, u64),
        frame: Vec<u8>,
        body_at: usize,
    ) -> io::Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let len = (frame.len() - body_at) as u64;
        // A chunk past its file's announced end (which `parse_chunk_header` refuses too) must
        // never grow a file on the disk the WAL shares.
        if offset != part.written || file_bytes != part.file_bytes || len > file_bytes - offset {
            return Err(protocol("chunk out of order"));
        }
        let job = WriteJob::Append {
            path: part.path.clone(),
            create: part.written == 0,
            frame,
            body_at,
            last: part.written + len == part.file_bytes,
        };
        futures_lite::future::poll_fn(|cx| self.jobs.poll_ready(cx))
            .await
            .and_then(|()| self.jobs.start_send(job))
            .map_err(|_| io::Error::other("the snapshot writer thread has ended"))?;
        part.written += len;
        Ok(())
    }

    /// Waits until every queued chunk is written, and each whole file synced.
    async fn flush(&mut self) -> io::Result<()> {
        let (tx, rx) = futures_channel::oneshot::channel();
        futures_lite::future::poll_fn(|cx| self.jobs.poll_ready(cx))
            .await
            .and_then(|()| self.jobs.start_send(WriteJob::Flush(tx)))
            .map_err(|_| io::Error::other("the snapshot writer thread has ended"))?;
        rx.await
            .map_err(|_| io::Error::other("the snapshot writer thread has ended"))?
    }
}

/// The writer thread's loop (see `StagingWriter`): until the queue closes.
fn write_staged(mut jobs: futures_channel::mpsc::Receiver<WriteJob>, shared: &WriterShared) {
    let mut open: Option<keel_io::pages::PacedWriter<std::fs::File>> = None;
    let mut first_failure: Option<io::Error> = None;
    while let Some(job) = futures_lite::future::block_on(jobs.next()) {
        match job {
            WriteJob::Append {
                path,
                create,
                frame,
                body_at,
                last,
            } => {
                if first_failure.is_some()
                    || shared.abandoned.load(std::sync::atomic::Ordering::Acquire)
                {
                    continue;
                }
                let written = (|| {
                    if create {
                        open = Some(keel_io::pages::PacedWriter::new(std::fs::File::create(
                            &path,
                        )?));
                    }
                    let file = open
                        .as_mut()
                        .ok_or_else(|| io::Error::other("a chunk for a file never created"))?;
                    file.append(&frame[body_at..])?;
                    if last {
                        sync_or_abort(file.file(), &path);
                        open = None;
                    }
                    Ok::<_, io::Error>(())
                })();
                if let Err(e) = written {
                    let e = io::Error::new(e.kind(), format!("{}: {e}", path.display()));
                    *shared
                        .failed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Some(io::Error::new(e.kind(), e.to_string()));
                    first_failure = Some(e);
                }
            }
            WriteJob::Flush(reply) => {
                let _ = reply.send(first_failure.take().map_or(Ok(()), Err));
            }
        }
    }
}

/// The staged checkpoint file's name in its staging directory.
const CHECKPOINT_FILE: &str = "checkpoint";
/// A delta's base file's name in its staging directory.
const BASE_FILE: &str = "base";

/// A snapshot being received on one connection. Every part goes to a file in the staging
/// directory as it comes, the checkpoint file too: held in memory until installed, it was a
/// copy as large as the index (416 MB at 4M keys) on a member that also builds its index
/// from it, and writing it then held up the raft loop.
pub struct IncomingSnapshot {
    from: u64,
    index: u64,
    dir: PathBuf,
    writer: StagingWriter,
    checkpoint: Receiving,
    /// A delta's base, from its first chunk.
    base: Option<Receiving>,
    /// The segment being received, by the leader's id.
    open: Option<(u32, Receiving)>,
    segments: Vec<u32>,
    /// Set once handed on: the staging directory is then the driver's.
    finished: bool,
}

fn protocol(why: &str) -> io::Error {
    io::Error::other(format!("snapshot stream: {why}"))
}

impl IncomingSnapshot {
    /// Starts receiving the snapshot at `index` from `from` into a fresh staging directory
    /// under `staging_root`, named by `stream` (unique among this process's streams: a
    /// snapshot sent again never touches the staging of an earlier copy).
    pub async fn begin(
        staging_root: &Path,
        stream: u64,
        from: u64,
        index: u64,
        checkpoint_bytes: u64,
    ) -> io::Result<IncomingSnapshot> {
        if checkpoint_bytes == 0 {
            return Err(protocol("an empty checkpoint file"));
        }
        let dir = staging_root.join(format!("{index:016x}-{from:016x}-{stream}"));
        let fresh = dir.clone();
        rt::on_thread("keel-snapshot-in", move || {
            match std::fs::remove_dir_all(&fresh) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            std::fs::create_dir_all(&fresh)
        })
        .await?;
        let writer = match StagingWriter::start(dir.clone()) {
            Ok(writer) => writer,
            Err(e) => {
                // No `IncomingSnapshot` yet, whose drop would delete the staging.
                remove_staged(vec![dir]);
                return Err(e);
            }
        };
        Ok(IncomingSnapshot {
            from,
            index,
            checkpoint: Receiving::new(dir.join(CHECKPOINT_FILE), checkpoint_bytes),
            dir,
            writer,
            base: None,
            open: None,
            segments: Vec::new(),
            finished: false,
        })
    }

    /// Takes one chunk: `frame[body_at..]` is its bytes. Chunks of a file come in order, files
    /// one after another, segments ascending. The chunk is written behind the connection, a
    /// few chunks at most; a write that failed fails a later chunk, or `finish`.
    pub async fn chunk(
        &mut self,
        h: ChunkHeader,
        frame: Vec<u8>,
        body_at: usize,
    ) -> io::Result<()> {
        let at = (h.offset, h.file_bytes);
        match h.part {
            Part::Checkpoint => {
                if self.checkpoint.complete() || self.open.is_some() || !self.segments.is_empty() {
                    return Err(protocol("checkpoint chunk out of order"));
                }
                self.writer
                    .append(&mut self.checkpoint, at, frame, body_at)
                    .await
            }
            Part::Base => {
                if !self.checkpoint.complete()
                    || self.open.is_some()
                    || !self.segments.is_empty()
                    || self.base.as_ref().is_some_and(Receiving::complete)
                {
                    return Err(protocol("base chunk out of order"));
                }
                let base = self
                    .base
                    .get_or_insert_with(|| Receiving::new(self.dir.join(BASE_FILE), h.file_bytes));
                self.writer.append(base, at, frame, body_at).await
            }
            Part::Segment(id) => {
                if !self.checkpoint.complete() || self.base.as_ref().is_some_and(|b| !b.complete())
                {
                    return Err(protocol("segment chunk before the whole checkpoint"));
                }
                let mut open = match self.open.take() {
                    Some((open_id, open)) if open_id == id => open,
                    Some(_) => return Err(protocol("segment chunk out of order")),
                    None => {
                        if self.segments.last().is_some_and(|last| *last >= id) || h.offset != 0 {
                            return Err(protocol("segment out of order"));
                        }
                        let path = keel_io::vlog::segment_path(&self.dir, id);
                        Receiving::new(path, h.file_bytes)
                    }
                };
                self.writer.append(&mut open, at, frame, body_at).await?;
                // An empty file is whole at its one chunk.
                if open.complete() {
                    self.segments.push(id);
                } else {
                    self.open = Some((id, open));
                }
                Ok(())
            }
        }
    }

    /// The raft message for snapshot `index` arrived: every part must be complete, and the
    /// segments received exactly those the checkpoint file names. Makes the staging directory
    /// durable and returns it with the checkpoint file, the message's data.
    pub async fn finish(mut self, index: u64) -> io::Result<StagedSnapshot> {
        if index != self.index
            || self.open.is_some()
            || !self.checkpoint.complete()
            || self.base.as_ref().is_some_and(|b| !b.complete())
        {
            return Err(protocol("the raft message came before the whole snapshot"));
        }
        // Every file whole on disk, and synced, before it is mapped.
        self.writer.flush().await?;
        let (dir, received) = (self.dir.clone(), self.segments.clone());
        let checkpoint_path = self.checkpoint.path.clone();
        let base_path = self.base.as_ref().map(|b| b.path.clone());
        let (data_file, base) = rt::on_thread("keel-snapshot-in", move || {
            let map = |path: &Path| {
                keel_io::vlog::map_file_to_read(path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
            };
            let data_file = map(&checkpoint_path)?;
            let base = base_path
                .map(|path| map(&path).map(|f| f.bytes().clone()))
                .transpose()?;
            let checked = data_file.bytes();
            // Checked here, off the raft CPU, so that a snapshot raft installs is whole: a
            // delta comes with the base it names, a full checkpoint alone.
            let whole = match (base_index_of(checked)?, &base) {
                (None, None) => true,
                (Some(_), Some(base)) => is_base_of(checked, base)?,
                _ => false,
            };
            if !whole {
                return Err(protocol(
                    "a delta checkpoint without its base, or a base without a delta",
                ));
            }
            if segments_of(checked, base.as_ref())? != received {
                return Err(protocol(
                    "the segments sent are not those its checkpoint names",
                ));
            }
            let d = std::fs::File::open(&dir)?;
            sync_or_abort(&d, &dir);
            Ok((data_file, base))
        })
        .await?;
        self.writer.keep();
        self.finished = true;
        Ok(StagedSnapshot {
            from: self.from,
            index: self.index,
            dir: self.dir.clone(),
            segments: std::mem::take(&mut self.segments),
            data: data_file.bytes().clone(),
            data_file,
            base,
        })
    }
}

impl Drop for IncomingSnapshot {
    fn drop(&mut self) {
        if !self.finished {
            // The stream broke (a dropped connection, a sender that stopped, a bad chunk) or
            // its end was refused: nothing of it is used, and raft has the snapshot sent
            // again, whole.
            tracing::warn!(
                from = format!("{:x}", self.from),
                index = self.index,
                segments = self.segments.len(),
                "a snapshot stream ended unfinished; what it staged is deleted"
            );
            // The writer thread deletes it once the queue closes with this value, skipping
            // the writes still queued.
            self.writer.abandon();
        }
    }
}

/// fsync, and stop the process if it fails: after a failed fsync the kernel may have dropped
/// the pages, and no retry could tell (as the WAL and the value log do).
fn sync_or_abort(file: &std::fs::File, path: &Path) {
    if let Err(error) = file.sync_all() {
        tracing::error!(file = %path.display(), %error, "fsync of a received snapshot failed; aborting");
        std::process::abort();
    }
}

/// Deletes staging directories on a thread beside the raft CPU (thousands of files).
pub fn remove_staged(dirs: Vec<PathBuf>) {
    if dirs.is_empty() {
        return;
    }
    let removal = move || {
        for dir in dirs {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot delete a staged snapshot");
                }
            }
        }
    };
    if let Err(e) = rt::spawn_beside("keel-snapshot-gc", removal) {
        tracing::warn!(error = %e, "cannot start a thread to delete staged snapshots");
    }
}

/// At start: every staging directory is left from a snapshot that never completed, or that
/// completed but was not installed before the stop (its leader sends it again).
pub fn remove_all_staged(staging_root: &Path) -> Result<(), CoreError> {
    match std::fs::remove_dir_all(staging_root) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CoreError::DataDir {
            path: staging_root.to_path_buf(),
            source,
        }),
    }
}

/// What gives a leader's checkpoint file this member's segment ids: the file's store image
/// named every segment `shift` higher, by a new store-image header at `image_at`, and the
/// file's new crc at its end. The rest of the file stays as the leader sent it: rewriting each
/// id in the archive meant writing and syncing the whole file again (416 MB at 4M keys) while
/// the raft loop waited.
pub struct IdShift {
    image_at: usize,
    head: [u8; kv::CHECKPOINT_HEADER_BYTES],
    crc: [u8; 4],
}

impl IdShift {
    /// For `file`, decoded from it as `cp` (`decode_shared`); `highest` is the highest segment
    /// id the leader's files name.
    pub fn of(
        file: &Bytes,
        cp: &checkpoint::Checkpoint,
        shift: u32,
        highest: u32,
    ) -> Result<IdShift, String> {
        let head =
            kv::segment_shift_header(&cp.kv_image, shift, highest).map_err(|e| e.to_string())?;
        let (image_at, crc) = checkpoint::crc_with_image_head(file, cp, &head);
        Ok(IdShift {
            image_at,
            head,
            crc,
        })
    }

    /// `file` with the shift, in memory (the simulation, tests).
    pub fn applied_to(&self, file: &Bytes) -> Bytes {
        let mut out = file.to_vec();
        out[self.image_at..self.image_at + self.head.len()].copy_from_slice(&self.head);
        let crc_at = out.len() - self.crc.len();
        out[crc_at..].copy_from_slice(&self.crc);
        Bytes::from(out)
    }

    /// Written over the staged file at `path` (the file `of` was given), and the file synced.
    /// It is still in staging, so a crash midway leaves nothing that is used.
    fn write_over(&self, path: &Path, file_bytes: usize) -> Result<(), CoreError> {
        use std::os::unix::fs::FileExt;
        let data_dir_error = |source| CoreError::DataDir {
            path: path.to_path_buf(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(data_dir_error)?;
        f.write_all_at(&self.head, self.image_at as u64)
            .map_err(data_dir_error)?;
        f.write_all_at(&self.crc, (file_bytes - self.crc.len()) as u64)
            .map_err(data_dir_error)?;
        sync_or_abort(&f, path);
        Ok(())
    }
}

/// Makes a received snapshot this member's newest checkpoint (on a thread: renames and syncs):
/// its segments move into `vlog_dir` under ids raised by `shift` (above every id this member's
/// stores used), and the checkpoint file goes into `snap_dir` naming them so, and the segments
/// are mapped for the store that replaces the member's. The staged checkpoint file is moved,
/// never written again: where the ids move, only its store image's header and its crc are
/// (`IdShift`). `shift` is 0 for a member that never had a segment file.
/// A crash midway leaves the previous checkpoint newest; the moved segment files are then
/// named by no checkpoint and deleted at the next start.
///
/// Also returns the checkpoint file's mapping, whose pages the install's restore reads in
/// place: the driver gives them back once the store is replaced.
pub fn place(
    staged: StagedSnapshot,
    shift: u32,
    snap_dir: &Path,
    vlog_dir: &Path,
) -> Result<(PlacedSnapshot, keel_io::vlog::MappedFile), CoreError> {
    let bad =
        |why: String| CoreError::Snapshot(format!("leader's snapshot {}: {why}", staged.index));
    let data_dir_error = |path: &Path, source| CoreError::DataDir {
        path: path.to_path_buf(),
        source,
    };
    let cp = checkpoint::decode_shared(&staged.data).map_err(bad)?;
    let base_cp = match &staged.base {
        None => None,
        Some(base_file) => Some(checkpoint::decode_shared(base_file).map_err(bad)?),
    };
    let listed = staged.segments.clone();
    let shift = if listed.is_empty() { 0 } else { shift };
    // What gives each file this member's ids, worked out before anything moves: a shift
    // past the id space is refused with the staging as it was.
    let highest = listed.last().copied().unwrap_or(0);
    let id_shift = |file: &Bytes, cp: &checkpoint::Checkpoint| {
        (shift != 0)
            .then(|| IdShift::of(file, cp, shift, highest))
            .transpose()
            .map_err(bad)
    };
    let data_shift = id_shift(&staged.data, &cp)?;
    let base_shift = match (&staged.base, &base_cp) {
        (Some(base_file), Some(base_cp)) => id_shift(base_file, base_cp)?,
        _ => None,
    };
    std::fs::create_dir_all(vlog_dir).map_err(|e| data_dir_error(vlog_dir, e))?;
    // Never over a file of this member's: a checkpoint of its own may still name it (see
    // `Member::segment_id_base`, which keeps the leader's ids only where none can be).
    // Every target is looked at before the first moves.
    let mut targets = Vec::with_capacity(listed.len());
    for &id in &listed {
        let local = id
            .checked_add(shift)
            .ok_or_else(|| bad("segment ids run out".into()))?;
        let to = keel_io::vlog::segment_path(vlog_dir, local);
        if to.try_exists().map_err(|e| data_dir_error(&to, e))? {
            return Err(bad(format!("segment file {} exists already", to.display())));
        }
        targets.push((id, to));
    }
    for (id, to) in targets {
        std::fs::rename(keel_io::vlog::segment_path(&staged.dir, id), &to)
            .map_err(|e| data_dir_error(&to, e))?;
    }
    if !listed.is_empty() {
        let d = std::fs::File::open(vlog_dir).map_err(|e| data_dir_error(vlog_dir, e))?;
        sync_or_abort(&d, vlog_dir);
    }
    // The staged file (durable since its last chunk) moved to `path`, and the move made durable.
    // A failed directory fsync aborts, as every other sync of a received snapshot does: the
    // kernel may have dropped the entry, and no retry could tell.
    let moved = |from: &str, path: &Path| {
        std::fs::rename(staged.dir.join(from), path).map_err(|e| data_dir_error(path, e))?;
        let d = std::fs::File::open(snap_dir).map_err(|e| data_dir_error(snap_dir, e))?;
        sync_or_abort(&d, snap_dir);
        Ok::<_, CoreError>(())
    };
    // A staged file given this member's ids in place (nothing to do where none move).
    let reheaded = |from: &str, file: &Bytes, id_shift: &Option<IdShift>| match id_shift {
        None => Ok(()),
        Some(id_shift) => id_shift.write_over(&staged.dir.join(from), file.len()),
    };
    // A delta's base goes first, under its own index: a crash before the delta is written
    // leaves it a full checkpoint older than this member's newest, which removal takes.
    // Same index, same state: one of this member's own there is replaced by it unharmed
    // (the rename is atomic, and a delta of its own that names it finds the same state).
    let base = match (&staged.base, &base_cp) {
        (Some(base_file), Some(base_cp)) => {
            let path = snap_dir.join(checkpoint::file_name(base_cp.meta.index));
            reheaded(BASE_FILE, base_file, &base_shift)?;
            moved(BASE_FILE, &path)?;
            Some(base_file.clone())
        }
        _ => None,
    };
    let path = snap_dir.join(checkpoint::file_name(staged.index));
    // Raft keeps the file as the snapshot this member sends on: mapped, not a heap copy. The
    // mapping shows the bytes written over it in place.
    reheaded(CHECKPOINT_FILE, &staged.data, &data_shift)?;
    moved(CHECKPOINT_FILE, &path)?;
    let mapped = staged.data_file;
    let file = mapped.bytes().clone();
    let mut files = std::collections::BTreeMap::new();
    for id in listed {
        let local = id + shift;
        files.insert(
            local,
            vlog_writer::map_segment(vlog_dir, local).map_err(CoreError::Snapshot)?,
        );
    }
    if let Err(e) = std::fs::remove_dir_all(&staged.dir) {
        tracing::warn!(dir = %staged.dir.display(), error = %e, "cannot delete a placed snapshot's staging directory");
    }
    Ok((
        PlacedSnapshot {
            index: staged.index,
            data: file,
            files,
            base,
        },
        mapped,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::peer::{parse_frame, Incoming, SNAPSHOT_CHUNK_BODY_AT};

    /// A leader's store with its values in segment files under `vlog_dir` (written as the
    /// value-log writer leaves them: records, then zeros to a whole block), and its
    /// checkpoint file at raft index 7.
    fn leader(vlog_dir: &Path) -> (Bytes, kv::Reader) {
        let (w, r) = leader_store(vlog_dir);
        (checkpoint_file(7, &w.checkpoint()), r)
    }

    /// The leader's store of `leader`, its values in segment files under `vlog_dir`.
    fn leader_store(vlog_dir: &Path) -> (kv::Writer, kv::Reader) {
        let (mut w, r) = kv::Store::with_value_log(kv::ValueLogOptions {
            segment_bytes: 8192,
            first_segment_id: 3,
            on_disk: true,
        });
        std::fs::create_dir_all(vlog_dir).unwrap();
        for i in 0..60u64 {
            put_sealed(&mut w, vlog_dir, i + 1, i, i as u8);
        }
        (w, r)
    }

    /// Applies a put of 1000 bytes to key `key` at raft index `index`, then writes every
    /// sealed segment as the value-log writer does.
    fn put_sealed(w: &mut kv::Writer, vlog_dir: &Path, index: u64, key: u64, byte: u8) {
        let put = kv::Op::Put(kv::PutRequest {
            key: Bytes::from(format!("key-{key:03}")),
            value: Bytes::from(vec![byte; 1000]),
            ..Default::default()
        });
        w.apply(index, &put).unwrap();
        for sealed in w.take_sealed_segments() {
            let mut file: Vec<u8> = sealed.records.to_vec();
            file.resize(file.len().next_multiple_of(4096), 0);
            let path = keel_io::vlog::segment_path(vlog_dir, sealed.id);
            std::fs::write(&path, &file).unwrap();
            let mapped = vlog_writer::map_segment(vlog_dir, sealed.id).unwrap();
            w.segment_durable(sealed.id, sealed.bytes, mapped);
        }
    }

    fn checkpoint_file(index: u64, kv_image: &[u8]) -> Bytes {
        Bytes::from(checkpoint::encode(
            index,
            2,
            &keel_raft::ConfState::default(),
            checkpoint::ClusterState {
                members: &[],
                alarms: &[],
                auth: &Default::default(),
                removed: &[],
            },
            kv_image,
        ))
    }

    /// A leader under `dir` whose newest checkpoint is a delta: a full checkpoint at raft
    /// index 60 (in `dir/snap`), then `changed` keys written again (from index 61), and the
    /// delta against it. Returns the delta's file, its index, the base's file and the stream
    /// of both with their segments, in chunks of 1000 bytes.
    async fn delta_leader(dir: &Path, changed: &[u64]) -> (DeltaLeader, Vec<Vec<u8>>) {
        let vlog = dir.join("vlog");
        let leader_snap = dir.join("snap");
        std::fs::create_dir_all(&leader_snap).unwrap();
        let (mut w, reader) = leader_store(&vlog);
        let source = w.checkpoint_source();
        let base = source.delta_base();
        let base_file = checkpoint_file(60, &source.serialize().unwrap());
        std::fs::write(leader_snap.join(checkpoint::file_name(60)), &base_file).unwrap();
        for (n, key) in changed.iter().enumerate() {
            put_sealed(&mut w, &vlog, 61 + n as u64, *key, 0xee);
        }
        let index = 60 + changed.len() as u64;
        let parts = w
            .checkpoint_source()
            .serialize_parts_against(Some(&base))
            .unwrap();
        assert_eq!(parts.delta_of(), Some(60));
        let data = checkpoint_file(index, &parts.to_vec());
        let mut out = futures_lite::io::Cursor::new(Vec::new());
        write_snapshot(&mut out, &data, index, (&vlog, &leader_snap), 1000)
            .await
            .unwrap();
        let leader = DeltaLeader {
            listed: segments_of(&data, Some(&base_file)).unwrap(),
            data,
            index,
            base_file,
            reader,
        };
        (leader, frames(&out.into_inner()))
    }

    struct DeltaLeader {
        data: Bytes,
        index: u64,
        base_file: Bytes,
        /// The segments the delta and its base name.
        listed: Vec<u32>,
        reader: kv::Reader,
    }

    /// The frames a stream wrote, without their length prefixes.
    fn frames(mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
            out.push(bytes[4..4 + len].to_vec());
            bytes = &bytes[4 + len..];
        }
        out
    }

    /// Feeds a stream's frames to a receiver, as `Transport::take_frames` does (each stream
    /// with its own number, as the transport gives them).
    async fn receive(staging: &Path, frames: Vec<Vec<u8>>) -> io::Result<IncomingSnapshot> {
        static STREAMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let stream = STREAMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut incoming = None;
        for frame in frames {
            match parse_frame(&frame, 1)? {
                Incoming::SnapshotBegin {
                    index,
                    checkpoint_bytes,
                } => {
                    incoming = Some(
                        IncomingSnapshot::begin(staging, stream, 1, index, checkpoint_bytes)
                            .await?,
                    )
                }
                Incoming::SnapshotChunk(h) => {
                    let s = incoming.as_mut().expect("begin came first");
                    s.chunk(h, frame, SNAPSHOT_CHUNK_BODY_AT).await?;
                }
                other => panic!("a stream holds only snapshot frames: {other:?}"),
            }
        }
        Ok(incoming.expect("a stream begins"))
    }

    /// Restored from the placed segment files, `kv_image` (over `base` for a delta) is the
    /// leader's store.
    fn assert_restores_to(
        placed: &PlacedSnapshot,
        kv_image: &[u8],
        base: Option<&[u8]>,
        leader: &kv::Reader,
    ) {
        let (_, reader) = kv::Store::restore_on_base(
            kv_image,
            base,
            kv::ValueLogOptions {
                on_disk: true,
                ..Default::default()
            },
            &mut |id| {
                placed
                    .files
                    .get(&id)
                    .cloned()
                    .ok_or(format!("no segment {id}"))
            },
            kv::RestoreHelpers::NONE,
        )
        .unwrap();
        let rev = leader.current_revision();
        assert_eq!(reader.hash_kv(rev).unwrap(), leader.hash_kv(rev).unwrap());
    }

    fn run(test: impl FnOnce() -> futures_lite::future::BoxedLocal<()> + Send + 'static) {
        crate::rt::spawn_pinned("snapshot-test", crate::rt::process_cpu_list()[0], test)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn a_snapshot_streams_in_chunks_and_the_follower_stores_its_segments_under_its_own_ids() {
        run(|| {
            Box::pin(async {
                let leader_dir = tempfile::tempdir().unwrap();
                let follower_dir = tempfile::tempdir().unwrap();
                let (vlog, snap) = (
                    leader_dir.path().join("vlog"),
                    follower_dir.path().join("snap"),
                );
                let (data, leader_reader) = leader(&vlog);
                let listed = segments_of(&data, None).unwrap();
                assert!(listed.len() > 3, "the values span segments: {listed:?}");
                // Chunks far smaller than the files, so each file takes several.
                let mut out = futures_lite::io::Cursor::new(Vec::new());
                let sent = write_snapshot(&mut out, &data, 7, (&vlog, &vlog), 1000)
                    .await
                    .unwrap();
                let stream = out.into_inner();
                assert_eq!(sent, stream.len() as u64);
                let segment_bytes: u64 = listed
                    .iter()
                    .map(|id| {
                        std::fs::metadata(keel_io::vlog::segment_path(&vlog, *id))
                            .unwrap()
                            .len()
                    })
                    .sum();
                let frames = frames(&stream);
                let chunk_frames = frames
                    .iter()
                    .filter(|f| f[0] == FRAME_SNAPSHOT_CHUNK)
                    .count() as u64;
                assert!(chunk_frames >= (data.len() as u64 + segment_bytes) / 1000);
                assert!(frames
                    .iter()
                    .all(|f| f.len() <= 1000 + SNAPSHOT_CHUNK_BODY_AT));

                let staging = snap.join(STAGING_DIR);
                let incoming = receive(&staging, frames).await.unwrap();
                // The raft message must name the snapshot the stream carried.
                let staged = incoming.finish(7).await.unwrap();
                assert_eq!(staged.segments, listed);
                assert_eq!(staged.data, data);

                // The follower's own stores used ids below 50: the leader's go from 50 up.
                let shift = 50 - listed[0];
                let follower_vlog = follower_dir.path().join("vlog");
                let staged_dir = staged.dir.clone();
                let (placed, _mapped) = place(staged, shift, &snap, &follower_vlog).unwrap();
                assert!(
                    !staged_dir.exists(),
                    "the staging directory goes once placed"
                );
                let raised: Vec<u32> = listed.iter().map(|id| id + shift).collect();
                assert_eq!(placed.files.keys().copied().collect::<Vec<_>>(), raised);
                assert_eq!(
                    keel_io::vlog::list_segments(&follower_vlog).unwrap(),
                    raised
                );
                // The checkpoint file written is the placed one, and names the raised ids.
                let written = std::fs::read(snap.join(checkpoint::file_name(7))).unwrap();
                assert_eq!(written, placed.data);
                let cp = checkpoint::decode(&written).unwrap();
                assert_eq!(kv::checkpoint_segments(&cp.kv_image).unwrap(), raised);
                // Not written again: the leader's file with a new store-image header and crc.
                assert_eq!(written.len(), data.len());
                let changed: Vec<usize> =
                    (0..data.len()).filter(|&i| written[i] != data[i]).collect();
                let image_at = data.len() - 4 - cp.kv_image.len();
                assert!(
                    changed
                        .iter()
                        .all(
                            |&i| (image_at..image_at + kv::CHECKPOINT_HEADER_BYTES).contains(&i)
                                || i >= data.len() - 4
                        ),
                    "{changed:?}"
                );
                // Restored from the placed files, the store is the leader's.
                assert_restores_to(&placed, &cp.kv_image, None, &leader_reader);

                // Sent on by this member to a third: the raised ids written into the archive
                // and no shift left (what a build before shifts reads), naming its own files.
                let mut out = futures_lite::io::Cursor::new(Vec::new());
                write_snapshot(&mut out, &placed.data, 7, (&follower_vlog, &snap), 1000)
                    .await
                    .unwrap();
                let third = tempfile::tempdir().unwrap();
                let third_snap = third.path().join("snap");
                let sent_frames = super::tests::frames(&out.into_inner());
                let incoming = receive(&third_snap.join(STAGING_DIR), sent_frames)
                    .await
                    .unwrap();
                let staged = incoming.finish(7).await.unwrap();
                assert_eq!(staged.segments, raised);
                let sent = checkpoint::decode(&staged.data).unwrap();
                assert_eq!(sent.kv_image[12..16], [0; 4], "no shift goes out");
                let image_at = placed.data.len() - 4 - sent.kv_image.len();
                assert_eq!(staged.data.len(), placed.data.len());
                assert_eq!(
                    staged.data[..image_at],
                    placed.data[..image_at],
                    "the file around the image goes as it is"
                );
                assert_eq!(kv::checkpoint_segments(&sent.kv_image).unwrap(), raised);
                let (placed3, _mapped3) =
                    place(staged, 0, &third_snap, &third.path().join("vlog")).unwrap();
                assert_restores_to(&placed3, &sent.kv_image, None, &leader_reader);
            })
        });
    }

    #[test]
    fn a_delta_streams_with_its_base_and_the_follower_restores_the_pair() {
        run(|| {
            Box::pin(async {
                let leader_dir = tempfile::tempdir().unwrap();
                let follower_dir = tempfile::tempdir().unwrap();
                // A few keys change after the base: the delta holds only those.
                let (leader, frames) = delta_leader(leader_dir.path(), &[5, 17, 40, 41]).await;
                let DeltaLeader {
                    data,
                    index,
                    base_file,
                    listed,
                    reader: leader_reader,
                } = leader;
                assert_eq!(index, 64);
                assert!(data.len() * 4 < base_file.len());
                let snap = follower_dir.path().join("snap");
                let staging = snap.join(STAGING_DIR);
                // Without its base, the delta is refused when the raft message comes.
                let no_base: Vec<Vec<u8>> = frames
                    .iter()
                    .filter(|f| {
                        f[0] != FRAME_SNAPSHOT_CHUNK
                            || parse_chunk_header(&f[1..]).unwrap().part != Part::Base
                    })
                    .cloned()
                    .collect();
                let incoming = receive(&staging, no_base).await.unwrap();
                let refused = incoming.finish(64).await.unwrap_err().to_string();
                assert!(refused.contains("without its base"), "{refused}");

                let incoming = receive(&staging, frames).await.unwrap();
                let staged = incoming.finish(64).await.unwrap();
                assert_eq!(staged.segments, listed);
                assert_eq!(staged.base.as_ref(), Some(&base_file));
                let shift = 50;
                let follower_vlog = follower_dir.path().join("vlog");
                let (placed, _mapped) = place(staged, shift, &snap, &follower_vlog).unwrap();
                // Both files are written, renamed alike, and the pair restores to the leader's
                // store from the follower's files.
                let written_base = std::fs::read(snap.join(checkpoint::file_name(60))).unwrap();
                assert_eq!(placed.base.as_deref(), Some(&written_base[..]));
                let (cp, base_cp) = (
                    checkpoint::decode(&placed.data).unwrap(),
                    checkpoint::decode(&written_base).unwrap(),
                );
                let raised: Vec<u32> = listed.iter().map(|id| id + shift).collect();
                let mut named = kv::checkpoint_segments(&cp.kv_image).unwrap();
                named.extend(kv::checkpoint_segments(&base_cp.kv_image).unwrap());
                named.sort_unstable();
                named.dedup();
                assert_eq!(named, raised);
                assert_restores_to(
                    &placed,
                    &cp.kv_image,
                    Some(&base_cp.kv_image),
                    &leader_reader,
                );
            })
        });
    }

    /// A new member keeps the leader's segment ids, so the files it staged are already the
    /// ones to keep: placing moves them (the same inodes), writing no second copy, and the
    /// pair still restores to the leader's store.
    #[test]
    fn a_new_members_snapshot_files_are_moved_into_place_not_written_again() {
        run(|| {
            Box::pin(async {
                use std::os::unix::fs::MetadataExt;
                let leader_dir = tempfile::tempdir().unwrap();
                let follower_dir = tempfile::tempdir().unwrap();
                let (leader, frames) = delta_leader(leader_dir.path(), &[9]).await;
                let DeltaLeader {
                    data,
                    base_file,
                    listed,
                    reader: leader_reader,
                    ..
                } = leader;
                let snap = follower_dir.path().join("snap");
                let incoming = receive(&snap.join(STAGING_DIR), frames).await.unwrap();
                let staged = incoming.finish(61).await.unwrap();
                assert_eq!(staged.data, data);
                let inode = |path: &Path| std::fs::metadata(path).unwrap().ino();
                let (staged_file, staged_base) = (
                    inode(&staged.dir.join(CHECKPOINT_FILE)),
                    inode(&staged.dir.join(BASE_FILE)),
                );
                let staged_dir = staged.dir.clone();
                let follower_vlog = follower_dir.path().join("vlog");
                let (placed, mapped) = place(staged, 0, &snap, &follower_vlog).unwrap();
                let (file_path, base_path) = (
                    snap.join(checkpoint::file_name(61)),
                    snap.join(checkpoint::file_name(60)),
                );
                assert_eq!(inode(&file_path), staged_file, "moved, not written again");
                assert_eq!(inode(&base_path), staged_base, "moved, not written again");
                assert!(!staged_dir.exists());
                assert_eq!(std::fs::read(&file_path).unwrap(), data);
                assert_eq!(std::fs::read(&base_path).unwrap(), base_file);
                assert_eq!(placed.data, data);
                assert_eq!(
                    mapped.bytes(),
                    &data,
                    "the mapping handed back is the file's"
                );
                assert_eq!(placed.files.keys().copied().collect::<Vec<_>>(), listed);
                assert_eq!(
                    keel_io::vlog::list_segments(&follower_vlog).unwrap(),
                    listed
                );
                let (cp, base_cp) = (
                    checkpoint::decode(&placed.data).unwrap(),
                    checkpoint::decode(placed.base.as_ref().unwrap()).unwrap(),
                );
                assert_restores_to(
                    &placed,
                    &cp.kv_image,
                    Some(&base_cp.kv_image),
                    &leader_reader,
                );
                // A restart finds the moved pair as this member's newest checkpoint.
                let loaded = checkpoint::load_newest(&snap).unwrap().unwrap();
                assert_eq!(loaded.checkpoint.meta.index, 61);
            })
        });
    }

    #[test]
    fn a_broken_or_disordered_stream_is_refused_and_its_staging_deleted() {
        run(|| {
            Box::pin(async {
                let leader_dir = tempfile::tempdir().unwrap();
                let follower_dir = tempfile::tempdir().unwrap();
                let vlog = leader_dir.path().join("vlog");
                let (data, _) = leader(&vlog);
                let mut out = futures_lite::io::Cursor::new(Vec::new());
                write_snapshot(&mut out, &data, 7, (&vlog, &vlog), 4096)
                    .await
                    .unwrap();
                let all = frames(&out.into_inner());
                let staging = follower_dir.path().join(STAGING_DIR);
                let staged_dirs = || std::fs::read_dir(&staging).map_or(0, |d| d.count());

                // Cut short: the raft message finds parts missing; the staging goes.
                let cut = receive(&staging, all[..all.len() - 2].to_vec())
                    .await
                    .unwrap();
                assert_eq!(staged_dirs(), 1);
                assert!(cut.finish(7).await.is_err());
                // A message for another index than the stream's is refused too.
                let whole = receive(&staging, all.clone()).await.unwrap();
                assert!(whole.finish(8).await.is_err());
                // Deletion runs on a thread beside the caller.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while staged_dirs() > 0 && std::time::Instant::now() < deadline {
                    rt::sleep(Duration::from_millis(10)).await;
                }
                assert_eq!(staged_dirs(), 0, "refused streams leave nothing staged");

                // A stream cut off in the middle of its end (its connection's task dropped
                // while `finish` waits for the writer) leaves nothing staged either.
                let whole = receive(&staging, all.clone()).await.unwrap();
                let mut finishing = Box::pin(whole.finish(7));
                assert!(futures_lite::future::poll_once(&mut finishing)
                    .await
                    .is_none());
                assert_eq!(staged_dirs(), 1);
                drop(finishing);
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while staged_dirs() > 0 && std::time::Instant::now() < deadline {
                    rt::sleep(Duration::from_millis(10)).await;
                }
                assert_eq!(
                    staged_dirs(),
                    0,
                    "a stream cut off while finishing leaves nothing"
                );

                // Chunks out of order: a segment before the whole checkpoint, a chunk skipped,
                // a segment sent twice.
                let first_segment = all
                    .iter()
                    .position(|f| f[0] == FRAME_SNAPSHOT_CHUNK && f[1] == PART_SEGMENT)
                    .unwrap();
                let mut early = all.clone();
                early.swap(1, first_segment);
                assert!(receive(&staging, early).await.is_err());
                let mut skipped = all.clone();
                skipped.remove(first_segment + 1);
                assert!(receive(&staging, skipped).await.is_err());
                let mut twice = all.clone();
                twice.push(all[first_segment].clone());
                assert!(receive(&staging, twice).await.is_err());

                // Segments the checkpoint does not name are refused at the end.
                let mut extra = all.clone();
                let mut stray = encode_chunk_header(
                    ChunkHeader {
                        part: Part::Segment(u32::MAX - 3),
                        offset: 0,
                        file_bytes: 4,
                    },
                    4,
                );
                stray.extend_from_slice(b"abcd");
                extra.push(stray[4..].to_vec());
                let extra = receive(&staging, extra).await.unwrap();
                assert!(extra.finish(7).await.is_err());

                // A leader whose segment file is gone fails its stream (raft sends it again).
                let listed = segments_of(&data, None).unwrap();
                std::fs::remove_file(keel_io::vlog::segment_path(&vlog, listed[1])).unwrap();
                let mut out = futures_lite::io::Cursor::new(Vec::new());
                let gone = write_snapshot(&mut out, &data, 7, (&vlog, &vlog), 4096)
                    .await
                    .unwrap_err();
                assert_eq!(gone.kind(), io::ErrorKind::NotFound, "{gone}");
            })
        });
    }

    #[test]
    fn begin_and_chunk_headers_round_trip_and_damage_is_refused() {
        let begin = encode_begin(42, 1 << 33);
        assert_eq!(
            u32::from_be_bytes(begin[..4].try_into().unwrap()) as usize,
            begin.len() - 4
        );
        assert_eq!(begin[4], FRAME_SNAPSHOT_BEGIN);
        assert_eq!(parse_begin(&begin[5..]).unwrap(), (42, 1 << 33));
        assert!(parse_begin(&begin[5..begin.len() - 1]).is_err());
        let ack = encode_ack(42);
        assert_eq!(
            u32::from_be_bytes(ack[..4].try_into().unwrap()) as usize,
            ack.len() - 4
        );
        assert_eq!(ack[4], FRAME_SNAPSHOT_ACK);
        assert_eq!(parse_ack(&ack[5..]).unwrap(), 42);
        assert!(parse_ack(&ack[5..12]).is_err());
        for part in [Part::Checkpoint, Part::Segment(7)] {
            let h = ChunkHeader {
                part,
                offset: 4096,
                file_bytes: 4096 + 3,
            };
            let mut frame = encode_chunk_header(h, 3);
            frame.extend_from_slice(b"abc");
            assert_eq!(
                u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize,
                frame.len() - 4
            );
            assert_eq!(frame[4], FRAME_SNAPSHOT_CHUNK);
            assert_eq!(parse_chunk_header(&frame[5..]).unwrap(), h);
            // A chunk that runs past the length its file was announced with is refused.
            frame.push(b'd');
            assert!(parse_chunk_header(&frame[5..]).is_err());
        }
        let mut bad_part = encode_chunk_header(
            ChunkHeader {
                part: Part::Segment(1),
                offset: 0,
                file_bytes: 0,
            },
            0,
        );
        bad_part[5] = 9;
        assert!(parse_chunk_header(&bad_part[5..]).is_err());
        assert!(parse_chunk_header(&[PART_SEGMENT, 0, 0]).is_err());
        let overflow = encode_chunk_header(
            ChunkHeader {
                part: Part::Checkpoint,
                offset: u64::MAX,
                file_bytes: u64::MAX,
            },
            0,
        );
        let mut overflow = overflow;
        overflow.push(0);
        assert!(parse_chunk_header(&overflow[5..]).is_err());
    }
}
