//! The on-disk format: batches of framed records, packed back to back in a segment.
//!
//! A segment is a zero-filled file. It holds batches, each starting at an 8-byte aligned offset right
//! after the previous one (batches are packed, so the next batch rewrites the previous batch's last,
//! partial 4 KiB block). After the last batch the segment is zero: a batch header whose bytes are all
//! zero marks the clean end of the segment's data.
//!
//! Batch header (32 bytes, little-endian):
//! `magic u32 | header_crc u32 (over bytes 8..32) | batch_seq u64 | body_bytes u32 | record_count u32 | reserved u64 = 0`
//!
//! Record frame (20-byte header, then the payload, then zero padding to 8 bytes):
//! `frame_bytes u32 (header + payload, unpadded) | crc u32 | index u64 | kind u8 | reserved [u8; 3] = 0 | payload`
//! The crc covers `frame_bytes` and every byte from offset 8 to `frame_bytes` (index, kind, reserved,
//! payload): the exact bytes, never the padding, which must be zero.
//!
//! Why a batch header: a crash can tear only the last batch (a batch is written only after the previous
//! one was fdatasync'ed), and the batch sequence number lets recovery tell that torn tail (nothing valid
//! after it) from corruption in the middle (a valid batch with a later sequence number after it).

use bytes::Bytes;

/// The I/O unit: every write covers whole blocks at block-aligned offsets (O_DIRECT).
pub const BLOCK_BYTES: usize = 4096;
/// Size of the header that starts every batch.
pub const BATCH_HEADER_BYTES: usize = 32;
/// Size of the header that starts every record frame.
pub const FRAME_HEADER_BYTES: usize = 20;
/// Batches and frames start at offsets that are multiples of this.
pub const FRAME_ALIGN_BYTES: usize = 8;

/// "KWAL", little-endian. Zero is never a valid magic, so a zero header reads as "no more batches".
const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"KWAL");

const _: () = assert!(BLOCK_BYTES % 512 == 0, "O_DIRECT needs 512-byte multiples");
const _: () = assert!(BLOCK_BYTES.is_power_of_two());
const _: () = assert!(BATCH_HEADER_BYTES % FRAME_ALIGN_BYTES == 0);
const _: () = assert!(BLOCK_BYTES % FRAME_ALIGN_BYTES == 0);
const _: () = assert!(BATCH_MAGIC != 0);

/// One log record: a caller-defined kind, the raft index it covers, and opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Caller-defined record type (entry, hard state, snapshot marker, ...). Opaque to the WAL.
    pub kind: u8,
    /// The raft index this record covers; `Wal::release_before` uses it to free whole segments.
    pub index: u64,
    /// The record's bytes, stored and returned exactly.
    pub payload: Bytes,
}

/// Rounds `n` up to a multiple of `align` (a power of two).
pub(crate) const fn align_up(n: usize, align: usize) -> usize {
    (n + align - 1) & !(align - 1)
}

/// Rounds `n` down to a multiple of `align` (a power of two).
pub(crate) const fn align_down(n: usize, align: usize) -> usize {
    n & !(align - 1)
}

/// Bytes a record occupies inside a batch body, padding included.
pub(crate) fn frame_padded_bytes(payload_bytes: usize) -> usize {
    align_up(FRAME_HEADER_BYTES + payload_bytes, FRAME_ALIGN_BYTES)
}

fn frame_crc(frame: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&frame[0..4]);
    hasher.update(&frame[8..]);
    hasher.finalize()
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("slice of 4 bytes"))
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("slice of 8 bytes"))
}

