//! Value-log segment files: `<id as 8 hex digits>.seg` in one directory, each written once with
//! O_DIRECT through glommio's io_uring (whole 4 KiB blocks, zero padding after the records),
//! made durable with fdatasync and a directory sync, then mapped read-only so that reads share
//! the page cache's bytes instead of copying them.
//!
//! A file is never rewritten or truncated once mapped (a truncated mapping would fault), only
//! deleted once no checkpoint refers to it; a file left half written by a crash is referred to
//! by no checkpoint (only durable segments are) and is deleted at the next start.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use glommio::io::{Directory, OpenOptions};

use crate::frame::BLOCK_BYTES;

const SUFFIX: &str = ".seg";
/// Largest single write: bounds the DMA buffer.
const WRITE_CHUNK_BYTES: usize = 256 << 10;
const _: () = assert!(WRITE_CHUNK_BYTES % BLOCK_BYTES == 0);

/// The path of segment `id` in `dir`.
pub fn segment_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id:08x}{SUFFIX}"))
}

/// The segment ids with a file in `dir`, ascending (an absent directory has none).
pub fn list_segments(dir: &Path) -> io::Result<Vec<u32>> {
    let mut ids = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ids),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(hex) = name.strip_suffix(SUFFIX) {
            if let Ok(id) = u32::from_str_radix(hex, 16) {
                if hex.len() == 8 {
                    ids.push(id);
                }
            }
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Writes segment `id` from its records (in order, `bytes` in all) and makes it durable: the
/// file's data with fdatasync, its name with a sync of `dir`. Must run on a glommio executor.
/// A failed fdatasync aborts the process, as the WAL's does: after one, the kernel may have
/// dropped the dirty pages, and retrying would report success for data that is gone.
pub async fn write_segment(dir: &Path, id: u32, records: &[Bytes], bytes: u64) -> io::Result<()> {
    assert_eq!(
        records.iter().map(|r| r.len() as u64).sum::<u64>(),
        bytes,
        "the records make up the segment"
    );
    let path = segment_path(dir, id);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .dma_open(&path)
        .await?;
    let total_bytes = (bytes as usize).next_multiple_of(BLOCK_BYTES);
    let mut offset = 0u64;
    let mut pieces = records.iter().map(|r| &r[..]);
    let mut piece: &[u8] = pieces.next().unwrap_or(&[]);
    while (offset as usize) < total_bytes {
        let chunk_bytes = WRITE_CHUNK_BYTES.min(total_bytes - offset as usize);
        let mut chunk = file.alloc_dma_buffer(chunk_bytes);
        // Fill the chunk from the records; what is left of the last block stays zero.
        let out = chunk.as_bytes_mut();
        let mut filled = 0usize;
        while filled < chunk_bytes && !piece.is_empty() {
            let n = piece.len().min(chunk_bytes - filled);
            out[filled..filled + n].copy_from_slice(&piece[..n]);
            filled += n;
            piece = &piece[n..];
            if piece.is_empty() {
                piece = pieces.next().unwrap_or(&[]);
            }
        }
        out[filled..].fill(0);
        let written = file.write_at(chunk, offset).await?;
        if written != chunk_bytes {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "short O_DIRECT write to {}: {written} of {chunk_bytes} bytes",
                    path.display()
                ),
            ));
        }
        offset += chunk_bytes as u64;
    }
    assert_eq!(offset as usize, total_bytes, "every block was written");
    if let Err(error) = file.fdatasync().await {
        tracing::error!(file = %path.display(), %error, "value-log fdatasync failed; aborting");
        std::process::abort();
    }
    file.close().await?;
    let directory = Directory::open(dir).await?;
    if let Err(error) = directory.sync().await {
        tracing::error!(dir = %dir.display(), %error, "value-log directory sync failed; aborting");
        std::process::abort();
    }
    directory.close().await?;
    Ok(())
}

