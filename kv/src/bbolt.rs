//! bbolt's file format (go.etcd.io/bbolt 1.3, the database etcd 3.4 keeps and snapshots): the
//! subset a snapshot needs, both ways.
//!
//! - [`BoltWriter`] writes a database in one pass: buckets in ascending name order, keys in
//!   ascending order within each, each bucket's B+tree built bottom-up as its leaves fill
//!   (memory: one page per tree level), then the root bucket page, an empty freelist and the
//!   two meta pages. Every page below the high-water mark is reachable exactly once, so bbolt's
//!   own `tx.Check` (run by `etcdctl snapshot status`) finds nothing to report.
//! - [`BoltReader`] reads any bbolt database through a [`PageSource`] (a file read with pread,
//!   or bytes in memory), one page at a time: meta pages (checksums, the newer transaction
//!   wins), branch and leaf pages, overflow pages, regular and inline buckets.
//!
//! Layout (little-endian, as bbolt writes on every platform etcd runs on):
//! page header `id u64 | flags u16 | count u16 | overflow u32`, then `count` elements, then
//! their keys and values. A leaf element is `flags u32 | pos u32 | ksize u32 | vsize u32`,
//! a branch element `pos u32 | ksize u32 | pgid u64`; `pos` counts from the element itself.
//! Meta (at byte 16 of pages 0 and 1): `magic u32 | version u32 | page_size u32 | flags u32 |
//! root {pgid u64, sequence u64} | freelist pgid u64 | high-water pgid u64 | txid u64 |
//! checksum u64` (FNV-1a 64 of the 56 bytes before it). A bucket's value in its parent leaf is
//! `root pgid u64 | sequence u64`, followed by the bucket's whole page when root is 0 (inline).
//!
//! keel-kv does no I/O: the writer writes into any `Write + Seek` and the reader reads through
//! the `PageSource` its caller implements.
//!
//! Why not the `bbolt-rs` crate (a port of bbolt 1.3.10): one release, no license given on
//! crates.io, a full transactional database (mmap, file locks, freelist management) where
//! snapshots need one sequential write and a read-only walk, and a dependency tree (clap, fake,
//! bumpalo, fs4, ...) that would slow every build here for a few hundred lines of format.

use std::io::{Seek, SeekFrom, Write};

use crate::error::{KvError, Result};

/// The page size Keel writes (etcd's on x86-64 and arm64 Linux).
pub const PAGE_BYTES: usize = 4096;
const PAGE_HEADER_BYTES: usize = 16;
const LEAF_ELEMENT_BYTES: usize = 16;
const BRANCH_ELEMENT_BYTES: usize = 16;
const BUCKET_HEADER_BYTES: usize = 16;
const META_CHECKSUMMED_BYTES: usize = 56;
const MAGIC: u32 = 0xED0C_DAED;
const FORMAT_VERSION: u32 = 2;
const PAGE_FLAG_BRANCH: u16 = 0x01;
const PAGE_FLAG_LEAF: u16 = 0x02;
const PAGE_FLAG_META: u16 = 0x04;
const PAGE_FLAG_FREELIST: u16 = 0x10;
const LEAF_FLAG_BUCKET: u32 = 0x01;
/// The freelist page this writer reserves; pages 0 and 1 are the metas.
const FREELIST_PGID: u64 = 2;
const FIRST_DATA_PGID: u64 = 3;
/// A page's element count is a u16.
const PAGE_ELEMENTS_MAX: usize = u16::MAX as usize;
/// bbolt's limits on one key and one value.
pub const KEY_BYTES_MAX: usize = 32768;
pub const VALUE_BYTES_MAX: usize = (1 << 31) - 2;

const _: () = assert!(
    PAGE_BYTES.is_multiple_of(512),
    "etcdctl expects a multiple of 512"
);
const _: () = assert!(PAGE_HEADER_BYTES + 64 <= PAGE_BYTES);

