//! WAL appends/s and latency with 1, 16 and 256 concurrent appenders of 256-byte records, beside
//! the disk's own 4 KiB O_DIRECT write + fdatasync floor measured in the same run (before and after).
//!
//! Run: `cargo bench -p keel-io --bench wal` (`KEEL_WAL_BENCH_DIR` picks the file system; the default
//! is the system temporary directory, which must support O_DIRECT).

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::{LocalExecutorBuilder, Placement};
use keel_io::{measure_fsync_floor, DmaStore, FloorStats, Record, Wal, WalConfig};

const RECORD_PAYLOAD_BYTES: usize = 256;
const FLOOR_SAMPLES: usize = 1000;

fn print_row(name: &str, stats: &FloorStats, records_per_batch: f64, floor_p50_us: f64) {
    println!(
        "| {name:<34} | {:>9.0} | {:>8.0} | {:>8.0} | {:>8.0} | {:>13.1} | {:>11.2} |",
        stats.ops_per_sec,
        stats.p50_us,
        stats.p99_us,
        stats.max_us,
        records_per_batch,
        stats.p50_us / floor_p50_us
    );
}

async fn run_appenders(dir: &Path, appenders: usize, appends_each: usize) -> (FloorStats, f64) {
    // Open once and close so that the spare segment is prepared before the clock starts.
    let (wal, _) = Wal::open(DmaStore::new(dir), WalConfig::default())
        .await
        .expect("wal opens");
    wal.close().await;
    let (wal, _) = Wal::open(DmaStore::new(dir), WalConfig::default())
        .await
        .expect("wal reopens");
    let wal = Rc::new(wal);
    let next_index = Rc::new(Cell::new(1u64));
    let latencies = Rc::new(RefCell::new(Vec::with_capacity(appenders * appends_each)));
    let payload = Bytes::from(vec![0x5Au8; RECORD_PAYLOAD_BYTES]);
    let started = Instant::now();
    let tasks: Vec<_> = (0..appenders)
        .map(|_| {
            let (wal, next_index, latencies, payload) = (
                wal.clone(),
                next_index.clone(),
                latencies.clone(),
                payload.clone(),
            );
            glommio::spawn_local(async move {
                for _ in 0..appends_each {
                    let index = next_index.get();
                    next_index.set(index + 1);
                    let record = Record {
                        kind: 1,
                        index,
                        payload: payload.clone(),
                    };
                    let append_started = Instant::now();
                    wal.append(vec![record]).await.expect("append");
                    latencies.borrow_mut().push(append_started.elapsed());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await;
    }
    let elapsed = started.elapsed();
    let stats = wal.stats();
    let mut latencies: Vec<Duration> = latencies.take();
    let records_per_batch = stats.records as f64 / stats.batches as f64;
    Rc::try_unwrap(wal)
        .ok()
        .expect("appenders finished")
        .close()
        .await;
    (
        FloorStats::from_latencies(&mut latencies, elapsed),
        records_per_batch,
    )
}

fn main() {
    let parent =
        std::env::var_os("KEEL_WAL_BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = tempfile::Builder::new()
        .prefix("keel-wal-bench")
        .tempdir_in(parent)
        .expect("benchmark directory");
    let executor = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(2 << 20)
        .make()
        .expect("glommio executor starts");
    executor.run(async {
        println!(
            "WAL benchmark in {} ({RECORD_PAYLOAD_BYTES}-byte records, one record per append)",
            dir.path().display()
        );
        println!();
        println!(
            "| {:<34} | {:>9} | {:>8} | {:>8} | {:>8} | {:>13} | {:>11} |",
            "run", "ops/s", "p50 µs", "p99 µs", "max µs", "records/batch", "p50/floor"
        );
        println!(
            "|{:-<36}|{:->11}|{:->10}|{:->10}|{:->10}|{:->15}|{:->13}|",
            "", "", "", "", "", "", ""
        );
        let floor = measure_fsync_floor(dir.path(), FLOOR_SAMPLES)
            .await
            .expect("floor probe");
        print_row(
            "disk floor: 4 KiB write+fdatasync",
            &floor,
            1.0,
            floor.p50_us,
        );
        for (appenders, appends_each) in [(1, 2000), (16, 500), (256, 100)] {
            let wal_dir = dir.path().join(format!("wal-{appenders}"));
            let (stats, records_per_batch) = run_appenders(&wal_dir, appenders, appends_each).await;
            print_row(
                &format!("wal append, {appenders} appenders"),
                &stats,
                records_per_batch,
                floor.p50_us,
            );
        }
        let floor_after = measure_fsync_floor(dir.path(), FLOOR_SAMPLES)
            .await
            .expect("floor probe");
        print_row("disk floor again (after)", &floor_after, 1.0, floor.p50_us);
    });
}
