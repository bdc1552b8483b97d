//! CPU per unary gRPC call through the server's HTTP/2 and gRPC layers, with no socket, no
//! kernel and no other thread: a measure of h2's and this crate's own cost per call that
//! stays within a few percent from run to run, where the end-to-end benchmarks (`keel-bench
//! compare`, `bench/scripts/server-ab.sh`) spread by ±15 % on a shared 2-core VM.
//!
//! A client's bytes are encoded once up front: the HTTP/2 preface, SETTINGS, a connection
//! WINDOW_UPDATE, then for each call a HEADERS frame (HPACK as a Go or h2 client writes it:
//! the first call's fields enter the dynamic table, later calls index them) and one DATA frame
//! with a PutRequest of an 8-byte key and a 256-byte value, as in `keel-bench put`. The
//! connection reads those bytes from memory, at most `IN_FLIGHT` calls ahead of the answered
//! ones (the put benchmark's 1000 clients over 100 connections keep about 10 in flight on
//! each), and writes into a counter. The handler decodes the PutRequest and answers a
//! PutResponse with a header, through `keel_grpc::unary`, as Keel's service does.
//!
//!   cargo bench -p keel-grpc --bench unary [-- CALLS ROUNDS CONNS]
//!
//! prints the median, min and max ns of the thread's CPU time per call over ROUNDS rounds of CALLS calls (default
//! 200,000 and 7), spread over CONNS fresh connections served at once (default 1; the put
//! benchmark's 100 adds the cost of their state falling out of the CPU's caches), and the
//! heap allocations per call.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::{Cell, RefCell};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::{BufMut, Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use keel_grpc::{serve_connection, unary, Call, Handler, ResponseSink, ServerConfig, Status};
use keel_proto::etcdserverpb::{PutRequest, PutResponse, ResponseHeader};
use prost::Message;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Counts heap allocations, passing them on to mimalloc (Keel's allocator).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Calls a connection keeps in flight (1000 clients over 100 connections).
const IN_FLIGHT: usize = 10;
/// The most bytes one read returns, as a socket read into h2's buffer would.
const READ_BYTES_MAX: usize = 16 * 1024;
const KEY_BYTES: usize = 8;
const VALUE_BYTES: usize = 256;

/// Frame types and flags (RFC 9113 section 6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;
const END_STREAM: u8 = 0x1;
const SETTINGS_ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(out: &mut BytesMut, kind: u8, flags: u8, stream_id: u32, payload: &[u8]) {
    let length = payload.len() as u32;
    assert!(
        length < 1 << 14,
        "one frame within the default max frame size"
    );
    out.put_slice(&length.to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream_id);
    out.put_slice(payload);
}

/// An HPACK string literal, no Huffman coding (lengths here stay under 127).
fn literal(out: &mut Vec<u8>, text: &[u8]) {
    assert!(
        text.len() < 127,
        "a length that fits HPACK's 7-bit prefix in one byte"
    );
    out.push(text.len() as u8);
    out.extend_from_slice(text);
}

/// The first call's header block: the fields enter the dynamic table, newest at index 62.
fn first_header_block() -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static 3 and 6)
    block.push(0x44); // :path (static name 4), incremental indexing
    literal(&mut block, b"/etcdserverpb.KV/Put");
    block.push(0x41); // :authority (static name 1)
    literal(&mut block, b"127.0.0.1:2379");
    block.push(0x5f); // content-type (static name 31)
    literal(&mut block, b"application/grpc");
    block.push(0x40); // te, a new name
    literal(&mut block, b"te");
    literal(&mut block, b"trailers");
    block.push(0x40);
    literal(&mut block, b"user-agent");
    literal(&mut block, b"grpc-go/1.26.0");
    block
}

/// Every later call's block: each field indexed (user-agent 62 ... :path 66).
const LATER_HEADER_BLOCK: [u8; 7] = [0x83, 0x86, 0xc2, 0xc1, 0xc0, 0xbf, 0xbe];

