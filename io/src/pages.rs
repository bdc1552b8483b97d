//! Which pages of a read's bytes are in memory, and bringing them in: the value log's durable
//! segments are mapped files, so the first read of a cold value is a page fault that blocks
//! the reading thread for a disk read. A shard asks `pages_missing` (mincore, which never
//! faults) and, when some are missing, has another thread call `fault_in`, so that only that
//! thread waits for the disk while the shard serves its other connections.

/// The kernel's page size (mincore and madvise work in pages).
pub fn page_bytes() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the running kernel.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(page)
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// The pages `[first, end)` (addresses, page aligned) that `span` lies on.
fn pages_of(span: &[u8]) -> (usize, usize) {
    let page = page_bytes();
    let start = span.as_ptr() as usize;
    let first = start & !(page - 1);
    let end = (start + span.len() + page - 1) & !(page - 1);
    (first, end)
}

/// How many pages (each counted once where spans that follow each other share it) that the
/// spans lie on are not in memory now. Empty spans lie on no page. Each span must be memory
/// this process can read (a slice it holds). An address mincore refuses counts as missing:
/// bringing it in is then left to the thread that reads it.
pub fn pages_missing<'a>(spans: impl IntoIterator<Item = &'a [u8]> + Clone) -> usize {
    pages_missing_within(spans, usize::MAX).expect("no bound on the pages")
}

/// `pages_missing`, or None without asking the kernel when the spans lie on more than
/// `pages_max` pages: for a caller that bounds what it spends finding out (mincore is asked
/// once per run of touching pages, and per `PAGES_PER_CALL` of a long run).
pub fn pages_missing_within<'a>(
    spans: impl IntoIterator<Item = &'a [u8]> + Clone,
    pages_max: usize,
) -> Option<usize> {
    let page = page_bytes();
    let mut pages = 0;
    let counted = for_each_run(spans.clone(), |(first, end)| {
        pages += (end - first) / page;
        pages <= pages_max
    });
    if !counted {
        return None;
    }
    let mut missing = 0;
    for_each_run(spans, |run| {
        missing += missing_in(run, page);
        true
    });
    Some(missing)
}

/// Calls `f` with each run of touching pages the spans lie on, in order, merging a span into
/// the run before it where their pages touch: the spans of a range in key order often follow
/// each other in their segment. Stops, returning false, once `f` does.
fn for_each_run<'a>(
    spans: impl IntoIterator<Item = &'a [u8]>,
    mut f: impl FnMut((usize, usize)) -> bool,
) -> bool {
    let mut run: Option<(usize, usize)> = None;
    for span in spans {
        if span.is_empty() {
            continue;
        }
        let (first, end) = pages_of(span);
        run = match run {
            Some((run_first, run_end)) if first <= run_end && end >= run_first => {
                Some((run_first.min(first), run_end.max(end)))
            }
            Some(done) => {
                if !f(done) {
                    return false;
                }
                Some((first, end))
            }
            None => Some((first, end)),
        };
    }
    run.is_none_or(f)
}

/// Pages one mincore call asks about: its answer is a byte per page, on the stack.
pub const PAGES_PER_CALL: usize = 256;

/// Missing pages in `[first, end)`, asked a bounded vector's worth at a time.
fn missing_in((first, end): (usize, usize), page: usize) -> usize {
    let mut vec = [0u8; PAGES_PER_CALL];
    let mut missing = 0;
    let mut at = first;
    while at < end {
        let pages = ((end - at) / page).min(PAGES_PER_CALL);
        // SAFETY: `at` is page aligned, the range lies within memory the caller holds (a
        // span's pages), and `vec` has room for one byte per page asked.
        let rc = unsafe { libc::mincore(at as *mut libc::c_void, pages * page, vec.as_mut_ptr()) };
        if rc != 0 {
            missing += pages;
        } else {
            missing += vec[..pages].iter().filter(|v| **v & 1 == 0).count();
        }
        at += pages * page;
    }
    missing
}

