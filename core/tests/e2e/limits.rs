//! Limits and faults at the edge of a member, against the real binary: taking over a port that
//! etcd just left, SETTINGS_MAX_CONCURRENT_STREAMS, the per-shard connection limit, the
//! per-stream watcher limit and the preface timeout. Where etcd has the same knob, the test
//! runs the same steps against a real etcd 3.4 so the expectation is etcd's. Also: calls that
//! arrive together are answered in one write (counted in TCP segments received).
//!
//! HTTP/2 is spoken here frame by frame over a blocking socket (`RawH2`), because the `h2`
//! client obeys the server's stream limit and so can never exceed it.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::WatchOptions;
use prost::Message;

use crate::common::{client, Kind, Server};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_DATA: u8 = 0x0;
const FRAME_HEADERS: u8 = 0x1;
const FRAME_RST_STREAM: u8 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_PING: u8 = 0x6;
const FRAME_GOAWAY: u8 = 0x7;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const REASON_REFUSED_STREAM: u32 = 0x7;
const REASON_CANCEL: u32 = 0x8;
/// How long a raw read may wait before the test calls the server stuck.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP/2 frame as read off the wire.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream_id: u32,
    payload: Vec<u8>,
}

/// How a stream ended, seen from the client.
#[derive(Debug, PartialEq, Eq)]
enum StreamEnd {
    /// The server reset it with this error code.
    Reset(u32),
    /// The server answered: the DATA it sent, then trailers with END_STREAM.
    Answered(Vec<u8>),
}

/// A minimal HTTP/2 client over a blocking socket: it writes frames as asked, without the
/// client-side stream limit a real client applies, and answers SETTINGS and PING.
struct RawH2 {
    tcp: TcpStream,
    authority: String,
    /// The server's SETTINGS, as (identifier, value).
    settings: Vec<(u16, u32)>,
    /// Frames held back by `cork`, for `uncork` to write at once.
    corked: Option<Vec<u8>>,
}

