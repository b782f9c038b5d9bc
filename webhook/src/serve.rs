//! HTTPS serving: rustls (TLS 1.2/1.3, ALPN h2 and http/1.1) under hyper's
//! auto (HTTP/1.1 + HTTP/2) connection builder, driving an axum `Router`.
//!
//! Public so that the performance harness serves its baseline through exactly
//! the same TLS and HTTP stack as the webhook.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// Timeouts of the serving loop.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// A client must finish the TLS handshake within this.
    pub handshake_timeout: Duration,
    /// An HTTP/1.1 client must send a request's headers within this
    /// (slowloris protection; also closes idle keep-alive connections that
    /// start a request and stall).
    pub header_read_timeout: Duration,
    /// After shutdown is signalled, in-flight requests get this long.
    pub drain_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(120),
            drain_timeout: Duration::from_secs(20),
        }
    }
}

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
    let acceptor = TlsAcceptor::from(tls);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(opts.header_read_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    // ALPN already chose the protocol: serve it directly instead of sniffing
    // the first bytes (the sniffing stage has no timeout of its own).
    let builders = Arc::new(Builders {
        h1: builder.clone().http1_only(),
        h2: builder.clone().http2_only(),
        auto: builder,
    });
    let service = TowerToHyperService::new(router);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Admission calls are small request/response pairs: don't let Nagle delay them.
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let builders = builders.clone();
        let service = service.clone();
        // Taken before the handshake so shutdown also waits for connections still in it.
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(opts.handshake_timeout, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(err)) => {
                        tracing::debug!(%peer, %err, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let builder = match tls.get_ref().1.alpn_protocol() {
                Some(b"h2") => &builders.h2,
                Some(b"http/1.1") => &builders.h1,
                _ => &builders.auto,
            };
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(err) = watcher.watch(conn).await {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(opts.drain_timeout, graceful.shutdown())
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
