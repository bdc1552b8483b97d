//! Conversions between etcd's wire types (keel-proto) and keel-kv's plain types.
//!
//! keel-kv never sees protobuf, so this is the one place that maps field for field. Requests
//! are taken by value: `Bytes` fields move without copying the key or value.

use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use keel_proto::mvccpb;

pub fn range_request(r: pb::RangeRequest) -> kv::RangeRequest {
    kv::RangeRequest {
        key: r.key,
        range_end: r.range_end,
        limit: r.limit,
        revision: r.revision,
        sort_order: match r.sort_order {
            1 => kv::SortOrder::Ascend,
            2 => kv::SortOrder::Descend,
            _ => kv::SortOrder::None,
        },
        sort_target: match r.sort_target {
            1 => kv::SortTarget::Version,
            2 => kv::SortTarget::Create,
            3 => kv::SortTarget::Mod,
            4 => kv::SortTarget::Value,
            _ => kv::SortTarget::Key,
        },
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    }
}

pub fn put_request(r: pb::PutRequest) -> kv::PutRequest {
    kv::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

pub fn delete_request(r: pb::DeleteRangeRequest) -> kv::DeleteRangeRequest {
    kv::DeleteRangeRequest {
        key: r.key,
        range_end: r.range_end,
        prev_kv: r.prev_kv,
    }
}

pub fn compare(c: pb::Compare) -> kv::Compare {
    use pb::compare::TargetUnion as U;
    // etcd reads the operand from the union and falls back to the zero value when the client
    // left it out, so a missing operand compares as 0 or as the empty value.
    let target = match c.target {
        0 => kv::CompareTarget::Version(match c.target_union {
            Some(U::Version(v)) => v,
            _ => 0,
        }),
        1 => kv::CompareTarget::Create(match c.target_union {
            Some(U::CreateRevision(v)) => v,
            _ => 0,
        }),
        2 => kv::CompareTarget::Mod(match c.target_union {
            Some(U::ModRevision(v)) => v,
            _ => 0,
        }),
        3 => kv::CompareTarget::Value(match c.target_union {
            Some(U::Value(v)) => v,
            _ => bytes::Bytes::new(),
        }),
        _ => kv::CompareTarget::Lease(match c.target_union {
            Some(U::Lease(v)) => v,
            _ => 0,
        }),
    };
    let result = match c.result {
        1 => kv::CompareResult::Greater,
        2 => kv::CompareResult::Less,
        3 => kv::CompareResult::NotEqual,
        _ => kv::CompareResult::Equal,
    };
    kv::Compare {
        result,
        target,
        key: c.key,
        range_end: c.range_end,
    }
}

fn request_op(op: pb::RequestOp) -> Option<kv::RequestOp> {
    use pb::request_op::Request as R;
    Some(match op.request? {
        R::RequestRange(r) => kv::RequestOp::Range(range_request(r)),
        R::RequestPut(r) => kv::RequestOp::Put(put_request(r)),
        R::RequestDeleteRange(r) => kv::RequestOp::DeleteRange(delete_request(r)),
        R::RequestTxn(t) => kv::RequestOp::Txn(txn_request(t)),
    })
}

/// A RequestOp with no request inside is skipped, as etcd's apply skips it.
pub fn txn_request(t: pb::TxnRequest) -> kv::TxnRequest {
    kv::TxnRequest {
        compare: t.compare.into_iter().map(compare).collect(),
        success: t.success.into_iter().filter_map(request_op).collect(),
        failure: t.failure.into_iter().filter_map(request_op).collect(),
    }
}

pub fn key_value(kv: kv::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

pub fn event(e: kv::Event, with_prev_kv: bool) -> mvccpb::Event {
    mvccpb::Event {
        r#type: match e.kind {
            kv::EventKind::Put => mvccpb::event::EventType::Put as i32,
            kv::EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(key_value(e.kv)),
        prev_kv: if with_prev_kv {
            e.prev_kv.map(|prev| key_value(prev.checked()))
        } else {
            None
        },
    }
}

/// The response header every KV, Lease and Watch answer carries.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    pub cluster_id: u64,
    pub member_id: u64,
    pub raft_term: u64,
}

impl Header {
    pub fn at(&self, revision: i64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.raft_term,
        })
    }
}

/// Inner txn responses carry a header with only the revision set, as etcd's do.
fn inner_header(revision: i64) -> Option<pb::ResponseHeader> {
    Some(pb::ResponseHeader {
        revision,
        ..Default::default()
    })
}

