//! Plain-HTTP admin port shared by the agent and the roster publisher:
//! `/livez`, `/readyz` (once the caller's ready flag is set) and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone)]
struct AdminState {
    registry: Arc<Registry>,
    ready: Arc<AtomicBool>,
    waiting_for: &'static str,
}

/// `/readyz` answers 503 with `waiting_for` until `ready` is set.
pub fn router(
    registry: Arc<Registry>,
    ready: Arc<AtomicBool>,
    waiting_for: &'static str,
) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState {
            registry,
            ready,
            waiting_for,
        })
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, s.waiting_for)
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Binds and logs `listening admin=ADDR` with the bound address (port 0 works).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let l = TcpListener::bind(addr).await?;
    let bound = l.local_addr()?;
    tracing::info!("listening admin={bound}");
    Ok(l)
}

/// Serves until `shutdown` flips to true.
pub async fn serve(l: TcpListener, app: Router, mut shutdown: watch::Receiver<bool>) {
    let res = axum::serve(l, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = res {
        tracing::error!(error = %e, "admin server failed");
    }
}
