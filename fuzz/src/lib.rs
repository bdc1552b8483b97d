//! Fuzz targets for every parser that reads bytes Keel did not write itself in this process:
//! what clients send (gRPC framing, request messages, raw HTTP/2, auth tokens), what peers send (handshake
//! and frames, raft messages), and what the disk gives back (WAL segments, checkpoints).
//!
//! Each target is a plain `fn(&[u8])` that must never panic, hang or allocate without bound,
//! whatever the bytes: bad input is an error value (etcd's answer on the client port, a closed
//! connection on the peer port, a refused start on disk). Where a target can check more than
//! "no panic", it does: a decoded message re-encodes to one that decodes the same, a WAL that
//! opened recovers what was appended to it.
//!
//! Drivers:
//! - `tests/smoke.rs` runs every target over its seed corpus (`corpus/<target>/`) and a few
//!   thousand deterministic mutations of it, on stable, under `cargo test --workspace`;
//!   `KEEL_FUZZ_SECONDS=N` turns it into an N-second run per target (no coverage guidance).
//! - `libfuzzer/` is a cargo-fuzz project (nightly, libFuzzer, coverage-guided) with one
//!   binary per target calling these same functions; RELIABILITY.md has the commands.
//!
//! Targets whose input carries a checksum (WAL frames, checkpoints) read their first byte as a
//! mode: raw bytes as found on disk, or bytes whose checksums this target fills in first, so
//! the fuzzer reaches the code behind the checksum instead of stopping at it.

pub mod mutate;

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use keel_grpc::server::{Call, Handler, ResponseSink, Runtime, ServerConfig};
use keel_grpc::status::Status;
use keel_proto::etcdserverpb as pb;
use keel_proto::{v3electionpb, v3lockpb};

/// A fuzz target: must return normally for every input.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and libFuzzer binary.
pub const TARGETS: [(&str, Target); 9] = [
    ("grpc_framing", grpc_framing),
    ("grpc_requests", grpc_requests),
    ("http2_server", http2_server),
    ("wal_recovery", wal_recovery),
    ("checkpoint_load", checkpoint_load),
    ("raft_message", raft_message),
    ("peer_frames", peer_frames),
    ("simple_token", simple_token),
    ("jwt_token", jwt_token),
];

/// Largest input a target looks at: larger ones are cut (keeps every run fast and bounded).
pub const INPUT_BYTES_MAX: usize = 256 * 1024;

fn bounded(data: &[u8]) -> &[u8] {
    &data[..data.len().min(INPUT_BYTES_MAX)]
}

/// gRPC message framing: the 5-byte prefix reassembled from arbitrary DATA chunks under a
/// receive limit, and `grpc-timeout` values.
///
/// Input: limit selector, chunk size, then the stream's bytes.
pub fn grpc_framing(data: &[u8]) {
    use keel_grpc::codec::{parse_grpc_timeout, MessageDecoder, PREFIX_BYTES};
    let data = bounded(data);
    let [limit, chunk, rest @ ..] = data else {
        return;
    };
    // The server always runs with a positive limit (MessageDecoder asserts it).
    let max_message_bytes = (usize::from(*limit) + 1) * 64;
    let chunk_bytes = usize::from(*chunk).max(1);
    let mut decoder = MessageDecoder::new(max_message_bytes);
    let mut pushed = 0usize;
    let mut decoded = 0usize;
    'stream: for piece in rest.chunks(chunk_bytes) {
        decoder.push(piece);
        pushed += piece.len();
        loop {
            match decoder.next_message() {
                Ok(Some(message)) => {
                    assert!(
                        message.len() <= max_message_bytes,
                        "a message over the limit"
                    );
                    decoded += PREFIX_BYTES + message.len();
                    assert!(decoded <= pushed, "more bytes decoded than received");
                }
                Ok(None) => break,
                // An error ends the call (ResourceExhausted, Internal): the stream stops here.
                Err(_) => break 'stream,
            }
        }
        assert!(
            decoder.buffered_bytes() <= pushed - decoded,
            "the decoder holds bytes it never received"
        );
    }
    let _ = decoder.end_of_stream_status();
    let _ = parse_grpc_timeout(rest);
}

