//! The seed corpus: well-formed inputs for every target, made by Keel's own encoders (and, for
//! HTTP/2, frames laid out by hand the way gRPC clients send them), so fuzzing starts from
//! inputs that reach deep into each parser.
//!
//! `corpus_seeds_are_current` checks the committed seeds match what this file makes; after a
//! format change, rewrite them with
//! `KEEL_FUZZ_WRITE_SEEDS=1 cargo test -p keel-fuzz --test seeds` and review the diff.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use keel_grpc::codec::encode_message;
use keel_io::frame::Record;
use keel_io::sim::SimStore;
use keel_io::wal::Wal;
use keel_proto::etcdserverpb as pb;
use keel_raft::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Message, MessageType,
    Snapshot, SnapshotMetadata,
};
use prost::Message as _;

/// Target name → seed file name → bytes.
type Seeds = BTreeMap<&'static str, BTreeMap<String, Vec<u8>>>;

fn put(key: &str, value: &str, lease: i64) -> pb::PutRequest {
    pb::PutRequest {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
        lease,
        prev_kv: true,
        ..Default::default()
    }
}

fn txn() -> pb::TxnRequest {
    pb::TxnRequest {
        compare: vec![pb::Compare {
            result: pb::compare::CompareResult::Equal as i32,
            target: pb::compare::CompareTarget::Mod as i32,
            key: Bytes::from_static(b"/registry/pods/a"),
            target_union: Some(pb::compare::TargetUnion::ModRevision(0)),
            range_end: Bytes::new(),
        }],
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(put(
                "/registry/pods/a",
                "v1",
                0,
            ))),
        }],
        failure: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                key: Bytes::from_static(b"/registry/pods/a"),
                ..Default::default()
            })),
        }],
    }
}

/// One encoded request per selector of `grpc_requests`, in selector order.
fn requests() -> Vec<(u8, &'static str, Vec<u8>)> {
    let range = pb::RangeRequest {
        key: Bytes::from_static(b"/registry/"),
        range_end: Bytes::from_static(b"/registry0"),
        limit: 500,
        revision: 7,
        sort_order: 1,
        sort_target: 2,
        count_only: false,
        max_mod_revision: 9,
        ..Default::default()
    };
    let watch = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: Bytes::from_static(b"/registry/"),
                range_end: Bytes::from_static(b"/registry0"),
                start_revision: 3,
                progress_notify: true,
                filters: vec![1],
                prev_kv: true,
                watch_id: 4,
                fragment: true,
            },
        )),
    };
    let member_add = pb::MemberAddRequest {
        peer_ur_ls: vec!["https://10.0.0.4:2380".into()],
        is_learner: true,
    };
    let internal = pb::InternalRaftRequest {
        id: 9,
        put: Some(put("k", "v", 5)),
        ..Default::default()
    };
    vec![
        (0, "range", range.encode_to_vec()),
        (1, "put", put("key", "value", 0x1234).encode_to_vec()),
        (
            2,
            "delete_range",
            pb::DeleteRangeRequest {
                key: Bytes::from_static(b"a"),
                range_end: Bytes::from_static(b"\0"),
                prev_kv: true,
            }
            .encode_to_vec(),
        ),
        (3, "txn", txn().encode_to_vec()),
        (
            4,
            "compaction",
            pb::CompactionRequest {
                revision: 42,
                physical: true,
            }
            .encode_to_vec(),
        ),
        (5, "watch", watch.encode_to_vec()),
        (
            6,
            "lease_grant",
            pb::LeaseGrantRequest { ttl: 60, id: 77 }.encode_to_vec(),
        ),
        (
            7,
            "lease_revoke",
            pb::LeaseRevokeRequest { id: 77 }.encode_to_vec(),
        ),
        (
            8,
            "lease_keepalive",
            pb::LeaseKeepAliveRequest { id: 77 }.encode_to_vec(),
        ),
        (
            9,
            "lease_ttl",
            pb::LeaseTimeToLiveRequest { id: 77, keys: true }.encode_to_vec(),
        ),
        (10, "member_add", member_add.encode_to_vec()),
        (
            14,
            "alarm",
            pb::AlarmRequest {
                action: 1,
                member_id: 3,
                alarm: 1,
            }
            .encode_to_vec(),
        ),
        (
            15,
            "hash_kv",
            pb::HashKvRequest { revision: 12 }.encode_to_vec(),
        ),
        (22, "internal_raft", internal.encode_to_vec()),
    ]
}

