//! Serving: rustls (TLS 1.2/1.3, ALPN h2 and http/1.1) or plain HTTP/1.1
//! under hyper's connection builders, driving an axum `Router`, with every
//! per-connection cost bounded: a connection cap, handshake and header
//! timeouts, header and buffer sizes, HTTP/2 streams, windows and pings, and
//! an idle limit for HTTP/2 (HTTP/1.1's is the header read timeout).
//!
//! Public so that the performance harness serves its baseline through exactly
//! the same TLS and HTTP stack as the webhook.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use nodegate_shared::connection_gate::GatedListener;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::metrics::{Metrics, Port, Refusal};

/// Bounds and timeouts of the serving loop.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// A client must finish the TLS handshake within this.
    pub handshake_timeout: Duration,
    /// An HTTP/1.1 client must send a request's headers within this
    /// (slowloris protection). hyper also applies it to idle keep-alive
    /// connections; HTTP/2 connections idle this long get a GOAWAY.
    pub header_read_timeout: Duration,
    /// After shutdown is signalled, in-flight requests get this long.
    pub drain_timeout: Duration,
    /// Connections open at once; one more is closed as soon as accepted.
    pub max_connections: usize,
    /// Extra connections for peers on this host (see
    /// [`nodegate_shared::connection_gate::ConnectionGate`]).
    pub local_reserve: usize,
    /// HTTP/1.1 read buffer, which bounds a request head (hyper's minimum is 8 KiB).
    pub max_header_bytes: usize,
    /// HTTP/2 streams open at once per connection.
    pub h2_max_concurrent_streams: u32,
    /// HTTP/2 ping interval; a peer that does not answer within the same
    /// time is dropped.
    pub h2_keep_alive: Duration,
    /// Where refusals and open connections are counted (none for the baseline).
    pub metrics: Option<(Arc<Metrics>, Port)>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(20),
            max_connections: 1024,
            local_reserve: 16,
            max_header_bytes: 16 * 1024,
            h2_max_concurrent_streams: 32,
            h2_keep_alive: Duration::from_secs(30),
            metrics: None,
        }
    }
}

/// HTTP/2 flow-control windows: a review is at most a few MiB, so a stream
/// need not buffer more than this before the handler reads it.
const H2_STREAM_WINDOW: u32 = 256 * 1024;
const H2_CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Largest HTTP/2 header block (decoded) accepted.
const H2_MAX_HEADER_LIST: u32 = 16 * 1024;
/// Unsent response bytes buffered per HTTP/2 stream.
const H2_MAX_SEND_BUF: usize = 64 * 1024;

/// The crypto provider used everywhere (ring), so nothing depends on a
/// process-wide default being installed.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config offering TLS 1.3 and 1.2 and ALPN `h2`, `http/1.1`.
pub fn tls_server_config(
    resolver: Arc<dyn ResolvesServerCert>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut cfg = ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// One connection builder per ALPN outcome.
struct Builders {
    h1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new(opts: &ServeOptions) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(opts.header_read_timeout)
            .max_buf_size(opts.max_header_bytes.max(8192))
            .max_headers(64)
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(opts.h2_max_concurrent_streams)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .max_header_list_size(H2_MAX_HEADER_LIST)
            .max_send_buf_size(H2_MAX_SEND_BUF)
            .keep_alive_interval(opts.h2_keep_alive)
            .keep_alive_timeout(opts.h2_keep_alive);
        // ALPN already chose the protocol: serve it directly instead of
        // sniffing the first bytes (the sniffing stage has no timeout of its own).
        Self {
            h1: builder.clone().http1_only(),
            h2: builder.clone().http2_only(),
            auto: builder,
        }
    }
}