/// Every request message a Keel service decodes, decoded from arbitrary bytes; those Keel
/// validates before proposing go through `core/src/convert.rs` and keel-kv's `validate_*`, as
/// service.rs does. A message that decodes re-encodes to bytes that decode to the same message.
///
/// Input: message selector, then the message's bytes.
pub fn grpc_requests(data: &[u8]) {
    let data = bounded(data);
    let [selector, body @ ..] = data else {
        return;
    };
    /// Decodes `body` as `M`; when it decodes, checks the round trip and returns it.
    fn decoded<M: prost::Message + Default + PartialEq>(body: &[u8]) -> Option<M> {
        let message = M::decode(body).ok()?;
        let again = M::decode(message.encode_to_vec().as_slice())
            .expect("a message Keel encoded decodes again");
        assert!(again == message, "decode(encode(m)) differs from m");
        Some(message)
    }
    use keel_core::convert;
    use keel_kv as kv;
    match selector % 24 {
        0 => {
            if let Some(r) = decoded::<pb::RangeRequest>(body) {
                let _ = kv::validate_range(&convert::range_request(r));
            }
        }
        1 => {
            if let Some(r) = decoded::<pb::PutRequest>(body) {
                let _ = kv::validate_put(&convert::put_request(r));
            }
        }
        2 => {
            if let Some(r) = decoded::<pb::DeleteRangeRequest>(body) {
                let _ = kv::validate_delete_range(&convert::delete_request(r));
            }
        }
        3 => {
            if let Some(r) = decoded::<pb::TxnRequest>(body) {
                let _ = kv::validate_txn(
                    &convert::txn_request(r),
                    keel_core::config::DEFAULT_MAX_TXN_OPS as usize,
                );
            }
        }
        4 => {
            let _ = decoded::<pb::CompactionRequest>(body);
        }
        5 => {
            let _ = decoded::<pb::WatchRequest>(body);
        }
        6 => {
            if let Some(r) = decoded::<pb::LeaseGrantRequest>(body) {
                let _ = kv::validate_lease_grant(&kv::LeaseGrantRequest {
                    id: r.id,
                    ttl_s: r.ttl,
                });
            }
        }
        7 => {
            let _ = decoded::<pb::LeaseRevokeRequest>(body);
        }
        8 => {
            let _ = decoded::<pb::LeaseKeepAliveRequest>(body);
        }
        9 => {
            let _ = decoded::<pb::LeaseTimeToLiveRequest>(body);
        }
        10 => {
            let _ = decoded::<pb::MemberAddRequest>(body);
        }
        11 => {
            let _ = decoded::<pb::MemberRemoveRequest>(body);
        }
        12 => {
            let _ = decoded::<pb::MemberUpdateRequest>(body);
        }
        13 => {
            let _ = decoded::<pb::MemberPromoteRequest>(body);
        }
        14 => {
            let _ = decoded::<pb::AlarmRequest>(body);
        }
        15 => {
            let _ = decoded::<pb::HashKvRequest>(body);
        }
        16 => {
            let _ = decoded::<pb::MoveLeaderRequest>(body);
        }
        17 => {
            let _ = decoded::<pb::AuthenticateRequest>(body);
        }
        18 => {
            let _ = decoded::<pb::AuthRoleGrantPermissionRequest>(body);
        }
        19 => {
            let _ = decoded::<v3lockpb::LockRequest>(body);
        }
        20 => {
            let _ = decoded::<v3electionpb::CampaignRequest>(body);
        }
        21 => {
            let _ = decoded::<v3electionpb::ProclaimRequest>(body);
        }
        22 => {
            let _ = decoded::<pb::InternalRaftRequest>(body);
        }
        _ => {
            let _ = decoded::<pb::AuthUserAddRequest>(body);
        }
    }
}

