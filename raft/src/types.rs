//! Wire and persistence types (the crate's own, never protobuf) and their compact binary codec.
//!
//! Format: unsigned integers are LEB128 varints, byte strings are a varint length followed by the
//! bytes, enums are one byte. Every decoder checks lengths against the remaining input before it
//! allocates, so garbage input yields `Error::Decode`, never a panic or a huge allocation.

use crate::error::{Error, Result};
use bytes::Bytes;

/// What an entry carries: application data, or an encoded [`ConfChange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EntryType {
    /// Opaque application data (empty for the entry a new leader appends).
    #[default]
    Normal,
    /// `data` holds an encoded [`ConfChange`].
    ConfChange,
}

/// One log entry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entry {
    /// Normal or ConfChange.
    pub entry_type: EntryType,
    /// The term of the leader that created the entry.
    pub term: u64,
    /// The entry's position in the log (first entry is 1).
    pub index: u64,
    /// Opaque payload.
    pub data: Bytes,
}

/// Bytes an entry counts for against the size limits (payload plus a fixed header estimate).
pub const ENTRY_OVERHEAD_BYTES: u64 = 24;
// A zero overhead would let empty entries slip past every byte limit.
const _: () = assert!(ENTRY_OVERHEAD_BYTES > 0);

impl Entry {
    /// The size an entry counts for in message and memory limits.
    pub fn size_bytes(&self) -> u64 {
        self.data.len() as u64 + ENTRY_OVERHEAD_BYTES
    }
}

/// The state that must be durable before the messages that depend on it go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HardState {
    /// The current term.
    pub term: u64,
    /// The member voted for in `term` (0: none).
    pub vote: u64,
    /// The highest index known committed.
    pub commit: u64,
}

/// Cluster membership: voters count toward quorum, learners only receive the log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfState {
    /// Voting members, sorted.
    pub voters: Vec<u64>,
    /// Non-voting members, sorted.
    pub learners: Vec<u64>,
}

/// Where a snapshot sits in the log and the membership at that point.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotMetadata {
    /// Membership as of `index`.
    pub conf_state: ConfState,
    /// The last log index the snapshot covers.
    pub index: u64,
    /// The term of the entry at `index`.
    pub term: u64,
}

/// A snapshot: metadata plus opaque application state.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Position and membership.
    pub metadata: SnapshotMetadata,
    /// Opaque application state (the server's MVCC image).
    pub data: Bytes,
}

impl Snapshot {
    /// True for the placeholder "no snapshot" value (index 0).
    pub fn is_empty(&self) -> bool {
        self.metadata.index == 0
    }
}

/// Kinds of membership change (one at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfChangeType {
    /// Add a voter, or promote an existing learner to voter.
    AddNode,
    /// Add a learner (a new member always starts as a learner, then is promoted).
    AddLearnerNode,
    /// Remove a voter or learner.
    RemoveNode,
}

/// One membership change, proposed as the data of an `EntryType::ConfChange` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfChange {
    /// What to do.
    pub change_type: ConfChangeType,
    /// To whom.
    pub node_id: u64,
    /// Opaque application context (for example the member's peer URLs).
    pub context: Bytes,
}

/// Peer message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageType {
    /// Log replication (leader to follower).
    #[default]
    Append,
    /// Reply to Append or Snapshot.
    AppendResponse,
    /// Request a vote.
    RequestVote,
    /// Reply to RequestVote.
    RequestVoteResponse,
    /// Pre-vote: would you vote for me? (changes no state on the receiver).
    RequestPreVote,
    /// Reply to RequestPreVote.
    RequestPreVoteResponse,
    /// Snapshot install (leader to a follower too far behind).
    Snapshot,
    /// Leader liveness and commit propagation; `context` carries a read-index round.
    Heartbeat,
    /// Reply to Heartbeat, echoing `context`.
    HeartbeatResponse,
    /// A proposal forwarded from a follower to the leader.
    Propose,
    /// Ask the leader to hand leadership over to `from` (forwarded by followers).
    TransferLeader,
    /// Tell the transfer target to campaign now, skipping pre-vote and leases.
    TimeoutNow,
    /// A read-index request forwarded from a follower to the leader.
    ReadIndex,
    /// The leader's answer to ReadIndex: `index` is the read index, `context` the request.
    ReadIndexResponse,
}

