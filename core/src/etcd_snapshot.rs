//! etcd 3.4's snapshot, both ways: the bbolt database etcd keeps as its backend (and streams
//! from Maintenance.Snapshot), in etcd's schema, followed by its SHA-256.
//!
//! Buckets, as etcd 3.4 writes them (mvcc/kvstore.go, mvcc/revision.go, lease/lessor.go,
//! etcdserver/api/membership/store.go, etcdserver/api/v3alarm):
//! - `key`: revision bytes (`main` u64 BE, `_`, `sub` u64 BE; a tombstone adds `t`) →
//!   a marshaled `mvccpb.KeyValue` (a tombstone's holds only the key);
//! - `meta`: `consistent_index` (u64 BE), `scheduledCompactRev` and `finishedCompactRev`
//!   (revision bytes with sub 0), present once a compaction happened;
//! - `lease`: lease id (i64 BE) → marshaled `leasepb.Lease {ID, TTL}`;
//! - `members`: hex member id → the member as JSON; `members_removed`: hex id → "removed";
//! - `cluster`: `clusterVersion` → "3.4.0"; `alarm`: marshaled `AlarmMember` → empty;
//! - `auth` (auth/store.go): `authRevision` (u64 BE) and, once auth was enabled, `authEnabled`
//!   (one byte, 1 or 0); `authUsers`: user name → marshaled `authpb.User` (the bcrypt hash as
//!   the password, granted roles sorted, the add options); `authRoles`: role name → marshaled
//!   `authpb.Role` with its key permissions sorted by key. etcd grants the `root` role without
//!   needing a record of it, so `root` has one only when it was added (etcdctl's `auth enable`
//!   adds it).
//!
//! Export ([`write_db`]) reads a consistent capture of the store (keel-kv's `CheckpointSource`)
//! off the raft core; import ([`read_db`]) reads any etcd 3.4 backend page by page.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use keel_kv as kv;
use keel_kv::bbolt::{BoltReader, BoltWriter, PageSource};
use keel_proto::authpb;
use keel_proto::etcdserverpb as pb;
use keel_proto::mvccpb;
use prost::Message;
use serde::Serialize;
use sha2::Digest;

use crate::auth::store::{PermRecord, UserRecord};
use crate::auth::AuthImage;
use crate::error::CoreError;
use crate::shared::SnapshotSource;

/// The cluster version a Keel snapshot declares: the etcd API Keel speaks.
pub const CLUSTER_VERSION: &str = "3.4.0";
/// A trailing SHA-256, as `etcdctl snapshot save` keeps it.
pub const SHA256_BYTES: u64 = 32;

const BUCKET_KEY: &[u8] = b"key";
const BUCKET_META: &[u8] = b"meta";
const BUCKET_LEASE: &[u8] = b"lease";
const META_CONSISTENT_INDEX: &[u8] = b"consistent_index";
const META_SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
const META_FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
const BUCKET_AUTH: &[u8] = b"auth";
const BUCKET_AUTH_USERS: &[u8] = b"authUsers";
const BUCKET_AUTH_ROLES: &[u8] = b"authRoles";
const AUTH_ENABLED: &[u8] = b"authEnabled";
const AUTH_REVISION: &[u8] = b"authRevision";
const REV_BYTES: usize = 17;
const TOMBSTONE_MARK: u8 = b't';

/// etcd's `leasepb.Lease` (lease/leasepb/lease.proto).
#[derive(Clone, PartialEq, prost::Message)]
struct LeasePb {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(int64, tag = "2")]
    ttl: i64,
    #[prost(int64, tag = "3")]
    remaining_ttl: i64,
}

/// etcd's `membership.Member` as it marshals it into the `members` bucket.
#[derive(Serialize)]
struct EtcdMember<'a> {
    id: u64,
    #[serde(rename = "peerURLs")]
    peer_urls: &'a [String],
    #[serde(rename = "isLearner", skip_serializing_if = "std::ops::Not::not")]
    is_learner: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    name: &'a str,
    #[serde(rename = "clientURLs", skip_serializing_if = "<[String]>::is_empty")]
    client_urls: &'a [String],
}

fn rev_bytes(rev: kv::Revision) -> [u8; REV_BYTES] {
    let mut b = [0u8; REV_BYTES];
    b[..8].copy_from_slice(&(rev.main as u64).to_be_bytes());
    b[8] = b'_';
    b[9..].copy_from_slice(&(rev.sub as u64).to_be_bytes());
    b
}

fn parse_rev(b: &[u8]) -> Option<kv::Revision> {
    if b.len() < REV_BYTES || b[8] != b'_' {
        return None;
    }
    Some(kv::Revision {
        main: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")) as i64,
        sub: u64::from_be_bytes(b[9..17].try_into().expect("8 bytes")) as i64,
    })
}

fn snapshot_error(e: impl std::fmt::Display) -> CoreError {
    CoreError::Snapshot(e.to_string())
}