/// A handler that reads every request message of a call and answers each with an empty
/// RangeResponse: enough to drive the server's framing, flow control and trailers. Counts the
/// request messages it read.
#[derive(Default)]
struct EchoHandler {
    messages: std::cell::Cell<usize>,
}

impl Handler for EchoHandler {
    async fn grpc(self: Rc<Self>, mut call: Call, sink: &mut ResponseSink) -> Status {
        loop {
            match call.requests.next_raw().await {
                Ok(Some(_)) => {
                    self.messages.set(self.messages.get() + 1);
                    if let Err(status) = sink.send(&pb::RangeResponse::default()).await {
                        return status;
                    }
                }
                Ok(None) => return Status::ok(),
                Err(status) => return status,
            }
        }
    }
}

/// A runtime whose spawned tasks the fuzz loop polls, and whose timers never fire (a deadline
/// would only end the connection early, which is not what is being fuzzed).
#[derive(Default)]
struct LoopRuntime {
    spawned: RefCell<Vec<Pin<Box<dyn Future<Output = ()>>>>>,
}

impl Runtime for LoopRuntime {
    fn spawn_local(&self, task: Pin<Box<dyn Future<Output = ()>>>) {
        self.spawned.borrow_mut().push(task);
    }
    fn sleep(&self, _duration: Duration) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(std::future::pending())
    }
}

/// Records that some task was woken during a polling round.
#[derive(Default)]
struct WakeFlag(AtomicBool);

impl std::task::Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Rounds of polling after which a connection fed all of its input must have nothing left to
/// do; each round polls every task once.
const HTTP2_ROUNDS_MAX: usize = 10_000;

/// Raw bytes from a client into `serve_connection` (HTTP/2 or HTTP/1.1, sniffed), over an
/// in-memory duplex; what the server writes back is read and dropped.
pub fn http2_server(data: &[u8]) {
    http2_serve(data);
}

/// [`http2_server`]'s work; returns how many gRPC request messages reached the handler (the
/// seed corpus checks its seeds get that far).
pub fn http2_serve(data: &[u8]) -> usize {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let data = Bytes::copy_from_slice(bounded(data));
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (mut client_rx, mut client_tx) = tokio::io::split(client);
    let config = Rc::new(ServerConfig {
        max_recv_message_bytes: 64 * 1024,
        ..ServerConfig::default()
    });
    let runtime = Rc::new(LoopRuntime::default());
    let handler = Rc::new(EchoHandler::default());
    let mut tasks: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
    tasks.push(Box::pin({
        let runtime = runtime.clone();
        let handler = handler.clone();
        async move {
            let _ = keel_grpc::server::serve_connection(server, handler, config, runtime).await;
        }
    }));
    tasks.push(Box::pin(async move {
        // Small writes, so the server sees frames split at arbitrary points. The write side
        // stays open (a client closing it at once would have h2 drop calls it never saw
        // through): the loop below ends the connection once nothing is left to do.
        for piece in data.chunks(997) {
            if client_tx.write_all(piece).await.is_err() {
                return;
            }
        }
        std::future::pending::<()>().await;
    }));
    tasks.push(Box::pin(async move {
        let mut sink = vec![0u8; 16 * 1024];
        while matches!(client_rx.read(&mut sink).await, Ok(n) if n > 0) {}
    }));
    let woken = Arc::new(WakeFlag::default());
    let waker = Waker::from(woken.clone());
    let mut cx = Context::from_waker(&waker);
    for _ in 0..HTTP2_ROUNDS_MAX {
        woken.0.store(false, Ordering::Relaxed);
        let before = tasks.len();
        tasks.retain_mut(|t| t.as_mut().poll(&mut cx).is_pending());
        let finished = tasks.len() < before;
        let spawned = !runtime.spawned.borrow().is_empty();
        tasks.append(&mut runtime.spawned.borrow_mut());
        // Every wake-up comes from these tasks (the duplex wakes its other end): a round that
        // woke nothing, finished nothing and spawned nothing leaves only timers to wait for.
        if tasks.is_empty() || !(woken.0.load(Ordering::Relaxed) || finished || spawned) {
            break;
        }
    }
    // Tasks still pending after the input ended wait on timers that never fire (idle streams
    // under a deadline): dropping them is what a closed connection does.
    drop(tasks);
    handler.messages.get()
}