/// The client's bytes for `calls` puts, and where each call's bytes end.
fn client_bytes(calls: usize) -> (Bytes, Vec<usize>) {
    let mut out = BytesMut::new();
    out.put_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    // SETTINGS_INITIAL_WINDOW_SIZE (4) at its largest, so answers never wait for a window.
    let mut settings = Vec::new();
    settings.extend_from_slice(&4u16.to_be_bytes());
    settings.extend_from_slice(&((1u32 << 31) - 1).to_be_bytes());
    frame(&mut out, SETTINGS, 0, 0, &settings);
    // The server's SETTINGS go out first, at the handshake, so a client's ACK of them can
    // come this early; it makes the server's own settings (windows, frame size) take effect.
    frame(&mut out, SETTINGS, SETTINGS_ACK, 0, &[]);
    let increment = (1u32 << 31) - 1 - 65_535;
    frame(&mut out, WINDOW_UPDATE, 0, 0, &increment.to_be_bytes());
    let mut ends = Vec::with_capacity(calls);
    let first = first_header_block();
    for call in 0..calls {
        let stream_id = 2 * call as u32 + 1;
        let block: &[u8] = if call == 0 {
            &first
        } else {
            &LATER_HEADER_BLOCK
        };
        frame(&mut out, HEADERS, END_HEADERS, stream_id, block);
        let request = PutRequest {
            key: Bytes::from(format!("{:0width$}", call % 20_000, width = KEY_BYTES)),
            value: Bytes::from(vec![b'v'; VALUE_BYTES]),
            ..PutRequest::default()
        };
        let mut message = Vec::with_capacity(5 + request.encoded_len());
        message.push(0);
        message.extend_from_slice(&(request.encoded_len() as u32).to_be_bytes());
        request.encode(&mut message).expect("a Vec grows");
        frame(&mut out, DATA, END_STREAM, stream_id, &message);
        ends.push(out.len());
    }
    (out.freeze(), ends)
}

/// What the connection and the handler share: how many calls have been answered, and the
/// connection's reader, parked until an answer lets the next call in.
#[derive(Default)]
struct Progress {
    answered: Cell<usize>,
    reader: RefCell<Option<Waker>>,
}

impl Progress {
    fn answered_one(&self) {
        self.answered.set(self.answered.get() + 1);
        if let Some(waker) = self.reader.borrow_mut().take() {
            waker.wake();
        }
    }
}

/// The connection's socket: reads the client's bytes, at most `IN_FLIGHT` calls past the
/// answered ones; writes are counted and dropped.
struct MemoryIo {
    input: Bytes,
    read_bytes: usize,
    /// Where the bytes of each call end (the preamble comes before the first).
    call_ends: Vec<usize>,
    progress: Rc<Progress>,
    written_bytes: usize,
}

