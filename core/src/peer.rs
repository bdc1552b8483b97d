//! The peer transport: persistent TCP connections between members carrying framed, batched raft
//! messages. It runs on the raft core's executor.
//!
//! Each peer has one outgoing connection, driven by its own task: it connects with backoff,
//! introduces itself (cluster id, sender, recipient, and its own peer URLs, from which a member
//! that does not know it yet learns where to answer, as etcd's `X-PeerURLs` header does; a
//! build from before handshake version 2 refuses such a handshake, and its own are still
//! read), then writes whatever the raft core queued,
//! many frames per write. The queue is bounded in messages and bytes; when it is full, or the
//! peer is down, messages are dropped, and raft's retries and probes recover. A member therefore
//! never waits for a slow or dead peer. Incoming connections are read into a bounded inbox the
//! raft loop drains.
//!
//! Frame: u32 big-endian length, then the payload (a handshake, then one `keel_raft::Message`
//! in its own binary encoding per frame). A snapshot travels on a connection of its own, in
//! chunks of bounded size, with the segment files its checkpoint points into
//! (`peer_snapshot.rs`), so no frame is larger than a raft append message. Parsing a handshake
//! and a frame are pure functions ([`parse_hello`], [`parse_frame`]), fuzzed by `core/tests/fuzz`.
//!
//! A connection carries frames one way, from the dialer, with two exceptions: the receiver of
//! a snapshot stream answers it with one ack frame (`peer_snapshot.rs`), and a member that
//! applied another's removal answers a connection from the removed member (at its handshake,
//! at its next frame, or within `REMOVED_CHECK_INTERVAL` of applying the removal, so a removed
//! member that sends nothing hears it too) with one `FRAME_MEMBER_REMOVED` frame back to the
//! dialer, then closes it, as etcd answers 410 Gone; the dialer's member then stops (etcd's `errMemberRemoved`).
//! A build from before this frame never reads from a connection it dialed: it sees the
//! connection close and redials with backoff, lingering as before, and each refused dial is
//! logged on the refusing member.
//!
//! Deadlines (etcd's): a write blocked for [`PEER_CONN_TIMEOUT`] ends the connection; a dialer
//! with nothing to send writes a link heartbeat every third of it, and a receiver closes a
//! version-2 dialer's connection that stays silent that long after its first frame.
//!
//! TLS (`https://` peer URLs): an https listener runs the server side of a handshake (bounded
//! by [`PEER_HANDSHAKE_TIMEOUT`]) before reading the hello; a sender dialing an https URL runs
//! the client side, presenting this member's peer certificate, and verifies the peer's (see
//! `tls.rs`). An https listener never reads a plaintext byte as a frame, and an http URL is
//! dialed in plaintext, as etcd does.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::poll_fn;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
use keel_raft::{Message, MessageType, SnapshotSent, SnapshotStatus};

use crate::config::{url_scheme_host_port, Scheme};
use crate::peer_snapshot::{self, ChunkHeader, IncomingSnapshot, StagedSnapshot};
use crate::rt::{self, TcpStream};
use crate::stats::{PeerStats, PeerTable, RaftStats};
use crate::tls::{Acceptor, Connector};

/// Messages queued for one peer before new ones are dropped.
pub const PEER_QUEUE_MSGS_MAX: usize = 16 * 1024;
/// Bytes queued for one peer before new messages are dropped.
pub const PEER_QUEUE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Snapshots received and waiting for raft to install them (or pass them over): older ones
/// are deleted past this.
const STAGED_SNAPSHOTS_MAX: usize = 4;
/// Messages received but not yet stepped.
pub const INBOX_MSGS_MAX: usize = 64 * 1024;
/// Bytes written per syscall batch.
const WRITE_BATCH_BYTES: usize = 1024 * 1024;
/// Bytes an accepted peer connection reads ahead per syscall. Frames are small (a forwarded
/// proposal, an append's answer, a heartbeat) and come batched up to `WRITE_BATCH_BYTES`;
/// read unbuffered, each took two `recvfrom`s (its length, then its body). A frame larger than
/// this is read into its own buffer directly.
const READ_AHEAD_BYTES: usize = 64 * 1024;
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// How long a TLS handshake on the peer port may take, either side, before the connection is
/// dropped (a peer that connects and stays silent must not hold a task forever).
pub const PEER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
const HANDSHAKE_MAGIC: &[u8; 8] = b"KEELPEER";
/// Version 2 added the dialer's peer URLs to the handshake; a version-1 handshake (the fixed
/// part alone) is still read, so a member of an older build is heard.
const PROTOCOL_VERSION: u32 = 2;
const PROTOCOL_VERSION_NO_URLS: u32 = 1;
/// The handshake's fixed part: magic, version, cluster id, sender, recipient.
const HANDSHAKE_FIXED_BYTES: usize = 8 + 4 + 8 + 8 + 8;
/// The most bytes of peer URLs a handshake carries (a URL count u16, then each URL as a u16
/// length and its bytes). A member lists a few URLs; the URLs past the bound are left out.
const HANDSHAKE_URLS_BYTES_MAX: usize = 4096;
/// The largest handshake read.
pub const HANDSHAKE_BYTES_MAX: usize = HANDSHAKE_FIXED_BYTES + HANDSHAKE_URLS_BYTES_MAX;
/// How many members this one learns of from their handshakes alone (see
/// `Transport::learn_remote`): a cluster has a handful, and the bound keeps dialers that pass
/// the cluster check from growing the table without end.
const DIALED_REMOTES_MAX: usize = 64;
/// Frame kinds: the first byte of every frame after the handshake.
const FRAME_RAFT: u8 = 0;
const FRAME_KEEPALIVE: u8 = 1;
const FRAME_KEEPALIVE_REPLY: u8 = 2;
const FRAME_HASHKV: u8 = 3;
const FRAME_HASHKV_REPLY: u8 = 4;
const FRAME_PROPOSAL_REFUSED: u8 = 5;
/// The answer to [`MEMBERS_QUERY`]: cluster id u64, member count u32, then per member its id
/// u64, its peer URL count u16, and each URL as a u16 length and its bytes.
const FRAME_MEMBERS_REPLY: u8 = 6;
/// The largest members reply read: a cluster has a handful of members, and the bound keeps a
/// hostile answer from making a joining member allocate.
pub const MEMBERS_REPLY_BYTES_MAX: usize = 1 << 20;
/// A joining member's question "which member am I, in which cluster": a handshake from member
/// 0 to member 0, which no member has. The answer is one members-reply frame (every member's id
/// and peer URLs, as etcd's peers answer `GET /members`), then the connection closes. A member
/// running an older build refuses the handshake ("meant for another member") and closes.
pub const MEMBERS_QUERY: Hello = Hello {
    cluster_id: 0,
    from: 0,
    to: 0,
    peer_urls: Vec::new(),
};
/// Sent back to the dialer of a connection, with an empty body: "you were removed from the
/// cluster" (etcd's 410 Gone on its peer handlers).
const FRAME_MEMBER_REMOVED: u8 = 7;
/// An empty frame a dialer writes when it has had nothing to send for
/// [`LINK_HEARTBEAT_INTERVAL`], so the receiver's read deadline tells a quiet connection from
/// a dead one (etcd's `linkHeartbeatMessage`). Sent only after a version-2 handshake.
const FRAME_LINK_HEARTBEAT: u8 = 8;
/// How long a peer connection may go without a frame arriving, or a write completing,
/// before it is closed (etcd's `ConnReadTimeout` and `ConnWriteTimeout`). A partition that
/// drops packets but leaves the connection open then ends it: the sender drops its queue and
/// raft hears the peer is unreachable, and what the sender's kernel still held is not
/// delivered in one burst when the partition heals.
pub const PEER_CONN_TIMEOUT: Duration = Duration::from_millis(PEER_CONN_TIMEOUT_MS);
/// How often a dialer with nothing to send writes a link heartbeat: three to a deadline.
const LINK_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(PEER_CONN_TIMEOUT_MS / 3);
const PEER_CONN_TIMEOUT_MS: u64 = 5_000;
/// The largest frame a dialer reads back from the member it dialed (only the removed notice
/// travels that way; larger ones are refused as damage).
const ANSWER_FRAME_BYTES_MAX: usize = 64;
/// How long a member that told a removed peer so keeps reading (and discarding) what that peer
/// had already sent, before closing: closing with unread bytes resets the connection, and a
/// reset may discard the notice before the peer reads it.
const REMOVED_NOTICE_LINGER: Duration = Duration::from_secs(2);
/// How often an incoming connection checks whether its sender was removed meanwhile, while the
/// sender is silent (a removed learner sends nothing of its own accord).
const REMOVED_CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Proposal-refused body: refusal code u8, proposal kind u8, proposal id u64.
const PROPOSAL_REFUSED_BYTES: usize = 1 + 1 + 8;
/// HashKV request body: request id u64, revision i64.
const HASHKV_REQUEST_BYTES: usize = 16;
/// HashKV reply body: request id u64, outcome u8, hash u32, compact revision i64, the peer's
/// current revision i64.
const HASHKV_REPLY_BYTES: usize = 8 + 1 + 4 + 8 + 8;
/// HashKV requests of the corruption check waiting for a peer's answer.
const HASHKV_WAITING_MAX: usize = 1024;

/// Peer requests that are not raft messages: lease keep-alives a follower forwards to the
/// leader, whose clock owns lease expiry.
#[derive(Debug, Clone, Copy)]
pub enum Control {
    KeepAlive {
        from: u64,
        request_id: u64,
        lease: i64,
    },
    KeepAliveReply {
        request_id: u64,
        ttl: i64,
    },
    /// The leader refused a proposal this member forwarded (codes: `member::Refusal` and
    /// `member::ProposalKind`).
    ProposalRefused {
        refusal_code: u8,
        kind_code: u8,
        id: u64,
    },
    /// A peer's corruption check asks for this member's HashKV at `revision`.
    HashKv {
        from: u64,
        request_id: u64,
        revision: i64,
    },
}