/// Writes `snap` as an etcd 3.4 backend database into `out` (at its start); returns `out` and
/// the database's size. Fails with keel-kv's `Compacted` when a compaction started after the
/// capture: take a new capture and retry.
pub fn write_db<W: Write + Seek>(snap: &SnapshotSource, out: W) -> Result<(W, u64), kv::KvError> {
    let mut w = BoltWriter::new(out)?;
    // Top-level buckets in name order, as bbolt keeps them.
    w.begin_bucket(b"alarm")?;
    let mut alarms: Vec<Vec<u8>> = snap
        .alarms
        .iter()
        .map(|a| {
            pb::AlarmMember {
                member_id: a.member_id,
                alarm: a.alarm,
            }
            .encode_to_vec()
        })
        .collect();
    alarms.sort();
    alarms.dedup();
    for a in &alarms {
        w.put(a, b"")?;
    }
    w.end_bucket()?;

    write_auth(&mut w, &snap.auth)?;

    w.begin_bucket(b"cluster")?;
    w.put(b"clusterVersion", CLUSTER_VERSION.as_bytes())?;
    w.end_bucket()?;

    w.begin_bucket(BUCKET_KEY)?;
    let mut buf = Vec::new();
    snap.source.for_each_by_revision(&mut |v| {
        let mut key = rev_bytes(v.rev).to_vec();
        let kv_pb = if v.tombstone {
            key.push(TOMBSTONE_MARK);
            mvccpb::KeyValue {
                key: v.key,
                ..Default::default()
            }
        } else {
            mvccpb::KeyValue {
                key: v.key,
                create_revision: v.create_revision,
                mod_revision: v.rev.main,
                version: v.version,
                value: v.value,
                lease: v.lease,
            }
        };
        buf.clear();
        kv_pb
            .encode(&mut buf)
            .expect("a Vec grows to hold any message");
        w.put(&key, &buf)
    })?;
    w.end_bucket()?;

    w.begin_bucket(BUCKET_LEASE)?;
    let mut leases: Vec<(i64, i64)> = snap.source.leases().to_vec();
    leases.sort_unstable_by_key(|(id, _)| (*id as u64).to_be_bytes());
    for (id, ttl_s) in leases {
        let value = LeasePb {
            id,
            ttl: ttl_s,
            remaining_ttl: 0,
        }
        .encode_to_vec();
        w.put(&id.to_be_bytes(), &value)?;
    }
    w.end_bucket()?;

    w.begin_bucket(b"members")?;
    let mut members: Vec<(String, Vec<u8>)> = snap
        .members
        .iter()
        .map(|m| {
            let json = serde_json::to_vec(&EtcdMember {
                id: m.id,
                peer_urls: &m.peer_urls,
                is_learner: m.is_learner,
                name: &m.name,
                client_urls: &m.client_urls,
            })
            .expect("a member serializes");
            (format!("{:x}", m.id), json)
        })
        .collect();
    members.sort();
    for (id, json) in &members {
        w.put(id.as_bytes(), json)?;
    }
    w.end_bucket()?;
    w.begin_bucket(b"members_removed")?;
    // etcd's keys: the id in hex, as in `members`; its value: the word "removed".
    let mut removed: Vec<String> = snap.removed.iter().map(|id| format!("{id:x}")).collect();
    removed.sort();
    for id in &removed {
        w.put(id.as_bytes(), b"removed")?;
    }
    w.end_bucket()?;

    w.begin_bucket(BUCKET_META)?;
    w.put(META_CONSISTENT_INDEX, &snap.index.to_be_bytes())?;
    let compact_rev = snap.source.compact_revision();
    if compact_rev > 0 {
        let compact = rev_bytes(kv::Revision {
            main: compact_rev,
            sub: 0,
        });
        // Both equal: the compaction is finished (a restart need not resume it).
        w.put(META_FINISHED_COMPACT, &compact)?;
        w.put(META_SCHEDULED_COMPACT, &compact)?;
    }
    w.end_bucket()?;
    w.finish()
}

/// The auth store's three buckets (`auth`, `authRoles`, `authUsers`, in bbolt's name order),
/// as etcd's auth store writes them.
fn write_auth<W: Write + Seek>(w: &mut BoltWriter<W>, auth: &AuthImage) -> Result<(), kv::KvError> {
    w.begin_bucket(BUCKET_AUTH)?;
    // etcd writes the flag on the first enable and rewrites it on every enable or disable; a
    // store that was never enabled has none. An enabled store must carry it; a disabled one
    // reads the same with or without it, so Keel (which does not remember whether auth was
    // ever on) writes it only when enabled, as a never-enabled etcd does.
    if auth.enabled {
        w.put(AUTH_ENABLED, &[1])?;
    }
    // etcd commits revision 1 when it creates the buckets, so the key is always there.
    w.put(AUTH_REVISION, &auth.revision.max(1).to_be_bytes())?;
    w.end_bucket()?;

    w.begin_bucket(BUCKET_AUTH_ROLES)?;
    let mut roles: Vec<&(String, Vec<PermRecord>)> = auth.roles.iter().collect();
    roles.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    for (name, perms) in roles {
        let role = authpb::Role {
            name: bytes::Bytes::copy_from_slice(name.as_bytes()),
            key_permission: perms.iter().map(PermRecord::to_pb).collect(),
        };
        w.put(name.as_bytes(), &role.encode_to_vec())?;
    }
    w.end_bucket()?;

    w.begin_bucket(BUCKET_AUTH_USERS)?;
    let mut users: Vec<&UserRecord> = auth.users.iter().collect();
    users.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    for u in users {
        let user = authpb::User {
            name: bytes::Bytes::copy_from_slice(u.name.as_bytes()),
            // etcd keeps the bcrypt hash as it is ("$2a$..."); a no-password user has none.
            password: bytes::Bytes::copy_from_slice(u.password_hash.as_bytes()),
            roles: u.roles.clone(),
            // etcd's UserAdd always stores the options, and every later rewrite keeps them.
            options: Some(authpb::UserAddOptions {
                no_password: u.no_password,
            }),
        };
        w.put(u.name.as_bytes(), &user.encode_to_vec())?;
    }
    w.end_bucket()
}

