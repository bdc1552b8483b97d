//! Sans-I/O gRPC message framing (5-byte prefix: compressed flag + big-endian u32 length) and
//! `grpc-timeout` parsing. Nothing here touches a socket, a clock or h2.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::status::{Code, Status};

/// Length of the gRPC message prefix: one flag byte and a u32 length.
pub const PREFIX_BYTES: usize = 5;

const _: () = assert!(PREFIX_BYTES == 1 + std::mem::size_of::<u32>());

/// grpc-go's default send limit (math.MaxInt32).
pub const DEFAULT_MAX_SEND_MESSAGE_BYTES: usize = i32::MAX as usize;

/// etcd's default receive limit: max-request-bytes (1.5 MiB) plus 512 KiB of gRPC overhead.
pub const DEFAULT_MAX_RECV_MESSAGE_BYTES: usize = 1_572_864 + 512 * 1024;

/// Encodes `message` as one framed gRPC message with exactly one allocation.
///
/// Fails with grpc-go's ResourceExhausted text when the encoded message is over `max_bytes`.
pub fn encode_message<M: prost::Message>(message: &M, max_bytes: usize) -> Result<Bytes, Status> {
    let length_bytes = message.encoded_len();
    let mut frame = BytesMut::with_capacity(PREFIX_BYTES + length_bytes);
    put_prefix(&mut frame, length_bytes, max_bytes)?;
    message
        .encode(&mut frame)
        .expect("capacity was reserved from encoded_len");
    assert_eq!(frame.len(), PREFIX_BYTES + length_bytes);
    Ok(frame.freeze())
}

/// Writes the 5-byte prefix of a message of `length_bytes`, or fails with grpc-go's
/// ResourceExhausted text when that is over `max_bytes`.
pub fn put_prefix(
    frame: &mut BytesMut,
    length_bytes: usize,
    max_bytes: usize,
) -> Result<(), Status> {
    if length_bytes > max_bytes || length_bytes > u32::MAX as usize {
        return Err(Status::new(
            Code::ResourceExhausted,
            format!(
                "grpc: trying to send message larger than max ({length_bytes} vs. {max_bytes})"
            ),
        ));
    }
    frame.put_u8(0);
    frame.put_u32(u32::try_from(length_bytes).expect("checked against u32::MAX above"));
    Ok(())
}

/// The size a piece of a message encoded piece by piece aims at (see [`PieceEncode`]): large
/// enough that the per-piece work (a flow-control check, one DATA frame hand-off) is noise,
/// small enough that a stream holds little while the client reads.
pub const PIECE_BYTES_TARGET: usize = 128 * 1024;

/// A message whose encoding is produced piece by piece, so that an answer of any size is sent
/// with memory for one piece: its length comes first (the gRPC prefix carries it), then each
/// call appends the next part. The pieces together are exactly the message's encoding.
pub trait PieceEncode {
    /// The length of the whole encoding: exactly what the pieces add up to.
    fn encoded_len(&self) -> usize;
    /// Appends the next part of the encoding to `buf`, stopping once `buf` holds at least
    /// `target_bytes` (a part is never split, so it may hold more) or the message is done.
    /// Returns true while more remains. An error ends the call with its status: a message
    /// read while it is sent (a range's rest) can find it no longer has what it promised.
    /// Once part of the message was sent the stream is reset instead, as a torn message
    /// cannot be followed by trailers.
    fn encode_piece(&mut self, buf: &mut BytesMut, target_bytes: usize) -> Result<bool, Status>;

    /// What to wait for before the next `encode_piece`, awaited by the sender without
    /// blocking its thread: e.g. another thread bringing into memory the disk pages the next
    /// piece reads. None (the default) when the next piece needs nothing. A message that
    /// prepares may end a piece early, short of `target_bytes`, once what was prepared is
    /// encoded, so that the next piece is prepared too.
    fn prepare(&mut self) -> Option<PieceWait> {
        None
    }
}

/// A wait [`PieceEncode::prepare`] asks for.
pub type PieceWait = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// Any prost message, encoded as one piece.
#[derive(Debug)]
pub struct Whole<M>(pub M);

impl<M: prost::Message> PieceEncode for Whole<M> {
    fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }

    fn encode_piece(&mut self, buf: &mut BytesMut, _target_bytes: usize) -> Result<bool, Status> {
        self.0.encode_raw(buf);
        Ok(false)
    }
}