fn bolt(why: impl Into<String>) -> KvError {
    KvError::Bolt(why.into())
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u16(b: &[u8], at: usize) -> Result<u16> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes(s.try_into().expect("2 bytes")))
        .ok_or_else(|| bolt("a field past the end of its page"))
}
fn get_u32(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or_else(|| bolt("a field past the end of its page"))
}
fn get_u64(b: &[u8], at: usize) -> Result<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or_else(|| bolt("a field past the end of its page"))
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// One element of a page being built: a leaf's key and value, or a branch's key and child.
enum Element {
    Leaf {
        flags: u32,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Branch {
        key: Vec<u8>,
        child: u64,
    },
}

impl Element {
    fn bytes(&self) -> usize {
        match self {
            Element::Leaf { key, value, .. } => LEAF_ELEMENT_BYTES + key.len() + value.len(),
            Element::Branch { key, .. } => BRANCH_ELEMENT_BYTES + key.len(),
        }
    }
    fn key(&self) -> &[u8] {
        match self {
            Element::Leaf { key, .. } | Element::Branch { key, .. } => key,
        }
    }
}

/// Lays out one branch or leaf page (with its overflow pages) whose id is `pgid`.
fn encode_page(pgid: u64, flags: u16, elements: &[Element], page_bytes: usize) -> Vec<u8> {
    assert!(
        elements.len() <= PAGE_ELEMENTS_MAX,
        "a page's count is a u16"
    );
    let data_bytes: usize = elements.iter().map(Element::bytes).sum();
    let pages = (PAGE_HEADER_BYTES + data_bytes).div_ceil(page_bytes).max(1);
    let mut page = vec![0u8; pages * page_bytes];
    put_u64(&mut page, 0, pgid);
    put_u16(&mut page, 8, flags);
    put_u16(&mut page, 10, elements.len() as u16);
    put_u32(
        &mut page,
        12,
        u32::try_from(pages - 1).expect("an overflow run fits a u32"),
    );
    let element_bytes = match flags {
        PAGE_FLAG_LEAF => LEAF_ELEMENT_BYTES,
        _ => BRANCH_ELEMENT_BYTES,
    };
    let mut data_at = PAGE_HEADER_BYTES + elements.len() * element_bytes;
    for (i, element) in elements.iter().enumerate() {
        let at = PAGE_HEADER_BYTES + i * element_bytes;
        let pos = u32::try_from(data_at - at).expect("a page's data offset fits a u32");
        match element {
            Element::Leaf {
                flags: leaf_flags,
                key,
                value,
            } => {
                assert!(flags == PAGE_FLAG_LEAF, "leaf elements go on leaf pages");
                put_u32(&mut page, at, *leaf_flags);
                put_u32(&mut page, at + 4, pos);
                put_u32(&mut page, at + 8, key.len() as u32);
                put_u32(&mut page, at + 12, value.len() as u32);
                page[data_at..data_at + key.len()].copy_from_slice(key);
                data_at += key.len();
                page[data_at..data_at + value.len()].copy_from_slice(value);
                data_at += value.len();
            }
            Element::Branch { key, child } => {
                assert!(
                    flags == PAGE_FLAG_BRANCH,
                    "branch elements go on branch pages"
                );
                put_u32(&mut page, at, pos);
                put_u32(&mut page, at + 4, key.len() as u32);
                put_u64(&mut page, at + 8, *child);
                page[data_at..data_at + key.len()].copy_from_slice(key);
                data_at += key.len();
            }
        }
    }
    assert!(data_at <= page.len());
    page
}

/// The tree of the bucket being written, built bottom-up: `levels[0]` is the leaf being filled,
/// `levels[i]` the branch page being filled with the first keys of finished level-`i-1` pages.
struct TreeBuilder {
    name: Vec<u8>,
    levels: Vec<Vec<Element>>,
    /// Bytes `levels[i]` would take as a page.
    level_bytes: Vec<usize>,
    last_key: Option<Vec<u8>>,
}

/// Writes a bbolt database in one pass (see the module's description).
pub struct BoltWriter<W: Write + Seek> {
    out: W,
    page_bytes: usize,
    next_pgid: u64,
    /// Finished buckets: name and root page.
    buckets: Vec<(Vec<u8>, u64)>,
    tree: Option<TreeBuilder>,
}

impl<W: Write + Seek> BoltWriter<W> {
    /// Starts a database at the current position of `out` (which must be its start).
    pub fn new(mut out: W) -> Result<BoltWriter<W>> {
        // Pages 0..3 (metas and freelist) are written last, once their contents are known.
        out.write_all(&vec![0u8; FIRST_DATA_PGID as usize * PAGE_BYTES])
            .map_err(|e| bolt(format!("write: {e}")))?;
        Ok(BoltWriter {
            out,
            page_bytes: PAGE_BYTES,
            next_pgid: FIRST_DATA_PGID,
            buckets: Vec::new(),
            tree: None,
        })
    }

    /// Begins a top-level bucket; names must ascend and the previous bucket must be finished.
    pub fn begin_bucket(&mut self, name: &[u8]) -> Result<()> {
        assert!(
            self.tree.is_none(),
            "finish a bucket before beginning the next"
        );
        assert!(!name.is_empty() && name.len() <= KEY_BYTES_MAX);
        assert!(
            self.buckets
                .last()
                .is_none_or(|(last, _)| last.as_slice() < name),
            "buckets are written in ascending name order"
        );
        self.tree = Some(TreeBuilder {
            name: name.to_vec(),
            levels: vec![Vec::new()],
            level_bytes: vec![PAGE_HEADER_BYTES],
            last_key: None,
        });
        Ok(())
    }