pub fn range_response(
    r: kv::RangeResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::RangeResponse {
    pb::RangeResponse {
        header,
        kvs: r.kvs.into_iter().map(key_value).collect(),
        more: r.more,
        count: r.count,
    }
}

/// A Range answer encoded piece by piece (`keel_grpc::PieceEncode`): the header, then the
/// key-values a piece at a time, then `more` and `count`, which is byte for byte what prost
/// encodes whole (fields in tag order, defaults left out). A range of any size is then sent
/// holding one piece of its encoding, not the whole answer a second time.
///
/// A large range in key order (`kv::RangeSplit`) also does not hold all its key-values: the
/// answer has the first `RANGE_FIRST_KVS_MAX`, and the rest are read from the store a batch
/// at a time as pieces are sent, the length of their encoding having been summed from their
/// shapes when the range was walked.
#[derive(Debug)]
pub struct RangePieces {
    response: pb::RangeResponse,
    /// The next key-value to encode; `None` before the header is written.
    next_kv: Option<usize>,
    rest: Option<RangeRestPieces>,
}

/// How many key-values a range holds before the rest is read as it is sent: about 100 bytes
/// of handles each, so a few MiB at most for an answer of any size.
pub const RANGE_FIRST_KVS_MAX: usize = 10_000;

/// The keys and values one batch of a range's rest reads at most (at least one key-value):
/// a piece's worth, so a batch is encoded and sent before the next is read.
const RANGE_REST_BATCH_BYTES_MAX: usize = keel_grpc::PIECE_BYTES_TARGET;

/// The key-values of a range still to read, and the length their encoding was promised.
struct RangeRestPieces {
    reader: kv::Reader,
    rest: kv::RangeRest,
    promised_bytes: usize,
    encoded_bytes: usize,
    /// With a pager, each batch is read unchecked ahead of the piece that encodes it
    /// (`prepare`), its pages brought in by a pager thread where some are not in memory.
    pager: Option<std::sync::Arc<crate::pager::Pager>>,
    /// A batch read ahead, not yet checked.
    ahead: Option<kv::Unchecked<Vec<kv::KeyValue>>>,
    /// The read ahead failed (compacted): the next piece fails with it.
    ahead_failed: Option<keel_grpc::Status>,
    /// Checked key-values still to encode.
    ready: std::vec::IntoIter<kv::KeyValue>,
}

impl std::fmt::Debug for RangeRestPieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeRestPieces")
            .field("rest", &self.rest)
            .field("promised_bytes", &self.promised_bytes)
            .field("encoded_bytes", &self.encoded_bytes)
            .finish()
    }
}

/// The length of `RangeResponse.kvs` field entry for a key-value of this shape: the same sum
/// prost's `encoded_len` makes (defaults left out), without the value's bytes at hand.
pub fn range_kv_encoded_len(shape: &kv::KeyValueShape<'_>) -> usize {
    use prost::encoding::{encoded_len_varint, int64, key_len};
    let bytes_len = |tag: u32, len: usize| {
        if len == 0 {
            0
        } else {
            key_len(tag) + encoded_len_varint(len as u64) + len
        }
    };
    let int_len = |tag: u32, value: i64| {
        if value == 0 {
            0
        } else {
            int64::encoded_len(tag, &value)
        }
    };
    let message_len = bytes_len(1, shape.key.len())
        + int_len(2, shape.create_revision)
        + int_len(3, shape.mod_revision)
        + int_len(4, shape.version)
        + bytes_len(5, shape.value_len)
        + int_len(6, shape.lease);
    key_len(2) + encoded_len_varint(message_len as u64) + message_len
}

impl RangePieces {
    pub fn new(response: pb::RangeResponse) -> RangePieces {
        RangePieces {
            response,
            next_kv: None,
            rest: None,
        }
    }

    /// An answer whose key-values go on in `rest`, read from `reader`; `rest_encoded_bytes`
    /// is what their encoding adds up to (`range_kv_encoded_len` of each).
    pub fn with_rest(
        response: pb::RangeResponse,
        reader: kv::Reader,
        rest: kv::RangeRest,
        rest_encoded_bytes: usize,
    ) -> RangePieces {
        assert!(rest.kvs_left() > 0, "a rest owes key-values");
        RangePieces {
            response,
            next_kv: None,
            rest: Some(RangeRestPieces {
                reader,
                rest,
                promised_bytes: rest_encoded_bytes,
                encoded_bytes: 0,
                pager: None,
                ahead: None,
                ahead_failed: None,
                ready: Vec::new().into_iter(),
            }),
        }
    }