impl RawH2 {
    /// Connects, sends the preface and empty SETTINGS and reads the server's SETTINGS.
    /// `None`: the server closed the connection instead.
    fn connect(port: u16) -> Option<RawH2> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).expect("the server accepts TCP");
        tcp.set_read_timeout(Some(READ_TIMEOUT))
            .expect("set a read timeout");
        tcp.set_nodelay(true).expect("set TCP_NODELAY");
        let mut h2 = RawH2 {
            tcp,
            authority: format!("127.0.0.1:{port}"),
            settings: Vec::new(),
            corked: None,
        };
        // A refused connection may be closed before these writes land.
        h2.tcp.write_all(PREFACE).ok()?;
        h2.write_frame(FRAME_SETTINGS, 0, 0, &[]).ok()?;
        loop {
            let frame = h2.read_frame()?;
            if frame.kind == FRAME_SETTINGS && frame.flags & FLAG_ACK == 0 {
                h2.settings = frame
                    .payload
                    .chunks_exact(6)
                    .map(|p| {
                        (
                            u16::from_be_bytes([p[0], p[1]]),
                            u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                        )
                    })
                    .collect();
                h2.write_frame(FRAME_SETTINGS, FLAG_ACK, 0, &[]).ok()?;
                return Some(h2);
            }
        }
    }

    fn setting(&self, id: u16) -> Option<u32> {
        self.settings
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, v)| *v)
    }

    fn write_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream_id: u32,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let len = payload.len() as u32;
        assert!(len < 1 << 14, "frames stay under the default maximum size");
        let mut frame = Vec::with_capacity(9 + payload.len());
        frame.extend_from_slice(&len.to_be_bytes()[1..]);
        frame.push(kind);
        frame.push(flags);
        frame.extend_from_slice(&stream_id.to_be_bytes());
        frame.extend_from_slice(payload);
        match &mut self.corked {
            Some(held) => {
                held.extend_from_slice(&frame);
                Ok(())
            }
            None => self.tcp.write_all(&frame),
        }
    }

    /// Holds the frames written from now on until `uncork`.
    fn cork(&mut self) {
        self.corked = Some(Vec::new());
    }

    /// Writes the held frames in one write, so the server reads them together.
    fn uncork(&mut self) {
        let held = self.corked.take().expect("corked");
        self.tcp.write_all(&held).expect("the held frames are sent");
    }

    /// TCP segments this socket has received so far (`tcpi_segs_in`).
    fn segments_in(&self) -> u32 {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed tcp_info is valid; getsockopt writes at most `len` bytes into it.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: the pointers are to `info` and `len`, which outlive the call.
        let rc = unsafe {
            libc::getsockopt(
                self.tcp.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
        info.tcpi_segs_in
    }

    /// The next frame; `None` when the server closed (or reset) the connection.
    fn read_frame(&mut self) -> Option<Frame> {
        let mut head = [0u8; 9];
        match self.tcp.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("no frame from the server in {READ_TIMEOUT:?}")
            }
            Err(_) => return None,
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        self.tcp.read_exact(&mut payload).ok()?;
        Some(Frame {
            kind: head[3],
            flags: head[4],
            stream_id: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        })
    }

    /// HEADERS for a gRPC call to `path`, HPACK-encoded as literals without indexing.
    fn open_stream(&mut self, stream_id: u32, path: &str) {
        let authority = self.authority.clone();
        let headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority.as_str()),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ];
        let mut block = Vec::new();
        for (name, value) in headers {
            block.push(0x00);
            hpack_string(&mut block, name);
            hpack_string(&mut block, value);
        }
        self.write_frame(FRAME_HEADERS, FLAG_END_HEADERS, stream_id, &block)
            .expect("HEADERS is sent");
    }

    /// A unary Range call for `key` on a new stream: HEADERS, then the message with END_STREAM.
    fn range(&mut self, stream_id: u32, key: &str) {
        self.range_as(stream_id, key, false)
    }

    /// `range`, serializable or linearizable.
    fn range_as(&mut self, stream_id: u32, key: &str, serializable: bool) {
        self.open_stream(stream_id, "/etcdserverpb.KV/Range");
        let message = keel_proto::etcdserverpb::RangeRequest {
            key: key.as_bytes().to_vec().into(),
            serializable,
            ..Default::default()
        }
        .encode_to_vec();
        let mut body = vec![0u8];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(&message);
        // The server may have reset the stream already; the write still lands on the socket.
        let _ = self.write_frame(FRAME_DATA, FLAG_END_STREAM, stream_id, &body);
    }

    fn reset(&mut self, stream_id: u32, reason: u32) {
        self.write_frame(FRAME_RST_STREAM, 0, stream_id, &reason.to_be_bytes())
            .expect("RST_STREAM is sent");
    }

    /// Reads until `stream_id` ends, answering SETTINGS and PING on the way. Panics on GOAWAY
    /// or a closed connection: the connection must keep serving.
    fn stream_end(&mut self, stream_id: u32) -> StreamEnd {
        let mut data = Vec::new();
        loop {
            let frame = self
                .read_frame()
                .unwrap_or_else(|| panic!("the connection closed while stream {stream_id} ran"));
            match frame.kind {
                FRAME_GOAWAY => panic!("the server sent GOAWAY: {frame:?}"),
                FRAME_SETTINGS if frame.flags & FLAG_ACK == 0 => self
                    .write_frame(FRAME_SETTINGS, FLAG_ACK, 0, &[])
                    .expect("SETTINGS ack"),
                FRAME_PING if frame.flags & FLAG_ACK == 0 => self
                    .write_frame(FRAME_PING, FLAG_ACK, 0, &frame.payload)
                    .expect("PING ack"),
                _ if frame.stream_id != stream_id => {}
                FRAME_RST_STREAM => {
                    let code = u32::from_be_bytes(
                        frame.payload[..4].try_into().expect("a 4-byte error code"),
                    );
                    return StreamEnd::Reset(code);
                }
                FRAME_DATA => {
                    data.extend_from_slice(&frame.payload);
                    if frame.flags & FLAG_END_STREAM != 0 {
                        return StreamEnd::Answered(data);
                    }
                }
                FRAME_HEADERS if frame.flags & FLAG_END_STREAM != 0 => {
                    return StreamEnd::Answered(data)
                }
                _ => {}
            }
        }
    }
}

