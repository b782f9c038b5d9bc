//! The HTTP routes: `POST /mutate/<token>` (the path the webhook
//! configuration names, whose reviews may write a stored Node:
//! [`crate::caller`]), `/mutate` and `/` (answered, nothing stored) on the TLS port (within
//! [`RequestLimits`]), `/livez`, `/readyz` and `/metrics` on the plain admin
//! port (GET only, nothing else).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Semaphore;

use crate::admission::{Handled, Webhook};
use crate::body::{self, BodyBudget, BodyError};
use crate::limits::RequestLimits;
use crate::metrics::{Metrics, Port, Refusal};
use crate::refusal;

/// Largest AdmissionReview read (see [`crate::limits`] for why).
pub const BODY_LIMIT: usize = crate::limits::DEFAULT_MAX_BODY_BYTES;

/// The admission route's state: the decision maker and the limits around it.
#[derive(Debug)]
struct Route {
    hook: Arc<Webhook>,
    limits: RequestLimits,
    inflight: Arc<Semaphore>,
    budget: BodyBudget,
}

async fn mutate(State(route): State<Arc<Route>>, req: Request) -> Response {
    answer(route, req, None).await
}

async fn mutate_with_token(
    State(route): State<Arc<Route>>,
    Path(token): Path<String>,
    req: Request,
) -> Response {
    answer(route, req, Some(token)).await
}

async fn answer(route: Arc<Route>, req: Request, token: Option<String>) -> Response {
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + route.limits.request_timeout);
    let admitted = admit(&route, req, token.as_deref(), deadline);
    match tokio::time::timeout_at(deadline, admitted).await {
        Ok(resp) => resp,
        Err(_) => {
            tracing::debug!(timeout = ?route.limits.request_timeout, "admission request past its deadline");
            route
                .hook
                .metrics
                .refused(Port::Https, Refusal::RequestTimeout);
            refusal::plain(StatusCode::SERVICE_UNAVAILABLE, "request deadline exceeded")
        }
    }
}

/// Waits for an in-flight slot, reads the body within its bounds, decides.
async fn admit(
    route: &Route,
    req: Request,
    token: Option<&str>,
    deadline: tokio::time::Instant,
) -> Response {
    let Ok(_slot) = route.inflight.clone().acquire_owned().await else {
        return refusal::plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    };
    let metrics = &route.hook.metrics;
    metrics.inflight().inc();
    let _gauge = DecOnDrop(metrics.inflight());
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let limits = &route.limits;
    let body_deadline = deadline.min(tokio::time::Instant::now() + limits.body_read_timeout);
    let read = body::read(
        req.into_body(),
        declared,
        limits.max_body_bytes,
        body_deadline,
        &route.budget,
    )
    .await;
    let body = match read {
        Ok(b) => b,
        Err(err) => {
            metrics.unreadable_request();
            return refused(metrics, err, limits.max_body_bytes);
        }
    };
    let Handled {
        status,
        bytes,
        reregistration,
    } = route.hook.handle_review(&body.bytes, token);
    if let Some(job) = reregistration {
        // Before the answer: the kubelet's status write (the new boot ID)
        // only follows it. At most a second, well inside the API server's
        // timeout; past it the status write that follows still queues the
        // background patch.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let budget = (left / 2).min(std::time::Duration::from_secs(1));
        route
            .hook
            .patcher
            .retaint_now(&job, tokio::time::Instant::now() + budget)
            .await;
    }
    let ctype = if status == StatusCode::OK {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    (status, [(header::CONTENT_TYPE, ctype)], bytes).into_response()
}

/// The answer to a body that was not read in full.
fn refused(metrics: &Metrics, err: BodyError, max: usize) -> Response {
    match err {
        BodyError::TooLarge { prefix } => {
            metrics.refused(Port::Https, Refusal::BodyTooLarge);
            let uid = refusal::sniff_uid(&prefix);
            match uid {
                // Looks like the API server's: worth a line (see `refusal`).
                Some(uid) => {
                    tracing::warn!(%uid, max, "AdmissionReview over the body limit; allowing untouched")
                }
                None => tracing::debug!(max, "request body over the limit, no review uid in it"),
            }
            refusal::too_large(uid, max)
        }
        BodyError::Timeout => {
            metrics.refused(Port::Https, Refusal::BodyTimeout);
            tracing::debug!("request body not complete before its timeout");
            refusal::plain(StatusCode::REQUEST_TIMEOUT, "request body too slow")
        }
        BodyError::Busy => {
            metrics.refused(Port::Https, Refusal::BodyBudget);
            tracing::debug!("request body budget spent");
            refusal::plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many request bodies in flight",
            )
        }
        BodyError::Broken(err) => {
            tracing::debug!(%err, "request body broke off");
            refusal::plain(StatusCode::BAD_REQUEST, "request body broke off")
        }
    }
}

struct DecOnDrop<'a>(&'a Gauge);

impl Drop for DecOnDrop<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The TLS port's routes, within `limits`.
pub fn webhook_router(hook: Arc<Webhook>, limits: RequestLimits) -> Router {
    let route = Route {
        hook,
        limits,
        inflight: Arc::new(Semaphore::new(limits.max_inflight.max(1))),
        budget: BodyBudget::new(limits.body_buffer_bytes),
    };
    Router::new()
        .route("/mutate", post(mutate))
        .route("/mutate/{token}", post(mutate_with_token))
        // A configuration line without a path (the shipped ones: an apply
        // would reset a patched path) calls `/`.
        .route("/", post(mutate))
        .with_state(Arc::new(route))
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