const MESSAGE_TYPES: [MessageType; 14] = [
    MessageType::Append,
    MessageType::AppendResponse,
    MessageType::RequestVote,
    MessageType::RequestVoteResponse,
    MessageType::RequestPreVote,
    MessageType::RequestPreVoteResponse,
    MessageType::Snapshot,
    MessageType::Heartbeat,
    MessageType::HeartbeatResponse,
    MessageType::Propose,
    MessageType::TransferLeader,
    MessageType::TimeoutNow,
    MessageType::ReadIndex,
    MessageType::ReadIndexResponse,
];

/// A peer message. Unused fields stay zero/empty and cost one byte each on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    /// Kind.
    pub msg_type: MessageType,
    /// Recipient member id.
    pub to: u64,
    /// Sender member id.
    pub from: u64,
    /// Sender's term (for pre-vote: the term it would campaign in).
    pub term: u64,
    /// Append: term of the entry at `index`; vote: last log term; reject: hint term.
    pub log_term: u64,
    /// Append: index preceding `entries`; response: last index; vote: last log index.
    pub index: u64,
    /// Entries to append (Append, Propose).
    pub entries: Vec<Entry>,
    /// Leader's commit index (Append, Heartbeat).
    pub commit: u64,
    /// Snapshot to install (Snapshot).
    pub snapshot: Option<Snapshot>,
    /// The request was refused.
    pub reject: bool,
    /// On a rejected append: the index the follower suggests probing next.
    pub reject_hint: u64,
    /// Opaque context: read-index round/request, or the campaign-transfer marker on votes.
    pub context: Bytes,
}

/// Most entries one decoded message may hold (a bound on decode allocations).
pub const DECODE_ENTRIES_MAX: u64 = 1 << 20;
const _: () = assert!(
    MESSAGE_TYPES.len() < 256,
    "message types are encoded in one byte"
);

// ---------------------------------------------------------------------------------------------
// Primitive codec.

fn put_u64(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    put_u64(buf, b.len() as u64);
    buf.extend_from_slice(b);
}

/// A bounds-checked reader over an input slice.
struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
    /// `input` as a shared buffer, when the caller has one: byte strings are then slices of
    /// it, not copies (a follower's appended entries point into the frame they came in).
    shared: Option<&'a Bytes>,
}

impl<'a> Reader<'a> {
    fn new(input: &'a [u8]) -> Self {
        Reader {
            input,
            pos: 0,
            shared: None,
        }
    }

    fn shared(input: &'a Bytes) -> Self {
        Reader {
            input,
            pos: 0,
            shared: Some(input),
        }
    }

    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    fn u8(&mut self) -> Result<u8> {
        let b = *self
            .input
            .get(self.pos)
            .ok_or(Error::Decode("truncated input"))?;
        self.pos += 1;
        Ok(b)
    }

    fn u64(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(Error::Decode("varint overflows u64"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::Decode("varint too long"))
    }

    fn bytes(&mut self) -> Result<Bytes> {
        let len = self.u64()?;
        if len > self.remaining() as u64 {
            return Err(Error::Decode("byte string longer than input"));
        }
        let len = len as usize;
        let range = self.pos..self.pos + len;
        let out = match self.shared {
            Some(shared) => shared.slice(range),
            None => Bytes::copy_from_slice(&self.input[range]),
        };
        self.pos += len;
        Ok(out)
    }

    fn finish(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(Error::Decode("trailing bytes"));
        }
        Ok(())
    }
}