/// Bytes of one Maintenance.Snapshot message.
pub const CHUNK_BYTES: usize = 1024 * 1024;

/// A database written for one Maintenance.Snapshot stream: a file in the data directory's
/// `snap/` folder, unlinked as soon as it is created, so nothing is left behind whether the
/// stream ends, fails or the process dies; the open descriptor keeps it readable meanwhile.
pub struct TempDb {
    file: std::fs::File,
    size_bytes: u64,
}

impl TempDb {
    /// Writes `snap` (see [`write_db`]); runs on a blocking thread, never on the raft core.
    pub fn write(data_dir: &Path, snap: &SnapshotSource) -> Result<TempDb, kv::KvError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let io = |what: &str, e: std::io::Error| kv::KvError::Bolt(format!("{what}: {e}"));
        let dir = data_dir.join("snap");
        std::fs::create_dir_all(&dir).map_err(|e| io("snapshot folder", e))?;
        let path = dir.join(format!(
            "etcd-snapshot-{}-{}.db.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io("temporary snapshot file", e))?;
        std::fs::remove_file(&path).map_err(|e| io("unlinking the temporary snapshot", e))?;
        let (writer, size_bytes) =
            write_db(snap, std::io::BufWriter::with_capacity(1 << 20, file))?;
        let file = writer
            .into_inner()
            .map_err(|e| io("writing the temporary snapshot", e.into_error()))?;
        Ok(TempDb { file, size_bytes })
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Up to [`CHUNK_BYTES`] from `at`.
    pub fn read_chunk(&self, at: u64) -> std::io::Result<Vec<u8>> {
        assert!(at < self.size_bytes, "a chunk starts inside the database");
        let n = (self.size_bytes - at).min(CHUNK_BYTES as u64) as usize;
        let mut buf = vec![0u8; n];
        FileExt::read_exact_at(&self.file, &mut buf, at)?;
        Ok(buf)
    }
}

/// A file read with pread, a page at a time.
pub struct FileSource(pub std::fs::File);

impl PageSource for FileSource {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(&self.0, buf, offset)
    }
}

/// etcdctl's test for a trailing SHA-256: bbolt files are whole pages, so a size of 512k + 32
/// means one was appended.
pub fn has_sha256(file_bytes: u64) -> bool {
    file_bytes % 512 == SHA256_BYTES
}

/// Opens a snapshot file (`etcdctl snapshot save`'s output, or a bare backend database) for
/// reading; the trailing SHA-256, if any, is left outside the database.
pub fn open_file(path: &Path) -> Result<BoltReader<FileSource>, CoreError> {
    let file = std::fs::File::open(path).map_err(|source| CoreError::DataDir {
        path: path.to_path_buf(),
        source,
    })?;
    let bytes = file
        .metadata()
        .map_err(|source| CoreError::DataDir {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let db_bytes = if has_sha256(bytes) {
        bytes - SHA256_BYTES
    } else {
        bytes
    };
    BoltReader::open(Box::new(FileSource(file)), db_bytes).map_err(snapshot_error)
}

/// Checks a snapshot file's trailing SHA-256 as `etcdctl snapshot restore` does: streamed, so
/// any size fits in bounded memory. A file without one is refused unless the hash check is
/// skipped.
pub fn verify_sha256(path: &Path) -> Result<(), CoreError> {
    let io = |source| CoreError::DataDir {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let bytes = file.metadata().map_err(io)?.len();
    if !has_sha256(bytes) {
        return Err(CoreError::Snapshot(
            "snapshot missing hash but --skip-hash-check=false".into(),
        ));
    }
    let mut remaining = bytes - SHA256_BYTES;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    while remaining > 0 {
        let n = (remaining as usize).min(buf.len());
        file.read_exact(&mut buf[..n]).map_err(io)?;
        hasher.update(&buf[..n]);
        remaining -= n as u64;
    }
    let mut expected = [0u8; SHA256_BYTES as usize];
    file.read_exact(&mut expected).map_err(io)?;
    let got = hasher.finalize();
    if got.as_slice() != expected {
        return Err(CoreError::Snapshot(format!(
            "expected sha256 {expected:?}, got {:?}",
            got.as_slice()
        )));
    }
    Ok(())
}

/// What an etcd backend holds that a Keel store needs.
#[derive(Debug)]
pub struct Imported {
    pub versions: Vec<kv::ExportVersion>,
    /// `(id, ttl_s)` ascending by id.
    pub leases: Vec<(i64, i64)>,
    pub current_rev: i64,
    /// `COMPACT_REVISION_NONE` when the store was never compacted.
    pub compact_rev: i64,
    /// The auth store: users, roles, the enabled flag and the auth revision.
    pub auth: AuthImage,
}

/// Reads the store out of an etcd 3.4 backend (keys with every kept revision, leases, the
/// compact revision, the auth store); membership, alarms and the cluster version are left
/// behind, as `etcdctl snapshot restore` leaves them (the restored members form a new cluster).
pub fn read_db<S: PageSource + ?Sized>(db: &BoltReader<S>) -> Result<Imported, CoreError> {
    let mut versions = Vec::new();
    let mut current_rev = kv::REVISION_INITIAL;
    if let Some(bucket) = db.bucket(BUCKET_KEY).map_err(snapshot_error)? {
        db.for_each(&bucket, &mut |k, v| {
            let bad = |why: &str| kv::KvError::Bolt(format!("key bucket: {why}"));
            let rev = parse_rev(k).ok_or_else(|| bad("a key that is not a revision"))?;
            let tombstone = match k.len() {
                REV_BYTES => false,
                n if n == REV_BYTES + 1 && k[REV_BYTES] == TOMBSTONE_MARK => true,
                _ => return Err(bad("a revision with an unknown mark")),
            };
            let v = v.ok_or_else(|| bad("a nested bucket"))?;
            let kv_pb =
                mvccpb::KeyValue::decode(v).map_err(|e| bad(&format!("a KeyValue: {e}")))?;
            if kv_pb.key.is_empty() {
                return Err(bad("a KeyValue without a key"));
            }
            current_rev = current_rev.max(rev.main);
            versions.push(if tombstone {
                kv::ExportVersion {
                    key: kv_pb.key,
                    rev,
                    tombstone,
                    create_revision: 0,
                    version: 0,
                    lease: 0,
                    value: bytes::Bytes::new(),
                }
            } else {
                kv::ExportVersion {
                    key: kv_pb.key,
                    rev,
                    tombstone,
                    create_revision: kv_pb.create_revision,
                    version: kv_pb.version,
                    lease: kv_pb.lease,
                    value: kv_pb.value,
                }
            });
            Ok(())
        })
        .map_err(snapshot_error)?;
    }
    let mut compact_rev = kv::COMPACT_REVISION_NONE;
    if let Some(bucket) = db.bucket(BUCKET_META).map_err(snapshot_error)? {
        db.for_each(&bucket, &mut |k, v| {
            // etcd resumes a scheduled compaction at start, so the scheduled one counts.
            if k == META_SCHEDULED_COMPACT || k == META_FINISHED_COMPACT {
                let rev = v.and_then(parse_rev).ok_or_else(|| {
                    kv::KvError::Bolt("meta bucket: a compact revision that is not one".into())
                })?;
                compact_rev = compact_rev.max(rev.main);
            }
            Ok(())
        })
        .map_err(snapshot_error)?;
    }
    let mut leases = Vec::new();
    if let Some(bucket) = db.bucket(BUCKET_LEASE).map_err(snapshot_error)? {
        db.for_each(&bucket, &mut |_, v| {
            let lease = v
                .ok_or(())
                .and_then(|v| LeasePb::decode(v).map_err(|_| ()))
                .map_err(|()| kv::KvError::Bolt("lease bucket: not a Lease".into()))?;
            leases.push((lease.id, lease.ttl));
            Ok(())
        })
        .map_err(snapshot_error)?;
    }
    leases.sort_unstable();
    Ok(Imported {
        versions,
        leases,
        current_rev: current_rev.max(compact_rev),
        compact_rev,
        auth: read_auth(db)?,
    })
}

/// A key of an auth bucket, printable in an error.
fn key_text(k: &[u8]) -> String {
    k.escape_ascii().to_string()
}

/// A name stored as bytes (authpb's `name`), which must be its record's key and UTF-8, as
/// every name etcd's Auth API takes is a proto string.
fn record_name(bucket: &str, k: &[u8], name: &[u8]) -> Result<String, kv::KvError> {
    let bad =
        |why: String| kv::KvError::Bolt(format!("{bucket} bucket: key \"{}\": {why}", key_text(k)));
    if name != k {
        return Err(bad(format!(
            "the record names \"{}\" instead",
            key_text(name)
        )));
    }
    String::from_utf8(name.to_vec()).map_err(|_| bad("a name that is not UTF-8".into()))
}

/// Reads the auth store out of an etcd 3.4 backend. A backend without the auth buckets
/// (never opened by an etcd with auth) is a new store, as etcd makes one at start.
fn read_auth<S: PageSource + ?Sized>(db: &BoltReader<S>) -> Result<AuthImage, CoreError> {
    let mut image = AuthImage::default();
    if let Some(bucket) = db.bucket(BUCKET_AUTH).map_err(snapshot_error)? {
        let mut revision = None;
        db.for_each(&bucket, &mut |k, v| {
            let bad = |why: &str| {
                kv::KvError::Bolt(format!("auth bucket: key \"{}\": {why}", key_text(k)))
            };
            match k {
                // etcd reads the flag as "enabled iff it is [1]"; anything but one byte of 0
                // or 1 is damage, and guessing "disabled" would silently drop access control.
                AUTH_ENABLED => match v {
                    Some([0]) => image.enabled = false,
                    Some([1]) => image.enabled = true,
                    _ => return Err(bad("not one byte of 0 or 1")),
                },
                AUTH_REVISION => {
                    let bytes: [u8; 8] = v
                        .and_then(|v| v.try_into().ok())
                        .ok_or_else(|| bad("not an 8-byte big-endian revision"))?;
                    revision = Some(u64::from_be_bytes(bytes));
                }
                // Keys a later etcd might add mean nothing to a 3.4 store: etcd ignores them.
                _ => {}
            }
            Ok(())
        })
        .map_err(snapshot_error)?;
        // etcd commits revision 1 at start when the stored one is missing or 0.
        image.revision = revision.unwrap_or(0).max(1);
    }
    if let Some(bucket) = db.bucket(BUCKET_AUTH_ROLES).map_err(snapshot_error)? {
        db.for_each(&bucket, &mut |k, v| {
            let bad = |why: String| {
                kv::KvError::Bolt(format!("authRoles bucket: key \"{}\": {why}", key_text(k)))
            };
            let v = v.ok_or_else(|| bad("a nested bucket".into()))?;
            let role = authpb::Role::decode(v).map_err(|e| bad(format!("not a Role: {e}")))?;
            let name = record_name("authRoles", k, &role.name)?;
            let mut perms = Vec::with_capacity(role.key_permission.len());
            for p in role.key_permission {
                if authpb::permission::Type::try_from(p.perm_type).is_err() {
                    return Err(bad(format!(
                        "permission type {} is not READ, WRITE or READWRITE",
                        p.perm_type
                    )));
                }
                perms.push(PermRecord {
                    perm_type: p.perm_type,
                    key: p.key.to_vec(),
                    range_end: p.range_end.to_vec(),
                });
            }
            // etcd keeps them sorted by key (its grant binary-searches them); a stable sort
            // keeps a sorted record as it is.
            perms.sort_by(|a, b| a.key.cmp(&b.key));
            image.roles.push((name, perms));
            Ok(())
        })
        .map_err(snapshot_error)?;
    }
    if let Some(bucket) = db.bucket(BUCKET_AUTH_USERS).map_err(snapshot_error)? {
        db.for_each(&bucket, &mut |k, v| {
            let bad = |why: String| {
                kv::KvError::Bolt(format!("authUsers bucket: key \"{}\": {why}", key_text(k)))
            };
            let v = v.ok_or_else(|| bad("a nested bucket".into()))?;
            let user = authpb::User::decode(v).map_err(|e| bad(format!("not a User: {e}")))?;
            let name = record_name("authUsers", k, &user.name)?;
            let password_hash = String::from_utf8(user.password.to_vec())
                .map_err(|_| bad("a password hash that is not text".into()))?;
            let mut roles = user.roles;
            // etcd sorts them at every grant (its root check binary-searches them).
            roles.sort();
            roles.dedup();
            image.users.push(UserRecord {
                name,
                password_hash,
                roles,
                no_password: user.options.is_some_and(|o| o.no_password),
            });
            Ok(())
        })
        .map_err(snapshot_error)?;
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn small_snapshot() -> SnapshotSource {
        let (mut writer, _reader) = kv::Store::new();
        for i in 0..2000u64 {
            let op = kv::Op::Put(kv::PutRequest {
                key: format!("key/{i:05}").into(),
                value: vec![b'x'; 700].into(),
                ..Default::default()
            });
            writer.apply(i + 1, &op).expect("applies");
        }
        SnapshotSource {
            source: writer.checkpoint_source(),
            index: 2000,
            term: 2,
            conf_state: keel_raft::ConfState::default(),
            members: vec![crate::ids::Member {
                id: 0xabc,
                name: "n1".into(),
                peer_urls: vec!["http://127.0.0.1:2380".into()],
                client_urls: vec![],
                is_learner: false,
            }],
            removed: vec![0xdef],
            alarms: vec![crate::alarms::AlarmMember {
                member_id: 0xabc,
                alarm: 1,
            }],
            auth: Default::default(),
        }
    }

    #[test]
    fn the_stream_file_is_unlinked_and_reads_back_as_written_with_a_checked_sha256() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let snap = small_snapshot();
        let db = TempDb::write(dir.path(), &snap).expect("written");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("snap"))
            .expect("the folder exists")
            .collect();
        assert!(left.is_empty(), "nothing is left in the data dir: {left:?}");
        // The chunks are the database write_db makes, whole pages, then a sha256 trailer.
        let mut streamed = Vec::new();
        while (streamed.len() as u64) < db.size_bytes() {
            streamed.extend(db.read_chunk(streamed.len() as u64).expect("a chunk"));
        }
        let (direct, _) = write_db(&snap, Cursor::new(Vec::new())).expect("written");
        assert_eq!(streamed, direct.into_inner());
        assert!(streamed.len() > CHUNK_BYTES, "more than one chunk");
        let sha = sha2::Sha256::digest(&streamed);
        let file = dir.path().join("saved.db");
        let mut saved = streamed.clone();
        saved.extend_from_slice(&sha);
        std::fs::write(&file, &saved).expect("saved");
        assert!(has_sha256(saved.len() as u64) && !has_sha256(streamed.len() as u64));
        verify_sha256(&file).expect("the trailer matches");
        let status = open_file(&file).expect("opens").status().expect("status");
        assert_eq!(
            status.total_size,
            streamed.len() as u64,
            "the trailer is not the db's"
        );
        assert_eq!(status.revision, 2001);
        let imported = read_db(&open_file(&file).expect("opens")).expect("reads");
        assert_eq!(imported.versions.len(), 2000);
        // A flipped byte fails the check; a file without a trailer needs --skip-hash-check.
        saved[5000] ^= 1;
        std::fs::write(&file, &saved).expect("saved");
        let err = verify_sha256(&file).expect_err("damage found");
        assert!(err.to_string().contains("expected sha256"), "{err}");
        std::fs::write(&file, &streamed).expect("saved");
        let err = verify_sha256(&file).expect_err("no trailer");
        assert!(err.to_string().contains("--skip-hash-check"), "{err}");
        assert_eq!(
            open_file(&file)
                .expect("a bare database opens")
                .status()
                .expect("status"),
            status
        );
    }

    #[test]
    fn a_store_round_trips_through_etcds_schema() {
        let (mut writer, _reader) = kv::Store::new();
        let mut index = 0;
        let mut apply = |writer: &mut kv::Writer, op: kv::Op| {
            index += 1;
            writer.apply(index, &op).expect("applies");
        };
        apply(
            &mut writer,
            kv::Op::LeaseGrant(kv::LeaseGrantRequest { id: 7, ttl_s: 60 }),
        );
        for i in 0..300 {
            apply(
                &mut writer,
                kv::Op::Put(kv::PutRequest {
                    key: format!("k{:03}", i % 100).into(),
                    value: vec![b'v'; i].into(),
                    lease: if i == 205 { 7 } else { 0 },
                    ..Default::default()
                }),
            );
        }
        apply(
            &mut writer,
            kv::Op::DeleteRange(kv::DeleteRangeRequest {
                key: "k001".into(),
                ..Default::default()
            }),
        );
        apply(
            &mut writer,
            kv::Op::Compact(kv::CompactionRequest {
                revision: 150,
                physical: false,
            }),
        );
        let snap = SnapshotSource {
            source: writer.checkpoint_source(),
            index: 42,
            term: 3,
            conf_state: keel_raft::ConfState::default(),
            members: vec![],
            removed: vec![],
            alarms: vec![],
            auth: Default::default(),
        };
        let (out, size) = write_db(&snap, Cursor::new(Vec::new())).expect("written");
        let bytes = out.into_inner();
        assert_eq!(bytes.len() as u64, size);
        let db = BoltReader::open(Box::<[u8]>::from(&bytes[..]), size).expect("opens");
        let imported = read_db(&db).expect("reads");
        assert_eq!(
            imported.versions,
            snap.source.versions_by_revision().expect("versions")
        );
        assert_eq!(imported.leases, vec![(7, 60)]);
        assert_eq!(imported.current_rev, snap.source.revision());
        let status = db.status().expect("status");
        assert_eq!(status.revision, snap.source.revision());
        assert_eq!(imported.compact_rev, 150);
        // Versions above the compaction (every key's rewrites after 150, its newest at or
        // below 150, the tombstone) + 1 lease + cluster version + 3 meta keys + the auth
        // revision (a new auth store, as etcd's).
        let kept = imported.versions.len() as u64;
        assert!(kept < 301 && kept > 150, "{kept}");
        assert_eq!(status.total_key, kept + 1 + 1 + 3 + 1);
        assert_eq!(imported.auth, AuthImage::default());
    }

    fn perm(t: authpb::permission::Type, key: &[u8], end: &[u8]) -> authpb::Permission {
        authpb::Permission {
            perm_type: t as i32,
            key: key.to_vec().into(),
            range_end: end.to_vec().into(),
        }
    }

    /// A bcrypt hash in etcd's form, at the cheapest cost (the test checks the format, not
    /// the strength).
    fn hash(password: &str) -> String {
        bcrypt::hash_with_result(password, 4)
            .expect("hashes")
            .format_for_version(bcrypt::Version::TwoA)
    }

    fn snapshot_with_auth(auth: AuthImage) -> SnapshotSource {
        let (writer, _reader) = kv::Store::new();
        SnapshotSource {
            source: writer.checkpoint_source(),
            index: 1,
            term: 1,
            conf_state: keel_raft::ConfState::default(),
            members: vec![],
            removed: vec![],
            alarms: vec![],
            auth,
        }
    }

    fn bucket_entries(db: &BoltReader<[u8]>, name: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let bucket = db.bucket(name).expect("reads").expect("the bucket exists");
        let mut out = Vec::new();
        db.for_each(&bucket, &mut |k, v| {
            out.push((k.to_vec(), v.expect("a value").to_vec()));
            Ok(())
        })
        .expect("walks");
        out
    }

    #[test]
    fn the_auth_store_round_trips_through_etcds_auth_buckets() {
        use crate::auth::AuthState;
        use authpb::permission::Type;
        let mut s = AuthState::from_image(&AuthImage::default());
        let (root_hash, alice_hash) = (hash("rootpw"), hash("alicepw"));
        s.user_add("root", &root_hash, false).expect("add");
        s.user_add("alice", &alice_hash, false).expect("add");
        s.user_add("svc", "", true).expect("add");
        s.role_add("root").expect("role");
        s.user_grant_role("root", "root").expect("grant");
        s.role_add("reader").expect("role");
        // A prefix (etcdctl's --prefix makes the end), one key, a from-key range, a range.
        s.role_grant_permission("reader", &perm(Type::Readwrite, b"pre/", b"pre0"))
            .expect("perm");
        s.role_grant_permission("reader", &perm(Type::Read, b"foo", b""))
            .expect("perm");
        s.role_grant_permission("reader", &perm(Type::Read, b"open", b"\0"))
            .expect("perm");
        s.role_grant_permission("reader", &perm(Type::Write, b"w1", b"w9"))
            .expect("perm");
        s.role_add("empty").expect("role");
        s.user_grant_role("alice", "reader").expect("grant");
        s.user_grant_role("alice", "empty").expect("grant");
        s.user_grant_role("svc", "reader").expect("grant");
        s.enable().expect("enable");
        let image = s.image();
        assert!(image.enabled && image.revision > 10, "{image:?}");

        let (out, size) =
            write_db(&snapshot_with_auth(image.clone()), Cursor::new(Vec::new())).expect("written");
        let bytes = out.into_inner();
        let db = BoltReader::open(Box::<[u8]>::from(&bytes[..]), size).expect("opens");
        let imported = read_db(&db).expect("reads");
        assert_eq!(imported.auth, image);
        let back = AuthState::from_image(&imported.auth);
        assert!(back.enabled() && back.is_root("root") && !back.is_root("alice"));
        let (alice, _) = back.password_hash("alice").expect("alice has a password");
        assert!(bcrypt::verify("alicepw", &alice).expect("a bcrypt hash"));

        // The records are etcd's, byte for byte.
        assert_eq!(
            bucket_entries(&db, b"auth"),
            vec![
                (b"authEnabled".to_vec(), vec![1]),
                (
                    b"authRevision".to_vec(),
                    image.revision.to_be_bytes().to_vec()
                ),
            ]
        );
        let users = bucket_entries(&db, b"authUsers");
        let names: Vec<&[u8]> = users.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(names, [&b"alice"[..], b"root", b"svc"]);
        // authpb.User: name (1), the hash (2), the sorted roles (3), the options (4), which
        // etcd's UserAdd always stores, empty unless no_password.
        let mut alice_record = vec![0x0a, 5];
        alice_record.extend_from_slice(b"alice");
        alice_record.extend_from_slice(&[0x12, alice_hash.len() as u8]);
        alice_record.extend_from_slice(alice_hash.as_bytes());
        alice_record.extend_from_slice(&[0x1a, 5]);
        alice_record.extend_from_slice(b"empty");
        alice_record.extend_from_slice(&[0x1a, 6]);
        alice_record.extend_from_slice(b"reader");
        alice_record.extend_from_slice(&[0x22, 0]);
        assert_eq!(users[0].1, alice_record);
        let svc = authpb::User::decode(users[2].1.as_slice()).expect("a User");
        assert!(svc.password.is_empty());
        assert_eq!(
            svc.options,
            Some(authpb::UserAddOptions { no_password: true })
        );
        let roles = bucket_entries(&db, b"authRoles");
        let names: Vec<&[u8]> = roles.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(names, [&b"empty"[..], b"reader", b"root"]);
        let reader = authpb::Role::decode(roles[1].1.as_slice()).expect("a Role");
        assert_eq!(&reader.name[..], b"reader");
        let keys: Vec<&[u8]> = reader.key_permission.iter().map(|p| &p.key[..]).collect();
        assert_eq!(
            keys,
            [&b"foo"[..], b"open", b"pre/", b"w1"],
            "sorted by key"
        );
        assert_eq!(
            reader.key_permission[2],
            perm(Type::Readwrite, b"pre/", b"pre0")
        );
        // An empty role is a record with only its name.
        assert_eq!(roles[0].1, [&[0x0a, 5][..], b"empty"].concat());

        // Disabled again: the flag says so (etcd rewrites it), and a never-enabled store has
        // only its revision, as a new etcd's.
        s.disable().expect("disable");
        let image = s.image();
        let (out, size) =
            write_db(&snapshot_with_auth(image.clone()), Cursor::new(Vec::new())).expect("written");
        let db = BoltReader::open(Box::<[u8]>::from(&out.into_inner()[..]), size).expect("opens");
        assert_eq!(read_db(&db).expect("reads").auth, image);
        let (out, size) = write_db(
            &snapshot_with_auth(AuthImage::default()),
            Cursor::new(Vec::new()),
        )
        .expect("written");
        let db = BoltReader::open(Box::<[u8]>::from(&out.into_inner()[..]), size).expect("opens");
        assert_eq!(
            bucket_entries(&db, b"auth"),
            vec![(b"authRevision".to_vec(), 1u64.to_be_bytes().to_vec())]
        );
        assert!(bucket_entries(&db, b"authUsers").is_empty());
        assert!(bucket_entries(&db, b"authRoles").is_empty());
    }

    /// A bucket's records, keys ascending.
    type Records<'a> = Vec<(&'a [u8], Vec<u8>)>;

    /// A database holding only `buckets` (names ascending).
    fn db_of(buckets: &[(&[u8], Records<'_>)]) -> Result<Imported, CoreError> {
        let mut w = BoltWriter::new(Cursor::new(Vec::new())).expect("a writer");
        for (name, entries) in buckets {
            w.begin_bucket(name).expect("begins");
            for (k, v) in entries {
                w.put(k, v).expect("puts");
            }
            w.end_bucket().expect("ends");
        }
        let (out, size) = w.finish().expect("finished");
        let db = BoltReader::open(Box::<[u8]>::from(&out.into_inner()[..]), size).expect("opens");
        read_db(&db)
    }

    #[test]
    fn a_malformed_auth_record_is_an_error_naming_its_bucket_and_key() {
        let user = |name: &[u8]| {
            authpb::User {
                name: name.to_vec().into(),
                password: b"$2a$04$x".to_vec().into(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let role_with_type = |t: i32| {
            authpb::Role {
                name: b"r".to_vec().into(),
                key_permission: vec![authpb::Permission {
                    perm_type: t,
                    key: b"k".to_vec().into(),
                    range_end: Default::default(),
                }],
            }
            .encode_to_vec()
        };
        let cases: Vec<(&[u8], Records<'_>, &str)> = vec![
            (
                b"auth",
                vec![(&b"authEnabled"[..], vec![2])],
                r#"auth bucket: key "authEnabled""#,
            ),
            (
                b"auth",
                vec![(&b"authEnabled"[..], vec![])],
                r#"auth bucket: key "authEnabled""#,
            ),
            (
                b"auth",
                vec![(&b"authRevision"[..], vec![0, 1, 2])],
                r#"auth bucket: key "authRevision": not an 8-byte"#,
            ),
            (
                b"authRoles",
                vec![(&b"r"[..], vec![0xff, 0xff, 0xff])],
                r#"authRoles bucket: key "r": not a Role"#,
            ),
            (
                b"authRoles",
                vec![(&b"r"[..], role_with_type(7))],
                r#"authRoles bucket: key "r": permission type 7"#,
            ),
            (
                b"authRoles",
                vec![(&b"s"[..], role_with_type(0))],
                r#"authRoles bucket: key "s": the record names "r""#,
            ),
            (
                b"authUsers",
                vec![(&b"u"[..], vec![0x0a, 9])],
                r#"authUsers bucket: key "u": not a User"#,
            ),
            (
                b"authUsers",
                vec![(&b"u"[..], user(b"v"))],
                r#"authUsers bucket: key "u": the record names "v""#,
            ),
            (
                b"authUsers",
                vec![(&b"\xff"[..], user(b"\xff"))],
                r#"authUsers bucket: key "\xff": a name that is not UTF-8"#,
            ),
        ];
        for (bucket, entries, want) in cases {
            let err = db_of(&[(bucket, entries)]).expect_err(want);
            assert!(err.to_string().contains(want), "{err} lacks {want}");
        }
        // The well-formed versions of the same records read.
        let ok = db_of(&[
            (
                b"auth",
                vec![
                    (&b"authEnabled"[..], vec![0]),
                    (b"authRevision", 0u64.to_be_bytes().to_vec()),
                ],
            ),
            (b"authRoles", vec![(&b"r"[..], role_with_type(2))]),
            (b"authUsers", vec![(&b"u"[..], user(b"u"))]),
        ])
        .expect("reads");
        assert_eq!(ok.auth.revision, 1, "etcd starts a stored 0 at 1");
        assert_eq!(ok.auth.users[0].name, "u");
        assert!(!ok.auth.users[0].no_password, "no options: a password user");
        assert_eq!(ok.auth.roles[0].1[0].perm_type, 2);
    }
}
