//! What every handler shares: the server's state, the request's target, the
//! reply with its `Warning` headers, and body and option decoding.
//!
//! Follows `k8s.io/apiserver/pkg/endpoints/handlers/rest.go` (`RequestScope`,
//! `transformDecodeError`), `handlers/negotiation` (Table vs JSON),
//! `pkg/endpoints/handlers/responsewriters/warning.go` (the `299` header), and
//! `handlers/create.go`/`update.go`/`delete.go` (`dryRun` and the `*Options`
//! objects admission sees).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::admission::Admission;
use crate::resources::ResourceDef;
use crate::status::{ApiError, json_response};
use crate::store::Store;

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

pub(crate) type Result<T> = std::result::Result<T, ApiError>;

/// What a request is about.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) res: &'static ResourceDef,
    pub(crate) ns: String,
    pub(crate) name: Option<String>,
    pub(crate) sub: String,
}

/// A response with optional `Warning` headers.
pub(crate) struct Reply {
    pub(crate) code: StatusCode,
    pub(crate) body: Value,
    pub(crate) warnings: Vec<String>,
}

impl Reply {
    pub(crate) fn ok(body: Value) -> Self {
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

pub(crate) fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

pub(crate) fn json_body(body: &[u8]) -> Result<Value> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

pub(crate) fn yaml_or_json(body: &[u8]) -> Result<Value> {
    serde_json::from_slice(body)
        .or_else(|_| serde_yaml::from_slice(body))
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

pub(crate) fn parse_body(body: &[u8], headers: &HeaderMap) -> Result<Value> {
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

pub(crate) fn dry_run(q: &HashMap<String, String>) -> Result<bool> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid value: \"{other}\": supported values: \"All\""
        ))),
    }
}

pub(crate) fn options(kind: &str, q: &HashMap<String, String>, dry: bool) -> Value {
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
