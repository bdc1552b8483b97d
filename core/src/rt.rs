//! The thin layer over glommio and the cross-core plumbing: pinned executors, a bounded
//! multi-producer mailbox that wakes its single consumer on another core, and glommio's
//! implementation of keel-grpc's runtime trait.
//!
//! glommio is pinned (=0.9.0) and has open bugs upstream (#671, #555); everything that names it
//! outside `io` lives here so an upgrade or a swap touches one file.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, IntoRawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crossbeam::queue::ArrayQueue;
use futures_util::task::AtomicWaker;

use crate::error::CoreError;

pub use glommio::net::{TcpListener, TcpStream};

/// Locked memory per executor is 3 x io_memory (three io_uring rings), and `ulimit -l` is small
/// for unprivileged users: keep it at 1 MiB (FIELD-NOTES, glommio).
pub const EXECUTOR_IO_MEMORY_BYTES: usize = 1024 * 1024;

/// Starts a glommio executor on its own thread, pinned to `cpu`, running `main` to completion.
pub fn spawn_pinned<F, Fut, T>(name: &str, cpu: usize, main: F) -> Result<Pinned<T>, CoreError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let role = crate::alloc_count::ThreadRole::of_executor(name);
    let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(cpu))
        .name(name)
        .io_memory(EXECUTOR_IO_MEMORY_BYTES)
        // No spin_before_park: busy-spinning starves the kernel's io_uring fsync workers that
        // share the raft core's CPU (FIELD-NOTES: fdatasync got 4x slower).
        .spawn(move || {
            crate::alloc_count::label_this_thread(role);
            main()
        })
        .map_err(|e| {
            CoreError::Executor(format!("cannot start executor {name} on cpu {cpu}: {e}"))
        })?;
    Ok(Pinned(handle))
}

/// A running pinned executor; `join` waits for its main future to finish.
pub struct Pinned<T: Send + 'static>(glommio::ExecutorJoinHandle<T>);

impl<T: Send + 'static> Pinned<T> {
    pub fn join(self) -> Result<T, CoreError> {
        self.0
            .join()
            .map_err(|e| CoreError::Executor(e.to_string()))
    }
}

/// A bounded queue from many threads to one consumer task, which sleeps in its executor until
/// something arrives. The bound is the back-pressure: a full mailbox refuses, and the caller
/// answers "too many requests" as etcd does when proposals pile up.
pub struct Mailbox<T> {
    queue: ArrayQueue<T>,
    waker: AtomicWaker,
    closed: AtomicBool,
    /// Set by `nudge` until the consumer's `ready` returns for it.
    nudged: AtomicBool,
}

impl<T> Mailbox<T> {
    pub fn new(capacity: usize) -> Arc<Mailbox<T>> {
        assert!(capacity > 0, "a mailbox needs room for at least one item");
        Arc::new(Mailbox {
            queue: ArrayQueue::new(capacity),
            waker: AtomicWaker::new(),
            closed: AtomicBool::new(false),
            nudged: AtomicBool::new(false),
        })
    }

    /// Enqueues without waiting; gives the item back when the mailbox is full or closed.
    pub fn try_send(&self, item: T) -> Result<(), T> {
        if self.closed.load(Ordering::Acquire) {
            return Err(item);
        }
        self.queue.push(item)?;
        self.waker.wake();
        Ok(())
    }

    /// Takes what is queued now, without waiting.
    pub fn try_recv(&self) -> Option<T> {
        self.queue.pop()
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Waits until at least one item is queued (or the mailbox is closed). Never blocks the
    /// thread: crossbeam's blocking calls inside an executor would stall every task on it.
    pub fn ready(&self) -> MailboxReady<'_, T> {
        MailboxReady { mailbox: self }
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Wakes the consumer without sending, e.g. for a state change it must look at: its
    /// `ready` returns once for it, queue empty or not (a wake alone would find the queue
    /// empty and sleep again, leaving the change unseen until the next item).
    pub fn nudge(&self) {
        self.nudged.store(true, Ordering::Release);
        self.waker.wake();
    }
}

pub struct MailboxReady<'a, T> {
    mailbox: &'a Mailbox<T>,
}

impl<T> Future for MailboxReady<'_, T> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let m = self.mailbox;
        let ready = || {
            m.nudged.swap(false, Ordering::AcqRel)
                || !m.queue.is_empty()
                || m.closed.load(Ordering::Acquire)
        };
        if ready() {
            return Poll::Ready(());
        }
        // Register first, then look again: an item pushed between the two checks still wakes us.
        m.waker.register(cx.waker());
        if ready() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// The accept backlog asked for; the kernel caps it at net.core.somaxconn, which is what Go
/// (and so etcd) asks for.
const LISTEN_BACKLOG: i32 = 4096;

/// Binds a listening TCP socket on `addr` for the current executor, with both SO_REUSEPORT
/// (every shard binds the same address and the kernel spreads connections across them) and
/// SO_REUSEADDR. glommio's own `TcpListener::bind` sets only the first, so a member could not
/// take over a port whose previous owner (an etcd being replaced, or Keel itself restarting)
/// left accepted connections in TIME_WAIT: bind failed with EADDRINUSE. Go sets SO_REUSEADDR on
/// every listener, which is why etcd restarts on such a port.
///
/// Call it on the executor that will accept: glommio ties the listener to the current reactor.
pub fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = listening_socket(addr)?;
    // SAFETY: the fd is a bound, listening TCP socket we own; into_raw_fd hands its ownership
    // to glommio's listener, which closes it on drop.
    Ok(unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

/// Fails with EADDRINUSE when something already listens on `addr`, as etcd's start does
/// ("bind: address already in use"). Call it before the first [`bind_listener`] of `addr`:
/// that one sets SO_REUSEPORT so that every shard can bind the address, and Linux lets any
/// process of the same user join such a group, so a second member started on a taken port
/// would otherwise share it and take half of its clients. This probe sets only SO_REUSEADDR,
/// which a listener blocks and a previous owner's TIME_WAIT connections do not.
///
/// A listener stays for a few milliseconds after its process was killed and reaped (5-10 ms
/// after a `kill -9` here): io_uring tears a dead process's ring down in the background,
/// and requests still in flight on the listener hold it open until then. A port in use is
/// therefore probed again for up to `PORT_FREED_WAIT` before the start gives up.
pub fn ensure_unused(addr: SocketAddr) -> std::io::Result<()> {
    if addr.port() == 0 {
        // The kernel picks a free port for each bind.
        return Ok(());
    }
    let probe = reusable_tcp_socket(addr)?;
    let started = std::time::Instant::now();
    loop {
        match probe.bind(&addr.into()) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && started.elapsed() < PORT_FREED_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            bound => return bound,
        }
    }
}

/// An unbound TCP socket for `addr`'s family with SO_REUSEADDR, as Go sets it on every
/// listener. socket2 opens it with SOCK_CLOEXEC, as glommio does.
fn reusable_tcp_socket(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    Ok(socket)
}

/// How long [`ensure_unused`] waits for a port in use to be freed.
const PORT_FREED_WAIT: Duration = Duration::from_secs(2);

