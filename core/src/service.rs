//! The etcd v3 services a shard serves: request validation, the route of each call (local
//! read, ReadIndex then local read, or a raft proposal), and the response with its header.
//!
//! Architecture invariant: every answer that is an error goes through keel-grpc's one
//! `EtcdError` mapping, so codes and messages match etcd byte for byte.

use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::StatusCode;
use keel_grpc::{
    unary, unary_pieces, Call, CallHead, EtcdError, Handler, HttpRequest, HttpResponse,
    ResponseSink, ServiceKnown, Status,
};
use keel_kv as kv;
use keel_proto::etcdserverpb as pb;
use keel_proto::health;

use crate::alarms;
use crate::auth::{api as auth_api, AuthInfo};
use crate::convert;
use crate::ids::Member;
use crate::metrics::Metrics;
use crate::shared::{kv_error, Answer, MemberChange, Query, Shared};
use crate::watch::Hub;

/// Captures Maintenance.Hash takes before giving up when a new compaction starts during each
/// of its scans (every compaction is a raft entry: three in one scan is a very busy compactor).
const HASH_ATTEMPTS_MAX: usize = 3;

/// The version Status and /version report. kube-apiserver enables RequestProgress only from
/// 3.5.13, and clients parse it as semver.
pub const ETCD_VERSION: &str = "3.5.17";
/// The cluster version /version reports (etcd reports major.minor.0).
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";

/// One per shard, shared by all its connections.
pub struct Api {
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    hub: Rc<Hub>,
}

impl Api {
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn hub(&self) -> &Rc<Hub> {
        &self.hub
    }

    pub fn new(shared: Arc<Shared>, metrics: Arc<Metrics>, hub: Rc<Hub>) -> Api {
        Api {
            shared,
            metrics,
            hub,
        }
    }
}

type R<T> = Result<T, Status>;

/// `req` read from `reader` (split after `kvs_max` key-values when given, as
/// `kv::Reader::range_steps` splits), walked `limits::READ_KEYS_PER_STEP` index entries at a
/// time: between steps the shard's other calls run, and on a shard hosted by the raft core
/// the raft core too, where one walk of a million keys held them all for a quarter of a
/// second.
async fn range_walked(
    reader: &Arc<kv::Reader>,
    req: &kv::RangeRequest,
    kvs_max: Option<usize>,
    on_rest: &mut dyn FnMut(kv::KeyValueShape<'_>),
) -> R<kv::Unchecked<(kv::RangeResponse, Option<kv::RangeRest>)>> {
    let failed = |e| etcd(kv_error(e));
    let mut steps = reader.range_steps(req, kvs_max).map_err(failed)?;
    while !reader.range_step(&mut steps, req, crate::limits::READ_KEYS_PER_STEP, on_rest) {
        crate::rt::let_others_run().await;
    }
    range_walked_finish(reader, steps, req)
        .await
        .map_err(failed)
}

/// The end of a range's steps: its filters, sort and limit, which run whole, as etcd runs
/// them in memory. Past `limits::READ_SORT_ON_SHARD_KVS_MAX` key-values they run on the
/// shard's blocking pool (a hosted shard's helper thread, see `rt::blocking`), not in its
/// executor, where a sort of a million would hold the shard's other calls, and a hosted
/// shard's raft core, for all of it; etcd's goroutine would be preempted.
async fn range_walked_finish(
    reader: &Arc<kv::Reader>,
    steps: kv::RangeSteps,
    req: &kv::RangeRequest,
) -> kv::Result<kv::Unchecked<(kv::RangeResponse, Option<kv::RangeRest>)>> {
    if steps.reordered_kvs() > crate::limits::READ_SORT_ON_SHARD_KVS_MAX {
        let (reader, req) = (Arc::clone(reader), req.clone());
        return crate::rt::blocking(move || reader.range_steps_finish(steps, &req)).await;
    }
    reader.range_steps_finish(steps, req)
}

/// The read-only txn `req` read from `reader` in steps, as a range is (`range_walked`): its
/// compares and ranges a step's keys at a time, and a range's sort past
/// `limits::READ_SORT_ON_SHARD_KVS_MAX` key-values off the executor
/// (`range_walked_finish`).
async fn txn_read_walked(
    reader: &Arc<kv::Reader>,
    req: &kv::TxnRequest,
) -> kv::Result<kv::Unchecked<kv::TxnResponse>> {
    let mut steps = reader.txn_read_steps(req);
    steps.finish_elsewhere_past(crate::limits::READ_SORT_ON_SHARD_KVS_MAX);
    loop {
        while !reader.txn_read_step(&mut steps, req, crate::limits::READ_KEYS_PER_STEP) {
            crate::rt::let_others_run().await;
        }
        if let Some((range, range_req)) = steps.take_walked_range(req) {
            let answer = range_walked_finish(reader, range, &range_req).await;
            reader.txn_read_range_finished(&mut steps, answer);
            continue;
        }
        match reader.txn_read_end(steps, req) {
            kv::TxnReadEnd::Answered(answer) => return answer,
            kv::TxnReadEnd::Again(again) => steps = *again,
        }
    }
}

fn etcd(e: EtcdError) -> Status {
    Status::from(e)
}

impl Handler for Api {
    // Not an `async fn`: a forwarding layer would keep its own copy of `call` in the future
    // that every request's task holds.
    fn grpc<'a>(
        self: Rc<Self>,
        call: Call,
        sink: &'a mut ResponseSink,
    ) -> impl Future<Output = Status> + 'a {
        self.grpc_from(call, sink, None)
    }

    async fn http(self: Rc<Self>, mut request: HttpRequest) -> HttpResponse {
        // etcd's accessController (embed/serve.go), after the Host check: every answer names
        // the origins `--cors` lets read it, and a CORS preflight (OPTIONS) is answered 200
        // with those fields alone.
        let cors = self
            .shared
            .config
            .cors
            .allow_origin(
                request
                    .headers
                    .get(http::header::ORIGIN)
                    .and_then(|v| v.to_str().ok()),
            )
            .map(crate::host_whitelist::CorsOrigins::fields)
            .unwrap_or_default();
        let mut response = if request.method == http::Method::OPTIONS {
            HttpResponse::new(StatusCode::OK, "", "")
        } else {
            // The certificate user is ours to set, never the client's (etcd's gateway ignores
            // it).
            request.headers.remove(crate::auth::CERT_USER_HEADER);
            // etcd 3.4 still answers the 3.3 gateway's /v3beta/ paths, by rewriting them to
            // /v3/ (embed/serve.go); /v3alpha/ is gone there, and here.
            if let Some(rest) = request.path.strip_prefix("/v3beta/") {
                request.path = format!("/v3/{rest}");
            }
            if crate::gateway::is_gateway_path(&request.path) {
                crate::gateway::serve(&self, request).await
            } else {
                crate::http::serve(&self.shared, &self.metrics, request).await
            }
        };
        response.headers.extend(cors);
        response
    }
}