/// [`serve_https_with`] using [`ServeOptions::default`].
pub async fn serve_https(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    serve_https_with(listener, tls, router, shutdown, ServeOptions::default()).await
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves, then
/// stops accepting, lets in-flight connections finish their requests (up to
/// `drain_timeout`) and returns.
pub async fn serve_https_with(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    router: Router,
    shutdown: impl Future<Output = ()>,
    opts: ServeOptions,
) -> io::Result<()> {
    serve(
        listener,
        Some(TlsAcceptor::from(tls)),
        router,
        shutdown,
        opts,
    )
    .await
}

/// Plain HTTP/1.1 with the same bounds (the admin port).
pub async fn serve_http_with(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()>,
    opts: ServeOptions,
) -> io::Result<()> {
    serve(listener, None, router, shutdown, opts).await
}

async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: Router,
    shutdown: impl Future<Output = ()>,
    opts: ServeOptions,
) -> io::Result<()> {
    let mut listener = GatedListener::new(listener, opts.max_connections, opts.local_reserve)?;
    let builders = Arc::new(Builders::new(&opts));
    let opts = Arc::new(opts);
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a sender; all dropped = all connections done.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        let admitted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            a = listener.accept(|| count(&opts, Refusal::ConnectionLimit)) => a,
        };
        let (stream, peer, slot) = (admitted.stream, admitted.peer, admitted.slot);
        // Admission calls are small request/response pairs: don't let Nagle delay them.
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            tls: tls.clone(),
            builders: builders.clone(),
            router: router.clone(),
            opts: opts.clone(),
            stop: stop_rx.clone(),
            peer,
        };
        let alive = alive_tx.clone();
        let metrics = opts.metrics.clone();
        tokio::spawn(async move {
            let open = metrics.as_ref().map(|(m, p)| m.connections(*p));
            if let Some(g) = open {
                g.inc();
            }
            conn.run(stream).await;
            if let Some(g) = open {
                g.dec();
            }
            drop((slot, alive));
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(alive_tx);
    if tokio::time::timeout(opts.drain_timeout, alive_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout = ?opts.drain_timeout,
            "connections still open after the drain timeout; closing them"
        );
    }
    Ok(())
}

fn count(opts: &ServeOptions, why: Refusal) {
    if let Some((m, port)) = &opts.metrics {
        m.refused(*port, why);
    }
}

/// One accepted connection.
struct Conn {
    tls: Option<TlsAcceptor>,
    builders: Arc<Builders>,
    router: Router,
    opts: Arc<ServeOptions>,
    stop: watch::Receiver<bool>,
    peer: SocketAddr,
}

impl Conn {
    async fn run(self, stream: TcpStream) {
        let Some(acceptor) = self.tls.clone() else {
            let io = TokioIo::new(stream);
            self.serve(io, &self.builders.h1, false).await;
            return;
        };
        let timeout = self.opts.handshake_timeout;
        let tls = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => {
                tracing::debug!(peer = %self.peer, %err, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(peer = %self.peer, "TLS handshake timed out");
                count(&self.opts, Refusal::HandshakeTimeout);
                return;
            }
        };
        let (builder, h2) = match tls.get_ref().1.alpn_protocol() {
            Some(b"h2") => (&self.builders.h2, true),
            Some(b"http/1.1") => (&self.builders.h1, false),
            _ => (&self.builders.auto, false),
        };
        self.serve(TokioIo::new(tls), builder, h2).await;
    }

    /// Serves requests until the peer leaves, shutdown (a graceful close
    /// after the request in flight), or, on HTTP/2, the idle limit.
    async fn serve<IO>(&self, io: TokioIo<IO>, builder: &auto::Builder<TokioExecutor>, h2: bool)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Arc::new(Activity::new());
        let service = {
            let (router, activity) = (self.router.clone(), activity.clone());
            TowerToHyperService::new(tower::service_fn(
                move |req: Request<hyper::body::Incoming>| {
                    let guard = activity.begin();
                    let router = router.clone();
                    async move {
                        let res = router.oneshot(req.map(axum::body::Body::new)).await;
                        drop(guard);
                        res
                    }
                },
            ))
        };
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        let mut stop = self.stop.clone();
        let idle_limit = self.opts.header_read_timeout;
        let mut idle_check = tokio::time::interval((idle_limit / 4).max(Duration::from_millis(10)));
        let mut closing = false;
        let result = loop {
            tokio::select! {
                res = conn.as_mut() => break res,
                _ = stop.wait_for(|s| *s), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = idle_check.tick(), if h2 && !closing => {
                    if activity.idle_for() >= idle_limit {
                        tracing::debug!(peer = %self.peer, "idle HTTP/2 connection: closing");
                        count(&self.opts, Refusal::HeaderTimeout);
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        };
        if let Err(err) = result {
            let timeout = err
                .downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_timeout);
            if timeout {
                count(&self.opts, Refusal::HeaderTimeout);
            }
            tracing::debug!(peer = %self.peer, %err, "connection ended with an error");
        }
    }
}

/// Requests running on one connection, and when the last one ended.
struct Activity {
    running: AtomicUsize,
    /// Milliseconds since `EPOCH` when the connection last went idle.
    idle_since: AtomicU64,
}

/// A process-wide time origin, so the idle mark fits an atomic.
fn millis() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

struct Running(Arc<Activity>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.idle_since.store(millis(), Ordering::Relaxed);
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    fn new() -> Self {
        Self {
            running: AtomicUsize::new(0),
            idle_since: AtomicU64::new(millis()),
        }
    }

    fn begin(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    /// Zero while a request runs; else the time since the last one ended
    /// (or since the connection opened).
    fn idle_for(&self) -> Duration {
        if self.running.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        let since = self.idle_since.load(Ordering::Relaxed);
        Duration::from_millis(millis().saturating_sub(since))
    }
}