    /// Reads the rest a batch ahead, with `pager` bringing in the pages a batch reads that
    /// are not in memory (see `crate::pager`), so the shard sending this does not wait for
    /// the disk.
    pub fn paged_by(mut self, pager: std::sync::Arc<crate::pager::Pager>) -> RangePieces {
        if let Some(rest) = &mut self.rest {
            rest.pager = Some(pager);
        }
        self
    }

    /// Encodes the rest's key-values a batch at a time until `buf` holds `target_bytes`.
    /// Returns true while more remain. With a pager, batches come read ahead by `prepare`;
    /// when none is ahead, the piece ends (if this call encoded anything) so that `prepare`
    /// reads the next, else the batch is read here.
    fn encode_rest(
        rest: &mut RangeRestPieces,
        buf: &mut bytes::BytesMut,
        target_bytes: usize,
    ) -> Result<bool, keel_grpc::Status> {
        let len_at_start = buf.len();
        loop {
            for kv in rest.ready.by_ref() {
                let kv = key_value(kv);
                rest.encoded_bytes += prost::encoding::message::encoded_len(2, &kv);
                if rest.encoded_bytes > rest.promised_bytes {
                    return Err(rest_mismatch(rest));
                }
                prost::encoding::message::encode(2, &kv, buf);
                if buf.len() >= target_bytes {
                    break;
                }
            }
            let done = rest.ready.len() == 0
                && rest.ahead.is_none()
                && rest.ahead_failed.is_none()
                && rest.rest.kvs_left() == 0;
            if done {
                break;
            }
            // A call that encoded nothing yet goes on (a caller may pass a buffer already past
            // the target): each call makes progress. With key-values still ready, the loop
            // above stopped at the target having encoded one.
            if buf.len() >= target_bytes && buf.len() > len_at_start {
                return Ok(true);
            }
            if let Some(status) = rest.ahead_failed.take() {
                return Err(status);
            }
            let batch = match rest.ahead.take() {
                Some(ahead) => ahead.check(),
                None if rest.pager.is_some() && buf.len() > len_at_start => return Ok(true),
                None => {
                    let want_bytes = target_bytes
                        .saturating_sub(buf.len())
                        .clamp(1, RANGE_REST_BATCH_BYTES_MAX);
                    rest.reader
                        .range_rest(&mut rest.rest, want_bytes)
                        .map_err(|e| keel_grpc::Status::from(crate::shared::kv_error(e)))?
                }
            };
            if batch.is_empty() {
                // Keys owed but none left in the range: it would otherwise ask forever.
                return Err(rest_mismatch(rest));
            }
            rest.ready = batch.into_iter();
        }
        if rest.encoded_bytes != rest.promised_bytes {
            return Err(rest_mismatch(rest));
        }
        Ok(false)
    }

    /// Reads the rest's next batch unchecked while none is read ahead (the one being encoded
    /// may still have key-values, so a piece goes on into the next batch and stays whole),
    /// and asks the pager to bring its pages in where some are not in memory.
    fn prepare_rest(rest: &mut RangeRestPieces) -> Option<keel_grpc::PieceWait> {
        let pager = rest.pager.as_ref()?;
        if rest.ahead.is_some() || rest.ahead_failed.is_some() || rest.rest.kvs_left() == 0 {
            return None;
        }
        match rest
            .reader
            .range_rest_unchecked(&mut rest.rest, RANGE_REST_BATCH_BYTES_MAX)
        {
            Ok(ahead) => {
                let wait = pager.bring_in(&ahead);
                rest.ahead = Some(ahead);
                wait.map(|wait| Box::pin(wait) as keel_grpc::PieceWait)
            }
            Err(e) => {
                rest.ahead_failed = Some(keel_grpc::Status::from(crate::shared::kv_error(e)));
                None
            }
        }
    }
}

/// The rest read back other than its walk promised: only a compaction can trim what a range
/// reads at its revision, and the read checks for that, so this is a broken invariant. The
/// answer's length is already sent, so the call ends with an error rather than a wrong answer.
fn rest_mismatch(rest: &RangeRestPieces) -> keel_grpc::Status {
    tracing::error!(
        promised_bytes = rest.promised_bytes,
        encoded_bytes = rest.encoded_bytes,
        kvs_left = rest.rest.kvs_left(),
        revision = rest.rest.revision(),
        "a range's rest did not read back as its walk promised; failing the call"
    );
    keel_grpc::Status::new(keel_grpc::Code::Internal, "range changed while it was sent")
}