impl Api {
    /// Serves one call; `cert_user` is the common name of the connection's verified client
    /// certificate, the call's user when it carries no token (etcd's AuthInfoFromTLS).
    ///
    /// Not an `async fn`, nor is [`Api::dispatch`]: every call's task holds the future, which
    /// an `async fn` makes keep each argument twice (the 248-byte `call` among them).
    pub(crate) fn grpc_from<'a>(
        self: Rc<Self>,
        mut call: Call,
        sink: &'a mut ResponseSink,
        cert_user: Option<&str>,
    ) -> impl Future<Output = Status> + 'a {
        // Looked up first: a shared map (see `keel_grpc::Metadata`) is copied only to change it.
        // A connection with a client certificate copies it for every call (what h2 did for
        // every call before heads were shared).
        if call
            .head
            .metadata
            .contains_key(crate::auth::CERT_USER_HEADER)
        {
            call.head
                .metadata
                .to_mut()
                .remove(crate::auth::CERT_USER_HEADER);
        }
        if let Some(value) = cert_user.and_then(|u| http::HeaderValue::from_str(u).ok()) {
            call.head
                .metadata
                .to_mut()
                .insert(crate::auth::CERT_USER_HEADER, value);
        }
        // Taken, not cloned: dispatch reads the path it is given.
        let path = std::mem::replace(
            &mut call.head.path,
            http::uri::PathAndQuery::from_static("/"),
        );
        let method = Metrics::method_index(path.path());
        self.metrics.record_started(method);
        let (started, counts) = (std::time::Instant::now(), sink.counts());
        async move {
            let status = self.dispatch(path.path(), call, sink).await;
            self.metrics.record_grpc(method, status.code);
            self.metrics.record_call(method, &counts, started.elapsed());
            status
        }
    }

    /// Runs one call by its gRPC path (the JSON gateway's streaming calls come here too).
    // Written out by hand on purpose (see `Api::grpc_from`): clippy would make it an `async fn`.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn dispatch<'a>(
        self: &'a Rc<Self>,
        path: &'a str,
        call: Call,
        sink: &'a mut ResponseSink,
    ) -> impl Future<Output = Status> + 'a {
        async move {
            // etcd's clients send "hasleader: true" to be told at once when the member is cut
            // off.
            if requires_leader(&call.head) && !self.shared.has_leader() {
                return etcd(EtcdError::NoLeader);
            }
            let this = self.clone();
            match path {
                "/etcdserverpb.KV/Range" => {
                    // A range may answer hundreds of MB: it goes out piece by piece.
                    unary_pieces(call, sink, |r, h| async move {
                        let who = auth_api::who(&this.shared, &h.metadata).await?;
                        this.range_pieces(r, &who).await
                    })
                    .await
                }
                "/etcdserverpb.KV/Put" => {
                    unary(call, sink, |r, h| async move {
                        let who = auth_api::who(&this.shared, &h.metadata).await?;
                        this.put(r, &who).await
                    })
                    .await
                }
                "/etcdserverpb.KV/DeleteRange" => {
                    unary(call, sink, |r, h| async move {
                        let who = auth_api::who(&this.shared, &h.metadata).await?;
                        this.delete_range(r, &who).await
                    })
                    .await
                }
                "/etcdserverpb.KV/Txn" => {
                    // A txn's reads may answer as much as a Range: piece by piece too.
                    unary_pieces(call, sink, |r, h| async move {
                        let who = auth_api::who(&this.shared, &h.metadata).await?;
                        this.txn(r, &who).await.map(convert::TxnPieces::new)
                    })
                    .await
                }
                "/etcdserverpb.KV/Compact" => {
                    unary(call, sink, |r, _| async move { this.compact(r).await }).await
                }
                "/etcdserverpb.Lease/LeaseGrant" => {
                    unary(call, sink, |r, _| async move { this.lease_grant(r).await }).await
                }
                "/etcdserverpb.Lease/LeaseRevoke" => {
                    unary(call, sink, |r, h| async move {
                        let who = auth_api::who(&this.shared, &h.metadata).await?;
                        this.lease_revoke(r, &who).await
                    })
                    .await
                }
                // Boxed: a watch stream's future is the largest here, and a stream lives
                // long, so one allocation for it costs little, while every unary call's task
                // would otherwise be as large.
                "/etcdserverpb.Watch/Watch" => Box::pin(self.hub.serve(call, sink)).await,
                "/etcdserverpb.Lease/LeaseKeepAlive" => self.lease_keep_alive(call, sink).await,
                // Every call's task holds this future, copied into a fresh allocation per request:
                // the rarer calls are boxed so that their larger futures (locks, elections, auth,
                // membership) do not set its size.
                _ => Box::pin(self.dispatch_rare(path, call, sink)).await,
            }
        }
    }

    /// [`Api::dispatch`] for the calls that are not on a hot path.
    async fn dispatch_rare(
        self: &Rc<Self>,
        path: &str,
        call: Call,
        sink: &mut ResponseSink,
    ) -> Status {
        let this = self.clone();
        match path {
            "/etcdserverpb.Lease/LeaseTimeToLive" => {
                unary(call, sink, |r, _| async move {
                    this.lease_time_to_live(r).await
                })
                .await
            }
            "/etcdserverpb.Lease/LeaseLeases" => {
                unary(call, sink, |r, _| async move { this.lease_leases(r).await }).await
            }
            "/v3lockpb.Lock/Lock" => {
                unary(call, sink, |r, h| async move {
                    let who = auth_api::who(&this.shared, &h.metadata).await?;
                    crate::lock::lock(&this.shared, &this.hub, &who, r).await
                })
                .await
            }
            "/v3lockpb.Lock/Unlock" => {
                unary(call, sink, |r, h| async move {
                    let who = auth_api::who(&this.shared, &h.metadata).await?;
                    crate::lock::unlock(&this.shared, &who, r).await
                })
                .await
            }
            "/v3electionpb.Election/Campaign" => {
                unary(call, sink, |r, h| async move {
                    let who = auth_api::who(&this.shared, &h.metadata).await?;
                    crate::lock::campaign(&this.shared, &this.hub, &who, r).await
                })
                .await
            }
            "/v3electionpb.Election/Proclaim" => {
                unary(call, sink, |r, h| async move {
                    let who = auth_api::who(&this.shared, &h.metadata).await?;
                    crate::lock::proclaim(&this.shared, &who, r).await
                })
                .await
            }
            "/v3electionpb.Election/Leader" => {
                unary(call, sink, |r, h| async move {
                    let who = auth_api::who(&this.shared, &h.metadata).await?;
                    crate::lock::leader(&this.shared, &who, r).await
                })
                .await
            }
            "/v3electionpb.Election/Resign" => {
                unary(call, sink, |r, h| async move {
                    let who = auth_api::who(&this.shared, &h.metadata).await?;
                    crate::lock::resign(&this.shared, &who, r).await
                })
                .await
            }
            "/v3electionpb.Election/Observe" => {
                crate::lock::observe(&self.shared, &self.hub, call, sink).await
            }
            "/etcdserverpb.Maintenance/Status" => {
                unary(call, sink, |r, _| async move { this.status(r) }).await
            }
            "/etcdserverpb.Maintenance/Alarm" => {
                unary(call, sink, |r, _| async move { this.alarm(r).await }).await
            }
            // etcd's authMaintenanceServer: these need the root role once auth is enabled.
            "/etcdserverpb.Maintenance/Defragment" => {
                unary(call, sink, |r, h| async move {
                    auth_api::check_admin_maintenance(&this.shared, &h.metadata).await?;
                    this.defragment(r).await
                })
                .await
            }
            "/etcdserverpb.Maintenance/Snapshot" => {
                if let Err(status) =
                    auth_api::check_admin_maintenance(&self.shared, &call.head.metadata).await
                {
                    return status;
                }
                self.snapshot(call, sink).await
            }
            "/etcdserverpb.Maintenance/Hash" => {
                unary(call, sink, |r, h| async move {
                    auth_api::check_admin_maintenance(&this.shared, &h.metadata).await?;
                    this.hash(r).await
                })
                .await
            }
            "/etcdserverpb.Maintenance/HashKV" => {
                unary(call, sink, |r, h| async move {
                    auth_api::check_admin_maintenance(&this.shared, &h.metadata).await?;
                    this.hash_kv(r)
                })
                .await
            }
            // etcd checks membership changes for the root role on the member asked.
            "/etcdserverpb.Cluster/MemberAdd" => {
                unary(call, sink, |r, h| async move {
                    auth_api::check_admin(&this.shared, &h.metadata).await?;
                    this.member_add(r).await
                })
                .await
            }
            "/etcdserverpb.Cluster/MemberRemove" => {
                unary(call, sink, |r, h| async move {
                    auth_api::check_admin(&this.shared, &h.metadata).await?;
                    this.member_remove(r).await
                })
                .await
            }
            "/etcdserverpb.Cluster/MemberUpdate" => {
                unary(call, sink, |r, h| async move {
                    auth_api::check_admin(&this.shared, &h.metadata).await?;
                    this.member_update(r).await
                })
                .await
            }
            "/etcdserverpb.Cluster/MemberPromote" => {
                unary(call, sink, |r, h| async move {
                    auth_api::check_admin(&this.shared, &h.metadata).await?;
                    this.member_promote(r).await
                })
                .await
            }
            "/etcdserverpb.Maintenance/MoveLeader" => {
                unary(call, sink, |r, _| async move { this.move_leader(r).await }).await
            }
            "/etcdserverpb.Cluster/MemberList" => {
                unary(call, sink, |r, _| async move { this.member_list(r) }).await
            }
            p if p.starts_with("/etcdserverpb.Auth/") => {
                auth_api::dispatch(self, p, call, sink).await
            }
            "/grpc.health.v1.Health/Check" => {
                unary(call, sink, |r, _| async move { this.health_check(r) }).await
            }
            _ => Status::unknown_method(path, service_known(path)),
        }
    }

    /// A range for the JSON gateway, which answers it whole.
    pub(crate) async fn range(&self, r: pb::RangeRequest, who: &AuthInfo) -> R<pb::RangeResponse> {
        let req = self.range_checked(r, who).await?;
        // Its own handle, held across the walk's steps: a snapshot install replacing the
        // store meanwhile leaves this range reading the store it began on.
        let reader = arc_swap::Guard::into_inner(self.shared.reader());
        let unchecked = range_walked(&reader, &req, None, &mut |_| {}).await?;
        let (resp, rest) = self.shared.pager.serve(unchecked).await;
        assert!(rest.is_none(), "a range not split leaves no rest");
        auth_api::check_still_current(&self.shared, who)?;
        let header = self.shared.header(resp.revision);
        Ok(convert::range_response(resp, header))
    }

    /// A range for gRPC: a large one in key order holds only its first key-values, and reads
    /// the rest as it is sent (`convert::RangePieces`), so its memory does not grow with it.
    async fn range_pieces(&self, r: pb::RangeRequest, who: &AuthInfo) -> R<convert::RangePieces> {
        let req = self.range_checked(r, who).await?;
        // Its own handle, held across the walk's steps and the rest's reads: a snapshot
        // install replacing the store meanwhile leaves this range reading the store it began
        // on.
        let reader = arc_swap::Guard::into_inner(self.shared.reader());
        let mut rest_encoded_bytes = 0;
        let mut on_rest = |shape: kv::KeyValueShape<'_>| {
            rest_encoded_bytes += convert::range_kv_encoded_len(&shape)
        };
        let unchecked = range_walked(
            &reader,
            &req,
            Some(convert::RANGE_FIRST_KVS_MAX),
            &mut on_rest,
        )
        .await?;
        let (resp, rest) = self.shared.pager.serve(unchecked).await;
        auth_api::check_still_current(&self.shared, who)?;
        let header = self.shared.header(resp.revision);
        let answer = convert::range_response(resp, header);
        Ok(match rest {
            None => convert::RangePieces::new(answer),
            Some(rest) => {
                let reader = kv::Reader::clone(&reader);
                let pager = self.shared.pager.clone();
                convert::RangePieces::with_rest(answer, reader, rest, rest_encoded_bytes)
                    .paged_by(pager)
            }
        })
    }

    /// A txn of ranges alone, answered as etcd answers one (its `Txn` for `isTxnReadonly`): on
    /// this member, without raft, after the read barrier unless every range is
    /// serializable, at one revision; so it costs what its reads cost, and no write to the
    /// log. Its values come in as a range's do.
    async fn txn_read_only(&self, req: kv::TxnRequest, who: &AuthInfo) -> R<pb::TxnResponse> {
        if !kv::txn_is_serializable(&req) {
            self.shared.read_barrier().await.map_err(etcd)?;
        }
        auth_api::check_txn_read(&self.shared, who, &req)?;
        if let Some(wait) = self.txn_reads_wait(&req) {
            wait.await;
        }
        // Its own handle, held across the steps: a snapshot install replacing the store
        // meanwhile leaves this txn reading the store it began on.
        let reader = arc_swap::Guard::into_inner(self.shared.reader());
        let unchecked = txn_read_walked(&reader, &req)
            .await
            .map_err(|e| etcd(kv_error(e)))?;
        let resp = self.shared.pager.serve(unchecked).await;
        auth_api::check_still_current(&self.shared, who)?;
        let header = self.shared.header(resp.revision);
        Ok(convert::txn_response(resp, header))
    }

    /// Brings in the pages of `records`: the values a request will read where it cannot
    /// wait for the disk (the values a txn compares or sorts by, the value an `ignore_value`
    /// put keeps, see `kv::Reader::records_txn_reads`; a range's sorted by value), before it
    /// is proposed or read.
    async fn bring_in_records(&self, records: &[bytes::Bytes]) {
        if let Some(wait) = self.shared.pager.bring_in_records(records.iter()) {
            wait.await;
        }
    }

    /// Starts bringing in the pages of the values the txn `req` reads (see
    /// `bring_in_records`): the pager's wait, or None when nothing was handed to it (all in
    /// memory, or its queue full and the faults left to the raft core's own look). The shard
    /// looks at up to a raft step's worth of keys, as the raft core does before it applies:
    /// a compare of a million keys is listed by the pager thread, not walked here while the
    /// shard's other connections wait.
    fn txn_reads_wait(&self, req: &kv::TxnRequest) -> Option<crate::pager::PagerWait> {
        let reader = self.shared.reader();
        let (records, whole) =
            reader.records_txn_reads_within(req, crate::limits::APPLY_KEYS_PER_STEP);
        if whole {
            self.shared.pager.bring_in_records(records.iter())
        } else {
            self.shared
                .pager
                .bring_in_listed(records, reader.txn_reads_of(req.clone()))
        }
    }

    /// A range request converted and checked as etcd checks it, after the read barrier of a
    /// linearizable one.
    async fn range_checked(&self, r: pb::RangeRequest, who: &AuthInfo) -> R<kv::RangeRequest> {
        let req = convert::range_request(r);
        kv::validate_range(&req).map_err(|e| etcd(kv_error(e)))?;
        if !req.serializable {
            self.shared.read_barrier().await.map_err(etcd)?;
        }
        // etcd checks reads on the member that serves them, after the read barrier.
        auth_api::check_read(&self.shared, who, &req.key, &req.range_end)?;
        // A sort by value compares values before they are checked: bring them in first,
        // listed as a txn's are (`txn_reads_wait`): a raft step's worth of keys here, the
        // rest by a pager thread, not a walk of a million keys while the shard's other calls
        // (or a hosted shard's raft core) wait.
        if req.sort_target == kv::SortTarget::Value && !req.count_only {
            let reads = kv::TxnRequest {
                compare: Vec::new(),
                success: vec![kv::RequestOp::Range(req.clone())],
                failure: Vec::new(),
            };
            if let Some(wait) = self.txn_reads_wait(&reads) {
                wait.await;
            }
        }
        Ok(req)
    }

    /// A Put, proposed through raft.
    ///
    /// Not an `async fn`, which would hold `r` twice in every put's task.
    // Written out by hand on purpose: clippy would make it an `async fn`.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn put<'a>(
        &'a self,
        r: pb::PutRequest,
        who: &'a AuthInfo,
    ) -> impl Future<Output = R<pb::PutResponse>> + 'a {
        async move {
            // Validate a converted copy: conversion only moves the Bytes handles.
            let req = convert::put_request(r.clone());
            kv::validate_put(&req).map_err(|e| etcd(kv_error(e)))?;
            self.shared
                .check_quota(alarms::put_cost_bytes(&req))
                .await
                .map_err(etcd)?;
            if req.ignore_value {
                let records = self.shared.reader().records_put_reads(&req);
                self.bring_in_records(&records).await;
            }
            // Bound before awaiting: a request built in the awaited expression would stay in
            // this future (1.2 KB) until the answer comes.
            let proposed = self.shared.propose_as(
                pb::InternalRaftRequest {
                    put: Some(r),
                    ..Default::default()
                },
                who,
            );
            let out = proposed.await.map_err(etcd)?;
            match out.response {
                Answer::Op(kv::OpResponse::Put(p)) => {
                    let h = self.header_at(p.revision, out.raft_term);
                    Ok(convert::put_response(p, h))
                }
                other => unreachable_response("Put", &other),
            }
        }
    }

    pub(crate) async fn delete_range(
        &self,
        r: pb::DeleteRangeRequest,
        who: &AuthInfo,
    ) -> R<pb::DeleteRangeResponse> {
        kv::validate_delete_range(&convert::delete_request(r.clone()))
            .map_err(|e| etcd(kv_error(e)))?;
        let proposed = self.shared.propose_as(
            pb::InternalRaftRequest {
                delete_range: Some(r),
                ..Default::default()
            },
            who,
        );
        let out = proposed.await.map_err(etcd)?;
        match out.response {
            Answer::Op(kv::OpResponse::DeleteRange(d)) => {
                let h = self.header_at(d.revision, out.raft_term);
                Ok(convert::delete_response(d, h))
            }
            other => unreachable_response("DeleteRange", &other),
        }
    }

    pub(crate) async fn txn(&self, r: pb::TxnRequest, who: &AuthInfo) -> R<pb::TxnResponse> {
        let req = convert::txn_request(r.clone());
        kv::validate_txn(&req, self.shared.config.max_txn_ops as usize)
            .map_err(|e| etcd(kv_error(e)))?;
        if has_empty_op(&r) {
            return Err(etcd(EtcdError::KeyNotFound));
        }
        if kv::txn_is_read_only(&req) {
            return self.txn_read_only(req, who).await;
        }
        self.shared
            .check_quota(alarms::txn_cost_bytes(&req))
            .await
            .map_err(etcd)?;
        // etcd answers a write it could not apply within its request timeout with "request
        // timed out", and applies it later all the same. A txn whose values are still coming
        // in from disk at that deadline gets that answer now, and is proposed once they are
        // in, on a task of its own whose answer nobody awaits (at most one per job the pager
        // holds, queued or running: with its queue full, a txn is proposed at once).
        // (Answered only after the wait, a compare of 4 GiB of cold values got "request
        // timed out" after 24 s, the wait plus the proposal's own timeout.)
        let late = match self.txn_reads_wait(&req) {
            None => None,
            Some(mut wait) => {
                let came_in = async {
                    (&mut wait).await;
                    true
                };
                let timed_out = async {
                    crate::rt::sleep(self.shared.request_timeout()).await;
                    false
                };
                (!futures_lite::future::or(came_in, timed_out).await).then_some(wait)
            }
        };
        if let Some(wait) = late {
            let shared = self.shared.clone();
            let who = who.clone();
            crate::rt::spawn_local(async move {
                wait.await;
                let request = pb::InternalRaftRequest {
                    txn: Some(r),
                    ..Default::default()
                };
                if let Err(error) = shared.propose_as(request, &who).await {
                    tracing::debug!(%error, "a txn answered \"request timed out\" was not applied");
                }
            });
            return Err(etcd(EtcdError::Timeout));
        }
        let proposed = self.shared.propose_as(
            pb::InternalRaftRequest {
                txn: Some(r),
                ..Default::default()
            },
            who,
        );
        let out = proposed.await.map_err(etcd)?;
        match out.response {
            Answer::Op(kv::OpResponse::Txn(t)) => {
                let h = self.header_at(t.revision, out.raft_term);
                Ok(convert::txn_response(t, h))
            }
            other => unreachable_response("Txn", &other),
        }
    }

    pub(crate) async fn compact(&self, r: pb::CompactionRequest) -> R<pb::CompactionResponse> {
        let out = self
            .shared
            .propose(pb::InternalRaftRequest {
                compaction: Some(r),
                ..Default::default()
            })
            .await
            .map_err(etcd)?;
        match out.response {
            Answer::Op(kv::OpResponse::Compact(c)) => Ok(pb::CompactionResponse {
                header: self.header_at(c.revision, out.raft_term),
            }),
            other => unreachable_response("Compact", &other),
        }
    }

    pub(crate) async fn lease_grant(
        &self,
        mut r: pb::LeaseGrantRequest,
    ) -> R<pb::LeaseGrantResponse> {
        self.shared
            .check_quota(alarms::LEASE_OVERHEAD_BYTES)
            .await
            .map_err(etcd)?;
        if r.id == 0 {
            // The proposer picks the id, so every member applies the same one.
            r.id = self.shared.new_lease_id();
        }
        // Leases must outlive an election; etcd raises short TTLs the same way.
        r.ttl = r.ttl.max(self.shared.lease_ttl_min_s());
        kv::validate_lease_grant(&kv::LeaseGrantRequest {
            id: r.id,
            ttl_s: r.ttl,
        })
        .map_err(|e| etcd(kv_error(e)))?;
        let out = self
            .shared
            .propose(pb::InternalRaftRequest {
                lease_grant: Some(r),
                ..Default::default()
            })
            .await
            .map_err(etcd)?;
        match out.response {
            Answer::Op(kv::OpResponse::LeaseGrant(g)) => Ok(pb::LeaseGrantResponse {
                header: self.header_at(g.revision, out.raft_term),
                id: g.id,
                ttl: g.ttl_s,
                error: String::new(),
            }),
            other => unreachable_response("LeaseGrant", &other),
        }
    }

    pub(crate) async fn lease_time_to_live(
        &self,
        r: pb::LeaseTimeToLiveRequest,
    ) -> R<pb::LeaseTimeToLiveResponse> {
        let id = r.id;
        let status = self
            .shared
            .query(|reply| Query::TimeToLive { id, reply })
            .await
            .map_err(etcd)?;
        let header = self.shared.header(self.shared.reader().current_revision());
        Ok(match status {
            // etcd answers an unknown lease with TTL -1, not an error.
            None => pb::LeaseTimeToLiveResponse {
                header,
                id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
            Some(st) => pb::LeaseTimeToLiveResponse {
                header,
                id,
                ttl: st.remaining_ttl_s,
                granted_ttl: st.granted_ttl_s,
                keys: if r.keys { st.keys } else { Vec::new() },
            },
        })
    }

    pub(crate) async fn lease_leases(
        &self,
        _r: pb::LeaseLeasesRequest,
    ) -> R<pb::LeaseLeasesResponse> {
        let ids = self
            .shared
            .query(|reply| Query::Leases { reply })
            .await
            .map_err(etcd)?;
        Ok(pb::LeaseLeasesResponse {
            header: self.shared.header(self.shared.reader().current_revision()),
            leases: ids.into_iter().map(|id| pb::LeaseStatus { id }).collect(),
        })
    }

    /// The keep-alive stream: one answer per request, in order. An unknown lease answers TTL 0.
    pub(crate) async fn lease_keep_alive(&self, call: Call, sink: &mut ResponseSink) -> Status {
        let Call {
            head: _,
            mut requests,
        } = call;
        loop {
            let req = match requests.decode::<pb::LeaseKeepAliveRequest>().await {
                Ok(Some(r)) => r,
                Ok(None) => return Status::ok(),
                Err(status) => return status,
            };
            let id = req.id;
            // On the leader, the shard renews the lease itself; elsewhere, or when the leader
            // cannot vouch for its leadership now, the raft core answers (forwarding to the
            // leader from a follower).
            let ttl = match self.shared.renew_lease_here(id) {
                Some(ttl) => {
                    self.metrics.record_keepalive(true);
                    ttl
                }
                None => match self
                    .shared
                    .query(|reply| Query::KeepAlive { id, reply })
                    .await
                {
                    Ok(ttl) => {
                        self.metrics.record_keepalive(false);
                        ttl
                    }
                    Err(e) => return etcd(e),
                },
            };
            let resp = pb::LeaseKeepAliveResponse {
                header: self.shared.header(self.shared.reader().current_revision()),
                id,
                ttl,
            };
            if let Err(status) = sink.send(&resp).await {
                return status;
            }
        }
    }

    pub(crate) async fn lease_revoke(
        &self,
        r: pb::LeaseRevokeRequest,
        who: &AuthInfo,
    ) -> R<pb::LeaseRevokeResponse> {
        let proposed = self.shared.propose_as(
            pb::InternalRaftRequest {
                lease_revoke: Some(r),
                ..Default::default()
            },
            who,
        );
        let out = proposed.await.map_err(etcd)?;
        match out.response {
            Answer::Op(kv::OpResponse::LeaseRevoke(v)) => Ok(pb::LeaseRevokeResponse {
                header: self.header_at(v.revision, out.raft_term),
            }),
            other => unreachable_response("LeaseRevoke", &other),
        }
    }

    pub(crate) fn status(&self, _r: pb::StatusRequest) -> R<pb::StatusResponse> {
        let s = &self.shared;
        // etcd lists "no leader" and every raised alarm, each as its proto text.
        let mut errors = Vec::new();
        if !s.has_leader() {
            errors.push(etcd(EtcdError::NoLeader).message);
        }
        for a in s.alarms().iter() {
            errors.push(format!(
                "memberID:{} alarm:{} ",
                a.member_id,
                alarms::alarm_name(a.alarm)
            ));
        }
        Ok(pb::StatusResponse {
            header: s.header(s.reader().current_revision()),
            version: ETCD_VERSION.to_string(),
            db_size: s.db_size_bytes() as i64,
            leader: s.leader_id.load(Ordering::Acquire),
            raft_index: s.commit_index.load(Ordering::Acquire),
            raft_term: s.raft_term.load(Ordering::Acquire),
            raft_applied_index: s.applied_index.load(Ordering::Acquire),
            errors,
            db_size_in_use: s.db_size_in_use_bytes.load(Ordering::Acquire) as i64,
            is_learner: s.is_learner.load(Ordering::Acquire),
        })
    }

    pub(crate) async fn alarm(&self, r: pb::AlarmRequest) -> R<pb::AlarmResponse> {
        // etcd puts every alarm request through raft, GET included, so each answer reflects
        // every alarm applied before it, on whichever member is asked.
        let out = self
            .shared
            .propose(pb::InternalRaftRequest {
                alarm: Some(r),
                ..Default::default()
            })
            .await
            .map_err(etcd)?;
        match out.response {
            // etcd answers Alarm without a header.
            Answer::Alarms(listed) => Ok(pb::AlarmResponse {
                header: None,
                alarms: listed.into_iter().map(|a| a.to_pb()).collect(),
            }),
            other => unreachable_response("Alarm", &other),
        }
    }

    /// Rewrites the value log's dead space away in bounded steps on the raft core (requests go
    /// on meanwhile, unlike etcd's defrag) and answers once it is done. etcd answers Defragment
    /// without a header.
    pub(crate) async fn defragment(&self, _r: pb::DefragmentRequest) -> R<pb::DefragmentResponse> {
        self.shared
            .query(|reply| Query::Defragment { reply })
            .await
            .map_err(etcd)?;
        Ok(pb::DefragmentResponse { header: None })
    }

    pub(crate) fn hash_kv(&self, r: pb::HashKvRequest) -> R<pb::HashKvResponse> {
        let reader = self.shared.reader();
        // etcd's HashByRev refuses a revision at or below the compact revision, the compacted
        // one included (the store itself hashes there, for the corruption check's peers).
        if r.revision > 0 && r.revision <= reader.compact_revision() {
            return Err(etcd(kv_error(kv::KvError::Compacted)));
        }
        let (hash, compact_revision) = reader.hash_kv(r.revision).map_err(|e| etcd(kv_error(e)))?;
        Ok(pb::HashKvResponse {
            header: self.shared.header(self.shared.reader().current_revision()),
            hash,
            compact_revision,
        })
    }

    /// Maintenance.Hash: a hash of the whole replicated state (every kept revision, leases, the
    /// compact revision, then raft's voters and learners), equal on every member that applied
    /// the same entries. It hashes the same consistent capture Maintenance.Snapshot takes,
    /// off the shard's executor, so a large store never stalls this shard's other requests.
    ///
    /// Member names and URLs are left out: a founding member's view of them comes from its own
    /// flags until the attribute entries apply, so healthy members could disagree.
    pub(crate) async fn hash(&self, _r: pb::HashRequest) -> R<pb::HashResponse> {
        for _ in 0..HASH_ATTEMPTS_MAX {
            let snap = self
                .shared
                .query(|reply| Query::Snapshot { reply })
                .await
                .map_err(etcd)?;
            let revision = snap.source.revision();
            let conf_state = snap.conf_state;
            let source = snap.source;
            let store_hash = crate::rt::blocking(move || source.hash()).await;
            match store_hash {
                Ok(store_hash) => {
                    // Continue the store's CRC stream over the membership.
                    let mut hasher = crc32fast::Hasher::new_with_initial(store_hash);
                    for ids in [&conf_state.voters, &conf_state.learners] {
                        assert!(ids.windows(2).all(|w| w[0] < w[1]), "raft keeps ids sorted");
                        hasher.update(&(ids.len() as u64).to_le_bytes());
                        for id in ids {
                            hasher.update(&id.to_le_bytes());
                        }
                    }
                    return Ok(pb::HashResponse {
                        header: self.shared.header(revision),
                        hash: hasher.finalize(),
                    });
                }
                // A compaction began during the scan: capture again after it.
                Err(kv::KvError::Compacted) => continue,
                Err(e) => return Err(etcd(kv_error(e))),
            }
        }
        Err(etcd(EtcdError::Compacted))
    }

    pub(crate) fn member_list(&self, _r: pb::MemberListRequest) -> R<pb::MemberListResponse> {
        let s = &self.shared;
        // This member's own name and client URLs are known here before its attribute entry
        // is applied; etcd publishes them before serving clients, so answer as if it had.
        let mut members = s.members();
        if let Some(me) = members.iter_mut().find(|m| m.id == s.member_id()) {
            if me.name.is_empty() {
                me.name = s.config.name.clone();
            }
            if me.client_urls.is_empty() {
                me.client_urls = s.config.advertise_client_urls.clone();
            }
        }
        // etcd's MemberList header carries no revision.
        Ok(pb::MemberListResponse {
            header: s.header(0),
            members: pb_members(&members),
        })
    }

    async fn member_change(&self, change: MemberChange) -> Result<(u64, Vec<pb::Member>), Status> {
        let (id, members) = self
            .shared
            .query(|reply| Query::Member { change, reply })
            .await
            .map_err(etcd)?;
        Ok((id, pb_members(&members)))
    }

    pub(crate) async fn member_add(&self, r: pb::MemberAddRequest) -> R<pb::MemberAddResponse> {
        check_member_urls(&r.peer_ur_ls)?;
        let change = MemberChange::Add {
            peer_urls: r.peer_ur_ls.clone(),
            learner: r.is_learner,
            // etcd's MemberAdd mixes the wall-clock second of the call into the new id.
            added_at_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let (id, members) = self.member_change(change).await?;
        let member = members.iter().find(|m| m.id == id).cloned();
        Ok(pb::MemberAddResponse {
            header: self.shared.header(0),
            member,
            members,
        })
    }

    pub(crate) async fn member_remove(
        &self,
        r: pb::MemberRemoveRequest,
    ) -> R<pb::MemberRemoveResponse> {
        let (_, members) = self
            .member_change(MemberChange::Remove { id: r.id })
            .await?;
        Ok(pb::MemberRemoveResponse {
            header: self.shared.header(0),
            members,
        })
    }

    pub(crate) async fn member_update(
        &self,
        r: pb::MemberUpdateRequest,
    ) -> R<pb::MemberUpdateResponse> {
        // etcd 3.4 takes an empty list here and then panics applying it; a member left without
        // peer URLs could never be reached again.
        check_member_urls(&r.peer_ur_ls)?;
        let (_, members) = self
            .member_change(MemberChange::Update {
                id: r.id,
                peer_urls: r.peer_ur_ls,
            })
            .await?;
        Ok(pb::MemberUpdateResponse {
            header: self.shared.header(0),
            members,
        })
    }

    pub(crate) async fn member_promote(
        &self,
        r: pb::MemberPromoteRequest,
    ) -> R<pb::MemberPromoteResponse> {
        let (_, members) = self
            .member_change(MemberChange::Promote { id: r.id })
            .await?;
        Ok(pb::MemberPromoteResponse {
            header: self.shared.header(0),
            members,
        })
    }

    /// Streams a point-in-time image of the store as etcd 3.4 does: its bbolt backend in
    /// etcd's schema (crate::etcd_snapshot), in chunks with remaining_bytes counting down to 0,
    /// then the database's SHA-256 in a last message, so `etcdctl snapshot status` and
    /// `restore` read it. The database is written to a temporary file in the data directory on
    /// this shard's blocking thread (`rt::blocking`) from a consistent capture (the raft core
    /// only captures), then read back chunk by chunk, so memory stays bounded whatever the
    /// store's size.
    async fn snapshot(&self, call: Call, sink: &mut ResponseSink) -> Status {
        let Call {
            head: _,
            mut requests,
        } = call;
        if let Err(status) = requests.decode_one::<pb::SnapshotRequest>().await {
            return status;
        }
        let mut attempts = 0;
        let (db, revision) = loop {
            attempts += 1;
            let snap = match self.shared.query(|reply| Query::Snapshot { reply }).await {
                Ok(s) => s,
                Err(e) => return etcd(e),
            };
            let revision = snap.source.revision();
            let dir = self.shared.config.data_dir.clone();
            let written =
                crate::rt::blocking(move || crate::etcd_snapshot::TempDb::write(&dir, &snap)).await;
            match written {
                Ok(db) => break (db, revision),
                // A compaction began during the capture's scan: capture again after it.
                Err(kv::KvError::Compacted) if attempts < HASH_ATTEMPTS_MAX => continue,
                Err(e @ kv::KvError::Compacted) => return etcd(kv_error(e)),
                // An I/O error is not one of etcd's API errors: etcd's togRPCError answers it
                // as Unknown with the error's text, and so do we.
                Err(e) => {
                    tracing::warn!(error = %e, "snapshot failed");
                    return Status::new(keel_grpc::Code::Unknown, e.to_string());
                }
            }
        };
        let header = self.shared.header(revision);
        let db = Arc::new(db);
        let total = db.size_bytes();
        let mut sent = 0u64;
        let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
        while sent < total {
            let db = db.clone();
            let at = sent;
            let chunk = crate::rt::blocking(move || db.read_chunk(at)).await;
            let chunk = match chunk {
                Ok(c) => bytes::Bytes::from(c),
                Err(e) => return Status::new(keel_grpc::Code::Unknown, e.to_string()),
            };
            sha2::Digest::update(&mut hasher, &chunk);
            sent += chunk.len() as u64;
            let resp = pb::SnapshotResponse {
                header,
                remaining_bytes: total - sent,
                blob: chunk,
            };
            if let Err(status) = sink.send(&resp).await {
                return status;
            }
        }
        let sha = sha2::Digest::finalize(hasher);
        let resp = pb::SnapshotResponse {
            header,
            remaining_bytes: 0,
            blob: bytes::Bytes::copy_from_slice(&sha),
        };
        if let Err(status) = sink.send(&resp).await {
            return status;
        }
        Status::ok()
    }

    pub(crate) async fn move_leader(&self, r: pb::MoveLeaderRequest) -> R<pb::MoveLeaderResponse> {
        let to = r.target_id;
        self.shared
            .query(|reply| Query::TransferLeader { to, reply })
            .await
            .map_err(etcd)?;
        // etcd answers MoveLeader without a header.
        Ok(pb::MoveLeaderResponse { header: None })
    }

    fn health_check(&self, r: health::HealthCheckRequest) -> R<health::HealthCheckResponse> {
        // etcd registers the health service under "" only.
        if !r.service.is_empty() {
            return Err(Status::new(keel_grpc::Code::NotFound, "unknown service"));
        }
        // Serving only while writes can commit: a leader is known and the raft core turns.
        let serving = if self.shared.has_leader()
            && self.shared.raft_loop_idle_ms() <= crate::http::raft_stall_ms_max(&self.shared)
        {
            health::health_check_response::ServingStatus::Serving
        } else {
            health::health_check_response::ServingStatus::NotServing
        };
        Ok(health::HealthCheckResponse {
            status: serving as i32,
        })
    }

    fn header_at(&self, revision: i64, raft_term: u64) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            cluster_id: self.shared.cluster_id(),
            member_id: self.shared.member_id(),
            revision,
            raft_term,
        })
    }
}