/// Polls a future that needs no other task (the simulated disk answers at once).
fn run_now<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000_000 {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
    panic!("a simulated-disk operation never completed");
}

/// The WAL configuration of the fuzzed logs: small segments, so inputs span several.
fn wal_config() -> keel_io::wal::WalConfig {
    keel_io::wal::WalConfig {
        segment_bytes: 4 * keel_io::frame::BLOCK_BYTES as u64,
        batch_bytes_max: 8 * 1024,
        batch_records_max: 16,
        queue_records_max: 16,
        queue_bytes_max: 16 * 1024,
    }
}

/// WAL recovery (`Wal::open` over `io/src/sim.rs`'s in-memory store).
///
/// Mode 0 (raw): the input is the segments' bytes as found on disk. Mode 1 (written then
/// damaged): the input lists records, which a real WAL appends, then byte edits land on the
/// segments. Either way: open returns records or an error, never panics; when it opens, a
/// record appended now is recovered by the next open after the ones recovered before.
pub fn wal_recovery(data: &[u8]) {
    use keel_io::frame::Record;
    use keel_io::sim::SimStore;
    use keel_io::store::SegmentStore;
    use keel_io::wal::Wal;
    let data = bounded(data);
    let [mode, rest @ ..] = data else {
        return;
    };
    let config = wal_config();
    let segment_bytes = config.segment_bytes as usize;
    let store = SimStore::new(7);
    if mode % 2 == 0 {
        for (i, bytes) in rest.chunks(segment_bytes).take(4).enumerate() {
            let seq = i as u64 + 1;
            run_now(store.create(seq, config.segment_bytes)).expect("the sim disk creates");
            store.write_durable(seq, 0, bytes);
        }
    } else {
        let Some(edits_at) = rest.iter().position(|b| *b == 0xEE) else {
            return;
        };
        let (records, edits) = rest.split_at(edits_at);
        let (wal, _) = run_now(Wal::open(store.clone(), config.clone())).expect("an empty WAL");
        // Records: kind byte, length byte, payload; indices count up from 1.
        let mut index = 1;
        let mut at = 0;
        while at + 2 <= records.len() {
            let kind = records[at];
            let len = usize::from(records[at + 1]) * 8;
            let end = (at + 2 + len).min(records.len());
            let payload = Bytes::copy_from_slice(&records[at + 2..end]);
            at = end;
            let appended = run_now(wal.append(vec![Record {
                kind,
                index,
                payload,
            }]));
            if appended.is_err() {
                return;
            }
            index += 1;
        }
        drop(wal);
        // Edits: offset (u16) and xor mask, against the concatenated segments.
        let seqs = store.segment_seqs();
        for edit in edits[1..].chunks_exact(3) {
            let offset = usize::from(u16::from_le_bytes([edit[0], edit[1]]));
            let (seq_i, within) = (offset / segment_bytes, offset % segment_bytes);
            if let Some(seq) = seqs.get(seq_i % seqs.len().max(1)) {
                let old = store.durable_bytes(*seq)[within];
                store.write_durable(*seq, within, &[old ^ edit[2].max(1)]);
            }
        }
    }
    let Ok((wal, recovered)) = run_now(Wal::open(store.clone(), config.clone())) else {
        return;
    };
    let next = recovered.last().map_or(1, |r| r.index + 1);
    let record = Record {
        kind: 1,
        index: next,
        payload: Bytes::from_static(b"appended after recovery"),
    };
    if run_now(wal.append(vec![record.clone()])).is_err() {
        return;
    }
    drop(wal);
    let (_, again) =
        run_now(Wal::open(store, config)).expect("a WAL Keel opened and appended to opens again");
    let mut expected = recovered;
    expected.push(record);
    assert_eq!(
        again, expected,
        "reopening recovers what was there plus the append"
    );
}

