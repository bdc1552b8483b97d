//! The `keel` binary: an etcd v3 compatible member. Accepts etcd's flags and ETCD_* variables.

use keel_core::alloc_count::CountingAlloc;
use keel_core::config::Config;

// mimalloc: allocation-heavy request paths run per core without a global allocator lock.
// Counted per thread role for keel_heap_allocations_total (a load and a store per allocation).
#[global_allocator]
static GLOBAL: CountingAlloc<mimalloc::MiMalloc> = CountingAlloc(mimalloc::MiMalloc);

fn main() {
    // Before anything allocates much (see the function for why).
    let huge_pages_off = keel_core::rt::disable_transparent_huge_pages();
    // `keel snapshot status|restore`: etcdctl's snapshot tools, for moving from etcd.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("snapshot") {
        init_logging("warn");
        std::process::exit(keel_core::snapshot_cli::run(&args[2..]));
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("keel: {e}");
            std::process::exit(2);
        }
    };
    init_logging(&config.log_level);
    if let Err(error) = huge_pages_off {
        tracing::warn!(%error, "could not turn transparent huge pages off for this process");
    }
    // A panic is a programmer error somewhere in a member that cannot be trusted to go on:
    // a panicked raft core or shard would otherwise leave a process that looks alive and
    // serves nothing. Print it, then end the whole process.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        tracing::error!(panic = %info, "a thread panicked; stopping the member");
        std::process::abort();
    }));
    if let Err(e) = keel_core::node::run(config) {
        tracing::error!(error = %e, "keel stopped with an error");
        eprintln!("keel: {e}");
        std::process::exit(1);
    }
}

fn init_logging(level: &str) {
    // etcd's panic and fatal levels both mean "errors only" for our logger.
    let level = match level {
        "panic" | "fatal" => "error",
        other => other,
    };
    // KEEL_LOG (an EnvFilter directive) overrides the level for debugging. In a release build
    // tracing's trace-level events (h2's among them) are compiled out (see the root
    // Cargo.toml); trace records written through the `log` crate (rustls) still show.
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .json()
        .init();
}