/// An HPACK string literal without Huffman coding: a 7-bit-prefix length, then the bytes.
fn hpack_string(out: &mut Vec<u8>, text: &str) {
    let mut len = text.len();
    if len < 127 {
        out.push(len as u8);
    } else {
        out.push(127);
        len -= 127;
        while len >= 128 {
            out.push((len % 128) as u8 | 0x80);
            len /= 128;
        }
        out.push(len as u8);
    }
    out.extend_from_slice(text.as_bytes());
}

/// A successful Range answer: one gRPC message that decodes as a RangeResponse with a header.
fn assert_range_answer(end: StreamEnd, what: &str) {
    let StreamEnd::Answered(data) = end else {
        panic!("{what}: expected an answer, got {end:?}")
    };
    assert!(data.len() > 5, "{what}: no response message in {data:?}");
    let declared = u32::from_be_bytes(data[1..5].try_into().expect("a 4-byte length")) as usize;
    assert_eq!(declared, data.len() - 5, "{what}: one whole message");
    let response = keel_proto::etcdserverpb::RangeResponse::decode(&data[5..])
        .unwrap_or_else(|e| panic!("{what}: not a RangeResponse: {e}"));
    assert!(response.header.is_some(), "{what}: {response:?}");
}

/// What happens on one connection to a server started with `--max-concurrent-streams 3`.
fn stream_limit_steps(server: &Server) {
    let what = format!("{:?}", server.kind);
    let mut h2 = RawH2::connect(server.client_port).expect("the server takes the connection");
    assert_eq!(
        h2.setting(SETTINGS_MAX_CONCURRENT_STREAMS),
        Some(3),
        "{what}: advertised SETTINGS {:?}",
        h2.settings
    );
    // Three Watch streams that stay open: the client never half-closes them.
    for stream_id in [1, 3, 5] {
        h2.open_stream(stream_id, "/etcdserverpb.Watch/Watch");
    }
    // The fourth is refused as HTTP/2 says, and only that stream.
    h2.range(7, "k");
    assert_eq!(
        h2.stream_end(7),
        StreamEnd::Reset(REASON_REFUSED_STREAM),
        "{what}: a stream beyond the limit"
    );
    // Freeing a slot lets the next call through on the same connection. The server releases
    // the slot once the reset watch's task has ended, so a call racing it may still be refused.
    h2.reset(1, REASON_CANCEL);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut stream_id = 9;
    loop {
        h2.range(stream_id, "k");
        match h2.stream_end(stream_id) {
            StreamEnd::Reset(REASON_REFUSED_STREAM) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
                stream_id += 2;
            }
            end => {
                assert_range_answer(end, &what);
                break;
            }
        }
    }
}

/// Calls that arrive in one read and answer at once (serializable Ranges) go back in one
/// write, not one each. glommio polls a task it spawns before the spawner goes on, so a
/// call spawned that way answered inside its own accept, and the connection flushed each
/// answer alone before it accepted the next call: ten calls came back in ten TCP segments.
#[test]
fn calls_read_together_are_answered_in_one_write() {
    const CALLS: u32 = 10;
    let server = Server::keel(&[]);
    let mut h2 = RawH2::connect(server.client_port).expect("the server takes the connection");
    // One call first, so that the connection's own first frames are behind us.
    h2.range_as(1, "k", true);
    assert_range_answer(h2.stream_end(1), "the first call");
    std::thread::sleep(Duration::from_millis(200));
    let before = h2.segments_in();
    h2.cork();
    let streams: Vec<u32> = (0..CALLS).map(|i| 3 + 2 * i).collect();
    for &stream_id in &streams {
        h2.range_as(stream_id, "k", true);
    }
    h2.uncork();
    // The answers may come in any order: each stream's frames are gathered as they come.
    let mut bodies: std::collections::BTreeMap<u32, Vec<u8>> = Default::default();
    let mut ended = Vec::new();
    while ended.len() < streams.len() {
        let frame = h2.read_frame().expect("the connection stays open");
        if !streams.contains(&frame.stream_id) {
            continue;
        }
        match frame.kind {
            FRAME_DATA => bodies
                .entry(frame.stream_id)
                .or_default()
                .extend_from_slice(&frame.payload),
            FRAME_HEADERS if frame.flags & FLAG_END_STREAM != 0 => ended.push(frame.stream_id),
            FRAME_RST_STREAM => panic!("stream {} was reset: {frame:?}", frame.stream_id),
            _ => {}
        }
    }
    for stream_id in streams {
        let body = bodies.remove(&stream_id).unwrap_or_default();
        assert_range_answer(StreamEnd::Answered(body), "a call of the batch");
    }
    let segments = h2.segments_in() - before;
    // One write for the ten answers, with room for an ACK or a WINDOW_UPDATE of their own.
    assert!(
        segments <= 4,
        "{CALLS} calls read together were answered in {segments} TCP segments"
    );
}

