//! The JSON gateway on the client port, as etcd 3.4 serves it (grpc-gateway): `POST /v3/...`
//! with a JSON request in proto3's JSON mapping (the .proto field names, int64 as strings,
//! bytes as base64), answered by the same service methods gRPC calls reach.
//!
//! Unary calls only: the streaming ones (`/v3/watch`, `/v3/lease/keepalive`,
//! `/v3/election/observe`, `/v3/maintenance/snapshot`) answer 501 until the HTTP/1.1 server can
//! stream a chunked body.

use std::future::Future;
use std::rc::Rc;

use http::StatusCode;
use keel_grpc::{Code, HttpRequest, HttpResponse, Status};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::service::Api;

/// Whether `path` is one the gateway answers (everything under `/v3/`).
pub fn is_gateway_path(path: &str) -> bool {
    path.starts_with("/v3/")
}

/// Answers one gateway request.
pub async fn serve(api: &Rc<Api>, request: HttpRequest) -> HttpResponse {
    let path = request.path.split('?').next().unwrap_or("").to_string();
    if request.method != http::Method::POST {
        return HttpResponse::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "Method Not Allowed\n",
        );
    }
    // etcd's gateway passes the `Authorization` header on as the call's token.
    let who = match crate::auth::who(api.shared(), &request.headers).await {
        Ok(who) => who,
        Err(e) => return error(&Status::from(e)),
    };
    let is_admin = || async { api.shared().auth().check_admin(&who).map_err(Status::from) };
    let admin_only = matches!(
        path.as_str(),
        "/v3/cluster/member/add"
            | "/v3/cluster/member/remove"
            | "/v3/cluster/member/update"
            | "/v3/cluster/member/promote"
    );
    if admin_only {
        if let Err(status) = is_admin().await {
            return error(&status);
        }
    }
    if matches!(
        path.as_str(),
        "/v3/maintenance/defragment" | "/v3/maintenance/hash"
    ) {
        if let Err(status) =
            crate::auth::api::check_admin_maintenance(api.shared(), &request.headers).await
        {
            return error(&status);
        }
    }
    let body = request.body;
    let api = api.clone();
    let who = &who;
    if let Some(rest) = path.strip_prefix("/v3/auth/") {
        return auth_call(&api, who, rest, &body).await;
    }
    match path.as_str() {
        "/v3/kv/range" => call(&body, |r| async move { api.range(r, who).await }).await,
        "/v3/kv/put" => call(&body, |r| async move { api.put(r, who).await }).await,
        "/v3/kv/deleterange" => {
            call(&body, |r| async move { api.delete_range(r, who).await }).await
        }
        "/v3/kv/txn" => call(&body, |r| async move { api.txn(r, who).await }).await,
        "/v3/kv/compaction" => call(&body, |r| async move { api.compact(r).await }).await,
        "/v3/lease/grant" => call(&body, |r| async move { api.lease_grant(r).await }).await,
        "/v3/lease/revoke" | "/v3/kv/lease/revoke" => {
            call(&body, |r| async move { api.lease_revoke(r, who).await }).await
        }
        "/v3/lease/timetolive" | "/v3/kv/lease/timetolive" => {
            call(&body, |r| async move { api.lease_time_to_live(r).await }).await
        }
        "/v3/lease/leases" | "/v3/kv/lease/leases" => {
            call(&body, |r| async move { api.lease_leases(r).await }).await
        }
        "/v3/cluster/member/add" => call(&body, |r| async move { api.member_add(r).await }).await,
        "/v3/cluster/member/remove" => {
            call(&body, |r| async move { api.member_remove(r).await }).await
        }
        "/v3/cluster/member/update" => {
            call(&body, |r| async move { api.member_update(r).await }).await
        }
        "/v3/cluster/member/promote" => {
            call(&body, |r| async move { api.member_promote(r).await }).await
        }
        "/v3/cluster/member/list" => call(&body, |r| async move { api.member_list(r) }).await,
        "/v3/maintenance/alarm" => call(&body, |r| async move { api.alarm(r).await }).await,
        "/v3/maintenance/status" => call(&body, |r| async move { api.status(r) }).await,
        "/v3/maintenance/defragment" => {
            call(&body, |r| async move { api.defragment(r).await }).await
        }
        // etcd's protos map Hash and HashKV to the same path; grpc-gateway serves Hash there.
        "/v3/maintenance/hash" => call(&body, |r| async move { api.hash(r).await }).await,
        "/v3/maintenance/transfer-leadership" => {
            call(&body, |r| async move { api.move_leader(r).await }).await
        }
        "/v3/lock/lock" => {
            call(&body, |r| async move {
                crate::lock::lock(api.shared(), api.hub(), who, r).await
            })
            .await
        }
        "/v3/lock/unlock" => {
            call(&body, |r| async move {
                crate::lock::unlock(api.shared(), who, r).await
            })
            .await
        }
        "/v3/election/campaign" => {
            call(&body, |r| async move {
                crate::lock::campaign(api.shared(), api.hub(), who, r).await
            })
            .await
        }
        "/v3/election/proclaim" => {
            call(&body, |r| async move {
                crate::lock::proclaim(api.shared(), who, r).await
            })
            .await
        }
        "/v3/election/leader" => {
            call(&body, |r| async move {
                crate::lock::leader(api.shared(), who, r).await
            })
            .await
        }
        "/v3/election/resign" => {
            call(&body, |r| async move {
                crate::lock::resign(api.shared(), who, r).await
            })
            .await
        }
        "/v3/watch"
        | "/v3/lease/keepalive"
        | "/v3/election/observe"
        | "/v3/maintenance/snapshot" => error(&Status::new(
            Code::Unimplemented,
            "keel: streaming calls are not served by the JSON gateway yet",
        )),
        _ => HttpResponse::not_found(),
    }
}