/// A peer's answer to a HashKV request (etcd's `/members/hashkv` on the peer port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerHash {
    Hashed {
        hash: u32,
        compact_revision: i64,
        /// The peer's current revision when it answered.
        revision: i64,
    },
    /// The peer has not applied the revision yet.
    FutureRevision,
    /// The peer compacted past the revision.
    Compacted,
    /// The peer could not answer (or did not in time).
    Unavailable,
}

impl PeerHash {
    fn encode(self, request_id: u64) -> Vec<u8> {
        let (outcome, hash, compact_revision, revision) = match self {
            PeerHash::Hashed {
                hash,
                compact_revision,
                revision,
            } => (0u8, hash, compact_revision, revision),
            PeerHash::FutureRevision => (1, 0, 0, 0),
            PeerHash::Compacted => (2, 0, 0, 0),
            PeerHash::Unavailable => (3, 0, 0, 0),
        };
        let mut body = Vec::with_capacity(HASHKV_REPLY_BYTES);
        body.extend_from_slice(&request_id.to_be_bytes());
        body.push(outcome);
        body.extend_from_slice(&hash.to_be_bytes());
        body.extend_from_slice(&compact_revision.to_be_bytes());
        body.extend_from_slice(&revision.to_be_bytes());
        body
    }

    fn decode(body: &[u8]) -> Option<(u64, PeerHash)> {
        if body.len() != HASHKV_REPLY_BYTES {
            return None;
        }
        let request_id = u64::from_be_bytes(body[..8].try_into().ok()?);
        let hash = u32::from_be_bytes(body[9..13].try_into().ok()?);
        let compact_revision = i64::from_be_bytes(body[13..21].try_into().ok()?);
        let revision = i64::from_be_bytes(body[21..29].try_into().ok()?);
        let reply = match body[8] {
            0 => PeerHash::Hashed {
                hash,
                compact_revision,
                revision,
            },
            1 => PeerHash::FutureRevision,
            2 => PeerHash::Compacted,
            _ => PeerHash::Unavailable,
        };
        Some((request_id, reply))
    }
}