/// An HTTP/2 frame: 9-byte header, then the payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a small frame");
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK "literal header field without indexing, new name" for each pair (lengths < 127).
fn hpack(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0);
        out.push(u8::try_from(name.len()).expect("short name"));
        out.extend_from_slice(name.as_bytes());
        out.push(u8::try_from(value.len()).expect("short value"));
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// A gRPC client's connection: preface, SETTINGS, then each call as HEADERS + DATA.
fn h2_connection(calls: &[(&str, Vec<u8>)]) -> Vec<u8> {
    const HEADERS: u8 = 1;
    const SETTINGS: u8 = 4;
    const DATA: u8 = 0;
    const WINDOW_UPDATE: u8 = 8;
    const PING: u8 = 6;
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE = 4 MiB, SETTINGS_MAX_FRAME_SIZE = 16 KiB.
    out.extend(h2_frame(
        SETTINGS,
        0,
        0,
        &[0, 4, 0, 0x40, 0, 0, 0, 5, 0, 0, 0x40, 0],
    ));
    out.extend(h2_frame(WINDOW_UPDATE, 0, 0, &[0, 0x0f, 0, 1]));
    for (i, (path, body)) in calls.iter().enumerate() {
        let stream = 1 + 2 * u32::try_from(i).expect("few calls");
        out.extend(h2_frame(
            HEADERS,
            0x4,
            stream,
            &hpack(&[
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "127.0.0.1:2379"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                ("grpc-timeout", "5S"),
            ]),
        ));
        out.extend(h2_frame(DATA, 0x1, stream, body));
    }
    out.extend(h2_frame(PING, 0, 0, b"keelping"));
    out.extend(h2_frame(SETTINGS, 0x1, 0, &[]));
    out
}

fn wal_config() -> keel_io::wal::WalConfig {
    keel_io::wal::WalConfig {
        segment_bytes: 4 * keel_io::frame::BLOCK_BYTES as u64,
        batch_bytes_max: 8 * 1024,
        batch_records_max: 16,
        queue_records_max: 16,
        queue_bytes_max: 16 * 1024,
    }
}

/// Polls a simulated-disk future to completion (it never waits on anything else).
fn run_now<F: std::future::Future>(future: F) -> F::Output {
    futures_lite::future::block_on(future)
}

/// The raw segments of a WAL that appended `records` batches of records.
fn wal_segments(batches: &[Vec<(u8, Vec<u8>)>]) -> Vec<u8> {
    let store = SimStore::new(1);
    let (wal, _) = run_now(Wal::open(store.clone(), wal_config())).expect("an empty WAL");
    let mut index = 1;
    for batch in batches {
        let records = batch
            .iter()
            .map(|(kind, payload)| {
                index += 1;
                Record {
                    kind: *kind,
                    index: index - 1,
                    payload: Bytes::copy_from_slice(payload),
                }
            })
            .collect();
        run_now(wal.append(records)).expect("the sim disk appends");
    }
    drop(wal);
    let mut out = vec![0u8]; // mode 0: raw segments
    for seq in store.segment_seqs() {
        out.extend(store.durable_bytes(seq));
    }
    // Trailing zeros add nothing a mutation needs; keep the file small.
    while out.len() > 1 && out.last() == Some(&0) {
        out.pop();
    }
    out
}

/// A keel-kv image of a store with puts, a lease, a delete and a compaction.
fn kv_image() -> Vec<u8> {
    use keel_kv as kv;
    let (mut writer, _reader) = kv::Store::new();
    let ops = [
        kv::Op::LeaseGrant(kv::LeaseGrantRequest { id: 5, ttl_s: 60 }),
        kv::Op::Put(kv::PutRequest {
            key: Bytes::from_static(b"a"),
            value: Bytes::from_static(b"1"),
            lease: 5,
            prev_kv: false,
            ignore_value: false,
            ignore_lease: false,
        }),
        kv::Op::Put(kv::PutRequest {
            key: Bytes::from_static(b"b"),
            value: Bytes::from_static(b"two"),
            lease: 0,
            prev_kv: false,
            ignore_value: false,
            ignore_lease: false,
        }),
        kv::Op::Put(kv::PutRequest {
            key: Bytes::from_static(b"a"),
            value: Bytes::from_static(b"3"),
            lease: 0,
            prev_kv: false,
            ignore_value: false,
            ignore_lease: false,
        }),
        kv::Op::DeleteRange(kv::DeleteRangeRequest {
            key: Bytes::from_static(b"b"),
            range_end: Bytes::new(),
            prev_kv: false,
        }),
    ];
    for (i, op) in ops.iter().enumerate() {
        writer.apply(i as u64 + 1, op).expect("the op applies");
    }
    writer.checkpoint()
}

