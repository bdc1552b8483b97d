//! glommio's DMA reads through io_uring work on a freshly created segment: the store answers
//! glommio's IOPOLL probe with a non-empty file before its first segment, so the probe is not
//! fooled by an empty one (see `DmaStore::prime_iopoll_probe`).
//!
//! A test binary of its own: the probe's answer is cached per device for the whole process, so
//! this process must open no DmaFile before the store does.

use std::path::PathBuf;

use glommio::{LocalExecutorBuilder, Placement};
use keel_io::{pread_fallbacks, DmaStore, SegmentStore};

/// A directory on a real file system that supports O_DIRECT (`KEEL_WAL_TEST_DIR` overrides).
fn test_dir() -> tempfile::TempDir {
    let parent =
        std::env::var_os("KEEL_WAL_TEST_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    tempfile::Builder::new()
        .prefix("keel-io-reads")
        .tempdir_in(parent)
        .expect("a temp dir")
}

#[test]
fn a_freshly_created_segment_reads_back_through_io_uring() {
    let dir = test_dir();
    let path = dir.path().join("wal");
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .make()
        .expect("glommio executor starts")
        .run(async move {
            let store = DmaStore::new(&path);
            assert!(store.list().await.expect("list").is_empty());
            // The first segment is created empty (the case that fooled the probe).
            let segment = store.create(0, 1 << 20).await.expect("create");
            let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
            store.write_at(&segment, 8192, &data).await.expect("write");
            store.fdatasync(&segment).await.expect("fdatasync");
            let read = store
                .read_at(&segment, 8192, data.len())
                .await
                .expect("read through io_uring");
            assert_eq!(read, data);
            // Blocks never written read back as the zeros the segment was filled with, and a
            // read at the end of the file comes back short.
            let zeros = store.read_at(&segment, 1 << 19, 4096).await.expect("read");
            assert_eq!(zeros, vec![0u8; 4096]);
            let end = store
                .read_at(&segment, (1 << 20) - 4096, 8192)
                .await
                .expect("read");
            assert_eq!(end.len(), 4096);
            let reopened = store.open(0).await.expect("open");
            assert_eq!(
                store
                    .read_at(&reopened, 8192, data.len())
                    .await
                    .expect("read"),
                data
            );
        });
    assert_eq!(
        pread_fallbacks(),
        0,
        "io_uring refused a read: the IOPOLL probe was fooled"
    );
}