/// A local wake-up flag for a task on this executor.
#[derive(Default)]
struct Signal {
    woken: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Signal {
    fn wake(&self) {
        self.woken.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }
    async fn wait(&self) {
        poll_fn(|cx| {
            if self.woken.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

struct Peer {
    id: u64,
    addrs: RefCell<Vec<String>>,
    queue: RefCell<VecDeque<(Bytes, Option<SnapshotSent>)>>,
    queue_bytes: Cell<usize>,
    /// This peer's traffic counters (shared with /metrics).
    stats: Arc<PeerStats>,
    signal: Signal,
    removed: Cell<bool>,
    /// Snapshot streams to this peer that failed in a row once connected (see
    /// `snapshot_retry_delay`); a dial that fails starts the count again.
    snapshot_failures: Cell<u32>,
}

/// Why a snapshot stream ended without the receiver's ack.
enum StreamFailure {
    /// No connection: nothing was sent.
    NotDialed,
    /// Connected, then the stream broke or the receiver refused it.
    Broken(std::io::Error),
}

/// How long a failed snapshot stream holds back its failure report, once `failures_in_a_row`
/// (at least 1) streams to the same peer failed after connecting: 1 s, doubling up to 32 s.
/// Raft sends a failed snapshot again at its next heartbeat round, and a follower that cannot
/// store it (a full disk) refuses it only once it has filled the disk again: without a pause
/// the leader would read and send the whole checkpoint and its segments (gigabytes) over and
/// over, beside its clients' work, until an operator frees space.
fn snapshot_retry_delay(failures_in_a_row: u32) -> Duration {
    assert!(failures_in_a_row >= 1, "a pause follows a failure");
    SNAPSHOT_RETRY_DELAY_MIN
        .saturating_mul(1 << (failures_in_a_row - 1).min(16))
        .min(SNAPSHOT_RETRY_DELAY_MAX)
}
const SNAPSHOT_RETRY_DELAY_MIN: Duration = Duration::from_secs(1);
const SNAPSHOT_RETRY_DELAY_MAX: Duration = Duration::from_secs(32);

/// What the peer tasks report back to the raft loop.
#[derive(Default)]
struct Reports {
    unreachable: Vec<u64>,
    snapshots: Vec<(SnapshotSent, SnapshotStatus)>,
}

/// Peer TLS on the raft core: the acceptor for https listeners, and the connector for https
/// peer URLs (None when no CA is given to verify peers with and auto TLS is off: such a member
/// may listen on https but cannot dial it).
pub struct PeerTls {
    pub acceptor: Acceptor,
    pub connector: Option<Connector>,
}

/// A handshake, as [`parse_hello`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub cluster_id: u64,
    pub from: u64,
    pub to: u64,
    /// The dialer's advertised peer URLs (etcd's `X-PeerURLs` header): how a member that does
    /// not know the dialer yet answers it (see `Transport::learn_remote`). Empty from a
    /// version-1 dialer and in the members query.
    pub peer_urls: Vec<String>,
}

/// One frame after the handshake, as [`parse_frame`] reads it.
#[derive(Debug)]
pub enum Incoming {
    Raft(Message),
    Control(Control),
    HashKvReply {
        request_id: u64,
        reply: PeerHash,
    },
    /// The member this connection was dialed to says the dialer was removed from the cluster.
    MemberRemoved,
    /// A snapshot stream starts on this connection (`peer_snapshot.rs`).
    SnapshotBegin {
        index: u64,
        checkpoint_bytes: u64,
    },
    /// The dialer had nothing to send for a while ([`LINK_HEARTBEAT_INTERVAL`]).
    LinkHeartbeat,
    /// A piece of the snapshot being streamed: its bytes are the frame's from
    /// [`SNAPSHOT_CHUNK_BODY_AT`] on.
    SnapshotChunk(ChunkHeader),
    /// The receiver of a snapshot stream took the snapshot at this index (sent back to the
    /// dialer only).
    SnapshotAck {
        index: u64,
    },
}

/// Where a snapshot chunk's bytes start in its frame (after the kind byte and the header).
pub const SNAPSHOT_CHUNK_BODY_AT: usize = 1 + peer_snapshot::CHUNK_HEADER_BYTES;

/// A frame's length from its 4-byte prefix, refused above `max_bytes`.
pub fn frame_len(prefix: [u8; 4], max_bytes: usize) -> std::io::Result<usize> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max_bytes {
        return Err(std::io::Error::other(format!(
            "peer frame of {len} bytes exceeds {max_bytes}"
        )));
    }
    Ok(len)
}

/// Encodes this member's handshake as a whole frame (length prefix included). URLs that do
/// not fit in [`HANDSHAKE_URLS_BYTES_MAX`] are left out: the peer then learns this member's
/// address from the membership alone, as before handshakes carried it. A handshake without
/// URLs (the members query) is written as version 1, which older builds read too.
pub fn encode_hello(hello: &Hello) -> Vec<u8> {
    let version = if hello.peer_urls.is_empty() {
        PROTOCOL_VERSION_NO_URLS
    } else {
        PROTOCOL_VERSION
    };
    let mut buf = Vec::with_capacity(4 + HANDSHAKE_FIXED_BYTES + 2);
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(HANDSHAKE_MAGIC);
    buf.extend_from_slice(&version.to_be_bytes());
    buf.extend_from_slice(&hello.cluster_id.to_be_bytes());
    buf.extend_from_slice(&hello.from.to_be_bytes());
    buf.extend_from_slice(&hello.to.to_be_bytes());
    if version == PROTOCOL_VERSION_NO_URLS {
        buf[..4].copy_from_slice(&(HANDSHAKE_FIXED_BYTES as u32).to_be_bytes());
        return buf;
    }
    let mut urls_bytes = 2;
    let fitting: Vec<&String> = hello
        .peer_urls
        .iter()
        .take_while(|url| {
            urls_bytes += 2 + url.len();
            urls_bytes <= HANDSHAKE_URLS_BYTES_MAX
        })
        .collect();
    buf.extend_from_slice(&(fitting.len() as u16).to_be_bytes());
    for url in fitting {
        buf.extend_from_slice(&(url.len() as u16).to_be_bytes());
        buf.extend_from_slice(url.as_bytes());
    }
    let payload_bytes = buf.len() - 4;
    assert!(payload_bytes <= HANDSHAKE_BYTES_MAX);
    buf[..4].copy_from_slice(&(payload_bytes as u32).to_be_bytes());
    buf
}

/// The frame a member writes back to a removed member that dialed it (length prefix included).
pub fn encode_member_removed() -> Vec<u8> {
    let mut buf = Vec::with_capacity(5);
    buf.extend_from_slice(&1u32.to_be_bytes());
    buf.push(FRAME_MEMBER_REMOVED);
    buf
}

/// Reads a handshake frame's payload (without its length prefix): version 2 (with the
/// dialer's peer URLs) or version 1 (without).
pub fn parse_hello(frame: &[u8]) -> std::io::Result<Hello> {
    if frame.len() < HANDSHAKE_FIXED_BYTES || &frame[..8] != HANDSHAKE_MAGIC {
        return Err(std::io::Error::other("not a keel peer"));
    }
    let u64_at = |o: usize| u64::from_be_bytes(frame[o..o + 8].try_into().expect("8 bytes"));
    let version = u32::from_be_bytes(frame[8..12].try_into().expect("4 bytes"));
    let mut hello = Hello {
        cluster_id: u64_at(12),
        from: u64_at(20),
        to: u64_at(28),
        peer_urls: Vec::new(),
    };
    let urls = &frame[HANDSHAKE_FIXED_BYTES..];
    match version {
        PROTOCOL_VERSION_NO_URLS if urls.is_empty() => Ok(hello),
        PROTOCOL_VERSION => {
            hello.peer_urls = parse_hello_urls(urls)
                .ok_or_else(|| std::io::Error::other("damaged peer URLs in a handshake"))?;
            Ok(hello)
        }
        PROTOCOL_VERSION_NO_URLS => Err(std::io::Error::other("not a keel peer")),
        _ => Err(std::io::Error::other(format!(
            "peer protocol version {version} is not ours"
        ))),
    }
}

/// A handshake's URL list: a u16 count, then each URL as a u16 length and UTF-8 bytes, and
/// nothing after.
fn parse_hello_urls(bytes: &[u8]) -> Option<Vec<String>> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let whole: &'a [u8] = rest;
        let (head, tail) = (whole.get(..n)?, whole.get(n..)?);
        *rest = tail;
        Some(head)
    }
    let u16_of = |b: &[u8]| u16::from_be_bytes(b.try_into().expect("2 bytes"));
    let mut rest = bytes;
    let count = u16_of(take(&mut rest, 2)?);
    let mut urls = Vec::with_capacity(usize::from(count).min(HANDSHAKE_URLS_BYTES_MAX / 2));
    for _ in 0..count {
        let len = u16_of(take(&mut rest, 2)?);
        let url = std::str::from_utf8(take(&mut rest, usize::from(len))?).ok()?;
        urls.push(url.to_owned());
    }
    rest.is_empty().then_some(urls)
}

/// Reads one frame's payload (without its length prefix) from the peer `from` named in the
/// connection's handshake. An error ends the connection.
pub fn parse_frame(frame: &[u8], from: u64) -> std::io::Result<Incoming> {
    parse_frame_in(frame, None, from)
}

/// `parse_frame` of a frame in a shared buffer: a raft message's entries (and its other
/// payloads) are slices of `frame`, not copies (`Message::decode_shared`). Where a follower
/// takes appends, that saved an allocation and a copy of every entry.
pub fn parse_shared_frame(frame: &Bytes, from: u64) -> std::io::Result<Incoming> {
    parse_frame_in(frame, Some(frame), from)
}

fn parse_frame_in(frame: &[u8], shared: Option<&Bytes>, from: u64) -> std::io::Result<Incoming> {
    let Some((&kind, body)) = frame.split_first() else {
        return Err(std::io::Error::other("empty peer frame"));
    };
    let u64_at = |o: usize| u64::from_be_bytes(body[o..o + 8].try_into().expect("8 bytes"));
    let i64_at = |o: usize| i64::from_be_bytes(body[o..o + 8].try_into().expect("8 bytes"));
    let incoming = match kind {
        FRAME_RAFT => {
            let m = match shared {
                Some(frame) => Message::decode_shared(&frame.slice(1..)),
                None => Message::decode(body),
            }
            .map_err(|e| std::io::Error::other(e.to_string()))?;
            if m.from != from {
                return Err(std::io::Error::other(
                    "message sender does not match the connection",
                ));
            }
            Incoming::Raft(m)
        }
        FRAME_KEEPALIVE if body.len() == 16 => Incoming::Control(Control::KeepAlive {
            from,
            request_id: u64_at(0),
            lease: i64_at(8),
        }),
        FRAME_KEEPALIVE_REPLY if body.len() == 16 => Incoming::Control(Control::KeepAliveReply {
            request_id: u64_at(0),
            ttl: i64_at(8),
        }),
        FRAME_HASHKV if body.len() == HASHKV_REQUEST_BYTES => Incoming::Control(Control::HashKv {
            from,
            request_id: u64_at(0),
            revision: i64_at(8),
        }),
        FRAME_PROPOSAL_REFUSED if body.len() == PROPOSAL_REFUSED_BYTES => {
            Incoming::Control(Control::ProposalRefused {
                refusal_code: body[0],
                kind_code: body[1],
                id: u64_at(2),
            })
        }
        FRAME_MEMBER_REMOVED if body.is_empty() => Incoming::MemberRemoved,
        FRAME_LINK_HEARTBEAT if body.is_empty() => Incoming::LinkHeartbeat,
        peer_snapshot::FRAME_SNAPSHOT_BEGIN => {
            let (index, checkpoint_bytes) = peer_snapshot::parse_begin(body)?;
            Incoming::SnapshotBegin {
                index,
                checkpoint_bytes,
            }
        }
        peer_snapshot::FRAME_SNAPSHOT_CHUNK => {
            Incoming::SnapshotChunk(peer_snapshot::parse_chunk_header(body)?)
        }
        peer_snapshot::FRAME_SNAPSHOT_ACK => Incoming::SnapshotAck {
            index: peer_snapshot::parse_ack(body)?,
        },
        FRAME_HASHKV_REPLY => {
            let (request_id, reply) = PeerHash::decode(body)
                .ok_or_else(|| std::io::Error::other("malformed HashKV reply"))?;
            Incoming::HashKvReply { request_id, reply }
        }
        _ => {
            return Err(std::io::Error::other(format!(
                "unknown peer frame kind {kind} of {} bytes",
                body.len()
            )))
        }
    };
    Ok(incoming)
}

/// A members reply: the cluster id, and every member's id and peer URLs.
pub type MembersReply = (u64, Vec<(u64, Vec<String>)>);

/// Encodes a members reply as a whole frame (length prefix included).
pub fn encode_members_reply(cluster_id: u64, members: &[(u64, Vec<String>)]) -> Vec<u8> {
    let mut buf = vec![0; 4];
    buf.push(FRAME_MEMBERS_REPLY);
    buf.extend_from_slice(&cluster_id.to_be_bytes());
    buf.extend_from_slice(&(members.len() as u32).to_be_bytes());
    for (id, urls) in members {
        buf.extend_from_slice(&id.to_be_bytes());
        buf.extend_from_slice(&(urls.len() as u16).to_be_bytes());
        for url in urls {
            // Peer URLs are checked at startup and by MemberAdd; none is near 64 KiB.
            let bytes = &url.as_bytes()[..url.len().min(u16::MAX as usize)];
            buf.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
            buf.extend_from_slice(bytes);
        }
    }
    let len = (buf.len() - 4) as u32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    buf
}

/// Reads a members reply's payload (without its length prefix): the cluster id and every
/// member's id and peer URLs.
pub fn parse_members_reply(frame: &[u8]) -> std::io::Result<MembersReply> {
    let bad = || std::io::Error::other("malformed members reply");
    let mut rest = match frame.split_first() {
        Some((&FRAME_MEMBERS_REPLY, body)) => body,
        _ => return Err(bad()),
    };
    let mut take = |n: usize| -> std::io::Result<&[u8]> {
        if rest.len() < n {
            return Err(bad());
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let cluster_id = u64::from_be_bytes(take(8)?.try_into().expect("8 bytes"));
    let count = u32::from_be_bytes(take(4)?.try_into().expect("4 bytes"));
    let mut members = Vec::new();
    for _ in 0..count {
        let id = u64::from_be_bytes(take(8)?.try_into().expect("8 bytes"));
        let url_count = u16::from_be_bytes(take(2)?.try_into().expect("2 bytes"));
        let mut urls = Vec::new();
        for _ in 0..url_count {
            let len = u16::from_be_bytes(take(2)?.try_into().expect("2 bytes")) as usize;
            let url = std::str::from_utf8(take(len)?).map_err(|_| bad())?;
            urls.push(url.to_string());
        }
        members.push((id, urls));
    }
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok((cluster_id, members))
}

/// A connection a sender dialed: plaintext for http peer URLs, TLS for https ones.
enum Dialed {
    Plain(TcpStream),
    Tls(Box<futures_rustls::client::TlsStream<TcpStream>>),
}

pub struct Transport {
    me: u64,
    tls: Option<PeerTls>,
    /// 0 until a joining member hears the cluster's id from a peer.
    cluster_id: Cell<u64>,
    learned_cluster_id: Cell<Option<u64>>,
    peers: RefCell<HashMap<u64, Rc<Peer>>>,
    /// Every member's id and peer URLs as last given to `set_peers` (this member included):
    /// what a joining member's [`MEMBERS_QUERY`] is answered with.
    members: RefCell<Vec<(u64, Vec<String>)>>,
    /// This member's own peer URLs, sent in every handshake: the advertised ones it started
    /// with, then its applied membership's.
    own_peer_urls: RefCell<Vec<String>>,
    /// Members that dialed this one and that neither its applied membership nor its remotes
    /// list, with the peer URLs their handshakes gave (see `learn_remote`), until the
    /// membership lists them or they are removed.
    dialed_remotes: RefCell<BTreeMap<u64, Vec<String>>>,
    inbox: RefCell<VecDeque<Message>>,
    control: RefCell<VecDeque<Control>>,
    inbox_signal: Signal,
    reports: RefCell<Reports>,
    /// The largest frame sent or accepted (`Limits::peer_frame_bytes_max`).
    frame_bytes_max: usize,
    /// Where incoming snapshots are staged (`<data-dir>/snap/incoming`).
    staging_dir: std::path::PathBuf,
    /// Incoming snapshot streams so far: each stages into a directory of its own.
    snapshot_streams: Cell<u64>,
    /// Snapshots received whole, until the raft core takes the one raft installs.
    staged: RefCell<VecDeque<StagedSnapshot>>,
    /// HashKV requests this member sent, by request id, waiting for the peer's answer.
    hash_waiting: RefCell<HashMap<u64, futures_channel::oneshot::Sender<PeerHash>>>,
    next_hash_request: Cell<u64>,
    /// Per-peer traffic for /metrics.
    peer_stats: Arc<PeerTable>,
    /// Heartbeat send failures for /metrics.
    raft_stats: Arc<RaftStats>,
    /// Ids of members removed from the cluster, as the member last published them: their
    /// connections are answered with `FRAME_MEMBER_REMOVED` and closed.
    removed: RefCell<BTreeSet<u64>>,
    /// The peer that told this member it was removed, until the raft loop takes it.
    told_removed_by: Cell<Option<u64>>,
    /// Set once a peer told this member it was removed: the senders stop dialing.
    told_removed: Cell<bool>,
    /// When the last heartbeat to each peer was queued, until its response arrives: the
    /// round trip etcd's `etcd_network_peer_round_trip_time_seconds` reports. etcd probes each
    /// peer on a side channel; Keel times the raft heartbeats the leader already sends, so the
    /// leader measures its followers (the time includes the follower's loop turnaround).
    heartbeat_sent_at: RefCell<HashMap<u64, Instant>>,
}

impl Transport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        me: u64,
        own_peer_urls: Vec<String>,
        cluster_id: u64,
        frame_bytes_max: usize,
        staging_dir: std::path::PathBuf,
        peer_stats: Arc<PeerTable>,
        raft_stats: Arc<RaftStats>,
        tls: Option<PeerTls>,
    ) -> Rc<Transport> {
        assert!(
            frame_bytes_max < u32::MAX as usize,
            "peer frames carry a u32 length"
        );
        Rc::new(Transport {
            me,
            tls,
            cluster_id: Cell::new(cluster_id),
            learned_cluster_id: Cell::new(None),
            peers: RefCell::new(HashMap::new()),
            members: RefCell::new(Vec::new()),
            own_peer_urls: RefCell::new(own_peer_urls),
            dialed_remotes: RefCell::new(BTreeMap::new()),
            inbox: RefCell::new(VecDeque::new()),
            control: RefCell::new(VecDeque::new()),
            inbox_signal: Signal::default(),
            reports: RefCell::new(Reports::default()),
            frame_bytes_max,
            staging_dir,
            snapshot_streams: Cell::new(0),
            staged: RefCell::new(VecDeque::new()),
            hash_waiting: RefCell::new(HashMap::new()),
            next_hash_request: Cell::new(1),
            peer_stats,
            raft_stats,
            removed: RefCell::new(BTreeSet::new()),
            told_removed_by: Cell::new(None),
            told_removed: Cell::new(false),
            heartbeat_sent_at: RefCell::new(HashMap::new()),
        })
    }

    /// Serves incoming peer connections on `addr`, forever, in TLS when `scheme` is https.
    /// The listener allows address reuse, so a member replacing another on the same peer URL
    /// starts while the old one's connections sit in TIME_WAIT.
    pub fn listen(self: &Rc<Self>, addr: SocketAddr, scheme: Scheme) -> std::io::Result<()> {
        assert!(
            scheme == Scheme::Http || self.tls.is_some(),
            "config refuses an https peer listener without peer TLS"
        );
        let listener = rt::bind_listener(addr)?;
        let this = self.clone();
        rt::spawn_local(async move {
            loop {
                match listener.accept().await {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        let this = this.clone();
                        rt::spawn_local(async move {
                            if let Err(e) = this.serve_peer(stream, scheme).await {
                                tracing::debug!(error = %e, "peer connection ended");
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(%addr, error = %e, "peer accept failed");
                        rt::sleep(BACKOFF_MIN).await;
                    }
                }
            }
        });
        Ok(())
    }

    /// Makes the set of peers match `members` (id and peer URLs) plus `remotes` (members
    /// this one knows of that `members` does not list, see `RaftCore::publish_members`) plus
    /// the members learned from their handshakes that neither lists, starting a sender task
    /// for each new one and stopping those no longer listed. Only `members` answers a joining
    /// member's query.
    pub fn set_peers(
        self: &Rc<Self>,
        members: &[(u64, Vec<String>)],
        remotes: &[(u64, Vec<String>)],
    ) {
        *self.members.borrow_mut() = members.to_vec();
        if let Some((_, urls)) = members.iter().find(|(id, _)| *id == self.me) {
            *self.own_peer_urls.borrow_mut() = urls.clone();
        }
        // A member the membership (or the remotes) lists is dialed at the URLs given there.
        let dialed: Vec<(u64, Vec<String>)> = {
            let mut dialed = self.dialed_remotes.borrow_mut();
            dialed.retain(|id, _| !members.iter().chain(remotes).any(|(known, _)| known == id));
            dialed
                .iter()
                .map(|(id, urls)| (*id, urls.clone()))
                .collect()
        };
        let listed = || members.iter().chain(remotes).chain(&dialed);
        let mut peers = self.peers.borrow_mut();
        for (id, urls) in listed() {
            if *id == self.me {
                continue;
            }
            match peers.get(id) {
                Some(p) => *p.addrs.borrow_mut() = urls.clone(),
                None => self.start_peer(&mut peers, *id, urls.clone()),
            }
        }
        peers.retain(|id, p| {
            let stay = listed().any(|(listed, _)| listed == id);
            if !stay {
                p.removed.set(true);
                p.signal.wake();
            }
            stay
        });
    }

    /// Adds `id` to `peers` and starts its sender task.
    fn start_peer(self: &Rc<Self>, peers: &mut HashMap<u64, Rc<Peer>>, id: u64, urls: Vec<String>) {
        let peer = Rc::new(Peer {
            id,
            addrs: RefCell::new(urls),
            queue: RefCell::new(VecDeque::new()),
            queue_bytes: Cell::new(0),
            stats: self.peer_stats.peer(id),
            signal: Signal::default(),
            removed: Cell::new(false),
            snapshot_failures: Cell::new(0),
        });
        peers.insert(id, peer.clone());
        let this = self.clone();
        rt::spawn_local(async move { this.send_loop(peer).await });
    }

    /// A member of this cluster dialed this one, which knows no address for it: it starts
    /// sending to the URLs the dialer's handshake gave, as etcd adds a remote from a
    /// connection's `X-PeerURLs`. A member restarted on a checkpoint taken before another
    /// joined hears that member lead, but its answers went nowhere until it applied the
    /// member's addition, which needs that leader to hear them: it stayed behind for good.
    fn learn_remote(self: &Rc<Self>, from: u64, urls: &[String]) {
        if urls.is_empty()
            || from == self.me
            || self.removed.borrow().contains(&from)
            || self.peers.borrow().contains_key(&from)
        {
            return;
        }
        let mut dialed = self.dialed_remotes.borrow_mut();
        if dialed.len() >= DIALED_REMOTES_MAX {
            tracing::warn!(
                remote_peer_id = format!("{from:x}"),
                "not adding a remote peer from its handshake: {DIALED_REMOTES_MAX} are known already"
            );
            return;
        }
        dialed.insert(from, urls.to_vec());
        tracing::info!(
            local_member_id = format!("{:x}", self.me),
            remote_peer_id = format!("{from:x}"),
            remote_peer_urls = ?urls,
            "added remote peer from its handshake"
        );
        self.start_peer(&mut self.peers.borrow_mut(), from, urls.to_vec());
    }

    /// The ids of members removed from the cluster (the member's `removed_members`).
    pub fn set_removed(&self, removed: &BTreeSet<u64>) {
        // It may hold this member's own id: the member applied its own removal and is
        // stopping. Nobody dials itself, so that id is never looked up.
        assert!(
            !removed.contains(&0),
            "member id 0 means none, never a member"
        );
        if *self.removed.borrow() != *removed {
            *self.removed.borrow_mut() = removed.clone();
        }
        // A removed member learned from its handshake is not dialed any more.
        let gone: Vec<u64> = {
            let mut dialed = self.dialed_remotes.borrow_mut();
            let gone = dialed
                .keys()
                .filter(|id| removed.contains(id))
                .copied()
                .collect();
            dialed.retain(|id, _| !removed.contains(id));
            gone
        };
        let mut peers = self.peers.borrow_mut();
        for id in gone {
            if let Some(p) = peers.remove(&id) {
                p.removed.set(true);
                p.signal.wake();
            }
        }
    }

    /// The peer that told this member it was removed from the cluster, once.
    pub fn told_removed(&self) -> Option<u64> {
        self.told_removed_by.take()
    }

    /// Streams a raft snapshot whose data is our checkpoint file (pointing into the segment
    /// files of `vlog_dir`) to its recipient on a connection of its own, and reports the
    /// outcome to raft when the stream ends (see `peer_snapshot.rs`). A delta checkpoint's
    /// base is read from `snap_dir`.
    pub fn send_snapshot(
        self: &Rc<Self>,
        m: Message,
        vlog_dir: std::path::PathBuf,
        snap_dir: std::path::PathBuf,
    ) {
        assert_eq!(
            m.msg_type,
            MessageType::Snapshot,
            "only snapshots are streamed"
        );
        let to = m.to;
        let sent = SnapshotSent::of(&m).expect("checked a snapshot above");
        let Some(peer) = self.peers.borrow().get(&to).cloned() else {
            tracing::debug!(to, "snapshot for an unknown peer dropped");
            self.snapshot_not_sent(Some(sent));
            return;
        };
        let this = self.clone();
        rt::spawn_local(async move {
            let (started, index) = (Instant::now(), sent.index);
            let ok = match this.stream_snapshot(&peer, m, &vlog_dir, &snap_dir).await {
                Ok(bytes) => {
                    peer.snapshot_failures.set(0);
                    tracing::info!(
                        to = format!("{to:x}"),
                        index,
                        bytes,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "sent a snapshot"
                    );
                    true
                }
                Err(StreamFailure::NotDialed) => {
                    // Down or unreachable: raft asks again while it is, a refused dial costs
                    // nothing, and the member that comes back is a new process, which owes no
                    // pause for the old one's failures.
                    peer.snapshot_failures.set(0);
                    tracing::warn!(
                        to = format!("{to:x}"),
                        index,
                        error = "cannot connect",
                        "cannot send a snapshot; raft sends it again later"
                    );
                    false
                }
                Err(StreamFailure::Broken(e)) => {
                    let failures = peer.snapshot_failures.get().saturating_add(1);
                    peer.snapshot_failures.set(failures);
                    let pause = snapshot_retry_delay(failures);
                    tracing::warn!(
                        to = format!("{to:x}"),
                        index,
                        error = %e,
                        failures_in_a_row = failures,
                        next_try_after_ms = pause.as_millis() as u64,
                        "cannot send a snapshot; raft sends it again later"
                    );
                    // Reported only after the pause: raft holds the peer in its snapshot state
                    // until then (heartbeats still go), then sends a fresh message from its
                    // newest checkpoint, whose files exist (this one's may be gone by then).
                    // No longer leading in this message's term by then, raft ignores the
                    // report (`SnapshotSent`).
                    rt::sleep(pause).await;
                    false
                }
            };
            this.report_snapshots(&[sent], ok);
        });
    }

    /// Dials `peer` for one snapshot and streams it; the caller reports the outcome to raft.
    async fn stream_snapshot(
        &self,
        peer: &Peer,
        mut m: Message,
        vlog_dir: &std::path::Path,
        snap_dir: &std::path::Path,
    ) -> Result<u64, StreamFailure> {
        let snap = m
            .snapshot
            .as_mut()
            .expect("a snapshot message has a snapshot");
        let (index, data) = (snap.metadata.index, std::mem::take(&mut snap.data));
        let dialed = self.connect(peer).await.ok_or(StreamFailure::NotDialed)?;
        match dialed {
            Dialed::Plain(s) => {
                self.stream_to(peer, s, &m, &data, index, (vlog_dir, snap_dir))
                    .await
            }
            Dialed::Tls(s) => {
                self.stream_to(peer, *s, &m, &data, index, (vlog_dir, snap_dir))
                    .await
            }
        }
        .map_err(StreamFailure::Broken)
    }

    /// The whole stream on a dialed connection: the snapshot, then its message, then the
    /// receiver's answer.
    async fn stream_to<S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin>(
        &self,
        peer: &Peer,
        mut stream: S,
        m: &Message,
        data: &Bytes,
        index: u64,
        (vlog_dir, snap_dir): (&std::path::Path, &std::path::Path),
    ) -> std::io::Result<u64> {
        let chunk_bytes = crate::limits::SNAPSHOT_CHUNK_BYTES;
        let sent = peer_snapshot::write_snapshot(
            &mut stream,
            data,
            index,
            (vlog_dir, snap_dir),
            chunk_bytes,
        )
        .await?;
        // Last, the message itself, its data left behind: the receiver fills in the file.
        let mut buf = vec![0; 4];
        buf.push(FRAME_RAFT);
        m.encode(&mut buf);
        let len = u32::try_from(buf.len() - 4).expect("a snapshot message without data is small");
        buf[..4].copy_from_slice(&len.to_be_bytes());
        stream.write_all(&buf).await?;
        stream.flush().await?;
        // Reported sent only once the receiver has the message in raft's inbox (see
        // `peer_snapshot.rs`).
        let answer = async { Some(read_frame(&mut stream, ANSWER_FRAME_BYTES_MAX).await) };
        let expired = async {
            rt::sleep(peer_snapshot::ACK_TIMEOUT).await;
            None
        };
        let answer = futures_lite::future::or(answer, expired)
            .await
            .ok_or_else(|| std::io::Error::other("the peer did not answer the snapshot"))??;
        match parse_frame(&answer, m.to)? {
            Incoming::SnapshotAck { index: acked } if acked == index => {}
            Incoming::MemberRemoved => {
                return Err(std::io::Error::other(crate::member::MEMBER_REMOVED))
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "the peer answered the snapshot with {other:?}"
                )))
            }
        }
        stream.close().await?;
        let sent = sent + buf.len() as u64;
        RaftStats::count(&peer.stats.sent_bytes, sent);
        Ok(sent)
    }