/// The socket under [`bind_listener`]: bound and listening, not yet tied to an executor.
fn listening_socket(addr: SocketAddr) -> std::io::Result<socket2::Socket> {
    let socket = reusable_tcp_socket(addr)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket)
}

/// Sleeps on the current glommio executor.
pub async fn sleep(d: Duration) {
    glommio::timer::sleep(d).await;
}

/// Lets the threads waiting for this CPU, the executor's other tasks and task queues, and its
/// I/O, have a turn before the caller goes on: what a long walk (a count of a million keys)
/// does between its steps.
///
/// The CPU first: the kernel's workers that carry the WAL's writes and cache flushes to the
/// disk are bound to the CPU whose thread submitted them (the raft core's), and a thread
/// that never blocks keeps them waiting for the end of its kernel time slice. Measured with
/// a shard hosted by the raft core walking a count of a million keys: those workers waited
/// 5.0-5.4 ms for each turn, a put took about 5 ms of the walk's time instead of a fraction
/// of one, and one client's puts at 500/s queued up to 0.2-0.3 s behind it. `sched_yield`
/// hands the CPU to whatever is waiting for it and returns at once when nothing is.
///
/// Then the executor (third_party/glommio, KEEL PATCH `yield_to_reactor`): a plain task
/// yield would not do, as glommio polls its rings only once its task queues run dry or their
/// time slice ends (100 ms), and a task that yields at once keeps its queue busy, so requests
/// waiting on this shard's sockets (or, on a hosted shard, the WAL's completions) would wait
/// out the walk anyway. A short timer did let them in, but parked the thread whenever nothing
/// else ran: a count of a million keys in steps of 1,024 took 260-350 ms of CPU against
/// 190-230 walked whole.
pub async fn let_others_run() {
    std::thread::yield_now();
    glommio::executor().yield_to_reactor().await;
    // Back in the queue ahead of the tasks the rings just woke; and each of those may wake
    // another (a call's task, its proposal, its answer), each behind the walk again. A few
    // yields within the queue let such a chain run several links per step.
    for _ in 0..LET_OTHERS_RUN_QUEUE_YIELDS {
        futures_lite::future::yield_now().await;
    }
}

/// Yields within its task queue `let_others_run` makes after the executor's round: links of
/// a chain of wake-ups (a put's read, call, proposal) that run per step of the walk. Each is
/// a poll of the walking task, 0.1 µs when nothing else waits.
const LET_OTHERS_RUN_QUEUE_YIELDS: u32 = 4;

/// Puts the calling thread under SCHED_BATCH, the kernel's policy for threads that need no
/// low wake-up latency: when it wakes, it does not preempt the thread running on its CPU; it
/// runs once that thread's turn ends, at the same nice level and share of the CPU (an idle CPU
/// runs it at once). For the shard threads: one woken by a socket or by its answers waits for
/// the running thread's turn to end (the raft core's short one on its CPU, or a client's on a
/// shared host) rather than cut it, and takes more work per turn. The raft core's thread stays
/// SCHED_OTHER, so its own wake-ups may still preempt a shard. Measured on 2 CPUs with the
/// load generator on them (BENCHMARKS.md, "Shard threads under SCHED_BATCH"): 14-16 % less
/// CPU a put, the keep-alive p99 an eighth, its p50 up by about 0.1 ms. Only the executor's
/// own thread: glommio started its blocking-pool thread before, under SCHED_OTHER. Threads
/// started from the caller later inherit the policy. Any thread may choose it: no privilege.
pub fn batch_scheduling_for_this_thread() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the param struct, which lives across the call; pid 0
    // is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Turns transparent huge pages off for this process; the binary calls it first thing, before
/// the allocator's arenas grow. mimalloc asks for huge pages on its arenas (madvise), and the
/// kernel then zeroes 2 MiB at the first touch of each region, again after each purge of
/// freed memory: under 1000 clients' puts, `clear_page_erms` took 15-20 % of the raft core's
/// CPU. With them off, server CPU per put fell by about a tenth, RSS by a fifth, and a random
/// put over a million keys cost the same (BENCHMARKS.md, "Transparent huge pages").
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes no memory.
    // prctl is variadic and the kernel reads each argument as an unsigned long (and refuses
    // non-zero unused ones): pass them at that width.
    let (on, unused): (libc::c_ulong, libc::c_ulong) = (1, 0);
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, on, unused, unused, unused) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Hands all memory freed into the allocator's arenas since the last purge back to the OS
/// now, whatever its delay, rather than keep it for reuse. It costs what the purged ranges
/// cost to `madvise` away, plus a walk of the calling thread's own heap, on the calling
/// thread. Called for the rare steps that free copies of the index's size (a checkpoint, a
/// restore), and as the purger's turn (see `leave_freed_memory_to_the_purger`). A member at
/// rest makes few allocation calls and none of the slow paths that purge, so without these
/// it would also keep what a load freed: measured after a load of 1M keys of 1 KiB, 360 MiB
/// held 20 s after the load against 239 MiB once purged.
pub fn release_freed_memory() {
    // SAFETY: mi_thread_init and mi_collect take no pointers and may be called from any
    // thread at any time; where mimalloc is not the global allocator (the library's tests)
    // they set up and collect an empty heap. mi_collect starts from the caller's own heap and
    // returns before the arenas when this thread never set one up (a thread that has not
    // allocated through mimalloc yet), so the heap is set up first; that does nothing when it
    // is already. Forced, mi_collect then purges every range scheduled for purging in every
    // arena, whichever thread freed it.
    unsafe {
        libmimalloc_sys::mi_thread_init();
        libmimalloc_sys::mi_collect(true);
    }
}

/// How often one thread beside the cores hands the memory freed since its last turn back to
/// the OS (`release_freed_memory`).
pub const FREED_MEMORY_PURGE_EVERY: Duration = Duration::from_secs(1);

/// mimalloc's own purge delay once a purger runs: far past `FREED_MEMORY_PURGE_EVERY`, so an
/// allocating thread never finds a purge due unless the purger stopped turning for this long.
pub const ALLOCATOR_PURGE_DELAY_MS: i64 = 10 * FREED_MEMORY_PURGE_EVERY.as_millis() as i64;

/// `mi_option_purge_delay` in the `mi_option_e` enum of the mimalloc v3 that libmimalloc-sys
/// builds (its `mimalloc.h`; the crate's Rust constants leave this one out).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Moves the allocator's purges of freed memory off the threads that allocate, onto the
/// caller of `release_freed_memory`. mimalloc purges lazily: memory freed into an arena is
/// scheduled to go back to the OS a delay after the first free of a cycle (1 s by default),
/// and the first slow path of an allocation or a free past that moment carries out the whole
/// cycle's purge. Under a load of millions of keys that was the raft core, 10-22 ms at a time
/// (`madvise` of everything freed in the last second), during which no batch committed
/// (BENCHMARKS.md, "The allocator's purges moved off the raft core"). So the delay becomes
/// `ALLOCATOR_PURGE_DELAY_MS`, and the watchdog thread, which keeps off the raft core's CPU,
/// purges every `FREED_MEMORY_PURGE_EVERY` (up to one look of the watchdog later): memory
/// goes back about as soon as before, on a thread no request waits for.
pub fn leave_freed_memory_to_the_purger() {
    // SAFETY: mi_option_set takes an enum index and a value; mimalloc reads options at each
    // purge decision, so a change takes effect from then on, on every thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS as _) };
}

