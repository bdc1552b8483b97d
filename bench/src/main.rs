//! The `keel-bench` command line: etcd's benchmark workloads plus `compare`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use keel_bench::compare::{self, CompareArgs};
use keel_bench::report::{Precision, Summary};
use keel_bench::workloads::{self, Target};
use keel_bench::{client, Error};

#[derive(Parser, Debug)]
#[command(
    name = "keel-bench",
    version,
    about = "etcd v3 benchmark workloads, and etcd-vs-Keel comparison"
)]
struct Cli {
    /// gRPC endpoints, comma separated, with or without http:// (https:// needs --cacert)
    #[arg(long, global = true, default_value = "127.0.0.1:2379")]
    endpoints: String,
    /// PEM CA certificates trusted for https:// endpoints (as etcdctl's --cacert)
    #[arg(long, global = true)]
    cacert: Option<std::path::PathBuf>,
    /// Total number of HTTP/2 connections
    #[arg(long, global = true, default_value_t = 1)]
    conns: usize,
    /// Total number of concurrent clients (spread over the connections)
    #[arg(long, global = true, default_value_t = 1)]
    clients: usize,
    /// Print the result as JSON on stdout instead of the human summary
    #[arg(long, global = true)]
    json: bool,
    /// Print latencies with full floating point precision
    #[arg(long, global = true)]
    precise: bool,
    /// Also write every successful request as a line "CLIENT START_US LATENCY_US" to this
    /// file (START_US from the run's start): when slow requests ran, and on which client.
    /// Every workload but watch-latency, which keeps its own times
    #[arg(long, global = true)]
    latency_log: Option<std::path::PathBuf>,
    /// Requests each client sends before the timed run, not counted: the run then starts on
    /// warm connections with every client already going (etcd's benchmark has no warm-up).
    /// Not watch-latency; lease-grant's warm-up grants leases of its own that stay alive
    #[arg(long, global = true, default_value_t = 0)]
    warmup: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmark put
    Put(workloads::PutArgs),
    /// Benchmark range: KEY [END]
    Range(workloads::RangeArgs),
    /// Benchmark txn with puts
    TxnPut(workloads::TxnPutArgs),
    /// Benchmark txns that each compare every key of a range, then put one key
    TxnCompare(workloads::TxnCompareArgs),
    /// Benchmark a mixed load of txn-put and txn-range
    TxnMixed(workloads::TxnMixedArgs),
    /// Benchmark the latency from a put's acknowledgement to its watch event
    WatchLatency(workloads::WatchLatencyArgs),
    /// Benchmark lease keepalives over a stream
    LeaseKeepalive(workloads::LeaseKeepaliveArgs),
    /// Grant leases that stay alive (the set-up for bench/scripts/leases.sh)
    LeaseGrant(workloads::LeaseGrantArgs),
    /// Start etcd and Keel side by side and compare them on DESIGN.md's targets
    Compare(CompareArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    keel_bench::load::set_run_options(keel_bench::load::RunOptions {
        latency_log: cli.latency_log.clone(),
        warmup_per_client: cli.warmup,
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("keel-bench: cannot start the tokio runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("keel-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let precision = if cli.precise {
        Precision::Full
    } else {
        Precision::Short
    };
    let output = if cli.json {
        Output::Json
    } else {
        Output::Text(precision)
    };
    if let Some(ca) = &cli.cacert {
        client::use_ca_file(ca)?;
    }
    if let Command::Compare(args) = &cli.command {
        let result = compare::run(args).await?;
        match output {
            Output::Json => println!("{}", serde_json::to_string_pretty(&result)?),
            Output::Text(_) => print!("{}", compare::to_text(&result)),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let target = Target {
        endpoints: client::parse_endpoints(&cli.endpoints)?,
        conns: cli.conns,
        clients: cli.clients,
    };
    let summary = match &cli.command {
        Command::Put(args) => workloads::put(&target, args).await?,
        Command::Range(args) => workloads::range(&target, args).await?,
        Command::TxnPut(args) => workloads::txn_put(&target, args).await?,
        Command::TxnCompare(args) => workloads::txn_compare(&target, args).await?,
        Command::TxnMixed(args) => workloads::txn_mixed(&target, args).await?,
        Command::WatchLatency(args) => workloads::watch_latency(&target, args).await?,
        Command::LeaseKeepalive(args) => workloads::lease_keepalive(&target, args).await?,
        Command::LeaseGrant(args) => workloads::lease_grant(&target, args).await?,
        Command::Compare(_) => unreachable!("handled above"),
    };
    print_summary(&summary, output)?;
    // Errors are reported in the summary; the exit status also says so, for scripts.
    Ok(if summary.total_errors() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

#[derive(Clone, Copy)]
enum Output {
    Json,
    Text(Precision),
}

fn print_summary(summary: &Summary, output: Output) -> Result<(), Error> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(summary)?),
        Output::Text(precision) => print!("{}", summary.to_text(precision)),
    }
    Ok(())
}
