//! The REST handlers: routing, list/get/watch, and writes through admission
//! and the per-type strategies into storage.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use crate::admission::{Admission, Attributes, Operation};
use crate::discovery;
use crate::resources::{self, ResourceDef};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::smp;
use crate::status::{ApiError, json_response};
use crate::store::{EventType, Store, StoredEvent, WriteError, rv_of};
use crate::table;
use crate::users;
use crate::util;

/// Largest request body accepted (the real server's limit is 3 MiB for most writes).
const MAX_BODY: usize = 3 * 1024 * 1024;
/// How often a write retries after a storage conflict it did not ask for.
const MAX_RETRIES: usize = 8;

#[derive(Debug)]
pub struct AppState {
    pub store: Arc<Store>,
    pub admission: Arc<Admission>,
    pub shutdown: watch::Receiver<bool>,
    /// Bumped to end every open watch (what an API server restart does).
    pub kick: watch::Receiver<u64>,
    pub bookmark_interval: Duration,
    /// RBAC from the given roles and bindings; `None` lets every authenticated user do anything.
    pub policy: Option<crate::rbac::Policy>,
    /// What every watch sent, per type (the fan-out benchmark reads it).
    pub fanout: Arc<crate::fanout::Fanout>,
}

type Result<T> = std::result::Result<T, ApiError>;

/// What a request is about.
#[derive(Debug)]
struct Target {
    res: &'static ResourceDef,
    ns: String,
    name: Option<String>,
    sub: String,
}

/// A response with optional `Warning` headers.
struct Reply {
    code: StatusCode,
    body: Value,
    warnings: Vec<String>,
}

impl Reply {
    fn ok(body: Value) -> Self {
        Self {
            code: StatusCode::OK,
            body,
            warnings: Vec::new(),
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut resp = json_response(self.code, &self.body);
        for w in self.warnings {
            // Control characters cannot be in a header; UTF-8 text can (Go
            // sends it as is and kubectl prints it).
            let clean: String = w
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            let text = format!(
                "299 - \"{}\"",
                clean.replace('\\', "\\\\").replace('"', "\\\"")
            );
            if let Ok(v) = HeaderValue::from_bytes(text.as_bytes()) {
                resp.headers_mut().append(http::header::WARNING, v);
            }
        }
        resp
    }
}

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
            crate::token_request::create(&st, ns, sa, &user, req).map(IntoResponse::into_response)
        }),
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
    let verb = match (method.clone(), &t.name) {
        (Method::GET, None) if watch => "watch",
        (Method::GET, None) => "list",
        (Method::GET, Some(_)) => "get",
        (Method::POST, _) => "create",
        (Method::PUT, _) => "update",
        (Method::PATCH, _) => "patch",
        (Method::DELETE, None) => "deletecollection",
        (Method::DELETE, Some(_)) => "delete",
        _ => "unknown",
    };
    if let Some(node) = users::node_name_of(user) {
        // The Node authorizer decides for kubelets, always (RBAC binds
        // nothing to system:nodes, so its "no opinion" is a denial).
        let selector = |field: &str| {
            q.get("fieldSelector").and_then(|fs| {
                fs.split(',')
                    .find_map(|p| p.strip_prefix(field)?.strip_prefix('='))
                    .map(str::to_string)
            })
        };
        let listed_name = selector("metadata.name");
        let pod_node = selector("spec.nodeName");
        let bound = match (&t.name, t.res.key() == resources::PODS.key()) {
            (Some(n), true) => st.store.get(t.res, &t.ns, n).and_then(|p| {
                p.pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            }),
            _ => None,
        };
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
        if let Err(why) = crate::node_authz::authorize(node, &r) {
            let msg = crate::node_authz::denial(user, &r, &t.ns, &why);
            return Err(match &t.name {
                Some(n) => ApiError::forbidden(t.res.plural, t.res.group, n, &msg),
                None => ApiError::new(
                    403,
                    "Forbidden",
                    format!("{} is forbidden: {msg}", t.res.plural),
                ),
            });
        }
    } else if let Some(policy) = &st.policy {
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
        if let Err(why) = policy.authorize(&req) {
            return Err(match &t.name {
                Some(n) => ApiError::forbidden(t.res.plural, t.res.group, n, &why),
                None => {
                    let what = if t.res.group.is_empty() {
                        t.res.plural.to_string()
                    } else {
                        format!("{}.{}", t.res.plural, t.res.group)
                    };
                    ApiError::new(403, "Forbidden", format!("{what} is forbidden: {why}"))
                }
            });
        }
    }
    match (method.clone(), t.name.clone(), t.sub.as_str()) {
        (Method::GET, None, _) if watch => watch_stream(st, &t, q, user, wants_table(headers)),
        (Method::GET, None, _) => list(st, &t, q, headers).map(IntoResponse::into_response),
        (Method::GET, Some(name), "" | "status") => {
            let obj = st
                .store
                .get(t.res, &t.ns, &name)
                .ok_or_else(|| ApiError::not_found(t.res.plural, t.res.group, &name))?;
            if wants_table(headers) {
                let rv = rv_of(&obj).unwrap_or(0);
                return Ok(Reply::ok(table::table(t.res, &[&obj], rv, None)).into_response());
            }
            Ok(Reply::ok((*obj).clone()).into_response())
        }
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
            let ct = headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let ct = ct.split(';').next().unwrap_or_default().trim().to_string();
            let change = match ct.as_str() {
                "application/json-patch+json" => Change::Json(
                    serde_json::from_slice(&body)
                        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?,
                ),
                "application/merge-patch+json" => Change::Merge(json_body(&body)?),
                "application/strategic-merge-patch+json" => Change::Strategic(json_body(&body)?),
                "application/apply-patch+yaml" => Change::Apply(yaml_or_json(&body)?),
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!(
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
                        ),
                    ));
                }
            };
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

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