/// mimalloc's purge delay now, in milliseconds.
pub fn allocator_purge_delay_ms() -> i64 {
    // SAFETY: as in `leave_freed_memory_to_the_purger`.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) as i64 }
}

/// Spawns a task on the current executor and lets it run detached. glommio polls it once at
/// once, inside the caller's poll, before `spawn_local` returns.
pub fn spawn_local<F: Future<Output = ()> + 'static>(f: F) {
    glommio::spawn_local(f).detach();
}

/// Spawns a task on the current executor's current task queue, behind the tasks already
/// there, and lets it run detached: unlike `spawn_local`, the caller goes on before the task's
/// first poll. A connection that accepts a read of several calls spawns each call's task so,
/// and the calls that answer without waiting (a serializable Range) all answer before the
/// connection flushes again. Polled at once, each answered inside its accept, and the next
/// accept flushed it alone (measured: one `sendto` per serializable Range at 1000 clients,
/// BENCHMARKS.md). Must be called from a task (glommio names the running task's queue).
pub fn spawn_local_queued<F: Future<Output = ()> + 'static>(f: F) {
    let queue = glommio::executor().current_task_queue();
    glommio::spawn_local_into(f, queue)
        .expect("the running task's own queue exists")
        .detach();
}

/// Spawns a task, detached, in a new task queue of the current executor named `name`: it and
/// the tasks it spawns (`spawn_local`, `spawn_local_queued` keep to the running task's queue)
/// take turns with the executor's other queues, as glommio shares its time between queues,
/// rather than run in the spawner's queue. For a shard hosted in the raft core's executor.
pub fn spawn_local_in_own_queue<F: Future<Output = ()> + 'static>(name: &str, f: F) {
    let queue = glommio::executor().create_task_queue(
        glommio::Shares::default(),
        glommio::Latency::NotImportant,
        name,
    );
    glommio::spawn_local_into(f, queue)
        .expect("the queue was just made on this executor")
        .detach();
}

/// Blocking work a shard hands off (bcrypt, JWT signing, a whole-store hash, a snapshot's
/// capture and its chunks): on a shard thread, its executor's blocking pool, as before; on the
/// raft core's thread (a shard hosted there, `shard::Host`), one long-lived helper thread
/// beside the raft core's CPU instead. The raft core's own blocking pool renames and removes
/// the WAL's segment files, and a rotation that needs a spare must not wait behind a password
/// hash; nor may the work run on the raft core's CPU. The helper takes jobs in turn from a
/// bounded queue (`HELPER_QUEUE_JOBS_MAX`): a caller waits while it is full.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    if !RAFT_CORE_THREAD.with(Cell::get) {
        return glommio::executor().spawn_blocking(f).await;
    }
    let Some(mut jobs) = raft_side_helper() else {
        // No thread could be started: the raft core's pool, rather than fail the request.
        return glommio::executor().spawn_blocking(f).await;
    };
    let (tx, rx) = futures_channel::oneshot::channel();
    let job: HelperJob = Box::new(move || {
        let _ = tx.send(f());
    });
    std::future::poll_fn(|cx| jobs.poll_ready(cx))
        .await
        .and_then(|()| jobs.start_send(job))
        .expect("the helper thread takes jobs for the life of the process");
    rx.await
        .expect("the helper thread runs every job it takes (a panic ends the process)")
}

/// Jobs waiting for the raft core's side helper (see `blocking`), at most.
pub const HELPER_QUEUE_JOBS_MAX: usize = 64;

type HelperJob = Box<dyn FnOnce() + Send>;

thread_local! {
    /// Set on the raft core's thread (`mark_raft_core_thread`).
    static RAFT_CORE_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as the raft core's: `blocking` then sends work to the helper.
pub fn mark_raft_core_thread() {
    RAFT_CORE_THREAD.with(|on| on.set(true));
}

/// The helper's queue, its thread started on first use; None when the OS starts no thread.
fn raft_side_helper() -> Option<futures_channel::mpsc::Sender<HelperJob>> {
    static HELPER: std::sync::Mutex<Option<futures_channel::mpsc::Sender<HelperJob>>> =
        std::sync::Mutex::new(None);
    let mut helper = HELPER
        .lock()
        .expect("nothing panics while the helper's queue is held");
    if helper.is_none() {
        let (tx, mut rx) = futures_channel::mpsc::channel::<HelperJob>(HELPER_QUEUE_JOBS_MAX);
        // Started from the raft core's pinned thread: beside its CPU.
        let started = spawn_beside("keel-helper", move || {
            futures_lite::future::block_on(async {
                while let Some(job) = futures_util::StreamExt::next(&mut rx).await {
                    job();
                }
            })
        });
        match started {
            Ok(_) => *helper = Some(tx),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the raft core's helper thread");
                return None;
            }
        }
    }
    helper.clone()
}

/// Runs `f` on a new thread beside the caller's CPU (see `spawn_beside`) and waits for its
/// result without blocking the executor: for rare CPU-heavy work (hashing a whole store) that
/// must not stall a pinned core.
pub async fn on_thread<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = futures_channel::oneshot::channel();
    spawn_beside(name, move || {
        let _ = tx.send(f());
    })
    .expect("the OS starts a thread");
    rx.await
        .expect("the thread sends its result before it ends (it does not panic)")
}

/// Starts a plain thread that runs beside the calling thread's CPUs: on the process's CPUs
/// except those the caller is pinned to, or on all of the process's when that leaves none (one
/// CPU) or the caller is not pinned. A thread inherits its creator's affinity, so a thread
/// started from a pinned executor would otherwise share that executor's one CPU and stall it
/// (glommio's own blocking pool is pinned there too: FIELD-NOTES).
pub fn spawn_beside<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    spawn_on(name, cpus_beside_caller(), f)
}

/// What a thread started from the calling thread runs first to move beside the caller's CPUs,
/// as `spawn_beside` places its threads: for threads another crate starts (a restore's
/// helpers), which inherit the caller's pinning.
pub fn mover_beside_caller() -> impl Fn() + Send + Sync + 'static {
    mover_to(cpus_beside_caller())
}

/// Moves the calling thread beside the CPUs it is pinned to now, as `spawn_beside` places
/// its threads: for a helper another crate starts from a pinned executor (a snapshot
/// install's restore), which inherited that executor's pinning and calls this first.
pub fn move_beside_own_cpus() {
    mover_beside_caller()()
}

