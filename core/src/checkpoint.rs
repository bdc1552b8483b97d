//! The checkpoint file: the MVCC image at an applied raft index, with the raft position and the
//! membership at that index. It is what a restart loads before replaying the WAL, and exactly
//! the bytes a leader sends a follower as a raft snapshot.
//!
//! Format (little-endian): magic "KEELCKPT", version u32, raft index u64, raft term u64,
//! conf-state length u32 + bytes (keel-raft's encoding), cluster length u32 + JSON (version 1:
//! the members; version 2: `{"members": [...], "alarms": [...], "auth": {...}, "removed": [...]}`,
//! where the auth store is absent in files written before auth existed, and the removed member
//! ids in files written before they were kept: such a file loads with none, as older builds load
//! a newer file and ignore them; spaces after it put the store image's archive at a 16-byte
//! aligned offset, so a restart reads it from the mapped file in place),
//! store-image length u64 + bytes (keel-kv's own framed checkpoint), crc32 of all before it.
//! Any damage is an error, never a guess.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use keel_raft::{ConfState, SnapshotMetadata};

use serde::{Deserialize, Serialize};

use crate::alarms::AlarmMember;
use crate::auth::AuthImage;
use crate::error::CoreError;
use crate::ids::Member;
use keel_io::vlog::MappedFile;

const MAGIC: &[u8; 8] = b"KEELCKPT";
const VERSION: u32 = 2;
/// Version 1 files (members only, no alarms) still load.
const VERSION_MEMBERS_ONLY: u32 = 1;

/// The replicated cluster state beside the store, as the file holds it: membership, raised
/// alarms, the auth store, and the ids of removed members.
#[derive(Debug, Deserialize)]
struct Cluster {
    members: Vec<Member>,
    alarms: Vec<AlarmMember>,
    #[serde(default)]
    auth: AuthImage,
    #[serde(default)]
    removed: Vec<u64>,
}

/// The replicated cluster state a checkpoint carries beside the store image.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ClusterState<'a> {
    pub members: &'a [Member],
    pub alarms: &'a [AlarmMember],
    pub auth: &'a AuthImage,
    /// Members removed from the cluster (etcd's `members_removed`): a peer that dials in under
    /// one of these ids is told it was removed.
    pub removed: &'a [u64],
}

/// A decoded checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    pub meta: SnapshotMetadata,
    pub members: Vec<Member>,
    pub alarms: Vec<AlarmMember>,
    pub auth: AuthImage,
    pub removed: Vec<u64>,
    /// The store image: a slice of the file's bytes when decoded with [`decode_shared`].
    pub kv_image: Bytes,
}

impl Checkpoint {
    /// This checkpoint's file again, with `kv_image` as its store image (its own, or another
    /// form of it, such as the all-inline one a follower is sent).
    pub fn encode_with_image(&self, kv_image: &[u8]) -> Vec<u8> {
        encode(
            self.meta.index,
            self.meta.term,
            &self.meta.conf_state,
            ClusterState {
                members: &self.members,
                alarms: &self.alarms,
                auth: &self.auth,
                removed: &self.removed,
            },
            kv_image,
        )
    }
}

pub fn encode(
    index: u64,
    term: u64,
    conf_state: &ConfState,
    cluster: ClusterState<'_>,
    kv_image: &[u8],
) -> Vec<u8> {
    let framing = encode_around(index, term, conf_state, cluster, &[kv_image]);
    let mut out = Vec::with_capacity(framing.prefix.len() + kv_image.len() + framing.crc.len());
    out.extend_from_slice(&framing.prefix);
    out.extend_from_slice(kv_image);
    out.extend_from_slice(&framing.crc);
    out
}

/// What a checkpoint file holds around its store image: the file is `prefix`, then the image's
/// parts in order, then `crc`.
pub struct Framing {
    pub prefix: Vec<u8>,
    pub crc: [u8; 4],
}

