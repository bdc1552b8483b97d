//! Starting and stopping a member: configuration, identity, the data directory lock, the raft
//! core, the shards, and the signals that end them.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::config::Config;
use crate::error::CoreError;
use crate::ids::Identity;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::raftcore::{self, RaftCore};
use crate::shared::Shared;
use crate::watchdog::LoopPhase;
use crate::{corrupt, rt, shard};

/// How long a clean shutdown waits for the raft core to finish its batch and checkpoint.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Runs a member until SIGINT or SIGTERM.
pub fn run(config: Config) -> Result<(), CoreError> {
    // Block the stop signals before any thread exists, so every thread inherits the mask and
    // only `sigwait` below sees them.
    let signals = block_stop_signals();
    std::fs::create_dir_all(&config.data_dir).map_err(|source| CoreError::DataDir {
        path: config.data_dir.clone(),
        source,
    })?;
    // Every size limit must hold the one before it, or a request a shard accepted could stop
    // the raft core: refuse to start instead.
    Limits::new(&config).assert_nested();
    // Every port before the data directory, as etcd binds its listeners before it opens it.
    for addr in config
        .listen_peer
        .iter()
        .chain(&config.listen_client)
        .chain(&config.listen_metrics)
        .map(|l| l.addr)
    {
        rt::ensure_unused(addr).map_err(|source| CoreError::Listen { addr, source })?;
    }
    let _lock = lock_data_dir(&config)?;
    let (identity, bootstrap) = Identity::load_or_create(&config)?;
    crate::lifecycle::log_starting(&identity, &bootstrap);

    let (ready_tx, ready_rx) = mpsc::channel::<Result<Arc<Shared>, CoreError>>();
    let (check_tx, check_rx) = mpsc::channel::<Result<(), CoreError>>();
    let raft_config = config.clone();
    let raft_identity = identity.clone();
    // The shards placed on the raft core's CPU run in its executor where the configuration
    // says so (see `shard::Host`).
    let (host_shards, hosted_shards) = futures_channel::oneshot::channel();
    let host = config.host_shards_on_raft_cpu.then_some(shard::Host {
        cpu: config.raft_cpu,
        shards: host_shards,
    });
    let raft = rt::spawn_pinned("keel-raft", config.raft_cpu, move || async move {
        // A shard hosted here hands its blocking work to a helper, not this executor's pool.
        rt::mark_raft_core_thread();
        let opened = raftcore::open(&raft_config, &raft_identity).await;
        let (parts, reader) = match opened {
            Ok(x) => x,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return Ok(());
            }
        };
        let shared = Arc::new(Shared::new(raft_config, raft_identity, reader));
        let core = match RaftCore::new(parts, shared.clone()) {
            Ok(core) => core,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return Ok(());
            }
        };
        let transport = core.transport();
        if let Some(interval) = shared.config.corrupt_check_interval {
            rt::spawn_local(corrupt::periodic_checks(
                shared.clone(),
                transport.clone(),
                interval,
            ));
        }
        if shared.config.initial_corrupt_check {
            let shared = shared.clone();
            rt::spawn_local(async move {
                let timeout = shared.request_timeout();
                let _ = check_tx.send(corrupt::initial_check(shared, transport, timeout).await);
            });
        }
        if let Ok(after) = std::env::var(TEST_HANG_RAFT_EXECUTOR_ENV) {
            // Test-only: block the raft core's thread for good after this many milliseconds,
            // as a task that never yields would, so tests can watch the watchdog stop us.
            let after_ms: u64 = after.parse().unwrap_or(0);
            tracing::warn!(after_ms, "TEST ONLY: the raft executor will hang");
            rt::spawn_local(async move {
                rt::sleep(Duration::from_millis(after_ms)).await;
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            });
        }
        shard::host_shards(hosted_shards);
        let _ = ready_tx.send(Ok(shared.clone()));
        let result = core.run().await;
        if !shared.signalled.load(Ordering::Acquire) {
            // Nobody asked the raft core to stop, so the member cannot go on: without it no
            // write commits and no linearizable read answers. Say why and end the process now,
            // rather than linger as a member that looks alive and serves nothing.
            stop_process(&shared, result.as_ref().err());
        }
        result
    })?;
    let shared = match ready_rx.recv() {
        Ok(Ok(shared)) => shared,
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            return Err(raft
                .join()
                .and_then(|r| r)
                .err()
                .unwrap_or(CoreError::Executor("raft core exited".into())))
        }
    };
    if config.initial_corrupt_check {
        // etcd compares its data with its peers' before it serves a client.
        match check_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(CoreError::Executor("the raft core exited".into())),
        }
    }
    crate::watchdog::start(shared.clone()).map_err(|e| CoreError::Executor(e.to_string()))?;
    // From this unpinned thread, so the pager threads may run on any CPU.
    shared
        .pager
        .start()
        .map_err(|e| CoreError::Executor(format!("cannot start the pager threads: {e}")))?;
    crate::value_cache::start(shared.clone(), config.value_cache_bytes)
        .map_err(|e| CoreError::Executor(format!("cannot start the value cache: {e}")))?;
    let metrics = Metrics::new();
    let _shards = shard::start(shared.clone(), metrics, &config.shard_cpus, host)?;
    if let Some(path) = &config.config_file {
        // etcd's words, which operators grep for.
        tracing::info!(
            path = %path.display(),
            "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided"
        );
    }
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    crate::lifecycle::log_serving(&config);
    tracing::info!(
        name = %config.name,
        data_dir = %config.data_dir.display(),
        member_id = format!("{:x}", identity.member_id),
        cluster_id = format!("{:x}", identity.cluster_id),
        listen_client_urls = ?config.listen_client,
        advertise_client_urls = ?config.advertise_client_urls,
        listen_peer_urls = ?config.listen_peer,
        shards = config.shard_cpus.len(),
        shard_cpus = ?config.shard_cpus,
        raft_cpu = config.raft_cpu,
        shards_on_raft_cpu = config
            .shard_cpus
            .iter()
            .filter(|&&cpu| cpu == config.raft_cpu)
            .count(),
        // Whether those run in the raft core's executor, not on threads of their own.
        host_shards_on_raft_cpu = config.host_shards_on_raft_cpu,
        members_on_this_host = config.members_on_this_host,
        ignored_flags = ?config.ignored_flags,
        auto_compaction = config
            .auto_compaction
            .map_or("off".to_string(), |r| r.to_string()),
        "keel is serving client requests"
    );

    let sig = wait_for_signal(&signals);
    tracing::info!(signal = sig, "stopping");
    shared.signalled.store(true, Ordering::Release);
    shared.stopping.store(true, Ordering::Release);
    shared.proposals.close();
    shared.reads.close();
    // The raft core finishes its batch, answers what waits, and writes a checkpoint.
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(raft.join());
    });
    match done_rx.recv_timeout(SHUTDOWN_GRACE) {
        Ok(Ok(Ok(()))) => tracing::info!("stopped cleanly"),
        Ok(Ok(Err(e))) | Ok(Err(e)) => return Err(e),
        Err(_) => return Err(CoreError::Executor("raft core did not stop in time".into())),
    }
    Ok(())
}

