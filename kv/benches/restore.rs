//! keel-kv restart benchmark: the restore of a checkpoint whose values are in segment files,
//! at the key counts users run. A server's start is WAL open + this + the WAL tail; this is the
//! part that grows with the keys (BENCHMARKS.md, issue #10).
//!
//! Loads `KEYS` (default 1,000,000) keys of 16 bytes with 1 KiB values into a store whose
//! value log is on disk (segment files in a temporary directory, mapped as the server maps
//! them), serializes a checkpoint, then restores it `REPEATS` (default 3) times with each
//! number of helper threads from 0 to `HELPERS` (default 1, as a 2-CPU server uses), timing
//! each. mimalloc is the allocator, as in the server.
//!
//! Run: `CARGO_TARGET_DIR=/work/target-rel KEYS=4000000 cargo bench -p keel-kv --bench restore`

use std::time::Instant;

use bytes::Bytes;
use keel_kv::{Op, PutRequest, RestoreHelpers, Store, ValueLogOptions, Writer};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SEGMENT_BYTES: usize = 64 << 20;
const VALUE_BYTES: usize = 1024;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().expect("a number"))
}

fn write_sealed(w: &mut Writer, dir: &std::path::Path) {
    for sealed in w.take_sealed_segments() {
        let path = keel_io::vlog::segment_path(dir, sealed.id);
        std::fs::write(&path, &sealed.records).expect("write a segment");
        let mapped = keel_io::vlog::map_file(&path).expect("map a segment");
        w.segment_durable(sealed.id, sealed.bytes, mapped);
    }
}

fn main() {
    let keys = env_or("KEYS", 1_000_000);
    let repeats = env_or("REPEATS", 3);
    let helpers_max = env_or("HELPERS", 1);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let options = ValueLogOptions {
        segment_bytes: SEGMENT_BYTES,
        first_segment_id: 0,
        on_disk: true,
    };
    let (mut w, _r) = Store::with_value_log(options);
    let value = Bytes::from(vec![b'v'; VALUE_BYTES]);
    let start = Instant::now();
    for i in 0..keys {
        let op = Op::Put(PutRequest {
            key: Bytes::from(format!("key/{i:012}")),
            value: value.clone(),
            ..Default::default()
        });
        w.apply(i as u64 + 1, &op).expect("put");
        if i % 10_000 == 0 {
            write_sealed(&mut w, dir.path());
        }
    }
    write_sealed(&mut w, dir.path());
    println!(
        "load: {keys} puts of {VALUE_BYTES}-byte values in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let start = Instant::now();
    let image = w
        .checkpoint_source()
        .serialize()
        .expect("no compaction meanwhile");
    println!(
        "checkpoint: {} bytes serialized in {:.0} ms",
        image.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    drop((w, _r));
    for repeat in 0..repeats {
        for threads in 0..=helpers_max {
            let start = Instant::now();
            let restored = Store::restore_with_helpers(
                &image,
                ValueLogOptions {
                    first_segment_id: 1 << 20,
                    ..options
                },
                &mut |id| {
                    keel_io::vlog::map_file(&keel_io::vlog::segment_path(dir.path(), id))
                        .map_err(|e| e.to_string())
                },
                RestoreHelpers {
                    threads,
                    on_start: &|| {},
                },
            )
            .expect("our checkpoint");
            let restore_ms = start.elapsed().as_secs_f64() * 1e3;
            let start = Instant::now();
            drop(restored);
            println!(
                "restore {repeat}, {threads} helpers: {keys} keys in {restore_ms:.0} ms ({:.0} ns per key); drop {:.0} ms",
                restore_ms * 1e6 / keys as f64,
                start.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}
