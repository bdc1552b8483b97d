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
    config
        .compile_fds(fds)
        .expect("prost code generation must succeed for our own protos");
}