/// Checkpoint loading: the core checkpoint file (`core/src/checkpoint.rs`) and the MVCC image
/// inside it (`kv/src/checkpoint.rs`), as a restart or an installed snapshot loads them.
///
/// Mode 0: the input is a checkpoint file. Mode 1: the input is a checkpoint file whose crc this
/// target appends. Mode 2: the input is an MVCC image payload whose header (key count from the
/// next byte, length, crcs) this target writes.
pub fn checkpoint_load(data: &[u8]) {
    let data = bounded(data);
    let [mode, rest @ ..] = data else {
        return;
    };
    match mode % 3 {
        0 => load_checkpoint_file(rest),
        1 => {
            let mut file = rest.to_vec();
            file.extend_from_slice(&crc32fast::hash(rest).to_le_bytes());
            load_checkpoint_file(&file);
        }
        _ => {
            let [key_count, payload @ ..] = rest else {
                return;
            };
            load_kv_image(&kv_image(u64::from(*key_count), payload));
        }
    }
}

/// A keel-kv checkpoint frame around `payload` (the header layout of `kv/src/checkpoint.rs`).
pub fn kv_image(key_count: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(keel_kv::CHECKPOINT_HEADER_BYTES + payload.len());
    out.extend_from_slice(b"KEELKVCP");
    // Format 2: versions may point into value-log segments.
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&key_count.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let header_crc = crc32fast::hash(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());
    assert_eq!(out.len(), keel_kv::CHECKPOINT_HEADER_BYTES);
    out.extend_from_slice(payload);
    out
}

fn load_checkpoint_file(bytes: &[u8]) {
    if let Ok(checkpoint) = keel_core::checkpoint::decode(bytes) {
        load_kv_image(&checkpoint.kv_image);
    }
}

/// Restores an MVCC image; one that restores is read whole (every key's history) and
/// checkpointed again, and the new image restores to the same revision and hash.
fn load_kv_image(image: &[u8]) {
    // Segment files as the fuzzer's image names them: 4 KiB of a byte derived from the id, so
    // pointers into them are checked against real bounds.
    let mut files = |id: u32| Ok(bytes::Bytes::from(vec![id as u8; 4096]));
    let options = keel_kv::ValueLogOptions::default();
    let Ok((writer, reader)) = keel_kv::Store::restore_with_segments(image, options, &mut files)
    else {
        return;
    };
    let revision = reader.current_revision();
    // Values behind pointers are the stand-in files' bytes, which no crc vouches for: reading
    // them stops the process by design (see `Version::value`), so only an image whose values
    // are all inline is read whole.
    let inline = keel_kv::checkpoint_segments(image).is_ok_and(|ids| ids.is_empty());
    let source = writer.checkpoint_source();
    let hash = if inline {
        source.hash()
    } else {
        Err(keel_kv::KvError::Compacted)
    };
    let again = writer.checkpoint();
    let (writer2, reader2) = keel_kv::Store::restore_with_segments(&again, options, &mut files)
        .expect("an image Keel wrote restores");
    assert_eq!(reader2.current_revision(), revision);
    if inline {
        assert_eq!(
            writer2.checkpoint_source().hash().ok(),
            hash.ok(),
            "a restored image checkpoints to the same hash"
        );
    }
}

/// Raft's own binary codec (`raft/src/types.rs`): every decoder, and the round trip of what
/// decodes.
///
/// Input: type selector, then the encoded value.
pub fn raft_message(data: &[u8]) {
    use keel_raft::{ConfChange, ConfState, Entry, HardState, Message, Snapshot};
    let data = bounded(data);
    let [selector, body @ ..] = data else {
        return;
    };
    macro_rules! round_trip {
        ($ty:ty) => {
            if let Ok(value) = <$ty>::decode(body) {
                let mut buf = Vec::new();
                value.encode(&mut buf);
                let again = <$ty>::decode(&buf).expect("what keel-raft encodes decodes");
                assert_eq!(again, value, "decode(encode(v)) differs from v");
            }
        };
    }
    match selector % 6 {
        0 => round_trip!(Message),
        1 => round_trip!(Entry),
        2 => round_trip!(HardState),
        3 => round_trip!(ConfState),
        4 => round_trip!(Snapshot),
        _ => round_trip!(ConfChange),
    }
}