    /// Adds a key to the open bucket; keys must strictly ascend.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(bolt(format!("a key of {} bytes", key.len())));
        }
        if value.len() > VALUE_BYTES_MAX {
            return Err(bolt(format!("a value of {} bytes", value.len())));
        }
        let tree = self.tree.as_mut().expect("put needs an open bucket");
        assert!(
            tree.last_key.as_deref().is_none_or(|last| last < key),
            "keys are put in strictly ascending order"
        );
        tree.last_key = Some(key.to_vec());
        self.push(
            0,
            Element::Leaf {
                flags: 0,
                key: key.to_vec(),
                value: value.to_vec(),
            },
        )
    }

    /// Adds `element` to level `level`, writing that level's page first when it is full.
    fn push(&mut self, level: usize, element: Element) -> Result<()> {
        let page_bytes = self.page_bytes;
        let tree = self.tree.as_mut().expect("an open bucket");
        let full = !tree.levels[level].is_empty()
            && (tree.level_bytes[level] + element.bytes() > page_bytes
                || tree.levels[level].len() == PAGE_ELEMENTS_MAX);
        if full {
            self.flush_level(level)?;
        }
        let tree = self.tree.as_mut().expect("an open bucket");
        tree.level_bytes[level] += element.bytes();
        tree.levels[level].push(element);
        Ok(())
    }

    /// Writes level `level`'s page and hands its first key to the level above.
    fn flush_level(&mut self, level: usize) -> Result<()> {
        let tree = self.tree.as_mut().expect("an open bucket");
        let elements = std::mem::take(&mut tree.levels[level]);
        tree.level_bytes[level] = PAGE_HEADER_BYTES;
        let first_key = elements
            .first()
            .map(|e| e.key().to_vec())
            .unwrap_or_default();
        if tree.levels.len() == level + 1 {
            tree.levels.push(Vec::new());
            tree.level_bytes.push(PAGE_HEADER_BYTES);
        }
        let pgid = self.write_page(
            if level == 0 {
                PAGE_FLAG_LEAF
            } else {
                PAGE_FLAG_BRANCH
            },
            &elements,
        )?;
        self.push(
            level + 1,
            Element::Branch {
                key: first_key,
                child: pgid,
            },
        )
    }

    fn write_page(&mut self, flags: u16, elements: &[Element]) -> Result<u64> {
        let pgid = self.next_pgid;
        let page = encode_page(pgid, flags, elements, self.page_bytes);
        self.out
            .write_all(&page)
            .map_err(|e| bolt(format!("write: {e}")))?;
        self.next_pgid += (page.len() / self.page_bytes) as u64;
        Ok(pgid)
    }

    /// Finishes the open bucket: writes its partly filled pages, bottom up, down to one root.
    pub fn end_bucket(&mut self) -> Result<()> {
        let mut level = 0;
        loop {
            let tree = self.tree.as_ref().expect("end_bucket needs an open bucket");
            let top = tree.levels.len() == level + 1;
            if top {
                // The top level holds the root: a leaf (possibly empty) when everything fit in one
                // page, else one branch page over the pages below.
                if level > 0 && tree.levels[level].len() == 1 {
                    let Element::Branch { child, .. } = tree.levels[level][0] else {
                        unreachable!("levels above 0 hold branch elements")
                    };
                    let name = tree.name.clone();
                    self.buckets.push((name, child));
                } else {
                    let flags = if level == 0 {
                        PAGE_FLAG_LEAF
                    } else {
                        PAGE_FLAG_BRANCH
                    };
                    let elements = std::mem::take(
                        &mut self.tree.as_mut().expect("an open bucket").levels[level],
                    );
                    let root = self.write_page(flags, &elements)?;
                    let name = self.tree.as_ref().expect("an open bucket").name.clone();
                    self.buckets.push((name, root));
                }
                self.tree = None;
                return Ok(());
            }
            if !tree.levels[level].is_empty() {
                self.flush_level(level)?;
            }
            level += 1;
        }
    }

    /// Writes the root bucket, the freelist and the metas; returns the output and the
    /// database's size in bytes (the high-water mark times the page size).
    pub fn finish(mut self) -> Result<(W, u64)> {
        assert!(self.tree.is_none(), "finish the last bucket first");
        let elements: Vec<Element> = std::mem::take(&mut self.buckets)
            .into_iter()
            .map(|(name, root)| {
                let mut header = vec![0u8; BUCKET_HEADER_BYTES];
                put_u64(&mut header, 0, root);
                Element::Leaf {
                    flags: LEAF_FLAG_BUCKET,
                    key: name,
                    value: header,
                }
            })
            .collect();
        let root = self.write_page(PAGE_FLAG_LEAF, &elements)?;
        let high_pgid = self.next_pgid;
        let io = |e: std::io::Error| bolt(format!("write: {e}"));
        // The freelist: empty, every page is in use.
        let mut freelist = vec![0u8; self.page_bytes];
        put_u64(&mut freelist, 0, FREELIST_PGID);
        put_u16(&mut freelist, 8, PAGE_FLAG_FREELIST);
        self.out
            .seek(SeekFrom::Start(FREELIST_PGID * self.page_bytes as u64))
            .map_err(io)?;
        self.out.write_all(&freelist).map_err(io)?;
        // Two metas: bbolt reads the valid one with the higher txid and writes its next commit
        // over the other.
        for pgid in 0..2u64 {
            let mut page = vec![0u8; self.page_bytes];
            put_u64(&mut page, 0, pgid);
            put_u16(&mut page, 8, PAGE_FLAG_META);
            let m = PAGE_HEADER_BYTES;
            put_u32(&mut page, m, MAGIC);
            put_u32(&mut page, m + 4, FORMAT_VERSION);
            put_u32(&mut page, m + 8, self.page_bytes as u32);
            put_u64(&mut page, m + 16, root);
            put_u64(&mut page, m + 32, FREELIST_PGID);
            put_u64(&mut page, m + 40, high_pgid);
            put_u64(&mut page, m + 48, pgid + 1);
            let checksum = fnv1a64(&page[m..m + META_CHECKSUMMED_BYTES]);
            put_u64(&mut page, m + META_CHECKSUMMED_BYTES, checksum);
            self.out
                .seek(SeekFrom::Start(pgid * self.page_bytes as u64))
                .map_err(io)?;
            self.out.write_all(&page).map_err(io)?;
        }
        self.out
            .seek(SeekFrom::Start(high_pgid * self.page_bytes as u64))
            .map_err(io)?;
        self.out.flush().map_err(io)?;
        Ok((self.out, high_pgid * self.page_bytes as u64))
    }
}