#[test]
fn max_concurrent_streams_is_advertised_and_a_stream_beyond_it_is_refused() {
    const ARGS: &[&str] = &["--max-concurrent-streams", "3"];
    let etcd = std::thread::spawn(|| Server::start(Kind::Etcd, ARGS));
    let keel = Server::keel(ARGS);
    let etcd = etcd.join().expect("etcd starts");
    stream_limit_steps(&etcd);
    stream_limit_steps(&keel);
}

/// Whether `port` has sockets other than listeners bound on 127.0.0.1 (TIME_WAIT, FIN_WAIT2
/// and the like), from /proc/net/tcp.
fn lingering_sockets(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp is readable");
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // State 0A is LISTEN, 01 ESTABLISHED: neither is left behind by a dead process.
            fields.len() > 3 && fields[1] == local && !matches!(fields[3], "0A" | "01")
        })
        .count()
}

/// Whether a socket with only SO_REUSEPORT (what glommio's own bind sets) can bind `port`.
fn reuseport_only_bind(port: u16) -> std::io::Result<()> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.set_reuse_port(true)?;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    socket.bind(&addr.into())
}

/// A raw HTTP/1.1 keep-alive connection that has sent one request and read its answer, so the
/// server holds an idle accepted connection with nothing unread: when the server goes away
/// its side of the connection lingers on the port.
fn idle_http_connection(port: u16, path: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    tcp.set_read_timeout(Some(READ_TIMEOUT))
        .expect("set a read timeout");
    write!(tcp, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").expect("request");
    let mut got = [0u8; 512];
    let n = tcp.read(&mut got).expect("an answer");
    assert!(
        got[..n].starts_with(b"HTTP/1.1 "),
        "{:?}",
        String::from_utf8_lossy(&got[..n])
    );
    tcp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keel_takes_over_the_ports_of_an_etcd_that_just_stopped() {
    let mut etcd = tokio::task::spawn_blocking(|| Server::etcd(&[]))
        .await
        .expect("etcd starts");
    let (client_port, peer_port) = (etcd.client_port, etcd.peer_port);
    // Load from several client connections while etcd stops.
    let stop = Arc::new(AtomicBool::new(false));
    let puts = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for worker in 0..4 {
        let mut c = client(&etcd).await;
        let (stop, puts) = (stop.clone(), puts.clone());
        load.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Bounded, so a put caught by the stop cannot hold the test up.
                let put = c.put(format!("load/{worker}/{i}"), "v", None);
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), put).await {
                    puts.fetch_add(1, Ordering::Relaxed);
                }
                i += 1;
            }
        }));
    }
    // Idle accepted connections on both ports, so the stop leaves sockets behind for sure.
    let idle: Vec<TcpStream> = (0..3)
        .flat_map(|_| {
            [
                idle_http_connection(client_port, "/health"),
                idle_http_connection(peer_port, "/version"),
            ]
        })
        .collect();
    while puts.load(Ordering::Relaxed) < 50 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let etcd = tokio::task::spawn_blocking(move || {
        etcd.stop();
        etcd
    })
    .await
    .expect("etcd stops");
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("a load task ends");
    }
    // Our side closes after etcd's: etcd's side of each connection is now in TIME_WAIT.
    drop(idle);
    // The situation this test is about: without SO_REUSEADDR the ports cannot be bound.
    for port in [client_port, peer_port] {
        assert!(
            lingering_sockets(port) > 0,
            "port {port}: nothing left behind by etcd"
        );
        let err = reuseport_only_bind(port).expect_err("a SO_REUSEPORT-only bind fails");
        assert_eq!(err.kind(), ErrorKind::AddrInUse, "port {port}: {err}");
    }
    let keel = tokio::task::spawn_blocking(move || {
        Server::start_on(Kind::Keel, client_port, peer_port, &[])
    })
    .await
    .expect("keel starts on etcd's ports");
    let mut c = client(&keel).await;
    c.put("after-etcd", "keel", None)
        .await
        .expect("keel serves a put");
    let r = c.get("after-etcd", None).await.expect("keel serves a get");
    assert_eq!(r.kvs()[0].value(), b"keel");
    drop(etcd);
}

