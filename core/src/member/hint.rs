//! The keys a committed entry's apply will look up, read from its encoded bytes without
//! decoding it, so that the raft core can start loading their index nodes into the cache for a
//! window of entries before it applies them (`kv::Writer::prefetch_keys`).
//!
//! Only a hint: a key missed or misread costs a cache miss later, never a wrong answer, so the
//! scan gives up at the first thing it does not expect. It reads the common writes: a Put, and
//! a Txn's compares and the puts of its success branch (not nested txns).

/// Keys one entry may hint: a txn with more ops hints its first ones.
const KEYS_PER_ENTRY_MAX: usize = 8;

/// `InternalRaftRequest` fields (etcd's raft_internal.proto).
const REQUEST_PUT: u32 = 4;
const REQUEST_TXN: u32 = 6;
/// `PutRequest.key`, `Compare.key`.
const PUT_KEY: u32 = 1;
const COMPARE_KEY: u32 = 3;
/// `TxnRequest.compare`, `TxnRequest.success`; `RequestOp.request_put`.
const TXN_COMPARE: u32 = 1;
const TXN_SUCCESS: u32 = 2;
const OP_PUT: u32 = 2;

/// Appends to `keys` the keys that applying the encoded `InternalRaftRequest` in `entry`
/// will look up first.
pub(crate) fn entry_keys<'e>(entry: &'e [u8], keys: &mut Vec<&'e [u8]>) {
    let limit = keys.len() + KEYS_PER_ENTRY_MAX;
    for (field, body) in Fields(entry) {
        match field {
            REQUEST_PUT => {
                if let Some(key) = first_field(body, PUT_KEY) {
                    keys.push(key);
                }
                return;
            }
            REQUEST_TXN => {
                for (field, body) in Fields(body) {
                    let key = match field {
                        TXN_COMPARE => first_field(body, COMPARE_KEY),
                        TXN_SUCCESS => {
                            first_field(body, OP_PUT).and_then(|put| first_field(put, PUT_KEY))
                        }
                        _ => None,
                    };
                    if keys.len() == limit {
                        return;
                    }
                    keys.extend(key);
                }
                return;
            }
            _ => {}
        }
    }
}

/// The body of the first length-delimited field numbered `want` in a message.
fn first_field(message: &[u8], want: u32) -> Option<&[u8]> {
    Fields(message)
        .find(|&(field, _)| field == want)
        .map(|(_, body)| body)
}

/// A message's length-delimited fields, as (number, body); other wire types are skipped. Ends
/// at the message's end or at the first malformed field.
struct Fields<'m>(&'m [u8]);

impl<'m> Iterator for Fields<'m> {
    type Item = (u32, &'m [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let field = self.next_field();
        if field.is_none() {
            // Fused: after a malformed field, nothing more.
            self.0 = &[];
        }
        field
    }
}

impl<'m> Fields<'m> {
    fn next_field(&mut self) -> Option<(u32, &'m [u8])> {
        while !self.0.is_empty() {
            let tag = varint(&mut self.0)?;
            let field = u32::try_from(tag >> 3).ok()?;
            let skip = match tag & 7 {
                0 => {
                    varint(&mut self.0)?;
                    0
                }
                1 => 8,
                2 => {
                    let len = usize::try_from(varint(&mut self.0)?).ok()?;
                    if len > self.0.len() {
                        return None;
                    }
                    let (body, rest) = self.0.split_at(len);
                    self.0 = rest;
                    return Some((field, body));
                }
                5 => 4,
                _ => return None,
            };
            if skip > self.0.len() {
                return None;
            }
            self.0 = &self.0[skip..];
        }
        None
    }
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_proto::etcdserverpb as pb;
    use prost::Message as _;

    fn keys_of(req: &pb::InternalRaftRequest) -> Vec<Vec<u8>> {
        let bytes = req.encode_to_vec();
        let mut keys = Vec::new();
        entry_keys(&bytes, &mut keys);
        keys.into_iter().map(<[u8]>::to_vec).collect()
    }

    fn header() -> Option<pb::RequestHeader> {
        Some(pb::RequestHeader {
            id: 77,
            username: "alice".into(),
            auth_revision: 3,
        })
    }

    fn put(key: &[u8]) -> pb::PutRequest {
        pb::PutRequest {
            key: key.to_vec().into(),
            value: vec![b'v'; 300].into(),
            lease: 9,
            prev_kv: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_put_hints_its_key_whatever_surrounds_it() {
        let req = pb::InternalRaftRequest {
            header: header(),
            id: 12345,
            put: Some(put(b"/registry/pods/a")),
            ..Default::default()
        };
        assert_eq!(keys_of(&req), vec![b"/registry/pods/a".to_vec()]);
    }

    #[test]
    fn a_txn_hints_its_compares_and_its_success_puts_only() {
        let compare = |key: &[u8]| pb::Compare {
            result: 0,
            target: 2,
            key: key.to_vec().into(),
            range_end: Default::default(),
            target_union: Some(pb::compare::TargetUnion::ModRevision(5)),
        };
        let op_put = |key: &[u8]| pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(put(key))),
        };
        let op_range = pb::RequestOp {
            request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                key: b"r".to_vec().into(),
                ..Default::default()
            })),
        };
        let req = pb::InternalRaftRequest {
            header: header(),
            txn: Some(pb::TxnRequest {
                compare: vec![compare(b"c1"), compare(b"c2")],
                success: vec![op_put(b"s1"), op_range, op_put(b"s2")],
                failure: vec![op_put(b"f1")],
            }),
            ..Default::default()
        };
        assert_eq!(
            keys_of(&req),
            vec![
                b"c1".to_vec(),
                b"c2".to_vec(),
                b"s1".to_vec(),
                b"s2".to_vec()
            ]
        );
    }

    #[test]
    fn a_large_txn_hints_its_first_keys_only() {
        let req = pb::InternalRaftRequest {
            txn: Some(pb::TxnRequest {
                success: (0..100u8)
                    .map(|i| pb::RequestOp {
                        request: Some(pb::request_op::Request::RequestPut(put(&[i]))),
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let keys = keys_of(&req);
        assert_eq!(keys.len(), KEYS_PER_ENTRY_MAX);
        assert_eq!(keys[0], vec![0u8]);
    }

    #[test]
    fn other_requests_and_broken_bytes_hint_nothing() {
        let req = pb::InternalRaftRequest {
            header: header(),
            delete_range: Some(pb::DeleteRangeRequest {
                key: b"d".to_vec().into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(keys_of(&req).is_empty());
        let whole = pb::InternalRaftRequest {
            put: Some(put(b"key")),
            ..Default::default()
        }
        .encode_to_vec();
        // Every prefix of a put, and bytes that are no protobuf at all: no panic, and no key
        // beyond the bytes given.
        for end in 0..whole.len() {
            let mut keys = Vec::new();
            entry_keys(&whole[..end], &mut keys);
            assert!(keys.iter().all(|k| *k == b"key"));
        }
        let mut keys = Vec::new();
        entry_keys(&[0xff; 20], &mut keys);
        entry_keys(&[0x22, 0xff, 0xff, 0xff, 0xff, 0x0f], &mut keys);
        assert!(keys.is_empty());
    }
}