/// Starts a plain thread on the process's CPUs except `cpu` (on all of them when that leaves
/// none): for a thread started from an unpinned one that must still keep off a pinned core,
/// such as the watchdog, whose purges of freed memory would otherwise take the raft core's
/// CPU from it.
pub fn spawn_off_cpu<T: Send + 'static>(
    name: &str,
    cpu: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET checks nothing but writes one bit
    // of it, and `cpu` is below CPU_SETSIZE (a pinned core's index; checked here).
    let away = unsafe {
        let mut away: libc::cpu_set_t = std::mem::zeroed();
        assert!(
            cpu < libc::CPU_SETSIZE as usize,
            "CPU {cpu} is out of range"
        );
        libc::CPU_SET(cpu, &mut away);
        away
    };
    spawn_on(name, process_cpus_except(&away), f)
}

/// Starts a plain thread that first moves itself onto `cpus` (stays where it was created
/// where None).
fn spawn_on<T: Send + 'static>(
    name: &str,
    cpus: Option<libc::cpu_set_t>,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    let move_to = mover_to(cpus);
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            move_to();
            f()
        })
}

/// What a new thread calls first to move itself onto `cpus` (nothing where None).
fn mover_to(cpus: Option<libc::cpu_set_t>) -> impl Fn() + Send + Sync + 'static {
    move || {
        if let Some(set) = cpus {
            // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is this thread.
            let rc =
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
            if rc != 0 {
                tracing::warn!(
                    thread = std::thread::current().name().unwrap_or("unnamed"),
                    error = %std::io::Error::last_os_error(),
                    "cannot move a helper thread off the caller's CPU"
                );
            }
        }
    }
}

/// How many threads a restart's restore adds beside the raft core: one per other CPU of the
/// process, at most seven (the skip list's inserts scale little beyond that, and a start must
/// not take over a machine it shares).
pub fn restore_helper_threads() -> usize {
    process_cpus().saturating_sub(1).min(7)
}

/// How many CPUs the process may run on (see `process_cpu_list`).
fn process_cpus() -> usize {
    process_cpu_list().len()
}

/// The CPUs the process may run on, by number, ascending: the main thread's set, which nothing
/// pins (a pinned caller's own set, which `available_parallelism` reads, is one CPU). Under
/// `taskset -c 4-7` or a cgroup cpuset these are 4..=7, not 0..=3: executors pin by number,
/// and a CPU outside the set would refuse them. Never empty: [0] when the set cannot be read.
pub fn process_cpu_list() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity writes at most its size.
    let cpus: Vec<usize> = unsafe {
        let mut process: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(
            libc::getpid(),
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut process,
        ) != 0
        {
            return vec![0];
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &process))
            .collect()
    };
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

/// The CPUs `spawn_beside` gives a new thread, or None when they cannot be read.
fn cpus_beside_caller() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity writes at most its size.
    let caller = unsafe {
        let mut caller: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut caller) != 0 {
            return None;
        }
        caller
    };
    process_cpus_except(&caller)
}

/// The process's CPUs less those in `away`, or all of the process's when that leaves none;
/// None when they cannot be read.
fn process_cpus_except(away: &libc::cpu_set_t) -> Option<libc::cpu_set_t> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: zeroed cpu_set_t values are empty sets; sched_getaffinity writes at most `size`
    // bytes into one. The process id names the main thread, which nothing pins.
    unsafe {
        let mut process: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(libc::getpid(), size, &mut process) != 0 {
            return None;
        }
        let mut beside: libc::cpu_set_t = std::mem::zeroed();
        let mut beside_count = 0;
        for cpu in 0..libc::CPU_SETSIZE as usize {
            if libc::CPU_ISSET(cpu, &process) && !libc::CPU_ISSET(cpu, away) {
                libc::CPU_SET(cpu, &mut beside);
                beside_count += 1;
            }
        }
        Some(if beside_count == 0 { process } else { beside })
    }
}

/// Spawns a task on the current executor; the returned future completes with its output.
pub fn spawn_local_handle<T: 'static, F: Future<Output = T> + 'static>(
    f: F,
) -> impl Future<Output = T> {
    glommio::spawn_local(f)
}

/// A client connection as the gRPC server reads and writes it (tokio's I/O traits), over a
/// glommio TCP stream. `tokio_util::compat` does the same, but zeroes the read buffer's whole
/// spare capacity (8 KiB or more) before every read to make a `&mut [u8]` of it (0.7 % of the
/// server's samples under a put load, BENCHMARKS.md); this reads into the spare capacity as
/// it is (`TcpStream::poll_read_uninit`, a patch of the vendored glommio). Writes go through
/// as `compat` sends them (not vectored).
pub struct TcpIo(TcpStream);

impl TcpIo {
    pub fn new(stream: TcpStream) -> Self {
        TcpIo(stream)
    }
}