/// A second server started on a port the first one listens on stops at once with "address
/// already in use", as etcd does, and the first one goes on serving. Keel's shards bind their
/// client ports with SO_REUSEPORT, which Linux lets another process of the same user join:
/// without its check at start, the second member shared the port and took half of the
/// first one's clients.
#[test]
fn a_second_member_on_a_taken_port_stops_as_etcd_does() {
    for kind in [Kind::Etcd, Kind::Keel] {
        let first = Server::start(kind, &[]);
        for (taken, client_port, peer_port) in [
            ("client", first.client_port, crate::common::free_port()),
            ("peer", crate::common::free_port(), first.peer_port),
        ] {
            let mut second = Server::launch_on(kind, client_port, peer_port);
            let Some(status) = second.wait_exit(Duration::from_secs(20)) else {
                panic!("{kind:?}: a second member on the taken {taken} port kept running");
            };
            let log = second.log_all();
            assert!(!status.success(), "{kind:?}, {taken} port: {status}");
            assert!(
                log.to_lowercase().contains("address already in use"),
                "{kind:?}, {taken} port: {log}"
            );
        }
        // The first one was not disturbed: it alone answers on its client port.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                let mut c = client(&first).await;
                c.put("still-here", "yes", None).await.expect("a put");
                let r = c.get("still-here", None).await.expect("a get");
                assert_eq!(r.kvs()[0].value(), b"yes", "{kind:?}");
            });
    }
}

/// Raw TCP to `port` that sends the HTTP/2 preface; returns how long until the server closed
/// it, or `None` when it answered with SETTINGS instead (the connection was served).
fn time_to_close(port: u16) -> Option<Duration> {
    let started = Instant::now();
    match RawH2::connect(port) {
        Some(_) => None,
        None => Some(started.elapsed()),
    }
}

/// Connects and does one Range round trip; `None` when the server closed the connection.
fn served_connection(port: u16) -> Option<RawH2> {
    let mut h2 = RawH2::connect(port)?;
    h2.range(1, "k");
    assert_range_answer(h2.stream_end(1), "a served connection");
    Some(h2)
}

const REFUSAL_LOG: &str = "refusing client connections";

