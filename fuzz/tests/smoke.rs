//! The stable driver of every fuzz target: its seed corpus (`corpus/<target>/`), any crash
//! reproducers (`corpus/<target>/regressions/`), then deterministic mutations of the corpus.
//! A CI run takes seconds; `KEEL_FUZZ_SECONDS=N` runs each target for N seconds instead, and
//! `KEEL_FUZZ_SEED` picks another mutation sequence. A failing input is written to
//! `target/fuzz-failures/<target>-<seed>.bin` and named in the panic message.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_fuzz::mutate::{mutate, Rng};
use keel_fuzz::{Target, INPUT_BYTES_MAX, TARGETS};

/// Mutated inputs per target in a CI run.
const SMOKE_MUTATIONS: u64 = 20_000;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// Every file under the target's corpus directory (seeds and regressions), sorted by path.
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut dirs = vec![corpus_dir(target)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("a corpus file reads");
                files.push((path, bytes));
            }
        }
    }
    files.sort();
    files
}

/// Runs `target` on `input`; on a panic, saves the input and fails naming it.
fn run_one(name: &str, target: Target, input: &[u8], label: &str) {
    if std::panic::catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target")
            .join("fuzz-failures");
        std::fs::create_dir_all(&dir).expect("the failure directory");
        let path = dir.join(format!("{name}-{label}.bin"));
        std::fs::write(&path, input).expect("the failing input is saved");
        panic!(
            "fuzz target {name} panicked on {label} ({} bytes), saved as {}",
            input.len(),
            path.display()
        );
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn drive(name: &str, target: Target) {
    let corpus = corpus(name);
    assert!(
        corpus.len() >= 2,
        "{name}: the seed corpus in {} is missing",
        corpus_dir(name).display()
    );
    for (path, bytes) in &corpus {
        let label = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        run_one(name, target, bytes, &label);
    }
    let seed = env_u64("KEEL_FUZZ_SEED").unwrap_or(1);
    let deadline = env_u64("KEEL_FUZZ_SECONDS").map(|s| Instant::now() + Duration::from_secs(s));
    let started = Instant::now();
    let mut runs = 0u64;
    loop {
        match deadline {
            Some(d) if Instant::now() >= d => break,
            None if runs >= SMOKE_MUTATIONS => break,
            _ => {}
        }
        // Each input's edits follow from (seed, run) alone, so a failure replays by its label.
        let mut rng = Rng::new(seed.wrapping_mul(0x1_0000_0001).wrapping_add(runs));
        let base = &corpus[rng.below(corpus.len())].1;
        let other = &corpus[rng.below(corpus.len())].1;
        let input = mutate(&mut rng, base, other, INPUT_BYTES_MAX);
        run_one(name, target, &input, &format!("seed{seed}-run{runs}"));
        runs += 1;
    }
    eprintln!(
        "fuzz {name}: {} corpus inputs + {runs} mutations in {:?}",
        corpus.len(),
        started.elapsed()
    );
}

#[test]
fn grpc_framing() {
    drive("grpc_framing", TARGETS[0].1);
}

#[test]
fn grpc_requests() {
    drive("grpc_requests", TARGETS[1].1);
}

#[test]
fn http2_server() {
    drive("http2_server", TARGETS[2].1);
}

#[test]
fn wal_recovery() {
    drive("wal_recovery", TARGETS[3].1);
}

#[test]
fn checkpoint_load() {
    drive("checkpoint_load", TARGETS[4].1);
}

#[test]
fn raft_message() {
    drive("raft_message", TARGETS[5].1);
}

#[test]
fn peer_frames() {
    drive("peer_frames", TARGETS[6].1);
}

#[test]
fn simple_token() {
    drive("simple_token", TARGETS[7].1);
}

#[test]
fn jwt_token() {
    drive("jwt_token", TARGETS[8].1);
}

#[test]
fn every_target_has_a_smoke_test() {
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "grpc_framing",
            "grpc_requests",
            "http2_server",
            "wal_recovery",
            "checkpoint_load",
            "raft_message",
            "peer_frames",
            "simple_token",
            "jwt_token"
        ]
    );
}