fn json_body(body: &[u8]) -> Result<Value> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

fn yaml_or_json(body: &[u8]) -> Result<Value> {
    serde_json::from_slice(body)
        .or_else(|_| serde_yaml::from_slice(body))
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

fn parse_body(body: &[u8], headers: &HeaderMap) -> Result<Value> {
    let ct = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ct.contains("protobuf") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the emulator speaks JSON only",
        ));
    }
    if ct.contains("yaml") {
        yaml_or_json(body)
    } else {
        json_body(body)
    }
}

fn dry_run(q: &HashMap<String, String>) -> Result<bool> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid value: \"{other}\": supported values: \"All\""
        ))),
    }
}

fn options(kind: &str, q: &HashMap<String, String>, dry: bool) -> Value {
    let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if dry {
        o["dryRun"] = json!(["All"]);
    }
    if let Some(fm) = q.get("fieldManager") {
        o["fieldManager"] = json!(fm);
    }
    if let Some(fv) = q.get("fieldValidation") {
        o["fieldValidation"] = json!(fv);
    }
    o
}

fn list(
    st: &AppState,
    t: &Target,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Reply> {
    let ls = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fs = FieldSelector::parse(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        t.res,
    )?;
    let ns = (!t.ns.is_empty()).then_some(t.ns.as_str());
    let (items, mut rv) = st.store.list(t.res, ns);
    let start = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            let (crv, key) = decode_continue(c)?;
            rv = crv;
            Some(key)
        }
        None => None,
    };
    let limit: usize = match q.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        None => 0,
    };
    let mut matched: Vec<&Value> = items
        .iter()
        .map(|a| a.as_ref())
        .filter(|o| ls.matches_object(o) && fs.matches(o))
        .filter(|o| start.as_ref().is_none_or(|s| obj_key(o) > *s))
        .collect();
    let mut cont = None;
    let mut remaining = 0;
    if limit > 0 && matched.len() > limit {
        remaining = matched.len() - limit;
        matched.truncate(limit);
        cont = matched.last().map(|o| encode_continue(rv, &obj_key(o)));
    }
    if wants_table(headers) {
        return Ok(Reply::ok(table::table(
            t.res,
            &matched,
            rv,
            cont.as_deref(),
        )));
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    Ok(Reply::ok(json!({
        "kind": t.res.list_kind(),
        "apiVersion": t.res.api_version(),
        "metadata": meta,
        "items": matched,
    })))
}

fn obj_key(o: &Value) -> String {
    let ns = o
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let name = o
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    format!("{ns}\u{0}{name}")
}

fn encode_continue(rv: u64, key: &str) -> String {
    URL_SAFE_NO_PAD.encode(json!({"rv": rv, "start": key}).to_string())
}