fn decode_whole<T>(input: &[u8], f: impl FnOnce(&mut Reader<'_>) -> Result<T>) -> Result<T> {
    read_whole(Reader::new(input), f)
}

fn read_whole<T>(mut r: Reader<'_>, f: impl FnOnce(&mut Reader<'_>) -> Result<T>) -> Result<T> {
    let v = f(&mut r)?;
    r.finish()?;
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Per-type codec.

impl Entry {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        buf.push(match self.entry_type {
            EntryType::Normal => 0,
            EntryType::ConfChange => 1,
        });
        put_u64(buf, self.term);
        put_u64(buf, self.index);
        put_bytes(buf, &self.data);
    }

    /// Decodes exactly one entry from `input`.
    pub fn decode(input: &[u8]) -> Result<Entry> {
        decode_whole(input, Entry::read)
    }

    /// As `decode`, with the entry's data a slice of `input`, not a copy.
    pub fn decode_shared(input: &Bytes) -> Result<Entry> {
        read_whole(Reader::shared(input), Entry::read)
    }

    fn read(r: &mut Reader<'_>) -> Result<Entry> {
        let entry_type = match r.u8()? {
            0 => EntryType::Normal,
            1 => EntryType::ConfChange,
            _ => return Err(Error::Decode("unknown entry type")),
        };
        Ok(Entry {
            entry_type,
            term: r.u64()?,
            index: r.u64()?,
            data: r.bytes()?,
        })
    }
}

impl HardState {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        put_u64(buf, self.term);
        put_u64(buf, self.vote);
        put_u64(buf, self.commit);
    }

    /// Decodes exactly one hard state from `input`.
    pub fn decode(input: &[u8]) -> Result<HardState> {
        decode_whole(input, |r| {
            Ok(HardState {
                term: r.u64()?,
                vote: r.u64()?,
                commit: r.u64()?,
            })
        })
    }
}

fn put_ids(buf: &mut Vec<u8>, ids: &[u64]) {
    put_u64(buf, ids.len() as u64);
    for id in ids {
        put_u64(buf, *id);
    }
}

fn read_ids(r: &mut Reader<'_>) -> Result<Vec<u64>> {
    let n = r.u64()?;
    // Each id takes at least one byte, so a count beyond the input is garbage.
    if n > r.remaining() as u64 {
        return Err(Error::Decode("id count longer than input"));
    }
    (0..n).map(|_| r.u64()).collect()
}

impl ConfState {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        put_ids(buf, &self.voters);
        put_ids(buf, &self.learners);
    }

    /// Decodes exactly one conf state from `input`.
    pub fn decode(input: &[u8]) -> Result<ConfState> {
        decode_whole(input, ConfState::read)
    }

    fn read(r: &mut Reader<'_>) -> Result<ConfState> {
        Ok(ConfState {
            voters: read_ids(r)?,
            learners: read_ids(r)?,
        })
    }
}

impl SnapshotMetadata {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        self.conf_state.encode(buf);
        put_u64(buf, self.index);
        put_u64(buf, self.term);
    }

    /// Decodes exactly one snapshot metadata from `input`.
    pub fn decode(input: &[u8]) -> Result<SnapshotMetadata> {
        decode_whole(input, SnapshotMetadata::read)
    }

    fn read(r: &mut Reader<'_>) -> Result<SnapshotMetadata> {
        Ok(SnapshotMetadata {
            conf_state: ConfState::read(r)?,
            index: r.u64()?,
            term: r.u64()?,
        })
    }
}

impl Snapshot {
    /// Appends the encoding (metadata, then data) to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        self.metadata.encode(buf);
        put_bytes(buf, &self.data);
    }

    /// Decodes exactly one snapshot from `input`.
    pub fn decode(input: &[u8]) -> Result<Snapshot> {
        decode_whole(input, Snapshot::read)
    }

    fn read(r: &mut Reader<'_>) -> Result<Snapshot> {
        Ok(Snapshot {
            metadata: SnapshotMetadata::read(r)?,
            data: r.bytes()?,
        })
    }
}