fn requires_leader(head: &CallHead) -> bool {
    // A static name: one given as `&str` is parsed again at every lookup.
    const HAS_LEADER: http::HeaderName = http::HeaderName::from_static("hasleader");
    head.metadata
        .get(HAS_LEADER)
        .is_some_and(|v| v.as_bytes() == b"true")
}

fn service_known(path: &str) -> ServiceKnown {
    const SERVICES: [&str; 9] = [
        "/etcdserverpb.KV/",
        "/etcdserverpb.Watch/",
        "/etcdserverpb.Lease/",
        "/etcdserverpb.Cluster/",
        "/etcdserverpb.Maintenance/",
        "/etcdserverpb.Auth/",
        "/grpc.health.v1.Health/",
        "/v3lockpb.Lock/",
        "/v3electionpb.Election/",
    ];
    if SERVICES.iter().any(|s| path.starts_with(s)) {
        ServiceKnown::Yes
    } else {
        ServiceKnown::No
    }
}

fn unreachable_response<T>(method: &str, got: &Answer) -> R<T> {
    // The raft core answers each proposal with the response of the op it carried; anything
    // else is a programmer error, reported rather than crashing a shard.
    tracing::error!(method, ?got, "mismatched apply response");
    Err(Status::new(
        keel_grpc::Code::Internal,
        "keel: mismatched apply response",
    ))
}