/// Ends the process because the raft core stopped on its own: logs why, naming the member and
/// the raft position, then exits at once (the shards die with the process): non-zero after a
/// failure, 0 after this member was removed from the cluster.
fn stop_process(shared: &Shared, error: Option<&CoreError>) -> ! {
    let member = format!("{:x}", shared.member_id());
    let term = shared.raft_term.load(Ordering::Acquire);
    let commit_index = shared.commit_index.load(Ordering::Acquire);
    let applied_index = shared.applied_index.load(Ordering::Acquire);
    let removed = shared.removed.load(Ordering::Acquire);
    match error {
        Some(e) => {
            tracing::error!(
                member,
                term,
                commit_index,
                applied_index,
                error = %e,
                "the raft core failed; this member cannot go on and stops"
            );
            eprintln!("keel: member {member} stopped at term {term}, index {applied_index}: {e}");
            std::process::exit(EXIT_RAFT_CORE_STOPPED);
        }
        None => {
            // The raft loop ends without an error only when asked to stop: by a signal (not
            // here) or by the member's removal.
            assert!(removed, "the raft core stopped cleanly without being asked");
            tracing::warn!(
                member,
                term,
                commit_index,
                applied_index,
                "the raft core stopped (this member was removed from the cluster); stopping"
            );
            eprintln!("keel: member {member} was removed from the cluster");
            // etcd 3.4 exits 0 here (etcdmain ends with osutil.Exit(0) once the server has
            // stopped): a removed member must stay down, and systemd's Restart=on-failure (our
            // keel.service, and etcd's) restarts only a non-zero exit. Restarted, it would
            // only be told again that it was removed, in a loop.
            std::process::exit(EXIT_REMOVED);
        }
    }
}

/// Ends the process because the raft loop hangs for good (see `watchdog`): logs why, with
/// the raft position and what the loop was waiting on, and exits non-zero at once.
pub fn stop_stuck(shared: &Shared, phase: LoopPhase, stalled_ms: u64, why: &str) -> ! {
    let member = format!("{:x}", shared.member_id());
    let term = shared.raft_term.load(Ordering::Acquire);
    let commit_index = shared.commit_index.load(Ordering::Acquire);
    let applied_index = shared.applied_index.load(Ordering::Acquire);
    tracing::error!(
        member,
        term,
        commit_index,
        applied_index,
        phase = phase.name(),
        stalled_ms,
        reason = why,
        "the raft loop is stuck; this member cannot go on and stops"
    );
    eprintln!("keel: member {member} stopped at term {term}, index {applied_index}: {why}");
    std::process::exit(EXIT_RAFT_LOOP_STUCK);
}

/// The exit status when the raft core stops without being asked (1 is a startup error).
pub const EXIT_RAFT_CORE_STOPPED: i32 = 3;
/// The exit status when the watchdog finds the raft loop stuck.
pub const EXIT_RAFT_LOOP_STUCK: i32 = 4;
/// Test-only: milliseconds after which the raft core's thread blocks for good.
pub const TEST_HANG_RAFT_EXECUTOR_ENV: &str = "KEEL_TEST_HANG_RAFT_EXECUTOR_AFTER_MS";
/// The exit status of a member that stopped because it was removed from the cluster.
pub const EXIT_REMOVED: i32 = 0;

fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it, and
    // pthread_sigmask only changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        assert_eq!(rc, 0, "pthread_sigmask cannot fail with a valid set");
        set
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: `set` was initialised by block_stop_signals; sig is a valid out pointer.
        let rc = unsafe { libc::sigwait(set, &mut sig) };
        if rc == 0 {
            return sig;
        }
    }
}

/// An exclusive lock on the data directory, so two members can never share one (etcd locks
/// its WAL files for the same reason).
fn lock_data_dir(config: &Config) -> Result<std::fs::File, CoreError> {
    use std::os::fd::AsRawFd;
    let path = config.data_dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| CoreError::DataDir {
            path: path.clone(),
            source,
        })?;
    // SAFETY: the fd is valid for the life of `file`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(CoreError::DataDir {
            path,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(file)
}