/// The file around a store image given in `image_parts` (see [`Framing`]), so a writer can put
/// a multi-GiB image on disk from where it lies, without a copy of it in one buffer.
pub fn encode_around(
    index: u64,
    term: u64,
    conf_state: &ConfState,
    cluster: ClusterState<'_>,
    image_parts: &[&[u8]],
) -> Framing {
    let mut conf = Vec::new();
    conf_state.encode(&mut conf);
    let mut members = serde_json::to_vec(&cluster).expect("cluster state serializes");
    // Spaces after the JSON (which any JSON reader skips) put the store image's archive on an
    // aligned offset, so a restart reads it straight from the mapped file rather than from a
    // copy as large as the image.
    let payload_at = MAGIC.len()
        + 4
        + 8
        + 8
        + 4
        + conf.len()
        + 4
        + members.len()
        + 8
        + keel_kv::CHECKPOINT_HEADER_BYTES;
    let align = keel_kv::CHECKPOINT_PAYLOAD_ALIGN_BYTES;
    members.resize(members.len() + (align - payload_at % align) % align, b' ');
    let image_bytes: usize = image_parts.iter().map(|p| p.len()).sum();
    let mut prefix = Vec::with_capacity(conf.len() + members.len() + 64);
    prefix.extend_from_slice(MAGIC);
    prefix.extend_from_slice(&VERSION.to_le_bytes());
    prefix.extend_from_slice(&index.to_le_bytes());
    prefix.extend_from_slice(&term.to_le_bytes());
    prefix.extend_from_slice(&(conf.len() as u32).to_le_bytes());
    prefix.extend_from_slice(&conf);
    prefix.extend_from_slice(&(members.len() as u32).to_le_bytes());
    prefix.extend_from_slice(&members);
    prefix.extend_from_slice(&(image_bytes as u64).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&prefix);
    for part in image_parts {
        crc.update(part);
    }
    Framing {
        prefix,
        crc: crc.finalize().to_le_bytes(),
    }
}

/// Where the store image of `cp` lies in `file` (decoded with [`decode_shared`], so the image
/// is a slice of it), and the crc32 the file needs once the image's first bytes are `head`,
/// all else unchanged: a follower writes a new store-image header and this crc over a leader's
/// file in place, rather than the file again.
///
/// Worked out from the file's own crc, which decoding `cp` checked, without reading the bytes
/// after the head again (416 MB at 4M keys, on the raft loop's wait at an install). crc32 is
/// affine: for two inputs of one length, the crcs differ by a value that depends only on where
/// they differ. Here they differ only within the head, so the new crc is the old one XOR the
/// difference of the crcs of `file[..head's end]` with each head, carried over the bytes after
/// it as over zeros (crc32's combine, O(log n)).
pub fn crc_with_image_head(file: &[u8], cp: &Checkpoint, head: &[u8]) -> (usize, [u8; 4]) {
    let at = image_offset(file, cp);
    assert!(head.len() <= cp.kv_image.len(), "a head within the image");
    let head_end = at + head.len();
    let body_end = file.len() - 4;
    let old_crc = u32::from_le_bytes(file[body_end..].try_into().expect("4 bytes"));
    let mut before_head = crc32fast::Hasher::new();
    before_head.update(&file[..at]);
    let crc_up_to_head_with = |head: &[u8]| {
        let mut crc = before_head.clone();
        crc.update(head);
        crc.finalize()
    };
    let difference = crc_up_to_head_with(&file[at..head_end]) ^ crc_up_to_head_with(head);
    let mut carried = crc32fast::Hasher::new_with_initial(difference);
    carried.combine(&crc32fast::Hasher::new_with_initial_len(
        0,
        (body_end - head_end) as u64,
    ));
    (at, (old_crc ^ carried.finalize()).to_le_bytes())
}

