//! Plain-HTTP admin port shared by the agent and the roster publisher:
//! `/livez`, `/readyz` (once the caller's ready flag is set) and `/metrics`.
//!
//! The agent runs on the host network, so its admin port is on the node's
//! IP and every pod of the node can reach it. Every connection is bounded
//! ([`AdminOptions`]): a cap with a reserve for this host (where the
//! kubelet's probes come from), so pods holding connections can neither
//! exhaust the agent's file descriptors nor fail its liveness probe; a
//! header read timeout that is also the keep-alive idle limit; and a
//! lifetime, for a peer that stops reading its responses.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::connection_gate::{self, ConnectionGate, GatedListener, SameHost};

/// `--admin-max-connections`' default, as on the webhook's admin port.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// Bounds of the admin port.
#[derive(Debug, Clone)]
pub struct AdminOptions {
    /// Connections open at once; one more is closed as soon as accepted.
    pub max_connections: usize,
    /// Extra connections for peers on this host, so the kubelet's probes
    /// are answered while pods fill the cap.
    pub local_reserve: usize,
    /// A client must send a request's headers within this; hyper also
    /// applies it between requests, so it is the keep-alive idle limit.
    /// Probes and scrapers send a small GET at once.
    pub header_read_timeout: Duration,
    /// A connection is closed (after its response in flight) once this
    /// old, and dropped if that takes longer than `header_read_timeout`:
    /// bounds a peer that sends requests but never reads the answers.
    pub max_connection_age: Duration,
    /// After the stop, open connections get this long to finish.
    pub drain_timeout: Duration,
    /// Which peers count as this host (the reserve's).
    pub same_host: SameHost,
}

impl Default for AdminOptions {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            local_reserve: 16,
            header_read_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(5),
            same_host: connection_gate::same_host,
        }
    }
}

/// A request head larger than this is refused (hyper's minimum is 8 KiB).
const MAX_HEADER_BYTES: usize = 16 * 1024;

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

/// [`serve_with`] with [`AdminOptions::default`].
pub async fn serve(l: TcpListener, app: Router, shutdown: watch::Receiver<bool>) {
    serve_with(l, app, shutdown, AdminOptions::default()).await
}

/// Serves HTTP/1.1 within `opts` until `shutdown` flips to true (or its
/// sender is dropped), then stops accepting and gives open connections up
/// to `drain_timeout`.
pub async fn serve_with(
    l: TcpListener,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
    opts: AdminOptions,
) {
    let gate = ConnectionGate::new(opts.max_connections, opts.local_reserve)
        .with_same_host(opts.same_host);
    let mut listener = match GatedListener::with_gate(l, gate, opts.max_connections) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "admin server failed");
            return;
        }
    };
    let opts = Arc::new(opts);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a sender; all dropped = all connections done.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    loop {
        let admitted = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => break,
            a = listener.accept(|| {}) => a,
        };
        let (app, opts, stop) = (app.clone(), opts.clone(), stop_rx.clone());
        let alive = alive_tx.clone();
        tokio::spawn(async move {
            serve_connection(admitted.stream, admitted.peer, app, &opts, stop).await;
            drop((admitted.slot, alive));
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    if tokio::time::timeout(opts.drain_timeout, alive_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?opts.drain_timeout, "admin connections still open after the drain timeout; leaving them");
    }
}

/// One admitted connection, until the peer leaves, a timeout, its age, or
/// the stop (a graceful close after the request in flight).
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    opts: &AdminOptions,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout)
        .max_buf_size(MAX_HEADER_BYTES)
        .max_headers(64)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let deadline = tokio::time::sleep(opts.max_connection_age);
    tokio::pin!(deadline);
    let mut closing = false;
    let result = loop {
        tokio::select! {
            res = conn.as_mut() => break res,
            _ = stop.wait_for(|s| *s), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            () = &mut deadline => {
                if closing {
                    tracing::debug!(%peer, "admin connection did not close in time: dropping it");
                    return;
                }
                closing = true;
                conn.as_mut().graceful_shutdown();
                let grace = tokio::time::Instant::now() + opts.header_read_timeout;
                deadline.as_mut().reset(grace);
            }
        }
    };
    if let Err(err) = result {
        tracing::debug!(%peer, %err, "admin connection ended with an error");
    }
}