/// Frames an already encoded message body (one allocation, one copy).
pub fn frame_bytes(body: &[u8]) -> Bytes {
    let length = u32::try_from(body.len()).expect("a gRPC message is at most u32::MAX bytes");
    let mut frame = BytesMut::with_capacity(PREFIX_BYTES + body.len());
    frame.put_u8(0);
    frame.put_u32(length);
    frame.put_slice(body);
    frame.freeze()
}

/// Reassembles gRPC messages from DATA chunks. Holds at most one partial message (bounded by
/// the receive limit) plus the chunk that completed it.
#[derive(Debug)]
pub struct MessageDecoder {
    buffer: BytesMut,
    max_message_bytes: usize,
}

impl MessageDecoder {
    pub fn new(max_message_bytes: usize) -> MessageDecoder {
        assert!(max_message_bytes > 0);
        MessageDecoder {
            buffer: BytesMut::new(),
            max_message_bytes,
        }
    }

    /// Appends one DATA chunk as received.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// Bytes held that do not yet form a whole message.
    pub fn buffered_bytes(&self) -> usize {
        self.buffer.len()
    }

    /// Returns the next complete message body, `Ok(None)` when more bytes are needed, or the
    /// status the call must end with (compressed flag, oversized message).
    pub fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buffer.len() < PREFIX_BYTES {
            return Ok(None);
        }
        let flag = self.buffer[0];
        let length_bytes = u32::from_be_bytes(
            self.buffer[1..PREFIX_BYTES]
                .try_into()
                .expect("the prefix has four length bytes"),
        );
        match flag {
            0 => {}
            // We advertise no grpc-accept-encoding, so a compressed message is the peer's bug.
            1 => {
                return Err(Status::new(
                    Code::Internal,
                    "grpc: compressed flag set with identity or empty encoding",
                ))
            }
            other => {
                return Err(Status::new(
                    Code::Internal,
                    format!("grpc: received unexpected payload format {other}"),
                ))
            }
        }
        // Checked on the prefix, before buffering the body, so an oversized message never
        // occupies memory.
        if u64::from(length_bytes) > self.max_message_bytes as u64 {
            return Err(Status::message_too_large(
                u64::from(length_bytes),
                self.max_message_bytes,
            ));
        }
        let total_bytes = PREFIX_BYTES + length_bytes as usize;
        if self.buffer.len() < total_bytes {
            // Reserve once for the whole message so the body is copied at most once more.
            self.buffer.reserve(total_bytes - self.buffer.len());
            return Ok(None);
        }
        self.buffer.advance(PREFIX_BYTES);
        let body = self.buffer.split_to(length_bytes as usize).freeze();
        assert_eq!(body.len(), length_bytes as usize);
        Ok(Some(body))
    }

    /// The status for a request stream that ended: `None` when it ended on a message boundary.
    pub fn end_of_stream_status(&self) -> Option<Status> {
        if self.buffer.is_empty() {
            None
        } else {
            // etcd 3.4's grpc-go answers a stream cut inside a message with Unknown and
            // io.ErrUnexpectedEOF's own text (checked against etcd by core's e2e tests).
            Some(Status::new(Code::Unknown, "unexpected EOF"))
        }
    }
}