impl keel_grpc::PieceEncode for RangePieces {
    fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(&self.response)
            + self.rest.as_ref().map_or(0, |rest| rest.promised_bytes)
    }

    fn encode_piece(
        &mut self,
        buf: &mut bytes::BytesMut,
        target_bytes: usize,
    ) -> Result<bool, keel_grpc::Status> {
        use prost::encoding;
        let r = &self.response;
        let mut next = match self.next_kv {
            Some(next) => next,
            None => {
                if let Some(header) = &r.header {
                    encoding::message::encode(1, header, buf);
                }
                0
            }
        };
        let first_kvs_left = next < r.kvs.len();
        while next < r.kvs.len() {
            encoding::message::encode(2, &r.kvs[next], buf);
            next += 1;
            if buf.len() >= target_bytes {
                self.next_kv = Some(next);
                return Ok(true);
            }
        }
        self.next_kv = Some(next);
        if let Some(rest) = &mut self.rest {
            // The first key-values are all encoded: end the piece, so that `prepare` reads
            // the rest's first batch now (not while they were sent, when it would only wait).
            if first_kvs_left && rest.pager.is_some() && rest.ahead.is_none() {
                return Ok(true);
            }
            if Self::encode_rest(rest, buf, target_bytes)? {
                return Ok(true);
            }
        }
        if r.more {
            encoding::bool::encode(3, &r.more, buf);
        }
        if r.count != 0 {
            encoding::int64::encode(4, &r.count, buf);
        }
        Ok(false)
    }

    fn prepare(&mut self) -> Option<keel_grpc::PieceWait> {
        // Not before the first key-values are encoded: a batch read ahead would wait in
        // memory (its pages perhaps evicted again) while they are sent.
        if self.next_kv != Some(self.response.kvs.len()) {
            return None;
        }
        Self::prepare_rest(self.rest.as_mut()?)
    }
}

/// A Txn answer encoded piece by piece (`keel_grpc::PieceEncode`), byte for byte as prost
/// encodes it whole: a txn's reads can answer as much as a Range, and this keeps a call from
/// holding their whole encoding at once. An answer of at most one piece
/// (`keel_grpc::PIECE_BYTES_TARGET`, every txn that only writes) is encoded whole, as before.
/// A larger one is laid out once as encoded bytes (headers, keys and lengths of the nested
/// messages, small answers) between lists of key-values, which are encoded a few at a time.
#[derive(Debug)]
pub struct TxnPieces {
    encoded_len: usize,
    whole: Option<pb::TxnResponse>,
    parts: std::collections::VecDeque<TxnPart>,
}

#[derive(Debug)]
enum TxnPart {
    /// Bytes already encoded.
    Encoded(Vec<u8>),
    /// Key-values still to encode, each as field `tag` of the message around them.
    Kvs {
        tag: u32,
        kvs: std::vec::IntoIter<mvccpb::KeyValue>,
    },
}

/// Builds [`TxnPieces`]' layout: encoded bytes accumulate in `open` until a list of
/// key-values interrupts them.
#[derive(Default)]
struct TxnLayout {
    parts: std::collections::VecDeque<TxnPart>,
    open: Vec<u8>,
}

impl TxnLayout {
    fn kvs(&mut self, tag: u32, kvs: Vec<mvccpb::KeyValue>) {
        if kvs.is_empty() {
            return;
        }
        if !self.open.is_empty() {
            self.parts
                .push_back(TxnPart::Encoded(std::mem::take(&mut self.open)));
        }
        self.parts.push_back(TxnPart::Kvs {
            tag,
            kvs: kvs.into_iter(),
        });
    }

    /// The key and length of a nested message (field `tag`) whose body follows.
    fn nested(&mut self, tag: u32, body_bytes: usize) {
        use prost::encoding;
        encoding::encode_key(tag, encoding::WireType::LengthDelimited, &mut self.open);
        encoding::encode_varint(body_bytes as u64, &mut self.open);
    }

    /// A TxnResponse's fields in tag order, as prost writes them.
    fn txn(&mut self, r: pb::TxnResponse) {
        use pb::response_op::Response as R;
        use prost::encoding;
        use prost::Message;
        if let Some(header) = &r.header {
            encoding::message::encode(1, header, &mut self.open);
        }
        if r.succeeded {
            encoding::bool::encode(2, &r.succeeded, &mut self.open);
        }
        for op in r.responses {
            self.nested(3, op.encoded_len());
            // A oneof's message is written even when empty: it says which one was set.
            match op.response {
                None => {}
                Some(R::ResponseRange(x)) => {
                    self.nested(1, x.encoded_len());
                    self.range(x);
                }
                Some(R::ResponsePut(x)) => encoding::message::encode(2, &x, &mut self.open),
                Some(R::ResponseDeleteRange(x)) => {
                    self.nested(3, x.encoded_len());
                    self.delete_range(x);
                }
                Some(R::ResponseTxn(x)) => {
                    self.nested(4, x.encoded_len());
                    self.txn(x);
                }
            }
        }
    }