/// The peer transport's handshake and frames (`core/src/peer.rs`): the byte stream of one
/// incoming connection, read as the transport reads it (length prefix under the frame limit,
/// the handshake, then frames until one is refused).
pub fn peer_frames(data: &[u8]) {
    use keel_core::peer::{
        frame_len, parse_frame, parse_hello, parse_members_reply, HANDSHAKE_BYTES_MAX,
    };
    const FRAME_BYTES_MAX: usize = 64 * 1024;
    let mut rest = bounded(data);
    let mut next = |max: usize| -> Option<&[u8]> {
        let prefix: [u8; 4] = rest.get(..4)?.try_into().ok()?;
        let len = frame_len(prefix, max).ok()?;
        let frame = rest.get(4..4 + len)?;
        rest = &rest[4 + len..];
        Some(frame)
    };
    let Some(hello) = next(HANDSHAKE_BYTES_MAX) else {
        return;
    };
    let Ok(hello) = parse_hello(hello) else {
        return;
    };
    // What a member dials back: each URL is text the handshake carried, no more of them
    // than its bytes could hold.
    assert!(hello.peer_urls.len() * 2 <= HANDSHAKE_BYTES_MAX);
    while let Some(frame) = next(FRAME_BYTES_MAX) {
        // A joining member reads a members reply from the same kind of stream.
        if let Ok((_, members)) = parse_members_reply(frame) {
            assert!(
                members.len() * 10 <= frame.len(),
                "each member takes 10 bytes at least"
            );
        }
        if parse_frame(frame, hello.from).is_err() {
            return;
        }
    }
}

/// Simple auth tokens as clients send them (etcd's "<16 letters>.<raft index>"): the index a
/// token names, and a lookup in a member's token table.
///
/// Input: the token's bytes (lossy UTF-8, as metadata reaches `auth::who` as text).
pub fn simple_token(data: &[u8]) {
    use keel_core::auth::tokens::{token_index, TokenTable};
    let token = String::from_utf8_lossy(bounded(data));
    if let Some(index) = token_index(&token) {
        // Only "prefix.index" parses, and the index is exactly the text after the one dot.
        let (prefix, rest) = token.split_once('.').expect("an index follows a dot");
        assert!(!prefix.contains('.') && !rest.contains('.'));
        assert_eq!(rest.parse::<u64>().ok(), Some(index));
    }
    // An unknown token resolves to nobody; the assigned one to its user until it expires.
    const KNOWN: &str = "abcdefghijklmnop.7";
    let mut table = TokenTable::default();
    table.assign(KNOWN.into(), "u", 0, 1_000);
    let known = token == KNOWN;
    assert_eq!(table.touch(&token, 1), known.then(|| "u".to_string()));
    assert_eq!(table.touch(&token, 5_000), None);
}

/// The claims part of a token, decoded without checking anything else.
pub fn jwt_claims_of(token: &str) -> Option<serde_json::Value> {
    use base64::Engine;
    let claims = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.replace(['\r', '\n'], ""))
        .ok()?;
    serde_json::Deserializer::from_slice(&bytes)
        .into_iter()
        .next()?
        .ok()
}

/// When the JWT fuzz target's clock stands (Unix seconds), and its tokens' TTL.
pub const JWT_NOW_S: u64 = 1_800_000_000;
const JWT_TTL_NS: i64 = 300_000_000_000;

/// The JWT providers the target checks tokens with: HS256, RS256 (PKCS#8 key), ES256 (SEC1).
pub fn jwt_providers() -> &'static [keel_core::auth::jwt::Jwt; 3] {
    use keel_core::auth::jwt::Jwt;
    static PROVIDERS: std::sync::OnceLock<[Jwt; 3]> = std::sync::OnceLock::new();
    PROVIDERS.get_or_init(|| {
        let make = |method: &str, key: &[u8]| {
            Jwt::from_key_material(method, None, Some(key), JWT_TTL_NS)
                .unwrap_or_else(|e| panic!("the {method} test key loads: {e}"))
        };
        [
            make("HS256", b"keel-fuzz-secret"),
            make(
                "RS256",
                include_bytes!("../../core/src/auth/testdata/rsa.pem"),
            ),
            make(
                "ES256",
                include_bytes!("../../core/src/auth/testdata/ec.pem"),
            ),
        ]
    })
}