/// A read-only shared mapping of a whole file, unmapped when the last `Bytes` slice of it
/// drops.
struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only and never changes while mapped (segment files are written
// once, before they are mapped, and never truncated), so sharing it across threads is sharing
// immutable bytes.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of `len` readable bytes until `drop`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and no slice of it outlives the
        // last `Bytes` that owns this mapping.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Maps the whole file at `path` read-only. Pages are read in on first touch, so only values
/// actually read take memory (page cache, reclaimable), never the whole file.
pub fn map_file(path: &Path) -> io::Result<Bytes> {
    let file = std::fs::File::open(path)?;
    let len = usize::try_from(file.metadata()?.len()).expect("file sizes fit in usize");
    if len == 0 {
        return Ok(Bytes::new());
    }
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh read-only private mapping of an open file; the fd may close afterwards.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // Values are read one by one in key order, not sequentially through the file.
    // SAFETY: advice on the mapping just made; failure is harmless.
    unsafe { libc::madvise(ptr, len, libc::MADV_RANDOM) };
    Ok(Bytes::from_owner(Mapping {
        ptr: ptr as *const u8,
        len,
    }))
}

/// A whole file mapped read-only for reading through once (a checkpoint at a restart): read
/// ahead sequentially, and able to give back the pages that reading made resident.
pub struct MappedFile {
    bytes: Bytes,
    /// The mapping `bytes` owns (a copy of its address, for `madvise`; valid while `bytes`
    /// lives). Zero for an empty file, which has no mapping.
    addr: usize,
    len: usize,
}

impl std::fmt::Debug for MappedFile {
    // Not the bytes: a mapped file is a checkpoint or a segment, megabytes to gigabytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl MappedFile {
    /// The file's bytes (clones share the mapping).
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Takes the pages read so far out of this process's memory (`MADV_DONTNEED`): they stay
    /// in the page cache, reclaimable, and a later read faults them back in. Without it a
    /// restart's pass over a multi-GiB checkpoint stays in the member's RSS for good, though
    /// the file is read again only to send a follower a snapshot.
    pub fn forget_resident_pages(&self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: a read-only shared mapping of a file, alive while `self.bytes` is: dropping
        // its pages loses nothing (they are the file's, clean) and readers fault them back.
        unsafe {
            libc::madvise(
                self.addr as *mut libc::c_void,
                self.len,
                libc::MADV_DONTNEED,
            )
        };
    }
}

/// Maps the whole file at `path` read-only for one pass from start to end (see `MappedFile`).
pub fn map_file_to_read(path: &Path) -> io::Result<MappedFile> {
    let bytes = map_file(path)?;
    let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
    if len > 0 {
        // One pass in order: read ahead, and fault in whole runs of pages at a time.
        // SAFETY: advice on the mapping just made (`bytes` is all of it); failure is harmless.
        unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_SEQUENTIAL) };
    }
    Ok(MappedFile { bytes, addr, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_written_through_io_uring_maps_back_with_its_records_then_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let records = vec![
            Bytes::from(vec![1u8; 3000]),
            Bytes::from(vec![2u8; 5000]),
            Bytes::from(vec![3u8; 1]),
        ];
        let bytes = 8001;
        let path = dir.path().to_path_buf();
        let written = records.clone();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                write_segment(&path, 7, &written, bytes).await.unwrap();
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(list_segments(dir.path()).unwrap(), vec![7]);
        let map = map_file(&segment_path(dir.path(), 7)).unwrap();
        assert_eq!(map.len(), 8192, "padded to whole blocks");
        let expected: Vec<u8> = records.iter().flat_map(|r| r.iter().copied()).collect();
        assert_eq!(&map[..8001], &expected[..]);
        assert!(map[8001..].iter().all(|b| *b == 0));
        // A slice outlives the handle it came from.
        let slice = map.slice(3000..3010);
        drop(map);
        assert_eq!(&slice[..], &[2u8; 10]);
        assert_eq!(
            list_segments(&dir.path().join("absent")).unwrap(),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn a_segment_larger_than_one_write_goes_out_in_several() {
        // A value above the segment size gets a segment of its own size: over 1 MiB, several
        // O_DIRECT writes.
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<Bytes> = (0..3u8)
            .map(|i| Bytes::from(vec![i + 1; WRITE_CHUNK_BYTES - 100]))
            .collect();
        let bytes = records.iter().map(|r| r.len() as u64).sum();
        let path = dir.path().to_path_buf();
        let written = records.clone();
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                write_segment(&path, 0x1234_5678, &written, bytes)
                    .await
                    .unwrap();
            })
            .unwrap()
            .join()
            .unwrap();
        let map = map_file(&segment_path(dir.path(), 0x1234_5678)).unwrap();
        assert_eq!(map.len() as u64, bytes.next_multiple_of(BLOCK_BYTES as u64));
        let expected: Vec<u8> = records.iter().flat_map(|r| r.iter().copied()).collect();
        assert!(map[..expected.len()] == expected[..]);
        assert!(map[expected.len()..].iter().all(|b| *b == 0));
        assert_eq!(list_segments(dir.path()).unwrap(), vec![0x1234_5678]);
    }
}
