//! The HTTP routes: `POST /mutate` on the TLS port, `/livez`, `/readyz` and
//! `/metrics` on the plain admin port.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::metrics::{Metrics, Op, Outcome};
use crate::patcher::{Enqueued, RebootPatcher};
use crate::rules::Rules;
use crate::wire::{self, BadInput};

/// Largest AdmissionReview accepted (a Node is far smaller; this bounds memory).
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Shared by the admission handler.
#[derive(Debug)]
pub struct Webhook {
    pub rules: Arc<Rules>,
    pub patcher: RebootPatcher,
    pub metrics: Arc<Metrics>,
}

impl Webhook {
    /// Answers one body: the response bytes and the HTTP status.
    pub fn handle(&self, body: &[u8]) -> (StatusCode, Vec<u8>) {
        let start = Instant::now();
        let (decoded, decoder) = wire::decode_request_with(body);
        self.metrics.decoded(decoder);
        let (op, outcome, status, bytes) = match decoded {
            Ok(req) => {
                let op = Op::from(&req.operation);
                let d = self.rules.review(&req);
                // Per-request lines are debug: a burst of thousands of node
                // writes must not turn into blocking stderr writes.
                if let Some((reason, n)) = d.added {
                    self.metrics.taints_added(reason, n);
                    tracing::debug!(
                        uid = %req.uid, node = %req.name, operation = ?req.operation,
                        dry_run = req.dry_run, taints = n, "{}", d.why
                    );
                } else {
                    tracing::debug!(uid = %req.uid, node = %req.name, operation = ?req.operation, "{}", d.why);
                }
                if let Some(job) = &d.reboot_patch {
                    let node = &job.node;
                    // Info only for a new job: a node without the taint keeps
                    // sending reboot-looking status writes until it is patched.
                    match self.patcher.enqueue(job) {
                        Enqueued::Queued => tracing::info!(uid = %req.uid, %node, "{}", d.why),
                        q => tracing::debug!(uid = %req.uid, %node, queued = ?q, "{}", d.why),
                    }
                }
                let outcome = if d.added.is_some() {
                    Outcome::Patched
                } else {
                    Outcome::Allowed
                };
                (
                    op,
                    outcome,
                    StatusCode::OK,
                    wire::encode_response(&req.uid, d.patch.as_deref()),
                )
            }
            Err(BadInput::Answer { uid, reason }) => {
                tracing::warn!(%uid, "{reason}; allowing untouched");
                (
                    Op::Unknown,
                    Outcome::Invalid,
                    StatusCode::OK,
                    wire::encode_response(&uid, None),
                )
            }
            Err(BadInput::Reject(reason)) => {
                tracing::warn!("{reason}; answering 400");
                (
                    Op::Unknown,
                    Outcome::Invalid,
                    StatusCode::BAD_REQUEST,
                    format!("{reason}\n").into_bytes(),
                )
            }
        };
        self.metrics
            .request(op, outcome, start.elapsed().as_secs_f64());
        (status, bytes)
    }
}

async fn mutate(State(hook): State<Arc<Webhook>>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(rejection) => {
            // Too large, or the body broke off: nothing to answer for.
            tracing::warn!(%rejection, "unreadable admission request body");
            hook.metrics.unreadable_request();
            return rejection.into_response();
        }
    };
    let (status, bytes) = hook.handle(&body);
    let ctype = if status == StatusCode::OK {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    (status, [(header::CONTENT_TYPE, ctype)], bytes).into_response()
}

/// The TLS port's routes.
pub fn webhook_router(hook: Arc<Webhook>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(hook)
}

/// Liveness/readiness and metrics state for the admin port.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// The admin port's routes.
pub fn admin_router(health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = health.is_ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ok\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let text = metrics.encode();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                }
            }),
        )
}