fn checkpoint_file() -> Vec<u8> {
    let members = vec![keel_core::ids::Member {
        id: 0x8e9e05c52164694d,
        name: "n0".into(),
        peer_urls: vec!["https://127.0.0.1:2380".into()],
        client_urls: vec!["http://127.0.0.1:2379".into()],
        is_learner: false,
    }];
    keel_core::checkpoint::encode(
        6,
        2,
        &ConfState {
            voters: vec![0x8e9e05c52164694d],
            learners: vec![3],
        },
        keel_core::checkpoint::ClusterState {
            members: &members,
            alarms: &[],
            auth: &keel_core::auth::AuthImage::default(),
            removed: &[0x1234],
        },
        &kv_image(),
    )
}

fn raft_message() -> Message {
    Message {
        msg_type: MessageType::Append,
        to: 2,
        from: 1,
        term: 3,
        log_term: 3,
        index: 10,
        entries: vec![
            Entry {
                entry_type: EntryType::Normal,
                term: 3,
                index: 11,
                data: Bytes::from(
                    pb::InternalRaftRequest {
                        id: 1,
                        put: Some(put("k", "v", 0)),
                        ..Default::default()
                    }
                    .encode_to_vec(),
                ),
            },
            Entry {
                entry_type: EntryType::ConfChange,
                term: 3,
                index: 12,
                data: Bytes::from_static(b"\x01\x02"),
            },
        ],
        commit: 10,
        context: Bytes::from_static(b"read-1"),
        ..Default::default()
    }
}

fn encoded(encode: impl FnOnce(&mut Vec<u8>), selector: u8) -> Vec<u8> {
    let mut out = vec![selector];
    encode(&mut out);
    out
}

/// A peer connection: the hello, then frames of each kind.
fn peer_stream() -> Vec<u8> {
    fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = (u32::try_from(body.len() + 1).expect("small"))
            .to_be_bytes()
            .to_vec();
        out.push(kind);
        out.extend_from_slice(body);
        out
    }
    let mut out = keel_core::peer::encode_hello(&keel_core::peer::Hello {
        cluster_id: 0xcdf818194e3a8c32,
        from: 1,
        to: 2,
        peer_urls: vec!["http://127.0.0.1:2380".into()],
    });
    let mut raft = Vec::new();
    raft_message_from(1).encode(&mut raft);
    out.extend(frame(0, &raft));
    let mut keepalive = 9u64.to_be_bytes().to_vec();
    keepalive.extend(77i64.to_be_bytes());
    out.extend(frame(1, &keepalive));
    out.extend(frame(2, &keepalive));
    let mut hashkv = 10u64.to_be_bytes().to_vec();
    hashkv.extend(5i64.to_be_bytes());
    out.extend(frame(3, &hashkv));
    let mut reply = 10u64.to_be_bytes().to_vec();
    reply.push(0);
    reply.extend(0xdeadbeefu32.to_be_bytes());
    reply.extend(2i64.to_be_bytes());
    reply.extend(5i64.to_be_bytes());
    out.extend(frame(4, &reply));
    let mut refused = vec![1, 2];
    refused.extend(33u64.to_be_bytes());
    out.extend(frame(5, &refused));
    out
}

fn raft_message_from(from: u64) -> Message {
    Message {
        from,
        ..raft_message()
    }
}