impl tokio::io::AsyncRead for TcpIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // SAFETY: nothing writes uninitialized bytes into the unfilled part (`recv` stores
        // only the bytes it returns), so nothing initialized becomes uninitialized.
        let unfilled = unsafe { buf.unfilled_mut() };
        let read_bytes = std::task::ready!(Pin::new(&mut self.0).poll_read_uninit(cx, unfilled))?;
        assert!(
            read_bytes <= buf.remaining(),
            "recv returns at most the bytes it was given"
        );
        // SAFETY: `recv` wrote the first `read_bytes` bytes of the unfilled part.
        unsafe { buf.assume_init(read_bytes) };
        buf.advance(read_bytes);
        Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncWrite for TcpIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        futures_lite::AsyncWrite::poll_write(Pin::new(&mut self.0), cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        futures_lite::AsyncWrite::poll_flush(Pin::new(&mut self.0), cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        futures_lite::AsyncWrite::poll_close(Pin::new(&mut self.0), cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `TcpIo` reads into a buffer's uninitialized spare capacity exactly what arrived, in
    /// pieces and across reads, after what the buffer already holds, reports the peer's close
    /// as a read of nothing, and writes through. Bounded: a lost wake-up fails it, not hangs.
    #[test]
    fn tcp_io_reads_into_spare_capacity_and_writes_through() {
        use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
        let (received, echoed) = spawn_pinned("tcp-io-test", process_cpu_list()[0], || async {
            let work = async {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
                let addr = listener.local_addr().expect("address");
                let peer = std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut client = std::net::TcpStream::connect(addr).expect("connect");
                    // Bytes lost on the way would leave both ends waiting: the peer gives up
                    // and closes, and the reader's next read, of nothing, fails the test.
                    client
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .expect("a read timeout");
                    client.write_all(b"hello, ").expect("write");
                    std::thread::sleep(Duration::from_millis(20));
                    client.write_all(&[7u8; 10_000]).expect("write");
                    let mut echoed = [0u8; 5];
                    let answered = client.read_exact(&mut echoed);
                    drop(client);
                    answered.map(|()| echoed)
                });
                let mut io = TcpIo::new(listener.accept().await.expect("accept"));
                let mut received = Vec::new();
                // Into a buffer that already holds bytes, none of the rest initialized: the
                // read lands after them, and exactly the bytes read become initialized.
                let mut storage = [std::mem::MaybeUninit::<u8>::uninit(); 16];
                let mut buf = ReadBuf::uninit(&mut storage);
                buf.put_slice(b"ab");
                futures_lite::future::poll_fn(|cx| Pin::new(&mut io).poll_read(cx, &mut buf))
                    .await
                    .expect("read");
                assert!(buf.filled().len() > 2 && buf.filled().starts_with(b"ab"));
                assert_eq!(buf.initialized().len(), buf.filled().len());
                received.extend_from_slice(&buf.filled()[2..]);
                // Into initialized bytes: they stay initialized past the read.
                let mut storage = [0xEEu8; 16];
                let mut buf = ReadBuf::new(&mut storage);
                buf.put_slice(b"xy");
                futures_lite::future::poll_fn(|cx| Pin::new(&mut io).poll_read(cx, &mut buf))
                    .await
                    .expect("read");
                assert!(buf.filled().len() > 2 && buf.filled().starts_with(b"xy"));
                assert_eq!(buf.initialized().len(), 16);
                received.extend_from_slice(&buf.filled()[2..]);
                // Into a growing buffer's spare capacity, as h2 reads.
                let mut rest = bytes::BytesMut::with_capacity(64);
                while received.len() + rest.len() < 7 + 10_000 {
                    rest.reserve(4096);
                    let read_bytes = io.read_buf(&mut rest).await.expect("read");
                    assert!(read_bytes > 0, "the peer is still sending");
                }
                received.extend_from_slice(&rest);
                io.write_all(b"done!").await.expect("write");
                io.flush().await.expect("flush");
                // The peer closes after reading the answer: a read then fills nothing.
                assert_eq!(io.read_buf(&mut rest).await.expect("read at close"), 0);
                let echoed = peer.join().expect("the peer thread ends");
                (received, echoed)
            };
            match futures_util::future::select(
                std::pin::pin!(work),
                std::pin::pin!(sleep(Duration::from_secs(10))),
            )
            .await
            {
                futures_util::future::Either::Left((done, _)) => done,
                futures_util::future::Either::Right(_) => panic!("TcpIo's reads stalled"),
            }
        })
        .expect("executor starts")
        .join()
        .expect("the executor finishes");
        assert_eq!(&received[..7], b"hello, ");
        assert!(received[7..].iter().all(|&b| b == 7));
        assert_eq!(received.len(), 7 + 10_000);
        assert_eq!(&echoed.expect("the answer arrives"), b"done!");
    }

    /// The executors' rings hold a completion back while their thread runs in user space
    /// (`COOP_TASKRUN`, third_party/README.md): no IPI interrupts the thread, and the
    /// completion is posted when the thread next enters the kernel. A thread busy with tasks
    /// that make no system call must still get it. Here one task spins, yielding but never
    /// sleeping, while another waits for bytes that arrive on its socket after the socket's
    /// poll was armed. Fails (the spinner gives up after 5 s) if the completion is lost.
    /// On this machine the timer tick's return to user space also posts it, so the test
    /// passes without the patched peek (`cq_ring_needs_flush`) as well; the peek is what
    /// posts it on a CPU without a tick (`nohz_full`), as an isolated core for a shard is.
    #[test]
    fn a_completion_reaches_an_executor_busy_in_user_space() {
        let seen_after = spawn_pinned("coop-test", process_cpu_list()[0], || async {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = listener.local_addr().expect("address");
            let peer = std::thread::spawn(move || {
                use std::io::Write;
                let mut client = std::net::TcpStream::connect(addr).expect("connect");
                // Long after the reader armed its poll, which the executor submits at the end
                // of its first turn (a 100 ms time slice at most).
                std::thread::sleep(Duration::from_millis(400));
                client.write_all(b"ping").expect("write");
                std::thread::sleep(Duration::from_secs(6));
            });
            let mut stream = listener.accept().await.expect("accept");
            let arrived = std::rc::Rc::new(std::cell::Cell::new(false));
            let reader_arrived = arrived.clone();
            spawn_local(async move {
                use futures_lite::AsyncReadExt;
                let mut buf = [0u8; 4];
                stream.read_exact(&mut buf).await.expect("read");
                assert_eq!(&buf, b"ping");
                reader_arrived.set(true);
            });
            let start = std::time::Instant::now();
            // No system call in this loop: `Instant::now` reads the vDSO clock.
            while !arrived.get() && start.elapsed() < Duration::from_secs(5) {
                futures_lite::future::yield_now().await;
            }
            let seen_after = arrived.get().then(|| start.elapsed());
            drop(peer);
            seen_after
        })
        .expect("executor starts")
        .join()
        .expect("the executor finishes");
        let seen_after = seen_after.expect("the read completed while the executor was busy");
        assert!(seen_after >= Duration::from_millis(300), "{seen_after:?}");
    }

    /// What the shards' call tasks rely on: a queued spawn runs only once its spawner yields,
    /// in spawn order, while glommio's own spawn polls the task before it returns.
    #[test]
    fn a_queued_spawn_runs_after_its_spawner_yields() {
        let order = spawn_pinned("spawn-test", process_cpu_list()[0], || async {
            let log = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
            for name in ["queued 1", "queued 2"] {
                let log = log.clone();
                spawn_local_queued(async move { log.borrow_mut().push(name) });
            }
            log.borrow_mut().push("spawner");
            let at_once = log.clone();
            spawn_local(async move { at_once.borrow_mut().push("at once") });
            log.borrow_mut().push("spawner, later");
            futures_lite::future::yield_now().await;
            let order = log.borrow().clone();
            order
        })
        .expect("executor starts")
        .join()
        .expect("the executor finishes");
        assert_eq!(
            order,
            [
                "spawner",
                "at once",
                "spawner, later",
                "queued 1",
                "queued 2"
            ]
        );
    }

    #[test]
    fn mailbox_wakes_a_consumer_on_another_executor() {
        let mb: Arc<Mailbox<u64>> = Mailbox::new(4);
        let consumer = {
            let mb = mb.clone();
            spawn_pinned("mb-test", process_cpu_list()[0], move || async move {
                let mut sum = 0;
                let mut got = 0;
                while got < 100 {
                    mb.ready().await;
                    while let Some(v) = mb.try_recv() {
                        sum += v;
                        got += 1;
                    }
                }
                sum
            })
            .expect("executor starts")
        };
        for i in 0..100u64 {
            let mut item = i;
            loop {
                match mb.try_send(item) {
                    Ok(()) => break,
                    Err(back) => {
                        item = back;
                        std::thread::yield_now();
                    }
                }
            }
        }
        assert_eq!(
            consumer.join().expect("consumer finishes"),
            (0..100).sum::<u64>()
        );
    }

    #[test]
    fn listening_sockets_share_a_port_and_allow_address_reuse() {
        let first = listening_socket("127.0.0.1:0".parse().expect("an address"))
            .expect("an ephemeral port binds");
        let addr = first
            .local_addr()
            .expect("a bound socket has an address")
            .as_socket()
            .expect("an inet address");
        // A second shard binds the same address (SO_REUSEPORT).
        let second = listening_socket(addr).expect("a second listener shares the port");
        for socket in [&first, &second] {
            assert!(socket.reuse_address().expect("getsockopt SO_REUSEADDR"));
            assert!(socket.reuse_port().expect("getsockopt SO_REUSEPORT"));
        }
    }

    #[test]
    fn a_port_with_connections_in_time_wait_can_be_bound_again() {
        // The previous owner listens as Go does (SO_REUSEADDR), accepts, and closes first, so
        // the server side of the connection lingers in TIME_WAIT on the port.
        let old = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = old.local_addr().expect("address");
        let client = std::net::TcpStream::connect(addr).expect("connect");
        let (accepted, _) = old.accept().expect("accept");
        drop(accepted);
        let mut client = client;
        let mut buf = [0u8; 1];
        let eof = std::io::Read::read(&mut client, &mut buf).expect("the server's FIN arrives");
        assert_eq!(eof, 0);
        drop(client);
        drop(old);
        // Without SO_REUSEADDR (glommio's bind sets only SO_REUSEPORT) this fails with
        // EADDRINUSE.
        let plain = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        plain.set_reuse_port(true).expect("SO_REUSEPORT");
        let err = plain
            .bind(&addr.into())
            .expect_err("TIME_WAIT blocks a plain bind");
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
        listening_socket(addr).expect("SO_REUSEADDR takes the port over");
    }

    // The allocator must not find a purge due between two of the purger's turns, which may
    // come up to one watchdog look (at most a second) late.
    const _: () =
        assert!(ALLOCATOR_PURGE_DELAY_MS >= 5 * FREED_MEMORY_PURGE_EVERY.as_millis() as i64);

    #[test]
    fn the_purge_delay_set_is_the_allocators_purge_delay() {
        // Nothing in this test binary starts a member, so the option still holds mimalloc's
        // default unless the environment set it; no other option defaults to 1000, so
        // another value means the enum index is wrong.
        let from_env = ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"]
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        let before = allocator_purge_delay_ms();
        assert!(
            from_env || before == 1000,
            "mi_option_get({MI_OPTION_PURGE_DELAY}) read {before}, not mimalloc's default purge delay"
        );
        leave_freed_memory_to_the_purger();
        assert_eq!(allocator_purge_delay_ms(), ALLOCATOR_PURGE_DELAY_MS);
    }

    #[test]
    fn a_port_counts_as_taken_while_it_is_listened_on_and_free_once_that_ends() {
        // Taken by a listener of our own kind (SO_REUSEPORT): the probe refuses it, having
        // waited for it to be freed.
        let taken = listening_socket("127.0.0.1:0".parse().expect("an address")).expect("bind");
        let addr = taken
            .local_addr()
            .expect("address")
            .as_socket()
            .expect("an inet address");
        let started = std::time::Instant::now();
        let err = ensure_unused(addr).expect_err("a listened-on port is taken");
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
        assert!(started.elapsed() >= PORT_FREED_WAIT);
        // Freed while the probe waits (as a killed process's listener is, a moment after it
        // was reaped): the probe takes it.
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(taken);
        });
        let taken_again = listening_socket(addr).expect("our own kind joins the group");
        drop(taken_again);
        ensure_unused(addr).expect("free once the listener is closed");
        closer.join().expect("the closer ends");
        // Port 0 is never taken.
        ensure_unused("127.0.0.1:0".parse().expect("an address")).expect("port 0");
    }

    #[test]
    fn a_bound_listener_accepts_on_its_executor() {
        let executor = spawn_pinned("listen-test", process_cpu_list()[0], || async {
            let listener = bind_listener("127.0.0.1:0".parse().expect("an address"))
                .expect("an ephemeral port binds");
            let addr = listener.local_addr().expect("an address");
            let client = std::net::TcpStream::connect(addr).expect("connect");
            let stream = listener.accept().await.expect("accept");
            assert_eq!(
                stream.peer_addr().expect("peer address"),
                client.local_addr().expect("local address")
            );
        })
        .expect("executor starts");
        executor.join().expect("the test body finishes");
    }

    /// The CPUs the calling thread may run on.
    fn own_cpus() -> Vec<usize> {
        // SAFETY: as in `cpus_beside_caller`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let rc = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            assert_eq!(rc, 0, "sched_getaffinity");
            (0..libc::CPU_SETSIZE as usize)
                .filter(|cpu| libc::CPU_ISSET(*cpu, &set))
                .collect()
        }
    }

    #[test]
    fn a_thread_started_beside_a_pinned_executor_runs_off_its_cpu() {
        let process_cpus = own_cpus();
        let pinned_cpu = process_cpus[0];
        let executor = spawn_pinned("beside-test", pinned_cpu, move || async move {
            assert_eq!(own_cpus(), vec![pinned_cpu], "the executor is pinned");
            on_thread("beside-test-helper", own_cpus).await
        })
        .expect("executor starts");
        let helper_cpus = executor.join().expect("the test body finishes");
        if process_cpus.len() > 1 {
            assert!(!helper_cpus.contains(&pinned_cpu), "{helper_cpus:?}");
            let others: Vec<usize> = process_cpus[1..].to_vec();
            assert_eq!(helper_cpus, others, "every other CPU the process has");
        } else {
            assert_eq!(helper_cpus, process_cpus, "one CPU: nowhere else to go");
        }
    }

    #[test]
    fn a_thread_started_off_a_cpu_from_an_unpinned_thread_keeps_off_it() {
        // The test thread is not pinned, as `node::run`'s thread is not: the thread must still
        // keep off the CPU named (the raft core's), not inherit every CPU.
        let process_cpus = own_cpus();
        let away = *process_cpus.last().expect("the process has a CPU");
        let cpus = spawn_off_cpu("off-cpu-test", away, own_cpus)
            .expect("the OS starts a thread")
            .join()
            .expect("the thread ends");
        if process_cpus.len() > 1 {
            let others: Vec<usize> = process_cpus[..process_cpus.len() - 1].to_vec();
            assert_eq!(cpus, others, "every CPU the process has but {away}");
        } else {
            assert_eq!(cpus, process_cpus, "one CPU: nowhere else to go");
        }
    }

    /// A nudge with nothing queued still wakes the consumer, once: the watch hubs look at
    /// their resync flag only when `ready` returns, and a cut batch queues nothing.
    #[test]
    fn a_nudge_makes_ready_return_once_with_nothing_queued() {
        let mb: Arc<Mailbox<u8>> = Mailbox::new(1);
        let (first_tx, first_rx) = std::sync::mpsc::channel();
        let consumer = {
            let mb = mb.clone();
            spawn_pinned("mb-nudge", process_cpu_list()[0], move || async move {
                mb.ready().await;
                first_tx.send(mb.is_empty()).expect("the test waits");
                // The nudge is used up: the next `ready` waits for an item.
                mb.ready().await;
                mb.try_recv()
            })
            .expect("executor starts")
        };
        mb.nudge();
        assert!(
            first_rx.recv().expect("ready returned"),
            "ready returned for the nudge alone"
        );
        assert!(mb.try_send(7).is_ok());
        assert_eq!(consumer.join().expect("consumer finishes"), Some(7));
    }

    /// Blocking work from a shard thread runs on its executor's blocking pool; from the raft
    /// core's thread (a hosted shard), on the helper thread, never on the raft core's pool.
    #[test]
    fn blocking_work_from_the_raft_core_thread_goes_to_the_helper() {
        let executor = spawn_pinned("blocking-test", process_cpu_list()[0], || async {
            let name = || std::thread::current().name().map(str::to_owned);
            let from_shard = blocking(name).await;
            mark_raft_core_thread();
            let from_raft_core = blocking(name).await;
            (from_shard, from_raft_core)
        })
        .expect("executor starts");
        let (from_shard, from_raft_core) = executor.join().expect("the test body finishes");
        assert_eq!(from_raft_core.as_deref(), Some("keel-helper"));
        assert_ne!(from_shard.as_deref(), Some("keel-helper"));
        // glommio's pool threads have no name; the executor's own thread does.
        assert_ne!(from_shard.as_deref(), Some("blocking-test"));
    }

    /// A task that works in steps and calls `let_others_run` between them (a long walk)
    /// never runs dry, yet a task waiting on a timer on the same executor runs between its
    /// steps: 20 sleeps of 1 ms end long before the executor's 100 ms time slices would have
    /// let them (20 slices, 2 s), as they do only when the executor goes round its rings
    /// between steps.
    #[test]
    fn a_task_that_lets_others_run_between_steps_lets_timers_fire() {
        const SLEEPS: u32 = 20;
        let executor = spawn_pinned("let-others-test", process_cpu_list()[0], || async {
            let slept = std::rc::Rc::new(std::cell::Cell::new(0u32));
            let sleeper = {
                let slept = slept.clone();
                glommio::spawn_local(async move {
                    for _ in 0..SLEEPS {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                        slept.set(slept.get() + 1);
                    }
                })
            };
            let started = std::time::Instant::now();
            // Bounded, so an executor that never polls fails the test instead of hanging it.
            while slept.get() < SLEEPS && started.elapsed() < Duration::from_secs(5) {
                // A step: 100 µs of work without yielding.
                let step = std::time::Instant::now();
                while step.elapsed() < Duration::from_micros(100) {
                    std::hint::spin_loop();
                }
                let_others_run().await;
            }
            sleeper.await;
            started.elapsed()
        })
        .expect("executor starts");
        let took = executor.join().expect("the test body finishes");
        assert!(
            took < Duration::from_millis(1_000),
            "{SLEEPS} sleeps of 1 ms took {took:?} beside the stepping task"
        );
    }

    /// glommio here is patched (third_party/glommio, KEEL PATCH): a turn's time slice is a
    /// deadline read from the clock instead of an io_uring timer. A task that only yields
    /// when glommio asks must still be asked, or a timer on the same executor never fires.
    #[test]
    fn a_task_that_yields_only_when_asked_lets_a_timer_fire() {
        let executor = spawn_pinned("preempt-test", process_cpu_list()[0], || async {
            let fired = std::rc::Rc::new(std::cell::Cell::new(false));
            let timer = {
                let fired = fired.clone();
                glommio::spawn_local(async move {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                    fired.set(true);
                })
            };
            let started = std::time::Instant::now();
            // Bounded, so a broken preemption fails the test instead of hanging it. The timer
            // task runs only if this one yields, and it yields only when glommio asks.
            while !fired.get() && started.elapsed() < Duration::from_secs(5) {
                glommio::yield_if_needed().await;
            }
            timer.detach();
            (fired.get(), started.elapsed())
        })
        .expect("executor starts");
        let (fired, elapsed) = executor.join().expect("the test body finishes");
        assert!(
            fired,
            "the timer never fired in {elapsed:?}: the busy task was never asked to yield"
        );
        assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    }

    /// glommio here keeps the timer a sleep armed for its next glommio timer, and reuses it
    /// for the next sleep if it is due no later (third_party/glommio, KEEL PATCH). A sleep
    /// whose timer is due sooner must arm its own, or it oversleeps; one woken again and
    /// again by another thread must still wake for its timer on time.
    #[test]
    fn sleeping_executors_wake_for_their_timers_across_wake_ups() {
        let mb: Arc<Mailbox<u32>> = Mailbox::new(4);
        let (tx, rx) = std::sync::mpsc::channel();
        let executor = {
            let mb = mb.clone();
            spawn_pinned("timer-test", process_cpu_list()[0], move || async move {
                let started = std::time::Instant::now();
                // A far timer: every sleep below arms or keeps one due at 1 s.
                let far = glommio::spawn_local(async move {
                    glommio::timer::sleep(Duration::from_millis(1000)).await;
                    started.elapsed()
                });
                // Woken from another thread while only the far timer is pending.
                mb.ready().await;
                while mb.try_recv().is_some() {}
                // A nearer timer now: the sleep must not keep waiting for the far one.
                let near_started = std::time::Instant::now();
                glommio::timer::sleep(Duration::from_millis(20)).await;
                let near = near_started.elapsed();
                tx.send(()).expect("the test waits");
                // Woken again and again, the far timer still fires on time.
                let mut woken = 0;
                while woken < 20 {
                    mb.ready().await;
                    while mb.try_recv().is_some() {
                        woken += 1;
                    }
                }
                (near, far.await)
            })
            .expect("executor starts")
        };
        std::thread::sleep(Duration::from_millis(30));
        assert!(mb.try_send(0).is_ok());
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the near timer fired");
        for i in 1..=20 {
            std::thread::sleep(Duration::from_millis(5));
            while mb.try_send(i).is_err() {
                std::thread::yield_now();
            }
        }
        let (near, far) = executor.join().expect("the test body finishes");
        // Generous bounds for a loaded CI machine; the broken case is about a second.
        assert!(
            near < Duration::from_millis(600),
            "a 20 ms timer took {near:?}: the sleep kept a later timer"
        );
        assert!(
            far >= Duration::from_millis(1000) && far < Duration::from_millis(3000),
            "a 1 s timer fired after {far:?}"
        );
    }

    /// A turn's time slice is a deadline read from the clock (third_party/glommio, KEEL
    /// PATCH), and a task queue may ask for a slice shorter than the time it takes to reach
    /// its first task, or a timer kept from a past sleep may fire before it. A turn must
    /// still run a task before it yields; one that yielded first ran nothing, every turn,
    /// and the executor spun without progress (or parked with tasks queued).
    #[test]
    fn a_turn_runs_a_task_even_when_its_slice_is_over_before_the_first() {
        const ROUNDS: u32 = 20;
        let (tx, rx) = std::sync::mpsc::channel();
        let executor = spawn_pinned("slice-test", process_cpu_list()[0], move || async move {
            let queue = glommio::executor().create_task_queue(
                glommio::Shares::default(),
                glommio::Latency::Matters(Duration::from_nanos(1)),
                "one-ns-slice",
            );
            let rounds = glommio::spawn_local_into(
                async {
                    let mut rounds = 0;
                    // Each wake-up comes from a timer, at the start of a turn, so every turn
                    // that should run this task begins with its queue active and a 1 ns slice.
                    while rounds < ROUNDS {
                        glommio::timer::sleep(Duration::from_millis(1)).await;
                        rounds += 1;
                    }
                    rounds
                },
                queue,
            )
            .expect("the queue exists")
            .await;
            tx.send(rounds).expect("the test waits");
        })
        .expect("executor starts");
        // Bounded, so the broken case fails instead of hanging (its executor thread spins on
        // until the test binary exits).
        let rounds = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the task of a queue with a 1 ns slice ran to its end");
        assert_eq!(rounds, ROUNDS);
        executor.join().expect("the executor finishes");
    }

    /// A future that is ready on its second poll: a task that awaits it goes back to its queue.
    struct YieldNow(bool);

    impl std::future::Future for YieldNow {
        type Output = ();
        fn poll(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<()> {
            if self.0 {
                return std::task::Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }

    /// Two task queues that always have work, each task yielding only when glommio asks:
    /// they take turns, a slice each. Returns, shortest first, the times one task waited
    /// for the other to run again, about two slices each. glommio here reads a long slice's end on the
    /// coarse clock and a short one's on the precise clock (third_party/glommio, KEEL PATCH
    /// `PreemptDeadline`): either way a slice must end, and not before its time. The slice
    /// is the shortest latency a queue with work asks for; `None` leaves the executor's own
    /// (100 ms, coarse on a kernel with 4 ms ticks).
    fn waits_for_the_other_queue(slice: Option<Duration>) -> Vec<Duration> {
        const ROUNDS: u32 = 5;
        let executor = spawn_pinned("slice-end", process_cpu_list()[0], move || async move {
            let latency = slice.map_or(glommio::Latency::NotImportant, glommio::Latency::Matters);
            let queue_a =
                glommio::executor().create_task_queue(glommio::Shares::default(), latency, "a");
            let queue_b =
                glommio::executor().create_task_queue(glommio::Shares::default(), latency, "b");
            let b_rounds = std::rc::Rc::new(std::cell::Cell::new(0u32));
            let done = std::rc::Rc::new(std::cell::Cell::new(false));
            let b = glommio::spawn_local_into(
                {
                    let (b_rounds, done) = (b_rounds.clone(), done.clone());
                    async move {
                        while !done.get() {
                            // Back to its queue at once, so the queue never runs dry; the
                            // queue itself yields only when the slice is over.
                            b_rounds.set(b_rounds.get() + 1);
                            YieldNow(false).await;
                        }
                    }
                },
                queue_b,
            )
            .expect("the queue exists");
            let waits = glommio::spawn_local_into(
                async move {
                    let mut waits = Vec::new();
                    // Round 0's turn began before the queues had work, so it ran on the
                    // executor's own slice whatever the queues ask for: not counted.
                    for round in 0..=ROUNDS {
                        let seen = b_rounds.get();
                        let started = std::time::Instant::now();
                        // Bounded, so a slice that never ends fails the test instead of
                        // hanging it.
                        while b_rounds.get() == seen && started.elapsed() < Duration::from_secs(5) {
                            glommio::yield_if_needed().await;
                        }
                        if round > 0 {
                            waits.push(started.elapsed());
                        }
                    }
                    done.set(true);
                    waits.sort();
                    waits
                },
                queue_a,
            )
            .expect("the queue exists")
            .await;
            b.await;
            waits
        })
        .expect("executor starts");
        executor.join().expect("the test body finishes")
    }

    #[test]
    fn a_busy_task_yields_when_its_slice_ends_on_either_clock() {
        // The medians: a thread the kernel sets aside on a busy machine lengthens a round or
        // two, never shortens one.
        let long = waits_for_the_other_queue(None);
        assert!(
            long[0] >= Duration::from_millis(50) && long[long.len() / 2] < Duration::from_secs(1),
            "with 100 ms slices, the other queue waited {long:?}"
        );
        let short = waits_for_the_other_queue(Some(Duration::from_millis(2)));
        assert!(
            short[short.len() / 2] < Duration::from_millis(50),
            "with 2 ms slices, the other queue waited {short:?}"
        );
    }

    /// The sleeping side of a cross-core wake-up: the consumer goes to sleep before every
    /// item (the producer waits for each answer), so each round runs the sleep handshake that
    /// the patched glommio does with fences instead of `membarrier` (third_party/glommio,
    /// KEEL PATCH). A lost wake-up shows as a round that never answers.
    #[test]
    fn a_sleeping_consumer_is_woken_for_every_item() {
        const ROUNDS: u64 = 5_000;
        let mb: Arc<Mailbox<u64>> = Mailbox::new(1);
        let (ack_tx, ack_rx) = std::sync::mpsc::channel();
        let consumer = {
            let mb = mb.clone();
            spawn_pinned("mb-sleep", process_cpu_list()[0], move || async move {
                let mut got = 0;
                while got < ROUNDS {
                    mb.ready().await;
                    while let Some(v) = mb.try_recv() {
                        ack_tx.send(v).expect("the test waits");
                        got += 1;
                    }
                }
            })
            .expect("executor starts")
        };
        for i in 0..ROUNDS {
            // A short pause now and then lets the consumer get all the way to sleep.
            if i % 64 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
            assert!(
                mb.try_send(i).is_ok(),
                "the consumer answered the last item"
            );
            let answered = ack_rx
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("item {i} was never taken: a lost wake-up"));
            assert_eq!(answered, i);
        }
        consumer.join().expect("consumer finishes");
    }

    /// glommio looks up a task's executor (its sleep notifier, which wake-ups from other
    /// threads go through) when the task is spawned, and a thread keeps the one it found last
    /// (a KEEL PATCH in third_party/glommio). Executors run one after another on one thread
    /// must each get their own: a task woken through another executor's notifier would never
    /// run. The earlier executors stay alive, so a cache that ignored the id would hand out a
    /// live notifier of an idle executor, and the test would hang.
    #[test]
    fn executors_made_one_after_another_on_a_thread_get_their_own_wake_ups() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            for round in 0..3u32 {
                let executor = glommio::LocalExecutorBuilder::default()
                    .make()
                    .expect("executor");
                executor.run(async move {
                    let mb: Arc<Mailbox<u32>> = Mailbox::new(1);
                    let sender = {
                        let mb = mb.clone();
                        std::thread::spawn(move || {
                            // Long enough for the task below to wait, and its executor to sleep.
                            std::thread::sleep(Duration::from_millis(20));
                            assert!(mb.try_send(round).is_ok());
                        })
                    };
                    let waiting = glommio::spawn_local(async move {
                        mb.ready().await;
                        mb.try_recv()
                    });
                    assert_eq!(waiting.await, Some(round));
                    sender.join().expect("the sender");
                });
                kept.push(executor);
            }
            done_tx.send(()).expect("the test waits");
            drop(kept);
        });
        done_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("every executor was woken for its task");
    }

    #[test]
    fn full_mailbox_refuses_and_gives_the_item_back() {
        let mb: Arc<Mailbox<u8>> = Mailbox::new(1);
        assert!(mb.try_send(1).is_ok());
        assert_eq!(mb.try_send(2), Err(2));
        mb.close();
        assert_eq!(mb.try_recv(), Some(1));
        assert_eq!(mb.try_send(3), Err(3));
    }
}
