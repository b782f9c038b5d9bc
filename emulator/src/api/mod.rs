//! The REST endpoint: authenticates every request, resolves its target
//! (group, version, namespace, resource, name, subresource) and routes it to
//! the handler for its verb.
//!
//! Follows `k8s.io/apiserver/pkg/endpoints/installer.go` (`registerResourceHandlers`:
//! the verbs per path), `pkg/endpoints/request/requestinfo.go` (`NewRequestInfo`) and
//! `pkg/endpoints/filters/authentication.go` (`WithAuthentication`).
//!
//! Below it, one way down: `get`, `watch`, `write` (the handlers), `validation`
//! (the per-type strategies' `Validate`), `scope` (what every handler shares).

mod get;
mod scope;
pub mod validation;
mod watch;
mod write;

pub use scope::AppState;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::Value;

use crate::discovery;
use crate::resources;
use crate::status::ApiError;
use crate::store::rv_of;
use crate::table;
use crate::users;
use crate::util;
use get::list;
use scope::*;
use watch::watch_stream;
use write::{Change, bind, create, delete, write};

/// Largest request body accepted (the real server's limit is 3 MiB for most writes).
const MAX_BODY: usize = 3 * 1024 * 1024;

fn bearer_user(headers: &HeaderMap) -> Option<users::Identity> {
    let h = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let token = h
        .strip_prefix("Bearer ")
        .or_else(|| h.strip_prefix("bearer "))?;
    users::identity_of_token(token.trim())
}

/// The single entry point: authenticates and routes every request.
pub async fn handle(
    axum::extract::State(st): axum::extract::State<Arc<AppState>>,
    req: http::Request<Body>,
) -> Response {
    let (parts, body) = req.into_parts();
    let Some(requester) = bearer_user(&parts.headers) else {
        return ApiError::unauthorized().into_response();
    };
    if !crate::token_request::still_valid(&st.store, &requester) {
        return ApiError::unauthorized().into_response();
    }
    let user = match crate::impersonation::resolve(&parts.headers, &requester, st.policy.as_ref()) {
        Ok(u) => u,
        Err(e) => return e.into_response(),
    };
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::new(413, "RequestEntityTooLarge", format!("reading body: {e}"))
                .into_response();
        }
    };
    let q = util::parse_query(parts.uri.query());
    let path = parts.uri.path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let get = parts.method == Method::GET;
    let r: Result<Response> = match segs.as_slice() {
        ["version"] if get => Ok(Reply::ok(discovery::version()).into_response()),
        ["healthz" | "livez" | "readyz"] if get => Ok((StatusCode::OK, "ok").into_response()),
        // The admission counters kube-apiserver serves on /metrics (a subset).
        ["metrics"] if get => Ok((
            StatusCode::OK,
            [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            st.admission.metrics().render(),
        )
            .into_response()),
        ["api"] if get => Ok(Reply::ok(discovery::api_versions(&host)).into_response()),
        ["apis"] if get => Ok(Reply::ok(discovery::api_group_list()).into_response()),
        ["api", "v1"] if get => discovery::resource_list("", "v1")
            .map(|b| Reply::ok(b).into_response())
            .ok_or_else(not_found),
        ["apis", g] if get => discovery::api_group(g)
            .map(|b| Reply::ok(b).into_response())
            .ok_or_else(not_found),
        ["apis", g, v] if get => discovery::resource_list(g, v)
            .map(|b| Reply::ok(b).into_response())
            .ok_or_else(not_found),
        ["openapi", "v3"] if get => Ok(Reply::ok(discovery::openapi_root()).into_response()),
        ["openapi", "v3", "api", "v1"] if get => discovery::openapi_gv("", "v1")
            .map(|b| Reply::ok(b).into_response())
            .ok_or_else(not_found),
        ["openapi", "v3", "apis", g, v] if get => discovery::openapi_gv(g, v)
            .map(|b| Reply::ok(b).into_response())
            .ok_or_else(not_found),
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "serviceaccounts",
            sa,
            "token",
        ] if parts.method == Method::POST => parse_body(&body, &parts.headers).and_then(|req| {
            crate::token_request::create(&st.store, st.policy.as_ref(), ns, sa, &user, req)
                .map(IntoResponse::into_response)
        }),
        [
            "api",
            "v1",
            "namespaces",
            ns,
            "services",
            id,
            "proxy",
            rest @ ..,
        ] => {
            let cluster = crate::service_proxy::Cluster {
                store: &st.store,
                admission: &st.admission,
                policy: st.policy.as_ref(),
            };
            let r = crate::service_proxy::ProxyRequest::new(&parts, ns, id, rest, body);
            crate::service_proxy::handle(cluster, &user, r).await
        }
        ["api", "v1", rest @ ..] if !rest.is_empty() => match target("", "v1", rest) {
            Some(t) => resource(&st, &parts.method, &parts.headers, &q, &user, t, body).await,
            None => Err(not_found()),
        },
        ["apis", g, v, rest @ ..] if !rest.is_empty() => match target(g, v, rest) {
            Some(t) => resource(&st, &parts.method, &parts.headers, &q, &user, t, body).await,
            None => Err(not_found()),
        },
        _ => Err(not_found()),
    };
    r.unwrap_or_else(IntoResponse::into_response)
}