impl AsyncRead for MemoryIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.read_bytes == this.input.len() {
            // Every call sent: the client closes once all are answered.
            if this.progress.answered.get() == this.call_ends.len() {
                return Poll::Ready(Ok(()));
            }
            *this.progress.reader.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let let_in = (this.progress.answered.get() + IN_FLIGHT).min(this.call_ends.len());
        let readable_end = this.call_ends[let_in - 1];
        if this.read_bytes >= readable_end {
            *this.progress.reader.borrow_mut() = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = (readable_end - this.read_bytes)
            .min(buf.remaining())
            .min(READ_BYTES_MAX);
        buf.put_slice(&this.input[this.read_bytes..this.read_bytes + n]);
        this.read_bytes += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MemoryIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written_bytes += buf.len();
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[path = "../tests/support/glommio_runtime.rs"]
mod glommio_runtime;
use glommio_runtime::GlommioRuntime;

struct PutHandler {
    progress: Rc<Progress>,
}

impl Handler for PutHandler {
    async fn grpc(self: Rc<Self>, call: Call, sink: &mut ResponseSink) -> Status {
        assert_eq!(call.head.path, "/etcdserverpb.KV/Put");
        let status = unary(call, sink, |request: PutRequest, _head| async move {
            assert_eq!(request.value.len(), VALUE_BYTES);
            Ok(PutResponse {
                header: Some(ResponseHeader {
                    cluster_id: 0x1234_5678_9abc_def0,
                    member_id: 0x0fed_cba9_8765_4321,
                    revision: 1_000_000 + request.key.len() as i64,
                    raft_term: 2,
                }),
                prev_kv: None,
            })
        })
        .await;
        self.progress.answered_one();
        status
    }
}

/// This thread's CPU time so far, in nanoseconds: the kernel's run time of the task, brought
/// up to date by the call, which leaves out time a VM's CPU was stolen by its host, unlike a
/// wall clock. (`/proc/thread-self/schedstat` would lag by up to a scheduler tick.)
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(
        rc, 0,
        "CLOCK_THREAD_CPUTIME_ID is always available on Linux"
    );
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// `conns` connections at once, each through the calls of `call_ends`: nanoseconds per call
/// and allocations per call.
async fn one_round(conns: usize, input: Bytes, call_ends: Vec<usize>) -> (f64, f64) {
    let calls = conns * call_ends.len();
    let config = Rc::new(ServerConfig::default());
    let mut connections = Vec::with_capacity(conns);
    let mut progresses = Vec::with_capacity(conns);
    let allocations_before = ALLOCATIONS.load(Ordering::Relaxed);
    let started = thread_cpu_ns();
    for _ in 0..conns {
        let progress = Rc::new(Progress::default());
        let io = MemoryIo {
            input: input.clone(),
            read_bytes: 0,
            call_ends: call_ends.clone(),
            progress: progress.clone(),
            written_bytes: 0,
        };
        let handler = Rc::new(PutHandler {
            progress: progress.clone(),
        });
        progresses.push(progress);
        let connection = serve_connection(io, handler, config.clone(), Rc::new(GlommioRuntime));
        connections.push(glommio::spawn_local(connection));
    }
    for connection in connections {
        connection.await.expect("the connection serves every call");
    }
    let elapsed_ns = thread_cpu_ns() - started;
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations_before;
    for progress in progresses {
        assert_eq!(
            progress.answered.get(),
            call_ends.len(),
            "every call answered"
        );
    }
    (
        elapsed_ns as f64 / calls as f64,
        allocations as f64 / calls as f64,
    )
}

fn main() {
    // `cargo bench` passes `--bench`, then CALLS, ROUNDS and CONNS if given. `cargo test`
    // runs this too (with neither): a short smoke run, so the benchmark keeps working.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let numbers: Vec<usize> = args.iter().filter_map(|arg| arg.parse().ok()).collect();
    let smoke = numbers.is_empty() && !args.iter().any(|arg| arg == "--bench");
    let (default_calls, default_rounds, default_conns) = if smoke {
        (2_000, 1, 2)
    } else {
        (200_000, 7, 1)
    };
    let calls = numbers.first().copied().unwrap_or(default_calls);
    let rounds = numbers.get(1).copied().unwrap_or(default_rounds);
    let conns = numbers.get(2).copied().unwrap_or(default_conns).max(1);
    assert!(calls >= conns, "at least one call per connection");
    // Whole calls per connection: the figures count what ran.
    let calls = calls / conns * conns;
    let (input, call_ends) = client_bytes(calls / conns);
    let results = LocalExecutorBuilder::new(Placement::Unbound)
        .name("unary-bench")
        .io_memory(1 << 20)
        .spawn(move || async move {
            // One round first to warm the allocator and caches, not counted.
            one_round(conns, input.clone(), call_ends.clone()).await;
            let mut results = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                results.push(one_round(conns, input.clone(), call_ends.clone()).await);
            }
            results
        })
        .expect("executor")
        .join()
        .expect("bench ran");
    let mut ns: Vec<f64> = results.iter().map(|(ns, _)| *ns).collect();
    ns.sort_by(f64::total_cmp);
    let allocations = results[0].1;
    println!(
        "unary put through serve_connection, {calls} calls over {conns} connections x {rounds} rounds, \
         {IN_FLIGHT} in flight on each: \
         ns per call median {:.0} (min {:.0}, max {:.0}); heap allocations per call {allocations:.2}",
        ns[ns.len() / 2],
        ns[0],
        ns[ns.len() - 1],
    );
}