/// Brings the spans' pages into memory: first asks the kernel to read them all ahead
/// (madvise WILLNEED, so the disk works on many at once rather than one fault at a time), then
/// reads one byte of each page, which waits for those still on their way. Blocks the calling
/// thread for as long as the disk takes: call it off the serving threads.
///
/// The pages are taken in address order, each once, in runs of touching pages: the values of
/// a range in key order lie scattered over their segments (where a key sorts says nothing of
/// when it was written), and one madvise per value cost more than the reads it started (a
/// pager thread spent about 1.8 µs a value on 100,000 values of 1 KiB, nearly all in the
/// syscall). The memory this takes is one pair of addresses per span: callers hand over
/// bounded lists (a pager job lists a txn's reads in chunks).
pub fn fault_in<'a>(spans: impl IntoIterator<Item = &'a [u8]>) {
    let spans: Vec<(usize, usize)> = spans
        .into_iter()
        .filter(|s| !s.is_empty())
        .map(|s| (s.as_ptr() as usize, s.as_ptr() as usize + s.len()))
        .collect();
    let (runs, reads) = fault_in_plan(spans, page_bytes());
    for (first, end) in runs {
        // SAFETY: the pages lie within memory the caller holds; WILLNEED only starts reads.
        // Its result is advice: a failure leaves the reads below to fault as they would.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_WILLNEED);
        }
    }
    for at in reads {
        // SAFETY: `fault_in_plan` reads only inside the spans, which the caller holds; a
        // volatile read is not optimized away.
        unsafe { std::ptr::read_volatile(at as *const u8) };
    }
}

/// What `fault_in` does for `spans` (first and past-the-end addresses, none empty): the runs
/// of touching pages they lie on, in address order, for madvise; and one address to read on
/// each of those pages, inside a span (the bytes of a page outside every span may be
/// another allocation's).
fn fault_in_plan(mut spans: Vec<(usize, usize)>, page: usize) -> (Vec<(usize, usize)>, Vec<usize>) {
    spans.sort_unstable();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut reads = Vec::new();
    // The first page not read yet.
    let mut untouched = 0usize;
    for (start, end) in spans {
        assert!(start < end, "an empty span lies on no page");
        let (first, last) = (start & !(page - 1), (end + page - 1) & !(page - 1));
        match runs.last_mut() {
            Some(run) if first <= run.1 => run.1 = run.1.max(last),
            _ => runs.push((first, last)),
        }
        let mut at = start.max(untouched);
        while at < end {
            reads.push(at);
            at = (at & !(page - 1)) + page;
        }
        untouched = at;
    }
    (runs, reads)
}

/// How many of the pages `span` lies on are in memory now: for the value cache, which asks
/// it of whole mapped segment files, off the serving threads.
pub fn pages_resident(span: &[u8]) -> usize {
    if span.is_empty() {
        return 0;
    }
    let page = page_bytes();
    let run = pages_of(span);
    (run.1 - run.0) / page - missing_in(run, page)
}

/// Asks the kernel to reclaim the pages `span` lies on (MADV_PAGEOUT, Linux 5.4 and later):
/// clean pages of a mapped file leave this process's memory and, where no other process maps
/// them, the page cache, so the next read of them waits for the disk again. The mapping stays
/// valid. `span` must be a whole mapping this process holds (its pages are its own), such as
/// a durable segment's file: the value cache's way of keeping to its byte limit.
pub fn page_out(span: &[u8]) -> std::io::Result<()> {
    if span.is_empty() {
        return Ok(());
    }
    let (first, end) = pages_of(span);
    // SAFETY: the pages lie within a mapping the caller holds; PAGEOUT changes only whether
    // they are in memory, never their contents (a file mapping's pages read back from it).
    let rc = unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_PAGEOUT) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Asks the kernel to drop `file`'s clean pages from the page cache (those no process has