/// Parses a `grpc-timeout` header: 1 to 8 ASCII digits then one unit of H, M, S, m, u, n.
pub fn parse_grpc_timeout(value: &[u8]) -> Result<Duration, Status> {
    let malformed = || {
        Status::new(
            Code::Internal,
            format!(
                "transport: malformed time-out: {:?}",
                String::from_utf8_lossy(value)
            ),
        )
    };
    if value.len() < 2 || value.len() > 9 {
        return Err(malformed());
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(malformed());
    }
    let amount: u64 = std::str::from_utf8(digits)
        .expect("ASCII digits are UTF-8")
        .parse()
        .map_err(|_| malformed())?;
    assert!(amount < 100_000_000);
    let duration = match unit[0] {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return Err(malformed()),
    };
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::etcdserverpb::{RangeRequest, RangeResponse};
    use keel_proto::mvccpb::KeyValue;
    use prost::Message;

    fn sample_response() -> RangeResponse {
        RangeResponse {
            kvs: vec![KeyValue {
                key: Bytes::from_static(b"foo"),
                value: Bytes::from_static(b"bar"),
                ..Default::default()
            }],
            count: 1,
            ..Default::default()
        }
    }

    #[test]
    fn encode_then_decode_round_trips_across_any_chunking() {
        let message = sample_response();
        let frame = encode_message(&message, DEFAULT_MAX_SEND_MESSAGE_BYTES).expect("fits");
        assert_eq!(frame[0], 0);
        assert_eq!(
            u32::from_be_bytes(frame[1..5].try_into().expect("4 bytes")) as usize,
            message.encoded_len()
        );
        // Two frames back to back, split at every possible point.
        let mut stream = frame.to_vec();
        stream.extend_from_slice(&frame);
        for split in 0..=stream.len() {
            let mut decoder = MessageDecoder::new(1024);
            let mut bodies = Vec::new();
            for chunk in [&stream[..split], &stream[split..]] {
                decoder.push(chunk);
                while let Some(body) = decoder.next_message().expect("valid frames") {
                    bodies.push(body);
                }
            }
            assert_eq!(bodies.len(), 2, "split at {split}");
            for body in bodies {
                assert_eq!(RangeResponse::decode(body).expect("decodes"), message);
            }
            assert_eq!(decoder.end_of_stream_status(), None);
        }
    }

    #[test]
    fn empty_message_is_a_five_byte_frame() {
        let frame = encode_message(&RangeRequest::default(), 10).expect("fits");
        assert_eq!(&frame[..], &[0, 0, 0, 0, 0]);
        let mut decoder = MessageDecoder::new(10);
        decoder.push(&frame);
        assert_eq!(decoder.next_message().expect("valid"), Some(Bytes::new()));
        assert_eq!(frame_bytes(b"ab").as_ref(), &[0, 0, 0, 0, 2, b'a', b'b']);
    }

    #[test]
    fn oversized_messages_are_refused_on_both_sides() {
        let message = sample_response();
        let length = message.encoded_len();
        let error = encode_message(&message, length - 1).expect_err("over the send limit");
        assert_eq!(error.code, Code::ResourceExhausted);
        assert_eq!(
            error.message,
            format!(
                "grpc: trying to send message larger than max ({length} vs. {})",
                length - 1
            )
        );
        let mut decoder = MessageDecoder::new(100);
        decoder.push(&[0, 0, 0, 0, 101]);
        let error = decoder.next_message().expect_err("over the receive limit");
        assert_eq!(error.code, Code::ResourceExhausted);
        assert_eq!(
            error.message,
            "grpc: received message larger than max (101 vs. 100)"
        );
        let mut decoder = MessageDecoder::new(100);
        decoder.push(&[0, 0, 0, 0, 100]);
        assert_eq!(decoder.next_message().expect("at the limit is fine"), None);
    }

    #[test]
    fn compressed_flag_is_internal() {
        let mut decoder = MessageDecoder::new(100);
        decoder.push(&[1, 0, 0, 0, 1, 7]);
        let error = decoder.next_message().expect_err("not negotiated");
        assert_eq!(error.code, Code::Internal);
        assert_eq!(
            error.message,
            "grpc: compressed flag set with identity or empty encoding"
        );
        let mut decoder = MessageDecoder::new(100);
        decoder.push(&[9, 0, 0, 0, 0]);
        assert_eq!(
            decoder.next_message().expect_err("bad flag").code,
            Code::Internal
        );
    }

    #[test]
    fn truncated_stream_reports_unexpected_eof() {
        let mut decoder = MessageDecoder::new(100);
        decoder.push(&[0, 0, 0]);
        assert_eq!(decoder.next_message().expect("needs more"), None);
        let status = decoder.end_of_stream_status().expect("partial prefix");
        assert_eq!(status.code, Code::Unknown);
        assert_eq!(status.message, "unexpected EOF");
    }

    #[test]
    fn grpc_timeout_parses_every_unit() {
        let cases: &[(&str, Duration)] = &[
            ("1H", Duration::from_secs(3600)),
            ("2M", Duration::from_secs(120)),
            ("3S", Duration::from_secs(3)),
            ("100m", Duration::from_millis(100)),
            ("250u", Duration::from_micros(250)),
            ("999n", Duration::from_nanos(999)),
            ("0m", Duration::ZERO),
            ("99999999H", Duration::from_secs(99_999_999 * 3600)),
            ("00000010S", Duration::from_secs(10)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_grpc_timeout(text.as_bytes()), Ok(*expected), "{text}");
        }
        for bad in [
            "",
            "S",
            "10",
            "10x",
            "123456789S",
            "-1S",
            "1.5S",
            " 1S",
            "1s",
        ] {
            let error = parse_grpc_timeout(bad.as_bytes()).expect_err(bad);
            assert_eq!(error.code, Code::Internal, "{bad}");
        }
    }
}