    fn range(&mut self, r: pb::RangeResponse) {
        use prost::encoding;
        if let Some(header) = &r.header {
            encoding::message::encode(1, header, &mut self.open);
        }
        self.kvs(2, r.kvs);
        if r.more {
            encoding::bool::encode(3, &r.more, &mut self.open);
        }
        if r.count != 0 {
            encoding::int64::encode(4, &r.count, &mut self.open);
        }
    }

    fn delete_range(&mut self, r: pb::DeleteRangeResponse) {
        use prost::encoding;
        if let Some(header) = &r.header {
            encoding::message::encode(1, header, &mut self.open);
        }
        if r.deleted != 0 {
            encoding::int64::encode(2, &r.deleted, &mut self.open);
        }
        self.kvs(3, r.prev_kvs);
    }
}

impl TxnPieces {
    pub fn new(response: pb::TxnResponse) -> TxnPieces {
        let encoded_len = prost::Message::encoded_len(&response);
        if encoded_len <= keel_grpc::PIECE_BYTES_TARGET {
            return TxnPieces {
                encoded_len,
                whole: Some(response),
                parts: Default::default(),
            };
        }
        let mut layout = TxnLayout::default();
        layout.txn(response);
        if !layout.open.is_empty() {
            layout.parts.push_back(TxnPart::Encoded(layout.open));
        }
        TxnPieces {
            encoded_len,
            whole: None,
            parts: layout.parts,
        }
    }
}

impl keel_grpc::PieceEncode for TxnPieces {
    fn encoded_len(&self) -> usize {
        self.encoded_len
    }

    fn encode_piece(
        &mut self,
        buf: &mut bytes::BytesMut,
        target_bytes: usize,
    ) -> Result<bool, keel_grpc::Status> {
        if let Some(whole) = self.whole.take() {
            prost::Message::encode_raw(&whole, buf);
            return Ok(false);
        }
        while let Some(part) = self.parts.front_mut() {
            match part {
                TxnPart::Encoded(bytes) => buf.extend_from_slice(bytes),
                TxnPart::Kvs { tag, kvs } => {
                    let tag = *tag;
                    for kv in kvs.by_ref() {
                        prost::encoding::message::encode(tag, &kv, buf);
                        if buf.len() >= target_bytes {
                            break;
                        }
                    }
                    if kvs.len() > 0 {
                        return Ok(true);
                    }
                }
            }
            self.parts.pop_front();
            if buf.len() >= target_bytes {
                return Ok(!self.parts.is_empty());
            }
        }
        Ok(false)
    }
}

pub fn put_response(r: kv::PutResponse, header: Option<pb::ResponseHeader>) -> pb::PutResponse {
    pb::PutResponse {
        header,
        prev_kv: r.prev_kv.map(key_value),
    }
}

pub fn delete_response(
    r: kv::DeleteRangeResponse,
    header: Option<pb::ResponseHeader>,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header,
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(key_value).collect(),
    }
}