/// Where a reader's pages come from: a file (pread) or bytes in memory.
pub trait PageSource {
    /// Fills `buf` from `offset`; a short source is an error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl PageSource for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let src = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// A bucket walk's callback: each key and its value (`None` for a nested bucket).
pub type Visit<'a> = dyn FnMut(&[u8], Option<&[u8]>) -> Result<()> + 'a;
/// The raw walk's callback: key, leaf flags, value bytes.
type VisitRaw<'a> = dyn FnMut(&[u8], u32, &[u8]) -> Result<()> + 'a;

/// A bucket found in its parent: its root page, or its whole page stored inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bucket {
    Paged(u64),
    Inline(Vec<u8>),
}

impl Bucket {
    fn from_value(value: &[u8]) -> Result<Bucket> {
        let root = get_u64(value, 0).map_err(|_| bolt("a bucket value shorter than its header"))?;
        if root == 0 {
            Ok(Bucket::Inline(
                value[BUCKET_HEADER_BYTES.min(value.len())..].to_vec(),
            ))
        } else {
            Ok(Bucket::Paged(root))
        }
    }
}

/// The meta page a reader follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub page_bytes: u32,
    pub root: u64,
    pub freelist: u64,
    /// Pages in use: the database's size is this times the page size.
    pub high_pgid: u64,
    pub txid: u64,
}

fn decode_meta(page: &[u8]) -> Result<Meta> {
    let m = PAGE_HEADER_BYTES;
    if get_u16(page, 8)? & PAGE_FLAG_META == 0 {
        return Err(bolt("a meta page without the meta flag"));
    }
    if get_u32(page, m)? != MAGIC {
        return Err(bolt("invalid database: bad magic"));
    }
    if get_u32(page, m + 4)? != FORMAT_VERSION {
        return Err(bolt("version mismatch"));
    }
    let checksum = get_u64(page, m + META_CHECKSUMMED_BYTES)?;
    if fnv1a64(&page[m..m + META_CHECKSUMMED_BYTES]) != checksum {
        return Err(bolt("checksum error"));
    }
    Ok(Meta {
        page_bytes: get_u32(page, m + 8)?,
        root: get_u64(page, m + 16)?,
        freelist: get_u64(page, m + 32)?,
        high_pgid: get_u64(page, m + 40)?,
        txid: get_u64(page, m + 48)?,
    })
}

/// Reads a bbolt database page by page (see the module's description).
pub struct BoltReader<S: PageSource + ?Sized> {
    meta: Meta,
    source_bytes: u64,
    source: Box<S>,
}

/// Pages deeper than this are a loop in a damaged file, not a tree (bbolt's trees are a few
/// levels deep even for terabytes).
const TREE_DEPTH_MAX: usize = 64;

impl<S: PageSource + ?Sized> BoltReader<S> {
    /// Opens a database of `source_bytes` bytes: the newer valid meta page wins.
    pub fn open(source: Box<S>, source_bytes: u64) -> Result<BoltReader<S>> {
        let read_meta = |offset: u64| -> Result<Meta> {
            let mut page = vec![0u8; PAGE_HEADER_BYTES + 64];
            source
                .read_exact_at(&mut page, offset)
                .map_err(|e| bolt(format!("reading a meta page: {e}")))?;
            decode_meta(&page)
        };
        let meta0 = read_meta(0);
        // bbolt finds meta 1 after meta 0's page size, or the OS page size when meta 0 is bad.
        let page1_at = match &meta0 {
            Ok(m) => u64::from(m.page_bytes),
            Err(_) => PAGE_BYTES as u64,
        };
        let meta1 = read_meta(page1_at);
        let meta = match (meta0, meta1) {
            (Ok(a), Ok(b)) => {
                if b.txid > a.txid {
                    b
                } else {
                    a
                }
            }
            (Ok(a), Err(_)) => a,
            (Err(_), Ok(b)) => b,
            (Err(e), Err(_)) => return Err(e),
        };
        let page_bytes = meta.page_bytes as usize;
        if !(512..=1 << 20).contains(&page_bytes) || !page_bytes.is_power_of_two() {
            return Err(bolt(format!("page size {page_bytes}")));
        }
        if meta.high_pgid < 3 || meta.root < 2 || meta.root >= meta.high_pgid {
            return Err(bolt("meta page names pages out of bounds"));
        }
        if meta.high_pgid.saturating_mul(page_bytes as u64) > source_bytes {
            return Err(bolt(format!(
                "file size too small: {source_bytes} bytes for {} pages",
                meta.high_pgid
            )));
        }
        Ok(BoltReader {
            meta,
            source_bytes,
            source,
        })
    }

    pub fn meta(&self) -> Meta {
        self.meta
    }

    /// bbolt's `tx.Size()`: the bytes in use.
    pub fn size_bytes(&self) -> u64 {
        self.meta.high_pgid * u64::from(self.meta.page_bytes)
    }