impl ConfChange {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        buf.push(match self.change_type {
            ConfChangeType::AddNode => 0,
            ConfChangeType::AddLearnerNode => 1,
            ConfChangeType::RemoveNode => 2,
        });
        put_u64(buf, self.node_id);
        put_bytes(buf, &self.context);
    }

    /// Decodes exactly one conf change from `input`.
    pub fn decode(input: &[u8]) -> Result<ConfChange> {
        decode_whole(input, |r| {
            let change_type = match r.u8()? {
                0 => ConfChangeType::AddNode,
                1 => ConfChangeType::AddLearnerNode,
                2 => ConfChangeType::RemoveNode,
                _ => return Err(Error::Decode("unknown conf change type")),
            };
            Ok(ConfChange {
                change_type,
                node_id: r.u64()?,
                context: r.bytes()?,
            })
        })
    }
}

impl Message {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        let tag = MESSAGE_TYPES
            .iter()
            .position(|t| *t == self.msg_type)
            .expect("every message type is listed in MESSAGE_TYPES");
        buf.push(tag as u8);
        for v in [
            self.to,
            self.from,
            self.term,
            self.log_term,
            self.index,
            self.commit,
        ] {
            put_u64(buf, v);
        }
        buf.push(u8::from(self.reject));
        put_u64(buf, self.reject_hint);
        put_bytes(buf, &self.context);
        put_u64(buf, self.entries.len() as u64);
        for e in &self.entries {
            e.encode(buf);
        }
        match &self.snapshot {
            None => buf.push(0),
            Some(s) => {
                buf.push(1);
                s.encode(buf);
            }
        }
    }

    /// Decodes exactly one message from `input`.
    pub fn decode(input: &[u8]) -> Result<Message> {
        decode_whole(input, Message::read)
    }

    /// As `decode`, with the entries' payloads, the context and a snapshot's data as slices
    /// of `input` instead of copies: one allocation and one copy less per entry where a
    /// follower takes an append, which then keeps `input` alive while any of them lives.
    pub fn decode_shared(input: &Bytes) -> Result<Message> {
        read_whole(Reader::shared(input), Message::read)
    }

    fn read(r: &mut Reader<'_>) -> Result<Message> {
        let tag = r.u8()? as usize;
        let msg_type = *MESSAGE_TYPES
            .get(tag)
            .ok_or(Error::Decode("unknown message type"))?;
        let mut m = Message {
            msg_type,
            to: r.u64()?,
            from: r.u64()?,
            term: r.u64()?,
            log_term: r.u64()?,
            index: r.u64()?,
            commit: r.u64()?,
            ..Message::default()
        };
        m.reject = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(Error::Decode("reject flag is not 0 or 1")),
        };
        m.reject_hint = r.u64()?;
        m.context = r.bytes()?;
        let n = r.u64()?;
        // An entry encodes to at least 4 bytes; a count beyond that is garbage.
        if n > DECODE_ENTRIES_MAX || n > (r.remaining() / 4) as u64 {
            return Err(Error::Decode("entry count longer than input"));
        }
        m.entries.reserve(n as usize);
        for _ in 0..n {
            m.entries.push(Entry::read(r)?);
        }
        m.snapshot = match r.u8()? {
            0 => None,
            1 => Some(Snapshot::read(r)?),
            _ => return Err(Error::Decode("snapshot flag is not 0 or 1")),
        };
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn sample_message() -> Message {
        Message {
            msg_type: MessageType::Snapshot,
            to: 2,
            from: 1,
            term: u64::MAX,
            log_term: 7,
            index: 300,
            entries: vec![
                Entry {
                    entry_type: EntryType::ConfChange,
                    term: 3,
                    index: 4,
                    data: Bytes::from_static(b"cc"),
                },
                Entry {
                    entry_type: EntryType::Normal,
                    term: 3,
                    index: 5,
                    data: Bytes::new(),
                },
            ],
            commit: 128,
            snapshot: Some(Snapshot {
                metadata: SnapshotMetadata {
                    conf_state: ConfState {
                        voters: vec![1, 2, 3],
                        learners: vec![4],
                    },
                    index: 100,
                    term: 2,
                },
                data: Bytes::from_static(b"state"),
            }),
            reject: true,
            reject_hint: 99,
            context: Bytes::from_static(b"ctx"),
        }
    }

    #[test]
    fn message_round_trips() {
        let m = sample_message();
        let mut buf = Vec::new();
        m.encode(&mut buf);
        assert_eq!(Message::decode(&buf).expect("valid encoding"), m);
        let empty = Message::default();
        buf.clear();
        empty.encode(&mut buf);
        assert_eq!(Message::decode(&buf).expect("valid encoding"), empty);
    }

    /// `decode_shared` reads what `decode` reads, and its payloads lie inside the input
    /// buffer (fails if they were copies); bad input is refused the same way by both.
    #[test]
    fn a_shared_decode_slices_the_input_and_agrees_with_decode() {
        let m = sample_message();
        let mut buf = Vec::new();
        m.encode(&mut buf);
        let input = Bytes::from(buf.clone());
        let shared = Message::decode_shared(&input).expect("valid encoding");
        assert_eq!(shared, m);
        let inside = input.as_ptr_range();
        let payloads = shared
            .entries
            .iter()
            .map(|e| &e.data)
            .chain([&shared.context]);
        for data in payloads.filter(|d| !d.is_empty()) {
            let range = data.as_ptr_range();
            assert!(
                inside.start <= range.start && range.end <= inside.end,
                "a payload was copied out of the frame"
            );
        }
        for len in 0..buf.len() {
            let prefix = input.slice(..len);
            assert_eq!(
                Message::decode_shared(&prefix).is_err(),
                Message::decode(&buf[..len]).is_err()
            );
        }
        let mut long = buf;
        long.push(0);
        assert_eq!(
            Message::decode_shared(&Bytes::from(long)),
            Err(Error::Decode("trailing bytes"))
        );
    }

    #[test]
    fn records_round_trip() {
        let hs = HardState {
            term: 5,
            vote: 3,
            commit: 1 << 40,
        };
        let mut buf = Vec::new();
        hs.encode(&mut buf);
        assert_eq!(HardState::decode(&buf), Ok(hs));
        let cc = ConfChange {
            change_type: ConfChangeType::RemoveNode,
            node_id: 9,
            context: Bytes::from_static(b"x"),
        };
        buf.clear();
        cc.encode(&mut buf);
        assert_eq!(ConfChange::decode(&buf), Ok(cc));
        let snap = sample_message().snapshot.expect("sample has a snapshot");
        buf.clear();
        snap.metadata.encode(&mut buf);
        assert_eq!(SnapshotMetadata::decode(&buf), Ok(snap.metadata.clone()));
    }

    #[test]
    fn truncations_and_garbage_are_errors() {
        let mut buf = Vec::new();
        sample_message().encode(&mut buf);
        for len in 0..buf.len() {
            assert!(
                Message::decode(&buf[..len]).is_err(),
                "prefix of {len} bytes decoded"
            );
        }
        let mut long = buf.clone();
        long.push(0);
        assert_eq!(Message::decode(&long), Err(Error::Decode("trailing bytes")));
        // Random garbage and random bit flips never panic.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let mut g = buf.clone();
            let flips = rng.gen_range(1..4);
            for _ in 0..flips {
                let i = rng.gen_range(0..g.len());
                g[i] = rng.gen();
            }
            let _ = Message::decode(&g);
            let n = rng.gen_range(0..64);
            let junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            let _ = Message::decode(&junk);
            let _ = Entry::decode(&junk);
            let _ = Snapshot::decode(&junk);
        }
        // A varint with too many continuation bytes is refused.
        assert!(HardState::decode(&[0xff; 11]).is_err());
    }
}