/// JWT tokens as clients send them, checked as etcd's golang-jwt checks them; the claims
/// behind a valid signature; Keel's own tokens round-tripping; key files and `--auth-token`.
///
/// Input: mode byte, then
/// - 0: a token, checked by every provider;
/// - 1: claims bytes, signed by a provider chosen by the next byte, then checked (reaches the
///   claim checks the signature guards);
/// - 2: eight bytes of auth revision and a user name, signed and checked: must round-trip;
/// - 3: a key file, tried as the next byte's method's private and public key;
/// - other: an `--auth-token` value, decomposed (files are never read here).
pub fn jwt_token(data: &[u8]) {
    use keel_core::auth::jwt::{decompose, Jwt};
    let data = bounded(data);
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let now_s = JWT_NOW_S as i64;
    let now = std::time::UNIX_EPOCH + Duration::from_secs(JWT_NOW_S);
    let providers = jwt_providers();
    match mode {
        0 => {
            let token = String::from_utf8_lossy(rest);
            for p in providers {
                // What a token is accepted as is what its claims say.
                if let Some(info) = p.verify(&token, now_s) {
                    let claims = jwt_claims_of(&token).expect("an accepted token has claims");
                    assert_eq!(claims["username"].as_str(), Some(info.user.as_str()));
                }
            }
        }
        1 => {
            let [which, claims @ ..] = rest else {
                return;
            };
            let p = &providers[usize::from(*which) % providers.len()];
            let token = p.sign_payload(claims).expect("a test key signs");
            if let Some(info) = p.verify(&token, now_s) {
                // Only an object with a string user name and a numeric revision passes.
                let json: serde_json::Value = serde_json::Deserializer::from_slice(claims)
                    .into_iter()
                    .next()
                    .expect("verified claims are JSON")
                    .expect("verified claims are JSON");
                assert_eq!(json["username"].as_str(), Some(info.user.as_str()));
                assert!(json["revision"].is_number());
            }
        }
        2 => {
            let Some((revision, user)) = rest.split_first_chunk::<8>() else {
                return;
            };
            let revision = u64::from_le_bytes(*revision);
            let user = String::from_utf8_lossy(user);
            for p in providers {
                let token = p.sign(&user, revision, now).expect("a test key signs");
                let info = p.verify(&token, now_s).expect("our own token verifies");
                assert_eq!(info.user, user);
                // etcd reads the revision as a float64: exact below 2^53.
                if revision < (1 << 53) {
                    assert_eq!(info.revision, revision);
                }
                assert_eq!(p.verify(&token, now_s + 300), None, "expired");
            }
        }
        3 => {
            let [which, key @ ..] = rest else {
                return;
            };
            const METHODS: [&str; 6] = ["RS256", "PS384", "ES256", "ES384", "HS256", "RS512"];
            let method = METHODS[usize::from(*which) % METHODS.len()];
            for (public, private) in [(None, Some(key)), (Some(key), None)] {
                if let Ok(p) = Jwt::from_key_material(method, public, private, JWT_TTL_NS) {
                    // A key that loads works: it signs (or is verify-only) and checks.
                    if let Ok(token) = p.sign("u", 1, now) {
                        assert!(p.verify(&token, now_s).is_some());
                    } else {
                        assert!(p.verify_only());
                    }
                }
            }
        }
        _ => {
            let flag = String::from_utf8_lossy(rest);
            if let Ok((token_type, opts)) = decompose(&flag) {
                assert!(!token_type.contains(','));
                assert_eq!(opts.len(), flag.matches(',').count());
            }
        }
    }
}