/// Where the store image of `cp` (decoded from `file` with [`decode_shared`], so a slice of
/// it) starts in `file`; it ends just before the file's crc.
pub fn image_offset(file: &[u8], cp: &Checkpoint) -> usize {
    let at = (cp.kv_image.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize);
    assert!(
        at.checked_add(cp.kv_image.len())
            .is_some_and(|end| end + 4 == file.len()),
        "the store image is a slice of its file, ending before the crc"
    );
    at
}

/// A cursor that refuses to read past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or("truncated")?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

/// Decodes a checkpoint, copying its store image out of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
    decode_with(bytes, |range| Bytes::copy_from_slice(&bytes[range]))
}

/// Decodes a checkpoint whose store image stays a slice of `bytes` (a mapped file: no copy).
pub fn decode_shared(bytes: &Bytes) -> Result<Checkpoint, String> {
    decode_with(bytes, |range| bytes.slice(range))
}

fn decode_with(
    bytes: &[u8],
    image: impl FnOnce(std::ops::Range<usize>) -> Bytes,
) -> Result<Checkpoint, String> {
    if bytes.len() < MAGIC.len() + 4 + 4 {
        return Err("too short".into());
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err("crc mismatch".into());
    }
    let mut c = Cursor { bytes: body, at: 0 };
    if c.take(8)? != MAGIC {
        return Err("bad magic".into());
    }
    let version = c.u32()?;
    if version != VERSION && version != VERSION_MEMBERS_ONLY {
        return Err(format!("unknown version {version}"));
    }
    let index = c.u64()?;
    let term = c.u64()?;
    let conf_len = c.u32()? as usize;
    let conf_state = ConfState::decode(c.take(conf_len)?).map_err(|e| e.to_string())?;
    let members_len = c.u32()? as usize;
    let cluster_json = c.take(members_len)?;
    let cluster = if version == VERSION_MEMBERS_ONLY {
        Cluster {
            members: serde_json::from_slice(cluster_json).map_err(|e| e.to_string())?,
            alarms: Vec::new(),
            auth: AuthImage::default(),
            removed: Vec::new(),
        }
    } else {
        serde_json::from_slice(cluster_json).map_err(|e| e.to_string())?
    };
    let kv_len = usize::try_from(c.u64()?).map_err(|_| "store image too large")?;
    let kv_at = c.at;
    c.take(kv_len)?;
    let kv_image = image(kv_at..kv_at + kv_len);
    if c.at != body.len() {
        return Err("trailing bytes after the store image".into());
    }
    Ok(Checkpoint {
        meta: SnapshotMetadata {
            conf_state,
            index,
            term,
        },
        members: cluster.members,
        alarms: cluster.alarms,
        auth: cluster.auth,
        removed: cluster.removed,
        kv_image,
    })
}

pub fn file_name(index: u64) -> String {
    format!("checkpoint-{index:016x}.keel")
}

/// Checkpoint files in `dir`, newest first.
pub fn files(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let hex = name.strip_prefix("checkpoint-")?.strip_suffix(".keel")?;
            Some((u64::from_str_radix(hex, 16).ok()?, e.path()))
        })
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    files
}

/// The newest checkpoint that validates. A damaged newer one is skipped (it was being written
/// when the process died) in favour of an older valid one; the WAL still covers the gap because
/// segments are released only after a checkpoint is durable.
///
/// Returns it with its file mapped read-only: raft keeps that as the snapshot it sends a
/// follower, and the decoded store image is a slice of it, read in place (no copy of the
/// file is made). Once the store is restored, `MappedFile::forget_resident_pages` takes the
/// pages the restore read out of this process's memory again.
pub fn load_newest(dir: &Path) -> Result<Option<Loaded>, CoreError> {
    let map = |path: &Path| {
        keel_io::vlog::map_file_to_read(path).map_err(|source| CoreError::DataDir {
            path: path.to_path_buf(),
            source,
        })
    };
    for (index, path) in files(dir) {
        let file = map(&path)?;
        let name = path.display().to_string();
        let Some(cp) = accepted(index, &name, decode_shared(file.bytes())) else {
            continue;
        };
        let Some(base_index) = base_index(&cp) else {
            return Ok(Some(Loaded {
                checkpoint: cp,
                file,
                base: None,
            }));
        };
        let base_path = dir.join(file_name(base_index));
        let base_file = match map(&base_path) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = name, error = %e, "a delta checkpoint's base cannot be read; skipped");
                continue;
            }
        };
        let base_name = base_path.display().to_string();
        if let Some(base) = accepted_base(&cp, base_index, &base_name, || {
            decode_shared(base_file.bytes())
        }) {
            return Ok(Some(Loaded {
                checkpoint: cp,
                file,
                base: Some((base, base_file)),
            }));
        }
    }
    Ok(None)
}