fn seeds() -> Seeds {
    let mut seeds: Seeds = BTreeMap::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| {
        seeds
            .entry(target)
            .or_default()
            .insert(format!("seed-{name}"), bytes);
    };
    // grpc_framing: limit selector (×64 bytes), chunk size, stream.
    let one = encode_message(&put("k", "v", 0), 1 << 20).expect("small");
    let two = encode_message(&txn(), 1 << 20).expect("small");
    add("grpc_framing", "one", [&[255, 7][..], &one].concat());
    add("grpc_framing", "two", [&[255, 3][..], &one, &two].concat());
    add(
        "grpc_framing",
        "compressed",
        [&[255, 64][..], &[1, 0, 0, 0, 1, 0]].concat(),
    );
    add(
        "grpc_framing",
        "too_large",
        [&[1, 255][..], &[0, 0, 0, 0x10, 0], &[0; 80]].concat(),
    );
    add("grpc_framing", "timeout", [&[0, 1][..], b"100m"].concat());
    for (selector, name, body) in requests() {
        add("grpc_requests", name, [&[selector][..], &body].concat());
    }
    add(
        "http2_server",
        "range",
        h2_connection(&[(
            "/etcdserverpb.KV/Range",
            encode_message(
                &pb::RangeRequest {
                    key: Bytes::from_static(b"k"),
                    ..Default::default()
                },
                1 << 20,
            )
            .expect("small")
            .to_vec(),
        )]),
    );
    add(
        "http2_server",
        "two_calls",
        h2_connection(&[
            ("/etcdserverpb.KV/Put", one.to_vec()),
            ("/etcdserverpb.KV/Txn", [&two[..], &one[..]].concat()),
        ]),
    );
    add(
        "http2_server",
        "http1_health",
        b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:2379\r\n\r\nPOST /v3/kv/range HTTP/1.1\r\nContent-Length: 11\r\n\r\n{\"key\":\"a\"}".to_vec(),
    );
    add(
        "wal_recovery",
        "segments",
        wal_segments(&[
            vec![(1, b"first".to_vec()), (2, vec![7; 300])],
            vec![(1, vec![9; 5000])],
            vec![(3, Vec::new()), (1, b"last".to_vec())],
        ]),
    );
    add(
        "wal_recovery",
        "many_batches",
        wal_segments(
            &(0..12)
                .map(|i| vec![(1, vec![i; 2000])])
                .collect::<Vec<_>>(),
        ),
    );
    // Mode 1: records (kind, length / 8, payload), 0xEE, then edits (offset u16 LE, xor).
    add(
        "wal_recovery",
        "damaged",
        [
            &[1u8, 1, 2][..],
            &[0x11; 16],
            &[2, 40],
            &[0x22; 320],
            &[0xEE, 0x30, 0x00, 0x01, 0x10, 0x01, 0x80],
        ]
        .concat(),
    );
    let file = checkpoint_file();
    add("checkpoint_load", "file", [&[0u8][..], &file].concat());
    add(
        "checkpoint_load",
        "file_without_crc",
        [&[1u8][..], &file[..file.len() - 4]].concat(),
    );
    let image = kv_image();
    let key_count = u64::from_le_bytes(image[24..32].try_into().expect("8 bytes"));
    add(
        "checkpoint_load",
        "kv_payload",
        [
            &[2u8, u8::try_from(key_count).expect("few keys")][..],
            &image[keel_kv::CHECKPOINT_HEADER_BYTES..],
        ]
        .concat(),
    );
    add(
        "raft_message",
        "append",
        encoded(|b| raft_message().encode(b), 0),
    );
    add(
        "raft_message",
        "snapshot_message",
        encoded(
            |b| {
                Message {
                    msg_type: MessageType::Snapshot,
                    snapshot: Some(Snapshot {
                        metadata: SnapshotMetadata {
                            conf_state: ConfState {
                                voters: vec![1, 2, 3],
                                learners: vec![],
                            },
                            index: 40,
                            term: 4,
                        },
                        data: Bytes::from_static(b"image"),
                    }),
                    ..raft_message()
                }
                .encode(b)
            },
            0,
        ),
    );
    add(
        "raft_message",
        "entry",
        encoded(|b| raft_message().entries[0].encode(b), 1),
    );
    add(
        "raft_message",
        "hard_state",
        encoded(
            |b| {
                HardState {
                    term: 5,
                    vote: 2,
                    commit: 99,
                }
                .encode(b)
            },
            2,
        ),
    );
    add(
        "raft_message",
        "conf_change",
        encoded(
            |b| {
                ConfChange {
                    change_type: ConfChangeType::AddLearnerNode,
                    node_id: 4,
                    context: Bytes::from_static(b"{\"name\":\"n3\"}"),
                }
                .encode(b)
            },
            5,
        ),
    );
    add("peer_frames", "stream", peer_stream());
    // A snapshot stream: begin, a checkpoint chunk, a segment chunk, then the raft message.
    let mut snapshot = keel_core::peer::encode_hello(&keel_core::peer::Hello {
        cluster_id: 0xcdf818194e3a8c32,
        from: 1,
        to: 2,
        peer_urls: vec!["http://127.0.0.1:2380".into()],
    });
    {
        use keel_core::peer_snapshot::{encode_begin, encode_chunk_header, ChunkHeader, Part};
        snapshot.extend(encode_begin(7, 3));
        let chunks: [(Part, &[u8]); 2] = [(Part::Checkpoint, b"abc"), (Part::Segment(5), b"data")];
        for (part, body) in chunks {
            let header = ChunkHeader {
                part,
                offset: 0,
                file_bytes: body.len() as u64,
            };
            snapshot.extend(encode_chunk_header(header, body.len()));
            snapshot.extend_from_slice(body);
        }
        let mut raft = vec![0u8];
        raft_message_from(1).encode(&mut raft);
        snapshot.extend((raft.len() as u32).to_be_bytes());
        snapshot.extend(raft);
    }
    add("peer_frames", "snapshot_stream", snapshot);
    // The removed notice a member writes back to a removed member that dialed it.
    let mut removed = keel_core::peer::encode_hello(&keel_core::peer::Hello {
        cluster_id: 0xcdf818194e3a8c32,
        from: 1,
        to: 2,
        peer_urls: vec!["http://127.0.0.1:2380".into()],
    });
    removed.extend(keel_core::peer::encode_member_removed());
    add("peer_frames", "removed_notice", removed);
    // A quiet dialer's link heartbeat (an empty frame of kind 8), then a raft message.
    let mut link = keel_core::peer::encode_hello(&keel_core::peer::Hello {
        cluster_id: 0xcdf818194e3a8c32,
        from: 1,
        to: 2,
        peer_urls: vec!["http://127.0.0.1:2380".into()],
    });
    link.extend([0, 0, 0, 1, 8]);
    let mut raft = vec![0u8];
    raft_message_from(1).encode(&mut raft);
    link.extend((raft.len() as u32).to_be_bytes());
    link.extend(raft);
    add("peer_frames", "link_heartbeat", link);
    add(
        "peer_frames",
        "hello_only",
        keel_core::peer::encode_hello(&keel_core::peer::Hello {
            cluster_id: 0,
            from: 7,
            to: 8,
            peer_urls: vec!["http://127.0.0.1:2380".into()],
        }),
    );
    // An older build's handshake (version 1: the fixed part alone, no URLs), then a frame.
    let mut v1 = keel_core::peer::encode_hello(&keel_core::peer::Hello {
        cluster_id: 0xcdf818194e3a8c32,
        from: 1,
        to: 2,
        peer_urls: Vec::new(),
    });
    v1.extend(keel_core::peer::encode_member_removed());
    add("peer_frames", "hello_v1", v1);
    // simple_token: etcd's shape, and near misses.
    for (name, token) in [
        ("known", "abcdefghijklmnop.7"),
        ("other", "QmDpLxwZsWjTvRnK.12345"),
        ("no_dot", "QmDpLxwZsWjTvRnK"),
        ("two_dots", "a.b.3"),
        ("not_a_number", "QmDpLxwZsWjTvRnK.-1"),
    ] {
        add("simple_token", name, token.as_bytes().to_vec());
    }
    // jwt_token: tokens (mode 0) signed with the target's keys, by Keel (HS256, RS256: both
    // deterministic) and by etcd (testdata/etcd-tokens.txt); claims to sign (1); a user to
    // round-trip (2); key files (3); --auth-token values (4).
    let providers = keel_fuzz::jwt_providers();
    let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(keel_fuzz::JWT_NOW_S);
    for (i, p) in providers[..2].iter().enumerate() {
        let token = p.sign("root", 4, now).expect("a test key signs");
        add(
            "jwt_token",
            &format!("token_{i}"),
            [&[0][..], token.as_bytes()].concat(),
        );
    }
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core/src/auth/testdata");
    let read = |name: &str| std::fs::read(testdata.join(name)).expect("a testdata file");
    let etcd_tokens = String::from_utf8(read("etcd-tokens.txt")).expect("text");
    for line in etcd_tokens.lines() {
        let (method, token) = line.split_once(' ').expect("METHOD TOKEN");
        add(
            "jwt_token",
            &format!("etcd_{method}"),
            [&[0][..], token.as_bytes()].concat(),
        );
    }
    for (name, which, claims) in [
        (
            "claims",
            0u8,
            r#"{"exp":1800000100,"revision":4,"username":"root"}"#,
        ),
        (
            "claims_times",
            0,
            r#"{"exp":1800000100.5,"iat":1799999999,"nbf":1800000000,"revision":4.5,"username":"a"}"#,
        ),
        (
            "claims_types",
            1,
            r#"{"exp":null,"revision":"4","username":7}"#,
        ),
        (
            "claims_ec",
            2,
            r#"{"revision":4,"username":"root"} trailing"#,
        ),
    ] {
        add(
            "jwt_token",
            name,
            [&[1, which][..], claims.as_bytes()].concat(),
        );
    }
    add(
        "jwt_token",
        "round_trip",
        [
            &[2][..],
            &9u64.to_le_bytes(),
            "al<i>ce\u{2028}\n".as_bytes(),
        ]
        .concat(),
    );
    for (name, which, file) in [
        ("rsa_pkcs8", 0u8, "rsa.pem"),
        ("rsa_pkcs1", 0, "rsa-pkcs1.pem"),
        ("rsa_public", 1, "rsa.pub"),
        ("rsa_certificate", 5, "rsa-cert.pem"),
        ("ec_sec1", 2, "ec.pem"),
        ("ec_pkcs8", 2, "ec-pkcs8.pem"),
        ("ec_public", 2, "ec.pub"),
        ("ec_p384", 3, "ec384.pem"),
    ] {
        add("jwt_token", name, [&[3, which][..], &read(file)].concat());
    }
    add(
        "jwt_token",
        "flag",
        [
            &[4][..],
            b"jwt,pub-key=a.pub,priv-key=a.key,sign-method=RS256,ttl=5m",
        ]
        .concat(),
    );
    seeds
}

#[test]
fn corpus_seeds_are_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = std::env::var_os("KEEL_FUZZ_WRITE_SEEDS").is_some();
    for (target, files) in seeds() {
        let dir = root.join(target);
        for (name, bytes) in files {
            let path = dir.join(&name);
            if write {
                std::fs::create_dir_all(&dir).expect("the corpus directory");
                std::fs::write(&path, &bytes).expect("the seed is written");
            } else {
                let committed = std::fs::read(&path).unwrap_or_else(|e| {
                    panic!(
                        "{}: {e}; rewrite the seeds (see the module docs)",
                        path.display()
                    )
                });
                assert!(
                    committed == bytes,
                    "{} is stale; rewrite the seeds (see the module docs)",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn http2_seeds_reach_the_handler() {
    let seeds = seeds();
    let h2 = &seeds["http2_server"];
    assert_eq!(keel_fuzz::http2_serve(&h2["seed-range"]), 1);
    assert_eq!(keel_fuzz::http2_serve(&h2["seed-two_calls"]), 3);
}

#[test]
fn checksum_fixing_modes_reach_past_the_checksums() {
    // The kv payload seed, framed by the target's own header, restores: the fuzzer's edits to
    // it are judged by the archive's validation, not by a crc.
    let seeds = seeds();
    let payload = &seeds["checkpoint_load"]["seed-kv_payload"];
    let image = keel_fuzz::kv_image(u64::from(payload[1]), &payload[2..]);
    assert!(keel_kv::Store::restore(&image).is_ok());
    let file = &seeds["checkpoint_load"]["seed-file_without_crc"][1..];
    let mut with_crc = file.to_vec();
    with_crc.extend(crc32fast::hash(file).to_le_bytes());
    assert!(keel_core::checkpoint::decode(&with_crc).is_ok());
}

#[test]
fn jwt_seeds_reach_past_the_signature() {
    // Keel's and etcd's tokens in the corpus verify under the target's keys at its clock, so
    // mutations start from inputs that reach the claim checks.
    let seeds = seeds();
    let jwt = &seeds["jwt_token"];
    let providers = keel_fuzz::jwt_providers();
    let now_s = keel_fuzz::JWT_NOW_S as i64;
    for (seed, provider) in [
        ("seed-token_0", 0),
        ("seed-token_1", 1),
        ("seed-etcd_RS256", 1),
        ("seed-etcd_ES256", 2),
    ] {
        let token = std::str::from_utf8(&jwt[seed][1..]).expect("text");
        let info = providers[provider].verify(token, now_s);
        assert_eq!(info.map(|i| i.user), Some("root".to_string()), "{seed}");
    }
}