fn decode_continue(c: &str) -> Result<(u64, String)> {
    let bad = || ApiError::bad_request("invalid continue token");
    let bytes = URL_SAFE_NO_PAD.decode(c).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok((
        v["rv"].as_u64().ok_or_else(bad)?,
        v["start"].as_str().ok_or_else(bad)?.to_string(),
    ))
}

/// Fills in what every stored object carries.
fn normalise(res: &ResourceDef, ns: &str, obj: &mut Value) -> Result<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or(res.kind);
    let av = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| res.api_version());
    if kind != res.kind || av != res.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) or kind ({kind}) does not match the expected {}, Kind={}",
            res.api_version(),
            res.kind
        )));
    }
    obj["kind"] = json!(res.kind);
    obj["apiVersion"] = json!(res.api_version());
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    if res.namespaced {
        match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => obj["metadata"]["namespace"] = json!(ns),
        }
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    Ok(())
}

fn name_of(obj: &Value) -> String {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The type's validation (`strategy.Validate`), run after mutating admission
/// on every write, and on objects a test stores directly.
pub fn validate(res: &ResourceDef, obj: &Value) -> Result<()> {
    let name = name_of(obj);
    if name.is_empty() {
        return Err(ApiError::invalid(
            res.kind,
            "",
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    if res.key() == resources::CONFIGMAPS.key() {
        validate_config_map(obj, &name)?;
    }
    let errors = crate::admission::validation::validate(res.kind, obj);
    if !errors.is_empty() {
        let errors: Vec<(String, String)> =
            errors.into_iter().map(|e| (e.field, e.detail)).collect();
        return Err(ApiError::invalid_fields(
            res.kind, res.group, &name, &errors,
        ));
    }
    if res.key() == resources::NODES.key() {
        // Kubernetes rejects two taints with the same key and effect.
        let taints = obj
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (i, a) in taints.iter().enumerate() {
            if a.get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
            {
                return Err(ApiError::invalid(
                    res.kind,
                    &name,
                    &format!("spec.taints[{i}].key: Required value"),
                ));
            }
            if taints[..i]
                .iter()
                .any(|b| b.get("key") == a.get("key") && b.get("effect") == a.get("effect"))
            {
                return Err(ApiError::invalid(
                    res.kind,
                    &name,
                    &format!(
                        "spec.taints[{i}]: Duplicate value: \"{}:{}\"",
                        a["key"].as_str().unwrap_or_default(),
                        a["effect"].as_str().unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `ValidateConfigMap` (pkg/apis/core/validation): every key of `data` and
/// `binaryData` passes `IsConfigMapKey`, no key is in both, and all values
/// together stay within `MaxSecretSize` (1 MiB), counting `binaryData`
/// decoded.
fn validate_config_map(obj: &Value, name: &str) -> Result<()> {
    const MAX_SIZE: usize = 1024 * 1024;
    let invalid = |msg: String| ApiError::invalid("ConfigMap", name, &msg);
    let key_ok = |k: &str| {
        !k.is_empty()
            && k.len() <= 253
            && k != "."
            && k != ".."
            && !k.starts_with("..")
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    };
    let mut total = 0usize;
    let data = obj.get("data").and_then(Value::as_object);
    for (k, v) in data.into_iter().flatten() {
        if !key_ok(k) {
            return Err(invalid(format!(
                "data[{k}]: Invalid value: {k:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
            )));
        }
        total += v.as_str().map_or(0, str::len);
    }
    let binary = obj.get("binaryData").and_then(Value::as_object);
    for (k, v) in binary.into_iter().flatten() {
        if !key_ok(k) || data.is_some_and(|d| d.contains_key(k)) {
            return Err(invalid(format!(
                "binaryData[{k}]: Invalid value: {k:?}: a valid config key must be unique and consist of alphanumeric characters, '-', '_' or '.'"
            )));
        }
        total += v.as_str().map_or(0, |s| s.len() / 4 * 3);
    }
    if total > MAX_SIZE {
        return Err(invalid(format!(
            "[]: Too long: may not be more than {MAX_SIZE} bytes"
        )));
    }
    Ok(())
}

async fn create(
    st: &AppState,
    t: &Target,
    q: &HashMap<String, String>,
    user: &users::Identity,
    body: &[u8],
) -> Result<Reply> {
    let dry = dry_run(q)?;
    let mut obj = yaml_or_json(body)?;
    normalise(t.res, &t.ns, &mut obj)?;
    if name_of(&obj).is_empty()
        && let Some(prefix) = obj
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
    {
        let suffix: String = (0..5)
            .map(|_| {
                let i = rand::random::<u8>() % 36;
                char::from_digit(u32::from(i), 36).unwrap_or('x')
            })
            .collect();
        obj["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
    }
    let name = name_of(&obj);
    let attrs = Attributes {
        res: t.res,
        subresource: "",
        operation: Operation::Create,
        name: &name,
        namespace: &t.ns,
        user,
        extra: &user.extra,
        dry_run: dry,
        options: options("CreateOptions", q, dry),
    };
    let mut admitted = st.admission.admit(&attrs, obj, None).await?;
    validate(t.res, &admitted.object)?;
    admitted
        .warnings
        .extend(st.admission.validate(&attrs, &admitted.object, None)?);
    let stored = st
        .store
        .create(t.res, &t.ns, admitted.object, dry)
        .map_err(|e| write_error(e, t.res, &name))?;
    Ok(Reply {
        code: StatusCode::CREATED,
        body: stored,
        warnings: admitted.warnings,
    })
}

fn write_error(e: WriteError, res: &ResourceDef, name: &str) -> ApiError {
    match e {
        WriteError::NotFound => ApiError::not_found(res.plural, res.group, name),
        WriteError::AlreadyExists => ApiError::already_exists(res.plural, res.group, name),
        WriteError::Conflict => ApiError::conflict(res.plural, res.group, name),
    }
}

/// How an update changes the stored object.
#[derive(Debug)]
enum Change {
    Replace(Value),
    Json(json_patch::Patch),
    Merge(Value),
    Strategic(Value),
    Apply(Value),
}

impl Change {
    /// Whether the request itself names a resourceVersion (a precondition).
    fn mentions_rv(&self) -> bool {
        let rv_set = |v: &Value| {
            v.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        };
        match self {
            Change::Replace(v) => rv_set(v),
            Change::Merge(v) | Change::Strategic(v) => rv_set(v),
            Change::Json(p) => {
                p.0.iter()
                    .any(|op| op.path().as_str() == "/metadata/resourceVersion")
            }
            Change::Apply(_) => false,
        }
    }

    fn apply(&self, cur: &Value) -> Result<Value> {
        let mut new = cur.clone();
        match self {
            Change::Replace(v) => new = v.clone(),
            Change::Json(p) => json_patch::patch(&mut new, p).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?,
            Change::Merge(p) | Change::Apply(p) => json_patch::merge(&mut new, p),
            Change::Strategic(p) => smp::apply(&mut new, p).map_err(ApiError::bad_request)?,
        }
        Ok(new)
    }
}

/// The node and pod strategies: a main-resource write keeps the stored
/// status, a status write keeps the stored spec. Identity fields never change.
fn prepare_for_update(res: &ResourceDef, sub: &str, new: &mut Value, cur: &Value) {
    if res.has_status() {
        let keep = if sub == "status" { "spec" } else { "status" };
        match cur.get(keep) {
            Some(v) => new[keep] = v.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove(keep);
                }
            }
        }
    }
    for f in ["uid", "creationTimestamp", "name", "namespace"] {
        match cur["metadata"].get(f) {
            Some(v) => new["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
}

async fn write(
    st: &AppState,
    t: &Target,
    name: &str,
    q: &HashMap<String, String>,
    user: &users::Identity,
    change: Change,
) -> Result<Reply> {
    let dry = dry_run(q)?;
    for _ in 0..MAX_RETRIES {
        let Some(cur) = st.store.get(t.res, &t.ns, name) else {
            if let (Change::Apply(obj), "") = (&change, t.sub.as_str()) {
                let body = serde_json::to_vec(obj).map_err(ApiError::internal)?;
                return create(st, t, q, user, &body).await;
            }
            return Err(ApiError::not_found(t.res.plural, t.res.group, name));
        };
        let cur_rv = rv_of(&cur).unwrap_or(0);
        let mut new = change.apply(&cur)?;
        normalise(t.res, &t.ns, &mut new)?;
        let body_name = name_of(&new);
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        // A resourceVersion in the new object is a precondition: no retries.
        let precondition = if change.mentions_rv() {
            new.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        } else {
            None
        };
        if let Some(rv) = &precondition
            && *rv != cur_rv.to_string()
        {
            return Err(ApiError::conflict(t.res.plural, t.res.group, name));
        }
        let attrs = Attributes {
            res: t.res,
            subresource: &t.sub,
            operation: Operation::Update,
            name,
            namespace: &t.ns,
            user,
            extra: &user.extra,
            dry_run: dry,
            options: options("UpdateOptions", q, dry),
        };
        let mut admitted = st.admission.admit(&attrs, new, Some(&cur)).await?;
        let mut obj = admitted.object;
        prepare_for_update(t.res, &t.sub, &mut obj, &cur);
        validate(t.res, &obj)?;
        admitted
            .warnings
            .extend(st.admission.validate(&attrs, &obj, Some(&cur))?);
        match st.store.update(t.res, &t.ns, name, obj, cur_rv, dry) {
            Ok(stored) => {
                return Ok(Reply {
                    code: StatusCode::OK,
                    body: stored,
                    warnings: admitted.warnings,
                });
            }
            Err(WriteError::Conflict) if precondition.is_none() => continue,
            Err(e) => return Err(write_error(e, t.res, name)),
        }
    }
    Err(ApiError::conflict(t.res.plural, t.res.group, name))
}

async fn delete(
    st: &AppState,
    t: &Target,
    name: &str,
    q: &HashMap<String, String>,
    user: &users::Identity,
    body: &[u8],
) -> Result<Reply> {
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        json_body(body)?
    };
    // DeleteOptions may carry dryRun in the body (kube-rs sends it there).
    let dry = dry_run(q)?
        || opts
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|d| d.iter().any(|x| x.as_str() == Some("All")));
    let precondition = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<u64>().ok());
    let cur = st
        .store
        .get(t.res, &t.ns, name)
        .ok_or_else(|| ApiError::not_found(t.res.plural, t.res.group, name))?;
    let attrs = Attributes {
        res: t.res,
        subresource: "",
        operation: Operation::Delete,
        name,
        namespace: &t.ns,
        user,
        extra: &user.extra,
        dry_run: dry,
        options: options("DeleteOptions", q, dry),
    };
    let mut admitted = st.admission.admit(&attrs, Value::Null, Some(&cur)).await?;
    admitted
        .warnings
        .extend(st.admission.validate(&attrs, &Value::Null, Some(&cur))?);
    let gone = st
        .store
        .delete(t.res, &t.ns, name, precondition, dry)
        .map_err(|e| write_error(e, t.res, name))?;
    Ok(Reply {
        code: StatusCode::OK,
        body: gone,
        warnings: admitted.warnings,
    })
}

/// `pods/binding`: what the scheduler posts to place a pod.
fn bind(st: &AppState, t: &Target, name: &str, body: &[u8]) -> Result<Reply> {
    let binding = json_body(body)?;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid("Binding", name, "target.name: Required value"))?;
    for _ in 0..MAX_RETRIES {
        let cur = st
            .store
            .get(t.res, &t.ns, name)
            .ok_or_else(|| ApiError::not_found(t.res.plural, t.res.group, name))?;
        if let Some(on) = cur
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{on}\""
                ),
            ));
        }
        let mut new = (*cur).clone();
        if !new.get("spec").is_some_and(Value::is_object) {
            new["spec"] = json!({});
        }
        new["spec"]["nodeName"] = json!(node);
        match st
            .store
            .update(t.res, &t.ns, name, new, rv_of(&cur).unwrap_or(0), false)
        {
            Ok(_) => {
                return Ok(Reply {
                    code: StatusCode::CREATED,
                    body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                    warnings: Vec::new(),
                });
            }
            Err(WriteError::Conflict) => continue,
            Err(e) => return Err(write_error(e, t.res, name)),
        }
    }
    Err(ApiError::conflict(t.res.plural, t.res.group, name))
}

fn event_line(etype: &str, object: &Value) -> Bytes {
    let mut line =
        serde_json::to_vec(&json!({"type": etype, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

struct WatchFilter {
    key: crate::store::TypeKey,
    ns: Option<String>,
    ls: LabelSelector,
    fs: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, o: &Value) -> bool {
        self.ls.matches_object(o) && self.fs.matches(o)
    }

    /// The event a filtered watcher sees for a stored change, if any.
    fn translate(&self, e: &StoredEvent) -> Option<(&'static str, Arc<Value>)> {
        if e.key != self.key || self.ns.as_ref().is_some_and(|n| *n != e.namespace) {
            return None;
        }
        let now = self.matches(&e.object);
        let before = e.prev.as_ref().is_some_and(|p| self.matches(p));
        let t = match e.etype {
            EventType::Added if now => EventType::Added,
            EventType::Deleted if before || now => EventType::Deleted,
            EventType::Modified if now && before => EventType::Modified,
            EventType::Modified if now => EventType::Added,
            EventType::Modified if before => EventType::Deleted,
            _ => return None,
        };
        Some((t.as_str(), e.object.clone()))
    }
}

/// A watched object as sent: itself, or a one-row Table when kubectl asked
/// for server-side printing (`kubectl get -w`).
fn watch_object(res: &ResourceDef, as_table: bool, o: &Value) -> Value {
    if as_table {
        table::table(res, &[o], rv_of(o).unwrap_or(0), None)
    } else {
        o.clone()
    }
}

fn watch_stream(
    st: &Arc<AppState>,
    t: &Target,
    q: &HashMap<String, String>,
    user: &users::Identity,
    as_table: bool,
) -> Result<Response> {
    let res: &'static ResourceDef = t.res;
    let filter = WatchFilter {
        key: t.res.key(),
        ns: (!t.ns.is_empty()).then(|| t.ns.clone()),
        ls: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fs: FieldSelector::parse(
            q.get("fieldSelector").map(String::as_str).unwrap_or(""),
            t.res,
        )?,
    };
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let send_initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let fanout = st.fanout.clone();
    let key = t.res.key();
    let watcher_user = user.to_string();
    let bookmark_obj = |rv: u64, initial_end: bool| {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"kind": t.res.kind, "apiVersion": t.res.api_version(), "metadata": meta})
    };
    // Resolve the starting point now, so errors and the initial state are consistent.
    let mut first: Vec<Bytes> = Vec::new();
    let (mut last_rv, live) = if rv_param.is_empty() || rv_param == "0" || send_initial {
        let ns = filter.ns.as_deref();
        let (items, rv, live) = st.store.snapshot_and_subscribe(t.res, ns);
        for o in items.iter().filter(|o| filter.matches(o)) {
            first.push(event_line("ADDED", &watch_object(res, as_table, o)));
        }
        if send_initial && bookmarks {
            first.push(event_line("BOOKMARK", &bookmark_obj(rv, true)));
        }
        (rv, Some(live))
    } else {
        let rv: u64 = rv_param
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv_param:?}")))?;
        match st.store.watch_from(rv) {
            Ok((past, live)) => {
                let mut last = rv;
                for e in past {
                    if let Some((ty, o)) = filter.translate(&e) {
                        first.push(event_line(ty, &watch_object(res, as_table, &o)));
                    }
                    last = last.max(e.rv);
                }
                (last, Some(live))
            }
            Err(oldest) => {
                // What the real server does: HTTP 200, then one ERROR event.
                let status = ApiError::gone(format!("too old resource version: {rv} ({oldest})"))
                    .to_status();
                first.push(event_line("ERROR", &status));
                (rv, None)
            }
        }
    };
    let mut shutdown = st.shutdown.clone();
    let mut kick = st.kick.clone();
    kick.mark_unchanged();
    let interval = st.bookmark_interval;
    let kind = t.res.kind;
    let api_version = t.res.api_version();
    // Counted as handed to the connection, bookmarks as bytes only.
    let count = move |line: &Bytes| {
        fanout.add(
            key,
            &watcher_user,
            // Keys are sorted: `type` is the last one.
            !line.ends_with(b"\"type\":\"BOOKMARK\"}\n"),
            line.len(),
        );
    };
    tokio::spawn(async move {
        for line in first {
            count(&line);
            if tx.send(line).await.is_err() {
                return;
            }
        }
        let Some(mut live) = live else {
            return;
        };
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                ev = live.recv() => match ev {
                    Ok(e) => {
                        if e.rv <= last_rv {
                            continue;
                        }
                        last_rv = e.rv;
                        if let Some((ty, o)) = filter.translate(&e) {
                            let line = event_line(ty, &watch_object(res, as_table, &o));
                            count(&line);
                            if tx.send(line).await.is_err() {
                                return;
                            }
                        }
                    }
                    // A watcher that falls behind is closed; the client resumes from its last RV.
                    Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let b = json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": last_rv.to_string()}});
                    let line = event_line("BOOKMARK", &b);
                    count(&line);
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = shutdown.changed() => return,
                _ = kick.changed() => return,
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}