    /// The staged snapshot whose checkpoint file is `data` (the same buffer raft carried on
    /// from the message), taken for the raft core to place.
    pub fn take_staged(&self, data: &Bytes) -> Option<StagedSnapshot> {
        let mut staged = self.staged.borrow_mut();
        let at = staged
            .iter()
            .position(|s| s.data.as_ptr() == data.as_ptr() && s.data.len() == data.len())?;
        staged.remove(at)
    }

    /// Queues a message for its recipient; drops it when the peer is unknown or its queue is
    /// full (raft retries).
    pub fn send(&self, m: Message) {
        let snapshot_to = SnapshotSent::of(&m);
        let mut buf =
            Vec::with_capacity(64 + m.entries.iter().map(|e| e.data.len() + 32).sum::<usize>());
        buf.extend_from_slice(&[0; 4]);
        buf.push(FRAME_RAFT);
        m.encode(&mut buf);
        let queued = self.enqueue(m.to, buf, snapshot_to);
        if m.msg_type == MessageType::Heartbeat {
            if queued {
                self.heartbeat_sent_at
                    .borrow_mut()
                    .entry(m.to)
                    .or_insert_with(Instant::now);
            } else {
                RaftStats::count(&self.raft_stats.heartbeat_send_failures, 1);
            }
        }
    }