#[test]
fn connections_beyond_the_shard_limit_are_closed_at_once() {
    const LIMIT: usize = 2;
    let keel = Server::keel(&["--shards", "1", "--max-connections-per-shard", "2"]);
    let port = keel.client_port;
    // The harness's readiness probes may still hold their slots for a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut held = Vec::new();
    while held.len() < LIMIT {
        match served_connection(port) {
            Some(h2) => held.push(h2),
            None => {
                assert!(Instant::now() < deadline, "slots never freed up");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    // Full: new connections are closed at once, far sooner than the 10 s preface timeout.
    let started = Instant::now();
    for attempt in 0..5 {
        let closed_after = time_to_close(port)
            .unwrap_or_else(|| panic!("connection {attempt} beyond the limit was served"));
        assert!(
            closed_after < Duration::from_secs(2),
            "closed after {closed_after:?}"
        );
    }
    let refusing_for = started.elapsed();
    // The held connections still serve.
    for (i, h2) in held.iter_mut().enumerate() {
        h2.range(3, "k");
        assert_range_answer(h2.stream_end(3), &format!("held connection {i}"));
    }
    // One log line per second at most, however many refusals.
    let log = keel.log_text();
    let lines = log.lines().filter(|l| l.contains(REFUSAL_LOG)).count();
    let max_lines = 1 + refusing_for.as_secs() as usize;
    assert!(
        (1..=max_lines).contains(&lines),
        "{lines} refusal log lines in {refusing_for:?}:\n{log}"
    );
    assert!(log.contains("\"max_connections_per_shard\":2"), "{log}");
    // A closed connection gives its slot back.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    while served_connection(port).is_none() {
        assert!(
            Instant::now() < deadline,
            "the freed slot was not given back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The next response on a watch stream, within a bound.
async fn next(stream: &mut etcd_client::WatchStream) -> etcd_client::WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a watch response in time")
        .expect("the watch stream works")
        .expect("the watch stream stays open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_creates_beyond_the_stream_limit_are_canceled_with_a_reason() {
    let keel = tokio::task::spawn_blocking(|| Server::keel(&["--max-watchers-per-stream", "3"]))
        .await
        .expect("keel starts");
    let mut c = client(&keel).await;
    let mut stream = c.watch("w/0", None).await.expect("a watch stream opens");
    let created = next(&mut stream).await;
    assert!(created.created() && !created.canceled(), "{created:?}");
    for i in 1..3 {
        stream
            .watch(format!("w/{i}"), None)
            .await
            .expect("a create is sent");
        let created = next(&mut stream).await;
        assert!(created.created() && !created.canceled(), "{created:?}");
        assert_eq!(created.watch_id(), i);
    }
    // The fourth: created and canceled at once, with the reason, as etcd answers a create it
    // refuses (an empty range, a duplicate id).
    stream
        .watch("w/3", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("a create is sent");
    let refused = next(&mut stream).await;
    assert!(refused.created() && refused.canceled(), "{refused:?}");
    assert_eq!(refused.watch_id(), -1);
    assert_eq!(
        refused.cancel_reason(),
        "etcdserver: too many watchers on this watch stream"
    );
    // The three watchers still see events.
    c.put("w/1", "v", None).await.expect("put");
    let event = next(&mut stream).await;
    assert_eq!(event.watch_id(), 1, "{event:?}");
    assert_eq!(event.events()[0].kv().expect("a kv").key(), b"w/1");
    // A cancel frees a place, and the next create gets the next id.
    stream.cancel(0).await.expect("a cancel is sent");
    let canceled = next(&mut stream).await;
    assert!(
        canceled.canceled() && canceled.watch_id() == 0,
        "{canceled:?}"
    );
    stream.watch("w/4", None).await.expect("a create is sent");
    let created = next(&mut stream).await;
    assert!(created.created() && !created.canceled(), "{created:?}");
    assert_eq!(created.watch_id(), 3);
    // The limit is per stream: another stream on the same client starts from zero.
    let mut other = c.watch("o/0", None).await.expect("a second stream");
    let created = next(&mut other).await;
    assert!(created.created() && !created.canceled(), "{created:?}");
}

#[test]
fn silent_connections_are_closed_after_the_preface_timeout() {
    const TIMEOUT: Duration = Duration::from_millis(300);
    const SLACK: Duration = Duration::from_secs(2);
    let keel = Server::keel(&["--preface-timeout-ms", "300"]);
    let port = keel.client_port;
    let silent_for = |first_bytes: &[u8]| {
        crate::common::closed_silently_after(port, first_bytes, TIMEOUT + SLACK)
    };
    // Nothing at all, and most of the preface: neither is a protocol the server can serve yet.
    for first_bytes in [&b""[..], &PREFACE[..10], &PREFACE[..PREFACE.len() - 2]] {
        let elapsed = silent_for(first_bytes);
        assert!(
            elapsed >= TIMEOUT && elapsed < TIMEOUT + SLACK,
            "{first_bytes:?}: closed after {elapsed:?}"
        );
    }
    // A connection that did send its preface outlives the timeout, and carries Keel's default
    // stream limit.
    let mut h2 = RawH2::connect(port).expect("a connection with a preface is served");
    assert_eq!(
        h2.setting(SETTINGS_MAX_CONCURRENT_STREAMS),
        Some(keel_grpc::DEFAULT_MAX_CONCURRENT_STREAMS)
    );
    std::thread::sleep(TIMEOUT * 2);
    h2.range(1, "k");
    assert_range_answer(h2.stream_end(1), "after the preface timeout");
}