pub fn txn_response(r: kv::TxnResponse, header: Option<pb::ResponseHeader>) -> pb::TxnResponse {
    use pb::response_op::Response as R;
    let responses = r
        .responses
        .into_iter()
        .map(|op| pb::ResponseOp {
            response: Some(match op {
                kv::ResponseOp::Range(x) => {
                    let h = inner_header(x.revision);
                    R::ResponseRange(range_response(x, h))
                }
                kv::ResponseOp::Put(x) => {
                    let h = inner_header(x.revision);
                    R::ResponsePut(put_response(x, h))
                }
                kv::ResponseOp::DeleteRange(x) => {
                    let h = inner_header(x.revision);
                    R::ResponseDeleteRange(delete_response(x, h))
                }
                kv::ResponseOp::Txn(x) => {
                    let h = inner_header(x.revision);
                    R::ResponseTxn(txn_response(x, h))
                }
            }),
        })
        .collect();
    pb::TxnResponse {
        header,
        succeeded: r.succeeded,
        responses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_without_operand_uses_the_zero_value() {
        let c = compare(pb::Compare {
            result: 0,
            target: 2,
            key: "k".into(),
            ..Default::default()
        });
        assert_eq!(c.target, kv::CompareTarget::Mod(0));
        assert_eq!(c.result, kv::CompareResult::Equal);
        let c = compare(pb::Compare {
            result: 3,
            target: 3,
            key: "k".into(),
            ..Default::default()
        });
        assert_eq!(c.target, kv::CompareTarget::Value(bytes::Bytes::new()));
        assert_eq!(c.result, kv::CompareResult::NotEqual);
    }

    #[test]
    fn nested_txn_responses_carry_only_their_revision() {
        let r = kv::TxnResponse {
            revision: 9,
            succeeded: true,
            responses: vec![kv::ResponseOp::Put(kv::PutResponse {
                revision: 9,
                prev_kv: None,
            })],
        };
        let h = Header {
            cluster_id: 1,
            member_id: 2,
            raft_term: 3,
        };
        let p = txn_response(r, h.at(9));
        assert_eq!(p.header.as_ref().map(|h| h.cluster_id), Some(1));
        let Some(pb::response_op::Response::ResponsePut(put)) = &p.responses[0].response else {
            panic!("expected a put response")
        };
        assert_eq!(
            put.header,
            Some(pb::ResponseHeader {
                revision: 9,
                ..Default::default()
            })
        );
    }

    /// Every piece `message` encodes at `target_bytes`, in order.
    fn all_pieces(message: &mut impl keel_grpc::PieceEncode, target_bytes: usize) -> Vec<Vec<u8>> {
        let mut pieces = Vec::new();
        loop {
            if let Some(wait) = message.prepare() {
                futures_lite::future::block_on(wait);
            }
            let mut buf = bytes::BytesMut::new();
            let more = message
                .encode_piece(&mut buf, target_bytes)
                .expect("nothing compacts the store under these answers");
            pieces.push(buf.to_vec());
            if !more {
                return pieces;
            }
        }
    }

    /// Key-value `i` of the piece tests, with a value of `value_bytes`.
    fn piece_test_kv(i: usize, value_bytes: usize) -> mvccpb::KeyValue {
        mvccpb::KeyValue {
            key: format!("key-{i:05}").into(),
            create_revision: i as i64 + 1,
            mod_revision: i as i64 + 2,
            version: (i % 3) as i64,
            value: vec![i as u8; value_bytes].into(),
            lease: (i % 2) as i64 * 77,
        }
    }

    #[test]
    fn a_range_answer_in_pieces_is_byte_for_byte_what_prost_encodes() {
        use keel_grpc::PieceEncode;
        let kv = piece_test_kv;
        let header = Some(pb::ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision: 300,
            raft_term: 4,
        });
        let answers = [
            pb::RangeResponse::default(),
            pb::RangeResponse {
                header,
                count: 5,
                ..Default::default()
            },
            pb::RangeResponse {
                header,
                kvs: (0..300).map(|i| kv(i, i * 7)).collect(),
                more: true,
                count: 1000,
            },
            pb::RangeResponse {
                header: None,
                kvs: (0..40).map(|i| kv(i, 0)).collect(),
                more: false,
                count: 40,
            },
        ];
        for answer in answers {
            let whole = prost::Message::encode_to_vec(&answer);
            for target_bytes in [1, 100, 4096, 1 << 20] {
                let mut pieces = RangePieces::new(answer.clone());
                assert_eq!(pieces.encoded_len(), whole.len());
                let pieces = all_pieces(&mut pieces, target_bytes);
                assert_eq!(pieces.concat(), whole, "target {target_bytes}");
                if target_bytes == 1 {
                    // One key-value per piece, then the tail.
                    assert_eq!(pieces.len(), answer.kvs.len() + 1);
                }
            }
        }
    }

    /// A store of `n` keys with values of 0..n*3 bytes, every other one with a lease.
    fn store_of(n: usize) -> (kv::Writer, kv::Reader) {
        let (mut w, r) = kv::Store::with_segment_bytes(64 * 1024);
        w.apply(
            1,
            &kv::Op::LeaseGrant(kv::LeaseGrantRequest { id: 77, ttl_s: 60 }),
        )
        .expect("grant");
        for i in 0..n {
            let put = kv::PutRequest {
                key: format!("key-{i:05}").into(),
                value: vec![i as u8; i * 3].into(),
                lease: (i % 2) as i64 * 77,
                ..Default::default()
            };
            w.apply(i as u64 + 2, &kv::Op::Put(put)).expect("put");
        }
        (w, r)
    }

    const SPLIT_TEST_HEADER: Header = Header {
        cluster_id: 1,
        member_id: 2,
        raft_term: 3,
    };

    /// The whole answer to `req`, encoded by prost.
    fn whole_range_encoding(r: &kv::Reader, req: &kv::RangeRequest) -> Vec<u8> {
        let answer = r.range(req).expect("range");
        let revision = answer.revision;
        prost::Message::encode_to_vec(&range_response(answer, SPLIT_TEST_HEADER.at(revision)))
    }

    /// `RangePieces` of a range split after `kvs_max` key-values, as the service builds them.
    fn split_pieces(r: &kv::Reader, req: &kv::RangeRequest, kvs_max: usize) -> RangePieces {
        let mut rest_bytes = 0;
        let mut on_rest = |shape: kv::KeyValueShape<'_>| rest_bytes += range_kv_encoded_len(&shape);
        let split = kv::RangeSplit {
            kvs_max,
            on_rest: &mut on_rest,
        };
        let (answer, rest) = r.range_split(req, split).expect("range");
        let revision = answer.revision;
        let answer = range_response(answer, SPLIT_TEST_HEADER.at(revision));
        match rest {
            Some(rest) => RangePieces::with_rest(answer, r.clone(), rest, rest_bytes),
            None => RangePieces::new(answer),
        }
    }

    #[test]
    fn a_range_read_as_it_is_sent_is_byte_for_byte_the_whole_answer() {
        use keel_grpc::PieceEncode;
        let (_w, r) = store_of(500);
        let all = kv::RangeRequest {
            key: "key-".into(),
            range_end: "key.".into(),
            ..Default::default()
        };
        let requests = [
            all.clone(),
            kv::RangeRequest {
                limit: 321,
                ..all.clone()
            },
            kv::RangeRequest {
                keys_only: true,
                ..all.clone()
            },
            kv::RangeRequest {
                key: "key-00100".into(),
                range_end: "\0".into(),
                revision: 300,
                ..all.clone()
            },
        ];
        // Read as before, and read a batch ahead with a pager (these values are in memory,
        // so it asks nothing of its threads; `pager.rs`'s own test does).
        let pager = std::sync::Arc::new(crate::pager::Pager::default());
        pager.start().expect("threads start");
        for req in requests {
            let whole = whole_range_encoding(&r, &req);
            for kvs_max in [1, 7, 100, 10_000] {
                for target_bytes in [1, 100, 4096, 1 << 20, usize::MAX] {
                    for paged in [false, true] {
                        let mut pieces = split_pieces(&r, &req, kvs_max);
                        if paged {
                            pieces = pieces.paged_by(pager.clone());
                        }
                        assert_eq!(pieces.encoded_len(), whole.len(), "{req:?} first {kvs_max}");
                        let pieces = all_pieces(&mut pieces, target_bytes);
                        assert_eq!(
                            pieces.concat(),
                            whole,
                            "{req:?} first {kvs_max}, target {target_bytes}, paged {paged}"
                        );
                        if paged && target_bytes <= RANGE_REST_BATCH_BYTES_MAX {
                            // Read ahead, a piece goes on into the next batch: only the one
                            // that ends the first key-values, and the last, fall short.
                            let (_, all_but_last) = pieces.split_last().expect("a piece");
                            let short = all_but_last.iter().filter(|p| p.len() < target_bytes);
                            assert!(short.count() <= 1, "{req:?} target {target_bytes}");
                        }
                    }
                }
            }
        }
        // These values are all in memory: no read asked mincore or handed anything over.
        let stats = &pager.stats;
        for count in [
            &stats.reads_in_memory,
            &stats.reads_paged,
            &stats.reads_unpaged,
        ] {
            assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), 0);
        }
    }

    /// A compaction past a range's revision while its rest is sent: one that cut a version
    /// the rest reads fails the call as compacted; one that cut only other keys' versions
    /// leaves the answer whole.
    #[test]
    fn a_compaction_past_a_range_being_sent_fails_it_only_if_it_cut_what_it_reads() {
        use keel_grpc::PieceEncode;
        let pager = std::sync::Arc::new(crate::pager::Pager::default());
        let cases = [("key-00049", true), ("key-00002", false)];
        // With a pager, the rest is read a batch ahead in `prepare`: a read ahead that finds
        // the compaction fails the next piece the same way.
        for ((rewritten, cut), paged) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
            let (mut w, r) = store_of(50);
            let req = kv::RangeRequest {
                key: "key-".into(),
                range_end: "key.".into(),
                ..Default::default()
            };
            let whole = whole_range_encoding(&r, &req);
            let mut pieces = split_pieces(&r, &req, 10);
            if paged {
                pieces = pieces.paged_by(pager.clone());
            }
            let mut buf = bytes::BytesMut::new();
            assert_eq!(pieces.encode_piece(&mut buf, 200), Ok(true));
            let revision = r.current_revision();
            let put = kv::PutRequest {
                key: rewritten.into(),
                value: "newer".into(),
                ..Default::default()
            };
            w.apply(100, &kv::Op::Put(put)).expect("put");
            let compact = kv::CompactionRequest {
                revision: revision + 1,
                physical: true,
            };
            w.apply(101, &kv::Op::Compact(compact)).expect("compact");
            while w.compact_step(64) == kv::CompactionStatus::Pending {}
            let outcome = loop {
                if let Some(wait) = pieces.prepare() {
                    futures_lite::future::block_on(wait);
                }
                match pieces.encode_piece(&mut buf, 200) {
                    Ok(true) => continue,
                    Ok(false) => break Ok(buf.to_vec()),
                    Err(error) => break Err(error),
                }
            };
            if cut {
                assert_eq!(
                    outcome,
                    Err(keel_grpc::Status::from(keel_grpc::EtcdError::Compacted)),
                    "paged {paged}"
                );
            } else {
                assert_eq!(
                    outcome,
                    Ok(whole),
                    "{rewritten} was handed out before; paged {paged}"
                );
            }
        }
    }

    /// Txn answers, small (sent whole) and large (laid out in parts), nested txns, empty
    /// ops, deletes with previous key-values and puts with one: piece by piece, each is
    /// byte for byte what prost encodes, and a large one's pieces stay near the target.
    #[test]
    fn a_txn_answer_in_pieces_is_byte_for_byte_what_prost_encodes() {
        use keel_grpc::{PieceEncode, PIECE_BYTES_TARGET};
        use pb::response_op::Response as R;
        let kv = piece_test_kv;
        let header = |revision| {
            Some(pb::ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision,
                raft_term: 4,
            })
        };
        let op = |response| pb::ResponseOp {
            response: Some(response),
        };
        let range = |n: usize, value_bytes: usize| {
            op(R::ResponseRange(pb::RangeResponse {
                header: header(9),
                kvs: (0..n).map(|i| kv(i, value_bytes)).collect(),
                more: n % 2 == 1,
                count: n as i64 * 3,
            }))
        };
        let ops = |value_bytes: usize| {
            vec![
                range(200, value_bytes),
                op(R::ResponsePut(pb::PutResponse {
                    header: header(10),
                    prev_kv: Some(kv(7, value_bytes)),
                })),
                pb::ResponseOp { response: None },
                op(R::ResponseRange(pb::RangeResponse::default())),
                op(R::ResponseDeleteRange(pb::DeleteRangeResponse {
                    header: header(11),
                    deleted: 30,
                    prev_kvs: (0..30).map(|i| kv(i, value_bytes)).collect(),
                })),
                op(R::ResponseTxn(pb::TxnResponse {
                    header: header(12),
                    succeeded: false,
                    responses: vec![range(50, value_bytes), range(0, 0)],
                })),
                range(3, 0),
            ]
        };
        let answers = [
            pb::TxnResponse::default(),
            pb::TxnResponse {
                header: header(5),
                succeeded: true,
                responses: ops(3),
            },
            pb::TxnResponse {
                header: header(6),
                succeeded: true,
                responses: ops(2000),
            },
            pb::TxnResponse {
                header: None,
                succeeded: false,
                responses: ops(700),
            },
        ];
        let mut laid_out = 0;
        for answer in answers {
            let whole = prost::Message::encode_to_vec(&answer);
            let large = whole.len() > PIECE_BYTES_TARGET;
            laid_out += usize::from(large);
            for target_bytes in [1, 100, 4096, PIECE_BYTES_TARGET, 1 << 20] {
                let mut pieces = TxnPieces::new(answer.clone());
                assert_eq!(pieces.encoded_len(), whole.len());
                let pieces = all_pieces(&mut pieces, target_bytes);
                assert_eq!(pieces.concat(), whole, "target {target_bytes}");
                if large {
                    // A piece ends at the first key-value that reaches the target.
                    let (last, rest) = pieces.split_last().expect("a piece");
                    assert!(!last.is_empty() || rest.is_empty());
                    for piece in rest {
                        assert!(piece.len() <= target_bytes + 2100, "{}", piece.len());
                    }
                    if target_bytes <= 4096 {
                        assert!(pieces.len() > whole.len() / 4096 / 2, "{}", pieces.len());
                    }
                }
            }
        }
        assert_eq!(laid_out, 2, "both large answers take the laid-out path");
    }
}