    /// Asks `to` (the leader) to renew a lease for a client of this member.
    pub fn send_keepalive(&self, to: u64, request_id: u64, lease: i64) {
        let mut buf = Vec::with_capacity(4 + 17);
        buf.extend_from_slice(&[0; 4]);
        buf.push(FRAME_KEEPALIVE);
        buf.extend_from_slice(&request_id.to_be_bytes());
        buf.extend_from_slice(&lease.to_be_bytes());
        self.enqueue(to, buf, None);
    }

    /// Answers a forwarded keep-alive with the lease's TTL (0: unknown, -1: not leader).
    pub fn send_keepalive_reply(&self, to: u64, request_id: u64, ttl: i64) {
        let mut buf = Vec::with_capacity(4 + 17);
        buf.extend_from_slice(&[0; 4]);
        buf.push(FRAME_KEEPALIVE_REPLY);
        buf.extend_from_slice(&request_id.to_be_bytes());
        buf.extend_from_slice(&ttl.to_be_bytes());
        self.enqueue(to, buf, None);
    }

    /// Tells `to` that this member (the leader) refused a proposal `to` forwarded.
    pub fn send_proposal_refused(&self, to: u64, refusal_code: u8, kind_code: u8, id: u64) {
        let mut buf = Vec::with_capacity(4 + 1 + PROPOSAL_REFUSED_BYTES);
        buf.extend_from_slice(&[0; 4]);
        buf.push(FRAME_PROPOSAL_REFUSED);
        buf.push(refusal_code);
        buf.push(kind_code);
        buf.extend_from_slice(&id.to_be_bytes());
        self.enqueue(to, buf, None);
    }

    /// Asks peer `to` for its HashKV at `revision`; waits at most `timeout` for the answer.
    pub async fn hash_kv_of(&self, to: u64, revision: i64, timeout: Duration) -> PeerHash {
        if self.hash_waiting.borrow().len() >= HASHKV_WAITING_MAX {
            return PeerHash::Unavailable;
        }
        let request_id = self.next_hash_request.get();
        self.next_hash_request.set(request_id + 1);
        let (tx, rx) = futures_channel::oneshot::channel();
        self.hash_waiting.borrow_mut().insert(request_id, tx);
        let mut buf = Vec::with_capacity(4 + 1 + HASHKV_REQUEST_BYTES);
        buf.extend_from_slice(&[0; 4]);
        buf.push(FRAME_HASHKV);
        buf.extend_from_slice(&request_id.to_be_bytes());
        buf.extend_from_slice(&revision.to_be_bytes());
        self.enqueue(to, buf, None);
        let answer = async { rx.await.unwrap_or(PeerHash::Unavailable) };
        let expired = async {
            rt::sleep(timeout).await;
            PeerHash::Unavailable
        };
        let reply = futures_lite::future::or(answer, expired).await;
        self.hash_waiting.borrow_mut().remove(&request_id);
        reply
    }

    /// Answers a peer's HashKV request.
    pub fn send_hash_kv_reply(&self, to: u64, request_id: u64, reply: PeerHash) {
        let mut buf = Vec::with_capacity(4 + 1 + HASHKV_REPLY_BYTES);
        buf.extend_from_slice(&[0; 4]);
        buf.push(FRAME_HASHKV_REPLY);
        buf.extend_from_slice(&reply.encode(request_id));
        self.enqueue(to, buf, None);
    }

    /// Forwarded keep-alives and their replies received since the last call.
    pub fn take_control(&self) -> Vec<Control> {
        self.control.borrow_mut().drain(..).collect()
    }

    /// Tells raft a snapshot frame for `snapshot_to` was not sent, so it retries later.
    fn snapshot_not_sent(&self, snapshot_to: Option<SnapshotSent>) {
        if let Some(to) = snapshot_to {
            self.reports
                .borrow_mut()
                .snapshots
                .push((to, SnapshotStatus::Failure));
            // The raft loop takes reports when it wakes; it may be about to sleep.
            self.inbox_signal.wake();
        }
    }

    /// Queues a frame whose first 4 bytes are reserved for its length; false when it was
    /// dropped (unknown peer, too large, queue full).
    fn enqueue(&self, to: u64, mut buf: Vec<u8>, snapshot_to: Option<SnapshotSent>) -> bool {
        let peers = self.peers.borrow();
        let Some(peer) = peers.get(&to) else {
            tracing::debug!(to, "frame for an unknown peer dropped");
            // As `send_snapshot` does: a snapshot's report must come, or raft waits for it
            // until the term ends.
            self.snapshot_not_sent(snapshot_to);
            return false;
        };
        if buf.len() - 4 > self.frame_bytes_max {
            // Nothing should outgrow a frame (requests are bounded below it by Limits, and
            // snapshots are streamed in chunks): the receiver would refuse it, so do not send
            // it, and tell raft when it was a snapshot.
            tracing::error!(
                to = format!("{to:x}"),
                frame_bytes = buf.len() - 4,
                frame_bytes_max = self.frame_bytes_max,
                "peer frame too large; dropped"
            );
            self.snapshot_not_sent(snapshot_to);
            return false;
        }
        let len = u32::try_from(buf.len() - 4).expect("frames stay below frame_bytes_max");
        buf[..4].copy_from_slice(&len.to_be_bytes());
        let full = peer.queue.borrow().len() >= PEER_QUEUE_MSGS_MAX
            || (peer.queue_bytes.get() + buf.len() > PEER_QUEUE_BYTES_MAX
                && !peer.queue.borrow().is_empty());
        if full {
            RaftStats::count(&peer.stats.sent_failures, 1);
            self.snapshot_not_sent(snapshot_to);
            return false;
        }
        peer.queue_bytes.set(peer.queue_bytes.get() + buf.len());
        peer.queue
            .borrow_mut()
            .push_back((Bytes::from(buf), snapshot_to));
        peer.signal.wake();
        true
    }