/// The newest checkpoint that loads, its file mapped, and for a delta its base too.
pub struct Loaded {
    pub checkpoint: Checkpoint,
    pub file: MappedFile,
    pub base: Option<(Checkpoint, MappedFile)>,
}

/// For a delta checkpoint, the index of the full one its store image needs (its base).
pub fn base_index(cp: &Checkpoint) -> Option<u64> {
    match keel_kv::checkpoint_kind(&cp.kv_image) {
        Ok(keel_kv::CheckpointKind::Delta(base)) => Some(base.applied_index()),
        _ => None,
    }
}

/// `decode`'s checkpoint when it is the full one delta `cp` names (file `name`, for
/// `base_index`), else None, logged: the delta is then skipped as a damaged file would be.
fn accepted_base(
    cp: &Checkpoint,
    base_index: u64,
    name: &str,
    decode: impl FnOnce() -> Result<Checkpoint, String>,
) -> Option<Checkpoint> {
    let base = accepted(base_index, name, decode())?;
    let named = keel_kv::checkpoint_kind(&cp.kv_image).ok();
    match keel_kv::checkpoint_kind(&base.kv_image) {
        Ok(keel_kv::CheckpointKind::Full(b))
            if named == Some(keel_kv::CheckpointKind::Delta(b)) =>
        {
            Some(base)
        }
        _ => {
            tracing::warn!(
                path = name,
                delta = cp.meta.index,
                "a delta checkpoint's base is not the full checkpoint it names; the delta is skipped"
            );
            None
        }
    }
}

/// The checkpoint in file `name` (named for `index`), or None, logged, when it is damaged or
/// its contents belong to another index; for a delta, with its base's store image, which
/// `base_file(index)` gives (None when it is missing, damaged or not the one named). Pure,
/// so the simulator chooses as a restart does.
pub fn accept(
    index: u64,
    name: &str,
    bytes: &[u8],
    base_file: &mut dyn FnMut(u64) -> Option<Bytes>,
) -> Option<(Checkpoint, Option<Checkpoint>)> {
    let cp = accepted(index, name, decode(bytes))?;
    let Some(base_index) = base_index(&cp) else {
        return Some((cp, None));
    };
    let Some(bytes) = base_file(base_index) else {
        tracing::warn!(path = name, "a delta checkpoint's base is missing; skipped");
        return None;
    };
    let base = accepted_base(&cp, base_index, &file_name(base_index), || {
        decode_shared(&bytes)
    })?;
    Some((cp, Some(base)))
}

fn accepted(index: u64, name: &str, decoded: Result<Checkpoint, String>) -> Option<Checkpoint> {
    match decoded {
        Ok(cp) if cp.meta.index == index => Some(cp),
        Ok(_) => {
            tracing::warn!(
                path = name,
                "checkpoint name and contents disagree; skipped"
            );
            None
        }
        Err(why) => {
            tracing::warn!(path = name, why, "damaged checkpoint skipped");
            None
        }
    }
}

/// Removes the temporary files of checkpoints whose write a crash cut short (`write_durably`
/// writes `checkpoint-<index>.tmp`, then renames it): they are never loaded, and each may be as
/// large as the store. Called at start, before the checkpoint writer runs.
pub fn remove_unfinished(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with("checkpoint-") && name.ends_with(".tmp") {
            let path = entry.path();
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed an unfinished checkpoint")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove an unfinished checkpoint")
                }
            }
        }
    }
}

