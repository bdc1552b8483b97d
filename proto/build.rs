//! Compiles our .proto files with protox (pure Rust), so a fresh machine needs no system protoc.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "proto/mvccpb/kv.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/etcdserverpb/raft_internal.proto",
    "proto/v3lockpb/v3lock.proto",
    "proto/v3electionpb/v3election.proto",
    "proto/grpc_health_v1/health.proto",
];

fn main() {
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(PROTOS, ["proto"]).expect("our .proto files must compile");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut config = prost_build::Config::new();
    // Bytes fields let range responses hand out slices of the value log without copies.
    config.bytes(["."]);
    config.out_dir(&out);
    let descriptors = prost::Message::encode_to_vec(&fds);
    config
        .compile_fds(fds)
        .expect("prost code generation must succeed for our own protos");
    // serde impls in proto3's JSON mapping for the JSON gateway. etcd's gateway keeps the
    // .proto field names (grpc-gateway's OrigName), so ours do too; both spellings are read.
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)
        .expect("our descriptors register")
        .out_dir(&out)
        .preserve_proto_field_names()
        // grpc-gateway ignores fields it does not know.
        .ignore_unknown_fields()
        .build(&[
            ".etcdserverpb",
            ".mvccpb",
            ".authpb",
            ".v3lockpb",
            ".v3electionpb",
        ])
        .expect("pbjson code generation must succeed for our own protos");
}