    /// Messages received since the last call (at most the inbox bound).
    pub fn take_inbox(&self) -> Vec<Message> {
        self.inbox.borrow_mut().drain(..).collect()
    }

    pub fn has_inbox(&self) -> bool {
        !self.inbox.borrow().is_empty()
            || !self.control.borrow().is_empty()
            || self.told_removed_by.get().is_some()
    }

    /// Resolves when a message arrived (or a report is waiting).
    pub async fn inbox_ready(&self) {
        if self.has_inbox() {
            return;
        }
        self.inbox_signal.wait().await;
    }

    /// The cluster id learned from a peer since the last call (joining members only).
    pub fn learned_cluster_id(&self) -> Option<u64> {
        self.learned_cluster_id.take()
    }

    /// Peers whose connection failed, and snapshot transfers that finished or failed.
    pub fn take_reports(&self) -> (Vec<u64>, Vec<(SnapshotSent, SnapshotStatus)>) {
        let mut r = self.reports.borrow_mut();
        (
            std::mem::take(&mut r.unreachable),
            std::mem::take(&mut r.snapshots),
        )
    }

    async fn send_loop(self: Rc<Self>, peer: Rc<Peer>) {
        let mut backoff = BACKOFF_MIN;
        while !peer.removed.get() && !self.told_removed.get() {
            let stream = match self.connect(&peer).await {
                Some(s) => s,
                None => {
                    self.drop_queue(&peer);
                    self.reports.borrow_mut().unreachable.push(peer.id);
                    self.inbox_signal.wake();
                    rt::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            backoff = BACKOFF_MIN;
            if let Err(e) = self.write_dialed(&peer, stream).await {
                tracing::debug!(peer = format!("{:x}", peer.id), error = %e, "peer connection lost");
                self.drop_queue(&peer);
                self.reports.borrow_mut().unreachable.push(peer.id);
                self.inbox_signal.wake();
            }
        }
    }

    /// Dropped messages are lost like any on a broken network; snapshot senders are told.
    fn drop_queue(&self, peer: &Peer) {
        let mut q = peer.queue.borrow_mut();
        for (_, snap) in q.drain(..) {
            if let Some(to) = snap {
                self.reports
                    .borrow_mut()
                    .snapshots
                    .push((to, SnapshotStatus::Failure));
            }
        }
        peer.queue_bytes.set(0);
    }

    async fn connect(&self, peer: &Peer) -> Option<Dialed> {
        let urls = peer.addrs.borrow().clone();
        let hello = encode_hello(&Hello {
            cluster_id: self.cluster_id.get(),
            from: self.me,
            to: peer.id,
            peer_urls: self.own_peer_urls.borrow().clone(),
        });
        for url in urls {
            let Ok((scheme, host, port)) = url_scheme_host_port("peer-urls", &url) else {
                continue;
            };
            let ip = if host == "localhost" {
                "127.0.0.1"
            } else {
                host.as_str()
            };
            let addr = format!("{ip}:{port}");
            let Ok(s) = TcpStream::connect(addr.as_str()).await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            let mut dialed = match scheme {
                Scheme::Http => Dialed::Plain(s),
                Scheme::Https => {
                    let Some(connector) = self.tls.as_ref().and_then(|t| t.connector.as_ref())
                    else {
                        tracing::warn!(%url, "cannot dial an https peer URL: no --peer-trusted-ca-file (or --peer-auto-tls) to verify it with");
                        continue;
                    };
                    let handshake = async { Some(connector.connect(&host, s).await) };
                    let expired = async {
                        rt::sleep(PEER_HANDSHAKE_TIMEOUT).await;
                        None
                    };
                    match futures_lite::future::or(handshake, expired).await {
                        Some(Ok(tls)) => Dialed::Tls(Box::new(tls)),
                        Some(Err(e)) => {
                            tracing::warn!(peer = format!("{:x}", peer.id), %url, error = %e, "peer TLS handshake failed");
                            continue;
                        }
                        None => {
                            tracing::warn!(peer = format!("{:x}", peer.id), %url, "peer TLS handshake timed out");
                            continue;
                        }
                    }
                }
            };
            let sent = match &mut dialed {
                Dialed::Plain(s) => s.write_all(&hello).await,
                Dialed::Tls(s) => match s.write_all(&hello).await {
                    Ok(()) => s.flush().await,
                    Err(e) => Err(e),
                },
            };
            if sent.is_ok() {
                return Some(dialed);
            }
        }
        None
    }

    async fn write_dialed(&self, peer: &Peer, dialed: Dialed) -> std::io::Result<()> {
        match dialed {
            Dialed::Plain(s) => self.run_dialed(peer, s).await,
            Dialed::Tls(s) => self.run_dialed(peer, *s).await,
        }
    }

    /// Writes the queued frames to a dialed connection while listening on it for the one
    /// answer a peer may send back: that this member was removed from the cluster.
    async fn run_dialed<S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin>(
        &self,
        peer: &Peer,
        stream: S,
    ) -> std::io::Result<()> {
        let (reader, writer) = split_local(stream);
        futures_lite::future::or(
            self.write_loop(peer, writer),
            self.read_answers(peer, reader),
        )
        .await
    }

    /// Resolves only when the peer says this member was removed; anything else it may send is
    /// skipped, and a connection that ends is the writer's to notice (it fails its next write),
    /// so the writer is never cut short mid-frame for that.
    async fn read_answers<R: futures_lite::AsyncRead + Unpin>(
        &self,
        peer: &Peer,
        mut reader: R,
    ) -> std::io::Result<()> {
        loop {
            let Ok(frame) = read_frame(&mut reader, ANSWER_FRAME_BYTES_MAX).await else {
                return futures_lite::future::pending().await;
            };
            if let Ok(Incoming::MemberRemoved) = parse_frame(&frame, peer.id) {
                tracing::warn!(
                    local_member_id = format!("{:x}", self.me),
                    remote_peer_id = format!("{:x}", peer.id),
                    error = crate::member::MEMBER_REMOVED,
                    "peer refused this member's connection: removed from the cluster"
                );
                self.told_removed.set(true);
                self.told_removed_by.set(Some(peer.id));
                self.inbox_signal.wake();
                return Err(std::io::Error::other(crate::member::MEMBER_REMOVED));
            }
        }
    }

    async fn write_loop<S: futures_lite::AsyncWrite + Unpin>(
        &self,
        peer: &Peer,
        mut stream: S,
    ) -> std::io::Result<()> {
        let mut batch = Vec::with_capacity(WRITE_BATCH_BYTES);
        loop {
            if peer.removed.get() {
                return Ok(());
            }
            // Small frames are gathered into one write; a large frame (a snapshot) ends the
            // gathering and is written from its own buffer after them, keeping the order.
            let mut snapshots = Vec::new();
            let mut large = None;
            {
                let mut q = peer.queue.borrow_mut();
                while let Some((frame, snap)) = q.pop_front() {
                    peer.queue_bytes.set(peer.queue_bytes.get() - frame.len());
                    if let Some(to) = snap {
                        snapshots.push(to);
                    }
                    if frame.len() >= WRITE_BATCH_BYTES {
                        large = Some(frame);
                        break;
                    }
                    batch.extend_from_slice(&frame);
                    if batch.len() >= WRITE_BATCH_BYTES {
                        break;
                    }
                }
            }
            if batch.is_empty() && large.is_none() {
                let signalled = async {
                    peer.signal.wait().await;
                    true
                };
                let idle = async {
                    rt::sleep(LINK_HEARTBEAT_INTERVAL).await;
                    false
                };
                if futures_lite::future::or(signalled, idle).await {
                    continue;
                }
                batch.extend_from_slice(&1u32.to_be_bytes());
                batch.push(FRAME_LINK_HEARTBEAT);
            }
            let mut result = Ok(());
            if !batch.is_empty() {
                result = within_deadline(stream.write_all(&batch)).await;
                if result.is_ok() {
                    RaftStats::count(&peer.stats.sent_bytes, batch.len() as u64);
                }
                batch.clear();
            }
            if let (Ok(()), Some(frame)) = (&result, large) {
                result = within_deadline(stream.write_all(&frame)).await;
                if result.is_ok() {
                    RaftStats::count(&peer.stats.sent_bytes, frame.len() as u64);
                }
            }
            if result.is_ok() {
                // A TLS stream may hold the last record until flushed; TCP's flush is free.
                result = within_deadline(stream.flush()).await;
            }
            self.report_snapshots(&snapshots, result.is_ok());
            result?;
        }
    }

    fn report_snapshots(&self, to: &[SnapshotSent], ok: bool) {
        if to.is_empty() {
            return;
        }
        let status = if ok {
            SnapshotStatus::Finish
        } else {
            SnapshotStatus::Failure
        };
        let mut r = self.reports.borrow_mut();
        for id in to {
            r.snapshots.push((*id, status));
        }
        drop(r);
        self.inbox_signal.wake();
    }

    /// Runs an accepted connection: the TLS handshake first on an https listener, then the
    /// peer protocol.
    async fn serve_peer(self: &Rc<Self>, stream: TcpStream, scheme: Scheme) -> std::io::Result<()> {
        match scheme {
            Scheme::Http => self.read_peer(stream).await,
            Scheme::Https => {
                let acceptor = &self.tls.as_ref().expect("checked by listen").acceptor;
                let handshake = async { Some(acceptor.accept(stream).await) };
                let expired = async {
                    rt::sleep(PEER_HANDSHAKE_TIMEOUT).await;
                    None
                };
                match futures_lite::future::or(handshake, expired).await {
                    Some(Ok(tls)) => self.read_peer(tls).await,
                    Some(Err(e)) => {
                        // etcd logs the same refusal ("rejected connection from ...") at
                        // warning level: a peer with a bad certificate is an operator's problem.
                        tracing::warn!(error = %e, "rejected peer connection: TLS handshake failed");
                        Err(e)
                    }
                    None => Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "peer TLS handshake timed out",
                    )),
                }
            }
        }
    }

