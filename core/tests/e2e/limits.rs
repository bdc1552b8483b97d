//! Limits and faults at the edge of a member, against the real binary: taking over a port that
//! etcd just left.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{client, Kind, Server};

/// How long a raw read may wait before the test calls the server stuck.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

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