    /// Reads page `pgid` with its overflow pages.
    fn page(&self, pgid: u64) -> Result<Vec<u8>> {
        let page_bytes = u64::from(self.meta.page_bytes);
        if pgid >= self.meta.high_pgid {
            return Err(bolt(format!(
                "page {pgid}: out of bounds: {}",
                self.meta.high_pgid
            )));
        }
        let mut header = [0u8; PAGE_HEADER_BYTES];
        let read = |buf: &mut [u8], at: u64| {
            self.source
                .read_exact_at(buf, at)
                .map_err(|e| bolt(format!("page {pgid}: {e}")))
        };
        read(&mut header, pgid * page_bytes)?;
        let overflow = u64::from(get_u32(&header, 12)?);
        let pages = overflow + 1;
        if pgid + pages > self.meta.high_pgid || (pgid + pages) * page_bytes > self.source_bytes {
            return Err(bolt(format!("page {pgid}: overflow past the end")));
        }
        let mut page = vec![0u8; (pages * page_bytes) as usize];
        read(&mut page, pgid * page_bytes)?;
        if get_u64(&page, 0)? != pgid {
            return Err(bolt(format!("page {pgid}: the page names another id")));
        }
        Ok(page)
    }

    /// The top-level buckets, in name order.
    pub fn buckets(&self) -> Result<Vec<(Vec<u8>, Bucket)>> {
        let mut buckets = Vec::new();
        self.for_each_raw(&Bucket::Paged(self.meta.root), &mut |key, flags, value| {
            if flags & LEAF_FLAG_BUCKET == 0 {
                return Err(bolt("a top-level key that is not a bucket"));
            }
            buckets.push((key.to_vec(), Bucket::from_value(value)?));
            Ok(())
        })?;
        Ok(buckets)
    }

    /// The top-level bucket `name`, if present.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket>> {
        Ok(self
            .buckets()?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b))
    }

    /// Visits every key of `bucket` in order, as bbolt's `Bucket.ForEach`: the value is `None`
    /// for a nested bucket.
    pub fn for_each(&self, bucket: &Bucket, f: &mut Visit<'_>) -> Result<()> {
        self.for_each_raw(bucket, &mut |key, flags, value| {
            if flags & LEAF_FLAG_BUCKET != 0 {
                f(key, None)
            } else {
                f(key, Some(value))
            }
        })
    }

    fn for_each_raw(&self, bucket: &Bucket, f: &mut VisitRaw<'_>) -> Result<()> {
        let mut last_key: Option<Vec<u8>> = None;
        match bucket {
            Bucket::Paged(root) => self.walk(*root, 0, &mut last_key, f),
            Bucket::Inline(page) => self.walk_page(page, 0, &mut last_key, f),
        }
    }

    fn walk(
        &self,
        pgid: u64,
        depth: usize,
        last_key: &mut Option<Vec<u8>>,
        f: &mut VisitRaw<'_>,
    ) -> Result<()> {
        if depth > TREE_DEPTH_MAX {
            return Err(bolt(format!(
                "page {pgid}: the tree is deeper than {TREE_DEPTH_MAX}"
            )));
        }
        let page = self.page(pgid)?;
        self.walk_page(&page, depth, last_key, f)
    }

    fn walk_page(
        &self,
        page: &[u8],
        depth: usize,
        last_key: &mut Option<Vec<u8>>,
        f: &mut VisitRaw<'_>,
    ) -> Result<()> {
        let pgid = get_u64(page, 0)?;
        let flags = get_u16(page, 8)?;
        let count = usize::from(get_u16(page, 10)?);
        let slice = |at: usize, len: usize| -> Result<&[u8]> {
            at.checked_add(len)
                .and_then(|end| page.get(at..end))
                .ok_or_else(|| bolt(format!("page {pgid}: an element past the end of its page")))
        };
        if flags & PAGE_FLAG_BRANCH != 0 {
            for i in 0..count {
                let at = PAGE_HEADER_BYTES + i * BRANCH_ELEMENT_BYTES;
                let pos = get_u32(page, at)? as usize;
                let _key = slice(at + pos, get_u32(page, at + 4)? as usize)?;
                let child = get_u64(page, at + 8)?;
                self.walk(child, depth + 1, last_key, f)?;
            }
            Ok(())
        } else if flags & PAGE_FLAG_LEAF != 0 {
            for i in 0..count {
                let at = PAGE_HEADER_BYTES + i * LEAF_ELEMENT_BYTES;
                let leaf_flags = get_u32(page, at)?;
                let pos = get_u32(page, at + 4)? as usize;
                let ksize = get_u32(page, at + 8)? as usize;
                let vsize = get_u32(page, at + 12)? as usize;
                let key = slice(at + pos, ksize)?;
                let value = slice(at + pos + ksize, vsize)?;
                if last_key.as_deref().is_some_and(|last| last >= key) {
                    return Err(bolt(format!("page {pgid}: keys out of order")));
                }
                *last_key = Some(key.to_vec());
                f(key, leaf_flags, value)?;
            }
            Ok(())
        } else {
            Err(bolt(format!("page {pgid}: invalid type {flags:#x}")))
        }
    }
}

/// bbolt's "no freelist stored" marker (its freelist is rebuilt by scanning at open).
const PGID_NO_FREELIST: u64 = u64::MAX;

/// One bit per page: bounded memory (a 10 GiB database of 4 KiB pages takes 320 KiB).
struct PageSet(Vec<u64>);