/// Removes the checkpoint file for `index`, if there is one (a checkpoint that a leader's
/// snapshot overtook while it was being written).
pub fn remove(dir: &Path, index: u64) {
    let path = dir.join(file_name(index));
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a stale checkpoint")
        }
    }
}

pub fn remove_older(dir: &Path, newest: u64) {
    for (index, path) in files(dir) {
        if index < newest {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove an old checkpoint");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let conf = ConfState {
            voters: vec![7],
            learners: vec![9],
        };
        let members = vec![Member {
            id: 7,
            name: "a".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec![],
            is_learner: false,
        }];
        let alarms = vec![AlarmMember {
            member_id: 7,
            alarm: 1,
        }];
        let auth = AuthImage {
            enabled: true,
            revision: 7,
            users: vec![crate::auth::store::UserRecord {
                name: "root".into(),
                password_hash: "$2a$10$x".into(),
                roles: vec!["root".into()],
                no_password: false,
            }],
            roles: vec![],
        };
        let cluster = ClusterState {
            members: &members,
            alarms: &alarms,
            auth: &auth,
            removed: &[0xdead],
        };
        let file = encode(42, 3, &conf, cluster, b"store image");
        let cp = decode(&file).expect("valid");
        assert_eq!(cp.alarms, alarms);
        assert_eq!(cp.removed, vec![0xdead], "removed member ids are carried");
        assert_eq!(cp.auth, auth, "the auth store is carried");
        assert_eq!(
            (cp.meta.index, cp.meta.term, cp.meta.conf_state),
            (42, 3, conf)
        );
        assert_eq!(cp.members, members);
        assert_eq!(&cp.kv_image[..], b"store image");
        for i in [0, 9, 13, 30, file.len() - 5] {
            let mut flipped = file.clone();
            flipped[i] ^= 1;
            assert!(decode(&flipped).is_err(), "flip at {i} accepted");
        }
        assert!(decode(&file[..file.len() - 1]).is_err());
        let mut padded = file.clone();
        padded.extend_from_slice(&[0; 16]);
        assert!(decode(&padded).is_err());
    }

    #[test]
    fn the_crc_with_a_new_image_head_is_the_crc_of_the_file_written_with_it() {
        let conf = ConfState {
            voters: vec![1],
            learners: vec![],
        };
        let cluster = ClusterState {
            members: &[],
            alarms: &[],
            auth: &AuthImage::default(),
            removed: &[],
        };
        // Images shorter and longer than a head, heads at the image's start of every length,
        // including one equal to the bytes there (no change) and the whole image.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut byte = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        for image_bytes in [1usize, 7, 40, 41, 1000, 70_000] {
            let image: Vec<u8> = (0..image_bytes).map(|_| byte()).collect();
            let file = Bytes::from(encode(5, 2, &conf, cluster, &image));
            let cp = decode_shared(&file).expect("valid");
            for head_bytes in [0, 1, 4, 40, image_bytes].map(|n| n.min(image_bytes)) {
                for same in [false, true] {
                    let head: Vec<u8> = if same {
                        image[..head_bytes].to_vec()
                    } else {
                        (0..head_bytes).map(|_| byte()).collect()
                    };
                    let (at, crc) = crc_with_image_head(&file, &cp, &head);
                    let mut written = file.to_vec();
                    written[at..at + head_bytes].copy_from_slice(&head);
                    let crc_at = written.len() - 4;
                    assert_eq!(
                        crc,
                        crc32fast::hash(&written[..crc_at]).to_le_bytes(),
                        "image {image_bytes} bytes, head {head_bytes}, same {same}"
                    );
                    written[crc_at..].copy_from_slice(&crc);
                    let rewritten = decode(&written).expect("the file with its new crc decodes");
                    assert_eq!(&rewritten.kv_image[..head_bytes], &head[..]);
                }
            }
        }
    }

    #[test]
    fn a_file_framed_around_an_images_parts_is_the_file_encoded_around_the_whole() {
        let (mut writer, _reader) = keel_kv::Store::new();
        writer.apply_empty(1);
        let parts = writer
            .checkpoint_source()
            .serialize_parts()
            .expect("no compaction");
        let whole = parts.to_vec();
        let cluster = ClusterState {
            members: &[],
            alarms: &[],
            auth: &AuthImage::default(),
            removed: &[7],
        };
        let conf = ConfState {
            voters: vec![1],
            learners: vec![],
        };
        let framing = encode_around(1, 2, &conf, cluster, &parts.parts());
        let [header, archive] = parts.parts();
        let from_parts = [&framing.prefix[..], header, archive, &framing.crc].concat();
        assert_eq!(from_parts, encode(1, 2, &conf, cluster, &whole));
        assert_eq!(
            &decode(&from_parts).expect("valid").kv_image[..],
            &whole[..]
        );
    }

    #[test]
    fn the_store_image_is_aligned_in_the_file_and_loads_in_place_from_its_mapping() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (mut writer, _reader) = keel_kv::Store::new();
        writer.apply_empty(1);
        let image = writer.checkpoint();
        // Cluster states of every JSON length modulo the alignment.
        for name_len in 0..keel_kv::CHECKPOINT_PAYLOAD_ALIGN_BYTES {
            let members = vec![Member {
                id: 1,
                name: "n".repeat(name_len),
                peer_urls: vec!["http://127.0.0.1:2380".into()],
                client_urls: vec![],
                is_learner: false,
            }];
            let cluster = ClusterState {
                members: &members,
                alarms: &[],
                auth: &AuthImage::default(),
                removed: &[],
            };
            let file = encode(1, 1, &ConfState::default(), cluster, &image);
            let path = dir.path().join(file_name(1));
            std::fs::write(&path, &file).expect("write");
            let Loaded {
                checkpoint: cp,
                file: mapped,
                base,
            } = load_newest(dir.path()).expect("loads").expect("one file");
            assert!(base.is_none(), "a full checkpoint needs no base");
            assert_eq!(cp.members, members);
            let base = mapped.bytes().as_ptr() as usize;
            let at = cp.kv_image.as_ptr() as usize;
            assert!(
                (base..base + mapped.bytes().len()).contains(&at),
                "the image is the mapping's own bytes, not a copy"
            );
            assert_eq!(
                (at + keel_kv::CHECKPOINT_HEADER_BYTES) % keel_kv::CHECKPOINT_PAYLOAD_ALIGN_BYTES,
                0,
                "the archive is aligned (name of {name_len} bytes)"
            );
            let (restored, _) = keel_kv::Store::restore(&cp.kv_image).expect("restores");
            assert_eq!(restored.applied_index(), 1);
            mapped.forget_resident_pages();
            assert_eq!(
                &cp.kv_image[..],
                &image[..],
                "read back after the pages were dropped"
            );
        }
    }

    #[test]
    fn unfinished_and_stale_checkpoint_files_are_removed_and_others_kept() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = |name: &str| dir.path().join(name);
        let unfinished = path(&file_name(7)).with_extension("tmp");
        for p in [&unfinished, &path(&file_name(5)), &path(&file_name(9))] {
            std::fs::write(p, b"x").expect("write");
        }
        std::fs::write(path("other.tmp"), b"x").expect("write");
        remove_unfinished(dir.path());
        assert!(!unfinished.exists(), "a cut-short write is gone");
        assert!(
            path("other.tmp").exists(),
            "only checkpoint files are touched"
        );
        remove(dir.path(), 5);
        remove(dir.path(), 6);
        let left: Vec<u64> = files(dir.path()).into_iter().map(|(i, _)| i).collect();
        assert_eq!(left, vec![9]);
    }
}