/// An HTTP answer with a JSON body.
pub fn json(status: StatusCode, body: String) -> HttpResponse {
    HttpResponse::new(status, "application/json", body)
}

/// etcd's `checkRequestOp`: an op with no request in it ("empty op / nil entry"), at any
/// depth of nested txns, refuses the txn as "key not found". (Conversion drops such ops, so
/// this looks at the request as sent; apply skips them, as etcd's does, in logs that hold one.)
fn has_empty_op(txn: &pb::TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .any(|op| match &op.request {
            None => true,
            Some(pb::request_op::Request::RequestTxn(inner)) => has_empty_op(inner),
            Some(_) => false,
        })
}

/// etcd's check of a member's peer URLs (`types.NewURLs`): at least one, each a URL with a
/// host and a port. An empty list would add a voter no one can reach (a one-member cluster
/// then loses its quorum for good).
fn check_member_urls(urls: &[String]) -> Result<(), Status> {
    let valid = !urls.is_empty()
        && urls
            .iter()
            .all(|url| crate::config::url_host_port("peer-urls", url).is_ok());
    if valid {
        Ok(())
    } else {
        Err(Status::new(
            keel_grpc::Code::InvalidArgument,
            "etcdserver: given member URLs are invalid",
        ))
    }
}

/// The members as etcd lists them: ascending by id (its `RaftCluster.Members`), so every
/// member answers the same list whatever order it learnt of the members in.
fn pb_members(members: &[Member]) -> Vec<pb::Member> {
    let mut listed: Vec<pb::Member> = members
        .iter()
        .map(|m| pb::Member {
            id: m.id,
            name: m.name.clone(),
            peer_ur_ls: m.peer_urls.clone(),
            client_ur_ls: m.client_urls.clone(),
            is_learner: m.is_learner,
        })
        .collect();
    listed.sort_unstable_by_key(|m| m.id);
    listed
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use bytes::Bytes;

    use super::*;

    /// A store of `keys` keys, each written once, and a range over all of them sorted by
    /// modification revision, newest first, walked to its end.
    fn walked_sort(keys: u64) -> (Arc<kv::Reader>, kv::RangeRequest, kv::RangeSteps) {
        let (mut writer, reader) = kv::Store::new();
        for i in 0..keys {
            let put = kv::Op::Put(kv::PutRequest {
                key: Bytes::from(format!("k{i:08}")),
                value: Bytes::from_static(b"v"),
                ..Default::default()
            });
            writer.apply(i + 1, &put).expect("put");
        }
        let req = kv::RangeRequest {
            key: Bytes::from_static(b"k"),
            range_end: Bytes::from_static(b"l"),
            sort_order: kv::SortOrder::Descend,
            sort_target: kv::SortTarget::Mod,
            limit: 3,
            ..Default::default()
        };
        let mut steps = reader.range_steps(&req, None).expect("a valid read");
        while !reader.range_step(&mut steps, &req, usize::MAX, &mut |_| {}) {}
        (Arc::new(reader), req, steps)
    }

    /// A range's sort past `READ_SORT_ON_SHARD_KVS_MAX` key-values is handed off the
    /// executor: the executor runs a task beside it (woken by a timer) while the answer of
    /// 200,000 key-values is awaited. One within the bound is sorted in place, with no await:
    /// the task beside it does not run. Both answer as one walk does.
    #[test]
    fn a_large_sort_runs_off_the_executor_and_a_small_one_in_place() {
        let executor = crate::rt::spawn_pinned(
            "sort-test",
            crate::rt::process_cpu_list()[0],
            move || async move {
                let ticks = Rc::new(Cell::new(0u64));
                let done = Rc::new(Cell::new(false));
                let ticker = {
                    let (ticks, done) = (ticks.clone(), done.clone());
                    glommio::spawn_local(async move {
                        while !done.get() {
                            ticks.set(ticks.get() + 1);
                            crate::rt::sleep(std::time::Duration::from_micros(100)).await;
                        }
                    })
                };
                let mut seen = Vec::new();
                for keys in [200_000, crate::limits::READ_SORT_ON_SHARD_KVS_MAX as u64] {
                    let (reader, req, steps) = walked_sort(keys);
                    assert_eq!(steps.reordered_kvs(), keys as usize);
                    let before = ticks.get();
                    let answer = range_walked_finish(&reader, steps, &req)
                        .await
                        .expect("not compacted")
                        .check();
                    seen.push(ticks.get() - before);
                    assert_eq!(answer.0, reader.range(&req).expect("one walk"));
                    assert_eq!(answer.0.kvs[0].mod_revision, keys as i64 + 1);
                }
                done.set(true);
                ticker.await;
                seen
            },
        )
        .expect("executor starts");
        let ticked = executor.join().expect("the test body finishes");
        assert!(ticked[0] > 0, "the large sort held the executor");
        assert_eq!(ticked[1], 0, "the small sort left the executor");
    }
}