impl PageSet {
    fn new(pages: u64) -> PageSet {
        PageSet(vec![0; pages.div_ceil(64) as usize])
    }
    /// Marks `pgid`; false when it was already marked.
    fn insert(&mut self, pgid: u64) -> bool {
        let (word, bit) = ((pgid / 64) as usize, pgid % 64);
        let was = self.0[word] & (1 << bit) != 0;
        self.0[word] |= 1 << bit;
        !was
    }
    fn contains(&self, pgid: u64) -> bool {
        self.0[(pgid / 64) as usize] & (1 << (pgid % 64)) != 0
    }
}

impl<S: PageSource + ?Sized> BoltReader<S> {
    /// bbolt's `tx.Check`, which `etcdctl snapshot status` runs first: no page freed twice,
    /// every page of every bucket in bounds, referenced once, not freed and a branch or leaf,
    /// and every page below the high-water mark either reachable or free. Fails on the first
    /// problem found.
    pub fn check(&self) -> Result<()> {
        let high = self.meta.high_pgid;
        let mut freed = PageSet::new(high);
        let mut reachable = PageSet::new(high);
        reachable.insert(0);
        reachable.insert(1);
        let freelist_stored = self.meta.freelist != PGID_NO_FREELIST;
        if freelist_stored {
            let page = self.page(self.meta.freelist)?;
            let overflow = u64::from(get_u32(&page, 12)?);
            for i in 0..=overflow {
                reachable.insert(self.meta.freelist + i);
            }
            let mut count = u64::from(get_u16(&page, 10)?);
            let mut at = PAGE_HEADER_BYTES;
            if count == 0xFFFF {
                // The real count is the first element when it does not fit the header.
                count = get_u64(&page, at)?;
                at += 8;
            }
            for i in 0..count {
                let id = get_u64(&page, at + 8 * i as usize)?;
                if id >= high {
                    return Err(bolt(format!("page {id}: freed page out of bounds")));
                }
                if !freed.insert(id) {
                    return Err(bolt(format!("page {id}: already freed")));
                }
            }
        }
        self.check_tree(self.meta.root, 0, &mut reachable, &freed)?;
        for pgid in 0..high {
            if !reachable.contains(pgid) && !freed.contains(pgid) && freelist_stored {
                return Err(bolt(format!("page {pgid}: unreachable unfreed")));
            }
        }
        Ok(())
    }

    fn check_tree(
        &self,
        pgid: u64,
        depth: usize,
        reachable: &mut PageSet,
        freed: &PageSet,
    ) -> Result<()> {
        if depth > TREE_DEPTH_MAX {
            return Err(bolt(format!(
                "page {pgid}: the tree is deeper than {TREE_DEPTH_MAX}"
            )));
        }
        let page = self.page(pgid)?;
        let overflow = u64::from(get_u32(&page, 12)?);
        for i in 0..=overflow {
            if !reachable.insert(pgid + i) {
                return Err(bolt(format!("page {}: multiple references", pgid + i)));
            }
        }
        if freed.contains(pgid) {
            return Err(bolt(format!("page {pgid}: reachable freed")));
        }
        let flags = get_u16(&page, 8)?;
        let count = usize::from(get_u16(&page, 10)?);
        if flags & PAGE_FLAG_BRANCH != 0 {
            for i in 0..count {
                let child = get_u64(&page, PAGE_HEADER_BYTES + i * BRANCH_ELEMENT_BYTES + 8)?;
                self.check_tree(child, depth + 1, reachable, freed)?;
            }
        } else if flags & PAGE_FLAG_LEAF != 0 {
            for i in 0..count {
                let at = PAGE_HEADER_BYTES + i * LEAF_ELEMENT_BYTES;
                if get_u32(&page, at)? & LEAF_FLAG_BUCKET == 0 {
                    continue;
                }
                let pos = get_u32(&page, at + 4)? as usize;
                let ksize = get_u32(&page, at + 8)? as usize;
                // Inline buckets own no pages (bbolt's check skips them too).
                if let Bucket::Paged(root) = Bucket::from_value(
                    page.get(at + pos + ksize..)
                        .ok_or_else(|| bolt(format!("page {pgid}: a bucket past its page")))?,
                )? {
                    self.check_tree(root, depth + 1, reachable, freed)?;
                }
            }
        } else {
            return Err(bolt(format!("page {pgid}: invalid type {flags:#x}")));
        }
        Ok(())
    }
}

/// The integrity facts `etcdctl snapshot status` prints, computed as etcd 3.4 does
/// (clientv3/snapshot): CRC-32C over each top-level bucket's name then its keys and values,
/// the revision of the last key in `key`, the count of keys over all buckets, and the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub hash: u32,
    pub revision: i64,
    pub total_key: u64,
    pub total_size: u64,
}

/// CRC-32C (Castagnoli), the table etcd's snapshot status hashes with.
struct Crc32c {
    table: [u32; 256],
    crc: u32,
}

impl Crc32c {
    fn new() -> Crc32c {
        let mut table = [0u32; 256];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0x82F6_3B78 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        Crc32c { table, crc: !0 }
    }
    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.crc = self.table[((self.crc ^ u32::from(*b)) & 0xff) as usize] ^ (self.crc >> 8);
        }
    }
    fn finish(&self) -> u32 {
        !self.crc
    }
}