/// mapped in use stay): how a test or a benchmark makes a file's next reads cold.
pub fn drop_cached(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on a descriptor this process holds open; offset 0, length 0: all of it.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// How much of a large file `write_paced` lets the kernel hold dirty: a chunk being written
/// and the one before it, whose writeback is under way.
pub const WRITEBACK_CHUNK_BYTES: usize = 8 << 20;

/// Writes `parts` one after another to `file` (from its current offset, which must be 0: a
/// new file) and starts the kernel's writeback of each `WRITEBACK_CHUNK_BYTES` as soon as it
/// is written, waiting for the one before it to reach the disk first. Durability is still the
/// caller's fsync; this only paces the writes, and a file system that cannot pace (EINVAL,
/// EOPNOTSUPP, ENOSYS) is written unpaced. Any other failure is returned: an I/O error that
/// writeback reported here may not be reported again to the fsync that follows.
///
/// A checkpoint of hundreds of MB written in one go sat dirty in the page cache, and on ext4
/// the WAL's next fdatasync (a journal commit) then waited for much of it: puts beside a
/// 1.13 GB checkpoint saw p99 0.9 s. Paced, the WAL's syncs wait for at most two chunks.
pub fn write_paced(file: &mut std::fs::File, parts: &[&[u8]]) -> std::io::Result<()> {
    write_paced_in(file, parts, WRITEBACK_CHUNK_BYTES)
}

fn write_paced_in(
    file: &mut std::fs::File,
    parts: &[&[u8]],
    chunk_bytes: usize,
) -> std::io::Result<()> {
    let mut w = PacedWriter::with_chunk(file, chunk_bytes);
    for part in parts {
        w.append(part)?;
    }
    Ok(())
}

/// A new file written in order, a call at a time, with its writeback paced as `write_paced`
/// paces it: for a file that arrives in pieces (a checkpoint file received from a leader).
/// Durability is still the caller's fsync.
pub struct PacedWriter<F> {
    file: F,
    chunk_bytes: usize,
    /// Bytes written so far; writeback started up to this offset, and done up to this one.
    written_bytes: usize,
    started_bytes: usize,
    waited_bytes: usize,
    /// False once the file system said it cannot pace: written unpaced from then on.
    paced: bool,
}

impl<F: std::borrow::BorrowMut<std::fs::File>> PacedWriter<F> {
    /// Writes `file` from its current offset, which must be 0 (a new file): the ranges it
    /// paces are offsets from where it started.
    pub fn new(file: F) -> Self {
        Self::with_chunk(file, WRITEBACK_CHUNK_BYTES)
    }

    fn with_chunk(mut file: F, chunk_bytes: usize) -> Self {
        use std::io::Seek;
        assert!(
            matches!(file.borrow_mut().stream_position(), Ok(0)),
            "a paced file is written from its start"
        );
        PacedWriter {
            file,
            chunk_bytes,
            written_bytes: 0,
            started_bytes: 0,
            waited_bytes: 0,
            paced: true,
        }
    }

    /// The file, for the caller's fsync.
    pub fn file(&self) -> &std::fs::File {
        self.file.borrow()
    }

    /// Appends `bytes`, starting the writeback of each whole chunk as soon as it is written
    /// and first waiting for the one before it.
    pub fn append(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let fd = self.file.borrow().as_raw_fd();
        let range = |from: usize, to: usize, flags: libc::c_uint| {
            // SAFETY: a request about a byte range of a descriptor this process holds open.
            let rc = unsafe {
                libc::sync_file_range(
                    fd,
                    from as libc::off64_t,
                    (to - from) as libc::off64_t,
                    flags,
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        let unsupported = |e: &std::io::Error| {
            matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS)
            )
        };
        while !bytes.is_empty() {
            let take =
                (self.chunk_bytes - (self.written_bytes - self.started_bytes)).min(bytes.len());
            self.file.borrow_mut().write_all(&bytes[..take])?;
            self.written_bytes += take;
            bytes = &bytes[take..];
            if self.written_bytes - self.started_bytes == self.chunk_bytes {
                if self.paced {
                    let before = if self.started_bytes > self.waited_bytes {
                        range(
                            self.waited_bytes,
                            self.started_bytes,
                            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                                | libc::SYNC_FILE_RANGE_WRITE
                                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                        )
                    } else {
                        Ok(())
                    };
                    let outcome = before.and_then(|()| {
                        range(
                            self.started_bytes,
                            self.written_bytes,
                            libc::SYNC_FILE_RANGE_WRITE,
                        )
                    });
                    match outcome {
                        Err(e) if unsupported(&e) => self.paced = false,
                        Err(e) => return Err(e),
                        Ok(()) => {}
                    }
                }
                self.waited_bytes = self.started_bytes;
                self.started_bytes = self.written_bytes;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Paced writes put every part's bytes in order, across chunk boundaries that fall
    /// inside a part, at its end, or past the last part.
    #[test]
    fn paced_writes_write_the_parts_in_order() {
        let chunk = 2 * page_bytes();
        for sizes in [
            vec![],
            vec![1],
            vec![chunk],
            vec![chunk - 1, 1, chunk + 1],
            vec![3 * chunk + 5, 0, chunk / 2, 7 * chunk],
        ] {
            let parts: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, n)| (0..*n).map(|b| (b * 31 + i * 7) as u8).collect())
                .collect();
            let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let file = tempfile::NamedTempFile::new().expect("temp file");
            let mut handle = file.reopen().expect("reopen");
            write_paced_in(&mut handle, &slices, chunk).expect("paced write");
            assert_eq!(
                std::fs::read(file.path()).expect("read back"),
                parts.concat(),
                "{sizes:?}"
            );
        }
    }

    /// A synced file of `pages` pages of 7s, mapped, its pages dropped from the page cache.
    fn cold_mapping(pages: usize) -> (tempfile::NamedTempFile, bytes::Bytes) {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(&vec![7u8; pages * page_bytes()])
            .expect("write");
        file.as_file().sync_all().expect("sync");
        drop_cached(file.as_file()).expect("fadvise");
        let mapped = crate::vlog::map_file(file.path()).expect("map");
        (file, mapped)
    }

    #[test]
    fn a_paged_out_mapping_is_no_longer_resident_and_reads_back_the_same() {
        let (_file, all) = cold_mapping(8);
        assert_eq!(pages_resident(&all), 0);
        fault_in([&all[..]]);
        assert_eq!(pages_resident(&all), 8);
        // Pages just faulted in may still wait in another CPU's LRU batch, which reclaim
        // skips until it is drained: the value cache asks again at its next look, so does
        // this test.
        for _ in 0..100 {
            page_out(&all).expect("MADV_PAGEOUT (Linux 5.4 and later)");
            if pages_resident(&all) == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(pages_resident(&all), 0, "paged out of the page cache too");
        assert!(all.iter().all(|b| *b == 7), "read back from the file");
        assert_eq!(pages_resident(&all), 8);
        assert_eq!(pages_resident(&all[..0]), 0);
    }

    #[test]
    fn a_cold_mapping_reads_as_missing_until_faulted_in() {
        let (_file, all) = cold_mapping(8);
        let page = page_bytes();
        // The kernel may keep some pages (another reader, readahead): all dropped is the rule
        // on an idle file, but the test asks only that some were.
        assert!(
            pages_missing([&all[..]]) > 0,
            "DONTNEED dropped the file's pages"
        );
        // Two spans on pages 1 and 2..3 (the second starting mid-page): three pages.
        let spans = [&all[page..page + 10], &all[2 * page + 100..3 * page + 1]];
        fault_in(spans);
        assert_eq!(
            pages_missing(spans),
            0,
            "every page the spans lie on came in"
        );
        assert_eq!(spans[1][0], 7);
    }

    #[test]
    fn faulting_in_reads_each_page_once_inside_a_span_and_advises_whole_runs() {
        let page = 4096;
        let p = |n: usize| n * page;
        // In the order a range in key order might list them: later pages first, one page
        // twice, a span inside another, spans crossing into the next page, a lone one.
        let spans = vec![
            (p(9) + 5, p(10) + 7),
            (p(2), p(2) + 1),
            (p(9) + 100, p(9) + 200),
            (p(3) + 4000, p(4)),
            (p(20) + 1, p(20) + 2),
            (p(2) + 10, p(3) + 1),
            (p(1) + 4095, p(2) + 3),
            (p(11) + 1, p(11) + 2),
        ];
        let (runs, reads) = fault_in_plan(spans.clone(), page);
        // Page 11 touches the run of pages 9-10: one run.
        assert_eq!(runs, vec![(p(1), p(4)), (p(9), p(12)), (p(20), p(21))]);
        let pages: Vec<usize> = reads.iter().map(|a| a / page).collect();
        assert_eq!(
            pages,
            vec![1, 2, 3, 9, 10, 11, 20],
            "each page once, in order"
        );
        for at in &reads {
            assert!(
                spans.iter().any(|&(s, e)| s <= *at && *at < e),
                "{at} is read outside every span"
            );
        }
        // The page before a span that starts mid-page is not read from its start.
        assert_eq!(reads[0], p(1) + 4095);
        assert_eq!(fault_in_plan(Vec::new(), page), (Vec::new(), Vec::new()));
    }

    #[test]
    fn spans_out_of_address_order_and_repeated_are_all_faulted_in() {
        let (_file, all) = cold_mapping(16);
        let page = page_bytes();
        // As a range in key order lists values: later pages first, a page twice, spans that
        // cross into the next page, and one that overlaps another.
        let spans = [
            &all[9 * page + 5..10 * page + 7],
            &all[2 * page..2 * page + 1],
            &all[9 * page + 100..9 * page + 200],
            &all[3 * page + 4000 % page..4 * page],
            &all[..1],
            &all[2 * page + 10..3 * page + 1],
        ];
        fault_in(spans);
        assert_eq!(pages_missing(spans), 0, "every page a span lies on came in");
        assert_eq!(spans[0][0], 7);
    }

    #[test]
    fn heap_memory_is_resident_and_empty_spans_lie_on_no_page() {
        let data = vec![1u8; 3 * page_bytes() + 5];
        assert_eq!(pages_missing([&data[..], &data[10..20], &[][..]]), 0);
        assert_eq!(pages_missing(std::iter::empty()), 0);
        fault_in([&data[..], &[][..]]);
    }

    #[test]
    fn a_bound_on_pages_refuses_larger_reads_without_asking() {
        let page = page_bytes();
        let data = vec![1u8; 16 * page];
        // One byte on each of four pages two apart: four pages in four runs.
        let scattered: Vec<&[u8]> = (0..4)
            .map(|i| &data[2 * i * page + 1..2 * i * page + 2])
            .collect();
        assert_eq!(pages_missing_within(scattered.iter().copied(), 3), None);
        assert_eq!(pages_missing_within(scattered.iter().copied(), 4), Some(0));
        // Spans on touching pages share them: 4 pages whether asked as one span or three.
        let misalignment = data.as_ptr() as usize % page;
        let start = if misalignment == 0 {
            0
        } else {
            page - misalignment
        };
        let whole = &data[start..start + 4 * page];
        let parts = [
            &whole[..page + 10],
            &whole[page + 10..3 * page],
            &whole[3 * page..],
        ];
        assert_eq!(pages_missing_within([whole], 4), Some(0));
        assert_eq!(pages_missing_within(parts, 4), Some(0));
        assert_eq!(pages_missing_within(parts, 3), None);
    }

    #[test]
    fn spans_are_rounded_out_to_whole_pages() {
        let page = page_bytes();
        let data = vec![0u8; 4 * page];
        let base = data.as_ptr() as usize;
        let (first, end) = pages_of(&data[1..2]);
        assert_eq!(first, base & !(page - 1));
        assert!(end > first && (end - first) % page == 0);
        assert!(first <= base + 1 && base + 2 <= end);
    }
}