/// Appends one record frame, padded with zeros to `FRAME_ALIGN_BYTES`.
pub(crate) fn encode_frame(out: &mut Vec<u8>, record: &Record) {
    let start = out.len();
    assert!(
        start % FRAME_ALIGN_BYTES == 0,
        "frames start 8-byte aligned"
    );
    let frame_bytes = FRAME_HEADER_BYTES + record.payload.len();
    let frame_bytes_u32 =
        u32::try_from(frame_bytes).expect("record size is bounded by batch_bytes_max");
    out.extend_from_slice(&frame_bytes_u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // crc, filled below
    out.extend_from_slice(&record.index.to_le_bytes());
    out.push(record.kind);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&record.payload);
    let crc = frame_crc(&out[start..start + frame_bytes]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out.resize(start + frame_padded_bytes(record.payload.len()), 0);
}

/// Appends one batch (header and frames) to `out`, which must end 8-byte aligned relative to the
/// segment (the caller lays batches out in segment coordinates).
pub(crate) fn encode_batch<'a>(
    out: &mut Vec<u8>,
    batch_seq: u64,
    records: impl Iterator<Item = &'a Record>,
) {
    let start = out.len();
    assert!(
        start % FRAME_ALIGN_BYTES == 0,
        "batches start 8-byte aligned"
    );
    out.resize(start + BATCH_HEADER_BYTES, 0);
    let mut record_count: u32 = 0;
    for record in records {
        encode_frame(out, record);
        record_count += 1;
    }
    assert!(record_count > 0, "a batch holds at least one record");
    let body_bytes = u32::try_from(out.len() - start - BATCH_HEADER_BYTES)
        .expect("batch size is bounded by batch_bytes_max");
    let header = &mut out[start..start + BATCH_HEADER_BYTES];
    header[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    header[8..16].copy_from_slice(&batch_seq.to_le_bytes());
    header[16..20].copy_from_slice(&body_bytes.to_le_bytes());
    header[20..24].copy_from_slice(&record_count.to_le_bytes());
    let header_crc = crc32fast::hash(&header[8..BATCH_HEADER_BYTES]);
    header[4..8].copy_from_slice(&header_crc.to_le_bytes());
}

/// The fields of a batch header whose magic and crc check out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub batch_seq: u64,
    pub body_bytes: usize,
    pub record_count: usize,
}

/// Decodes a batch header at `pos`, or `None` when it is not a well-formed header.
pub(crate) fn decode_header(buf: &[u8], pos: usize) -> Option<BatchHeader> {
    if pos + BATCH_HEADER_BYTES > buf.len() {
        return None;
    }
    let header = &buf[pos..pos + BATCH_HEADER_BYTES];
    if u32_at(header, 0) != BATCH_MAGIC || u32_at(header, 4) != crc32fast::hash(&header[8..]) {
        return None;
    }
    if u64_at(header, 24) != 0 {
        return None;
    }
    Some(BatchHeader {
        batch_seq: u64_at(header, 8),
        body_bytes: u32_at(header, 16) as usize,
        record_count: u32_at(header, 20) as usize,
    })
}

/// What the bytes at a batch position hold.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BatchParse {
    /// No batch here: the header bytes are all zero or the segment has no room for a header.
    End,
    /// A complete batch whose every record checks out; the next batch starts at `next_pos`.
    Valid {
        batch_seq: u64,
        next_pos: usize,
        records: Vec<Record>,
    },
    /// Something that is neither a batch nor the end: a torn write or corruption.
    Invalid { reason: String },
}