impl<S: PageSource + ?Sized> BoltReader<S> {
    /// `etcdctl snapshot status`'s numbers for this database.
    pub fn status(&self) -> Result<Status> {
        self.check()
            .map_err(|e| bolt(format!("snapshot file integrity check failed: {e}")))?;
        let mut crc = Crc32c::new();
        let mut revision = 0i64;
        let mut total_key = 0u64;
        for (name, bucket) in self.buckets()? {
            crc.update(&name);
            let is_key_bucket = name == b"key";
            self.for_each(&bucket, &mut |k, v| {
                crc.update(k);
                crc.update(v.unwrap_or_default());
                if is_key_bucket {
                    let main = k
                        .get(0..8)
                        .ok_or_else(|| bolt("a key-bucket key shorter than a revision"))?;
                    revision = i64::from_be_bytes(main.try_into().expect("8 bytes"));
                }
                total_key += 1;
                Ok(())
            })?;
        }
        Ok(Status {
            hash: crc.finish(),
            revision,
            total_key,
            total_size: self.size_bytes(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    fn write(buckets: &[(&str, Pairs)]) -> Vec<u8> {
        let mut w = BoltWriter::new(Cursor::new(Vec::new())).expect("in memory");
        for (name, kvs) in buckets {
            w.begin_bucket(name.as_bytes()).expect("begin");
            for (k, v) in kvs {
                w.put(k, v).expect("put");
            }
            w.end_bucket().expect("end");
        }
        let (out, size) = w.finish().expect("finish");
        let bytes = out.into_inner();
        assert_eq!(
            bytes.len() as u64,
            size,
            "the file is exactly the pages in use"
        );
        bytes
    }

    fn read_all(bytes: &[u8]) -> Vec<(Vec<u8>, Pairs)> {
        let r = BoltReader::open(Box::<[u8]>::from(bytes), bytes.len() as u64).expect("opens");
        let mut out = Vec::new();
        for (name, bucket) in r.buckets().expect("buckets") {
            let mut kvs = Vec::new();
            r.for_each(&bucket, &mut |k, v| {
                kvs.push((k.to_vec(), v.expect("no nested buckets").to_vec()));
                Ok(())
            })
            .expect("walk");
            out.push((name, kvs));
        }
        out
    }

    /// Every page below the high-water mark is reachable exactly once (bbolt's tx.Check).
    fn check_reachability(bytes: &[u8]) {
        let r = BoltReader::open(Box::<[u8]>::from(bytes), bytes.len() as u64).expect("opens");
        let meta = r.meta();
        let mut seen = vec![0u32; meta.high_pgid as usize];
        seen[0] += 1;
        seen[1] += 1;
        seen[meta.freelist as usize] += 1;
        fn visit(r: &BoltReader<[u8]>, pgid: u64, seen: &mut [u32]) {
            let page = r.page(pgid).expect("a page");
            let overflow = get_u32(&page, 12).expect("header");
            for i in 0..=u64::from(overflow) {
                seen[(pgid + i) as usize] += 1;
            }
            let flags = get_u16(&page, 8).expect("header");
            let count = get_u16(&page, 10).expect("header") as usize;
            for i in 0..count {
                let at = PAGE_HEADER_BYTES + i * 16;
                if flags == PAGE_FLAG_BRANCH {
                    visit(r, get_u64(&page, at + 8).expect("child"), seen);
                } else if get_u32(&page, at).expect("flags") & LEAF_FLAG_BUCKET != 0 {
                    let pos = get_u32(&page, at + 4).expect("pos") as usize;
                    let ksize = get_u32(&page, at + 8).expect("ksize") as usize;
                    let root = get_u64(&page, at + pos + ksize).expect("bucket root");
                    if root != 0 {
                        visit(r, root, seen);
                    }
                }
            }
        }
        visit(&r, meta.root, &mut seen);
        assert!(seen.iter().all(|n| *n == 1), "pages seen: {seen:?}");
        r.check().expect("bbolt's check passes");
    }

    #[test]
    fn the_check_finds_unreachable_and_doubly_referenced_pages() {
        let kvs: Vec<(Vec<u8>, Vec<u8>)> = (0..2000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![7; 100]))
            .collect();
        let bytes = write(&[("a", kvs.clone()), ("b", kvs)]);
        let open =
            |b: &[u8]| BoltReader::open(Box::<[u8]>::from(b), b.len() as u64).expect("opens");
        open(&bytes).check().expect("a fresh file passes");
        // Point bucket "b" at bucket "a"'s root: a's pages are referenced twice, b's orphaned.
        let r = open(&bytes);
        let roots: Vec<u64> = r
            .buckets()
            .expect("buckets")
            .into_iter()
            .map(|(_, b)| match b {
                Bucket::Paged(root) => root,
                Bucket::Inline(_) => panic!("the writer makes paged buckets"),
            })
            .collect();
        let root_page = r.meta().root as usize * PAGE_BYTES;
        let mut damaged = bytes.clone();
        let needle = roots[1].to_le_bytes();
        let at = damaged[root_page..root_page + PAGE_BYTES]
            .windows(8)
            .position(|w| w == needle)
            .expect("b's root is in the root page")
            + root_page;
        damaged[at..at + 8].copy_from_slice(&roots[0].to_le_bytes());
        let err = open(&damaged).check().expect_err("damage found");
        assert!(err.to_string().contains("multiple references"), "{err}");
        assert!(open(&damaged).status().is_err());
    }

    #[test]
    fn round_trips_small_buckets() {
        let buckets = vec![
            ("alarm", vec![]),
            (
                "key",
                vec![(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), vec![])],
            ),
            (
                "meta",
                vec![(b"consistent_index".to_vec(), 7u64.to_be_bytes().to_vec())],
            ),
        ];
        let bytes = write(&buckets);
        assert_eq!(bytes.len() % PAGE_BYTES, 0);
        let back = read_all(&bytes);
        let expected: Vec<_> = buckets
            .iter()
            .map(|(n, kvs)| (n.as_bytes().to_vec(), kvs.clone()))
            .collect();
        assert_eq!(back, expected);
        check_reachability(&bytes);
    }

    #[test]
    fn many_keys_span_branch_levels_and_overflow_values_round_trip() {
        // 200k small keys need three levels; a few large values need overflow pages.
        let kvs: Vec<(Vec<u8>, Vec<u8>)> = (0..200_000u64)
            .map(|i| {
                let value = if i % 50_000 == 7 {
                    vec![(i % 251) as u8; 3 * PAGE_BYTES + 100]
                } else {
                    format!("v{i}").into_bytes()
                };
                (i.to_be_bytes().to_vec(), value)
            })
            .collect();
        let bytes = write(&[
            ("a", vec![]),
            ("key", kvs.clone()),
            ("z", kvs[..3].to_vec()),
        ]);
        let back = read_all(&bytes);
        assert_eq!(back[1].1.len(), kvs.len());
        assert!(back[1].1 == kvs, "every key and value reads back");
        assert_eq!(back[2].1, kvs[..3].to_vec());
        check_reachability(&bytes);
        let status = BoltReader::open(Box::<[u8]>::from(&bytes[..]), bytes.len() as u64)
            .expect("opens")
            .status()
            .expect("status");
        assert_eq!(status.total_key, 200_003);
        assert_eq!(status.total_size, bytes.len() as u64);
    }

    #[test]
    fn a_value_larger_than_a_page_is_alone_on_its_overflow_run() {
        let big = vec![0xab; 10 * PAGE_BYTES];
        let bytes = write(&[(
            "b",
            vec![
                (b"k1".to_vec(), big.clone()),
                (b"k2".to_vec(), b"x".to_vec()),
            ],
        )]);
        let back = read_all(&bytes);
        assert_eq!(back[0].1[0].1, big);
        check_reachability(&bytes);
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let bytes = write(&[("key", vec![(b"a".to_vec(), b"1".to_vec())])]);
        // A bad meta 0 falls back to meta 1.
        let mut one_bad = bytes.clone();
        one_bad[PAGE_HEADER_BYTES + 20] ^= 1;
        assert_eq!(read_all(&one_bad), read_all(&bytes));
        let mut both_bad = one_bad.clone();
        both_bad[PAGE_BYTES + PAGE_HEADER_BYTES + 20] ^= 1;
        assert!(BoltReader::open(Box::<[u8]>::from(&both_bad[..]), both_bad.len() as u64).is_err());
        // A truncated file is refused at open.
        let short = &bytes[..bytes.len() - PAGE_BYTES];
        assert!(BoltReader::open(Box::<[u8]>::from(short), short.len() as u64).is_err());
        // A leaf element pointing past its page is an error.
        let mut bad_leaf = bytes.clone();
        let leaf_at = FIRST_DATA_PGID as usize * PAGE_BYTES;
        put_u32(&mut bad_leaf, leaf_at + PAGE_HEADER_BYTES + 12, 1 << 20);
        let r = BoltReader::open(Box::<[u8]>::from(&bad_leaf[..]), bad_leaf.len() as u64)
            .expect("metas are fine");
        let bucket = r.bucket(b"key").expect("root").expect("bucket");
        assert!(r.for_each(&bucket, &mut |_, _| Ok(())).is_err());
    }

    #[test]
    fn inline_buckets_read_as_bbolt_writes_them() {
        // An inline bucket: header with root 0, then a leaf page with id 0.
        let page = encode_page(
            0,
            PAGE_FLAG_LEAF,
            &[Element::Leaf {
                flags: 0,
                key: b"clusterVersion".to_vec(),
                value: b"3.4.0".to_vec(),
            }],
            PAGE_BYTES,
        );
        let used = PAGE_HEADER_BYTES + LEAF_ELEMENT_BYTES + 14 + 5;
        let mut value = vec![0u8; BUCKET_HEADER_BYTES];
        value.extend_from_slice(&page[..used]);
        let bucket = Bucket::from_value(&value).expect("a bucket value");
        let bytes = write(&[("key", vec![])]);
        let r = BoltReader::open(Box::<[u8]>::from(&bytes[..]), bytes.len() as u64).expect("opens");
        let mut seen = Vec::new();
        r.for_each(&bucket, &mut |k, v| {
            seen.push((k.to_vec(), v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .expect("walk");
        assert_eq!(
            seen,
            vec![(b"clusterVersion".to_vec(), Some(b"3.4.0".to_vec()))]
        );
    }

    #[test]
    fn crc32c_matches_the_castagnoli_check_value() {
        let mut c = Crc32c::new();
        c.update(b"123456789");
        assert_eq!(c.finish(), 0xE306_9283);
    }
}