fn target(group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if resources::lookup(group, version, plural).is_some_and(|r| r.namespaced) =>
        {
            (ns.to_string(), [&[*plural][..], tail].concat())
        }
        _ => (String::new(), rest.to_vec()),
    };
    let res = resources::lookup(group, version, rest.first()?)?;
    if !ns.is_empty() && !res.namespaced {
        return None;
    }
    let name = rest.get(1).map(|s| s.to_string());
    let sub = rest.get(2).map(|s| s.to_string()).unwrap_or_default();
    if rest.len() > 3 || (!sub.is_empty() && !res.subresources.contains(&sub.as_str())) {
        return None;
    }
    Some(Target { res, ns, name, sub })
}

async fn resource(
    st: &Arc<AppState>,
    method: &Method,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    user: &users::Identity,
    t: Target,
    body: Bytes,
) -> Result<Response> {
    let watch = matches!(q.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = verb_of(method, t.name.is_some(), watch);
    if let Some(node) = users::node_name_of(user) {
        // The Node authorizer decides for kubelets, always (RBAC binds
        // nothing to system:nodes, so its "no opinion" is a denial).
        authorize_kubelet(st, q, user, node, &t, verb)?;
    } else if let Some(policy) = &st.policy {
        authorize_by_rbac(policy, user, &t, verb)?;
    }
    match (method.clone(), t.name.clone(), t.sub.as_str()) {
        (Method::GET, None, _) if watch => watch_stream(st, &t, q, user, wants_table(headers)),
        (Method::GET, None, _) => list(st, &t, q, headers).map(IntoResponse::into_response),
        (Method::GET, Some(name), "" | "status") => get_one(st, &t, &name, headers),
        (Method::POST, None, "") => create(st, &t, q, user, &body)
            .await
            .map(IntoResponse::into_response),
        (Method::POST, Some(name), "binding") => {
            bind(st, &t, &name, &body).map(IntoResponse::into_response)
        }
        (Method::PUT, Some(name), "" | "status") => {
            let obj = parse_body(&body, headers)?;
            write(st, &t, &name, q, user, Change::Replace(obj))
                .await
                .map(IntoResponse::into_response)
        }
        (Method::PATCH, Some(name), "" | "status") => {
            let change = patch_change(headers, &body)?;
            write(st, &t, &name, q, user, change)
                .await
                .map(IntoResponse::into_response)
        }
        (Method::DELETE, Some(name), "") => delete(st, &t, &name, q, user, &body)
            .await
            .map(IntoResponse::into_response),
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The verb authorization sees for a request (`requestinfo.go`).
fn verb_of(method: &Method, named: bool, watch: bool) -> &'static str {
    match (method.clone(), named) {
        (Method::GET, false) if watch => "watch",
        (Method::GET, false) => "list",
        (Method::GET, true) => "get",
        (Method::POST, _) => "create",
        (Method::PUT, _) => "update",
        (Method::PATCH, _) => "patch",
        (Method::DELETE, false) => "deletecollection",
        (Method::DELETE, true) => "delete",
        _ => "unknown",
    }
}

/// The value `field` has in the request's field selector, if it names it.
fn field_selector_value(q: &HashMap<String, String>, field: &str) -> Option<String> {
    q.get("fieldSelector").and_then(|fs| {
        fs.split(',')
            .find_map(|p| p.strip_prefix(field)?.strip_prefix('='))
            .map(str::to_string)
    })
}

/// For a request on one pod: the node the stored pod is bound to.
fn bound_node(st: &AppState, t: &Target) -> Option<String> {
    match (&t.name, t.res.key() == resources::PODS.key()) {
        (Some(n), true) => st.store.get(t.res, &t.ns, n).and_then(|p| {
            p.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .map(str::to_string)
        }),
        _ => None,
    }
}

/// The Node authorizer's decision for the kubelet of `node`.
fn authorize_kubelet(
    st: &AppState,
    q: &HashMap<String, String>,
    user: &users::Identity,
    node: &str,
    t: &Target,
    verb: &str,
) -> Result<()> {
    let listed_name = field_selector_value(q, "metadata.name");
    let pod_node = field_selector_value(q, "spec.nodeName");
    let bound = bound_node(st, t);
    let r = crate::node_authz::NodeRequest {
        verb,
        group: t.res.group,
        resource: t.res.plural,
        subresource: &t.sub,
        name: t
            .name
            .as_deref()
            .or(listed_name.as_deref())
            .unwrap_or_default(),
        pod_node_selector: pod_node.as_deref(),
        pod_bound_to: bound.as_deref(),
    };
    crate::node_authz::authorize(node, &r).map_err(|why| {
        let msg = crate::node_authz::denial(user, &r, &t.ns, &why);
        match &t.name {
            Some(n) => ApiError::forbidden(t.res.plural, t.res.group, n, &msg),
            None => ApiError::new(
                403,
                "Forbidden",
                format!("{} is forbidden: {msg}", t.res.plural),
            ),
        }
    })
}

/// RBAC's decision for everyone else.
fn authorize_by_rbac(
    policy: &crate::rbac::Policy,
    user: &users::Identity,
    t: &Target,
    verb: &str,
) -> Result<()> {
    let resource = if t.sub.is_empty() {
        t.res.plural.to_string()
    } else {
        format!("{}/{}", t.res.plural, t.sub)
    };
    let req = crate::rbac::Request {
        user,
        verb,
        group: t.res.group,
        resource,
        namespace: &t.ns,
        name: t.name.as_deref(),
    };
    policy.authorize(&req).map_err(|why| match &t.name {
        Some(n) => ApiError::forbidden(t.res.plural, t.res.group, n, &why),
        None => {
            let what = if t.res.group.is_empty() {
                t.res.plural.to_string()
            } else {
                format!("{}.{}", t.res.plural, t.res.group)
            };
            ApiError::new(403, "Forbidden", format!("{what} is forbidden: {why}"))
        }
    })
}

/// GET of one object (or its status), as JSON or a one-row Table.
fn get_one(st: &AppState, t: &Target, name: &str, headers: &HeaderMap) -> Result<Response> {
    let obj = st
        .store
        .get(t.res, &t.ns, name)
        .ok_or_else(|| ApiError::not_found(t.res.plural, t.res.group, name))?;
    if wants_table(headers) {
        let rv = rv_of(&obj).unwrap_or(0);
        return Ok(Reply::ok(table::table(t.res, &[&obj], rv, None)).into_response());
    }
    Ok(Reply::ok((*obj).clone()).into_response())
}

/// The change a PATCH body describes, by its content type.
fn patch_change(headers: &HeaderMap, body: &[u8]) -> Result<Change> {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let ct = ct.split(';').next().unwrap_or_default().trim().to_string();
    Ok(match ct.as_str() {
        "application/json-patch+json" => Change::Json(
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?,
        ),
        "application/merge-patch+json" => Change::Merge(json_body(body)?),
        "application/strategic-merge-patch+json" => Change::Strategic(json_body(body)?),
        "application/apply-patch+yaml" => Change::Apply(yaml_or_json(body)?),
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
                ),
            ));
        }
    })
}