/// Parses the batch starting at `pos` in a segment's bytes.
pub(crate) fn parse_batch(buf: &[u8], pos: usize) -> BatchParse {
    assert!(pos % FRAME_ALIGN_BYTES == 0, "batches start 8-byte aligned");
    if pos + BATCH_HEADER_BYTES > buf.len() {
        return BatchParse::End;
    }
    let header_bytes = &buf[pos..pos + BATCH_HEADER_BYTES];
    if header_bytes.iter().all(|b| *b == 0) {
        return BatchParse::End;
    }
    let Some(header) = decode_header(buf, pos) else {
        return BatchParse::Invalid {
            reason: "batch header magic or crc mismatch".to_string(),
        };
    };
    let body_start = pos + BATCH_HEADER_BYTES;
    let body_end = body_start + header.body_bytes;
    if body_end > buf.len()
        || header.body_bytes % FRAME_ALIGN_BYTES != 0
        || header.record_count == 0
    {
        return BatchParse::Invalid {
            reason: format!(
                "batch header claims {} body bytes and {} records, which do not fit",
                header.body_bytes, header.record_count
            ),
        };
    }
    let mut records = Vec::with_capacity(
        header
            .record_count
            .min(header.body_bytes / FRAME_HEADER_BYTES),
    );
    let mut at = body_start;
    while at < body_end {
        match parse_frame(&buf[at..body_end]) {
            Ok((record, padded)) => {
                records.push(record);
                at += padded;
            }
            Err(reason) => {
                return BatchParse::Invalid {
                    reason: format!("record at offset {at}: {reason}"),
                }
            }
        }
    }
    if records.len() != header.record_count {
        return BatchParse::Invalid {
            reason: format!(
                "batch holds {} records, header says {}",
                records.len(),
                header.record_count
            ),
        };
    }
    BatchParse::Valid {
        batch_seq: header.batch_seq,
        next_pos: body_end,
        records,
    }
}

/// Parses one frame at the start of `buf`; returns the record and the padded frame size.
pub(crate) fn parse_frame(buf: &[u8]) -> Result<(Record, usize), String> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Err("torn frame header".to_string());
    }
    let frame_bytes = u32_at(buf, 0) as usize;
    if frame_bytes < FRAME_HEADER_BYTES {
        return Err(format!(
            "frame length {frame_bytes} is shorter than a frame header"
        ));
    }
    let padded = align_up(frame_bytes, FRAME_ALIGN_BYTES);
    if padded > buf.len() {
        return Err(format!("frame length {frame_bytes} runs past the batch"));
    }
    let frame = &buf[..frame_bytes];
    if u32_at(frame, 4) != frame_crc(frame) {
        return Err("record crc mismatch".to_string());
    }
    if frame[17..20] != [0; 3] || buf[frame_bytes..padded].iter().any(|b| *b != 0) {
        return Err("non-zero reserved or padding bytes".to_string());
    }
    let record = Record {
        kind: frame[16],
        index: u64_at(frame, 8),
        payload: Bytes::copy_from_slice(&frame[FRAME_HEADER_BYTES..]),
    };
    Ok((record, padded))
}