    /// Answers a connection from a removed member: etcd's words on this side, the removed
    /// notice to the dialer, then what it already sent is read and dropped until it hangs up
    /// (or `REMOVED_NOTICE_LINGER` passes), so the close does not reset the connection under
    /// the notice.
    async fn refuse_removed<R, W>(
        &self,
        mut reader: R,
        mut writer: W,
        from: u64,
    ) -> std::io::Result<()>
    where
        R: futures_lite::AsyncRead + Unpin,
        W: futures_lite::AsyncWrite + Unpin,
    {
        tracing::warn!(
            local_member_id = format!("{:x}", self.me),
            remote_peer_id_from = format!("{from:x}"),
            "rejected stream from remote peer because it was removed"
        );
        writer.write_all(&encode_member_removed()).await?;
        writer.flush().await?;
        let drain = async {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        futures_lite::future::or(drain, rt::sleep(REMOVED_NOTICE_LINGER)).await;
        Err(std::io::Error::other(
            "the peer was removed from the cluster",
        ))
    }

    /// Resolves once this member applied `from`'s removal: checked every
    /// `REMOVED_CHECK_INTERVAL`, so a removed member that sends nothing (a learner, or one
    /// frozen) is told too, without its next frame.
    async fn removed_now(&self, from: u64) {
        while !self.removed.borrow().contains(&from) {
            rt::sleep(REMOVED_CHECK_INTERVAL).await;
        }
    }

    async fn read_peer<S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin>(
        self: &Rc<Self>,
        stream: S,
    ) -> std::io::Result<()> {
        // The write half only ever carries an answer back: the members reply, a snapshot's
        // ack, or the removed notice.
        let (mut reader, mut writer) = split_local(stream);
        // A dialer writes its hello as soon as it connects: one that stays silent is not a
        // member, and must not hold the connection (nor, below, a read-ahead buffer).
        let hello =
            parse_hello(&within_deadline(read_frame(&mut reader, HANDSHAKE_BYTES_MAX)).await?)?;
        if hello == MEMBERS_QUERY {
            // A member joining with --initial-cluster-state existing asks who it is (its id
            // was made by MemberAdd, with the time in it). Only a member that knows the
            // cluster's id answers: a joining one does not know it yet.
            let cluster_id = self.cluster_id.get();
            if cluster_id == 0 {
                return Err(std::io::Error::other(
                    "members query to a member that is joining itself",
                ));
            }
            let reply = encode_members_reply(cluster_id, &self.members.borrow());
            writer.write_all(&reply).await?;
            writer.flush().await?;
            return Ok(());
        }
        let Hello {
            cluster_id,
            from,
            to,
            peer_urls,
        } = hello;
        let ours = self.cluster_id.get();
        if ours == 0 && cluster_id != 0 {
            // We are joining: the first member of the cluster to reach us tells us its id.
            self.cluster_id.set(cluster_id);
            self.learned_cluster_id.set(Some(cluster_id));
            self.inbox_signal.wake();
        }
        if self.removed.borrow().contains(&from)
            && (cluster_id == self.cluster_id.get() || cluster_id == 0)
            && to == self.me
        {
            return self.refuse_removed(reader, writer, from).await;
        }
        // A joining member does not know the id yet and sends 0; it must be a member we know.
        let joining_peer = cluster_id == 0 && self.peers.borrow().contains_key(&from);
        if cluster_id != self.cluster_id.get() && !joining_peer {
            // A member of another cluster (or one started with another token) must never mix
            // its log with ours.
            tracing::warn!(
                remote_cluster = format!("{cluster_id:x}"),
                local_cluster = format!("{:x}", self.cluster_id.get()),
                from = format!("{from:x}"),
                "refused a peer connection from a different cluster"
            );
            return Err(std::io::Error::other("cluster id mismatch"));
        }
        if to != self.me {
            return Err(std::io::Error::other(
                "peer connection meant for another member",
            ));
        }
        // A joining dialer (cluster id 0) is one this member lists already.
        self.learn_remote(from, &peer_urls);
        // Frames until the connection ends (an error), or until this member applies the
        // sender's removal (found at its next frame, or by the check beside the reads).
        let removed = async {
            self.removed_now(from).await;
            Ok(())
        };
        // A version-2 dialer (its handshake carries URLs) writes link heartbeats when it has
        // nothing else to send, so its connection can be read under a deadline.
        let read_deadline = !peer_urls.is_empty();
        // Read ahead only now, for a member's frames: the hello was read exactly, so no byte
        // after it is lost.
        let mut reader = futures_lite::io::BufReader::with_capacity(READ_AHEAD_BYTES, reader);
        let frames = self.take_frames(&mut reader, &mut writer, from, read_deadline);
        futures_lite::future::or(frames, removed).await?;
        self.refuse_removed(reader, writer, from).await
    }

    /// Takes `from`'s frames into the inbox and control queues; returns Ok once `from` is
    /// removed (its frames are not ours to take any more), an error when the connection ends.
    async fn take_frames<R, W>(
        &self,
        reader: &mut R,
        writer: &mut W,
        from: u64,
        read_deadline: bool,
    ) -> std::io::Result<()>
    where
        R: futures_lite::AsyncRead + Unpin,
        W: futures_lite::AsyncWrite + Unpin,
    {
        let stats = self.peer_stats.peer(from);
        // The snapshot this connection streams, once its begin frame came.
        let mut incoming: Option<IncomingSnapshot> = None;
        // Whether a frame came yet: a snapshot stream's sender lists the files it sends
        // before its first frame (seconds, for a store of gigabytes), and writes no link
        // heartbeats; its stream has deadlines of its own (its sender's per chunk).
        let mut framed = false;
        loop {
            let mut frame = if read_deadline && framed && incoming.is_none() {
                within_deadline(read_frame(reader, self.frame_bytes_max)).await?
            } else {
                read_frame(reader, self.frame_bytes_max).await?
            };
            framed = true;
            RaftStats::count(&stats.received_bytes, frame.len() as u64 + 4);
            if self.removed.borrow().contains(&from) {
                return Ok(());
            }
            // A raft message without a copy: the frame's bytes become the entries' payloads.
            // (A snapshot chunk's frame stays a `Vec`, which its writer reuses.)
            let parsed = if frame.first() == Some(&FRAME_RAFT) {
                parse_shared_frame(&Bytes::from(std::mem::take(&mut frame)), from)?
            } else {
                parse_frame(&frame, from)?
            };
            match parsed {
                Incoming::SnapshotBegin {
                    index,
                    checkpoint_bytes,
                } => {
                    if incoming.is_some() {
                        return Err(std::io::Error::other("a second snapshot on one stream"));
                    }
                    let stream = self.snapshot_streams.get() + 1;
                    self.snapshot_streams.set(stream);
                    match IncomingSnapshot::begin(
                        &self.staging_dir,
                        stream,
                        from,
                        index,
                        checkpoint_bytes,
                    )
                    .await
                    {
                        Ok(snapshot) => incoming = Some(snapshot),
                        Err(e) => {
                            tracing::warn!(from = format!("{from:x}"), index, error = %e, "cannot stage a snapshot; dropping the stream");
                            return Err(e);
                        }
                    }
                    continue;
                }
                Incoming::SnapshotChunk(header) => {
                    let Some(snapshot) = incoming.as_mut() else {
                        return Err(std::io::Error::other("a snapshot chunk without its begin"));
                    };
                    if let Err(e) = snapshot.chunk(header, frame, SNAPSHOT_CHUNK_BODY_AT).await {
                        // A full disk, a write error, or a chunk the sender got wrong: said
                        // here, since the connection's end is logged only at debug, and the
                        // leader only sees a reset.
                        tracing::warn!(from = format!("{from:x}"), error = %e, "cannot store a snapshot chunk; dropping the stream");
                        return Err(e);
                    }
                    continue;
                }
                Incoming::Raft(mut m) if incoming.is_some() => {
                    let snapshot = incoming.take().expect("checked by the guard");
                    let index = m.snapshot.as_ref().map(|s| s.metadata.index);
                    if m.msg_type != MessageType::Snapshot || index.is_none() {
                        return Err(std::io::Error::other(
                            "a snapshot stream ends with another message",
                        ));
                    }
                    let staged = match snapshot.finish(index.expect("checked above")).await {
                        Ok(staged) => staged,
                        Err(e) => {
                            tracing::warn!(from = format!("{from:x}"), error = %e, "cannot complete a received snapshot; dropping the stream");
                            return Err(e);
                        }
                    };
                    tracing::info!(
                        from = format!("{from:x}"),
                        index = staged.index,
                        checkpoint_bytes = staged.data.len(),
                        segments = staged.segments.len(),
                        "received a snapshot"
                    );
                    if let Some(snap) = m.snapshot.as_mut() {
                        snap.data = staged.data.clone();
                    }
                    let index = staged.index;
                    self.stage(staged);
                    {
                        let mut inbox = self.inbox.borrow_mut();
                        if inbox.len() >= INBOX_MSGS_MAX {
                            return Err(std::io::Error::other("inbox full; snapshot dropped"));
                        }
                        inbox.push_back(m);
                    }
                    self.inbox_signal.wake();
                    writer.write_all(&peer_snapshot::encode_ack(index)).await?;
                    writer.flush().await?;
                    continue;
                }
                Incoming::Raft(m) => {
                    if m.msg_type == MessageType::HeartbeatResponse {
                        if let Some(sent) = self.heartbeat_sent_at.borrow_mut().remove(&from) {
                            stats.round_trip.observe_duration(sent.elapsed());
                        }
                    }
                    let mut inbox = self.inbox.borrow_mut();
                    if inbox.len() < INBOX_MSGS_MAX {
                        inbox.push_back(m);
                    }
                }
                Incoming::Control(c) => {
                    let mut control = self.control.borrow_mut();
                    if control.len() < INBOX_MSGS_MAX {
                        control.push_back(c);
                    }
                }
                Incoming::HashKvReply { request_id, reply } => {
                    if let Some(tx) = self.hash_waiting.borrow_mut().remove(&request_id) {
                        let _ = tx.send(reply);
                    }
                }
                Incoming::LinkHeartbeat => continue,
                // Only ever sent back to a dialer; a dialer sending it is confused, and a
                // member is told it was removed only by the member it dialed.
                Incoming::MemberRemoved | Incoming::SnapshotAck { .. } => {
                    return Err(std::io::Error::other(
                        "a removed notice on an incoming connection",
                    ))
                }
            }
            self.inbox_signal.wake();
        }
    }
}

impl Transport {
    /// Keeps a received snapshot for the raft core; older ones (raft never installs a
    /// snapshot older than one it was offered since) and those past the bound are deleted.
    fn stage(&self, staged: StagedSnapshot) {
        let mut list = self.staged.borrow_mut();
        let mut gone = Vec::new();
        list.retain(|s| {
            let keep = s.index >= staged.index;
            if !keep {
                gone.push(s.dir.clone());
            }
            keep
        });
        list.push_back(staged);
        while list.len() > STAGED_SNAPSHOTS_MAX {
            gone.push(list.pop_front().expect("longer than the bound").dir);
        }
        peer_snapshot::remove_staged(gone);
    }
}

/// One half of a connection whose reader and writer the same task polls, one at a time (the
/// futures of `run_dialed` and `read_peer` are joined with `or`, never spawned apart): a
/// `RefCell` borrowed for the length of one poll shares the stream on this single-threaded
/// executor, where `futures_lite::io::split` would lock a mutex around every read and write.
struct Half<S>(Rc<RefCell<S>>);

fn split_local<S>(stream: S) -> (Half<S>, Half<S>) {
    let shared = Rc::new(RefCell::new(stream));
    (Half(shared.clone()), Half(shared))
}

impl<S: futures_lite::AsyncRead + Unpin> futures_lite::AsyncRead for Half<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_read(cx, buf)
    }
}