/// `/v3/auth/...`: etcd's Auth service through the gateway.
async fn auth_call(
    api: &Rc<Api>,
    who: &crate::auth::AuthInfo,
    rest: &str,
    body: &[u8],
) -> HttpResponse {
    use crate::auth::api as a;
    let api = api.as_ref();
    match rest {
        "enable" => call(body, |r| a::auth_enable(api, who, r)).await,
        "disable" => call(body, |r| a::auth_disable(api, who, r)).await,
        "authenticate" => call(body, |r| a::authenticate(api, who, r)).await,
        "user/add" => call(body, |r| a::user_add(api, who, r)).await,
        "user/get" => call(body, |r| a::user_get(api, who, r)).await,
        "user/list" => call(body, |r| a::user_list(api, who, r)).await,
        "user/delete" => call(body, |r| a::user_delete(api, who, r)).await,
        "user/changepw" => call(body, |r| a::user_change_password(api, who, r)).await,
        "user/grant" => call(body, |r| a::user_grant_role(api, who, r)).await,
        "user/revoke" => call(body, |r| a::user_revoke_role(api, who, r)).await,
        "role/add" => call(body, |r| a::role_add(api, who, r)).await,
        "role/get" => call(body, |r| a::role_get(api, who, r)).await,
        "role/list" => call(body, |r| a::role_list(api, who, r)).await,
        "role/delete" => call(body, |r| a::role_delete(api, who, r)).await,
        "role/grant" => call(body, |r| a::role_grant_permission(api, who, r)).await,
        "role/revoke" => call(body, |r| a::role_revoke_permission(api, who, r)).await,
        _ => HttpResponse::not_found(),
    }
}

/// Decodes the JSON request (an empty body is an empty request, and unknown fields are
/// ignored, as grpc-gateway does), runs the method, and encodes its answer or error.
async fn call<Req, Resp, F, Fut>(body: &[u8], method: F) -> HttpResponse
where
    Req: DeserializeOwned + Default,
    Resp: Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    let request = if body.iter().all(|b| b.is_ascii_whitespace()) {
        Req::default()
    } else {
        match serde_json::from_slice::<Req>(body) {
            Ok(r) => r,
            Err(e) => return error(&Status::new(Code::InvalidArgument, e.to_string())),
        }
    };
    match method(request).await {
        Ok(response) => match serde_json::to_vec(&response) {
            Ok(json) => HttpResponse::new(StatusCode::OK, "application/json", json),
            Err(e) => error(&Status::new(Code::Internal, e.to_string())),
        },
        Err(status) => error(&status),
    }
}

/// grpc-gateway's error answer: `{"error":…,"message":…,"code":…}` with the HTTP status its
/// `HTTPStatusFromCode` picks.
fn error(status: &Status) -> HttpResponse {
    let body = format!(
        r#"{{"error":{m},"message":{m},"code":{c}}}"#,
        m = serde_json::Value::String(status.message.clone()),
        c = status.code.as_u8()
    );
    HttpResponse::new(http_status(status.code), "application/json", body)
}

/// grpc-gateway v1's mapping from gRPC codes to HTTP statuses.
fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Canceled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_look_like_grpc_gateways() {
        let r = error(&Status::new(
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        ));
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            &r.body[..],
            br#"{"error":"etcdserver: key is not provided","message":"etcdserver: key is not provided","code":3}"#
        );
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::PRECONDITION_FAILED
        );
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
    }
}