/// Finds a well-formed batch header at or after `from` whose sequence number is at least
/// `min_batch_seq`: proof that data was acknowledged after a bad spot, i.e. that the bad spot is
/// corruption rather than a torn tail.
pub(crate) fn find_later_header(
    buf: &[u8],
    from: usize,
    min_batch_seq: Option<u64>,
) -> Option<usize> {
    let mut pos = align_up(from, FRAME_ALIGN_BYTES);
    while pos + BATCH_HEADER_BYTES <= buf.len() {
        if u32_at(buf, pos) == BATCH_MAGIC {
            if let Some(header) = decode_header(buf, pos) {
                if min_batch_seq.is_none_or(|min| header.batch_seq >= min) {
                    return Some(pos);
                }
            }
        }
        pos += FRAME_ALIGN_BYTES;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, index: u64, payload: &[u8]) -> Record {
        Record {
            kind,
            index,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    fn batch(seq: u64, records: &[Record]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_batch(&mut out, seq, records.iter());
        out
    }

    #[test]
    fn batch_round_trips_including_empty_payloads() {
        let records = vec![
            record(1, 7, b"hello"),
            record(2, 7, b""),
            record(255, 9, &[0xAB; 300]),
        ];
        let mut buf = batch(42, &records);
        let end = buf.len();
        buf.resize(BLOCK_BYTES, 0);
        assert_eq!(
            parse_batch(&buf, 0),
            BatchParse::Valid {
                batch_seq: 42,
                next_pos: end,
                records
            }
        );
        assert_eq!(parse_batch(&buf, end), BatchParse::End);
    }

    #[test]
    fn crc_mismatch_in_payload_is_invalid() {
        let mut buf = batch(1, &[record(1, 1, b"payload bytes")]);
        let last_payload_byte = BATCH_HEADER_BYTES + FRAME_HEADER_BYTES + 12;
        buf[last_payload_byte] ^= 0x01;
        match parse_batch(&buf, 0) {
            BatchParse::Invalid { reason } => assert!(reason.contains("crc"), "{reason}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn torn_length_is_invalid() {
        // A frame length that points past the batch end, as a torn or flipped length would.
        let mut buf = batch(1, &[record(1, 1, b"abc"), record(1, 2, b"def")]);
        let frame_len_at = BATCH_HEADER_BYTES;
        buf[frame_len_at..frame_len_at + 4].copy_from_slice(&4000u32.to_le_bytes());
        assert!(matches!(parse_batch(&buf, 0), BatchParse::Invalid { .. }));
        // A frame length shorter than a header.
        let mut buf = batch(1, &[record(1, 1, b"abc")]);
        buf[frame_len_at..frame_len_at + 4].copy_from_slice(&3u32.to_le_bytes());
        assert!(matches!(parse_batch(&buf, 0), BatchParse::Invalid { .. }));
        // A batch cut short: its body runs past the end of the buffer.
        let buf = batch(1, &[record(1, 1, &[7; 100])]);
        assert!(matches!(
            parse_batch(&buf[..buf.len() - 8], 0),
            BatchParse::Invalid { .. }
        ));
    }

    #[test]
    fn padding_is_recognised_and_must_be_zero() {
        // Zero bytes after the last batch are the end, also right at the end of the buffer.
        let mut buf = batch(3, &[record(1, 1, b"x")]);
        let end = buf.len();
        assert_eq!(end % FRAME_ALIGN_BYTES, 0);
        assert_eq!(parse_batch(&buf, end), BatchParse::End);
        buf.resize(BLOCK_BYTES, 0);
        assert_eq!(parse_batch(&buf, end), BatchParse::End);
        assert_eq!(
            parse_batch(&buf, BLOCK_BYTES - 16),
            BatchParse::End,
            "no room for a header"
        );
        // Non-zero padding inside a frame is rejected: the crc does not cover it.
        let pad_at = BATCH_HEADER_BYTES + FRAME_HEADER_BYTES + 1;
        buf[pad_at] = 0xFF;
        assert!(matches!(parse_batch(&buf, 0), BatchParse::Invalid { .. }));
    }

    #[test]
    fn header_damage_is_invalid_and_later_headers_are_found() {
        let mut buf = batch(5, &[record(1, 1, b"first")]);
        let second_at = buf.len();
        encode_batch(&mut buf, 6, [record(1, 2, b"second")].iter());
        assert_eq!(find_later_header(&buf, 8, Some(5)), Some(second_at));
        assert_eq!(
            find_later_header(&buf, 8, Some(7)),
            None,
            "older batches do not count"
        );
        buf[8] ^= 0x10; // batch_seq of the first header: its crc no longer matches
        assert!(matches!(parse_batch(&buf, 0), BatchParse::Invalid { .. }));
        assert!(matches!(
            parse_batch(&buf, second_at),
            BatchParse::Valid { batch_seq: 6, .. }
        ));
    }

    #[test]
    fn alignment_helpers() {
        assert_eq!(align_up(0, 8), 0);
        assert_eq!(align_up(1, 8), 8);
        assert_eq!(align_up(4097, BLOCK_BYTES), 8192);
        assert_eq!(align_down(4097, BLOCK_BYTES), 4096);
        assert_eq!(frame_padded_bytes(0), 24);
        assert_eq!(frame_padded_bytes(4), 24);
        assert_eq!(frame_padded_bytes(5), 32);
    }
}