impl<S: futures_lite::AsyncWrite + Unpin> futures_lite::AsyncWrite for Half<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0.borrow_mut()).poll_close(cx)
    }
}

/// `io`, or a `TimedOut` error once [`PEER_CONN_TIMEOUT`] passes first.
async fn within_deadline<T>(
    io: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    let expired = async {
        rt::sleep(PEER_CONN_TIMEOUT).await;
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "peer connection silent or blocked past its deadline",
        ))
    };
    futures_lite::future::or(io, expired).await
}

async fn read_frame<S: futures_lite::AsyncRead + Unpin>(
    stream: &mut S,
    max_bytes: usize,
) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = frame_len(len, max_bytes)?;
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_that_keeps_failing_is_sent_again_ever_less_often_up_to_a_bound() {
        let secs = |n| snapshot_retry_delay(n).as_secs_f64();
        assert_eq!(
            [1, 2, 3, 4, 5, 6].map(secs),
            [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
        );
        for n in [7, 17, 40, u32::MAX] {
            assert_eq!(secs(n), 32.0, "after {n} failures");
        }
    }

    #[test]
    fn split_halves_read_and_write_one_stream() {
        futures_lite::future::block_on(async {
            let (mut reader, mut writer) =
                split_local(futures_lite::io::Cursor::new(b"hello".to_vec()));
            let mut two = [0u8; 2];
            reader.read_exact(&mut two).await.expect("read");
            assert_eq!(&two, b"he");
            // The writer continues where the reader stopped: one stream, one position.
            writer.write_all(b"LL").await.expect("write");
            writer.flush().await.expect("flush");
            let mut rest = Vec::new();
            reader.read_to_end(&mut rest).await.expect("read the rest");
            assert_eq!(rest, b"o");
            drop(writer);
            let stream = Rc::try_unwrap(reader.0).expect("the last half");
            assert_eq!(stream.into_inner().into_inner(), b"heLLo");
        });
    }

    #[test]
    fn the_removed_notice_parses_only_as_itself() {
        let frame = encode_member_removed();
        let len = frame_len(
            frame[..4].try_into().expect("4 bytes"),
            ANSWER_FRAME_BYTES_MAX,
        )
        .expect("within the answer bound");
        assert_eq!(len, frame.len() - 4);
        assert!(matches!(
            parse_frame(&frame[4..], 7),
            Ok(Incoming::MemberRemoved)
        ));
        // With a body it is no notice: a newer build's frame of that kind is refused as
        // damage, never taken as "you were removed".
        assert!(parse_frame(&[FRAME_MEMBER_REMOVED, 0], 7).is_err());
    }

    #[test]
    fn a_members_reply_round_trips_and_damage_is_refused() {
        let members = vec![
            (
                0x8e9e_05c5_2164_694d,
                vec!["http://10.0.0.1:2380".to_string()],
            ),
            (
                7,
                vec![
                    "https://a.example:2380".to_string(),
                    "https://b.example:2380".to_string(),
                ],
            ),
            (9, vec![]),
        ];
        let frame = encode_members_reply(0xcdf8, &members);
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        assert_eq!(
            parse_members_reply(&frame[4..]).expect("parses"),
            (0xcdf8, members)
        );
        for cut in 0..frame.len() - 4 {
            assert!(
                parse_members_reply(&frame[4..4 + cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = frame[4..].to_vec();
        longer.push(0);
        assert!(parse_members_reply(&longer).is_err(), "trailing bytes");
        let mut other_kind = frame[4..].to_vec();
        other_kind[0] = FRAME_RAFT;
        assert!(parse_members_reply(&other_kind).is_err());
        // The query is a handshake no member sends: from 0 to 0, without URLs, in version
        // 1's bytes (the fixed part alone), which builds before version 2 read too.
        let query = encode_hello(&MEMBERS_QUERY);
        assert_eq!(query.len(), 4 + HANDSHAKE_FIXED_BYTES);
        assert_eq!(query[12..16], PROTOCOL_VERSION_NO_URLS.to_be_bytes());
        assert_eq!(parse_hello(&query[4..]).unwrap(), MEMBERS_QUERY);
    }

    #[test]
    fn a_link_heartbeat_is_an_empty_frame_of_its_own_kind() {
        assert!(matches!(
            parse_frame(&[FRAME_LINK_HEARTBEAT], 3),
            Ok(Incoming::LinkHeartbeat)
        ));
        assert!(parse_frame(&[FRAME_LINK_HEARTBEAT, 0], 3).is_err());
        // Three to a deadline, as etcd's.
        assert!(LINK_HEARTBEAT_INTERVAL * 3 <= PEER_CONN_TIMEOUT);
        assert!(LINK_HEARTBEAT_INTERVAL * 4 > PEER_CONN_TIMEOUT);
    }

    #[test]
    fn a_handshake_carries_the_dialers_urls_and_an_older_builds_is_read() {
        let hello = Hello {
            cluster_id: 0xcdf8,
            from: 3,
            to: 4,
            peer_urls: vec!["http://10.0.0.3:2380".into(), "https://n3:2380".into()],
        };
        let frame = encode_hello(&hello);
        assert_eq!(
            u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
        assert_eq!(parse_hello(&frame[4..]).unwrap(), hello);
        // Every cut and any trailing byte is damage, never a shorter list.
        for cut in 0..frame.len() - 4 {
            assert!(parse_hello(&frame[4..4 + cut]).is_err(), "cut at {cut}");
        }
        let mut longer = frame[4..].to_vec();
        longer.push(0);
        assert!(parse_hello(&longer).is_err(), "trailing bytes");
        let mut not_text = frame[4..].to_vec();
        let last = not_text.len() - 1;
        not_text[last] = 0xff;
        assert!(parse_hello(&not_text).is_err(), "a URL that is not UTF-8");
        // Version 1: the fixed part alone, read with no URLs; with more bytes, refused.
        let mut v1 = frame[4..4 + HANDSHAKE_FIXED_BYTES].to_vec();
        v1[8..12].copy_from_slice(&PROTOCOL_VERSION_NO_URLS.to_be_bytes());
        let heard = parse_hello(&v1).unwrap();
        assert_eq!((heard.cluster_id, heard.from, heard.to), (0xcdf8, 3, 4));
        assert!(heard.peer_urls.is_empty());
        v1.push(0);
        assert!(parse_hello(&v1).is_err());
        // A version from the future is named.
        let mut v9 = frame[4..].to_vec();
        v9[8..12].copy_from_slice(&9u32.to_be_bytes());
        let e = parse_hello(&v9).unwrap_err().to_string();
        assert!(e.contains("version 9"), "{e}");
        // URLs past the bound are left out, and what is sent stays under the read limit.
        let many = Hello {
            peer_urls: (0..1000)
                .map(|i| format!("http://10.0.{i}.1:2380"))
                .collect(),
            ..hello
        };
        let frame = encode_hello(&many);
        assert!(frame.len() - 4 <= HANDSHAKE_BYTES_MAX);
        let heard = parse_hello(&frame[4..]).unwrap();
        assert!(!heard.peer_urls.is_empty() && heard.peer_urls.len() < 1000);
        assert_eq!(heard.peer_urls[..], many.peer_urls[..heard.peer_urls.len()]);
        let room_left = HANDSHAKE_BYTES_MAX - (frame.len() - 4);
        assert!(room_left < 2 + many.peer_urls[heard.peer_urls.len()].len());
    }
}
